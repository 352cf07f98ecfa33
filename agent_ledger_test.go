// Tests of the ledger: what an apply syncs, the log's framing and replay,
// the decisions (settle, the worker found at a start) as tables, what
// survives a restart, and the recovery at startup (a corrupt state file, an
// apply interrupted after or before its writes, a reload left scheduled).
// The power-loss simulation is in powerloss_test.go.

package haptic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncCounter counts the syncs a hookDisk sees, by kind.
type syncCounter struct {
	mu               sync.Mutex
	logSyncs, others int
	dirSyncs         int
	ops              []diskOp
}

func (c *syncCounter) hook(logPath string) func(diskOp) error {
	return func(op diskOp) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch op.Op {
		case "sync":
			if op.Path == logPath {
				c.logSyncs++
			} else {
				c.others++
			}
			c.ops = append(c.ops, op)
		case "syncdir":
			c.dirSyncs++
			c.ops = append(c.ops, op)
		}
		return nil
	}
}

func (c *syncCounter) reset() (log, dirs, others int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	log, dirs, others = c.logSyncs, c.dirSyncs, c.others
	c.logSyncs, c.dirSyncs, c.others, c.ops = 0, 0, 0, nil
	return
}

// hasMapKey reports whether the fake worker's map at path holds key.
func hasMapKey(fake *FakeHAProxy, path, key string) bool {
	return slices.ContainsFunc(fake.MapEntries(path), func(e MapEntry) bool { return e.Key == key })
}

// TestRuntimeOpsRunWhileTheIntentSyncs pins the overlap of the hot path:
// the intent's sync waits, through the disk hook, until the worker holds
// the apply's map entry, so the apply lands only when its ops are sent
// while the intent syncs. Run in order, the sync would wait for ops that
// never come, fail after its deadline, and abort the apply.
func TestRuntimeOpsRunWhileTheIntentSyncs(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)

	next := fs.clone()
	next["maps/host.map"] += "overlap.example be-b\n"
	var armed sync.Once
	var sawOps bool
	d.setHook(func(op diskOp) error {
		if op.Op != "sync" || op.Path != logPath {
			return nil
		}
		var err error
		armed.Do(func() { // the first log sync of the apply is its intent's
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if hasMapKey(e.fake, "maps/host.map", "overlap.example") {
					sawOps = true
					return
				}
			}
			err = errors.New("the ops never reached the worker while the intent synced")
		})
		return err
	})
	res := e.c.apply(e.c.manifest("plan-2", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "overlap.example", Value: "be-b"}), next)
	d.setHook(nil)
	if !res.OK || res.Mode != ResultRuntime || !sawOps {
		t.Fatalf("apply: %+v (ops seen during the intent's sync: %v)", res, sawOps)
	}
	if got := e.disk(t)["maps/host.map"]; got != next["maps/host.map"] {
		t.Fatalf("disk map %q, want %q", got, next["maps/host.map"])
	}
}

// TestAFailedIntentSyncAfterTheOpsRestoresAndReloads: when the intent's
// sync fails after the ops reached the worker, the apply is aborted, the
// last-known-good set is restored, and the worker reloads it, so the entry
// the ops added is gone from it too. A large map (past the size carried in
// the log) is replaced by the same apply, compiled from its staged part.
func TestAFailedIntentSyncAfterTheOpsRestoresAndReloads(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	fs := seedFiles()
	var big strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&big, "host-%05d.example.com be-a\n", i)
	}
	fs["maps/big.map"] = big.String()
	e.land(t, "plan-1", fs)
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)

	// First the replace alone lands: its ops were compiled from the staged
	// part, not from the file still live when they ran.
	replaced := fs.clone()
	replaced["maps/big.map"] = strings.ReplaceAll(big.String(), "be-a", "be-b")
	res := e.land(t, "plan-2", replaced, Op{Kind: OpMapReplace, Path: "maps/big.map"})
	if res.Mode != ResultRuntime {
		t.Fatalf("replace: %+v", res)
	}
	e.a.reads.wg.Wait()
	if got := e.fake.MapEntries("maps/big.map"); len(got) != 4000 || got[0].Value != "be-b" || got[3999].Value != "be-b" {
		t.Fatalf("worker map after the replace: %d entries, first %+v", len(got), got[:min(1, len(got))])
	}

	next := replaced.clone()
	next["maps/host.map"] += "lost.example be-b\n"
	d.setHook(failFirstSync(logPath))
	reloadsBefore := fakeReloads(e.fake)
	res = e.c.apply(e.c.manifest("plan-3", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "lost.example", Value: "be-b"}), next)
	d.setHook(nil)
	if res.OK || res.Error == nil || res.Error.Stage != StageBackup || res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
		t.Fatalf("apply: %+v", res)
	}
	if !sameSet(e.disk(t), fs) {
		t.Fatalf("the tree is not the last-known-good set")
	}
	if hasMapKey(e.fake, "maps/host.map", "lost.example") || fakeReloads(e.fake) != reloadsBefore+1 {
		t.Fatalf("the worker keeps the aborted entry (reloads %d, before %d)", fakeReloads(e.fake), reloadsBefore)
	}
	// The log works again: the next push, a reload since the abort left no
	// applied plan to diff against, lands.
	if res := e.c.apply(reloadManifest(e, "plan-4", next), next); !res.OK || res.Mode != ResultReload {
		t.Fatalf("the apply after the abort: %+v", res)
	}
}

// TestAFailedIntentSyncIsTheApplysWhoeverWaitsFirst: while the ops run, a
// second writer of the ledger (an invalidation, or the adoption of the
// worker the ops found instead of the expected one) may wait for the
// intent's sync before the apply does. When that sync fails, the apply
// still learns it: it never renames a file behind an intent that may not
// be on disk.
func TestAFailedIntentSyncIsTheApplysWhoeverWaitsFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(e *testEnv)
	}{
		{"an invalidation writes first", func(e *testEnv) { holdOn(e.fake, "add map", e.a.led.invalidate) }},
		{"the ops adopt another worker", func(e *testEnv) { newWorker(e.fake, false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &hookDisk{}
			e := newTestEnvWithDisk(t, d, nil)
			fs := seedFiles()
			e.land(t, "plan-1", fs)
			logPath := filepath.Join(e.cfg.BaseDir, logFileName)
			d.setHook(failFirstSync(logPath))
			tc.setup(e)
			next := fs.clone()
			next["maps/host.map"] += "x.example be-b\n"
			res := e.c.apply(e.c.manifest("plan-2", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "x.example", Value: "be-b"}), next)
			d.setHook(nil)
			if res.OK || res.Error == nil || res.Error.Stage != StageBackup || !strings.Contains(res.Error.Message, "injected") {
				t.Fatalf("the failed intent sync went unreported: %+v %+v", res, res.Error)
			}
			if !sameSet(e.disk(t), fs) {
				t.Fatal("files were renamed behind an intent that is not durable")
			}
		})
	}
}

// TestTheNewSetIsSyncedWhileHAProxyReloadsIt: the syncs that make a
// reloaded set the next last-known-good run while HAProxy loads it, not
// after its answer. The fake's reload takes long enough that a sync made
// after the reload sees the new worker; each sync of the changed config
// must see the old one.
func TestTheNewSetIsSyncedWhileHAProxyReloadsIt(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	old := e.fake.Worker()
	e.fake.With(func(m *FakeModel) { m.ReloadTakes = 300 * time.Millisecond })
	config := filepath.Join(e.cfg.BaseDir, "haproxy.cfg")
	var mu sync.Mutex
	var syncs, late int
	d.setHook(func(op diskOp) error {
		if op.Op == "sync" && op.Path == config {
			mu.Lock()
			defer mu.Unlock()
			syncs++
			if !e.fake.Worker().SameWorker(old) {
				late++
			}
		}
		return nil
	})
	next := fs.clone()
	next["haproxy.cfg"] += "# 2\n"
	res := e.c.apply(reloadManifest(e, "plan-2", next), next)
	d.setHook(nil)
	if !res.OK || res.Mode != ResultReload {
		t.Fatalf("%+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if syncs == 0 || late > 0 {
		t.Fatalf("%d syncs of the new config, %d of them after the new worker came", syncs, late)
	}
}

// failFirstSync is a disk hook that fails the first sync of path, the
// log's next record being an apply's intent.
func failFirstSync(path string) func(diskOp) error {
	var fail sync.Once
	return func(op diskOp) error {
		var err error
		if op.Op == "sync" && op.Path == path {
			fail.Do(func() { err = errors.New("injected: the intent's sync failed") })
		}
		return err
	}
}

// fakeReloads is the fake master's reload count.
func fakeReloads(f *FakeHAProxy) int {
	var n int
	f.With(func(m *FakeModel) { n = m.Reloads })
	return n
}

// TestAnApplySyncsOnlyAtItsDurablePoints counts the syncs of each kind of
// apply through the file layer. A one-entry runtime apply makes at most two
// log syncs and two directory syncs (the intent before its first rename,
// the commit before its answer, and the backup directory the first time the
// map is journalled since the last reload); nothing else on its path syncs.
func TestAnApplySyncsOnlyAtItsDurablePoints(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	var c syncCounter
	d.setHook(c.hook(filepath.Join(e.cfg.BaseDir, logFileName)))
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	c.reset()

	type step struct {
		name           string
		mode           string
		maxLog, maxDir int
	}
	mapEntry := func(i int) (fileSet, Op) {
		next := fs.clone()
		key := "k" + string(rune('a'+i)) + ".example"
		next["maps/host.map"] += key + " be-k\n"
		fs = next
		return next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: key, Value: "be-k"}
	}
	for i, s := range []step{
		{"runtime, the map journalled for the first time", ResultRuntime, 2, 2},
		{"runtime, the map already journalled", ResultRuntime, 2, 2},
		{"runtime, again", ResultRuntime, 2, 2},
	} {
		next, op := mapEntry(i)
		res := e.land(t, "plan-r"+string(rune('0'+i)), next, op)
		e.a.reads.wg.Wait()
		log, dirs, others := c.reset()
		t.Logf("%s: %d log syncs, %d directory syncs, %d other syncs", s.name, log, dirs, others)
		if res.Mode != s.mode || log > s.maxLog || dirs > s.maxDir || others != 0 {
			t.Errorf("%s: mode %s, %d log syncs, %d directory syncs, %d other syncs; want at most %d and %d and no other",
				s.name, res.Mode, log, dirs, others, s.maxLog, s.maxDir)
		}
	}

	// A noop: nothing sent, nothing written, one synced commit for its new
	// generation.
	all := map[string]bool{}
	for p := range fs {
		all[p] = true
	}
	var res ApplyResult
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-noop", fs), files: fs, omit: all})
	if code != 200 || json.Unmarshal(body, &res) != nil {
		t.Fatalf("noop: %d %s", code, body)
	}
	log, dirs, others := c.reset()
	t.Logf("noop: %d log syncs, %d directory syncs, %d other syncs", log, dirs, others)
	if res.Mode != ResultNoop || log != 1 || dirs != 0 || others != 0 {
		t.Errorf("noop: mode %s, %d log syncs, %d directory syncs, %d other", res.Mode, log, dirs, others)
	}

	// A file_only and a reload apply, for the record.
	next := fs.clone()
	next["notes/readme.txt"] = "file only\n"
	applyFileOnly(t, e.c, "plan-fo", next)
	log, dirs, others = c.reset()
	t.Logf("file_only: %d log syncs, %d directory syncs, %d other syncs", log, dirs, others)
	next = next.clone()
	next["haproxy.cfg"] += "# reload\n"
	e.c.apply(reloadManifest(e, "plan-rl", next), next)
	log, dirs, others = c.reset()
	// A reload makes its plan the last-known-good: its files are synced
	// then, so that the next apply may link them into the journal at once.
	t.Logf("reload: %d log syncs, %d directory syncs, %d file syncs", log, dirs, others)
	if log > 2 {
		t.Errorf("reload: %d log syncs", log)
	}
}

func TestLogRecordsAreFramedAndATornTailIsCut(t *testing.T) {
	var b bytes.Buffer
	for i := range 3 {
		rec, err := encodeRecord(&logRecord{Seq: uint64(i + 1), Kind: recordState,
			Set: map[string]json.RawMessage{"generation": json.RawMessage(`7`)}})
		if err != nil {
			t.Fatal(err)
		}
		b.Write(rec)
	}
	whole := b.Bytes()
	recs, good := decodeRecords(whole)
	if len(recs) != 3 || good != len(whole) {
		t.Fatalf("decoded %d records, %d of %d bytes", len(recs), good, len(whole))
	}
	for cut := 1; cut < len(whole); cut++ {
		recs, good := decodeRecords(whole[:cut])
		if good > cut || len(recs) > 3 {
			t.Fatalf("cut at %d: %d records, good %d", cut, len(recs), good)
		}
		for i, r := range recs {
			if r.Seq != uint64(i+1) {
				t.Fatalf("cut at %d: record %d has seq %d", cut, i, r.Seq)
			}
		}
	}
	// A flipped byte in the second record's payload ends the log there.
	bad := bytes.Clone(whole)
	first, _ := encodeRecord(&recs[0])
	bad[len(first)+logHeaderBytes+3] ^= 0x20
	recs, good = decodeRecords(bad)
	if len(recs) != 1 || good != len(first) {
		t.Errorf("corrupt second record: %d records, good %d", len(recs), good)
	}
}

// TestChangedFieldsRoundTrip: a record carries exactly the fields that
// changed, and replaying it onto the old state gives the new one, zero
// values included.
func TestChangedFieldsRoundTrip(t *testing.T) {
	prev := agentState{Generation: 3, AppliedPlanID: "p", AppliedPlanProof: "a:3", ManifestPaths: []string{"a", "b"},
		Journal:         backupJournal{Entries: []journalEntry{{Path: "a", Kind: journalModified, Backup: "/x"}}},
		ReloadPendingAt: time.Unix(100, 0).UTC()}
	next := cloneState(prev)
	next.Generation = 4
	next.AppliedPlanProof = ""
	next.Journal = backupJournal{}
	next.ReloadPendingAt = time.Time{}
	next.LastApply = &ApplyResult{PlanID: "p", OK: true}
	set, err := changedFields(&prev, &next)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for k := range set {
		names = append(names, k)
	}
	want := "applied_plan_proof generation journal last_apply reload_pending_at"
	if got := strings.Join(sortedStrings(names), " "); got != want {
		t.Errorf("changed fields %q, want %q", got, want)
	}
	replayed := cloneState(prev)
	if err := applyFields(&replayed, set); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(replayed, next) {
		t.Errorf("replayed\n%+v\nwant\n%+v", replayed, next)
	}
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestSettle is the table of how a run's end changes the state.
func TestSettle(t *testing.T) {
	base := agentState{Generation: 5, AppliedPlanID: "p1", AppliedPlanProof: "a:1",
		RunningPlanID: "p1", RunningPlanProof: "a:1", WorkerOpsPlanID: "p1", WorkerOpsPlanProof: "a:1",
		LKGPlanID: "p1", LKGPlanProof: "a:1", AppliedToken: Token{1, 4}, TreeDigest: "t1"}
	before := base
	ok := ApplyResult{OK: true}
	nack := ApplyResult{OK: false}
	tests := []struct {
		name          string
		st            agentState
		o             outcome
		invalidations uint64
		check         func(s agentState) string
	}{
		{"an OK apply records its pair, token and tree", base,
			outcome{result: ok, ok: true, ref: planRef{"p2", "a:2"}, token: Token{1, 5}, landsTree: true, paths: []string{"x"}, tree: "t2"}, 0,
			func(s agentState) string {
				if s.Generation != 6 || s.applied() != (planRef{"p2", "a:2"}) || s.workerOps() != (planRef{"p2", "a:2"}) ||
					s.AppliedToken != (Token{1, 5}) || s.TreeDigest != "t2" || s.running() != (planRef{"p1", "a:1"}) {
					return "wrong"
				}
				return ""
			}},
		{"an overtaken apply records its tree but not its pair", base,
			outcome{result: ok, ok: true, ref: planRef{"p2", "a:2"}, token: Token{1, 5}, landsTree: true, tree: "t2", invalidations0: 0}, 1,
			func(s agentState) string {
				if s.Generation != 6 || s.AppliedPlanID != "" || s.AppliedToken != (Token{1, 4}) || s.TreeDigest != "t2" {
					return "wrong"
				}
				return ""
			}},
		{"a pending reload keeps the worker baseline", func() agentState {
			s := base
			s.ReloadPendingAt = time.Unix(1, 0)
			return s
		}(),
			outcome{result: ok, ok: true, ref: planRef{"p2", "a:2"}, token: Token{1, 5}}, 0,
			func(s agentState) string {
				if s.applied() != (planRef{"p2", "a:2"}) || s.workerOps() != (planRef{"p1", "a:1"}) {
					return "wrong"
				}
				return ""
			}},
		{"a revert records the LKG pair", base,
			outcome{result: ok, ok: true, revert: true, token: Token{1, 5}}, 0,
			func(s agentState) string {
				if s.applied() != (planRef{"p1", "a:1"}) || s.Generation != 6 {
					return "wrong"
				}
				return ""
			}},
		{"a failed apply clears the applied pair and keeps the token", base,
			outcome{result: nack}, 0,
			func(s agentState) string {
				if s.AppliedPlanID != "" || s.AppliedToken != (Token{1, 4}) || s.Generation != 5 || s.running() != (planRef{"p1", "a:1"}) {
					return "wrong"
				}
				return ""
			}},
		{"a refused reload that put the tree back restores the baseline", func() agentState {
			s := base
			s.setApplied(planRef{})
			s.setWorkerOps(planRef{})
			return s
		}(),
			outcome{result: nack, refused: true, restoredTree: true, before: before}, 0,
			func(s agentState) string {
				if s.applied() != (planRef{"p1", "a:1"}) || s.workerOps() != (planRef{"p1", "a:1"}) || s.Generation != 5 {
					return "wrong"
				}
				return ""
			}},
		{"a refused reload over another tree forgets", base,
			outcome{result: nack, refused: true, restoredTree: false, before: before}, 0,
			func(s agentState) string {
				if s.AppliedPlanID != "" {
					return "wrong"
				}
				return ""
			}},
		{"a scheduled reload never moves the generation", base,
			outcome{result: ok, ok: true, scheduled: true}, 0,
			func(s agentState) string {
				if s.Generation != 5 || s.applied() != (planRef{"p1", "a:1"}) {
					return "wrong"
				}
				return ""
			}},
		{"a failed scheduled reload clears the applied pair", base,
			outcome{result: nack, scheduled: true}, 0,
			func(s agentState) string {
				if s.Generation != 5 || s.AppliedPlanID != "" {
					return "wrong"
				}
				return ""
			}},
		{"a re-landed plan re-binds its stored blob", func() agentState {
			s := base
			s.PlanBlobPlanID, s.PlanBlobPlanProof = "p1", "a:1"
			return s
		}(),
			outcome{result: ok, ok: true, ref: planRef{"p1", "a:7"}, token: Token{1, 5}}, 0,
			func(s agentState) string {
				if s.PlanBlobPlanID != "p1" || s.PlanBlobPlanProof != "a:7" {
					return "wrong"
				}
				return ""
			}},
	}
	for _, tc := range tests {
		got := settle(tc.st, tc.o, tc.invalidations)
		if msg := tc.check(got); msg != "" {
			t.Errorf("%s: %+v", tc.name, got)
		}
		if got.LastApply == nil {
			t.Errorf("%s: no last_apply", tc.name)
		}
	}
}

// TestWorkerAtStart is the table of what a start keeps of the worker
// baseline.
func TestWorkerAtStart(t *testing.T) {
	changed := time.UnixMicro(2_000_000)
	expected := HAProxyInfo{WorkerPID: 10, WorkerStartTimeUnixMicros: 1_000_000}
	base := agentState{AppliedPlanID: "p1", AppliedPlanProof: "a:1", RunningPlanID: "p0", RunningPlanProof: "a:0",
		WorkerOpsPlanID: "p1", WorkerOpsPlanProof: "a:1", ExpectedWorker: expected, TreeChangedAt: changed,
		PendingReloadPlanID: "p1", PendingReloadPlanProof: "a:1", ReloadPendingAt: time.Unix(5, 0)}
	tests := []struct {
		name             string
		st               agentState
		observed         HAProxyInfo
		running, workOps planRef
		pending          bool
	}{
		{"the same worker keeps everything", base, expected, planRef{"p0", "a:0"}, planRef{"p1", "a:1"}, true},
		{"a worker that started after the tree changed loaded it", base,
			HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 3_000_000}, planRef{"p1", "a:1"}, planRef{"p1", "a:1"}, false},
		{"a worker that started before the tree changed runs something else", base,
			HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 1_500_000}, planRef{}, planRef{}, true},
		{"a new worker without a known applied plan runs something unknown", func() agentState {
			s := base
			s.setApplied(planRef{})
			return s
		}(), HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 3_000_000}, planRef{}, planRef{}, true},
		{"an unknown change time vouches for nothing", func() agentState {
			s := base
			s.TreeChangedAt = time.Time{}
			return s
		}(), HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 3_000_000}, planRef{}, planRef{}, true},
	}
	for _, tc := range tests {
		got := workerAtStart(tc.st, tc.observed)
		if got.running() != tc.running || got.workerOps() != tc.workOps || got.reloadPending() != tc.pending ||
			got.ExpectedWorker != tc.observed || got.applied() != tc.st.applied() {
			t.Errorf("%s: running %+v worker ops %+v pending %v", tc.name, got.running(), got.workerOps(), got.reloadPending())
		}
	}
}

// ---------------------------------------------------------------------------
// What survives a restart.

// TestRestartKeepsTheBaselineWhenNothingChanged: after a restart over the
// same tree and worker, a one-entry change is a runtime apply that sends
// one part.
func TestRestartKeepsTheBaselineWhenNothingChanged(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.restart(t)
	st := e.c.state("")
	next := fs.clone()
	next["maps/host.map"] += "r.example be-r\n"
	m := e.c.manifestFrom(st, "plan-2", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "r.example", Value: "be-r"})
	sent := partsNeeded(st, m)
	if len(sent) != 1 || sent[0] != "maps/host.map" {
		t.Fatalf("after the restart the agent holds no proof for %v", sent)
	}
	res := e.c.apply(m, next)
	if !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("%+v", res)
	}
}

// partsNeeded lists the files of m the agent does not hold with the quoted
// proof: the parts a controller must send.
func partsNeeded(st State, m *Manifest) []string {
	var out []string
	for _, f := range m.Files {
		if held, ok := st.Files[f.Path]; !ok || held.Proof == "" || held.Proof != f.Proof || held.Digest != f.Digest {
			out = append(out, f.Path)
		}
	}
	return out
}

// TestRestartWithANewWorkerAdoptsTheTree: HAProxy reloaded while the agent
// was away; the new worker loaded the tree, so it runs the applied plan.
func TestRestartWithANewWorkerAdoptsTheTree(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	before := e.c.state("")
	e.stop()
	// The fake's clock is its own; a real worker started now.
	e.fake.With(func(m *FakeModel) { m.Pid, m.StartTimeUnixMicros = m.Pid+1, time.Now().UnixMicro() })
	e.restartStopped(t)
	st := e.c.state("")
	if st.AppliedPlanID != before.AppliedPlanID || st.RunningPlanID != before.AppliedPlanID ||
		st.WorkerOpsPlanID != before.AppliedPlanID || st.WorkerOpsPlanProof != before.AppliedPlanProof ||
		st.HAProxy.WorkerPID == before.HAProxy.WorkerPID {
		t.Errorf("after a restart over a new worker: %+v", st)
	}
}

// TestRestartAfterTreeDriftForgets: a file changed while the agent was
// away, so the applied plan is unknown, and no file keeps its proof.
func TestRestartAfterTreeDriftForgets(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	e.stop()
	os.WriteFile(filepath.Join(e.cfg.BaseDir, "maps/host.map"), []byte("drifted.example be-x\n"), 0o644)
	e.restartStopped(t)
	st := e.c.state("")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("the baseline survived a drifted tree: %+v", st)
	}
	for p, at := range st.Files {
		if at.Proof != "" {
			t.Errorf("%s kept its proof", p)
		}
	}
}

// TestRefusedReloadKeepsThePreviousBaseline: HAProxy refused a config and
// kept serving the previous one, unchanged; the next push of a good plan
// diffs against it, and a one-entry change is a runtime apply.
func TestRefusedReloadKeepsThePreviousBaseline(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	before := e.c.state("")
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	bad := fs.clone()
	bad["haproxy.cfg"] += "bogus\n"
	res := e.c.apply(reloadManifest(e, "plan-bad", bad), bad)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("%+v", res)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	st := e.c.state("")
	if st.AppliedPlanID != before.AppliedPlanID || st.AppliedPlanProof != before.AppliedPlanProof ||
		st.RunningPlanID != before.RunningPlanID || st.WorkerOpsPlanProof != before.WorkerOpsPlanProof {
		t.Fatalf("the baseline was not restored: %+v", st)
	}
	next := fs.clone()
	next["maps/host.map"] += "g.example be-g\n"
	m := e.c.manifestFrom(st, "plan-good", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "g.example", Value: "be-g"})
	if sent := partsNeeded(st, m); len(sent) != 1 {
		t.Errorf("parts needed %v", sent)
	}
	if res := e.c.apply(m, next); !res.OK || res.Mode != ResultRuntime {
		t.Errorf("the next good push: %+v", res)
	}
}

func TestARestartBetweenAppliesKeepsTheBaseline(t *testing.T) {
	_, cfg, c, first := landedThenStopped(t)
	fs := seedFiles()

	a, _ := launchTestAgent(t, cfg, true)
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
	_, cfg, _, _ := landedThenStopped(t)
	os.WriteFile(filepath.Join(cfg.BaseDir, "haproxy.cfg"), []byte("global\n  # edited by hand\n"), 0o644)

	a, _ := launchTestAgent(t, cfg, true)
	st := newAgentClient(t, a).state("")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("baseline survived an edited tree: %+v", st)
	}
	if st.Files["haproxy.cfg"].Digest != DigestString("global\n  # edited by hand\n") {
		t.Errorf("files: %+v", st.Files)
	}
}

// restartStopped starts a new agent on the directory of a stopped one.
func (e *testEnv) restartStopped(t testing.TB) {
	t.Helper()
	seq := e.c.seq
	e.a, e.stop = launchTestAgent(t, e.cfg, true)
	e.c = newAgentClient(t, e.a)
	e.c.seq = seq
}

// ---------------------------------------------------------------------------
// Startup recovery: the state file, an interrupted apply, a pending reload.

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

func TestAnInterruptedApplyReloadsWhatIsOnDisk(t *testing.T) {
	fake, cfg, _, _ := landedThenStopped(t)
	editState(t, cfg.BaseDir, func(m map[string]any) { m["phase"] = "written"; m["in_flight_plan_id"] = "plan-2" })
	pid := fake.Worker().WorkerPID

	a, _ := launchTestAgent(t, cfg, true)
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
