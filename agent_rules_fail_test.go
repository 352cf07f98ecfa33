// This file owns the tests that pin how a failed apply ends (fail and
// runApply in agent_apply_run.go) where the disk fails too: an undo that
// could not put the tree back is not reported as performed, an apply that
// is not acknowledged never installs its files afterwards, and an undo
// record refused by a read-only disk reloads nothing and owes the reload.
// Each drives the agent through its API, on a disk whose faults the test
// arms.

package haptic

import (
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestAnUndoThatCouldNotPutTheTreeBackIsNotReportedAsPerformed: HAProxy
// refuses a reload apply's config, and the disk then refuses to put the
// old config back (EIO). The answer must not say the rollback was
// performed: the tree still holds the refused config, which a restart of
// HAProxy would load.
func TestAnUndoThatCouldNotPutTheTreeBackIsNotReportedAsPerformed(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	cfg := filepath.Join(e.a.files.base, ConfigFilePath)
	var renames atomic.Int32
	d.setHook(func(op diskOp) error {
		// The install renames the config into place; every later rename
		// onto it, the undo's, fails.
		if (op.Op == "exchange" || op.Op == "rename") && op.Path == cfg && renames.Add(1) > 1 {
			return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	bad := set.clone()
	bad[ConfigFilePath] += "bogus\n"
	res := e.c.apply(reloadManifest(e, "plan-bad", bad), bad)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("the refused config: %s", jsonOf(res))
	}
	if renames.Load() < 2 || e.disk(t)[ConfigFilePath] != bad[ConfigFilePath] {
		t.Fatalf("the undo did not fail to put the config back (%d renames onto it): the test does not reach the rule", renames.Load())
	}
	if res.Rollback == nil || res.Rollback.Performed {
		t.Errorf("rollback %+v: the refused config is still in place, yet the answer says the rollback was performed", res.Rollback)
	}
}

// TestAFallbackWhoseLinkAsideFailsNeverInstallsItsFiles: a runtime op the
// worker refuses falls back to a reload, which must first link aside the
// map it replaces; the disk is full (ENOSPC). The apply is refused at
// stage backup, and its files are never installed afterwards as if it had
// been acknowledged: the tree stays the ACKed set from before it.
func TestAFallbackWhoseLinkAsideFailsNeverInstallsItsFiles(t *testing.T) {
	d, e, set := ackedOnHookDisk(t) // the map is in the journal: the runtime apply links nothing of its own
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "Unknown map.", strings.HasPrefix(cmd, "add map") }
	})
	var links atomic.Int32
	d.setHook(func(op diskOp) error {
		if op.Op == "link" {
			links.Add(1)
			return &fs.PathError{Op: "link", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	next, op := mapEntryChange(set, "refused.example", "be-a")
	res := e.c.apply(e.c.manifest("plan-refused", next, op), next)
	d.setHook(nil)
	if res.OK || res.Error == nil || res.Error.Stage != StageBackup || !strings.Contains(res.Error.Message, "no space left on device") || links.Load() == 0 {
		t.Fatalf("the fallback whose link aside fails: %s", jsonOf(res))
	}
	if got := e.disk(t); !sameSet(got, set) {
		t.Errorf("the refused apply's files were installed:\n%s", describeSetDiff(got, set))
	}
}

// TestAnUndoRecordRefusedByAReadOnlyDiskOwesTheReload: a runtime op the
// worker refuses falls back to a reload; the rename of its map into place
// fails with EIO, and the filesystem turns read-only after the I/O error
// (ext4's errors=remount-ro), so the record of the undo is refused with
// EROFS. The op may have changed the worker, but the agent must not reload
// HAProxy onto a tree it cannot write (a real master cannot even keep its
// socket in a read-only directory): the reload is owed, the agent is not
// ready, and once the disk takes writes again it reloads.
func TestAnUndoRecordRefusedByAReadOnlyDiskOwesTheReload(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	reloads := fakeReloads(e.fake)
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "Unknown map.", strings.HasPrefix(cmd, "add map") }
	})
	target := filepath.Join(e.a.files.base, "maps/host.map")
	var readOnly, healed atomic.Bool
	var failing sync.Once
	d.setHook(func(op diskOp) error {
		switch {
		case healed.Load():
			return nil
		case readOnly.Load():
			return &fs.PathError{Op: op.Op, Path: op.Path, Err: syscall.EROFS}
		case op.Op == "exchange" && op.Path == target:
			failing.Do(func() { readOnly.Store(true) })
			return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	next, op := mapEntryChange(set, "refused.example", "be-a")
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-refused", next, op), files: next})
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), msgOutcomeUnknown) || !readOnly.Load() {
		t.Fatalf("the apply whose undo the disk would not record: %d %s", code, body)
	}
	e.a.deps.applyMu.Lock() // what follows the answer is done
	e.a.deps.applyMu.Unlock()
	if n := fakeReloads(e.fake); n != reloads {
		t.Errorf("HAProxy was reloaded onto a read-only tree: %d reloads after the apply", n-reloads)
	}
	if code, body := getText(t, e.a, PathReadyz); code != http.StatusServiceUnavailable {
		t.Errorf("readyz on the read-only disk: %d %q", code, body)
	}
	healed.Store(true)
	if code, body := awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK {
		t.Fatalf("readyz once the disk takes writes again: %d %q", code, body)
	}
	if n := fakeReloads(e.fake); n != reloads+1 {
		t.Errorf("%d reloads once the disk takes writes again, want the one owed", n-reloads)
	}
	if got := e.disk(t); !sameSet(got, set) {
		t.Errorf("the tree once the disk takes writes again:\n%s", describeSetDiff(got, set))
	}
}

// The one case the last-known-good set is loaded: a runtime apply whose op
// HAProxy refused falls back to a reload, HAProxy refuses that, and then
// refuses the tree the undo put back too (the worker holds the ops that did
// run, so it must reload something). The agent puts the last-known-good set
// back, reloads it, and starts the journal afresh: the runtime apply
// answered before, whose map entry the set does not hold, goes with it.
func TestADoubleRefusalLoadsTheLastKnownGoodSet(t *testing.T) {
	var armed atomic.Bool
	var refused atomic.Int32
	e, lkg := landedEnv(t, nil, func(a *Agent, fake *FakeHAProxy) {
		a.deps.beforeReload = func() {
			fail := armed.Load() && refused.Add(1) <= 2 // the fallback's reload, then the undo's
			fake.With(func(m *FakeModel) { m.ReloadFails = fail })
		}
	})
	answered := lkg.clone()
	answered["maps/host.map"] += "a.example be-a\n"
	e.land(t, "plan-2", answered, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "a.example", Value: "be-a"})
	awaitReadBacks(e.a)
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(command string) (string, bool) { return "refused", strings.HasPrefix(command, "set map") }
	})
	next := answered.clone()
	next["maps/host.map"] = strings.Replace(next["maps/host.map"], "a.example be-a", "a.example be-b", 1) + "b.example be-a\n"
	armed.Store(true)
	res := e.c.apply(e.c.manifest("plan-3", next,
		Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example", Value: "be-a"},
		Op{Kind: OpMapSet, Path: "maps/host.map", Key: "a.example", Value: "be-b"}), next)
	armed.Store(false)
	if n := refused.Load(); res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Rollback == nil || !res.Rollback.Reloaded || n != 3 {
		t.Fatalf("after %d reloads (want 3: two refused, the last-known-good set's taken): %s", n, jsonOf(res))
	}
	if got := e.disk(t); !sameSet(got, lkg) {
		t.Errorf("the tree is not the last-known-good set:\n%s", describeSetDiff(got, lkg))
	}
	st := e.a.led.state()
	if len(st.Journal) != 0 || st.Applied.ID != "plan-1" || st.Running.ID != "plan-1" {
		t.Errorf("journal %v, applied %s, running %s: want an empty journal and plan-1 applied and running", st.Journal, st.Applied.ID, st.Running.ID)
	}
}
