// Restart, refusal and hostile-reload tests of the ledger against a real
// HAProxy (HAPTIC_HAPROXY) in master-worker mode. They port the fake
// versions in agent_ledger_test.go and agent_hostile_test.go: what the
// agent remembers across its own restart, what it may still vouch for after
// HAProxy changed or refused something, and how long a stuck master may
// hold an apply. Every claim the agent makes is checked against the worker
// that actually answers the stats socket.
//
// The agent is stopped and started again on the same directory and
// sockets; HAProxy keeps running across those restarts. Nothing here edits
// the tree behind the agent's back except the drift test, whose point is
// exactly that edit.

package haptic

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Harness: one real HAProxy, an agent beside it that can be stopped and
// started again on the same directory.

// realLedgerEnv is a real HAProxy and the agent currently running beside
// it.
type realLedgerEnv struct {
	h    *realHAProxy
	cfg  AgentConfig
	a    *Agent
	c    *agentClient
	stop func()
	fs   fileSet // the fixture as HAProxy loaded it at start
}

// startRealLedgerEnv starts the real HAProxy (skipping without
// HAPTIC_HAPROXY) and an agent whose base directory is HAProxy's, with the
// given reload timeout.
func startRealLedgerEnv(t *testing.T, reloadTimeout time.Duration) *realLedgerEnv {
	t.Helper()
	h := startRealHAProxy(t)
	cfg := testAgentConfig(t, nil)
	cfg.BaseDir = h.Dir
	cfg.WorkerSocket, cfg.MasterSocket = h.WorkerSocket(), h.MasterSocket()
	cfg.ReloadTimeout = reloadTimeout
	e := &realLedgerEnv{h: h, cfg: cfg, fs: fileSet{}}
	for _, p := range []string{ConfigFilePath, "maps/host.map", "certs/a.pem", "certs/ca.pem", "certs/list.txt"} {
		b, err := os.ReadFile(filepath.Join(h.Dir, p))
		if err != nil {
			t.Fatal(err)
		}
		e.fs[p] = string(b)
	}
	e.startAgent(t)
	return e
}

// startAgent starts a new agent on the environment's directory and sockets
// and waits until it is ready. The client keeps its render sequence across
// restarts, as a controller's does.
func (e *realLedgerEnv) startAgent(t *testing.T) {
	t.Helper()
	var seq uint64
	if e.c != nil {
		seq = e.c.seq
	}
	e.a, e.stop = launchTestAgent(t, e.cfg, true)
	e.c = newAgentClient(t, e.a)
	e.c.seq = seq
}

// stopAgent cancels the agent's Run and waits for it to return.
func (e *realLedgerEnv) stopAgent() { e.stop() }

// land applies fs as planID in reload mode and requires a reload ACK.
func (e *realLedgerEnv) land(t *testing.T, planID string, fs fileSet) ApplyResult {
	t.Helper()
	m := e.c.manifest(planID, fs)
	m.Mode = ModeReload
	res := e.c.apply(m, fs)
	if !res.OK || res.Mode != ResultReload {
		t.Fatalf("landing %s: %s\n%s", planID, jsonOf(res), e.h.Output())
	}
	return res
}

// applyHeld sends m with only the parts partsNeeded(st, m) names, so that
// every file the agent claims to hold must really be held, and returns the
// answer and the parts sent.
func (e *realLedgerEnv) applyHeld(t *testing.T, st State, m *Manifest, fs fileSet) (ApplyResult, []string) {
	t.Helper()
	sent := partsNeeded(st, m)
	omit := map[string]bool{}
	for p := range fs {
		omit[p] = !slices.Contains(sent, p)
	}
	code, body := e.c.post(applyRequest{manifest: m, files: fs, omit: omit})
	if code != http.StatusOK {
		t.Fatalf("apply %s: %d %s", m.PlanID, code, body)
	}
	var res ApplyResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("apply %s: %v: %s", m.PlanID, err, body)
	}
	return res, sent
}

// tryState reads the state without failing the test: a verified read
// answers 503 while HAProxy is between workers, and a poll must ride that
// out.
func (e *realLedgerEnv) tryState(t *testing.T, query string) (State, int) {
	t.Helper()
	code, _, body := e.c.do("GET", PathState+query, nil, "")
	var st State
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("state: %v: %s", err, body)
		}
	}
	return st, code
}

// expectHeldProofs fails unless the agent holds every file of fs except
// skip with the controller's proof and the file's digest.
func expectHeldProofs(t *testing.T, st State, fs fileSet, skip string) {
	t.Helper()
	for p, content := range fs {
		if p == skip {
			continue
		}
		held, ok := st.Files[p]
		if !ok || held.Digest != DigestString(content) || held.Proof != testProof(content) {
			t.Errorf("%s: held %+v, want digest %s with proof %s", p, held, DigestString(content), testProof(content))
		}
	}
}

// mapEntryChange is fs with one more host map entry, and the op that adds
// it at runtime.
func mapEntryChange(fs fileSet, key, value string) (fileSet, Op) {
	next := fs.clone()
	next["maps/host.map"] += key + " " + value + "\n"
	return next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: key, Value: value}
}

// realExchange sends data on a new connection to a HAProxy socket and reads
// the reply to EOF, within timeout. Unlike socketExchange it never fails
// the test: during a reload the sockets may briefly refuse or reset.
func realExchange(sock, data string, timeout time.Duration) (string, error) {
	conn, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, data); err != nil {
		return "", err
	}
	reply, err := io.ReadAll(conn)
	return string(reply), err
}

// pidOf reads the Pid line of a show info reply, 0 when there is none.
func pidOf(reply string) int {
	m := showInfoPid.FindStringSubmatch(reply)
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// realWorkerPID is the PID of the worker answering the stats socket now,
// 0 when none answers.
func realWorkerPID(h *realHAProxy) int {
	reply, err := realExchange(h.WorkerSocket(), "show info\n", 5*time.Second)
	if err != nil {
		return 0
	}
	return pidOf(reply)
}

// awaitOtherWorker polls for up to 30 s until a worker other than prev
// answers the stats socket and the master lists it, and returns its PID.
func awaitOtherWorker(t *testing.T, h *realHAProxy, prev int) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if pid := realWorkerPID(h); pid != 0 && pid != prev && h.ready() {
			return pid
		}
	}
	t.Fatalf("no worker other than %d within 30s\n%s", prev, h.Output())
	return 0
}

var showProcMaster = regexp.MustCompile(`(?m)^(\d+)\s+master\s`)

// masterPID reads the master's PID from show proc, and checks it against
// the process the harness started: with -W that process is the master, and
// it keeps its PID across reloads because it re-executes itself.
func masterPID(t *testing.T, h *realHAProxy) int {
	t.Helper()
	reply, err := realExchange(h.MasterSocket(), "show proc;quit\n", 5*time.Second)
	m := showProcMaster.FindStringSubmatch(reply)
	if err != nil || m == nil {
		t.Fatalf("show proc: %v %q", err, reply)
	}
	pid, _ := strconv.Atoi(m[1])
	if pid != h.cmd.Process.Pid {
		t.Fatalf("show proc names master %d, the harness started %d", pid, h.cmd.Process.Pid)
	}
	return pid
}

// workerMapEntries lists the keys of one map in the worker.
func workerMapEntries(t *testing.T, h *realHAProxy, path string) []string {
	t.Helper()
	reply, err := realExchange(h.WorkerSocket(), "show map "+path+"\n", 5*time.Second)
	if err != nil {
		t.Fatalf("show map %s: %v", path, err)
	}
	var keys []string
	for line := range strings.SplitSeq(reply, "\n") {
		// <ref> <key> <value>
		if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "0x") {
			keys = append(keys, f[1])
		}
	}
	return keys
}

// isAtLeast30 tells the two installed versions apart: 3.0's master answers
// a reload with Success= and the startup log, 2.6's closes the connection
// without a word. Dynamic servers arrived in the same span.
func isAtLeast30(h *realHAProxy) bool { return CapsFor(h.Version(), nil).DynamicServers }

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// ---------------------------------------------------------------------------
// What survives the agent's restart.

// TestRealRestartKeepsTheBaselineWhenNothingChanged: the agent restarts
// over the tree and the worker it left. Both prove the applied plan still
// holds, so the agent keeps it with every file's proof: a one-entry map
// change composed against the new agent's state sends only the map and
// lands at runtime, in the worker that was already running.
func TestRealRestartKeepsTheBaselineWhenNothingChanged(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	landed := e.land(t, "plan-1", e.fs)
	e.stopAgent()
	e.startAgent(t)

	st := e.c.state("?plan=0")
	if st.AppliedPlanID != "plan-1" || st.AppliedPlanProof != landed.AppliedPlanProof ||
		st.RunningPlanID != "plan-1" || st.WorkerOpsPlanID != "plan-1" || !st.HAProxy.SameWorker(landed.HAProxy) {
		t.Fatalf("after the restart: %s", jsonOf(st))
	}
	next, op := mapEntryChange(e.fs, "restart.example.com", "be-a")
	m := e.c.manifestFrom(st, "plan-2", next, op)
	res, sent := e.applyHeld(t, st, m, next)
	if !slices.Equal(sent, []string{"maps/host.map"}) {
		t.Fatalf("after the restart the controller must send %v, want only the map", sent)
	}
	expectHeldProofs(t, st, e.fs, "maps/host.map")
	if !res.OK || res.Mode != ResultRuntime || !res.HAProxy.SameWorker(landed.HAProxy) {
		t.Fatalf("the one-entry change: %s", jsonOf(res))
	}
	if pid := realWorkerPID(e.h); pid != landed.HAProxy.WorkerPID {
		t.Fatalf("worker %d answers, the landed set ran on %d", pid, landed.HAProxy.WorkerPID)
	}
	if keys := workerMapEntries(t, e.h, "maps/host.map"); !slices.Contains(keys, "restart.example.com") {
		t.Fatalf("the worker's map lacks the entry: %v", keys)
	}
}

// TestRealRestartWithANewWorkerAdoptsTheTree: HAProxy reloaded while the
// agent was away. The new worker started after the agent last changed the
// tree, so it loaded that tree: the restarted agent reports it running the
// applied plan, with nothing left to do in place.
func TestRealRestartWithANewWorkerAdoptsTheTree(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	landed := e.land(t, "plan-1", e.fs)
	applied := e.c.state("?plan=0")
	e.stopAgent()

	reply, err := realExchange(e.h.MasterSocket(), "reload;quit\n", 30*time.Second)
	if err != nil && !strings.HasPrefix(reply, "Success=1") {
		t.Fatalf("reload through the master: %v %q", err, reply)
	}
	if strings.HasPrefix(reply, "Success=0") {
		t.Fatalf("HAProxy refused the reload: %q", reply)
	}
	worker := awaitOtherWorker(t, e.h, landed.HAProxy.WorkerPID)

	e.startAgent(t)
	st := e.c.state("?plan=0")
	want := [2]string{applied.AppliedPlanID, applied.AppliedPlanProof}
	if st.AppliedPlanID != want[0] || st.AppliedPlanProof != want[1] ||
		st.RunningPlanID != want[0] || st.RunningPlanProof != want[1] ||
		st.WorkerOpsPlanID != want[0] || st.WorkerOpsPlanProof != want[1] {
		t.Errorf("pairs after the restart: applied %s/%s running %s/%s worker ops %s/%s, want %v for all",
			st.AppliedPlanID, st.AppliedPlanProof, st.RunningPlanID, st.RunningPlanProof,
			st.WorkerOpsPlanID, st.WorkerOpsPlanProof, want)
	}
	if st.HAProxy.WorkerPID != worker || st.HAProxy.WorkerPID == landed.HAProxy.WorkerPID {
		t.Errorf("haproxy.worker_pid %d, the new worker is %d (the landed set ran on %d)",
			st.HAProxy.WorkerPID, worker, landed.HAProxy.WorkerPID)
	}
}

// TestRealRestartAfterTreeDriftForgets: a file changed while the agent was
// away, so nothing the agent recorded proves what the tree or the worker
// hold: the applied, running and worker-ops pairs are empty, no file keeps
// its proof, and the next auto apply reloads.
func TestRealRestartAfterTreeDriftForgets(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	landed := e.land(t, "plan-1", e.fs)
	e.stopAgent()
	drifted := e.fs["maps/host.map"] + "drifted.example.com be-a\n"
	if err := os.WriteFile(filepath.Join(e.h.Dir, "maps/host.map"), []byte(drifted), 0o600); err != nil {
		t.Fatal(err)
	}
	e.startAgent(t)

	st := e.c.state("?plan=0")
	if st.AppliedPlanID != "" || st.AppliedPlanProof != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("the baseline survived a drifted tree: %s", jsonOf(st))
	}
	for p, at := range st.Files {
		if at.Proof != "" {
			t.Errorf("%s kept its proof %q", p, at.Proof)
		}
	}
	if held := st.Files["maps/host.map"]; held.Digest != DigestString(drifted) {
		t.Errorf("the agent reports %s for the map, the disk holds %s", held.Digest, DigestString(drifted))
	}

	next, _ := mapEntryChange(e.fs, "after-drift.example.com", "be-a")
	m := e.c.manifestFrom(st, "plan-2", next)
	res, sent := e.applyHeld(t, st, m, next)
	if len(sent) != len(next) {
		t.Errorf("the controller sends %v; with no proofs held it must send all %d files", sent, len(next))
	}
	if !res.OK || res.Mode != ResultReload || res.HAProxy.SameWorker(landed.HAProxy) {
		t.Fatalf("the next auto apply: %s", jsonOf(res))
	}
	if keys := workerMapEntries(t, e.h, "maps/host.map"); !slices.Contains(keys, "after-drift.example.com") ||
		slices.Contains(keys, "drifted.example.com") {
		t.Fatalf("the reloaded worker's map: %v", keys)
	}
}

// ---------------------------------------------------------------------------
// A refused reload.

// TestRealRefusedReloadKeepsThePreviousBaseline: HAProxy refuses a config
// and keeps the worker it had. The rollback puts the previous tree back
// byte for byte, so everything the agent proved before still holds: the
// previous pairs, and every file's proof. The next one-entry change sends
// one part and lands at runtime.
//
// HAProxy 2.6's master answers a reload with nothing, so the agent learns
// of the refusal from show proc's failed counter and cannot quote
// HAProxy's ALERT; the message is checked only for being there.
func TestRealRefusedReloadKeepsThePreviousBaseline(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	landed := e.land(t, "plan-1", e.fs)
	before := e.c.state("?plan=0")

	bad := e.fs.clone()
	bad[ConfigFilePath] = strings.Replace(e.fs[ConfigFilePath], "frontend status\n", "frontend status\n    bogus_keyword\n", 1)
	if bad[ConfigFilePath] == e.fs[ConfigFilePath] {
		t.Fatal("the fixture has no frontend status to break")
	}
	m := e.c.manifest("plan-bad", bad)
	m.Mode = ModeReload
	res := e.c.apply(m, bad)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("the refused config: %s", jsonOf(res))
	}
	if isAtLeast30(e.h) {
		if !strings.Contains(res.Error.Message, "ALERT") || !strings.Contains(res.Error.Message, "bogus_keyword") {
			t.Errorf("the message does not carry HAProxy's ALERT: %q", res.Error.Message)
		}
	} else if res.Error.Message == "" {
		t.Error("an empty message")
	} else {
		t.Logf("HAProxy %s gives no reload log; the agent says %q", e.h.Version(), res.Error.Message)
	}
	if pid := realWorkerPID(e.h); pid != landed.HAProxy.WorkerPID {
		t.Fatalf("worker %d answers after the refusal, want the previous one, %d", pid, landed.HAProxy.WorkerPID)
	}
	if got := diskSet(t, e.h.Dir); !sameSet(got, e.fs) {
		t.Fatalf("the tree after the refusal is not the landed set: %v", got.paths())
	}

	st := e.c.state("?plan=0")
	type pairs struct{ applied, running, workerOps [2]string }
	of := func(s State) pairs {
		return pairs{[2]string{s.AppliedPlanID, s.AppliedPlanProof}, [2]string{s.RunningPlanID, s.RunningPlanProof},
			[2]string{s.WorkerOpsPlanID, s.WorkerOpsPlanProof}}
	}
	if of(st) != of(before) || of(before).applied[0] != "plan-1" {
		t.Fatalf("pairs after the refusal %+v, before it %+v", of(st), of(before))
	}

	next, op := mapEntryChange(e.fs, "after-refusal.example.com", "be-a")
	m = e.c.manifestFrom(st, "plan-good", next, op)
	res, sent := e.applyHeld(t, st, m, next)
	if !slices.Equal(sent, []string{"maps/host.map"}) {
		t.Errorf("after the refusal the controller must send %v, want only the map", sent)
	}
	// The restored config has the bytes it had before, so its proof holds.
	expectHeldProofs(t, st, e.fs, "maps/host.map")
	if !res.OK || res.Mode != ResultRuntime || !res.HAProxy.SameWorker(landed.HAProxy) {
		t.Fatalf("the next one-entry change: %s", jsonOf(res))
	}
	if keys := workerMapEntries(t, e.h, "maps/host.map"); !slices.Contains(keys, "after-refusal.example.com") {
		t.Fatalf("the worker's map lacks the entry: %v", keys)
	}
}

// ---------------------------------------------------------------------------
// Hostile reloads.

// bigRegexMap is n regular-expression entries. HAProxy compiles each one
// when it loads the map, so a few hundred thousand of them keep the reload
// busy for seconds with a file of a few MB; plain entries would need some
// 50 MB, close to the apply body limit, for the same load time.
func bigRegexMap(n int) string {
	const prefix, suffix = "^k", "\\.example\\.com$ be-a\n"
	b := make([]byte, 0, n*(len(prefix)+7+len(suffix)))
	for i := range n {
		b = append(b, prefix...)
		digits := strconv.Itoa(i)
		for range 7 - len(digits) {
			b = append(b, '0')
		}
		b = append(b, digits...)
		b = append(b, suffix...)
	}
	return string(b)
}

// measureMapLoad times `haproxy -c` on a config that loads content as a
// regex map, in a directory of its own: the same parsing and loading the
// master does at a reload, without touching the agent's tree.
func measureMapLoad(t *testing.T, bin, content string) time.Duration {
	t.Helper()
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "big.map")
	if err := os.WriteFile(mapPath, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := "defaults\n    mode http\n    timeout connect 5s\n    timeout client 5s\n    timeout server 5s\n\n" +
		"frontend f\n    bind unix@" + filepath.Join(dir, "f.sock") + "\n" +
		"    http-request set-var(txn.big) req.hdr(host),map_reg(" + mapPath + ")\n" +
		"    default_backend be-a\n\nbackend be-a\n    server s 127.0.0.1:9\n"
	cfgPath := filepath.Join(dir, "measure.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "-c", "-f", cfgPath).CombinedOutput()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Skipf("HAProxy took more than 30s to load a %d-byte regex map; too slow on this machine", len(content))
	}
	if err != nil {
		t.Fatalf("%s -c: %v\n%s", bin, err, out)
	}
	return took
}

// TestRealReloadSlowerThanItsTimeoutIsNeverVouchedFor: the agent's reload
// timeout is 1s, and the new set makes HAProxy load a map for several
// seconds. The apply is refused at stage reload and rolled back, but
// HAProxy may still bring up a worker with the refused set; the agent must
// never report a running plan for a worker other than the one answering,
// nor claim the earlier plan runs on a worker that loaded the refused map.
// Each state read is bracketed by two reads of the worker's PID, and a
// mismatch counts only when both agree, so a reload completing in between
// is not taken for a lie. Depending on how long HAProxy takes, the agent's
// recovery reload of the earlier set either wins (and the agent vouches for
// it on the new worker) or gives up while the master is still busy (and
// HAProxy ends up serving the refused set while the agent vouches for
// nothing); both are correct. At the end the earlier set is on disk, and
// sending it again reloads it and is vouched for.
func TestRealReloadSlowerThanItsTimeoutIsNeverVouchedFor(t *testing.T) {
	e := startRealLedgerEnv(t, time.Second)
	testStart := time.Now()
	earlier := e.land(t, "plan-1", e.fs)

	// Size the map so that HAProxy needs clearly more than the timeout to
	// load it: at least 2s by `haproxy -c`, doubling the entries at most
	// twice (1.2 million entries are some 36 MB, within the body limit).
	var big string
	var load time.Duration
	for n := 300_000; ; n *= 2 {
		genStart := time.Now()
		big = bigRegexMap(n)
		gen := time.Since(genStart)
		load = measureMapLoad(t, e.h.bin, big)
		t.Logf("HAProxy %s loads %d regex entries (%d bytes, generated in %v) in %v",
			e.h.Version(), n, len(big), gen.Round(time.Millisecond), load.Round(time.Millisecond))
		if load >= 2*time.Second {
			break
		}
		if n >= 1_200_000 {
			t.Skipf("HAProxy loads even %d regex entries in %v: too fast here to outlast a 1s reload timeout clearly", n, load)
		}
	}
	if load > 12*time.Second || time.Since(testStart) > 20*time.Second {
		t.Skipf("loading the map takes %v (%v spent so far): too slow to keep this test bounded", load, time.Since(testStart))
	}

	slow := e.fs.clone()
	slow["maps/big.map"] = big
	slow[ConfigFilePath] = strings.Replace(e.fs[ConfigFilePath], "frontend http-tcp\n",
		"frontend http-tcp\n    http-request set-var(txn.big) req.hdr(host),map_reg(maps/big.map)\n", 1)
	m := e.c.manifest("plan-slow", slow)
	m.Mode = ModeReload
	applyStart := time.Now()
	res := e.c.apply(m, slow)
	t.Logf("the slow reload was answered in %v: %s", time.Since(applyStart).Round(time.Millisecond), jsonOf(res.Error))
	if res.OK && res.Mode == ResultReload && res.Reload != nil && res.Reload.TookMs < time.Second.Milliseconds() {
		t.Skipf("HAProxy %s reloaded the big map in %dms, within the 1s timeout, although `haproxy -c` took %v",
			e.h.Version(), res.Reload.TookMs, load)
	}
	if res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the slow reload: %s", jsonOf(res))
	}
	if !strings.Contains(res.Error.Message, "within 1s") {
		t.Errorf("the NACK does not name the reload timeout: %q", res.Error.Message)
	}

	// check reads the state with query between two reads of the answering
	// worker's PID, the second on the same connection as its map listing.
	// It fails on a claim the worker disproves, and counts the reads where
	// the worker did not change in between (only those can disprove one).
	var seenBig []int
	bigSince := time.Duration(0)
	reads, vouched := 0, 0
	check := func(query string) {
		pidBefore := realWorkerPID(e.h)
		st, code := e.tryState(t, query)
		reply, err := realExchange(e.h.WorkerSocket(), "show info;show map\n", 5*time.Second)
		pidAfter, hasBig := pidOf(reply), strings.Contains(reply, "big.map")
		if err != nil || code != http.StatusOK || pidAfter == 0 {
			return
		}
		if hasBig && !slices.Contains(seenBig, pidAfter) {
			seenBig = append(seenBig, pidAfter)
			if bigSince == 0 {
				bigSince = time.Since(applyStart)
			}
		}
		if pidBefore != pidAfter {
			return
		}
		reads++
		if st.RunningPlanID == "" {
			return
		}
		vouched++
		if st.RunningPlanID != earlier.AppliedPlanID {
			t.Fatalf("%s: the agent vouches for %q, which it refused or never landed, on worker %d", query, st.RunningPlanID, st.HAProxy.WorkerPID)
		}
		if st.HAProxy.WorkerPID != pidAfter {
			t.Fatalf("%s: the agent vouches for %q on worker %d while worker %d answers", query, st.RunningPlanID, st.HAProxy.WorkerPID, pidAfter)
		}
		if hasBig {
			t.Fatalf("%s: the agent vouches for %q on worker %d, which loaded the refused map", query, st.RunningPlanID, pidAfter)
		}
	}
	// The answer itself must not vouch for a worker the reload's aftermath
	// replaced: read it once without verify, as a controller would after
	// the NACK.
	check("?plan=0")
	// Then watch for 10 s. The master may bring up a worker with the
	// refused set at any point, and the agent may reload the restored set.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		check("?plan=0&verify=1")
	}
	if reads == 0 {
		t.Fatal("no verified state read and worker reply agreed in 10s")
	}
	t.Logf("%d verified state reads agreed with the worker; %d of them vouched for a running plan", reads, vouched)
	if bigSince > 0 {
		t.Logf("a worker with the refused map (pid %v) answered %v after the apply was sent", seenBig, bigSince.Round(time.Millisecond))
	} else {
		t.Log("no worker with the refused map answered within the watch")
	}
	final := e.c.state("?plan=0&verify=1")
	t.Logf("after the watch: running %q on worker %d, applied %q, lkg %q", final.RunningPlanID, final.HAProxy.WorkerPID,
		final.AppliedPlanID, final.LKGPlanID)
	if got := diskSet(t, e.h.Dir); !sameSet(got, e.fs) {
		t.Fatalf("the tree is not the earlier set: %v", got.paths())
	}

	// The earlier set sent again reloads, and from then on the agent
	// vouches for it on a worker that answers and has no refused map.
	again := e.land(t, "plan-1-again", e.fs)
	reply, err := realExchange(e.h.WorkerSocket(), "show info;show map\n", 5*time.Second)
	if err != nil || pidOf(reply) != again.HAProxy.WorkerPID || strings.Contains(reply, "big.map") {
		t.Fatalf("after the earlier set landed again on worker %d: %v %q", again.HAProxy.WorkerPID, err, reply)
	}
	if st := e.c.state("?plan=0&verify=1"); st.RunningPlanID != "plan-1-again" || st.HAProxy.WorkerPID != again.HAProxy.WorkerPID {
		t.Fatalf("after the earlier set landed again: running %q on worker %d", st.RunningPlanID, st.HAProxy.WorkerPID)
	}
}

// TestRealStoppedMasterCostsTheReloadTimeout: a master stopped with
// SIGSTOP accepts connections into the kernel's backlog and never answers.
// A reload apply must be answered within the bounds of the reload timeout,
// not the 30 s I/O timeout; once the master runs again, a later apply
// lands. HAProxy 2.6 and 3.0 word the failure alike here (the agent's own
// timeout message), but only the stage and the bound are asserted.
func TestRealStoppedMasterCostsTheReloadTimeout(t *testing.T) {
	const reloadTimeout = 2 * time.Second
	e := startRealLedgerEnv(t, reloadTimeout)
	landed := e.land(t, "plan-1", e.fs)
	master := masterPID(t, e.h)

	if err := syscall.Kill(master, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			syscall.Kill(master, syscall.SIGCONT)
			stopped = false
		}
	}
	t.Cleanup(cont) // before HAProxy's own cleanup, which must be able to stop it

	next := e.fs.clone()
	next[ConfigFilePath] += "# stopped master\n"
	m := e.c.manifest("plan-2", next)
	m.Mode = ModeReload
	start := time.Now()
	res := e.c.apply(m, next)
	took := time.Since(start)
	t.Logf("HAProxy %s: the apply was answered in %v: %s", e.h.Version(), took.Round(time.Millisecond), jsonOf(res.Error))
	if res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the reload to a stopped master: %s", jsonOf(res))
	}
	// The reload is never sent, so no recovery reload follows: the answer
	// takes the reload timeout. Anything near the 30 s I/O timeout means a
	// wait was not bounded.
	if bound := reloadTimeout + 3*time.Second; took > bound {
		t.Errorf("the apply took %v with a %v reload timeout (bound %v)", took, reloadTimeout, bound)
	}
	if pid := realWorkerPID(e.h); pid != landed.HAProxy.WorkerPID {
		t.Errorf("worker %d answers while the master is stopped, want %d", pid, landed.HAProxy.WorkerPID)
	}
	if n := metricValue(e.a, "invariant_violations_total", invRecoveryReload); n != 0 {
		t.Errorf("a recovery reload was tried for a reload never sent: invariant_violations_total{recovery_reload} = %d", n)
	}
	cont()

	// The master works through what queued while it was stopped; the next
	// reload apply must land once it answers again.
	var last ApplyResult
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		st, code := e.tryState(t, "?plan=0")
		if code == http.StatusOK {
			m := e.c.manifestFrom(st, "plan-3", next)
			m.Mode = ModeReload
			code, body := e.c.post(applyRequest{manifest: m, files: next})
			if code == http.StatusOK && json.Unmarshal(body, &last) == nil && last.OK {
				break
			}
			t.Logf("an apply after SIGCONT: %d %s", code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no apply landed within 30s of SIGCONT: %s\n%s", jsonOf(last), e.h.Output())
		}
	}
	if last.Mode != ResultReload || last.HAProxy.WorkerPID == landed.HAProxy.WorkerPID {
		t.Fatalf("the apply after SIGCONT: %s", jsonOf(last))
	}
	if pid := realWorkerPID(e.h); pid != last.HAProxy.WorkerPID {
		t.Fatalf("worker %d answers, the agent reports %d", pid, last.HAProxy.WorkerPID)
	}
	if got := diskSet(t, e.h.Dir); !sameSet(got, next) {
		t.Errorf("the tree is not the landed set: %v", got.paths())
	}
}

// TestRealAWorkerStartedFromStaleFilesIsReloadedOnceTheyAreInPlace: the
// install of a runtime ACK is owed (its rename fails), and HAProxy is
// killed and started again in that window, on the tree as the disk holds
// it. Once the files are in place the agent reloads it: the ACKed entry is
// served again.
func TestRealAWorkerStartedFromStaleFilesIsReloadedOnceTheyAreInPlace(t *testing.T) {
	e := startRealLedgerEnv(t, 10*time.Second)
	e.stopAgent()
	d := &hookDisk{}
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	e.c = newAgentClient(t, e.a)
	e.land(t, "plan-1", e.fs)
	heal := refuseRenamesOnto(d, filepath.Join(e.a.files.base, "maps/host.map"))
	next, op := mapEntryChange(e.fs, "owed.example", "be-a")
	if res := e.c.apply(e.c.manifest("plan-2", next, op), next); !res.OK || res.Error == nil {
		t.Fatalf("the apply whose install fails: %s", jsonOf(res))
	}
	e.h = e.h.restart(t)
	if slices.Contains(workerMapEntries(t, e.h, "maps/host.map"), "owed.example") {
		t.Fatal("the restarted worker holds the owed entry: the test did not restart it on the stale tree")
	}
	heal()
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if !slices.Contains(workerMapEntries(t, e.h, "maps/host.map"), "owed.example") {
		t.Errorf("the files are in place and the agent is ready, but the worker HAProxy started meanwhile does not serve the ACKed entry\n%s", e.h.Output())
	}
}
