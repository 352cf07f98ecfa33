// Regression tests of the promise behind every ACK against a real HAProxy
// (HAPTIC_HAPROXY) in master-worker mode: the fake versions are in
// agent_reliability_test.go. What the worker serves is read from its stats
// socket, and a restart of HAProxy is a real one: the master stopped and
// started again on the same directory, behind the agent's back. It must
// never start a binary HAPTIC_HAPROXY does not name: without it every test
// here skips.

package haptic

import (
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// restartRealHAProxy stops the master (SIGTERM: it stops its worker and
// exits) and starts the binary again on the same directory, as an
// operator's restart does, and returns the new worker's PID.
func restartRealHAProxy(t *testing.T, e *realLedgerEnv) int {
	t.Helper()
	old := e.h
	prev := realWorkerPID(old)
	old.Stop()
	h := &realHAProxy{Dir: old.Dir, bin: old.bin, version: old.version, fixture: old.fixture, output: old.output, exited: make(chan struct{})}
	h.cmd = exec.Command(old.bin, old.cmd.Args[1:]...)
	h.cmd.Stdout, h.cmd.Stderr = h.output, h.output
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("starting %s again: %v", h.bin, err)
	}
	go func() {
		h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(h.Stop) // before the first start's cleanup removes the directory
	h.waitReady(t)
	e.h = h
	pid := realWorkerPID(h)
	if pid == 0 || pid == prev {
		t.Fatalf("after the restart worker %d answers (before it %d)", pid, prev)
	}
	return pid
}

// workerServesMapOf fails unless the real worker's host map holds every key
// of the map in set, and no other.
func workerServesMapOf(t *testing.T, h *realHAProxy, set fileSet) {
	t.Helper()
	var want []string
	for _, e := range ParseMapEntries(set["maps/host.map"]) {
		want = append(want, e.Key)
	}
	got := workerMapEntries(t, h, "maps/host.map")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the worker serves %d keys, the ACKed set holds %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// TestRealARefusedConfigKeepsEveryACKedRuntimeChange: a render, 22
// one-entry changes ACKed at runtime, then a config HAProxy 3.0 refuses (an
// unknown keyword). The map file keeps all 23 entries, the applied plan is
// the one before the refused one, the next one-entry change is a runtime
// apply sending one part, and HAProxy restarted afterwards serves every
// entry ever ACKed.
func TestRealARefusedConfigKeepsEveryACKedRuntimeChange(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	set := e.fs.clone()
	set["maps/host.map"] = "example.com be-a\n"
	e.land(t, "plan-1", set)
	set, _ = ackEntries(t, e.c, set, "ack", 22)
	before := e.c.state("?plan=0")
	pid := realWorkerPID(e.h)

	bad := set.clone()
	bad[ConfigFilePath] = strings.Replace(set[ConfigFilePath], "frontend status\n", "frontend status\n    bogus_keyword\n", 1)
	m := e.c.manifest("plan-bad", bad)
	m.Mode = ModeReload
	if res := e.c.apply(m, bad); res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the refused config: %s", jsonOf(res))
	}
	if got := diskSet(t, e.h.Dir); !sameSet(got, set) || len(ParseMapEntries(got["maps/host.map"])) != 23 {
		t.Fatalf("the tree after the refusal is not the ACKed set; map:\n%s", got["maps/host.map"])
	}
	st := e.c.state("?plan=0")
	samePairs(t, "after the refusal", st, before)
	if st.AppliedPlanID != "plan-ack-21.example" {
		t.Errorf("applied %q, want the plan before the refused one", st.AppliedPlanID)
	}
	if got := realWorkerPID(e.h); got != pid {
		t.Fatalf("worker %d answers after the refusal, want %d", got, pid)
	}
	workerServesMapOf(t, e.h, set)

	next, op := mapEntryChange(set, "after.example", "be-a")
	res, sent := e.applyHeld(t, st, e.c.manifestFrom(st, "plan-after", next, op), next)
	if !res.OK || res.Mode != ResultRuntime || !slices.Equal(sent, []string{"maps/host.map"}) {
		t.Fatalf("the next one-entry change (sent %v): %s", sent, jsonOf(res))
	}
	restartRealHAProxy(t, e)
	workerServesMapOf(t, e.h, next)
}

// TestRealAFailedFallbackReloadReloadsTheTreeTheApplyFound: a one-entry
// change the worker refuses (a map the worker does not know) falls back to
// a reload, which HAProxy refuses too (the config changed with it). The op
// reached the worker, so the agent reloads the tree the apply started from,
// and the new worker serves every entry ACKed before.
func TestRealAFailedFallbackReloadReloadsTheTreeTheApplyFound(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.land(t, "plan-1", e.fs)
	set, _ := ackEntries(t, e.c, e.fs, "ack", 5)
	before := e.c.state("?plan=0")
	pid := realWorkerPID(e.h)

	next := set.clone()
	next["maps/other.map"] = "refused.example be-a\n"
	next[ConfigFilePath] = strings.Replace(set[ConfigFilePath], "frontend status\n", "frontend status\n    bogus_keyword\n", 1)
	op := Op{Kind: OpMapAdd, Path: "maps/other.map", Key: "refused.example", Value: "be-a"}
	res := e.c.apply(e.c.manifest("plan-refused", next, op), next)
	if res.OK || res.Reload == nil || res.Reload.OK || res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
		t.Fatalf("the refused fallback: %s", jsonOf(res))
	}
	if got := diskSet(t, e.h.Dir); !sameSet(got, set) {
		t.Errorf("the tree is not the one the apply found: %v", got.paths())
	}
	if got := realWorkerPID(e.h); got == pid || got != res.HAProxy.WorkerPID {
		t.Errorf("worker %d answers; before %d, the answer names %d", got, pid, res.HAProxy.WorkerPID)
	}
	workerServesMapOf(t, e.h, set)
	st := e.c.state("?plan=0")
	if st.AppliedPlanProof != before.AppliedPlanProof || st.RunningPlanProof != before.AppliedPlanProof ||
		st.WorkerOpsPlanProof != before.AppliedPlanProof {
		t.Errorf("after the recovery: %s, before %s", jsonOf(st), jsonOf(before))
	}
}

// TestRealAFullDiskAtTheRecordWriteChangesNothing: the log refuses the
// apply's record with ENOSPC after runtime ACKs. The apply is refused at
// stage backup having changed nothing: HAProxy's worker keeps serving
// every ACKed entry, nothing is reloaded, and once the disk has room the
// same change lands at runtime.
func TestRealAFullDiskAtTheRecordWriteChangesNothing(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.land(t, "plan-1", e.fs)
	e.stopAgent()
	d := &hookDisk{}
	seq := e.c.seq
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	e.c = newAgentClient(t, e.a)
	e.c.seq = seq
	set, _ := ackEntries(t, e.c, e.fs, "ack", 3)
	before := e.c.state("?plan=0")
	pid := realWorkerPID(e.h)

	next, op := applyOnAFullDisk(t, d, e.c, e.cfg.BaseDir, set)
	if got := realWorkerPID(e.h); got != pid {
		t.Errorf("worker %d answers, want %d: HAProxy was reloaded", got, pid)
	}
	workerServesMapOf(t, e.h, set)
	samePairs(t, "after the full disk", e.c.state("?plan=0"), before)

	if res := e.c.apply(e.c.manifest("plan-full", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the apply once the disk has room: %s", jsonOf(res))
	}
	workerServesMapOf(t, e.h, next)
}

// TestRealADamagedLogRecordIsNeverActedOn: six runtime ACKs, a kill, one
// flipped byte in the middle of the second apply record. The agent keeps
// the damaged log aside, logs where it is, reloads nothing (the worker
// that served the six entries still does), keeps the tree, vouches for no
// plan and goes on above every number it gave.
func TestRealADamagedLogRecordIsNeverActedOn(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.land(t, "plan-1", e.fs)
	set, acks := ackEntries(t, e.c, e.fs, "ack", 6)
	gave := e.c.state("?plan=0")
	if gave.Generation != 7 || gave.AppliedToken != (Token{LeaderEpoch: 1, RenderSeq: 7}) {
		t.Fatalf("setup: generation %d token %+v", gave.Generation, gave.AppliedToken)
	}
	pid := realWorkerPID(e.h)
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	start, damaged := damageSecondApply(t, e.cfg.BaseDir)
	logs := &lockedBuffer{}
	e.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	e.startAgent(t)
	if got := realWorkerPID(e.h); got != pid {
		t.Errorf("worker %d answers, want %d: HAProxy was reloaded", got, pid)
	}
	workerServesMapOf(t, e.h, set)
	expectDamageHandled(t, e.c, e.cfg.BaseDir, logs.String(), start, damaged, set, gave, acks)
}

// TestRealAPlainStateReadWithholdsTheRunningPlanOfAWorkerThatIsGone:
// HAProxy restarted behind the agent's back; the first plain state read
// reports the worker that answers and no running or worker-ops plan.
func TestRealAPlainStateReadWithholdsTheRunningPlanOfAWorkerThatIsGone(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.land(t, "plan-1", e.fs)
	pid := restartRealHAProxy(t, e)
	st := e.c.state("?plan=0")
	if st.HAProxy.WorkerPID != pid {
		t.Errorf("the state reports worker %d, %d answers", st.HAProxy.WorkerPID, pid)
	}
	if st.RunningPlanID != "" || st.RunningPlanProof != "" || st.WorkerOpsPlanID != "" || st.WorkerOpsPlanProof != "" {
		t.Errorf("a plain read vouches for the worker that is gone: running %s/%s worker ops %s/%s",
			st.RunningPlanID, st.RunningPlanProof, st.WorkerOpsPlanID, st.WorkerOpsPlanProof)
	}
}

// TestRealTheFirstPushAfterAnHAProxyRestartLandsItsPlan: a controller that
// read the state before HAProxy restarted sends a one-entry change; the op
// finds the new worker, the agent reloads, and since that reload loaded
// the whole set the apply lands its plan: the same render again is a noop.
func TestRealTheFirstPushAfterAnHAProxyRestartLandsItsPlan(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.land(t, "plan-1", e.fs)
	read := e.c.state("?plan=0")
	restartRealHAProxy(t, e)
	next, op := mapEntryChange(e.fs, "after-restart.example", "be-a")
	res, _ := e.applyHeld(t, read, e.c.manifestFrom(read, "plan-2", next, op), next)
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != "plan-2" || res.RunningPlanID != "plan-2" || res.WorkerOpsPlanID != "plan-2" {
		t.Fatalf("the first push after the restart: %s", jsonOf(res))
	}
	if got := realWorkerPID(e.h); got != res.HAProxy.WorkerPID {
		t.Errorf("worker %d answers, the answer names %d", got, res.HAProxy.WorkerPID)
	}
	workerServesMapOf(t, e.h, next)
	st := e.c.state("?plan=0")
	again, sent := e.applyHeld(t, st, e.c.manifestFrom(st, "plan-2", next), next)
	if !again.OK || again.Mode != ResultNoop || len(sent) != 0 {
		t.Errorf("the same render again (sent %v): %s", sent, jsonOf(again))
	}
	if got := realWorkerPID(e.h); got != res.HAProxy.WorkerPID {
		t.Errorf("worker %d answers after the noop, want %d", got, res.HAProxy.WorkerPID)
	}
}

// TestRealAPlanUploadDuringAnApplyNeverRewindsTheState is
// TestAPlanUploadDuringAnApplyNeverRewindsTheState against a real HAProxy:
// the upload waits for the held runtime apply, and after a kill -9 at that
// instant and a start the pairs name the plan whose files are on disk and
// the worker serves its entry.
func TestRealAPlanUploadDuringAnApplyNeverRewindsTheState(t *testing.T) {
	e := startRealLedgerEnv(t, 20*time.Second)
	e.stopAgent()
	d := &hookDisk{}
	seq := e.c.seq
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	e.c = newAgentClient(t, e.a)
	e.c.seq = seq
	next, p2, img := uploadWhileAnApplyIsHeld(t, e.a, e.c, d, func(id string, fs fileSet) { e.land(t, id, fs) }, e.fs.clone(), e.cfg.BaseDir)
	e.stopAgent()
	restoreImage(t, e.cfg.BaseDir, img)
	e.startAgent(t)
	after := e.c.state("?plan=0")
	if after.AppliedPlanID != p2.ID || after.WorkerOpsPlanID != p2.ID {
		t.Errorf("after the kill and a start: applied %q, worker ops %q; the files on disk are plan 2's (%q)",
			after.AppliedPlanID, after.WorkerOpsPlanID, p2.ID)
	}
	if got := diskSet(t, e.h.Dir); !sameSet(got, next) {
		t.Errorf("the tree after the start:\n%s", describeSetDiff(got, next))
	}
	workerServesMapOf(t, e.h, next)
}
