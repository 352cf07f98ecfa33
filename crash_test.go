// This file owns crash consistency: the agent runs as a child process (the
// test binary re-executed, pointed at a fake HAProxy the parent serves), is
// killed with SIGKILL at each persisted phase of an apply, and is restarted
// on the same tree. After the restart the tree must be exactly the desired
// set or the last known good set, never a mix; the baseline must be
// invalidated; and the next apply must succeed. It also owns the child
// process harness, which the RSS benchmark reuses.
//
// Stopping at a phase needs a test-only hook in the agent: with
// HAPTIC_TEST_STOP_AT_PHASE=<phase> in its environment, the agent blocks
// for good right after it has persisted that phase. An apply that runs past
// its phase fails the test: a broken hook must not pass as a skip. The test
// skips only where the test binary cannot start itself as a child process.
// Nothing here edits the agent's files while it runs.
package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The agent as a child process.

// agentChildEnv carries the child's configuration as JSON; its presence is
// what makes TestAgentChildProcess run an agent. The stop-at-phase hook's
// variable, stopAtPhaseEnv, is the agent's own (agent.go).
const agentChildEnv = "HAPTIC_AGENT_CHILD"

// agentChildConfig is what the parent tells the child.
type agentChildConfig struct {
	BaseDir           string
	MasterSocket      string
	WorkerSocket      string
	AddrFile          string // the child writes its API address here once bound
	ReloadIntervalMin time.Duration
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
	a, err := NewAgent(AgentConfig{
		BaseDir: c.BaseDir, ConfigFile: ConfigFilePath, StateFile: ".haptic-agent.json",
		MasterSocket: c.MasterSocket, WorkerSocket: c.WorkerSocket,
		Username: "haptic", Password: "s3cret", Listen: "127.0.0.1:0",
		ReloadIntervalMin: c.ReloadIntervalMin, ReloadTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := a.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(1)
	}
	os.Exit(0)
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
		t.Skipf("cannot run a child process here: %v", err)
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
func (c *agentChild) postApply(st *State, planID string, fs fileSet, mode string) (int, []byte, error) {
	m := &Manifest{IdentityVersion: ExactIdentityVersion, PlanID: planID, PlanSchemaVersion: PlanSchemaVersion,
		Token:              Token{LeaderEpoch: 1, RenderSeq: st.AppliedToken.RenderSeq + 1},
		ExpectedPrevPlanID: st.AppliedPlanID, ExpectedPrevPlanProof: st.AppliedPlanProof, ExpectedPrevToken: st.AppliedToken,
		ExpectedWorkerOpsPlanID: st.WorkerOpsPlanID, ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files: fs.manifestFiles(), Mode: mode}
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	pw, _ := w.CreateFormField(PartManifest)
	if err := json.NewEncoder(pw).Encode(m); err != nil {
		return 0, nil, err
	}
	for _, p := range fs.paths() {
		pw, _ := w.CreateFormFile(p, p)
		io.WriteString(pw, fs[p])
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

// crashSets are the renders of the crash test: each changes the config and
// the map, adds a file and drops one, so a mix of two sets is visible.
func crashSets() (set1, set2, set3, set4 fileSet) {
	set1 = fileSet{
		ConfigFilePath:    "global\n  maxconn 100\n# render 1\n",
		"maps/host.map":   "a.example.com be-a\n",
		"errors/503.http": "HTTP/1.0 503 render 1\r\n\r\n",
	}
	set2 = fileSet{
		ConfigFilePath:  "global\n  maxconn 200\n# render 2\n",
		"maps/host.map": "a.example.com be-b\nb.example.com be-b\n",
		"lua/extra.lua": "-- render 2\n",
	}
	set3 = set2.clone()
	set3["lua/extra.lua"] = "-- render 3: a general file only\n"
	set4 = fileSet{
		ConfigFilePath:  "global\n  maxconn 400\n# render 4\n",
		"maps/host.map": "d.example.com be-d\n",
	}
	return set1, set2, set3, set4
}

// crashCase is one phase to die in and how to get there. Before the crash
// the first child landed set1 (a reload) and was killed idle; the second
// child runs with the hook and applies what the case says.
type crashCase struct {
	phase    string
	interval time.Duration // the second child's reload interval
	warmup   bool          // land set2 first (a reload), then apply set3
	mode     string        // of the interrupted apply; "" is auto
	failing  bool          // HAProxy refuses the reload of the interrupted apply
	want     string        // "set1", "set2": what the tree must be after recovery
}

var crashCases = []crashCase{
	// Nothing is written before backed_up: the tree stays as it was.
	{phase: phaseStaged, want: "set1"},
	{phase: phaseVerified, want: "set1"},
	// Writes may have begun: the journal restores the last known good set.
	{phase: phaseBackedUp, want: "set1"},
	{phase: phaseWritten, want: "set1"},
	// The reload succeeded and promoted set2: it is both desired and LKG.
	{phase: phaseReloaded, want: "set2"},
	// A file-only apply of set3 on top of the reloaded set2.
	{phase: phaseApplied, warmup: true, want: "set2"},
	// A reload inside the pacing window is scheduled, never run.
	{phase: phaseScheduled, interval: time.Minute, warmup: true, mode: ModeReload, want: "set2"},
	// HAProxy refused set2: abort persisted before it restored.
	{phase: phaseAborted, failing: true, want: "set1"},
}

// TestCrashAtEveryPersistedPhase kills the agent at each phase of an apply
// and restarts it on the same tree.
func TestCrashAtEveryPersistedPhase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 24 agent processes")
	}
	for _, tc := range crashCases {
		t.Run(tc.phase, func(t *testing.T) { runCrashCase(t, tc) })
	}
}

func runCrashCase(t *testing.T, tc crashCase) {
	set1, set2, set3, set4 := crashSets()
	sets := map[string]fileSet{"set1": set1, "set2": set2}
	fake := startTestFake(t, "")
	base := t.TempDir()
	loadOnReload(fake, base)
	cfg := agentChildConfig{BaseDir: base, MasterSocket: fake.MasterSocket(), WorkerSocket: fake.WorkerSocket(),
		AddrFile: filepath.Join(t.TempDir(), "addr")}

	// Child A lands set1 and dies idle.
	a := startAgentChild(t, cfg)
	a.land(t, "plan-1", set1)
	okApplies := uint64(1)
	a.kill()

	// Child B dies in the phase.
	cfgB := cfg
	cfgB.ReloadIntervalMin = tc.interval
	b := startAgentChild(t, cfgB, stopAtPhaseEnv+"="+tc.phase)
	desired, planID := set2, "plan-2"
	if tc.warmup {
		b.land(t, "plan-2", set2)
		okApplies++
		desired, planID = set3, "plan-3"
	}
	if tc.failing {
		fake.With(func(m *FakeModel) { m.ReloadFails = true })
	}
	answered := make(chan string, 1)
	st := b.state(t)
	go func() {
		mode := tc.mode
		if mode == "" {
			mode = ModeAuto
		}
		code, body, err := b.postApply(st, planID, desired, mode)
		answered <- fmt.Sprintf("%d %v %s", code, err, body)
	}()
	// Wait for the phase, then make sure the child stays in it: a normal
	// apply passes through every phase within milliseconds, so a phase
	// that still holds, unanswered, a while later is the hook at work. An
	// apply that goes past it means the hook (HAPTIC_TEST_STOP_AT_PHASE) is
	// broken, and crash consistency is not exercised: that is a failure.
	statePath := filepath.Join(base, ".haptic-agent.json")
	notStopped := func(why string) {
		t.Fatalf("the apply did not stop at %q (%s=%s): %s", tc.phase, stopAtPhaseEnv, tc.phase, why)
	}
	for deadline := time.Now().Add(15 * time.Second); readPhase(statePath) != tc.phase; time.Sleep(2 * time.Millisecond) {
		select {
		case ans := <-answered:
			notStopped(ans)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never persisted phase %q", tc.phase)
		}
	}
	select {
	case ans := <-answered:
		notStopped(ans)
	case <-time.After(300 * time.Millisecond):
	}
	if phase := readPhase(statePath); phase != tc.phase {
		notStopped("the persisted phase moved on to " + strconv.Quote(phase))
	}
	b.kill()
	fake.With(func(m *FakeModel) { m.ReloadFails = false })
	var reloadsBefore int
	fake.With(func(m *FakeModel) { reloadsBefore = m.Reloads })

	// Child C recovers.
	c := startAgentChild(t, cfg)
	got := diskSet(t, base)
	want := sets[tc.want]
	if !sameSet(got, want) {
		t.Fatalf("after a crash in %q the tree is %v, want %s %v", tc.phase, got, tc.want, want)
	}
	persisted := readStateFile(t, base)
	if persisted.Phase != phaseIdle || len(persisted.Journal.Entries) != 0 {
		t.Fatalf("after recovery: phase %q, %d journal entries", persisted.Phase, len(persisted.Journal.Entries))
	}
	st = c.state(t)
	if st.AppliedPlanID != "" || st.WorkerOpsPlanID != "" || st.RunningPlanID != "" {
		t.Fatalf("the baseline survived the crash: applied %q, worker ops %q, running %q", st.AppliedPlanID, st.WorkerOpsPlanID, st.RunningPlanID)
	}
	if st.Generation != okApplies {
		t.Fatalf("generation %d, want %d OK applies", st.Generation, okApplies)
	}
	if st.InvariantViolation != "" {
		t.Fatalf("invariant %q after recovery", st.InvariantViolation)
	}
	var reloadsAfter int
	fake.With(func(m *FakeModel) { reloadsAfter = m.Reloads })
	if reloadsAfter != reloadsBefore+1 {
		t.Fatalf("%d reloads at recovery, want the one recovery reload", reloadsAfter-reloadsBefore)
	}

	// The next apply succeeds, and reloads: the baseline is unknown.
	res := c.land(t, "plan-4", set4)
	if res.Mode != ResultReload || res.RunningPlanID != "plan-4" || res.LKGPlanID != "plan-4" {
		t.Fatalf("the next apply: mode %s, running %q, lkg %q", res.Mode, res.RunningPlanID, res.LKGPlanID)
	}
	if got := diskSet(t, base); !sameSet(got, set4) {
		t.Fatalf("after the next apply the tree is %v", got)
	}
	if st := c.state(t); st.Generation != okApplies+1 {
		t.Fatalf("generation %d after the next apply, want %d", st.Generation, okApplies+1)
	}
}

// readPhase reads the phase persisted in a state file; "" when it cannot.
func readPhase(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var s struct {
		Phase string `json:"phase"`
	}
	json.Unmarshal(b, &s)
	return s.Phase
}
