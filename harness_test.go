// This file owns the shared harness every agent test builds on: starting an
// agent beside the fake HAProxy (startTestAgent, launchAgentWith, newTestEnv,
// landedEnv) with the harness configuration, a small client of its API that
// composes manifests against the agent's current state (reloadManifest for a
// change only a reload carries) and sends multipart applies, desired file
// sets and what is on disk, counters, short socket paths, and edits of a
// stopped agent's state file.
//
// It must never assert behaviour: the tests do. A helper here may fail a
// test only when it cannot deliver what it promises (an agent that will not
// start, a request that cannot be sent, an answer that does not decode, a
// setup apply that did not land the way the helper says it does).

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Starting an agent beside the fake HAProxy.

// testLogger discards logs unless HAPTIC_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("HAPTIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testAgentConfig is the configuration every harness agent runs with: a
// fresh temporary base directory, haproxy.cfg and .haptic-agent.json, the
// Basic credentials haptic/s3cret, an ephemeral loopback port, and the
// fake's absolute socket paths. A nil fake leaves the sockets for the
// caller to set.
func testAgentConfig(t testing.TB, fake *FakeHAProxy) AgentConfig {
	cfg := AgentConfig{
		BaseDir:    t.TempDir(),
		ConfigFile: "haproxy.cfg",
		StateFile:  ".haptic-agent.json",
		Username:   "haptic",
		Password:   "s3cret",
		Listen:     "127.0.0.1:0",
		Logger:     testLogger(),
	}
	if fake != nil {
		cfg.MasterSocket, cfg.WorkerSocket = fake.MasterSocket(), fake.WorkerSocket()
	}
	return cfg
}

// startTestAgent starts an agent on the fake with the harness configuration
// (mutated by mutate), runs it until the test ends and waits for Ready.
func startTestAgent(t testing.TB, fake *FakeHAProxy, mutate func(*AgentConfig)) *Agent {
	t.Helper()
	cfg := testAgentConfig(t, fake)
	if mutate != nil {
		mutate(&cfg)
	}
	a, _ := launchTestAgent(t, cfg, true)
	return a
}

// launchTestAgent runs an agent built from cfg; stop cancels Run and waits
// for it (cleanup does the same if the test did not).
func launchTestAgent(t testing.TB, cfg AgentConfig, waitReady bool) (*Agent, func()) {
	t.Helper()
	return launchPreparedAgent(t, cfg, nil, waitReady)
}

// launchPreparedAgent is launchTestAgent with a hook that runs on the agent
// before Run, where internal tests set agent hooks without racing Run.
func launchPreparedAgent(t testing.TB, cfg AgentConfig, prepare func(*Agent), waitReady bool) (*Agent, func()) {
	t.Helper()
	return launchAgentWith(t, cfg, agentOptions{}, prepare, waitReady)
}

// launchAgentWith is launchPreparedAgent on an agent built with opts.
func launchAgentWith(t testing.TB, cfg AgentConfig, opts agentOptions, prepare func(*Agent), waitReady bool) (*Agent, func()) {
	t.Helper()
	a, err := newAgent(cfg, opts)
	if err != nil {
		t.Fatalf("NewAgent: %v", err)
	}
	if prepare != nil {
		prepare(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return after cancellation")
			}
		})
	}
	t.Cleanup(stop)
	if waitReady {
		waitFor(t, "the agent to be ready", a.Ready)
	}
	return a, stop
}

// waitFor polls cond every 5 ms for up to 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loadOnReload makes every successful reload of the fake "load" the maps
// and certificates under base, as a real worker would read them through its
// configuration.
func loadOnReload(fake *FakeHAProxy, base string) {
	fake.With(func(m *FakeModel) {
		m.OnReload = func(m *FakeModel) {
			m.Maps = map[string][]MapEntry{}
			m.Certs = map[string]string{}
			filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
					return nil
				}
				rel, _ := filepath.Rel(base, p)
				rel = filepath.ToSlash(rel)
				b, _ := os.ReadFile(p)
				switch {
				case strings.HasSuffix(p, ".map"):
					m.Maps[rel] = ParseMapEntries(string(b))
				case strings.HasSuffix(p, ".pem"):
					m.Certs[rel] = string(b)
				}
				return nil
			})
		}
	})
}

// testEnv is one fake HAProxy, one agent on it and a client.
type testEnv struct {
	fake *FakeHAProxy
	a    *Agent
	c    *agentClient
	cfg  AgentConfig
	stop func()
}

// newTestEnv starts a fake (3.4 dialect) whose reloads load the agent's
// maps and certificates, and an agent on it.
func newTestEnv(t testing.TB, mutate func(*AgentConfig), prepare func(*Agent, *FakeHAProxy)) *testEnv {
	t.Helper()
	return newTestEnvOn(t, "", mutate, prepare)
}

// newTestEnvOn is newTestEnv on a fake of the given version ("" = 3.4).
func newTestEnvOn(t testing.TB, version string, mutate func(*AgentConfig), prepare func(*Agent, *FakeHAProxy)) *testEnv {
	t.Helper()
	fake := startTestFake(t, version)
	cfg := testAgentConfig(t, fake)
	if mutate != nil {
		mutate(&cfg)
	}
	loadOnReload(fake, cfg.BaseDir)
	var prep func(*Agent)
	if prepare != nil {
		prep = func(a *Agent) { prepare(a, fake) }
	}
	a, stop := launchPreparedAgent(t, cfg, prep, true)
	return &testEnv{fake: fake, a: a, c: newAgentClient(t, a), cfg: cfg, stop: stop}
}

// landedEnv is an env with the seed's plan-1 landed by a reload.
func landedEnv(t testing.TB, mutate func(*AgentConfig), prepare func(*Agent, *FakeHAProxy)) (*testEnv, fileSet) {
	t.Helper()
	e := newTestEnv(t, mutate, prepare)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	return e, fs
}

// landedThenStopped lands the seed set as plan-1 on a fresh fake and agent
// and stops the agent, as a restart test begins: it returns the fake, the
// configuration to start the next agent on, the stopped agent's client and
// plan-1's answer.
func landedThenStopped(t testing.TB) (*FakeHAProxy, AgentConfig, *agentClient, ApplyResult) {
	t.Helper()
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	first := c.apply(c.manifest("plan-1", fs), fs)
	stop()
	return fake, cfg, c, first
}

// awaitReadBacks waits for the read-backs of every apply answered so far.
// An apply starts its read-back after its answer, still under the apply
// lock, so the lock is taken once first: a wait that began before that
// start would race with it (and miss it).
func awaitReadBacks(a *Agent) {
	a.deps.applyMu.Lock()
	a.deps.applyMu.Unlock()
	a.reads.wg.Wait()
}

// restart stops the agent and starts a new one on the same directory.
func (e *testEnv) restart(t testing.TB) {
	t.Helper()
	e.stop()
	seq := e.c.seq
	e.a, e.stop = launchTestAgent(t, e.cfg, true)
	e.c = newAgentClient(t, e.a)
	e.c.seq = seq
}

// land applies fs as planID and expects an OK result.
func (e *testEnv) land(t testing.TB, planID string, fs fileSet, ops ...Op) ApplyResult {
	t.Helper()
	res := e.c.apply(e.c.manifest(planID, fs, ops...), fs)
	if !res.OK {
		t.Fatalf("apply %s: %+v", planID, res)
	}
	return res
}

// reloadManifest composes a reload of fs against the current state, as a
// controller does for a change only a reload can carry.
func reloadManifest(e *testEnv, planID string, fs fileSet) *Manifest {
	m := e.c.manifest(planID, fs)
	m.Mode = ModeReload
	return m
}

// landThenSchedule lands the seed set as plan-1, then sends plan-2 (the
// config changed) as a reload inside the pacing window, and expects it to be
// scheduled. The agent must run with a ReloadIntervalMin the test outlives.
func (e *testEnv) landThenSchedule(t testing.TB) (fs, fs2 fileSet, scheduled ApplyResult) {
	t.Helper()
	fs = seedFiles()
	e.land(t, "plan-1", fs)
	fs2 = fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	scheduled = e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	if scheduled.Mode != ResultScheduled {
		t.Fatalf("%+v", scheduled)
	}
	return fs, fs2, scheduled
}

func (e *testEnv) disk(t testing.TB) fileSet { return diskSet(t, e.cfg.BaseDir) }

// agentClient talks to one agent over its TCP API.
type agentClient struct {
	t          testing.TB
	a          *Agent
	base       string
	user, pass string
	hc         *http.Client
	seq        uint64
	epoch      uint64
}

func newAgentClient(t testing.TB, a *Agent) *agentClient {
	return &agentClient{t: t, a: a, base: "http://" + a.Addr(), user: "haptic", pass: "s3cret",
		hc: &http.Client{Timeout: 60 * time.Second}, epoch: 1}
}

func (c *agentClient) do(method, path string, body io.Reader, contentType string) (int, http.Header, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// state reads GET /v1/state with the given query ("" or "?verify=1" …).
func (c *agentClient) state(query string) State {
	c.t.Helper()
	code, _, b := c.do("GET", PathState+query, nil, "")
	if code != http.StatusOK {
		c.t.Fatalf("state: %d %s", code, b)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		c.t.Fatalf("state: %v: %s", err, b)
	}
	return st
}

// fileSet is a desired file set: path → content.
type fileSet map[string]string

func (fs fileSet) clone() fileSet {
	out := fileSet{}
	for p, c := range fs {
		out[p] = c
	}
	return out
}

func (fs fileSet) paths() []string {
	var ps []string
	for p := range fs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// testProof is the controller's equality witness for content.
func testProof(content string) string { return "c:" + DigestString(content) }

func fileKind(p string) string {
	switch {
	case p == ConfigFilePath:
		return FileKindConfig
	case strings.HasSuffix(p, ".map"):
		return FileKindMap
	case strings.HasSuffix(p, ".pem"):
		return FileKindCert
	case strings.HasSuffix(p, ".crt-list"):
		return FileKindCRTList
	}
	return FileKindGeneral
}

// manifestFiles lists the set sorted by path, with digest, size, kind,
// reload_on_change and the controller's proof.
func (fs fileSet) manifestFiles() []ManifestFile {
	var out []ManifestFile
	for _, p := range fs.paths() {
		c := fs[p]
		out = append(out, ManifestFile{Path: p, Digest: DigestString(c), Proof: testProof(c), Size: int64(len(c)),
			Kind: fileKind(p), ReloadOnChange: fileKind(p) == FileKindConfig})
	}
	return out
}

// manifest composes an exact-identity auto manifest against the agent's
// current state, as a controller would.
func (c *agentClient) manifest(planID string, fs fileSet, ops ...Op) *Manifest {
	c.t.Helper()
	st := c.state("?plan=0")
	return c.manifestFrom(st, planID, fs, ops...)
}

func (c *agentClient) manifestFrom(st State, planID string, fs fileSet, ops ...Op) *Manifest {
	c.seq++
	return &Manifest{
		IdentityVersion:            ExactIdentityVersion,
		PlanID:                     planID,
		PlanSchemaVersion:          PlanSchemaVersion,
		Token:                      Token{LeaderEpoch: c.epoch, RenderSeq: c.seq},
		ExpectedPrevPlanID:         st.AppliedPlanID,
		ExpectedPrevPlanProof:      st.AppliedPlanProof,
		ExpectedPrevToken:          st.AppliedToken,
		ExpectedWorkerOpsPlanID:    st.WorkerOpsPlanID,
		ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files:                      fs.manifestFiles(),
		Ops:                        ops,
		Mode:                       ModeAuto,
	}
}

// extraPart is one extra or replacement part of a request.
type extraPart struct {
	header  textproto.MIMEHeader
	content string
}

// applyRequest describes one POST /v1/apply.
type applyRequest struct {
	manifest    *Manifest
	rawManifest []byte            // replaces the encoded manifest when set
	files       fileSet           // contents of the parts to send
	omit        map[string]bool   // paths whose part is not sent
	override    map[string]string // part content sent instead of files[path]
	plan        []byte
	planPatch   bool        // the plan is a PlanPatch: Content-Type application/json
	extra       []extraPart // parts appended after the file parts
	noManifest  bool
}

// body encodes the request as multipart/form-data.
func (r applyRequest) body(t testing.TB) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if !r.noManifest {
		b := r.rawManifest
		if b == nil {
			var err error
			if b, err = json.Marshal(r.manifest); err != nil {
				t.Fatal(err)
			}
		}
		pw, _ := w.CreateFormField(PartManifest)
		pw.Write(b)
	}
	if r.plan != nil {
		h := textproto.MIMEHeader{"Content-Disposition": {multipart.FileContentDisposition(PartPlan, PartPlan)}, "Content-Type": {"application/octet-stream"}}
		if r.planPatch {
			h.Set("Content-Type", "application/json")
		}
		pw, _ := w.CreatePart(h)
		pw.Write(r.plan)
	}
	if r.manifest != nil {
		for _, f := range r.manifest.Files {
			if r.omit[f.Path] {
				continue
			}
			content, ok := r.override[f.Path]
			if !ok {
				if content, ok = r.files[f.Path]; !ok {
					continue
				}
			}
			pw, _ := w.CreateFormFile(f.Path, f.Path)
			io.WriteString(pw, content)
		}
	}
	for _, p := range r.extra {
		pw, _ := w.CreatePart(p.header)
		io.WriteString(pw, p.content)
	}
	w.Close()
	return &buf, w.FormDataContentType()
}

// post sends the request and returns the status and body. It does not
// wait for anything the agent does after its answer: an ACK promises the
// tree as it stands when the answer arrives.
func (c *agentClient) post(r applyRequest) (int, []byte) {
	c.t.Helper()
	body, ct := r.body(c.t)
	code, _, b := c.do("POST", PathApply, body, ct)
	return code, b
}

// apply sends m with every file of fs and expects a 200 answer.
func (c *agentClient) apply(m *Manifest, fs fileSet) ApplyResult {
	c.t.Helper()
	code, b := c.post(applyRequest{manifest: m, files: fs})
	if code != http.StatusOK {
		c.t.Fatalf("apply %s: %d %s", m.PlanID, code, b)
	}
	var res ApplyResult
	if err := json.Unmarshal(b, &res); err != nil {
		c.t.Fatalf("apply %s: %v: %s", m.PlanID, err, b)
	}
	return res
}

// applyErr decodes an ApplyError answer.
func applyErr(t testing.TB, b []byte) ApplyError {
	t.Helper()
	var e ApplyError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an ApplyError: %v: %s", err, b)
	}
	return e
}

// applyFileOnly lands fs as a file_only apply (no ops, exact worker proof).
func applyFileOnly(t testing.TB, c *agentClient, planID string, fs fileSet) ApplyResult {
	t.Helper()
	res := c.apply(c.manifest(planID, fs), fs)
	if !res.OK || res.Mode != ResultFileOnly {
		t.Fatalf("file_only apply %s: %+v", planID, res)
	}
	return res
}

// seedFiles is the seed flow's first render.
func seedFiles() fileSet {
	return fileSet{
		"haproxy.cfg":   "global\n  maxconn 100\n\nfrontend http-in\n  bind :80\n  use_backend %[req.hdr(host),map(maps/host.map)]\n",
		"maps/host.map": "example.com be-a\n",
	}
}

// diskSet reads every regular file under the base directory, leaving out
// the agent's own dot-prefixed files and directories.
func diskSet(t testing.TB, base string) fileSet {
	t.Helper()
	out := fileSet{}
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") && p != base {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(base, p)
			b, _ := os.ReadFile(p)
			out[filepath.ToSlash(rel)] = string(b)
		}
		return nil
	})
	return out
}

func sameSet(a, b fileSet) bool {
	if len(a) != len(b) {
		return false
	}
	for p, c := range a {
		if bc, ok := b[p]; !ok || bc != c {
			return false
		}
	}
	return true
}

// mapsKeys iterates over the keys of m.
func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// metricValue reads one counter series of the agent.
func metricValue(a *Agent, family string, labels ...string) uint64 {
	m := a.metrics
	switch family {
	case "apply_total":
		return m.applyTotal.value(labels...)
	case "apply_rejected_total":
		return m.applyRejected.value(labels...)
	case "invariant_violations_total":
		return m.invariantViolations.value(labels...)
	case "reloads_total":
		return m.reloads.value(labels...)
	case "rollbacks_total":
		return m.rollbacks.value(labels...)
	case "op_errors_total":
		return m.opErrors.value(labels...)
	case "map_divergence_total":
		return m.mapDivergence.value(labels...)
	case "deferred_deletes_total":
		return m.deferredDeletes.value(labels...)
	}
	panic("unknown family " + family)
}

// ---------------------------------------------------------------------------
// Configuration without HAProxy, sockets and probes.

// validTestConfig is a configuration NewAgent accepts, on a fresh base
// directory, with no HAProxy behind it.
func validTestConfig(t testing.TB) AgentConfig {
	return AgentConfig{
		BaseDir:  t.TempDir(),
		Username: "haptic",
		Password: "s3cret",
		Listen:   "127.0.0.1:0",
		Logger:   testLogger(),
	}
}

func newTestAgentOrError(t testing.TB, cfg AgentConfig) error {
	t.Helper()
	a, err := NewAgent(cfg)
	if err == nil {
		a.close()
	}
	return err
}

// shortTempDir is a temp directory short enough for unix socket paths.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ha")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// getText reads a no-auth route and returns its status and body.
func getText(t testing.TB, a *Agent, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// unixClient is an HTTP client that dials the unix socket path.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// ---------------------------------------------------------------------------
// The persisted state of a stopped agent.

// editState rewrites the persisted state of a stopped agent: the snapshot
// with the log replayed on it becomes a new snapshot, edited, and the log
// starts empty, as after a clean stop.
func editState(t testing.TB, base string, edit func(s *agentState, tree map[string]FileAt)) {
	t.Helper()
	path := filepath.Join(base, ".haptic-agent.json")
	loaded, err := loadLog(osDisk{}, path)
	if err != nil {
		t.Fatal(err)
	}
	edit(&loaded.st, loaded.tree)
	writeSnapshot(t, base, loaded.st, loaded.tree, loaded.seq)
	if loaded.blob != nil {
		if err := os.WriteFile(filepath.Join(base, planBlobFile), loaded.blob, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// writeSnapshot writes a state file holding st and tree, and no log.
func writeSnapshot(t testing.TB, base string, st agentState, tree map[string]FileAt, seq uint64) {
	t.Helper()
	snap := &logRecord{Seq: seq, Kind: recordSnapshot, State: &st, Journal: st.Journal, Tree: map[string]*FileAt{}}
	for p, at := range tree {
		snap.Tree[p] = &at
	}
	b, err := encodeFrame(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, ".haptic-agent.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(base, logFileName)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// stopAsKilled stops an agent and leaves its state as kill -9 would: a
// clean stop compacts the log into a new snapshot, so the state file and
// the log are copied before the stop and put back after it (the page cache
// outlives a killed process, so these bytes are what it left).
func stopAsKilled(t testing.TB, base string, stop func()) {
	t.Helper()
	saved := map[string][]byte{}
	for _, name := range []string{".haptic-agent.json", logFileName, planBlobFile} {
		b, err := os.ReadFile(filepath.Join(base, name))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		saved[name] = b
	}
	stop()
	for name, b := range saved {
		p := filepath.Join(base, name)
		err := os.Remove(p)
		if b != nil {
			err = os.WriteFile(p, b, 0o600)
		}
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}

// readStateFile reads the persisted state: the snapshot with the log
// replayed on it, as the next start would read it.
func readStateFile(t testing.TB, base string) agentState {
	t.Helper()
	return readState(t, base).st
}

// readOwned is the persisted tree's paths, sorted.
func readOwned(t testing.TB, base string) []string {
	t.Helper()
	return slices.Sorted(maps.Keys(readState(t, base).tree))
}

func readState(t testing.TB, base string) *loadedLog {
	t.Helper()
	loaded, err := loadLog(osDisk{}, filepath.Join(base, ".haptic-agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

// lockedBuffer is a log or output sink several goroutines write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
