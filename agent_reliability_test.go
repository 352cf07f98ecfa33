// Regression tests of the promise behind every ACK, on the fake: nothing
// the agent acknowledged is taken back by a refusal, a full disk, a
// restart or a damaged log; a state read vouches only for the worker that
// answers; and the rules of fencing, recovery and durability that once
// could be broken without a test failing. The same cases against a real
// HAProxy are in agent_reliability_real_test.go.
//
// A kill -9 is simulated with stopAsKilled: the state file and the log
// are put back as they were before the clean stop compacted them. A test
// here must never touch the agent's files or the fake behind its back
// except for the one fault it is about (a kill, a flipped byte, a full
// disk, a restarted HAProxy), so that what it then sees is the agent's
// doing.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ackEntries makes n one-entry map changes on top of set, each of which
// the agent must answer as a runtime map_add, and returns the set they
// leave and their answers.
func ackEntries(t *testing.T, c *agentClient, set fileSet, prefix string, n int) (fileSet, []ApplyResult) {
	t.Helper()
	var acks []ApplyResult
	for i := range n {
		key := fmt.Sprintf("%s-%02d.example", prefix, i)
		next, op := mapEntryChange(set, key, "be-a")
		res := c.apply(c.manifest("plan-"+key, next, op), next)
		if !res.OK || res.Mode != ResultRuntime || len(res.OpResults) != 1 || res.OpResults[0].Kind != OpMapAdd {
			t.Fatalf("the one-entry change %s: %+v", key, res)
		}
		set, acks = next, append(acks, res)
	}
	return set, acks
}

// workerHoldsMapOf fails unless the fake worker's host map holds exactly
// the entries of the map in set.
func workerHoldsMapOf(t *testing.T, fake *FakeHAProxy, set fileSet) {
	t.Helper()
	want := ParseMapEntries(set["maps/host.map"])
	if got := fake.MapEntries("maps/host.map"); !slices.Equal(got, want) {
		t.Errorf("the worker's map holds %d entries, the ACKed set %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// samePairs fails unless the applied, running and worker-ops pairs of two
// answers are equal.
func samePairs(t *testing.T, what string, got, want State) {
	t.Helper()
	type pairs struct{ applied, running, workerOps [2]string }
	of := func(s State) pairs {
		return pairs{[2]string{s.AppliedPlanID, s.AppliedPlanProof}, [2]string{s.RunningPlanID, s.RunningPlanProof},
			[2]string{s.WorkerOpsPlanID, s.WorkerOpsPlanProof}}
	}
	if of(got) != of(want) {
		t.Errorf("%s: pairs %+v, want %+v", what, of(got), of(want))
	}
}

// killAndRestart stops the agent as kill -9 would and starts a new one on
// the same directory.
func (e *testEnv) killAndRestart(t *testing.T) {
	t.Helper()
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	e.restartStopped(t)
}

// restartFake restarts the fake HAProxy behind the agent's back: a new
// master and worker, which load the files on disk.
func restartFake(fake *FakeHAProxy) {
	fake.With(func(m *FakeModel) {
		m.MasterPID, m.Pid, m.StartTimeUnixMicros = m.MasterPID+1, m.Pid+100, m.StartTimeUnixMicros+100_000_000
		if m.OnReload != nil {
			m.OnReload(m)
		}
	})
}

// ---------------------------------------------------------------------------
// A refusal undoes only its own apply.

// TestARefusedConfigKeepsEveryACKedRuntimeChange: after a render and 22
// one-entry changes ACKed at runtime, HAProxy refuses a config. The map
// file keeps all 23 entries (a restart of HAProxy would serve them), the
// applied plan is the one before the refused one, and the next one-entry
// change is a runtime apply sending one part.
func TestARefusedConfigKeepsEveryACKedRuntimeChange(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	set, _ = ackEntries(t, e.c, set, "ack", 22)
	before := e.c.state("?plan=0")
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	bad := set.clone()
	bad[ConfigFilePath] += "bogus\n"
	res := e.c.apply(reloadManifest(e, "plan-bad", bad), bad)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	if res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the refused config: %+v", res)
	}
	if got := e.disk(t); !sameSet(got, set) || len(ParseMapEntries(got["maps/host.map"])) != 23 {
		t.Fatalf("the tree after the refusal is not the ACKed set; map:\n%s", got["maps/host.map"])
	}
	st := e.c.state("?plan=0")
	samePairs(t, "after the refusal", st, before)
	if st.AppliedPlanID != "plan-ack-21.example" {
		t.Errorf("applied %q, want the plan before the refused one", st.AppliedPlanID)
	}
	workerHoldsMapOf(t, e.fake, set)

	next, op := mapEntryChange(set, "after.example", "be-a")
	m := e.c.manifestFrom(st, "plan-after", next, op)
	if sent := partsNeeded(st, m); !slices.Equal(sent, []string{"maps/host.map"}) {
		t.Errorf("the next change must send only the map, sends %v", sent)
	}
	if res := e.c.apply(m, next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the next one-entry change: %+v", res)
	}
	workerHoldsMapOf(t, e.fake, next)
}

// TestAFailedFallbackReloadReloadsTheTreeTheApplyFound: a runtime op the
// worker refuses falls back to a reload, which HAProxy refuses too. The
// op may have changed the worker, so the agent reloads the tree the apply
// started from: the worker then serves every entry ACKed before, not the
// last reload's set.
func TestAFailedFallbackReloadReloadsTheTreeTheApplyFound(t *testing.T) {
	// Reload 1 lands plan-1, 2 is the fallback (refused), 3 the recovery.
	e, set := landedEnv(t, nil, failingReloads(2))
	set, _ = ackEntries(t, e.c, set, "ack", 5)
	before := e.c.state("?plan=0")
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "Unknown map.", strings.HasPrefix(cmd, "add map") }
	})
	next, op := mapEntryChange(set, "refused.example", "be-a")
	res := e.c.apply(e.c.manifest("plan-refused", next, op), next)
	if res.OK || res.Reload == nil || res.Reload.OK || res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
		t.Fatalf("the refused fallback: %+v reload %+v rollback %+v", res, res.Reload, res.Rollback)
	}
	if n := fakeReloads(e.fake); n != 3 {
		t.Errorf("%d reloads, want 3: plan-1, the refused fallback, the recovery", n)
	}
	if got := e.disk(t); !sameSet(got, set) {
		t.Errorf("the tree is not the one the apply found; map:\n%s", got["maps/host.map"])
	}
	workerHoldsMapOf(t, e.fake, set)
	// The worker reloaded the tree the apply found: the applied plan runs.
	st := e.c.state("?plan=0")
	if st.AppliedPlanID != before.AppliedPlanID || st.AppliedPlanProof != before.AppliedPlanProof ||
		st.RunningPlanProof != before.AppliedPlanProof || st.WorkerOpsPlanProof != before.AppliedPlanProof {
		t.Errorf("after the recovery: %+v, before %+v", st, before)
	}
}

// ---------------------------------------------------------------------------
// A full disk.

// applyOnAFullDisk sends a one-entry change on top of set while the log
// refuses every write with ENOSPC, and fails unless the apply is refused
// at stage backup with the tree left as set. It returns the change, for
// the test to send again once the disk has room.
func applyOnAFullDisk(t *testing.T, d *hookDisk, c *agentClient, base string, set fileSet) (fileSet, Op) {
	t.Helper()
	logPath := filepath.Join(base, logFileName)
	d.setHook(func(op diskOp) error {
		if op.Op == "write" && op.Path == logPath {
			return &fs.PathError{Op: "write", Path: logPath, Err: syscall.ENOSPC}
		}
		return nil
	})
	next, op := mapEntryChange(set, "full.example", "be-a")
	res := c.apply(c.manifest("plan-full", next, op), next)
	d.setHook(nil)
	if res.OK || res.Error == nil || res.Error.Stage != StageBackup || !strings.Contains(res.Error.Message, "no space left on device") {
		t.Fatalf("the apply on a full disk: %+v %+v", res, res.Error)
	}
	if got := diskSet(t, base); !sameSet(got, set) {
		t.Errorf("the tree changed; map:\n%s", got["maps/host.map"])
	}
	return next, op
}

// TestAFullDiskAtTheRecordWriteChangesNothing: the log refuses the
// apply's record with ENOSPC after runtime ACKs. The apply is refused at
// stage backup having changed nothing: the ACKed entries stay on disk and
// in the worker, no op ran and nothing reloaded; once the disk has room,
// the same change lands at runtime.
func TestAFullDiskAtTheRecordWriteChangesNothing(t *testing.T) {
	d, e, set := ackedOnHookDisk(t)
	before := e.c.state("?plan=0")
	reloads, worker := fakeReloads(e.fake), e.fake.Worker()
	next, op := applyOnAFullDisk(t, d, e.c, e.cfg.BaseDir, set)
	if fakeReloads(e.fake) != reloads || e.fake.Worker() != worker {
		t.Errorf("HAProxy was reloaded: %d reloads, then %d", reloads, fakeReloads(e.fake))
	}
	workerHoldsMapOf(t, e.fake, set)
	samePairs(t, "after the full disk", e.c.state("?plan=0"), before)

	if res := e.c.apply(e.c.manifest("plan-full", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the apply once the disk has room: %+v", res)
	}
	if !sameSet(e.disk(t), next) {
		t.Error("the tree is not the landed set")
	}
	workerHoldsMapOf(t, e.fake, next)
}

// ackedOnHookDisk lands the seed set on an agent whose disk the test can
// fail, then makes three runtime ACKs on top of it.
func ackedOnHookDisk(t *testing.T) (*hookDisk, *testEnv, fileSet) {
	t.Helper()
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	set, _ = ackEntries(t, e.c, set, "ack", 3)
	return d, e, set
}

// ---------------------------------------------------------------------------
// A damaged history.

// recordSpan is where the n-th record (from 1) of the given kind lies in
// the log's bytes.
func recordSpan(t *testing.T, b []byte, kind string, n int) (start, end int) {
	t.Helper()
	for pos := 0; ; {
		r, next, ok := frameAt(b, pos)
		if !ok {
			t.Fatalf("the log holds fewer than %d %s records", n, kind)
		}
		if r.Kind == kind {
			if n--; n == 0 {
				return pos, next
			}
		}
		pos = next
	}
}

// errorLogged reports whether an ERROR line of the JSON logs holds every
// one of parts.
func errorLogged(logs string, parts ...string) bool {
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, `"level":"ERROR"`) && !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

// tokenBelow orders tokens by epoch, then render sequence.
func tokenBelow(a, b Token) bool {
	return a.LeaderEpoch < b.LeaderEpoch || a.LeaderEpoch == b.LeaderEpoch && a.RenderSeq < b.RenderSeq
}

// damageSecondApply flips one byte in the middle of the second apply
// record of a stopped agent's log, and returns the record's offset and the
// log's bytes.
func damageSecondApply(t *testing.T, base string) (int, []byte) {
	t.Helper()
	logPath := filepath.Join(base, logFileName)
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	start, end := recordSpan(t, b, recordApply, 2)
	b[(start+end)/2] ^= 0x01
	if err := os.WriteFile(logPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return start, b
}

// expectDamageHandled checks what an agent started over the log that
// damageSecondApply left must do, apart from the worker: an error naming
// the log and the offset, the log kept aside, the tree as set left it, no
// plan vouched for, numbers not below what gave and acks handed out; and
// the next push reloads the desired set with a proof never given.
func expectDamageHandled(t *testing.T, c *agentClient, base, logs string, start int, damaged []byte, set fileSet, gave State, acks []ApplyResult) {
	t.Helper()
	logPath := filepath.Join(base, logFileName)
	if !errorLogged(logs, logPath, fmt.Sprintf("offset %d", start)) {
		t.Errorf("no error names %s at offset %d:\n%s", logPath, start, logs)
	}
	if aside, err := os.ReadFile(logPath + ".damaged"); err != nil || !bytes.Equal(aside, damaged) {
		t.Errorf("the damaged log is not kept aside: %v", err)
	}
	if got := diskSet(t, base); !sameSet(got, set) {
		t.Errorf("the tree changed; map:\n%s", got["maps/host.map"])
	}
	st := c.state("?plan=0")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" || st.LKGPlanID != "" {
		t.Errorf("a damaged log vouches for a plan: applied %q running %q worker ops %q lkg %q",
			st.AppliedPlanID, st.RunningPlanID, st.WorkerOpsPlanID, st.LKGPlanID)
	}
	if st.Generation < gave.Generation || tokenBelow(st.AppliedToken, gave.AppliedToken) {
		t.Errorf("generation %d token %+v, below the %d and %+v it gave", st.Generation, st.AppliedToken, gave.Generation, gave.AppliedToken)
	}
	res := c.apply(c.manifest("plan-next", set), set)
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != "plan-next" {
		t.Fatalf("the push after the damage: %+v", res)
	}
	for _, ack := range acks {
		if res.AppliedPlanProof == ack.AppliedPlanProof {
			t.Errorf("proof %s given again", res.AppliedPlanProof)
		}
	}
	if s := c.state("?plan=0"); s.Generation <= gave.Generation {
		t.Errorf("generation %d after the push, it gave %d before", s.Generation, gave.Generation)
	}
}

// TestADamagedLogRecordIsNeverActedOn: six runtime ACKs, a kill, one
// flipped byte in the middle of the second apply record. Records after it
// say it had been synced, so this is damage, not a torn tail: the agent
// logs an error naming the log and the offset, keeps the damaged log
// aside, reloads nothing, keeps the tree as it stands (all six entries),
// reports no applied plan, and goes on above the generation, token and
// proofs it gave.
func TestADamagedLogRecordIsNeverActedOn(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	set, acks := ackEntries(t, e.c, set, "ack", 6)
	gave := e.c.state("?plan=0")
	if gave.Generation != 7 || gave.AppliedToken != (Token{LeaderEpoch: 1, RenderSeq: 7}) {
		t.Fatalf("setup: generation %d token %+v", gave.Generation, gave.AppliedToken)
	}
	reloads, worker := fakeReloads(e.fake), e.fake.Worker()
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	start, damaged := damageSecondApply(t, e.cfg.BaseDir)
	logs := &lockedBuffer{}
	e.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	e.restartStopped(t)
	if fakeReloads(e.fake) != reloads || e.fake.Worker() != worker {
		t.Errorf("HAProxy was reloaded: %d reloads, then %d", reloads, fakeReloads(e.fake))
	}
	workerHoldsMapOf(t, e.fake, set)
	expectDamageHandled(t, e.c, e.cfg.BaseDir, logs.String(), start, damaged, set, gave, acks)
}

// TestAFlippedEpochInTheSnapshotIsDamageNotAnEpoch: "leader_epoch":1
// turned into 9 in the snapshot of a cleanly stopped agent fails its
// checksum. The agent sets the snapshot aside and forgets the baseline; it
// never takes 9 for an epoch, so the controller at epoch 1 is not fenced.
func TestAFlippedEpochInTheSnapshotIsDamageNotAnEpoch(t *testing.T) {
	_, cfg, c, _ := landedThenStopped(t)
	path := filepath.Join(cfg.BaseDir, ".haptic-agent.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Replace(b, []byte(`"leader_epoch":1`), []byte(`"leader_epoch":9`), 1)
	if bytes.Equal(flipped, b) {
		t.Fatal(`the snapshot holds no "leader_epoch":1`)
	}
	if err := os.WriteFile(path, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := launchTestAgent(t, cfg, true)
	c2 := newAgentClient(t, a)
	c2.seq = c.seq
	st := c2.state("?plan=0")
	if st.AppliedToken.LeaderEpoch == 9 || st.AppliedPlanID != "" {
		t.Errorf("the damaged snapshot was trusted: token %+v applied %q", st.AppliedToken, st.AppliedPlanID)
	}
	if aside, err := os.ReadFile(path + ".damaged"); err != nil || !bytes.Equal(aside, flipped) {
		t.Errorf("the damaged snapshot is not kept aside: %v", err)
	}
	set := seedFiles()
	code, body := c2.post(applyRequest{manifest: c2.manifest("plan-2", set), files: set})
	if res := applyResultOf(t, code, body); !res.OK || res.Mode != ResultReload {
		t.Errorf("the controller at epoch 1: %+v", res)
	}
}

// TestADamagedSnapshotNeverReissuesANumber: after a clean stop the log
// holds only the numbers the snapshot also holds; once the snapshot is
// damaged, the first push must still not be given a generation or a proof
// given before.
func TestADamagedSnapshotNeverReissuesANumber(t *testing.T) {
	_, cfg, c, first := landedThenStopped(t)
	path := filepath.Join(cfg.BaseDir, ".haptic-agent.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := launchTestAgent(t, cfg, true)
	c2 := newAgentClient(t, a)
	c2.seq = c.seq
	set := seedFiles()
	res := c2.apply(c2.manifest("plan-1", set), set)
	if st := c2.state("?plan=0"); !res.OK || res.AppliedPlanProof == first.AppliedPlanProof || st.Generation <= 1 {
		t.Errorf("the push after the damage: proof %s (before %s), generation %d (before 1)", res.AppliedPlanProof, first.AppliedPlanProof, st.Generation)
	}
}

// applyResultOf decodes a 200 apply answer, failing on anything else.
func applyResultOf(t *testing.T, code int, body []byte) ApplyResult {
	t.Helper()
	if code != http.StatusOK {
		t.Fatalf("apply answered %d %s", code, body)
	}
	var res ApplyResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return res
}

// ---------------------------------------------------------------------------
// HAProxy restarted behind the agent's back.

// TestAPlainStateReadWithholdsTheRunningPlanOfAWorkerThatIsGone: after
// HAProxy restarted, the first plain state read reports the worker that
// answers and no running or worker-ops plan on it.
func TestAPlainStateReadWithholdsTheRunningPlanOfAWorkerThatIsGone(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	restartFake(e.fake)
	st := e.c.state("?plan=0")
	if !st.HAProxy.SameWorker(e.fake.Worker()) {
		t.Errorf("the state reports worker %+v, %+v answers", st.HAProxy, e.fake.Worker())
	}
	if st.RunningPlanID != "" || st.RunningPlanProof != "" || st.WorkerOpsPlanID != "" || st.WorkerOpsPlanProof != "" {
		t.Errorf("a plain read vouches for the worker that is gone: running %s/%s worker ops %s/%s",
			st.RunningPlanID, st.RunningPlanProof, st.WorkerOpsPlanID, st.WorkerOpsPlanProof)
	}
}

// TestTheFirstPushAfterAnHAProxyRestartLandsItsPlan: a controller that
// read the state just before HAProxy restarted sends a one-entry change.
// Its op reaches the new worker, which the agent adopts, and it falls back
// to a reload; that reload loaded the whole set, so the apply lands its
// plan although a foreign worker was seen before it, and the same render
// pushed again is a noop.
func TestTheFirstPushAfterAnHAProxyRestartLandsItsPlan(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	read := e.c.state("?plan=0")
	restartFake(e.fake)
	next, op := mapEntryChange(set, "after-restart.example", "be-a")
	res := e.c.apply(e.c.manifestFrom(read, "plan-2", next, op), next)
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != "plan-2" || res.RunningPlanID != "plan-2" || res.WorkerOpsPlanID != "plan-2" {
		t.Fatalf("the first push after the restart: %+v", res)
	}
	if !res.HAProxy.SameWorker(e.fake.Worker()) {
		t.Errorf("the answer names worker %+v, %+v answers", res.HAProxy, e.fake.Worker())
	}
	workerHoldsMapOf(t, e.fake, next)
	st := e.c.state("?plan=0")
	m := e.c.manifestFrom(st, "plan-2", next)
	if sent := partsNeeded(st, m); len(sent) != 0 {
		t.Errorf("the same render again needs parts %v", sent)
	}
	omit := map[string]bool{}
	for p := range next {
		omit[p] = true
	}
	code, body := e.c.post(applyRequest{manifest: m, files: next, omit: omit})
	if again := applyResultOf(t, code, body); !again.OK || again.Mode != ResultNoop {
		t.Errorf("the same render again: %+v", again)
	}
}

// ---------------------------------------------------------------------------
// Fencing.

// TestAManifestNamingNoPreviousPlanIsFencedByAnAgentThatHasOne: whatever
// token, proof and mode a manifest without a previous plan carries, an
// agent with an applied plan refuses it.
func TestAManifestNamingNoPreviousPlanIsFencedByAnAgentThatHasOne(t *testing.T) {
	p1 := planRef{"plan-1", "a:1"}
	held := agentState{Applied: p1, Running: p1, WorkerOps: p1, LKG: p1, Token: Token{LeaderEpoch: 1, RenderSeq: 4}}
	for _, tc := range []struct {
		name   string
		mutate func(*Manifest)
	}{
		{"the agent's own token", func(m *Manifest) {}},
		{"no token", func(m *Manifest) { m.ExpectedPrevToken = Token{} }},
		{"a later token", func(m *Manifest) { m.ExpectedPrevToken.RenderSeq = 9 }},
		{"a later epoch", func(m *Manifest) { m.Token.LeaderEpoch, m.ExpectedPrevToken.LeaderEpoch = 2, 2 }},
		{"no proof either", func(m *Manifest) { m.ExpectedPrevPlanProof = "" }},
		{"auto", func(m *Manifest) { m.Mode = ModeAuto }},
		{"a legacy manifest", func(m *Manifest) { m.IdentityVersion, m.ExpectedPrevPlanProof = 0, "" }},
	} {
		m := &Manifest{IdentityVersion: ExactIdentityVersion, PlanID: "plan-2", Mode: ModeReload,
			Token: Token{LeaderEpoch: 1, RenderSeq: 5}, ExpectedPrevPlanProof: p1.Proof, ExpectedPrevToken: held.Token,
			ExpectedWorkerOpsPlanID: p1.ID, ExpectedWorkerOpsPlanProof: p1.Proof}
		tc.mutate(m)
		if got := fenceReason(m, &held, false); got != ReasonPrevMismatch {
			t.Errorf("%s: fenceReason = %q, want %q", tc.name, got, ReasonPrevMismatch)
		}
	}
}

// TestARevertMayNameTheWorkerOpsPlan: the plan being refused is the applied
// plan or the one the worker holds through in-place ops; a revert naming
// either passes the fence, one naming the running plan or neither does not.
func TestARevertMayNameTheWorkerOpsPlan(t *testing.T) {
	p0, p1, p2w := planRef{"plan-0", "a:1"}, planRef{"plan-1", "a:2"}, planRef{"plan-1w", "a:3"}
	s := agentState{Applied: p1, Running: p0, WorkerOps: p2w, LKG: p0, Token: Token{LeaderEpoch: 1, RenderSeq: 2}}
	for _, tc := range []struct {
		name string
		ref  planRef
		want string
	}{
		{"the applied plan", p1, ""},
		{"the worker-ops plan", p2w, ""},
		{"the running plan", p0, ReasonRevertTargetMismatch},
		{"another plan", planRef{"plan-9", "a:9"}, ReasonRevertTargetMismatch},
		{"the worker-ops plan under another proof", planRef{p2w.ID, "a:9"}, ReasonRevertTargetMismatch},
	} {
		m := &Manifest{IdentityVersion: ExactIdentityVersion, Mode: ModeRevertLKG, PlanID: tc.ref.ID, PlanProof: tc.ref.Proof,
			Token: Token{LeaderEpoch: 1, RenderSeq: 3}}
		if got := fenceReason(m, &s, false); got != tc.want {
			t.Errorf("a revert naming %s: fenceReason = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// ---------------------------------------------------------------------------
// Recovery at start.

// TestAFailedRecoveryReloadAtStartVouchesForNothing: a start that owes a
// reload (an apply's ops may be in the worker with no record closing it)
// and whose reload HAProxy refuses reports no running or worker-ops plan:
// the worker that serves on may hold those ops.
func TestAFailedRecoveryReloadAtStartVouchesForNothing(t *testing.T) {
	fake, cfg, _, _ := landedThenStopped(t)
	editState(t, cfg.BaseDir, func(s *agentState, _ map[string]FileAt) { s.ReloadOwed = true })
	fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	reloads := fakeReloads(fake)
	a, _ := launchTestAgent(t, cfg, true)
	if fakeReloads(fake) != reloads+1 {
		t.Fatalf("%d reloads at the start, want 1", fakeReloads(fake)-reloads)
	}
	st := newAgentClient(t, a).state("?plan=0")
	if st.RunningPlanID != "" || st.RunningPlanProof != "" || st.WorkerOpsPlanID != "" || st.WorkerOpsPlanProof != "" {
		t.Errorf("a refused recovery reload vouches for the worker: running %s/%s worker ops %s/%s",
			st.RunningPlanID, st.RunningPlanProof, st.WorkerOpsPlanID, st.WorkerOpsPlanProof)
	}
}

// TestRecoveryKeepsAPathDeletedThenCreatedAgain: one apply deletes a path,
// a later one creates it again, and the agent is killed. Recovery puts a
// path back only as the replayed tree says, so the later file stays.
func TestRecoveryKeepsAPathDeletedThenCreatedAgain(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	with := set.clone()
	with["notes/a.txt"] = "first\n"
	applyFileOnly(t, e.c, "plan-2", with)
	applyFileOnly(t, e.c, "plan-3", set)
	again := set.clone()
	again["notes/a.txt"] = "again\n"
	applyFileOnly(t, e.c, "plan-4", again)
	before := e.c.state("?plan=0")
	reloads := fakeReloads(e.fake)
	e.killAndRestart(t)
	if got := e.disk(t); !sameSet(got, again) {
		t.Errorf("recovery changed the tree: %v", got)
	}
	if fakeReloads(e.fake) != reloads {
		t.Error("the start reloaded HAProxy")
	}
	samePairs(t, "after the restart", e.c.state("?plan=0"), before)
}

// TestACrashAfterANACKNeitherRollsBackAgainNorReloads: a refused reload
// was undone and its end record written, one more change was ACKed, and
// the agent is killed. The start finds every apply closed: it reloads
// nothing, and the tree and the pairs are what the last ACK left.
func TestACrashAfterANACKNeitherRollsBackAgainNorReloads(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	set, _ = ackEntries(t, e.c, set, "ack", 2)
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	bad := set.clone()
	bad[ConfigFilePath] += "bogus\n"
	bad["maps/host.map"] += "refused.example be-a\n"
	if res := e.c.apply(reloadManifest(e, "plan-bad", bad), bad); res.OK || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("the refused reload: %+v", res)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	set, _ = ackEntries(t, e.c, set, "later", 1)
	before := e.c.state("?plan=0")
	reloads, worker := fakeReloads(e.fake), e.fake.Worker()
	e.killAndRestart(t)
	if fakeReloads(e.fake) != reloads || e.fake.Worker() != worker {
		t.Errorf("the start reloaded HAProxy: %d reloads, then %d", reloads, fakeReloads(e.fake))
	}
	if got := e.disk(t); !sameSet(got, set) {
		t.Errorf("the tree is not the last ACKed set; map:\n%s", got["maps/host.map"])
	}
	samePairs(t, "after the restart", e.c.state("?plan=0"), before)
	workerHoldsMapOf(t, e.fake, set)
}

// ---------------------------------------------------------------------------
// Durability of the journal.

// ---------------------------------------------------------------------------
// The read-back.

// TestSameMapKeys: a running map matches its file only with the same keys
// and the same number of entries; a key the worker holds that the file
// lacks is a divergence as much as a missing one.
func TestSameMapKeys(t *testing.T) {
	entries := func(keys ...string) []MapEntry {
		var out []MapEntry
		for _, k := range keys {
			out = append(out, MapEntry{Key: k, Value: "v"})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		running map[string][]string
		desired []MapEntry
		want    bool
	}{
		{"the same keys", map[string][]string{"a": {"v"}, "b": {"v"}}, entries("a", "b"), true},
		{"a key twice in both", map[string][]string{"a": {"v", "w"}}, entries("a", "a"), true},
		{"a missing key", map[string][]string{"a": {"v"}}, entries("a", "b"), false},
		{"an extra key", map[string][]string{"a": {"v"}, "b": {"v"}}, entries("a"), false},
		{"an extra key where the file holds a key twice", map[string][]string{"a": {"v"}, "b": {"v"}}, entries("a", "a"), false},
		{"a key twice in the worker only", map[string][]string{"a": {"v", "w"}}, entries("a"), false},
		{"an empty file", map[string][]string{"a": {"v"}}, nil, false},
	} {
		if got := sameMapKeys(tc.running, tc.desired); got != tc.want {
			t.Errorf("%s: sameMapKeys = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAFullDiskAtCompactionKeepsEveryACK: the disk fills just as the log
// is due for compaction. The apply that finds the log full is answered and
// kept; the compaction after it cannot write its snapshot (ENOSPC) and
// changes nothing: the tree, the pairs and the log keep every ACKed change,
// and the start after a kill -9 replays them all. Meanwhile the agent is
// not ready and refuses pushes with a 507, since its log grows toward what
// a start reads.
func TestAFullDiskAtCompactionKeepsEveryACK(t *testing.T) {
	d, e, set := ackedOnHookDisk(t)
	awaitReadBacks(e.a) // they take the apply lock, and would compact first
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogRecords
	e.a.deps.led.mu.Unlock()
	var refused atomic.Int32
	d.setHook(func(op diskOp) error {
		if strings.Contains(op.Path, ".haptic-agent-state-") {
			refused.Add(1)
			return &fs.PathError{Op: op.Op, Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	next, op := mapEntryChange(set, "full.example", "be-a")
	res := e.c.apply(e.c.manifest("plan-full", next, op), next)
	if !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the apply that finds the log full: %+v", res)
	}
	waitFor(t, "the compaction's attempt", func() bool { return refused.Load() > 0 })
	e.a.deps.applyMu.Lock() // the compaction holds it until it gave up
	e.a.deps.applyMu.Unlock()
	if code, body := getText(t, e.a, PathReadyz); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, msgLogStuck+": ") {
		t.Errorf("readyz while the compaction fails: %d %q", code, body)
	}
	refusedNext, op2 := mapEntryChange(next, "refused.example", "be-a")
	if code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-refused", refusedNext, op2), files: refusedNext}); code != http.StatusInsufficientStorage || !strings.Contains(string(body), msgLogStuck) {
		t.Errorf("a push while the compaction fails: %d %s", code, body)
	}
	d.setHook(nil)
	if !sameSet(e.disk(t), next) {
		t.Errorf("the tree after the failed compaction is not the ACKed set; map:\n%s", e.disk(t)["maps/host.map"])
	}
	workerHoldsMapOf(t, e.fake, next)
	st := e.c.state("?plan=0")
	if st.AppliedPlanID != res.AppliedPlanID || st.AppliedPlanProof != res.AppliedPlanProof {
		t.Fatalf("after the failed compaction the agent holds %s/%s, want the ACKed %s/%s",
			st.AppliedPlanID, st.AppliedPlanProof, res.AppliedPlanID, res.AppliedPlanProof)
	}

	e.killAndRestart(t)
	if st := e.c.state("?plan=0"); st.AppliedPlanID != res.AppliedPlanID || st.AppliedPlanProof != res.AppliedPlanProof {
		t.Errorf("after a restart the agent holds %s/%s, want the ACKed %s/%s", st.AppliedPlanID, st.AppliedPlanProof,
			res.AppliedPlanID, res.AppliedPlanProof)
	}
	if !sameSet(e.disk(t), next) {
		t.Error("the restart took an ACKed change back")
	}
	if again, op2 := mapEntryChange(next, "after.example", "be-a"); e.c.apply(e.c.manifest("plan-after", again, op2), again).Mode != ResultRuntime {
		t.Error("the next one-entry change after the restart is not a runtime apply")
	}
}

// TestAStuckCompactionLogsWhenItStartsAndWhenItEnds: a compaction that
// cannot write its snapshot fails, retried every second and by every push
// it refuses, nine times, then works: the agent logs the first failure and
// one line with the count once it works again, never a line per failure
// (9,900 lines in 100 s, once).
func TestAStuckCompactionLogsWhenItStartsAndWhenItEnds(t *testing.T) {
	const failures = 9 // more than the pushes meet: the retry loop meets the rest
	logs := &lockedBuffer{}
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, func(c *AgentConfig) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	set := seedFiles()
	e.land(t, "plan-1", set)
	awaitReadBacks(e.a)
	var writes atomic.Int32
	d.setHook(func(op diskOp) error {
		if op.Op == "write" && strings.Contains(op.Path, ".haptic-agent-state-") && writes.Add(1) <= failures {
			return &fs.PathError{Op: op.Op, Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogRecords
	e.a.deps.led.mu.Unlock()
	refused := 0
	for i := range 3 {
		next, op := mapEntryChange(set, fmt.Sprintf("stuck%d.example", i), "be-a")
		if code, _ := e.c.post(applyRequest{manifest: e.c.manifest(fmt.Sprintf("plan-stuck-%d", i), next, op), files: next}); code == http.StatusInsufficientStorage {
			refused++
		} else if code == http.StatusOK {
			set = next
		}
	}
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if refused == 0 || writes.Load() <= failures {
		t.Fatalf("%d pushes refused and %d snapshot writes: the compaction was never stuck, or never worked", refused, writes.Load())
	}
	out := logs.String()
	started := strings.Count(out, `"msg":"could not compact the agent's state; retrying, logged again once it works"`)
	ended := strings.Count(out, fmt.Sprintf(`"msg":"the agent's state compacts again","failed_compactions":%d,"failing_for":`, failures))
	errorLines := strings.Count(out, `"level":"ERROR"`) + strings.Count(out, `"level":"WARN"`)
	if started != 1 || ended != 1 || errorLines != 1 {
		t.Errorf("%d failures (%d pushes refused) logged %d start and %d end lines, %d at WARN or above; want 1, 1 and 1:\n%s",
			failures, refused, started, ended, errorLines, out)
	}
}

// TestAFailedInstallKeepsTheACKAndSaysSo: a runtime apply counts once its
// record is synced and its op acknowledged, and its files are installed
// before the answer. When that install fails (an I/O error), the ACK
// stands and says its files are owed: the agent is not ready and says why
// (/readyz, the disk_behind gauge, its log), refuses applies meanwhile,
// retries every second from what its record keeps, and is ready again
// with the answered files in place once the disk lets it.
func TestAFailedInstallKeepsTheACKAndSaysSo(t *testing.T) {
	d := &hookDisk{}
	logs := newLogCounter(testLogger().Handler())
	e := newTestEnvWithDisk(t, d, func(c *AgentConfig) { c.MetricsListen, c.Logger = "127.0.0.1:0", slog.New(logs) })
	set := seedFiles()
	e.land(t, "plan-1", set)
	var failing atomic.Bool
	failing.Store(true)
	d.setHook(func(op diskOp) error {
		if failing.Load() && op.Op == "exchange" && strings.HasSuffix(op.Path, "/maps/host.map") {
			return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	next, op := mapEntryChange(set, "kept.example", "be-a")
	res := e.c.apply(e.c.manifest("plan-2", next, op), next)
	if !res.OK || res.Mode != ResultRuntime || res.AppliedPlanID != "plan-2" {
		t.Fatalf("the apply: %s", jsonOf(res))
	}
	if res.Error == nil || res.Error.Stage != StageWrite || !strings.HasPrefix(res.Error.Message, msgFilesOwed+": ") {
		t.Errorf("the answer does not say the files are owed: %s", jsonOf(res.Error))
	}
	if !hasMapKey(e.fake, "maps/host.map", "kept.example") {
		t.Error("the op did not reach the worker")
	}
	if code, body := getText(t, e.a, PathReadyz); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, msgDiskBehind+": ") {
		t.Errorf("readyz while the install fails: %d %q", code, body)
	}
	if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_disk_behind 1\n") {
		t.Error("the gauge does not say the disk is behind")
	}
	if logs.count("the files of an acknowledged apply could not be installed; the agent retries, and is not ready until they are in place") != 1 {
		t.Error("the agent did not log the failed install")
	}
	if st := e.c.state("?plan=0"); st.AppliedPlanID != "plan-2" || st.AppliedPlanProof != res.AppliedPlanProof {
		t.Errorf("the ACK was taken back: applied %q %s", st.AppliedPlanID, st.AppliedPlanProof)
	}
	third, op3 := mapEntryChange(next, "third.example", "be-a")
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-3", third, op3), files: third})
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), msgDiskBehind) {
		t.Errorf("an apply while the disk is behind: %d %s", code, body)
	}
	failing.Store(false)
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if got := e.disk(t); !sameSet(got, next) {
		t.Errorf("the answered files once the disk lets them in:\n%s", describeSetDiff(got, next))
	}
	if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_disk_behind 0\n") {
		t.Error("the gauge still says the disk is behind")
	}
	if res := e.c.apply(e.c.manifest("plan-3", third, op3), third); !res.OK || res.Mode != ResultRuntime {
		t.Errorf("the next apply: %s", jsonOf(res))
	}
}

// TestAWorkerStartedFromStaleFilesIsReloadedOnceTheyAreInPlace: an
// install is owed (the rename fails), and HAProxy restarts meanwhile: its
// new worker loads the tree as the disk holds it, without the ACKed
// entry. Once the files are in place, the agent reloads that worker, so
// that the ACKed entry is served again.
func TestAWorkerStartedFromStaleFilesIsReloadedOnceTheyAreInPlace(t *testing.T) {
	e, _, heal := ackWithAFailedInstall(t, seedFiles())
	e.fake.With(func(m *FakeModel) { // HAProxy restarts on the tree as it is
		m.Pid, m.StartTimeUnixMicros = m.Pid+100, time.Now().UnixMicro()
		m.OnReload(m)
	})
	if hasMapKey(e.fake, "maps/host.map", "owed.example") {
		t.Fatal("the restarted worker holds the owed entry: the test did not restart it on the stale tree")
	}
	heal()
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if !hasMapKey(e.fake, "maps/host.map", "owed.example") {
		t.Error("the files are in place and the agent is ready, but the worker HAProxy started meanwhile does not serve the ACKed entry")
	}
	if st := e.c.state("?plan=0"); st.RunningPlanID != "plan-2" {
		t.Errorf("after the reload the running plan is %q, want plan-2", st.RunningPlanID)
	}
}
