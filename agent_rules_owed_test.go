// This file owns the tests that pin the rules of the agent's failure and
// retry paths which a hand-made mutant set could break with every other
// test still green: a record the disk would neither sync nor cut off, an
// owed reload HAProxy refuses, a second debt in one agent's life, the links
// a pending reload's undo needs across a compaction, a record refused by a
// full log, a large patch's replacement against the record's inline budget,
// and what a failed apply's undo could not put back. Each drives the agent
// through its API over a disk that refuses what the case needs, and heals
// it; none waits on a fixed sleep.

package haptic

import (
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// owedEnv is an agent over a hookDisk, with a metrics listener, and the
// seed set landed as plan-1 by a reload. prepare runs on the agent before
// Run (where beforeReload is set without racing it).
func owedEnv(t *testing.T, prepare func(*Agent)) (*testEnv, *hookDisk) {
	t.Helper()
	d := &hookDisk{}
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	cfg.MetricsListen = "127.0.0.1:0"
	loadOnReload(fake, cfg.BaseDir)
	a, stop := launchAgentWith(t, cfg, agentOptions{disk: d}, prepare, true)
	e := &testEnv{fake: fake, a: a, c: newAgentClient(t, a), cfg: cfg, stop: stop}
	e.land(t, "plan-1", seedFiles())
	return e, d
}

// readyzSays fails the test unless /readyz answers code with a body that
// starts with prefix.
func readyzSays(t *testing.T, a *Agent, what string, code int, prefix string) {
	t.Helper()
	if got, body := getText(t, a, PathReadyz); got != code || !strings.HasPrefix(body, prefix) {
		t.Errorf("%s: readyz %d %q, want %d %q…", what, got, body, code, prefix)
	}
}

// awaitReady waits, sending nothing but GET /readyz, until the agent says
// it is ready, and fails the test if it does not within awaitReadyz's
// deadline.
func awaitReady(t *testing.T, a *Agent, what string) {
	t.Helper()
	if code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK {
		t.Fatalf("%s: readyz %d %q, want 200 with no request", what, code, body)
	}
}

// retryRuns reports whether the loop that pays what the disk owes runs.
func retryRuns(a *Agent) bool {
	a.deps.applyMu.Lock()
	defer a.deps.applyMu.Unlock()
	return a.deps.retrying
}

// A counted apply (file_only here) whose record's sync fails and which the
// disk would not even cut off (the truncation fails too) may count at the
// next start, which replays the record: it is answered 503, outcome
// unknown, never 200 ok:false, which a controller takes as a refusal and
// acts on as if nothing had landed.
func TestARecordThatCouldNotBeCutOffIsOfUnknownOutcome(t *testing.T) {
	e, d := owedEnv(t, nil)
	next := seedFiles()
	next["notes/kept.txt"] = "kept?\n"
	m := e.c.manifest("plan-2", next)
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)
	var healed atomic.Bool
	d.setHook(func(op diskOp) error {
		if !healed.Load() && op.Path == logPath && (op.Op == "sync" || op.Op == "truncate") {
			return &fs.PathError{Op: op.Op, Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	defer healed.Store(true)
	code, body := e.c.post(applyRequest{manifest: m, files: next})
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), msgOutcomeUnknown) ||
		!strings.Contains(string(body), errRecordKept.Error()) {
		t.Errorf("an apply whose record could be neither synced nor cut off: %d %s", code, body)
	}
}

// An owed install paid once the disk heals, on a worker that started
// while it was owed, is reloaded; HAProxy refuses that reload. A refusal
// is a verdict (the worker serves on): the debt is paid, the agent is
// ready with no request, and no further reload is tried. Retried as if it
// had no verdict, the agent would reload every second and never be ready.
func TestAnOwedReloadHAProxyRefusesIsNotRetriedForever(t *testing.T) {
	e, d := owedEnv(t, nil)
	heal := refuseRenamesOnto(d, filepath.Join(e.a.files.base, "maps/host.map"))
	next, op := mapEntryChange(seedFiles(), "owed.example", "be-a")
	if res := e.c.apply(e.c.manifest("plan-2", next, op), next); !res.OK || res.Error == nil {
		t.Fatalf("the ACK whose install the disk refuses: %s", jsonOf(res))
	}
	awaitReadBacks(e.a)
	readyzSays(t, e.a, "while the install is owed", http.StatusServiceUnavailable, msgDiskBehind)
	newWorker(e.fake, false) // HAProxy restarted meanwhile, loading the tree without the owed map
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	reloads := fakeReloads(e.fake)
	heal()
	awaitReady(t, e.a, "once the disk takes the owed map, HAProxy refusing its reload")
	if got := fakeReloads(e.fake); got != reloads+1 || retryRuns(e.a) {
		t.Errorf("%d reloads since the heal, the retry loop running: %v; want one reload and no loop", got-reloads, retryRuns(e.a))
	}
	if !sameSet(e.disk(t), next) {
		t.Errorf("the owed map is not in place:\n%s", describeSetDiff(e.disk(t), next))
	}
}

// Each debt in one agent's life is retried on its own: the loop that paid
// the first one ends, and the second debt starts a new one. Each time the
// agent is ready again once the disk heals, with no request, and the tree
// is the ACKed set.
func TestEachDebtStartsItsOwnRetry(t *testing.T) {
	e, d := owedEnv(t, nil)
	mapPath := filepath.Join(e.a.files.base, "maps/host.map")
	set := seedFiles()
	for i, key := range []string{"first.example", "second.example"} {
		what := fmt.Sprintf("debt %d", i+1)
		heal := refuseRenamesOnto(d, mapPath)
		next, op := mapEntryChange(set, key, "be-a")
		if res := e.c.apply(e.c.manifest(fmt.Sprintf("plan-%d", i+2), next, op), next); !res.OK || res.Error == nil {
			t.Fatalf("%s: the ACK whose install the disk refuses: %s", what, jsonOf(res))
		}
		readyzSays(t, e.a, what+", owed", http.StatusServiceUnavailable, msgDiskBehind)
		heal()
		awaitReady(t, e.a, what+", healed")
		if !sameSet(e.disk(t), next) {
			t.Errorf("%s: the owed map is not in place:\n%s", what, describeSetDiff(e.disk(t), next))
		}
		set = next
	}
}

// A reload is scheduled (plan-3, changing the map a runtime apply changed
// since the last reload, and the config), then the log is compacted, whose
// sweep removes the links no record needs. HAProxy then refuses the
// scheduled reload: the files go back as the pending reload's applies found
// them, from the links its undo names, which the sweep must have kept (the
// journal names the map's older bytes, not these).
func TestACompactionKeepsTheLinksAPendingReloadsUndoNeeds(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	mid, op := mapEntryChange(set, "mid.example", "be-a")
	if res := e.land(t, "plan-2", mid, op); res.Mode != ResultRuntime {
		t.Fatalf("plan-2: %s", jsonOf(res))
	}
	awaitReadBacks(e.a)
	next := mid.clone()
	next[ConfigFilePath] += "# 3\n"
	next["maps/host.map"] += "late.example be-c\n"
	if res := e.c.apply(reloadManifest(e, "plan-3", next), next); res.Mode != ResultScheduled {
		t.Fatalf("plan-3: %s", jsonOf(res))
	}
	e.a.deps.applyMu.Lock()
	err := e.a.deps.compact()
	e.a.deps.applyMu.Unlock()
	if err != nil {
		t.Fatalf("the compaction: %v", err)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	e.a.clockOffset.Store(int64(2 * time.Minute))
	var la *ApplyResult
	waitFor(t, "the scheduled reload's verdict", func() bool {
		la = e.c.state("?plan=0").LastApply
		return la != nil && la.Mode == ResultRejected
	})
	if la.Rollback == nil || !la.Rollback.Performed || !sameSet(e.disk(t), mid) {
		t.Errorf("the refused scheduled reload: %s; the tree:\n%s", jsonOf(la), describeSetDiff(e.disk(t), mid))
	}
}

// A record refused because the log holds as much as a start reads wrote
// nothing: the log is not broken (nothing it held unsynced can have been
// dropped), only due for the compaction the full disk refuses. So /readyz
// says the log cannot be compacted, the broken-log gauge stays 0, and once
// a snapshot can be written the agent is ready again. The log fills while
// HAProxy reloads a reload apply, between its record and its end record.
func TestARecordRefusedByAFullLogLeavesTheLogWhole(t *testing.T) {
	var fill atomic.Bool
	e, d := owedEnv(t, func(a *Agent) {
		a.deps.beforeReload = func() {
			if fill.Load() {
				a.led.mu.Lock()
				a.led.log.count = maxLogReadRecords
				a.led.mu.Unlock()
			}
		}
	})
	var refuseSnapshots atomic.Bool
	refuseSnapshots.Store(true)
	d.setHook(func(op diskOp) error {
		if refuseSnapshots.Load() && op.Op == "sync" && strings.HasPrefix(filepath.Base(op.Path), strings.TrimSuffix(stateTempPattern, "*")) {
			return &fs.PathError{Op: "fsync", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	defer refuseSnapshots.Store(false)
	fill.Store(true)
	next := seedFiles()
	next[ConfigFilePath] += "# 2\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", next), next); !res.OK || res.Mode != ResultReload {
		t.Fatalf("the reload apply: %s", jsonOf(res))
	}
	fill.Store(false)
	// The compaction runs after the answer, before the apply lock is
	// released: once the lock is taken, it has failed.
	e.a.deps.applyMu.Lock()
	e.a.deps.applyMu.Unlock()
	readyzSays(t, e.a, "a full log the disk will not compact", http.StatusServiceUnavailable, msgLogStuck)
	if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_state_log_broken 0\n") {
		t.Error("the gauge says the log is broken")
	}
	refuseSnapshots.Store(false)
	awaitReady(t, e.a, "once a snapshot can be written")
}

// A patch whose result is too large to ride in the record but whose
// replacement is not rides as its replacement, and that replacement is
// charged to the record's inline budget like a small part: once the budget
// cannot hold the next one, that patch's result is staged whole, synced,
// and the record never carries more than the budget.
func TestALargePatchsReplacementIsChargedToTheRecord(t *testing.T) {
	ts := newTestStore(t, nil)
	base := bigHostMap(2*maxInlineBytes, "be-a", 0)
	n := maxInlineBytes / 2
	repl := strings.Repeat("r", n)
	want := repl + base[n:]
	p := &FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)), Offset: 0, Length: int64(n)}
	left := n + n/2 // room for one replacement, not two
	var staged []*stagedFile
	for _, rel := range []string{"maps/a.map", "maps/b.map"} {
		ts.write(t, rel, base)
		f, err := ts.stage(rel, strings.NewReader(repl), p, DigestString(want), int64(len(want)), heldOf(base), &left)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		defer f.discard(ts.disk)
		if got := ts.stagedBytes(t, f); got != want {
			t.Fatalf("%s: staged %d bytes, not the patched map", rel, len(got))
		}
		staged = append(staged, f)
	}
	if first := staged[0]; len(first.repl) != n || first.tmp != "" || left != n/2 {
		t.Errorf("the first patch: %d replacement bytes in the record, staged whole %t, %d bytes of budget left; want %d, false, %d",
			len(first.repl), first.tmp != "", left, n, n/2)
	}
	if second := staged[1]; second.repl != nil || second.tmp == "" {
		t.Errorf("the second patch, past the budget: %d replacement bytes in the record, staged whole %t; want none, staged whole",
			len(second.repl), second.tmp != "")
	}
}

// A reload apply HAProxy refuses is undone, but the disk refuses the
// rename that puts the config back. What the undo could not put back is
// owed: the agent is not ready and says why, and once the disk heals the
// old config is back, with no new push.
func TestWhatAFailedApplysUndoCouldNotPutBackIsOwed(t *testing.T) {
	var refusing, armed atomic.Bool
	e, d := owedEnv(t, func(a *Agent) {
		a.deps.beforeReload = func() { refusing.Store(armed.Load()) }
	})
	set := seedFiles()
	cfgPath := filepath.Join(e.a.files.base, ConfigFilePath)
	d.setHook(func(op diskOp) error {
		if refusing.Load() && (op.Op == "exchange" || op.Op == "rename") && op.Path == cfgPath {
			return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	defer refusing.Store(false)
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	next := set.clone()
	next[ConfigFilePath] += "bogus\n"
	armed.Store(true) // the install goes in; from the reload on, the config stays as it is
	res := e.c.apply(reloadManifest(e, "plan-2", next), next)
	armed.Store(false)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Rollback == nil || res.Rollback.Performed {
		t.Fatalf("the refused reload whose undo the disk refuses: %s", jsonOf(res))
	}
	readyzSays(t, e.a, "the undo owed", http.StatusServiceUnavailable, msgDiskBehind)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	refusing.Store(false)
	awaitReady(t, e.a, "once the disk takes the undo")
	if !sameSet(e.disk(t), set) {
		t.Errorf("the tree once the undo is paid:\n%s", describeSetDiff(e.disk(t), set))
	}
}
