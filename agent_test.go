// Tests of the agent (agent.md "Tests that must exist"): the harness every
// agent test shares (startTestAgent, a small client, manifest builders),
// configuration, startup, readiness and recovery, authentication and the
// handlers. The apply pipeline's tests are in agent_apply_test.go, pacing,
// read-back and the rest in agent_pacing_test.go, the fault simulation in
// agent_fault_test.go. All run against the fake HAProxy.

package haptic

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
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
// Harness.

// testLogger discards logs unless HAPTIC_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("HAPTIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testAgentConfig is the harness configuration of agent.md's test section.
// A nil fake leaves the sockets for the caller to set.
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
		pw, _ := w.CreateFormFile(PartPlan, PartPlan)
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

// post sends the request and returns the status and body.
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

// metric reads one counter series of the agent.
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

// totalInvariantViolations sums every invariant series.
func totalInvariantViolations(a *Agent) uint64 {
	var n uint64
	for _, name := range []string{invGenerationMonotonic, invDiskIsTheDesiredSet, invRuntimeModeDoesNotReload,
		invReloadModeReloads, invNoopRunsNoOps, invJournalOnlyWhileDiverged, invMountProbeFoundEveryMount,
		invOpsExecutable, invRecoveryReload} {
		n += a.metrics.invariantViolations.value(name)
	}
	return n
}

// ---------------------------------------------------------------------------
// The seed flow: first apply = full file set + reload, second = one map_add
// at runtime.

func TestSeedFlowReloadsThenAddsAMapEntryAtRuntime(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, nil)
	loadOnReload(fake, a.files.base)
	c := newAgentClient(t, a)

	fs := seedFiles()
	res := c.apply(c.manifest("plan-1", fs), fs)
	if !res.OK || res.Mode != ResultReload || res.Reload == nil || !res.Reload.Performed || !res.Reload.OK {
		t.Fatalf("first apply: %+v", res)
	}
	if res.AppliedPlanID != "plan-1" || res.RunningPlanID != "plan-1" || res.LKGPlanID != "plan-1" || res.AppliedPlanProof != "a:1" {
		t.Fatalf("first apply baseline: %+v", res)
	}
	if got := diskSet(t, a.files.base); !sameSet(got, fs) {
		t.Fatalf("disk after the first apply: %v", got)
	}
	pid := fake.Worker().WorkerPID

	fs2 := fs.clone()
	fs2["maps/host.map"] += "example.org be-b\n"
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.org", Value: "be-b"}
	res = c.apply(c.manifest("plan-2", fs2, op), fs2)
	if !res.OK || res.Mode != ResultRuntime || res.Reload != nil {
		t.Fatalf("second apply: %+v", res)
	}
	if len(res.OpResults) != 1 || !res.OpResults[0].OK || res.OpResults[0].Kind != OpMapAdd {
		t.Fatalf("op results: %+v", res.OpResults)
	}
	if fake.Worker().WorkerPID != pid {
		t.Fatal("the runtime apply reloaded")
	}
	if got := fake.MapEntries("maps/host.map"); len(got) != 2 || got[1].Key != "example.org" {
		t.Fatalf("map entries: %v", got)
	}
	st := c.state("")
	if st.Generation != 2 || st.AppliedPlanID != "plan-2" || st.RunningPlanID != "plan-1" || st.WorkerOpsPlanID != "plan-2" {
		t.Fatalf("state: %+v", st)
	}
	if st.InvariantViolation != "" || totalInvariantViolations(a) != 0 {
		t.Fatalf("invariant: %q", st.InvariantViolation)
	}
	a.reads.wg.Wait()
	if metricValue(a, "map_divergence_total") != 0 {
		t.Fatal("the read-back found a divergence")
	}
}

// ---------------------------------------------------------------------------
// Configuration.

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
		a.closeListeners()
	}
	return err
}

func TestNewAgentValidatesTheConfiguration(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	emptyTLS := t.TempDir()
	longDir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	os.MkdirAll(longDir, 0o755)
	tests := []struct {
		name   string
		mutate func(*AgentConfig)
		want   string
	}{
		{"empty base dir", func(c *AgentConfig) { c.BaseDir = "" }, "--base-dir is required"},
		{"bad config", func(c *AgentConfig) { c.ConfigFile = "../haproxy.cfg" },
			`--config: invalid manifest path: "../haproxy.cfg" has a component starting with a dot`},
		{"absolute config", func(c *AgentConfig) { c.ConfigFile = "/etc/haproxy/haproxy.cfg" },
			`--config: invalid manifest path: "/etc/haproxy/haproxy.cfg" is absolute`},
		{"interval 61s", func(c *AgentConfig) { c.ReloadIntervalMin = 61 * time.Second },
			"--reload-interval-min 1m1s is outside 0..60s"},
		{"interval 2m", func(c *AgentConfig) { c.ReloadIntervalMin = 2 * time.Minute },
			"--reload-interval-min 2m0s is outside 0..60s"},
		{"negative interval", func(c *AgentConfig) { c.ReloadIntervalMin = -time.Second },
			"--reload-interval-min -1s is outside 0..60s"},
		{"timeout -1s", func(c *AgentConfig) { c.ReloadTimeout = -time.Second },
			"--reload-timeout must be between 0 and 1m0s, got -1s"},
		{"timeout 61s", func(c *AgentConfig) { c.ReloadTimeout = 61 * time.Second },
			"--reload-timeout must be between 0 and 1m0s, got 1m1s"},
		{"negative quiet", func(c *AgentConfig) { c.DrainQuietPeriod = -time.Second },
			"--drain-quiet-period must not be negative, got -1s"},
		{"negative max wait", func(c *AgentConfig) { c.DrainMaxWait = -time.Second },
			"--drain-max-wait must not be negative, got -1s"},
		{"max wait 6m", func(c *AgentConfig) { c.DrainMaxWait = 6 * time.Minute },
			"--drain-max-wait must be at most 5m0s, got 6m0s"},
		{"quiet over max", func(c *AgentConfig) { c.DrainQuietPeriod = 3 * time.Second; c.DrainMaxWait = 2 * time.Second },
			"--drain-quiet-period 3s exceeds --drain-max-wait 2s"},
		{"TLS without client name", func(c *AgentConfig) { c.TLSDir = emptyTLS },
			"--tls-client-name is required with --tls-dir"},
		{"half Basic (user)", func(c *AgentConfig) { c.Password = "" },
			"DATAPLANE_USERNAME and DATAPLANE_PASSWORD must be set together"},
		{"half Basic (password)", func(c *AgentConfig) { c.Username = "" },
			"DATAPLANE_USERNAME and DATAPLANE_PASSWORD must be set together"},
		{"no auth", func(c *AgentConfig) { c.Username, c.Password = "", "" },
			"no authentication configured: use --tls-dir, or set DATAPLANE_USERNAME and DATAPLANE_PASSWORD, or pass --insecure-no-auth"},
		{"base dir not a directory", func(c *AgentConfig) { c.BaseDir = notDir },
			"--base-dir: " + notDir + " is not a directory"},
		{"admin socket too long", func(c *AgentConfig) { c.BaseDir = longDir; c.AdminSocket = "admin-socket-name.sock" },
			"--admin-socket: " + filepath.Join(longDir, "admin-socket-name.sock") + " exceeds the 107-byte unix socket path limit"},
		{"drain socket too long", func(c *AgentConfig) { c.BaseDir = longDir; c.DrainSocket = "drain-socket-name.sock" },
			"--drain-socket: " + filepath.Join(longDir, "drain-socket-name.sock") + " exceeds the 107-byte unix socket path limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validTestConfig(t)
			tc.mutate(&cfg)
			err := newTestAgentOrError(t, cfg)
			if err == nil || err.Error() != tc.want {
				t.Errorf("NewAgent = %v\nwant        %s", err, tc.want)
			}
		})
	}
	t.Run("missing base dir", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.BaseDir = filepath.Join(cfg.BaseDir, "absent")
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--base-dir: ") || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("NewAgent = %v", err)
		}
	})
	t.Run("unusable TLS dir", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.TLSDir, cfg.TLSClientName = emptyTLS, "controller"
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--tls-dir: ") {
			t.Errorf("NewAgent = %v", err)
		}
	})
	t.Run("bad listen", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.Listen = "256.0.0.1:bad"
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--listen: ") {
			t.Errorf("NewAgent = %v", err)
		}
	})
}

func TestNewAgentFillsDefaults(t *testing.T) {
	cfg := validTestConfig(t)
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.closeListeners()
	got := a.cfg
	if got.ReloadTimeout != 60*time.Second || got.DrainQuietPeriod != 2*time.Second || got.DrainMaxWait != 10*time.Second {
		t.Errorf("durations: %v %v %v", got.ReloadTimeout, got.DrainQuietPeriod, got.DrainMaxWait)
	}
	if got.ConfigFile != "haproxy.cfg" || got.MasterSocket != "haproxy-master.sock" || got.WorkerSocket != "haproxy-worker.sock" ||
		got.StateFile != ".haptic-agent.json" || got.AgentVersion != "dev" || got.Logger == nil {
		t.Errorf("names: %+v", got)
	}
	base := cfg.BaseDir
	want := agentPaths{
		config: filepath.Join(base, "haproxy.cfg"), state: filepath.Join(base, ".haptic-agent.json"),
		master: filepath.Join(base, "haproxy-master.sock"), worker: filepath.Join(base, "haproxy-worker.sock"),
		planBlob: filepath.Join(base, ".haptic-agent-plan.bin"), log: filepath.Join(base, ".haptic-agent.log"),
	}
	if a.paths != want {
		t.Errorf("paths = %+v\nwant %+v", a.paths, want)
	}
	// The listen default is the flag's; it is not bound here.
	c := AgentConfig{}
	fillAgentDefaults(&c)
	if c.Listen != ":5555" || c.AdminSocket != "" || c.DrainSocket != "" || c.MetricsListen != "" || c.TLSDir != "" {
		t.Errorf("off-by-default fields: %+v", c)
	}
	// Absolute socket paths stay as given.
	cfg = validTestConfig(t)
	cfg.MasterSocket = "/run/haproxy/master.sock"
	p, err := resolveAgentPaths(&cfg)
	if err != nil || p.master != "/run/haproxy/master.sock" {
		t.Errorf("absolute master socket: %q %v", p.master, err)
	}
}

func TestValidateDrainFillsDefaultsAndRejectsAnInvertedWindow(t *testing.T) {
	q, m, err := validateDrain(0, 0)
	if err != nil || q != 2*time.Second || m != 10*time.Second {
		t.Errorf("defaults: %v %v %v", q, m, err)
	}
	q, m, err = validateDrain(time.Second, 5*time.Minute)
	if err != nil || q != time.Second || m != 5*time.Minute {
		t.Errorf("max bound: %v %v %v", q, m, err)
	}
	if _, _, err := validateDrain(11*time.Second, 0); err == nil || err.Error() != "--drain-quiet-period 11s exceeds --drain-max-wait 10s" {
		t.Errorf("inverted window: %v", err)
	}
	if _, _, err := validateDrain(0, 5*time.Minute+time.Millisecond); err == nil || err.Error() != "--drain-max-wait must be at most 5m0s, got 5m0.001s" {
		t.Errorf("over 5m: %v", err)
	}
}

func TestLocalSocketsCannotReplaceAgentFilesOrOtherSockets(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*AgentConfig)
		want   string // with <base> for the base directory
	}{
		{"master and admin", func(c *AgentConfig) { c.AdminSocket = "haproxy-master.sock" },
			"--master-socket and --admin-socket share <base>/haproxy-master.sock; choose distinct file and socket paths"},
		{"state file and config", func(c *AgentConfig) { c.StateFile = "haproxy.cfg" },
			"--config and --state-file share <base>/haproxy.cfg; choose distinct file and socket paths"},
		{"worker and drain", func(c *AgentConfig) { c.DrainSocket = "./sub/../haproxy-worker.sock" },
			"--worker-socket and --drain-socket share <base>/haproxy-worker.sock; choose distinct file and socket paths"},
		{"absolute and relative", func(c *AgentConfig) { c.StateFile = filepath.Join(c.BaseDir, "x.sock"); c.AdminSocket = "x.sock" },
			"--state-file and --admin-socket share <base>/x.sock; choose distinct file and socket paths"},
		{"drain and admin", func(c *AgentConfig) { c.DrainSocket = "a.sock"; c.AdminSocket = "a.sock" },
			"--drain-socket and --admin-socket share <base>/a.sock; choose distinct file and socket paths"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validTestConfig(t)
			tc.mutate(&cfg)
			err := newTestAgentOrError(t, cfg)
			want := strings.ReplaceAll(tc.want, "<base>", cfg.BaseDir)
			if err == nil || err.Error() != want {
				t.Errorf("NewAgent = %v\nwant        %s", err, want)
			}
		})
	}
}

func TestLocalSocketCannotReplaceRegularFiles(t *testing.T) {
	cfg := validTestConfig(t)
	dir, err := os.MkdirTemp("", "ha")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "admin.sock")
	os.WriteFile(path, []byte("precious"), 0o644)
	cfg.AdminSocket = path
	err = newTestAgentOrError(t, cfg)
	want := "local agent socket " + path + " is occupied by a non-socket file; choose another path"
	if err == nil || err.Error() != want {
		t.Errorf("NewAgent = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Errorf("the file was touched: %q", b)
	}
	// A stale socket is replaced.
	os.Remove(path)
	cfg.AdminSocket = filepath.Join(dir, "stale.sock")
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.adminLn.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	a.closeListeners()
	if fi, err := os.Lstat(cfg.AdminSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no stale socket left to test with: %v", err)
	}
	a, err = NewAgent(cfg)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	fi, _ := os.Lstat(cfg.AdminSocket)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin socket mode %v", fi.Mode())
	}
	a.closeListeners()
}

func TestInsecureNoAuthAllowsStartingWithoutCredentials(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.Username, c.Password, c.InsecureNoAuth = "", "", true
	})
	c := newAgentClient(t, a)
	c.user = ""
	if st := c.state(""); st.APIVersion != 1 {
		t.Errorf("state: %+v", st)
	}
	fs := seedFiles()
	if res := c.apply(c.manifest("plan-1", fs), fs); !res.OK {
		t.Errorf("apply: %+v", res)
	}
	if code, _, b := c.do("PUT", PathPlan+"?plan_id=x&proof=y", strings.NewReader("blob"), ""); code != http.StatusConflict {
		t.Errorf("put plan: %d %s", code, b)
	}
}

func TestACorruptStateFileIsFatal(t *testing.T) {
	cfg := validTestConfig(t)
	path := filepath.Join(cfg.BaseDir, ".haptic-agent.json")
	os.WriteFile(path, []byte("{not json"), 0o600)
	err := newTestAgentOrError(t, cfg)
	if err == nil || !strings.HasPrefix(err.Error(), "parse "+path+": ") {
		t.Errorf("NewAgent = %v", err)
	}
	// Unknown fields are ignored.
	os.WriteFile(path, []byte(`{"generation":3,"from_the_future":true}`), 0o600)
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatalf("unknown field: %v", err)
	}
	a.closeListeners()
	if gen := a.led.generation(); gen != 3 {
		t.Errorf("generation %d", gen)
	}
}

// ---------------------------------------------------------------------------
// Startup, readiness, recovery.

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

func TestReadinessWaitsForEveryCondition(t *testing.T) {
	fake := startTestFake(t, "")
	for _, missing := range []string{"worker", "master"} {
		t.Run("without the "+missing, func(t *testing.T) {
			dir := shortTempDir(t)
			cfg := testAgentConfig(t, fake)
			cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
			a, _ := launchTestAgent(t, cfg, false)
			link := func(target, name string) {
				if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			if missing == "worker" {
				link(fake.MasterSocket(), "m.sock")
			} else {
				link(fake.WorkerSocket(), "w.sock")
			}
			for range 4 { // several probe rounds
				if code, body := getText(t, a, PathReadyz); code != http.StatusServiceUnavailable || body != "initialising\n" {
					t.Fatalf("readyz = %d %q", code, body)
				}
				if a.Ready() {
					t.Fatal("ready without the " + missing)
				}
				time.Sleep(150 * time.Millisecond)
			}
			if code, body := getText(t, a, PathHealthz); code != http.StatusOK || body != "ok\n" {
				t.Errorf("healthz before ready = %d %q", code, body)
			}
			if missing == "worker" {
				link(fake.WorkerSocket(), "w.sock")
			} else {
				link(fake.MasterSocket(), "m.sock")
			}
			waitFor(t, "readiness", a.Ready)
			if code, body := getText(t, a, PathReadyz); code != http.StatusOK || body != "ready\n" {
				t.Errorf("readyz = %d %q", code, body)
			}
		})
	}
}

// editState rewrites the state file of a stopped agent.
func editState(t testing.TB, base string, edit func(m map[string]any)) {
	t.Helper()
	path := filepath.Join(base, ".haptic-agent.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// readStateFile reads the persisted state: the snapshot with the log
// replayed on it, as the next start would read it.
func readStateFile(t testing.TB, base string) agentState {
	t.Helper()
	loaded, err := loadLog(osDisk{}, filepath.Join(base, ".haptic-agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	return loaded.st
}

func TestReadinessStaysTrueAfterAFailedRecoveryReload(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	c.apply(c.manifest("plan-1", fs), fs)
	stop()
	editState(t, cfg.BaseDir, func(m map[string]any) { m["phase"] = "written"; m["in_flight_plan_id"] = "plan-2" })
	fake.With(func(m *FakeModel) { m.ReloadFails = true })

	a, _ = launchTestAgent(t, cfg, true)
	c = newAgentClient(t, a)
	if code, body := getText(t, a, PathReadyz); code != http.StatusOK || body != "ready\n" {
		t.Errorf("readyz = %d %q", code, body)
	}
	st := c.state("")
	if st.InvariantViolation != "recovery_reload" || metricValue(a, "invariant_violations_total", "recovery_reload") != 1 {
		t.Errorf("invariant %q", st.InvariantViolation)
	}
	if st.RunningPlanID != "" || st.AppliedPlanID != "" {
		t.Errorf("after a failed recovery reload: running %q applied %q", st.RunningPlanID, st.AppliedPlanID)
	}
	if ps := readStateFile(t, cfg.BaseDir); ps.Phase != "" || ps.InFlightPlanID != "" {
		t.Errorf("phase %q in flight %q", ps.Phase, ps.InFlightPlanID)
	}
	// A later apply neither takes readiness away nor needs a restart.
	fake.With(func(m *FakeModel) { m.ReloadFails = false })
	if res := c.apply(c.manifest("plan-3", fs), fs); !res.OK || res.Mode != ResultReload {
		t.Errorf("apply after recovery: %+v", res)
	}
	if !a.Ready() {
		t.Error("readiness went back to false")
	}
}

// While HAProxy does not answer the startup probe, a state read answers at
// once with a 503 that names what the agent waits for; once HAProxy is
// there, the same read answers the initialised state.
func TestStateSaysWhatTheAgentWaitsFor(t *testing.T) {
	fake := startTestFake(t, "")
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	a, _ := launchTestAgent(t, cfg, false)
	c := newAgentClient(t, a)
	var code int
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		start := time.Now()
		code, _, body = c.do("GET", PathState, nil, "")
		if took := time.Since(start); took > stateInitGrace/2 {
			t.Errorf("the read took %s while HAProxy is away", took)
		}
		if code != http.StatusServiceUnavailable || !bytes.Contains(body, []byte(msgAgentInitialising)) {
			break // the first probe has failed: the read now says why
		}
	}
	var e ApplyError
	if code != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Stage != StageStartup ||
		!strings.HasPrefix(e.Message, "agent is waiting for HAProxy (worker socket "+cfg.WorkerSocket) ||
		!strings.Contains(e.Message, "no such file or directory") {
		t.Fatalf("state while HAProxy is away: %d %s", code, body)
	}
	os.Symlink(fake.WorkerSocket(), cfg.WorkerSocket)
	os.Symlink(fake.MasterSocket(), cfg.MasterSocket)
	for deadline := time.Now().Add(10 * time.Second); !a.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent never became ready")
		}
	}
	if st := c.state(""); st.HAProxy.WorkerPID != fake.Worker().WorkerPID || st.APIVersion != 1 {
		t.Errorf("state: %+v", st)
	}
}

func TestStateWaitRespectsCancellation(t *testing.T) {
	fake := startTestFake(t, "")
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	// A worker socket that accepts and never answers: the startup probe
	// neither succeeds nor fails, so a state read waits out its grace
	// (one whose probe fails is answered at once, with why).
	ln, err := net.Listen("unix", cfg.WorkerSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	a, _ := launchTestAgent(t, cfg, false)

	ctx, cancel := context.WithCancel(context.Background())
	rec := &recordingWriter{header: http.Header{}}
	req := httptestRequest(ctx, "GET", PathState)
	done := make(chan struct{})
	go func() { a.handleState(rec, req); close(done) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not return on cancellation")
	}
	if rec.wrote || rec.body.Len() != 0 {
		t.Errorf("a cancelled state read wrote %d %q", rec.code, rec.body.String())
	}
	// Over the network the client sees no answer at all.
	rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer rcancel()
	hreq, _ := http.NewRequestWithContext(rctx, "GET", "http://"+a.Addr()+PathState, nil)
	hreq.SetBasicAuth("haptic", "s3cret")
	if resp, err := http.DefaultClient.Do(hreq); err == nil {
		resp.Body.Close()
		t.Errorf("got an answer: %d", resp.StatusCode)
	}
}

// recordingWriter is a minimal http.ResponseWriter that records whether
// anything was written.
type recordingWriter struct {
	header http.Header
	code   int
	wrote  bool
	body   bytes.Buffer
}

func (w *recordingWriter) Header() http.Header { return w.header }
func (w *recordingWriter) WriteHeader(code int) {
	w.code, w.wrote = code, true
}
func (w *recordingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.body.Write(b)
}

func httptestRequest(ctx context.Context, method, target string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, method, "http://agent"+target, nil)
	return req
}

func TestARestartBetweenAppliesKeepsTheBaseline(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	first := c.apply(c.manifest("plan-1", fs), fs)
	stop()

	a, _ = launchTestAgent(t, cfg, true)
	c2 := newAgentClient(t, a)
	c2.seq = c.seq
	st := c2.state("")
	if st.AppliedPlanID != "plan-1" || st.AppliedToken != first.AppliedToken || st.Generation != 1 {
		t.Errorf("after restart: %+v", st)
	}
	// The tree and the worker are unchanged: every proof still holds.
	if st.AppliedPlanProof != first.AppliedPlanProof || st.RunningPlanProof != first.RunningPlanProof ||
		st.WorkerOpsPlanProof != first.WorkerOpsPlanProof || st.LKGPlanProof != first.LKGPlanProof {
		t.Errorf("proofs lost in the restart: %+v", st)
	}
	for p, at := range st.Files {
		if at.Proof == "" {
			t.Errorf("%s lost its proof", p)
		}
	}
	fs2 := fs.clone()
	fs2["maps/host.map"] += "example.org be-b\n"
	m := c2.manifestFrom(st, "plan-2", fs2)
	m.Mode = ModeReload
	res := c2.apply(m, fs2)
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != "plan-2" {
		t.Errorf("reload apply after restart: %+v", res)
	}
	if res.AppliedPlanProof == first.AppliedPlanProof || res.AppliedPlanProof != "a:2" {
		t.Errorf("proof %q reused or out of sequence", res.AppliedPlanProof)
	}
}

// A restart with the same tree and the same worker keeps what both still
// prove: the proofs, the stored blob's binding and a scheduled reload with
// its due time. The known-bad cache is not kept: it lives in memory.
func TestARestartKeepsWhatTheTreeAndTheWorkerProve(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	c.post(applyRequest{manifest: c.manifest("plan-1", fs), files: fs, plan: []byte("blob-1")})
	before := c.state("")
	if !before.AppliedPlanStored {
		t.Fatalf("blob not stored: %+v", before)
	}
	stop()
	due := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	editState(t, cfg.BaseDir, func(m map[string]any) {
		m["pending_reload_plan_id"], m["pending_reload_plan_proof"], m["reload_pending_at"] = "plan-1", before.AppliedPlanProof, due
		m["nack"] = map[string]any{"manifest_digest": "0123456789abcdef", "reason": "reload", "until": due}
	})

	a, _ = launchTestAgent(t, cfg, true)
	c = newAgentClient(t, a)
	st := c.state("")
	if st.AppliedPlanProof != before.AppliedPlanProof || st.RunningPlanProof != before.RunningPlanProof ||
		st.WorkerOpsPlanProof != before.WorkerOpsPlanProof || st.LKGPlanProof != before.LKGPlanProof ||
		st.ReloadPendingAt == "" || !st.AppliedPlanStored || string(st.AppliedPlan) != "blob-1" {
		t.Errorf("state after restart: %+v", st)
	}
	if a.led.nack != nil {
		t.Error("the known-bad record survived the restart")
	}
}

func TestATreeThatChangedWhileTheAgentWasAwayInvalidatesTheBaseline(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	c.apply(c.manifest("plan-1", fs), fs)
	stop()
	os.WriteFile(filepath.Join(cfg.BaseDir, "haproxy.cfg"), []byte("global\n  # edited by hand\n"), 0o644)

	a, _ = launchTestAgent(t, cfg, true)
	st := newAgentClient(t, a).state("")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("baseline survived an edited tree: %+v", st)
	}
	if st.Files["haproxy.cfg"].Digest != DigestString("global\n  # edited by hand\n") {
		t.Errorf("files: %+v", st.Files)
	}
}

func TestAnInterruptedApplyReloadsWhatIsOnDisk(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	c.apply(c.manifest("plan-1", fs), fs)
	stop()
	editState(t, cfg.BaseDir, func(m map[string]any) { m["phase"] = "written"; m["in_flight_plan_id"] = "plan-2" })
	pid := fake.Worker().WorkerPID

	a, _ = launchTestAgent(t, cfg, true)
	st := newAgentClient(t, a).state("")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("baseline after recovery: %+v", st)
	}
	if fake.Worker().WorkerPID <= pid || st.HAProxy.WorkerPID != fake.Worker().WorkerPID {
		t.Errorf("no recovery reload: pid %d → %d (state %d)", pid, fake.Worker().WorkerPID, st.HAProxy.WorkerPID)
	}
	if st.LKGPlanID != "plan-1" || st.InvariantViolation != "" {
		t.Errorf("LKG %q invariant %q", st.LKGPlanID, st.InvariantViolation)
	}
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

func TestAnInterruptedBackedUpApplyRestoresTheJournal(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	lkg := seedFiles()
	lkg["notes/readme.txt"] = "v1\n"
	c.apply(c.manifest("plan-1", lkg), lkg)
	next := lkg.clone()
	next["notes/readme.txt"] = "v2\n"
	next["notes/new.txt"] = "new\n"
	delete(next, "maps/host.map")
	applyFileOnly(t, c, "plan-2", next)
	stop()
	// A third apply was cut half way through its writes (to journalled
	// paths: an older agent journalled every path it was about to write).
	os.WriteFile(filepath.Join(cfg.BaseDir, "notes/readme.txt"), []byte("half written\n"), 0o644)
	os.WriteFile(filepath.Join(cfg.BaseDir, "notes/new.txt"), []byte("half\n"), 0o644)
	editState(t, cfg.BaseDir, func(m map[string]any) { m["phase"] = "backed_up"; m["in_flight_plan_id"] = "plan-3" })

	a, _ = launchTestAgent(t, cfg, true)
	if got := diskSet(t, cfg.BaseDir); !sameSet(got, lkg) {
		t.Errorf("tree after recovery = %v\nwant the LKG set %v", got, lkg)
	}
	st := newAgentClient(t, a).state("")
	if !slices.Equal(slices.Sorted(mapsKeys(st.Files)), lkg.paths()) {
		t.Errorf("state files %v", st.Files)
	}
	ps := readStateFile(t, cfg.BaseDir)
	if len(ps.Journal.Entries) != 0 || !slices.Equal(ps.ManifestPaths, lkg.paths()) || ps.Phase != "" {
		t.Errorf("state file: journal %v paths %v phase %q", ps.Journal.Entries, ps.ManifestPaths, ps.Phase)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestAScheduledReloadWaitsForStartupToFinish(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	a, stop := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	c.apply(c.manifest("plan-1", fs), fs)
	fs2 := fs.clone()
	fs2["notes/extra.txt"] = "extra\n"
	applyFileOnly(t, c, "plan-2", fs2)
	stop()
	editState(t, cfg.BaseDir, func(m map[string]any) {
		m["pending_reload_plan_id"], m["pending_reload_plan_proof"] = "plan-2", "a:2"
		m["reload_pending_at"] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	})
	dir := shortTempDir(t)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	a, _ = launchTestAgent(t, cfg, false)
	time.Sleep(time.Second)
	if a.Ready() {
		t.Fatal("ready without HAProxy")
	}
	if got := diskSet(t, cfg.BaseDir); !sameSet(got, fs2) {
		t.Errorf("the tree changed before startup finished: %v", got)
	}
}

// ---------------------------------------------------------------------------
// Authentication and handlers.

func TestAuthenticationIsRequiredForTheAPIButNotTheProbes(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, nil)
	for _, p := range []string{PathHealthz, PathReadyz} {
		if code, _ := getText(t, a, p); code != http.StatusOK {
			t.Errorf("%s without auth: %d", p, code)
		}
	}
	c := newAgentClient(t, a)
	for _, tc := range []struct {
		name, user, pass, method, path string
	}{
		{"no header", "", "", "GET", PathState},
		{"wrong password", "haptic", "wrong", "GET", PathState},
		{"wrong user", "admin", "s3cret", "GET", PathState},
		{"apply without auth", "", "", "POST", PathApply},
		{"plan without auth", "", "", "PUT", PathPlan + "?plan_id=a&proof=b"},
	} {
		c.user, c.pass = tc.user, tc.pass
		code, h, b := c.do(tc.method, tc.path, strings.NewReader("x"), "text/plain")
		if code != http.StatusUnauthorized || h.Get("WWW-Authenticate") != `Basic realm="haptic-agent"` ||
			string(b) != "unauthorized\n" || h.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("%s: %d %q %q", tc.name, code, h.Get("WWW-Authenticate"), b)
		}
	}
	c.user, c.pass = "haptic", "s3cret"
	if st := c.state(""); st.APIVersion != 1 {
		t.Errorf("with auth: %+v", st)
	}
}

// tlsFixture is a --tls-dir with its CAs, and clients built from them.
type tlsFixture struct {
	dir              string
	serverCA, client *testCA
}

func (f *tlsFixture) write(t testing.TB, serverCert, serverKey, clientCAPEM []byte) {
	t.Helper()
	bump := time.Now().Add(time.Duration(len(serverCert)) * time.Millisecond)
	for name, b := range map[string][]byte{tlsCertFile: serverCert, tlsKeyFile: serverKey, tlsCAFile: clientCAPEM} {
		p := filepath.Join(f.dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		// Make the change visible even within the file system's timestamp
		// granularity.
		os.Chtimes(p, bump, bump.Add(2*time.Second))
	}
}

func newTLSFixture(t testing.TB) *tlsFixture {
	f := &tlsFixture{dir: t.TempDir(), serverCA: newTestCA(t, "server-ca"), client: newTestCA(t, "client-ca")}
	cert, key := f.serverCA.issue(t, testCertOptions{CommonName: "agent", DNSNames: []string{"agent.test"}})
	f.write(t, cert, key, f.client.CertPEM)
	return f
}

// tlsGet makes one request over a fresh TLS connection (no reuse, so every
// request is a new handshake).
func tlsGet(t testing.TB, a *Agent, path string, roots *testCA, clientCert, clientKey []byte) (int, http.Header, string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots.CertPEM)
	cfg := &tls.Config{RootCAs: pool, ServerName: "agent.test"}
	if clientCert != nil {
		pair, err := tls.X509KeyPair(clientCert, clientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := hc.Get("https://" + a.Addr() + path)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), nil
}

func TestMutualTLS(t *testing.T) {
	fake := startTestFake(t, "")
	fx := newTLSFixture(t)
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.TLSDir, c.TLSClientName, c.Username, c.Password = fx.dir, "controller.haptic", "", ""
	})
	good, goodKey := fx.client.issue(t, testCertOptions{CommonName: "c", DNSNames: []string{"other", "Controller.HAPTIC"}, Client: true})
	wrongSAN, wrongSANKey := fx.client.issue(t, testCertOptions{CommonName: "controller.haptic", DNSNames: []string{"intruder"}, Client: true})
	wildcard, wildcardKey := fx.client.issue(t, testCertOptions{CommonName: "c", DNSNames: []string{"*.haptic"}, Client: true})
	// Verified in the handshake, so refused there: see agent_tls_test.go.
	tests := []struct {
		name       string
		path       string
		cert, key  []byte
		wantStatus int
	}{
		{"CA-signed with the client name", PathState, good, goodKey, http.StatusOK},
		{"wrong SAN", PathState, wrongSAN, wrongSANKey, http.StatusUnauthorized},
		{"wildcard not expanded", PathState, wildcard, wildcardKey, http.StatusUnauthorized},
		{"healthz with any trusted certificate", PathHealthz, wrongSAN, wrongSANKey, http.StatusOK},
		{"readyz with any trusted certificate", PathReadyz, wrongSAN, wrongSANKey, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, h, body, err := tlsGet(t, a, tc.path, fx.serverCA, tc.cert, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantStatus {
				t.Fatalf("status %d, want %d (%s)", code, tc.wantStatus, body)
			}
			if code == http.StatusUnauthorized && (body != "client certificate rejected\n" || h.Get("WWW-Authenticate") != "") {
				t.Errorf("401 body %q, WWW-Authenticate %q", body, h.Get("WWW-Authenticate"))
			}
		})
	}
}

func TestMutualTLSPicksUpRotatedFiles(t *testing.T) {
	fake := startTestFake(t, "")
	fx := newTLSFixture(t)
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.TLSDir, c.TLSClientName, c.Username, c.Password = fx.dir, "controller", "", ""
	})
	oldClient, oldClientKey := fx.client.issue(t, testCertOptions{DNSNames: []string{"controller"}, Client: true})
	if code, _, _, err := tlsGet(t, a, PathState, fx.serverCA, oldClient, oldClientKey); err != nil || code != 200 {
		t.Fatalf("before rotation: %d %v", code, err)
	}
	// Rotate all three files to new CAs.
	newServerCA, newClientCA := newTestCA(t, "server-ca-2"), newTestCA(t, "client-ca-2")
	cert, key := newServerCA.issue(t, testCertOptions{DNSNames: []string{"agent.test"}})
	fx.write(t, cert, key, newClientCA.CertPEM)
	newClient, newClientKey := newClientCA.issue(t, testCertOptions{DNSNames: []string{"controller"}, Client: true})
	if code, _, _, err := tlsGet(t, a, PathState, newServerCA, newClient, newClientKey); err != nil || code != 200 {
		t.Fatalf("after rotation, new material: %d %v", code, err)
	}
	if err := tlsRefusal(t, a, newServerCA, oldClient, oldClientKey); err == nil || !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Errorf("after rotation, the old client: %v", err)
	}
	if _, _, _, err := tlsGet(t, a, PathHealthz, fx.serverCA, newClient, newClientKey); err == nil {
		t.Error("the old server certificate is still served")
	}
	// A broken replacement keeps the material in use.
	fx.write(t, []byte("not a certificate"), []byte("not a key"), []byte("garbage"))
	for range 2 {
		if code, _, _, err := tlsGet(t, a, PathState, newServerCA, newClient, newClientKey); err != nil || code != 200 {
			t.Fatalf("after a broken rotation: %d %v", code, err)
		}
	}
}

func TestLocalAgentHealthSurvivesExpiredIdentity(t *testing.T) {
	fake := startTestFake(t, "")
	fx := newTLSFixture(t)
	expired, expiredKey := fx.serverCA.issue(t, testCertOptions{DNSNames: []string{"agent.test"}, NotAfter: time.Now().Add(-time.Minute)})
	fx.write(t, expired, expiredKey, fx.client.CertPEM)
	admin := filepath.Join(shortTempDir(t), "admin.sock")
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.TLSDir, c.TLSClientName, c.Username, c.Password = fx.dir, "controller", "", ""
		c.AdminSocket = admin
	})
	client, clientKey := fx.client.issue(t, testCertOptions{DNSNames: []string{"controller"}, Client: true})
	if _, _, _, err := tlsGet(t, a, PathHealthz, fx.serverCA, client, clientKey); err == nil {
		t.Fatal("an expired serving certificate verified")
	}
	uc := unixClient(admin)
	for _, p := range []string{PathHealthz, PathState} {
		resp, err := uc.Get("http://agent" + p)
		if err != nil {
			t.Fatalf("admin %s: %v", p, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("admin %s: %d", p, resp.StatusCode)
		}
	}
	cert, key := fx.serverCA.issue(t, testCertOptions{DNSNames: []string{"agent.test"}})
	fx.write(t, cert, key, fx.client.CertPEM)
	if code, _, _, err := tlsGet(t, a, PathState, fx.serverCA, client, clientKey); err != nil || code != 200 {
		t.Errorf("after rotation: %d %v", code, err)
	}
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

func TestLocalAgentStateSocketRejectsMutations(t *testing.T) {
	fake := startTestFake(t, "")
	admin := filepath.Join(shortTempDir(t), "admin.sock")
	cfg := testAgentConfig(t, fake)
	cfg.AdminSocket = admin
	_, stop := launchTestAgent(t, cfg, true)
	uc := unixClient(admin)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"POST", PathApply, 404}, {"PUT", PathPlan, 404}, {"POST", PathState, 405},
		{"GET", PathState, 200}, {"GET", PathHealthz, 200}, {"GET", PathReadyz, 404},
	} {
		req, _ := http.NewRequest(tc.method, "http://agent"+tc.path, strings.NewReader("x"))
		resp, err := uc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s = %d %s", tc.method, tc.path, resp.StatusCode, b)
		}
		if tc.want == 200 && tc.path == PathState {
			var st State
			if err := json.Unmarshal(b, &st); err != nil || st.APIVersion != 1 {
				t.Errorf("admin state: %v %s", err, b)
			}
		}
	}
	stop()
	if _, err := os.Lstat(admin); !os.IsNotExist(err) {
		t.Errorf("the admin socket is still there: %v", err)
	}
}

func TestHandlersAnswerExactBodies(t *testing.T) {
	fake := startTestFake(t, "")
	ready := startTestAgent(t, fake, nil)
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	starting, _ := launchTestAgent(t, cfg, false)

	const text, js = "text/plain; charset=utf-8", "application/json"
	tests := []struct {
		name         string
		a            *Agent
		method, path string
		contentType  string
		body         string
		wantCode     int
		wantType     string
		wantBody     string
	}{
		{"healthz", ready, "GET", PathHealthz, "", "", 200, text, "ok\n"},
		{"healthz while starting", starting, "GET", PathHealthz, "", "", 200, text, "ok\n"},
		{"readyz", ready, "GET", PathReadyz, "", "", 200, text, "ready\n"},
		{"readyz while starting", starting, "GET", PathReadyz, "", "", 503, text, "initialising\n"},
		{"unknown path", ready, "GET", "/v1/nothing", "", "", 404, text, "404 page not found\n"},
		{"wrong method", ready, "POST", PathState, "", "", 405, text, "Method Not Allowed\n"},
		{"apply before ready", starting, "POST", PathApply, "text/plain", "x", 503, js,
			`{"stage":"startup","message":"agent is initialising"}` + "\n"},
		{"plan before ready", starting, "PUT", PathPlan + "?plan_id=a&proof=b", "", "x", 503, js,
			`{"stage":"startup","message":"agent is initialising"}` + "\n"},
		{"not multipart", ready, "POST", PathApply, "application/json", "{}", 400, js,
			`{"stage":"request","message":"request Content-Type isn't multipart/form-data"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newAgentClient(t, tc.a)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			code, h, b := c.do(tc.method, tc.path, body, tc.contentType)
			if code != tc.wantCode || h.Get("Content-Type") != tc.wantType || string(b) != tc.wantBody {
				t.Errorf("got %d %q %q\nwant %d %q %q", code, h.Get("Content-Type"), b, tc.wantCode, tc.wantType, tc.wantBody)
			}
		})
	}
}
