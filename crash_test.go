// This file owns crash consistency: the agent runs as a child process (the
// test binary re-executed, pointed at a fake HAProxy the parent serves), is
// killed with SIGKILL between any two file operations of an apply (every
// durable point among them), and is restarted on the same tree. After the
// restart the tree must be exactly the set before the apply or the apply's
// set, never a mix; the state must name a plan only if the tree is its
// files; an answered apply must still be applied; generations and proofs
// never go backwards; and the next apply must succeed. It also owns the
// child process harness, which the RSS benchmark reuses.
//
// The child stops through a hook of the test binary, never of the agent:
// it builds its agent over a disk that counts every file operation after
// readiness and blocks for good at the one the parent names.

package haptic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The agent as a child process.

// agentChildEnv carries the child's configuration as JSON; its presence is
// what makes TestAgentChildProcess run an agent.
const agentChildEnv = "HAPTIC_AGENT_CHILD"

// agentChildConfig is what the parent tells the child.
type agentChildConfig struct {
	BaseDir           string
	MasterSocket      string
	WorkerSocket      string
	AddrFile          string // the child writes its API address here once bound
	ReloadIntervalMin time.Duration

	// OpsLog, when set, receives one line per file operation the agent
	// performs after it is ready; StopAtOp > 0 blocks the agent for good at
	// that operation (counted the same way, from 1), after writing the
	// operation to StopMarker.
	OpsLog     string
	StopAtOp   int
	StopMarker string
}

// TestAgentChildProcess is not a test: it is the body of the child process
// the crash test and the RSS benchmark start. It runs an agent until
// SIGTERM, or until it is killed.
func TestAgentChildProcess(t *testing.T) {
	raw := os.Getenv(agentChildEnv)
	if raw == "" {
		t.Skip("the body of the agent child process; runs only when the crash test or the RSS benchmark starts it")
	}
	var c agentChildConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(2)
	}
	d := &hookDisk{}
	var armed atomic.Bool
	if c.OpsLog != "" || c.StopAtOp > 0 {
		d.setHook(childStopHook(c, &armed))
	}
	a, err := newAgent(AgentConfig{
		BaseDir: c.BaseDir, ConfigFile: ConfigFilePath, StateFile: ".haptic-agent.json",
		MasterSocket: c.MasterSocket, WorkerSocket: c.WorkerSocket,
		Username: "haptic", Password: "s3cret", Listen: "127.0.0.1:0",
		ReloadIntervalMin: c.ReloadIntervalMin, ReloadTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, agentOptions{disk: d})
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(2)
	}
	// Written aside and renamed, so the parent never reads half an address.
	if err := os.WriteFile(c.AddrFile+".tmp", []byte(a.Addr()), 0o600); err == nil {
		err = os.Rename(c.AddrFile+".tmp", c.AddrFile)
	}
	if _, err := os.Stat(c.AddrFile); err != nil {
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(2)
	}
	go func() {
		for !a.Ready() {
			time.Sleep(time.Millisecond)
		}
		armed.Store(true)
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := a.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childStopHook counts the agent's file operations once armed, logs each,
// and blocks for good at StopAtOp. The log and the marker are written with
// the os package, outside the agent's disk.
func childStopHook(c agentChildConfig, armed *atomic.Bool) func(diskOp) error {
	var mu sync.Mutex
	n := 0
	return func(op diskOp) error {
		if !armed.Load() {
			return nil
		}
		mu.Lock()
		n++
		at := n
		if c.OpsLog != "" {
			f, err := os.OpenFile(c.OpsLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			if err == nil {
				fmt.Fprintf(f, "%d %s %s\n", at, op.Op, op.Path)
				f.Close()
			}
		}
		mu.Unlock()
		if at == c.StopAtOp {
			os.WriteFile(c.StopMarker, []byte(op.Op+" "+op.Path), 0o600)
			select {} // the parent kills the process here
		}
		return nil
	}
}

// agentChild is one running child agent.
type agentChild struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	output *lockedBuffer
	http   *http.Client
}

// startAgentChild starts the test binary as an agent on cfg, with extra
// environment entries, and waits until it is ready. Cleanup kills it.
func startAgentChild(t testing.TB, cfg agentChildConfig, env ...string) *agentChild {
	t.Helper()
	os.Remove(cfg.AddrFile)
	raw, _ := json.Marshal(cfg)
	c := &agentChild{exited: make(chan struct{}), output: &lockedBuffer{},
		http: &http.Client{Timeout: 60 * time.Second}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestAgentChildProcess$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), agentChildEnv+"="+string(raw))
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout, c.cmd.Stderr = c.output, c.output
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("agent child output:\n%s", c.output.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-c.exited:
			t.Fatalf("the agent child exited at start:\n%s", c.output.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent child was not ready within 20s:\n%s", c.output.String())
		}
		if c.addr == "" {
			b, err := os.ReadFile(cfg.AddrFile)
			if err != nil {
				continue
			}
			c.addr = string(b)
		}
		if resp, err := c.http.Get("http://" + c.addr + PathReadyz); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c
			}
		}
	}
}

// pid is the child's process id.
func (c *agentChild) pid() int { return c.cmd.Process.Pid }

// kill ends the child with SIGKILL and waits for it; it is idempotent.
func (c *agentChild) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// client talks to the child the way a controller does.
func (c *agentChild) client(t testing.TB) *Client {
	t.Helper()
	cl, err := NewClient(&ClientConfig{BaseURL: "http://" + c.addr, Username: "haptic", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// state reads the child's state.
func (c *agentChild) state(t testing.TB) *State {
	t.Helper()
	st, err := c.client(t).State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// postApply sends an exact-identity manifest for fs in mode, composed against the
// child's current state, with every part, and returns the answer. It does
// not fail the test, so it can run in a goroutine the child never answers.
func (c *agentChild) postApply(st *State, planID string, fs fileSet, mode string, ops ...Op) (int, []byte, error) {
	return c.postPatched(st, planID, nil, fs, nil, mode, false, ops...)
}

// postPatched is postApply whose large changed files travel as patches of
// their bytes in before, with planPatch (when not nil) as its plan part,
// and which with validate vouches for the applied plan (it becomes the
// last-known-good).
func (c *agentChild) postPatched(st *State, planID string, before, fs fileSet, planPatch []byte, mode string, validate bool, ops ...Op) (int, []byte, error) {
	m := &Manifest{IdentityVersion: ExactIdentityVersion, PlanID: planID, PlanSchemaVersion: PlanSchemaVersion,
		Token:              Token{LeaderEpoch: 1, RenderSeq: st.AppliedToken.RenderSeq + 1},
		ExpectedPrevPlanID: st.AppliedPlanID, ExpectedPrevPlanProof: st.AppliedPlanProof, ExpectedPrevToken: st.AppliedToken,
		ExpectedWorkerOpsPlanID: st.WorkerOpsPlanID, ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files: fs.manifestFiles(), Mode: mode, Ops: ops}
	if validate {
		m.ValidatedPlanID, m.ValidatedPlanProof = st.AppliedPlanID, st.AppliedPlanProof
	}
	patches := patchesFor(m, before, fs)
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	pw, _ := w.CreateFormField(PartManifest)
	if err := json.NewEncoder(pw).Encode(m); err != nil {
		return 0, nil, err
	}
	if planPatch != nil {
		pw, _ := w.CreatePart(textproto.MIMEHeader{"Content-Disposition": {multipart.FileContentDisposition(PartPlan, PartPlan)}, "Content-Type": {"application/json"}})
		pw.Write(planPatch)
	}
	for _, p := range fs.paths() {
		content, ok := patches[p]
		if !ok {
			content = fs[p]
		}
		pw, _ := w.CreateFormFile(p, p)
		io.WriteString(pw, content)
	}
	w.Close()
	req, err := http.NewRequest("POST", "http://"+c.addr+PathApply, &body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	req.SetBasicAuth("haptic", "s3cret")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// land applies fs and requires an OK answer.
func (c *agentChild) land(t testing.TB, planID string, fs fileSet) ApplyResult {
	t.Helper()
	code, b, err := c.postApply(c.state(t), planID, fs, ModeAuto)
	if err != nil || code != http.StatusOK {
		t.Fatalf("apply %s: %d %v %s", planID, code, err, b)
	}
	var res ApplyResult
	if err := json.Unmarshal(b, &res); err != nil || !res.OK {
		t.Fatalf("apply %s: %v %s", planID, err, b)
	}
	return res
}

// ---------------------------------------------------------------------------
// Crash consistency.

// crashKind is one kind of apply the crash test interrupts: the set before
// (landed by a reload), the apply's set, and its mode and ops.
type crashKind struct {
	name     string
	before   fileSet
	after    fileSet
	mode     string
	ops      []Op
	wantMode string

	// warmup, when set, is a runtime apply from the set landed first to
	// before, so that the interrupted apply finds its paths journalled
	// already (the steady state of a pod taking runtime changes).
	warmup []Op
	landed fileSet
	// refused: HAProxy refuses the apply's reload, so the apply fails and
	// must put back exactly the tree it found: the warmup's answered
	// runtime change included, at every crash point.
	refused bool
	// rejectOps: HAProxy refuses the apply's runtime ops, then the reload
	// the agent falls back to, and loads the tree the undo puts back. The
	// apply fails after its files were installed, and its record counted
	// from its sync: a crash before the undo began may redo it, one after
	// must find the tree it found.
	rejectOps bool
	// patched: every file of more than maxInlineBytes the apply changes
	// travels as a patch of its bytes before, which the record carries
	// instead of the file.
	patched bool
	// mounts are the directories of the tree that are mounts of their own.
	mounts []string
	// promote: the apply vouches for the plan before it, which becomes the
	// last-known-good: its journal links files the warmup installed
	// without a sync (the power-loss simulation skips its compaction).
	promote bool
	// plans are the real plans of the sets before and after: the plan
	// before is stored whole once landed, and the apply carries its plan
	// as a patch of it, which its record carries instead of a blob.
	plans []*Plan
	// uploads: the plan before, once stored, is uploaded this many times
	// again, as its blob and as a patch that changes nothing, as a
	// controller that retries its uploads does. Before every writer was
	// bounded, each wrote a record, and 8,300 made a log the next start
	// set aside, the warmup's answered change with it.
	uploads int
}

// uploadPlanAgain uploads the plan before n times through put.
func (k crashKind) uploadPlanAgain(t testing.TB, n int, put func(body []byte, contentType string) error) {
	t.Helper()
	blob, _ := EncodePlanBlob(k.plans[0])
	same, _ := json.Marshal(cutPlanPatch(string(k.plans[0].Canonical()), string(k.plans[0].Canonical()), k.plans[0].ID))
	for i := range n {
		body, contentType := blob, blobContentType
		if i%2 == 1 {
			body, contentType = same, patchContentType
		}
		if err := put(body, contentType); err != nil {
			t.Fatalf("upload %d of the plan before: %v", i, err)
		}
	}
}

// planID is the id the test lands set n under: plan-n, or the real plan's
// id for the sets before (1) and after (2) of a kind that has plans.
func (k crashKind) planID(n int) string {
	if k.plans != nil && (n == 1 || n == 2) {
		return k.plans[n-1].ID
	}
	return fmt.Sprintf("plan-%d", n)
}

// planPatch is the plan part of the apply under test: the patch of the
// plan before into the plan after, or nil.
func (k crashKind) planPatch() []byte {
	if k.plans == nil {
		return nil
	}
	return planPatchJSON(k.plans[0], k.plans[1])
}

// heldPlanProblem checks a recovered agent's stored plan: none, or a blob
// that is exactly one of the kind's plans, never a mix, and after an
// answered apply the apply's. It returns what failed, or "".
func (k crashKind) heldPlanProblem(storedID string, blob []byte, acked bool) string {
	if k.plans == nil {
		return ""
	}
	if acked && storedID != k.plans[1].ID {
		return fmt.Sprintf("the answered apply's plan is not stored: the stored plan is %q", storedID)
	}
	for _, p := range k.plans {
		if want, _ := EncodePlanBlob(p); storedID == p.ID && !bytes.Equal(blob, want) {
			return fmt.Sprintf("the stored blob of %s is not EncodePlanBlob's (%d bytes)", p.ID, len(blob))
		}
	}
	return ""
}

// planOfSet is the plan of fs, as PlanFromDir reads it from a directory.
func planOfSet(fs fileSet) *Plan {
	dir, err := os.MkdirTemp("", "haptic-plan-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	for rel, content := range fs {
		abs := filepath.Join(dir, filepath.FromSlash(rel))
		if os.MkdirAll(filepath.Dir(abs), 0o755) != nil || os.WriteFile(abs, []byte(content), 0o644) != nil {
			panic("writing " + abs)
		}
	}
	p, err := PlanFromDir(dir)
	if err != nil {
		panic(err)
	}
	return p
}

// patchBase is the set a patched kind's patches apply to.
func (k crashKind) patchBase() fileSet {
	if k.patched {
		return k.before
	}
	return nil
}

// patchesFor makes every large file fs changes from before travel as a
// patch: it sets the manifest entry's patch and returns the replacement
// bytes to send as its part, by path.
func patchesFor(m *Manifest, before, fs fileSet) map[string]string {
	parts := map[string]string{}
	for i, f := range m.Files {
		if old, ok := before[f.Path]; ok && old != fs[f.Path] && len(fs[f.Path]) > maxInlineBytes {
			p, repl := patchOf(old, fs[f.Path])
			m.Files[i].Patch, parts[f.Path] = p, repl
		}
	}
	return parts
}

func crashKinds() []crashKind {
	before := fileSet{
		ConfigFilePath:    "global\n  maxconn 100\n# render 1\n",
		"maps/host.map":   "a.example.com be-a\n",
		"errors/503.http": "HTTP/1.0 503 render 1\r\n\r\n",
		"lua/old.lua":     "-- dropped by the reload apply\n",
	}
	runtime := before.clone()
	runtime["maps/host.map"] += "b.example.com be-b\n"
	fileOnly := before.clone()
	fileOnly["errors/503.http"] = "HTTP/1.0 503 render 2\r\n\r\n"
	fileOnly["errors/504.http"] = "HTTP/1.0 504 new\r\n\r\n"
	reload := fileSet{
		ConfigFilePath:    "global\n  maxconn 200\n# render 2\n",
		"maps/host.map":   "c.example.com be-c\n",
		"errors/503.http": "HTTP/1.0 503 render 1\r\n\r\n",
		"lua/new/x.lua":   "-- created in a new directory\n",
	}
	second := runtime.clone()
	second["maps/host.map"] += "c.example.com be-c\n"
	var big strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&big, "host-%05d.example.com be-a\n", i)
	}
	bigBefore := before.clone()
	bigBefore["maps/host.map"] = big.String()
	bigAfter := bigBefore.clone()
	bigAfter["maps/host.map"] = strings.Replace(big.String(), "host-01500.example.com be-a\n", "host-01500.example.com be-a\nbig.example.com be-b\n", 1)
	bigWhole := bigAfter.clone()
	bigWhole["errors/big.http"] = "HTTP/1.0 503 big\r\n\r\n" + strings.Repeat("<!-- padding -->\n", 5000)
	refused := second.clone()
	refused["errors/503.http"] = "HTTP/1.0 503 refused\r\n\r\n"
	refused["errors/504.http"] = "HTTP/1.0 504 refused\r\n\r\n"
	return []crashKind{
		{name: "runtime", before: before, after: runtime, mode: ModeAuto,
			ops: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}}, wantMode: ResultRuntime},
		{name: "runtime_again", landed: before, before: runtime, after: second, mode: ModeAuto,
			warmup: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}},
			ops:    []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "c.example.com", Value: "be-c"}}, wantMode: ResultRuntime},
		{name: "runtime_promoting", landed: before, before: runtime, after: second, mode: ModeAuto, promote: true,
			warmup: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}},
			ops:    []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "c.example.com", Value: "be-c"}}, wantMode: ResultRuntime},
		{name: "file_only", before: before, after: fileOnly, mode: ModeAuto, wantMode: ResultFileOnly},
		{name: "reload", before: before, after: reload, mode: ModeReload, wantMode: ResultReload},
		{name: "big_map_patch", before: bigBefore, after: bigAfter, mode: ModeAuto, patched: true,
			ops: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "big.example.com", Value: "be-b"}}, wantMode: ResultRuntime},
		// The plan travels too, as a patch of the stored plan before.
		{name: "plan_patch", before: bigBefore, after: bigAfter, mode: ModeAuto, patched: true, plans: []*Plan{planOfSet(bigBefore), planOfSet(bigAfter)},
			ops: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "big.example.com", Value: "be-b"}}, wantMode: ResultRuntime},
		{name: "refused_after_runtime", landed: before, before: runtime, after: reload, mode: ModeReload, wantMode: ResultRejected,
			warmup: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}}, refused: true},
		// Every part larger than what rides in the record: the changed map
		// and a new file, staged whole in synced temp files.
		{name: "big_whole_parts", before: bigBefore, after: bigWhole, mode: ModeAuto,
			ops: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "big.example.com", Value: "be-b"}}, wantMode: ResultRuntime},
		// A runtime change after thousands of uploads of the plan held.
		{name: "runtime_after_uploads", landed: before, before: runtime, after: second, mode: ModeAuto,
			plans: []*Plan{planOfSet(runtime), planOfSet(second)}, uploads: 8300,
			warmup: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}},
			ops:    []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "c.example.com", Value: "be-c"}}, wantMode: ResultRuntime},
		{name: "refused_runtime", landed: before, before: runtime, after: refused, mode: ModeAuto, wantMode: ResultRejected,
			warmup: []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example.com", Value: "be-b"}},
			ops:    []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "c.example.com", Value: "be-c"}}, refused: true, rejectOps: true},
	}
}

// mountedCrashKinds are crashKinds on a tree whose maps/ and errors/ are
// mounts of their own, as upstream's pods keep maps and general files:
// every apply then stages, links and renames on two or three mounts. The
// kill -9 test takes an apply answered at its durable point, a reload, and
// a refusal after a fallback; the power-loss simulation, which is cheaper,
// takes them all.
func mountedCrashKinds(all bool) []crashKind {
	var out []crashKind
	for _, k := range crashKinds() {
		switch k.name {
		case "runtime_again", "reload", "refused_runtime":
		default:
			if !all {
				continue
			}
		}
		k.name, k.mounts = k.name+"_on_mounts", []string{"errors", "maps"}
		out = append(out, k)
	}
	return out
}

// haproxyRefuses arms (on) or disarms HAProxy's refusals of the kind's
// apply: its reload, or its ops and the one reload they fall back to.
func (k crashKind) haproxyRefuses(fake *FakeHAProxy, master *refusingMaster, on bool) {
	fake.With(func(m *FakeModel) {
		m.ReloadFails, m.Reject = on && k.refused && !k.rejectOps, nil
		if on && k.rejectOps {
			m.Reject = func(cmd string) (string, bool) {
				return "Unknown map identifier. Please use #<id> or <file>.", strings.HasPrefix(cmd, "add map")
			}
		}
	})
	if k.rejectOps {
		master.refuseNext(boolInt(on))
	}
}

// refusingMaster stands between the agent and the fake's master socket. It
// relays every command, except that it answers the reloads it is told to
// refuse as HAProxy refuses a configuration it cannot load, without passing
// them on: so a test can refuse one reload and let the next through.
type refusingMaster struct {
	path    string
	refused atomic.Int32 // the reloads refused so far

	mu       sync.Mutex
	left     int    // reloads still to refuse
	onRefuse func() // runs just before a refusal is answered
}

func newRefusingMaster(t testing.TB, fake *FakeHAProxy) *refusingMaster {
	t.Helper()
	m := &refusingMaster{path: filepath.Join(shortTempDir(t), "master.sock")}
	ln, err := net.Listen("unix", m.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go m.serve(conn, fake.MasterSocket())
		}
	}()
	return m
}

func (m *refusingMaster) refuseNext(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.left = n
}

func (m *refusingMaster) whenRefusing(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onRefuse = f
}

// serve answers one connection: one command, then the reply. A connection
// that sends nothing (a probe) is closed.
func (m *refusingMaster) serve(conn net.Conn, upstream string) {
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	m.mu.Lock()
	refuse, note := line == "reload;quit\n" && m.left > 0, m.onRefuse
	if refuse {
		m.left--
	}
	m.mu.Unlock()
	if refuse {
		if note != nil {
			note()
		}
		m.refused.Add(1)
		io.WriteString(conn, "Success=0\n--\n"+failedReloadLog+"\n\n")
		return
	}
	up, err := net.Dial("unix", upstream)
	if err != nil {
		return
	}
	defer up.Close()
	io.WriteString(up, line)
	io.Copy(conn, up)
}

// TestCrashBetweenAnyTwoFileOperations kills the agent at every file
// operation of each kind of apply crashKinds lists, and after the answer,
// and checks what the restarted agent holds.
func TestCrashBetweenAnyTwoFileOperations(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three agent processes per file operation of three applies")
	}
	for _, k := range crashKinds() {
		t.Run(k.name, func(t *testing.T) { crashAtEveryOp(t, k) })
	}
}

// TestCrashBetweenAnyTwoFileOperationsOnMounts is the kill -9 test on a
// tree that spans bind mounts, in a private mount namespace that the agent
// processes it starts share.
func TestCrashBetweenAnyTwoFileOperationsOnMounts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three agent processes per file operation of every apply")
	}
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestCrashBetweenAnyTwoFileOperationsOnMounts")
		return
	}
	for _, k := range mountedCrashKinds(false) {
		t.Run(k.name, func(t *testing.T) { crashAtEveryOp(t, k) })
	}
}

func crashAtEveryOp(t *testing.T, k crashKind) {
	n := len(applyOps(t, k))
	if n < 4 {
		t.Fatalf("the %s apply made %d file operations; the stop hook sees nothing", k.name, n)
	}
	for at := 1; at <= n+1; at++ {
		t.Run(fmt.Sprintf("op%02d", at), func(t *testing.T) { runCrashAt(t, k, at) })
	}
}

// crashEnv is one case's fake HAProxy and base directory, with the set
// before landed by a first child that was then killed idle.
type crashEnv struct {
	fake   *FakeHAProxy
	master *refusingMaster // the kind's master socket when it rejects ops, else nil
	cfg    agentChildConfig
	base   string
}

func newCrashEnv(t *testing.T, k crashKind) *crashEnv {
	fake := startTestFake(t, "")
	base := t.TempDir()
	if k.mounts != nil {
		base = bindMountTree(t, k.mounts...)
	}
	loadOnReload(fake, base)
	dir := t.TempDir()
	cfg := agentChildConfig{BaseDir: base, MasterSocket: fake.MasterSocket(), WorkerSocket: fake.WorkerSocket(),
		AddrFile: filepath.Join(dir, "addr"), StopMarker: filepath.Join(dir, "stopped")}
	var master *refusingMaster
	if k.rejectOps {
		master = newRefusingMaster(t, fake)
		cfg.MasterSocket = master.path
	}
	a := startAgentChild(t, cfg)
	k.landBefore(t, a.state, a.postApply)
	if k.plans != nil {
		st := a.state(t)
		blob, _ := EncodePlanBlob(k.plans[0])
		if err := a.client(t).PutPlan(context.Background(), st.AppliedPlanID, st.AppliedPlanProof, blob); err != nil {
			t.Fatalf("storing the plan before: %v", err)
		}
		// A thousand over HTTP to the child in each of the many cases; the
		// power-loss simulation, in process, takes them all.
		c := a.client(t)
		k.uploadPlanAgain(t, min(k.uploads, 1000), func(body []byte, contentType string) error {
			return c.putPlan(context.Background(), st.AppliedPlanID, st.AppliedPlanProof, body, contentType)
		})
	}
	a.kill()
	return &crashEnv{fake: fake, master: master, cfg: cfg, base: base}
}

// landBefore brings an agent to the set before: a reload, and the warmup's
// runtime apply when there is one.
func (k crashKind) landBefore(t testing.TB, state func(testing.TB) *State, post func(*State, string, fileSet, string, ...Op) (int, []byte, error)) {
	t.Helper()
	first, firstID := k.before, k.planID(1)
	if k.warmup != nil {
		first, firstID = k.landed, k.planID(0)
	}
	code, b, err := post(state(t), firstID, first, ModeReload)
	if err != nil || code != http.StatusOK || !bytes.Contains(b, []byte(`"ok":true`)) {
		t.Fatalf("landing the set before: %d %v %s", code, err, b)
	}
	if k.warmup == nil {
		return
	}
	code, b, err = post(state(t), k.planID(1), k.before, ModeAuto, k.warmup...)
	if err != nil || code != http.StatusOK || !bytes.Contains(b, []byte(`"mode":"runtime"`)) {
		t.Fatalf("the warmup: %d %v %s", code, err, b)
	}
}

// applyOps runs the apply once, to its end, and lists its file
// operations, one "number op path" line each.
func applyOps(t *testing.T, k crashKind) []string {
	e := newCrashEnv(t, k)
	cfg := e.cfg
	cfg.OpsLog = filepath.Join(t.TempDir(), "ops")
	b := startAgentChild(t, cfg)
	k.haproxyRefuses(e.fake, e.master, true)
	code, body, err := b.postPatched(b.state(t), k.planID(2), k.patchBase(), k.after, k.planPatch(), k.mode, k.promote, k.ops...)
	k.haproxyRefuses(e.fake, e.master, false)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the apply: %d %v %s", code, err, body)
	}
	var res ApplyResult
	if json.Unmarshal(body, &res); res.OK == k.refused || res.Mode != k.wantMode {
		t.Fatalf("the apply: %s", body)
	}
	b.awaitQuiet(t)
	ops := opsLogged(cfg.OpsLog)
	t.Logf("%s apply: %d file operations\n%s", k.name, len(ops), strings.Join(ops, "\n"))
	return ops
}

// runCrashAt interrupts the apply at its at-th file operation (or, past
// its last, right after its answer), restarts, and checks.
func runCrashAt(t *testing.T, k crashKind, at int) {
	e := newCrashEnv(t, k)
	cfgB := e.cfg
	cfgB.StopAtOp = at
	cfgB.OpsLog = filepath.Join(t.TempDir(), "ops")
	// The undo of a refused runtime apply begins with the first change of
	// the tree after HAProxy's refusal, the ops performed then being logged.
	var refusedAfterOps atomic.Int32
	refusedAfterOps.Store(-1)
	if e.master != nil {
		e.master.whenRefusing(func() { refusedAfterOps.Store(int32(len(opsLogged(cfgB.OpsLog)))) })
	}
	b := startAgentChild(t, cfgB)
	before := b.state(t)
	k.haproxyRefuses(e.fake, e.master, true)
	answered := make(chan ApplyResult, 1)
	go func() {
		code, body, err := b.postPatched(before, k.planID(2), k.patchBase(), k.after, k.planPatch(), k.mode, k.promote, k.ops...)
		var res ApplyResult
		if err == nil && code == http.StatusOK && json.Unmarshal(body, &res) == nil {
			answered <- res
		}
		close(answered)
	}()
	var acked *ApplyResult
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if _, err := os.Stat(e.cfg.StopMarker); err == nil {
			break
		}
		select {
		case res, ok := <-answered:
			if ok && res.OK {
				acked = &res
			}
			// Past the apply's last operation: the answer came. Whatever the
			// agent does next (a read-back, a compaction) may still be cut.
			time.Sleep(5 * time.Millisecond)
		default:
			if time.Now().After(deadline) {
				t.Fatal("the agent neither stopped nor answered")
			}
			continue
		}
		break
	}
	stoppedAt, _ := os.ReadFile(e.cfg.StopMarker)
	b.kill()
	k.haproxyRefuses(e.fake, e.master, false)
	undoing := refusedAfterOps.Load() >= 0 && slices.ContainsFunc(opsLogged(cfgB.OpsLog)[refusedAfterOps.Load():], func(op string) bool {
		f := strings.Fields(op)
		return changesTheTree(e.base, diskOp{Op: f[1], Path: f[2]})
	})

	c := startAgentChild(t, e.cfg)
	got := diskSet(t, e.base)
	st, err := c.client(t).State(context.Background(), StateRead{Plan: true})
	if err != nil {
		t.Fatal(err)
	}
	// Requirement 1: the set before or the apply's set, never a mix.
	isBefore, isAfter := sameSet(got, k.before), sameSet(got, k.after)
	if !isBefore && !isAfter {
		t.Fatalf("stopped at %q: the tree is a mix: %v", stoppedAt, got)
	}
	if k.mustFindTheSetBefore(undoing) && (!isBefore || slices.Contains([]string{st.AppliedPlanID, st.RunningPlanID, st.WorkerOpsPlanID}, k.planID(2))) {
		t.Fatalf("stopped at %q: the refused apply's files or pairs stayed, or its undo took an answered change back: %v %+v", stoppedAt, got, st)
	}
	// Requirement 2: a named plan's files are on disk.
	switch st.AppliedPlanID {
	case k.planID(1):
		if !isBefore {
			t.Fatalf("stopped at %q: applied plan-1 over the apply's set", stoppedAt)
		}
	case k.planID(2):
		if !isAfter {
			t.Fatalf("stopped at %q: applied plan-2 over the set before", stoppedAt)
		}
	case "":
	default:
		t.Fatalf("applied %q", st.AppliedPlanID)
	}
	// Requirement 3: an answered apply is still applied.
	if acked != nil && st.AppliedPlanID != k.planID(2) {
		t.Fatalf("the answered apply was lost: %+v", st)
	}
	// The stored plan is one plan's blob, never a mix.
	stored := ""
	if st.AppliedPlanStored {
		stored = st.AppliedPlanID
	}
	if msg := k.heldPlanProblem(stored, st.AppliedPlan, acked != nil); msg != "" {
		t.Fatalf("stopped at %q: %s", stoppedAt, msg)
	}
	// Requirement 4: nothing reported goes backwards.
	if st.Generation < before.Generation || st.Generation > before.Generation+1 || (acked != nil && st.Generation != before.Generation+1) {
		t.Fatalf("generation %d after the crash, %d before", st.Generation, before.Generation)
	}
	if st.InvariantViolation != "" {
		t.Fatalf("invariant %q after recovery", st.InvariantViolation)
	}
	// The next apply succeeds, and its proof is new.
	next := k.before.clone()
	next["errors/505.http"] = "HTTP/1.0 505 next\r\n\r\n"
	code, body, err := c.postApply(st, "plan-3", next, ModeReload)
	var res ApplyResult
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &res) != nil || !res.OK {
		t.Fatalf("the next apply: %d %v %s", code, err, body)
	}
	if acked != nil && proofNumber(res.AppliedPlanProof) <= proofNumber(acked.AppliedPlanProof) {
		t.Fatalf("proof %s issued after %s", res.AppliedPlanProof, acked.AppliedPlanProof)
	}
	if got := diskSet(t, e.base); !sameSet(got, next) {
		t.Fatalf("after the next apply the tree is %v", got)
	}
}

// mustFindTheSetBefore reports whether a crash now must find the tree and
// the pairs from before the apply, undoing being whether its undo has
// begun to change the tree back: a refused reload apply never counts (its
// record is open), a runtime apply whose ops and fallback reload HAProxy
// refused counts from its record until its undo begins.
func (k crashKind) mustFindTheSetBefore(undoing bool) bool {
	return k.refused && (!k.rejectOps || undoing)
}

// changesTheTree reports whether op renames, links or removes a path of
// the tree, not of the agent's own dot-prefixed files.
func changesTheTree(base string, op diskOp) bool {
	rel, err := filepath.Rel(base, op.Path)
	return err == nil && !strings.HasPrefix(rel, ".") && slices.Contains([]string{"rename", "exchange", "link", "remove"}, op.Op)
}

// opsLogged reads the child's ops log: one "number op path" line each.
func opsLogged(path string) []string {
	raw, _ := os.ReadFile(path)
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

// proofNumber reads n from an agent proof "a:<n>".
func proofNumber(p string) uint64 {
	var n uint64
	fmt.Sscanf(p, "a:%d", &n)
	return n
}

// awaitQuiet waits until the child has answered a state read after its
// background work: a read-back holds the apply lock, and a state read does
// not, so a short settle is all the ops log needs.
func (c *agentChild) awaitQuiet(t *testing.T) {
	time.Sleep(200 * time.Millisecond)
	c.state(t)
}
