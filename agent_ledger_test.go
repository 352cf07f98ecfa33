// Tests of the ledger: what an apply syncs, the log's framing and replay,
// the decisions (stateAfter, the worker found at a start) as tables, what
// survives a restart, and the recovery at startup (a corrupt state file, an
// apply interrupted after or before its writes, an open apply killed after
// its install, a reload left scheduled). The power-loss simulation is in
// powerloss_test.go.

package haptic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// TestRuntimeOpsRunWhileTheRecordSyncs pins the overlap of the hot path:
// the apply record's sync waits, through the disk hook, until the worker
// holds the apply's map entry, so the apply lands only when its ops are
// sent while the record syncs. Run in order, the sync would wait for ops
// that never come, fail after its deadline, and fail the apply.
func TestRuntimeOpsRunWhileTheRecordSyncs(t *testing.T) {
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
		armed.Do(func() { // the first log sync of the apply is its record's
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if hasMapKey(e.fake, "maps/host.map", "overlap.example") {
					sawOps = true
					return
				}
			}
			err = errors.New("the ops never reached the worker while the record synced")
		})
		return err
	})
	res := e.c.apply(e.c.manifest("plan-2", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "overlap.example", Value: "be-b"}), next)
	d.setHook(nil)
	if !res.OK || res.Mode != ResultRuntime || !sawOps {
		t.Fatalf("apply: %+v (ops seen during the record's sync: %v)", res, sawOps)
	}
	if got := e.disk(t)["maps/host.map"]; got != next["maps/host.map"] {
		t.Fatalf("disk map %q, want %q", got, next["maps/host.map"])
	}
}

// TestAFailedRecordSyncAfterTheOpsReloadsTheTreeItFound: when the apply
// record's sync fails after the ops reached the worker, the apply fails
// having renamed nothing, and the worker reloads the tree as the apply
// found it, so the entry the ops added is gone from the worker too, while
// everything answered before stays: the earlier runtime replace of a
// large map (past the size carried in the log, compiled from its staged
// part) keeps its values on disk and in the worker.
func TestAFailedRecordSyncAfterTheOpsReloadsTheTreeItFound(t *testing.T) {
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

	replaced := fs.clone()
	replaced["maps/big.map"] = strings.ReplaceAll(big.String(), "be-a", "be-b")
	res := e.land(t, "plan-2", replaced, Op{Kind: OpMapReplace, Path: "maps/big.map"})
	if res.Mode != ResultRuntime {
		t.Fatalf("replace: %+v", res)
	}
	awaitReadBacks(e.a)
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
		t.Fatalf("apply: %+v %+v", res, res.Rollback)
	}
	if !sameSet(e.disk(t), replaced) {
		t.Fatalf("the tree is not the one the apply found: %v", e.disk(t).paths())
	}
	if hasMapKey(e.fake, "maps/host.map", "lost.example") || fakeReloads(e.fake) != reloadsBefore+1 {
		t.Fatalf("the worker keeps the failed entry (reloads %d, before %d)", fakeReloads(e.fake), reloadsBefore)
	}
	if st := e.c.state(""); st.AppliedPlanID != "plan-2" || st.RunningPlanID != "plan-2" {
		t.Errorf("the baseline after the failed apply: %+v", st)
	}
	// The log works again: the next one-entry change is a runtime apply.
	if res := e.c.apply(e.c.manifest("plan-4", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "lost.example", Value: "be-b"}), next); res.Mode != ResultRuntime {
		t.Fatalf("the apply after the failure: %s", jsonOf(res))
	}
}

// TestAFailedSyncBreaksTheLogUntilASnapshotIsWritten: the undo record of
// a refused reload fails its sync once. The kernel may have dropped what the
// log held unsynced, so the log is broken: the agent says so (an error in
// its log, /readyz 503 with the reason, the state_log_broken gauge at 1) and
// refuses the next apply (503, before it writes anything) while no snapshot
// can be written. Once one can (every apply tries first, and so does a loop
// every second), the agent is ready again and the apply lands.
func TestAFailedSyncBreaksTheLogUntilASnapshotIsWritten(t *testing.T) {
	d := &hookDisk{}
	logs := newLogCounter(testLogger().Handler())
	e := newTestEnvWithDisk(t, d, func(c *AgentConfig) { c.MetricsListen, c.Logger = "127.0.0.1:0", slog.New(logs) })
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)

	var logSyncs, snapshotsRefused atomic.Int32
	var refuseSnapshots atomic.Bool
	refuseSnapshots.Store(true)
	d.setHook(func(op diskOp) error {
		switch name := filepath.Base(op.Path); {
		case op.Op != "sync":
		case op.Path == logPath && logSyncs.Add(1) == 2: // the apply's record, then its undo's
			return errors.New("injected: the undo record's sync failed")
		case refuseSnapshots.Load() && strings.HasPrefix(name, strings.TrimSuffix(stateTempPattern, "*")):
			snapshotsRefused.Add(1)
			return errors.New("injected: the snapshot's sync failed")
		}
		return nil
	})
	refused := fs.clone()
	refused["haproxy.cfg"] += "bogus\n"
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	if res := e.c.apply(reloadManifest(e, "plan-2", refused), refused); res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the refused reload: %+v", res)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	code, body := getText(t, e.a, PathReadyz)
	if code != http.StatusServiceUnavailable || body != "the agent's state log is broken: injected: the undo record's sync failed\n" {
		t.Fatalf("readyz with a broken log: %d %q", code, body)
	}
	waitFor(t, "the compaction after the answer", func() bool { return snapshotsRefused.Load() > 0 })
	if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_state_log_broken 1\n") {
		t.Error("the gauge does not say the log is broken")
	}
	if logs.count("the agent's state log is broken: it records nothing, so every apply is refused, until a new snapshot is written") != 1 {
		t.Error("the agent did not log that its state log is broken")
	}
	next := fs.clone()
	next["maps/host.map"] += "n.example be-n\n"
	code, raw := e.c.post(applyRequest{manifest: e.c.manifest("plan-3", next), files: next})
	if code != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"stage":"write"`) ||
		!strings.Contains(string(raw), msgLogBroken+": injected: the snapshot's sync failed") {
		t.Fatalf("an apply while the log is broken: %d %s", code, raw)
	}
	if !sameSet(e.disk(t), fs) {
		t.Fatal("an apply refused while the log is broken changed the tree")
	}

	// A snapshot can be written again: the log mends.
	refuseSnapshots.Store(false)
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_state_log_broken 0\n") {
		t.Error("the gauge still says the log is broken")
	}
	if res := e.c.apply(e.c.manifest("plan-3", next), next); !res.OK {
		t.Fatalf("the apply after the snapshot: %+v", res)
	}
	if logs.count("the agent's state log records again: a new snapshot holds the whole state") != 1 {
		t.Error("the agent did not log that its state log records again")
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
// log's next record being an apply's.
func failFirstSync(path string) func(diskOp) error {
	var fail sync.Once
	return func(op diskOp) error {
		var err error
		if op.Op == "sync" && op.Path == path {
			fail.Do(func() { err = errors.New("injected: the record's sync failed") })
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
// apply through the file layer. A one-entry runtime apply makes one log
// sync (its record, before its first rename) and nothing else on its path
// syncs, the first time its map is journalled since the last reload too; a
// reload apply makes two, and syncs no directory twice. The counts are the
// same on a tree whose maps/ and general/ are mounts of their own.
func TestAnApplySyncsOnlyAtItsDurablePoints(t *testing.T) {
	t.Run("one filesystem", func(t *testing.T) { testApplySyncs(t, nil) })
	t.Run("maps and notes on mounts of their own", func(t *testing.T) { testApplySyncs(t, []string{"maps", "notes"}) })
}

func testApplySyncs(t *testing.T, mounted []string) {
	d := &hookDisk{}
	base, _ := filepath.EvalSymlinks(t.TempDir())
	var points []string
	for _, m := range mounted {
		os.MkdirAll(filepath.Join(base, m), 0o750)
		points = append(points, filepath.Join(base, m))
	}
	e := newTestEnvWith(t, agentOptions{disk: d, mountInfo: mountInfoFile(t, points...)}, func(c *AgentConfig) { c.BaseDir = base })
	if n := len(e.a.files.mounts); n != len(mounted)+1 {
		t.Fatalf("the agent found %d mounts, want %d", n, len(mounted)+1)
	}
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
		{"runtime, the map journalled for the first time", ResultRuntime, 1, 0},
		{"runtime, the map already journalled", ResultRuntime, 1, 0},
		{"runtime, again", ResultRuntime, 1, 0},
	} {
		next, op := mapEntry(i)
		res := e.land(t, "plan-r"+string(rune('0'+i)), next, op)
		awaitReadBacks(e.a)
		log, dirs, others := c.reset()
		t.Logf("%s: %d log syncs, %d directory syncs, %d other syncs", s.name, log, dirs, others)
		if res.Mode != s.mode || log != s.maxLog || dirs > s.maxDir || others != 0 {
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
	if log != 1 || dirs != 0 || others != 0 {
		t.Errorf("file_only: %d log syncs, %d directory syncs, %d other", log, dirs, others)
	}
	next = next.clone()
	next["haproxy.cfg"] += "# reload\n"
	e.c.apply(reloadManifest(e, "plan-rl", next), next)
	c.mu.Lock()
	synced := map[string]int{}
	for _, op := range c.ops {
		if op.Op == "syncdir" {
			synced[op.Path]++
		}
	}
	c.mu.Unlock()
	log, dirs, others = c.reset()
	// A reload makes its plan the last-known-good: its files are synced
	// then, so that the next apply may link them into the journal at once.
	t.Logf("reload: %d log syncs, %d directory syncs, %d file syncs", log, dirs, others)
	if log != 2 {
		t.Errorf("reload: %d log syncs, want 2", log)
	}
	for dir, n := range synced {
		if n > 1 {
			t.Errorf("reload: %s synced %d times", dir, n)
		}
	}
}

// TestReplayNeverLetsAnOlderStateOverrideAnApply: a state record older than
// the state replay holds (written beside an apply still in flight, so
// describing the tree from before it) gives replay its numbers only: the
// apply's state, tree and blob stand. A later one of the same generation
// (a change after the apply) is the state.
func TestReplayNeverLetsAnOlderStateOverrideAnApply(t *testing.T) {
	p1, p2 := planRef{"plan-1", "a:1"}, planRef{"plan-2", "a:2"}
	landed := agentState{Generation: 2, ProofGeneration: 2, Applied: p2, Running: p1, WorkerOps: p2, Blob: p1}
	older := agentState{Generation: 1, ProofGeneration: 5, Applied: p1, Running: p1, WorkerOps: p1, Blob: p1}
	later := landed
	later.Running = planRef{}
	newMap := &FileAt{Digest: "d2", Size: 3}
	l := &loadedLog{tree: map[string]FileAt{}, sources: map[FileAt][]source{}}
	l.replay([]logRecord{
		{Seq: 1, Kind: recordApply, State: &landed, Files: []fileChange{{Path: "maps/host.map", New: newMap, Data: []byte("new")}}},
		{Seq: 2, Kind: recordState, State: &older, Blob: []byte("plan 1's blob")},
	})
	if l.st.Applied != p2 || l.st.WorkerOps != p2 || l.st.Generation != 2 || l.blob != nil || l.tree["maps/host.map"] != *newMap {
		t.Errorf("an older state overrode the apply: %+v, blob %q, tree %v", l.st, l.blob, l.tree)
	}
	if l.st.ProofGeneration != 5 {
		t.Errorf("the older record's proof counter was not kept: %d", l.st.ProofGeneration)
	}
	l.replay([]logRecord{{Seq: 3, Kind: recordState, State: &later}})
	if l.st.Running != (planRef{}) {
		t.Errorf("a later state of the same generation was not taken: %+v", l.st)
	}
}

// TestLogFramesTellATornTailFromDamage: a log cut anywhere decodes to a
// prefix of its records and no damage. A flipped byte in a record that a
// later record says was synced is damage, reported at its offset with the
// records after it; one in a record written after the last completed sync,
// with only such records after it (a power loss may write their blocks out
// of order), is a torn tail.
func TestLogFramesTellATornTailFromDamage(t *testing.T) {
	var b bytes.Buffer
	var offsets []int
	// Records 1 and 2 were synced, 3 and 4 were written after that.
	for i, durable := range []uint64{0, 1, 2, 2} {
		offsets = append(offsets, b.Len())
		frame, err := encodeFrame(&logRecord{Seq: uint64(i + 1), Kind: recordState, State: &agentState{Generation: uint64(i + 1)}, Durable: durable})
		if err != nil {
			t.Fatal(err)
		}
		b.Write(frame)
	}
	whole := b.Bytes()
	if recs, tail, good, damaged := decodeFrames(whole, 0); len(recs) != 4 || len(tail) != 0 || good != len(whole) || damaged != -1 {
		t.Fatalf("decoded %d records (+%d), %d of %d bytes, damage at %d", len(recs), len(tail), good, len(whole), damaged)
	}
	for cut := 1; cut < len(whole); cut++ {
		recs, _, good, damaged := decodeFrames(whole[:cut], 0)
		if good > cut || damaged != -1 {
			t.Fatalf("cut at %d: %d records, good %d, damage at %d", cut, len(recs), good, damaged)
		}
		for i, r := range recs {
			if r.Seq != uint64(i+1) {
				t.Fatalf("cut at %d: record %d has seq %d", cut, i, r.Seq)
			}
		}
	}
	flip := func(record int) []byte {
		bad := bytes.Clone(whole)
		bad[offsets[record]+frameHeaderBytes+3] ^= 0x20
		return bad
	}
	for _, tc := range []struct {
		record, records, tail int
		damage                bool
	}{
		{1, 1, 2, true},  // record 2 was synced, as records 3 and 4 say
		{0, 0, 3, true},  // so was record 1
		{2, 2, 0, false}, // record 3 was not, nor was 4 that follows it
		{3, 3, 0, false}, // the last record
	} {
		recs, tail, good, damaged := decodeFrames(flip(tc.record), 0)
		want := -1
		if tc.damage {
			want = offsets[tc.record]
		}
		if len(recs) != tc.records || good != offsets[tc.record] || damaged != want || len(tail) != tc.tail {
			t.Errorf("record %d flipped: %d records, good %d, damage at %d (want %d), %d after it",
				tc.record+1, len(recs), good, damaged, want, len(tail))
		}
	}
}

// TestTheLogWritesItsRecordsOverZerosKeptAhead: the log keeps synced zeros
// past its last record, so that a record lands on blocks the file already
// has and its sync commits no new size. A start reads the zeros as the
// log's end, and keeps them; only the bytes of a record cut short are a
// torn tail. Zeros
// half used up are renewed; zeros a full disk refuses are cut off again,
// and records then grow the file.
func TestTheLogWritesItsRecordsOverZerosKeptAhead(t *testing.T) {
	d := &halfFullDisk{}
	statePath := filepath.Join(t.TempDir(), defaultStateFile)
	w, err := openStateLog(d, statePath, 0, 0, logZeroAhead, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.f.Close()
	length := func() int64 {
		fi, err := os.Stat(logPathFor(statePath))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	var seq uint64
	write := func(sync bool) {
		seq++
		if err := w.append(logFiller(seq), sync); err != nil {
			t.Fatal(err)
		}
	}
	load := func(what string, torn int64) *loadedLog {
		t.Helper()
		l, err := loadLog(d, statePath)
		if err != nil || l.seq != seq || l.good != w.bytes || l.torn != torn || l.damage != "" {
			t.Fatalf("%s: a start read to record %d, %d bytes good, %d torn, damage %q (%v); want %d, %d, %d, none",
				what, l.seq, l.good, l.torn, l.damage, err, seq, w.bytes, torn)
		}
		return l
	}
	if n := length(); n != logZeroAhead {
		t.Fatalf("a new log is %d bytes long, want %d of zeros", n, logZeroAhead)
	}
	write(true)
	write(false)
	if n := length(); n != logZeroAhead {
		t.Errorf("two records made the log %d bytes long, want %d", n, logZeroAhead)
	}
	l := load("two records over zeros", 0)
	again, err := openStateLog(d, statePath, l.good, l.zeroed, logZeroAhead, l.count)
	if err != nil || again.bytes != w.bytes || again.zeroed != logZeroAhead || length() != logZeroAhead {
		t.Errorf("a start after two records: the log is %d bytes long, zeros from %d to %d (%v); want them kept", length(), again.bytes, again.zeroed, err)
	}
	again.f.Close()

	frame, _ := encodeFrame(logFiller(seq + 1))
	half := frame[:len(frame)/2]
	if _, err := w.f.Write(half); err != nil {
		t.Fatal(err)
	}
	load("half a record over zeros", int64(len(half)))
	w.f.Seek(w.bytes, io.SeekStart)

	for w.bytes < logZeroAhead/2 {
		write(false)
	}
	if err := w.keepAhead(); err != nil || length() != w.bytes+logZeroAhead {
		t.Errorf("zeros half used up: the log is %d bytes long past its %d (%v), want %d", length(), w.bytes, err, w.bytes+logZeroAhead)
	}
	for w.zeroed-w.bytes >= logZeroAhead/2 {
		write(false)
	}
	d.full.Store(true)
	if err := w.keepAhead(); err != nil || length() != w.bytes {
		t.Errorf("a full disk: the log is %d bytes long past its %d (%v), want none of the zeros left", length(), w.bytes, err)
	}
	d.full.Store(false)
	write(true)
	if length() != w.bytes {
		t.Errorf("a record past the zeros: the log is %d bytes long, want %d", length(), w.bytes)
	}
	load("records past the zeros", 0)
}

// TestAnAgentRenewsItsLogsZerosAfterItsAnswers: once an apply's records
// use up half the zeros, the work after its answer writes new ones, so
// that a long run of applies keeps landing on blocks the log already has.
func TestAnAgentRenewsItsLogsZerosAfterItsAnswers(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	for i := 0; logEnd(e.a) <= logZeroAhead/2; i++ {
		next, op := mapEntryChange(set, fmt.Sprintf("k%d.example", i), "be-a")
		if res := e.c.apply(e.c.manifest(fmt.Sprintf("plan-%d", i+2), next, op), next); !res.OK || res.Mode != ResultRuntime {
			t.Fatalf("apply %d: %s", i, jsonOf(res))
		}
		set = next
	}
	waitFor(t, "zeros renewed past the records", func() bool {
		fi, err := os.Stat(filepath.Join(e.cfg.BaseDir, logFileName))
		return err == nil && fi.Size()-logEnd(e.a) >= logZeroAhead/2
	})
}

// TestAFailedSyncOfTheZerosBreaksTheLog: the sync that makes new zeros
// durable also makes the records written since durable; when it fails, they
// may be lost, so the log is broken until a snapshot is written, as after
// any failed sync of the log.
func TestAFailedSyncOfTheZerosBreaksTheLog(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	e.land(t, "plan-1", seedFiles())
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)
	d.setHook(func(op diskOp) error {
		if op.Op == "sync" && op.Path == logPath {
			return syscall.EIO
		}
		return nil
	})
	defer d.setHook(nil)
	e.a.deps.applyMu.Lock()
	e.a.led.mu.Lock()
	e.a.led.log.zeroed = e.a.led.log.bytes // the zeros used up
	e.a.led.mu.Unlock()
	e.a.led.keepLogAhead()
	e.a.deps.applyMu.Unlock()
	if broken, _, _ := e.a.led.faults(); !errors.Is(broken, syscall.EIO) {
		t.Errorf("the log after a failed sync of its zeros: broken by %v, want the sync's error", broken)
	}
}

// halfFullDisk is the OS's disk, whose files, while full is set, take half
// of a write and then refuse the rest as a full disk does.
type halfFullDisk struct {
	osDisk
	full atomic.Bool
}

func (d *halfFullDisk) OpenFile(name string, flag int, perm os.FileMode) (diskFile, error) {
	f, err := d.osDisk.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return halfFullFile{f, d}, nil
}

type halfFullFile struct {
	diskFile
	d *halfFullDisk
}

func (f halfFullFile) Write(p []byte) (int, error) {
	if !f.d.full.Load() {
		return f.diskFile.Write(p)
	}
	n, _ := f.diskFile.Write(p[:len(p)/2])
	return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
}

// TestSettle is the table of how a run's end changes the state: p1 is on
// disk and in the worker, the apply lands p2.
func TestSettle(t *testing.T) {
	p1, p2, w2, lkg := planRef{"p1", "a:1"}, planRef{"p2", "a:2"}, planRef{"p2w", "a:3"}, planRef{"p0", "a:0"}
	base := agentState{Generation: 5, Applied: p1, Running: p1, WorkerOps: p1, LKG: lkg, Token: Token{1, 4}}
	pending := base
	pending.Pending, pending.PendingAt, pending.PendingBase = p1, time.Unix(9, 0), planRef{"p0", "a:0"}
	pending.PendingUndo = []journalEntry{{Path: "a"}}
	id := applyIdentity{ref: p2, worker: w2, token: Token{1, 5}, schema: 1,
		undo: []journalEntry{{Path: "a", Backup: "/l/2"}, {Path: "b", Backup: "/l/3"}}}
	now := time.Unix(100, 0)
	type pairs struct {
		gen                              uint64
		applied, running, workerOps, lkg planRef
		token                            Token
	}
	tests := []struct {
		name string
		cur  agentState
		id   applyIdentity
		o    outcome
		want pairs
		more func(s agentState) string
	}{
		{"a runtime or file_only apply lands its pair and token", base, id, outcome{ok: true, installed: true},
			pairs{6, p2, p1, p2, lkg, Token{1, 5}}, func(s agentState) string {
				if !s.TreeChangedAt.Equal(now) || s.ReloadOwed {
					return "tree change time, or a reload owed"
				}
				return ""
			}},
		{"a reload lands its pair as running and last-known-good", base, id, outcome{ok: true, reloaded: true},
			pairs{6, p2, p2, p2, p2, Token{1, 5}}, nil},
		{"an apply an invalidation overtook lands its tree, not its pair", base, id, outcome{ok: true, overtaken: true},
			pairs{6, planRef{}, p1, planRef{}, lkg, Token{1, 4}}, nil},
		{"a scheduled apply keeps the worker pair and records what its reload undoes", base, id, outcome{ok: true, due: now},
			pairs{6, p2, p1, p1, lkg, Token{1, 5}}, func(s agentState) string {
				if s.Pending != p2 || !s.PendingAt.Equal(now) || s.PendingBase != p1 || len(s.PendingUndo) != 2 {
					return fmt.Sprintf("pending %+v at %v base %+v undo %v", s.Pending, s.PendingAt, s.PendingBase, s.PendingUndo)
				}
				return ""
			}},
		{"an apply joining a pending reload keeps its due, its base and the first undo of a path", pending, id,
			outcome{ok: true, due: pending.PendingAt, inPlace: true},
			pairs{6, p2, p1, w2, lkg, Token{1, 5}}, func(s agentState) string {
				if s.Pending != p2 || !s.PendingAt.Equal(pending.PendingAt) || s.PendingBase != pending.PendingBase ||
					len(s.PendingUndo) != 2 || s.PendingUndo[0].Backup != "" {
					return fmt.Sprintf("pending %+v base %+v undo %v", s.Pending, s.PendingBase, s.PendingUndo)
				}
				return ""
			}},
		{"a revert lands the last-known-good pair", base, applyIdentity{ref: lkg, token: Token{1, 5}, revert: true},
			outcome{ok: true, reloaded: true}, pairs{6, lkg, lkg, lkg, lkg, Token{1, 5}}, nil},
		{"a re-landed plan re-binds its stored blob", func() agentState { s := base; s.Blob = planRef{"p2", "a:1"}; return s }(), id,
			outcome{ok: true}, pairs{6, p2, p1, p2, lkg, Token{1, 5}}, func(s agentState) string {
				if s.Blob != p2 {
					return fmt.Sprintf("blob %+v", s.Blob)
				}
				return ""
			}},
		// The refusal rows: a failure keeps the generation and token, and the
		// pairs where they are still true.
		{"a refused reload that was undone keeps the baseline it began with", base, id, outcome{undone: true, installed: true},
			pairs{5, p1, p1, p1, lkg, Token{1, 4}}, nil},
		{"an apply that failed before it changed anything keeps everything", base, id, outcome{undone: true},
			pairs{5, p1, p1, p1, lkg, Token{1, 4}}, func(s agentState) string {
				if !s.TreeChangedAt.IsZero() {
					return "the tree change time moved"
				}
				return ""
			}},
		{"ops that ran and a restored tree the worker reloaded", base, id, outcome{undone: true, opsRan: true, recovered: true},
			pairs{5, p1, p1, p1, lkg, Token{1, 4}}, nil},
		{"ops that ran and a recovery reload that failed vouch for no worker", base, id, outcome{undone: true, opsRan: true},
			pairs{5, p1, planRef{}, planRef{}, lkg, Token{1, 4}}, nil},
		{"a reload without a verdict whose undo failed forgets the applied pair", base, id, outcome{reloaded: true, installed: true},
			pairs{5, planRef{}, planRef{}, planRef{}, lkg, Token{1, 4}}, nil},
		{"a restored tree HAProxy refused too falls back to the last-known-good set", base, id,
			outcome{undone: true, opsRan: true, lkgRestored: true}, pairs{5, lkg, lkg, lkg, lkg, Token{1, 4}}, nil},
		{"an invalidation during a failed apply stays", func() agentState { s := base; s.Applied = planRef{}; return s }(), id,
			outcome{undone: true, overtaken: true}, pairs{5, planRef{}, p1, p1, lkg, Token{1, 4}}, nil},
		{"a failure keeps a pending reload it did not reload", pending, id, outcome{undone: true, installed: true},
			pairs{5, p1, p1, p1, lkg, Token{1, 4}}, func(s agentState) string {
				if s.Pending != p1 || len(s.PendingUndo) != 1 {
					return fmt.Sprintf("pending %+v undo %v", s.Pending, s.PendingUndo)
				}
				return ""
			}},
	}
	for _, tc := range tests {
		tc.o.result = ApplyResult{PlanID: "p2", OK: tc.o.ok}
		s := stateAfter(tc.cur, base, tc.id, tc.o, now)
		got := pairs{s.Generation, s.Applied, s.Running, s.WorkerOps, s.LKG, s.Token}
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
		if tc.more != nil {
			if msg := tc.more(s); msg != "" {
				t.Errorf("%s: %s", tc.name, msg)
			}
		}
		if s.LastApply == nil || s.LastApply.PlanID != "p2" {
			t.Errorf("%s: last_apply %+v", tc.name, s.LastApply)
		}
	}
}

// TestLandingIsWhatACrashRightAfterTheRecordFinds: the state an apply's
// record carries is the state it lands if it ends as planned, with a reload
// owed while its ops may still be in flight.
func TestLandingIsWhatACrashRightAfterTheRecordFinds(t *testing.T) {
	p1, p2 := planRef{"p1", "a:1"}, planRef{"p2", "a:2"}
	base := agentState{Generation: 5, Applied: p1, Running: p1, WorkerOps: p1, Token: Token{1, 4}}
	id := applyIdentity{ref: p2, token: Token{1, 5}}
	now := time.Unix(100, 0)
	ops := landing(base, id, steps{act: activateOps}, true, now)
	if ops.Generation != 6 || ops.Applied != p2 || ops.WorkerOps != p2 || ops.Running != p1 || !ops.ReloadOwed {
		t.Errorf("runtime: %+v", ops)
	}
	if fo := landing(base, id, steps{act: activateNothing}, false, now); fo.ReloadOwed || fo.Applied != p2 {
		t.Errorf("file_only: %+v", fo)
	}
	if sc := landing(base, id, steps{act: activateSchedule}, false, now); sc.Pending != p2 || sc.WorkerOps != p1 || !sc.PendingAt.Equal(now) {
		t.Errorf("scheduled: %+v", sc)
	}
}

// TestWorkerAtStart is the table of what a start keeps of the worker
// baseline.
func TestWorkerAtStart(t *testing.T) {
	changed := time.UnixMicro(2_000_000)
	expected := HAProxyInfo{WorkerPID: 10, WorkerStartTimeUnixMicros: 1_000_000}
	p0, p1 := planRef{"p0", "a:0"}, planRef{"p1", "a:1"}
	base := agentState{Applied: p1, Running: p0, WorkerOps: p1, Worker: expected, TreeChangedAt: changed,
		Pending: p1, PendingAt: time.Unix(5, 0)}
	tests := []struct {
		name             string
		st               agentState
		observed         HAProxyInfo
		running, workOps planRef
		pending          bool
	}{
		{"the same worker keeps everything", base, expected, p0, p1, true},
		{"a worker that started after the tree changed loaded it", base,
			HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 3_000_000}, p1, p1, false},
		{"a worker that started before the tree changed runs something else", base,
			HAProxyInfo{WorkerPID: 11, WorkerStartTimeUnixMicros: 1_500_000}, planRef{}, planRef{}, true},
		{"the same PID with another start time is another worker", base,
			HAProxyInfo{WorkerPID: 10, WorkerStartTimeUnixMicros: 1_500_000}, planRef{}, planRef{}, true},
		{"a new worker without a known applied plan runs something unknown", func() agentState {
			s := base
			s.Applied = planRef{}
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
		if got.Running != tc.running || got.WorkerOps != tc.workOps || got.reloadPending() != tc.pending ||
			got.Worker != tc.observed || got.Applied != tc.st.Applied {
			t.Errorf("%s: running %+v worker ops %+v pending %v", tc.name, got.Running, got.WorkerOps, got.reloadPending())
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
	if res.AppliedPlanProof == first.AppliedPlanProof || res.AppliedPlanProof != fmt.Sprintf("a:%d", 1+proofsALostTailMayHold+1) {
		t.Errorf("proof %q reused or not past what a lost record may hold", res.AppliedPlanProof)
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
	p := planOfFiles(t, fs)
	c.post(applyRequest{manifest: c.manifest(p.ID, fs), files: fs, plan: blobOf(t, p)})
	before := c.state("")
	if !before.AppliedPlanStored {
		t.Fatalf("blob not stored: %+v", before)
	}
	stop()
	editState(t, cfg.BaseDir, func(s *agentState, _ map[string]FileAt) {
		s.Pending, s.PendingAt = planRef{p.ID, before.AppliedPlanProof}, time.Now().Add(time.Hour)
	})

	a, _ = launchTestAgent(t, cfg, true)
	c = newAgentClient(t, a)
	st := c.state("")
	if st.AppliedPlanProof != before.AppliedPlanProof || st.RunningPlanProof != before.RunningPlanProof ||
		st.WorkerOpsPlanProof != before.WorkerOpsPlanProof || st.LKGPlanProof != before.LKGPlanProof ||
		st.ReloadPendingAt == "" || !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blobOf(t, p)) {
		t.Errorf("state after restart: %+v", st)
	}
	if a.deps.nack.work != nil {
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

// TestADamagedStateIsSetAsideAndTheBaselineForgotten: a state file that
// fails its checksum is not acted on: the agent starts, keeps it aside for
// inspection, keeps the tree as it stands and forgets the baseline, and a
// file that does not even parse is no different.
func TestADamagedStateIsSetAsideAndTheBaselineForgotten(t *testing.T) {
	_, cfg, _, first := landedThenStopped(t)
	path := filepath.Join(cfg.BaseDir, ".haptic-agent.json")
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 0x01
	os.WriteFile(path, b, 0o600)
	a, stop := launchTestAgent(t, cfg, true)
	st := newAgentClient(t, a).state("")
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.LKGPlanID != "" || !sameSet(diskSet(t, cfg.BaseDir), seedFiles()) {
		t.Errorf("after a damaged snapshot: %+v", st)
	}
	if aside, err := os.ReadFile(path + damagedSuffix); err != nil || !bytes.Equal(aside, b) {
		t.Errorf("the damaged snapshot was not kept aside: %v", err)
	}
	// What the agent owned is unknown with its snapshot, but the files stay,
	// and the next push lands by a reload.
	if first.AppliedPlanID != "plan-1" || len(st.Files) != 0 {
		t.Errorf("a damaged snapshot vouches for files: %+v", st.Files)
	}
	c := newAgentClient(t, a)
	fs := seedFiles()
	if res := c.apply(reloadManifest(&testEnv{c: c}, "plan-2", fs), fs); !res.OK || res.Mode != ResultReload {
		t.Errorf("the push after the damage: %+v", res)
	}
	stop() // one tree takes one agent
	os.WriteFile(path, []byte("{not json"), 0o600)
	if err := newTestAgentOrError(t, cfg); err != nil {
		t.Errorf("NewAgent over an unparsable state file: %v", err)
	}
}

func TestAnInterruptedApplyReloadsWhatIsOnDisk(t *testing.T) {
	fake, cfg, _, _ := landedThenStopped(t)
	editState(t, cfg.BaseDir, func(s *agentState, _ map[string]FileAt) { s.ReloadOwed = true })
	pid := fake.Worker().WorkerPID

	a, _ := launchTestAgent(t, cfg, true)
	st := newAgentClient(t, a).state("")
	if st.AppliedPlanID != "plan-1" || st.RunningPlanID != "plan-1" || st.WorkerOpsPlanID != "plan-1" {
		t.Errorf("baseline after recovery: %+v", st)
	}
	if fake.Worker().WorkerPID <= pid || st.HAProxy.WorkerPID != fake.Worker().WorkerPID {
		t.Errorf("no recovery reload: pid %d → %d (state %d)", pid, fake.Worker().WorkerPID, st.HAProxy.WorkerPID)
	}
	if st.LKGPlanID != "plan-1" || st.InvariantViolation != "" {
		t.Errorf("LKG %q invariant %q", st.LKGPlanID, st.InvariantViolation)
	}
}

// killOpenApplyAfterInstall runs the crash test's reload apply in an agent
// child and kills it right after the install: at the first sync of a tree
// file, which the reload makes while HAProxy loads the set. The apply's
// record is then the log's last, open and never closed. The child is gone
// when it returns.
func killOpenApplyAfterInstall(t *testing.T) *crashEnv {
	t.Helper()
	i := slices.IndexFunc(crashKinds(), func(k crashKind) bool { return k.name == "reload" })
	k := crashKinds()[i]
	ops := applyOps(t, k)
	at := 1 + slices.IndexFunc(ops, func(line string) bool {
		f := strings.Fields(line)
		return f[1] == "sync" && filepath.Base(f[2]) != logFileName
	})
	if at == 0 {
		t.Fatalf("the reload apply syncs no tree file:\n%s", strings.Join(ops, "\n"))
	}
	e := newCrashEnv(t, k)
	cfg := e.cfg
	cfg.StopAtOp = at
	b := startAgentChild(t, cfg)
	go b.postApply(b.state(t), "plan-2", k.after, k.mode)
	waitFor(t, "the agent to stop after the install", func() bool {
		_, err := os.Stat(cfg.StopMarker)
		return err == nil
	})
	b.kill()
	return e
}

// TestReplayKeepsTheProofAnUnclosedApplyReserved: an open apply's record
// counts only once an end record closes it, but the proof it reserved may
// have been seen (its record reached the disk). After a kill before the
// end record, the start rolls the apply back and the next apply's proof is
// above the lost one's.
func TestReplayKeepsTheProofAnUnclosedApplyReserved(t *testing.T) {
	e := killOpenApplyAfterInstall(t)
	raw, err := os.ReadFile(filepath.Join(e.base, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	records, _, _, _ := decodeFrames(raw, 0)
	var lost *logRecord
	for i := range records {
		switch r := &records[i]; {
		case r.Kind == recordApply && r.Open:
			lost = r
		case r.Kind == recordEnd && lost != nil && r.End == lost.Seq:
			t.Fatal("the interrupted apply was closed")
		}
	}
	if lost == nil || lost.State == nil || lost.State.Applied.ID != "plan-2" {
		t.Fatalf("no open record of plan-2 in the log: %+v", lost)
	}
	reserved := lost.State.Applied.Proof
	// Replay itself keeps the counter, whatever margin the start adds.
	if loaded, err := loadLog(osDisk{}, filepath.Join(e.base, defaultStateFile)); err != nil || loaded.st.ProofGeneration < proofNumber(reserved) {
		t.Fatalf("replay keeps proof counter %d, the lost apply reserved %s (%v)", loaded.st.ProofGeneration, reserved, err)
	}

	c := startAgentChild(t, e.cfg)
	st := c.state(t)
	if st.AppliedPlanID == "plan-2" {
		t.Fatalf("the unclosed apply counts after the start: %+v", st)
	}
	code, body, err := c.postApply(st, "plan-3", seedFiles(), ModeReload)
	var res ApplyResult
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &res) != nil || !res.OK {
		t.Fatalf("the next apply: %d %v %s", code, err, body)
	}
	if proofNumber(res.AppliedPlanProof) <= proofNumber(reserved) {
		t.Errorf("proof %s issued after the lost apply reserved %s", res.AppliedPlanProof, reserved)
	}
}

// TestAnInterruptedOpenApplyReloadsWhenItsUndoCannotBeRead: killed after
// its install, an open apply leaves its files in the tree; with every
// place its undo could be read from gone, the start cannot put them back.
// It still reloads HAProxy onto what is on disk (a worker may hold the
// killed apply's set, or boot on it), forgets the baseline, says which
// file it could not restore, and the next push lands.
func TestAnInterruptedOpenApplyReloadsWhenItsUndoCannotBeRead(t *testing.T) {
	e := killOpenApplyAfterInstall(t)
	// The file the apply created goes too, so that the start has nothing it
	// can put back: only the open record says that the worker may have
	// seen the apply.
	if err := os.RemoveAll(filepath.Join(e.base, "lua/new")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{storeLinkDir, storeTempDir} {
		entries, _ := os.ReadDir(filepath.Join(e.base, dir))
		for _, entry := range entries {
			if err := os.Remove(filepath.Join(e.base, dir, entry.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	reloads := fakeReloads(e.fake)

	c := startAgentChild(t, e.cfg)
	st := c.state(t)
	if fakeReloads(e.fake) <= reloads {
		t.Error("the start did not reload HAProxy")
	}
	onDisk := diskSet(t, e.base)
	if got, want := e.fake.MapEntries("maps/host.map"), ParseMapEntries(onDisk["maps/host.map"]); !slices.Equal(got, want) {
		t.Errorf("the worker holds %v, the disk %v", got, want)
	}
	if st.AppliedPlanID != "" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("the start vouches for a tree it could not restore: %+v", st)
	}
	said := ""
	for line := range strings.Lines(c.output.String()) {
		if strings.Contains(line, "recovery could not put every file back") {
			said = line
		}
	}
	if !strings.Contains(said, `restore \"haproxy.cfg\": no copy of its bytes`) {
		t.Errorf("the start did not say what it could not restore:\n%s", c.output.String())
	}
	next := seedFiles()
	if code, body, err := c.postApply(st, "plan-3", next, ModeReload); err != nil || code != http.StatusOK ||
		!bytes.Contains(body, []byte(`"ok":true`)) || !sameSet(diskSet(t, e.base), next) {
		t.Errorf("the next push: %d %v %s", code, err, body)
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
	editState(t, cfg.BaseDir, func(s *agentState, _ map[string]FileAt) {
		s.Pending, s.PendingAt = planRef{"plan-2", "a:2"}, time.Now().Add(-time.Hour)
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

// A runtime apply writes its map's new bytes while its record syncs, and
// renames them into the tree only once the sync is done: the log's sync is
// held until the temp file is written (or two seconds pass), and nothing
// may be renamed onto the map while it is held.
func TestAnInstallsBytesAreWrittenWhileItsRecordSyncs(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWith(t, agentOptions{disk: d}, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	logPath, mapPath := filepath.Join(e.cfg.BaseDir, logFileName), filepath.Join(e.cfg.BaseDir, "maps/host.map")
	var mu sync.Mutex
	var syncing, written, writtenBySync, renamedWhileSyncing bool
	wrote := make(chan struct{}, 1)
	d.setHook(func(op diskOp) error {
		mu.Lock()
		switch {
		case op.Op == "write" && strings.Contains(op.Path, storeTempDir):
			written = true
			notify(wrote)
		case (op.Op == "exchange" || op.Op == "rename") && op.Path == mapPath:
			renamedWhileSyncing = renamedWhileSyncing || syncing
		case op.Op == "sync" && op.Path == logPath && !syncing && !writtenBySync:
			syncing = true
			mu.Unlock()
			select {
			case <-wrote:
			case <-time.After(2 * time.Second):
			}
			mu.Lock()
			syncing, writtenBySync = false, written
		}
		mu.Unlock()
		return nil
	})
	next := fs.clone()
	next["maps/host.map"] += "new.example be-b\n"
	res := e.land(t, "plan-2", next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "new.example", Value: "be-b"})
	d.setHook(nil)
	mu.Lock()
	defer mu.Unlock()
	switch {
	case res.Mode != ResultRuntime:
		t.Fatalf("the apply landed as %s, want runtime", res.Mode)
	case !writtenBySync:
		t.Error("the map's new bytes were not written while the record synced")
	case renamedWhileSyncing:
		t.Error("the map was renamed into the tree before the record's sync")
	}
	if got := diskSet(t, e.cfg.BaseDir); got["maps/host.map"] != next["maps/host.map"] {
		t.Errorf("the map at the answer is %q, want %q", got["maps/host.map"], next["maps/host.map"])
	}
}

// A write of the install's bytes that fails while the record syncs (a full
// disk, say) refuses the apply before its op reaches HAProxy: the tree and
// the worker are as the apply found them, and the next apply lands.
func TestAFailedWriteBesideTheSyncRefusesTheApplyBeforeItsOps(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWith(t, agentOptions{disk: d}, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	var failed atomic.Bool
	d.setHook(func(op diskOp) error {
		if op.Op == "write" && strings.Contains(op.Path, storeTempDir) && failed.CompareAndSwap(false, true) {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	next, op := mapEntryChange(fs, "new.example", "be-b")
	res := e.c.apply(e.c.manifest("plan-2", next, op), next)
	d.setHook(nil)
	if !failed.Load() || res.OK || res.Error == nil || res.Error.Stage != StageWrite || res.AppliedPlanID != "plan-1" {
		t.Fatalf("failed a write: %v; the apply: %s", failed.Load(), jsonOf(res))
	}
	if hasMapKey(e.fake, "maps/host.map", "new.example") || res.Rollback == nil || res.Rollback.Reloaded {
		t.Errorf("the op reached the worker, or a reload took it away again: %s", jsonOf(res.Rollback))
	}
	if got := diskSet(t, e.cfg.BaseDir); !sameSet(got, fs) {
		t.Errorf("the tree after the refusal:\n%s", describeSetDiff(got, fs))
	}
	if res := e.land(t, "plan-2", next, op); res.Mode != ResultRuntime {
		t.Errorf("the apply once the write takes: %s", jsonOf(res))
	}
}

// What the agent forgets between applies (an invalidated baseline, a worker
// it adopted and cannot vouch for) is a record of its own, so a start that
// finds no snapshot after it still forgets: the log is read from a copy of
// the tree taken while the agent runs, as a kill -9 would leave it.
func TestForgottenBaselinesSurviveACrash(t *testing.T) {
	for _, c := range []struct {
		name   string
		forget func(l *ledger)
		check  func(s agentState) string
	}{
		{"an invalidation", func(l *ledger) { l.invalidate() }, func(s agentState) string {
			if s.Applied.complete() || s.WorkerOps.complete() {
				return fmt.Sprintf("applied %+v, worker ops %+v: want both forgotten", s.Applied, s.WorkerOps)
			}
			return ""
		}},
		{"a foreign worker adopted", func(l *ledger) { l.adoptWorker(HAProxyInfo{WorkerPID: 4242, WorkerStartTimeUnixMicros: 7}, nil, true) },
			func(s agentState) string {
				if s.Worker.WorkerPID != 4242 || s.Applied.complete() || s.Running.complete() || s.WorkerOps.complete() {
					return fmt.Sprintf("worker %d, applied %+v, running %+v, worker ops %+v: want 4242 and all three forgotten",
						s.Worker.WorkerPID, s.Applied, s.Running, s.WorkerOps)
				}
				return ""
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := landedEnv(t, nil, nil)
			if st := e.a.led.state(); !st.Applied.complete() || !st.Running.complete() {
				t.Fatalf("plan-1 did not land whole: %+v", st)
			}
			e.a.deps.applyMu.Lock()
			c.forget(e.a.led)
			e.a.deps.applyMu.Unlock()
			crashed := t.TempDir()
			if err := os.CopyFS(crashed, os.DirFS(e.cfg.BaseDir)); err != nil {
				t.Fatal(err)
			}
			cfg := e.cfg
			cfg.BaseDir = crashed
			paths, err := resolveAgentPaths(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			led, _, err := newLedger(osDisk{}, paths.state, paths.planBlob, logZeroAhead, testLogger())
			if err != nil {
				t.Fatal(err)
			}
			defer led.log.f.Close()
			if msg := c.check(led.state()); msg != "" {
				t.Error("after the crash: " + msg)
			}
		})
	}
}
