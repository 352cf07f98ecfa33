// Tests of what runs after or between applies, and of the agent-level
// surfaces around them: patches, the worker baseline an apply must prove,
// op batches, the pacing of reloads and the pacer, the read-back, deferred
// deletes driven through an apply, and the agent's side of the drain, the
// metrics and the invariants. All run against the fake HAProxy.

package haptic

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Patches.

// patchOf describes new as a splice of old: the common prefix and suffix
// are kept, the middle travels.
func patchOf(old, new string) (*FilePatch, string) {
	p := 0
	for p < len(old) && p < len(new) && old[p] == new[p] {
		p++
	}
	s := 0
	for s < len(old)-p && s < len(new)-p && old[len(old)-1-s] == new[len(new)-1-s] {
		s++
	}
	return &FilePatch{BaseDigest: DigestString(old), BaseSize: int64(len(old)), Offset: int64(p), Length: int64(len(old) - p - s)},
		new[p : len(new)-s]
}

// patched composes a reload manifest whose config travels as a patch.
func patched(e *testEnv, planID string, old, fs fileSet) (*Manifest, map[string]string) {
	m := reloadManifest(e, planID, fs)
	override := map[string]string{}
	for i, f := range m.Files {
		if f.Path == ConfigFilePath {
			patch, repl := patchOf(old[f.Path], fs[f.Path])
			m.Files[i].Patch = patch
			override[f.Path] = repl
		}
	}
	return m, override
}

func TestPatchedConfigIsSplicedIntoTheHeldFile(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	if st := e.c.state(""); !slices.Contains(st.Features, FeatureFilePatch) {
		t.Fatalf("features %v", st.Features)
	}
	fs2 := fs.clone()
	fs2["haproxy.cfg"] = strings.Replace(fs["haproxy.cfg"], "maxconn 100", "maxconn 20000", 1)
	m, override := patched(e, "plan-2", fs, fs2)
	if p := m.Files[0].Patch; p.Offset == 0 || p.Offset+p.Length == p.BaseSize {
		t.Fatalf("the test patch is not mid-file: %+v", p)
	}
	code, body := e.c.post(applyRequest{manifest: m, files: fs2, override: override, omit: map[string]bool{"maps/host.map": true}})
	if code != 200 || !strings.Contains(string(body), `"ok":true`) {
		t.Fatalf("%d %s", code, body)
	}
	if got := e.disk(t); got["haproxy.cfg"] != fs2["haproxy.cfg"] {
		t.Errorf("config %q", got["haproxy.cfg"])
	}
	if st := e.c.state("?verify=1"); st.Files["haproxy.cfg"].Digest != DigestString(fs2["haproxy.cfg"]) ||
		st.Files["haproxy.cfg"].Proof != testProof(fs2["haproxy.cfg"]) {
		t.Errorf("tree %+v", st.Files["haproxy.cfg"])
	}
}

func TestPatchWhoseBaseIsNotHeldAsksForTheWholeFile(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# patched\n"
	m, override := patched(e, "plan-2", fs, fs2)
	m.Files[0].Patch.BaseDigest = DigestString("something else")
	before := e.snapshot(t)
	code, body := e.c.post(applyRequest{manifest: m, files: fs2, override: override, omit: map[string]bool{"maps/host.map": true}})
	var miss Missing
	json.Unmarshal(body, &miss)
	if code != 409 || !slices.Equal(miss.Missing, []string{"haproxy.cfg"}) {
		t.Errorf("%d %s", code, body)
	}
	e.unchanged(t, before)
}

func TestPatchThatDoesNotFitItsBaseIsRefused(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# patched\n"
	base := int64(len(fs["haproxy.cfg"]))
	overflowing := int64(math.MaxInt64) - (int64(len(fs2["haproxy.cfg"])) - base)
	for name, tc := range map[string]struct {
		mutate func(p *FilePatch, override map[string]string)
		want   string
	}{
		"offset past the base": {func(p *FilePatch, _ map[string]string) { p.Offset = p.BaseSize + 1 },
			fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length 0, base %d bytes`, len(fs["haproxy.cfg"])+1, len(fs["haproxy.cfg"]))},
		"negative length": {func(p *FilePatch, _ map[string]string) { p.Length = -1 }, "does not fit its base"},
		// offset + length wraps negative while the replacement length
		// (size - base + length) stays representable.
		"offset plus length overflowing": {func(p *FilePatch, _ map[string]string) { p.Offset, p.Length = base, overflowing },
			fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length %d, base %d bytes`, base, overflowing, base)},
		"wrong bytes": {func(_ *FilePatch, o map[string]string) { o["haproxy.cfg"] = strings.ToUpper(o["haproxy.cfg"]) },
			"manifest digest"},
	} {
		t.Run(name, func(t *testing.T) {
			m, override := patched(e, "plan-2", fs, fs2)
			tc.mutate(m.Files[0].Patch, override)
			before := e.snapshot(t)
			code, body := e.c.post(applyRequest{manifest: m, files: fs2, override: override, omit: map[string]bool{"maps/host.map": true}})
			if ae := applyErr(t, body); code != 400 || ae.Stage != StageParts || !strings.Contains(ae.Message, tc.want) ||
				strings.Contains(ae.Message, e.cfg.BaseDir) {
				t.Errorf("%d %+v", code, ae)
			}
			e.unchanged(t, before)
		})
	}
}

func TestARefusedSetIsKnownBadHoweverItArrives(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2); res.OK {
		t.Fatalf("%+v", res)
	}
	m, override := patched(e, "plan-2", fs, fs2)
	code, body := e.c.post(applyRequest{manifest: m, files: fs2, override: override})
	var res ApplyResult
	json.Unmarshal(body, &res)
	if code != 200 || res.OK || metricValue(e.a, "reloads_total", "failed") != 1 {
		t.Errorf("the patched resend reached HAProxy: %d %s", code, body)
	}
}

// ---------------------------------------------------------------------------
// The worker baseline.

func TestRuntimeAndFileOnlyApplyRequireExactWorkerBaseline(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "w.example be-w\n"
	fs3 := fs.clone()
	fs3["notes/x.txt"] = "x\n"
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "w.example", Value: "be-w"}
	for _, tc := range []struct {
		name   string
		fs     fileSet
		ops    []Op
		mutate func(m *Manifest)
	}{
		{"runtime, wrong id", fs2, []Op{op}, func(m *Manifest) { m.ExpectedWorkerOpsPlanID = "plan-0" }},
		{"runtime, wrong proof", fs2, []Op{op}, func(m *Manifest) { m.ExpectedWorkerOpsPlanProof = "a:42" }},
		{"file_only, wrong id", fs3, nil, func(m *Manifest) { m.ExpectedWorkerOpsPlanID = "plan-0" }},
		{"file_only, wrong proof", fs3, nil, func(m *Manifest) { m.ExpectedWorkerOpsPlanProof = "a:42" }},
	} {
		before := e.snapshot(t)
		m := e.c.manifest("plan-2", tc.fs, tc.ops...)
		tc.mutate(m)
		code, body := e.c.post(applyRequest{manifest: m, files: tc.fs})
		var c Conflict
		json.Unmarshal(body, &c)
		if code != 409 || c.Reason != ReasonWorkerOpsMismatch {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		e.unchanged(t, before)
	}
}

func TestFileOnlyApplyAcrossScheduledReloadRequiresRediff(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Second }, nil)
	_, fs2, _ := e.landThenSchedule(t)
	before := e.c.state("")
	fs3 := fs2.clone()
	fs3["maps/host.map"] += "r.example be-r\n"
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "r.example", Value: "be-r"}
	stale := e.c.manifestFrom(before, "plan-3", fs3, op)
	waitFor(t, "the scheduled reload", func() bool { return e.c.state("").RunningPlanID == "plan-2" })
	after := e.c.state("")
	if after.WorkerOpsPlanProof == before.WorkerOpsPlanProof || after.WorkerOpsPlanID != "plan-2" ||
		after.AppliedPlanProof != before.AppliedPlanProof || after.RunningPlanID != "plan-2" {
		t.Fatalf("before %+v\nafter %+v", before, after)
	}
	code, body := e.c.post(applyRequest{manifest: stale, files: fs3})
	var c Conflict
	json.Unmarshal(body, &c)
	if code != 409 || c.Reason != ReasonWorkerOpsMismatch {
		t.Fatalf("stale: %d %s", code, body)
	}
	pid := e.fake.Worker().WorkerPID
	res := e.c.apply(e.c.manifest("plan-3", fs3, op), fs3)
	if !res.OK || res.Mode != ResultRuntime || e.fake.Worker().WorkerPID != pid {
		t.Errorf("rediffed: %+v", res)
	}
}

func TestAutomaticApplyWithoutWorkerProofReloads(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	pid := e.fake.Worker().WorkerPID
	fs2 := fs.clone()
	fs2["maps/host.map"] += "n.example be-n\n"
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "n.example", Value: "be-n"})
	m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof = "", ""
	res := e.c.apply(m, fs2)
	if res.Mode != ResultReload || len(res.OpResults) != 0 || e.fake.Worker().WorkerPID == pid {
		t.Errorf("%+v", res)
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "add map") {
			t.Errorf("the op was sent: %q", cmd)
		}
	}
}

func TestAutomaticInPlaceApplyWithoutWorkerProofIsRejected(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	m := e.c.manifest("plan-2", fs)
	m.InPlaceOps = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "v"}}
	m.WorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof = "plan-2w", ""
	before := e.snapshot(t)
	code, body := e.c.post(applyRequest{manifest: m, files: fs})
	if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != "in-place ops need an exact expected worker plan proof" {
		t.Errorf("%d %+v", code, ae)
	}
	e.unchanged(t, before)
}

// ---------------------------------------------------------------------------
// Batches.

func TestRuntimeBatchesDeleteAMapWithoutPartialReadBack(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	var b strings.Builder
	for i := range 1001 {
		fmt.Fprintf(&b, "k%04d v\n", i)
	}
	fs["maps/big.map"] = b.String()
	e.land(t, "plan-1", fs)
	pid := e.fake.Worker().WorkerPID
	fs2 := fs.clone()
	fs2["maps/big.map"] = ""
	var ops []Op
	for i := range 1001 {
		ops = append(ops, Op{Kind: OpMapDel, Path: "maps/big.map", Key: fmt.Sprintf("k%04d", i)})
	}
	m := e.c.manifest("plan-2", fs2)
	m.Ops, m.OpBatches = ops[:1000], [][]Op{ops[1000:]}
	res := e.c.apply(m, fs2)
	if !res.OK || res.Mode != ResultRuntime || len(res.OpResults) != 1001 || e.fake.Worker().WorkerPID != pid {
		t.Fatalf("mode %s, %d results, pid %d → %d", res.Mode, len(res.OpResults), pid, e.fake.Worker().WorkerPID)
	}
	if got := e.fake.MapEntries("maps/big.map"); len(got) != 0 {
		t.Errorf("%d entries left", len(got))
	}
	awaitReadBacks(e.a)
	if metricValue(e.a, "map_divergence_total") != 0 {
		t.Error("a divergence was found")
	}
}

func TestRuntimeBatchesValidateTheFinalBatchBeforeExecutingTheFirst(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] = ""
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapDel, Path: "maps/host.map", Key: "example.com"})
	m.OpBatches = [][]Op{{{Kind: OpMapDel, Path: "maps/host.map", Key: "bad key"}}}
	res := e.c.apply(m, fs2)
	if res.Mode != ResultReload || len(res.OpResults) != 0 {
		t.Errorf("%+v", res)
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "del map") {
			t.Errorf("the first batch ran: %q", cmd)
		}
	}
}

func TestRejectedFinalBatchClearsThePartialWorkerBaseline(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] = "example.com be-a\nfirst.example be-1\nsecond.example be-2\n"
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-a"})
	// The worker lacks second.example, so set map refuses it: "entry not found".
	m.OpBatches = [][]Op{{{Kind: OpMapAdd, Path: "maps/host.map", Key: "first.example", Value: "be-1"},
		{Kind: OpMapSet, Path: "maps/host.map", Key: "second.example", Value: "be-2"}}}
	res := e.c.apply(m, fs2)
	if !res.OK || res.Mode != ResultScheduled || res.Reload == nil || res.Reload.ScheduledAt == "" {
		t.Fatalf("%+v", res)
	}
	if res.WorkerOpsPlanID != "" || res.WorkerOpsPlanProof != "" {
		t.Errorf("worker baseline %q %q", res.WorkerOpsPlanID, res.WorkerOpsPlanProof)
	}
	if metricValue(e.a, "op_errors_total", OpMapSet) != 1 {
		t.Error("op_errors_total{map_set}")
	}
}

// ---------------------------------------------------------------------------
// Pacing.

func TestAScheduledReloadCoalescesAndRunsInPlaceOps(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	pid := e.fake.Worker().WorkerPID
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	res2 := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	st := e.c.state("")
	if res2.Mode != ResultScheduled || res2.Reload == nil || res2.Reload.Performed || res2.Reload.ScheduledAt != st.ReloadPendingAt {
		t.Fatalf("second: %+v %+v, pending %q", res2, res2.Reload, st.ReloadPendingAt)
	}
	if due, err := time.Parse(time.RFC3339Nano, st.ReloadPendingAt); err != nil || due.Nanosecond() == 0 || due.Location() != time.UTC {
		t.Errorf("reload_pending_at %q: %v", st.ReloadPendingAt, err)
	}
	fs3 := fs2.clone()
	fs3["maps/host.map"] += "ip.example be-ip\n"
	fs3["notes/third.txt"] = "3\n"
	m := e.c.manifest("plan-3", fs3)
	m.InPlaceOps, m.WorkerOpsPlanID = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "ip.example", Value: "be-ip"}}, "plan-3w"
	res3 := e.c.apply(m, fs3)
	if !res3.OK || res3.Mode != ResultScheduled || res3.Reload.ScheduledAt != res2.Reload.ScheduledAt || res3.Error != nil {
		t.Fatalf("third: %+v %+v", res3, res3.Error)
	}
	if res3.WorkerOpsPlanID != "plan-3w" || res3.WorkerOpsPlanProof != "a:4" || len(res3.OpResults) != 1 {
		t.Errorf("worker baseline %q %q, results %v", res3.WorkerOpsPlanID, res3.WorkerOpsPlanProof, res3.OpResults)
	}
	if got := e.fake.MapEntries("maps/host.map"); len(got) != 2 || e.fake.Worker().WorkerPID != pid {
		t.Errorf("worker map %v", got)
	}
	if !sameSet(e.disk(t), fs3) {
		t.Error("the third apply's files did not land")
	}
	ps := readStateFile(t, e.cfg.BaseDir)
	if ps.Pending != (planRef{"plan-3", "a:3"}) || ps.PendingAt.UTC().Format(time.RFC3339Nano) != st.ReloadPendingAt {
		t.Errorf("pending %+v", ps)
	}
}

// TestAnInPlaceOpOnAStaleWorkerBaselineInvalidatesThePod: a worker check
// (a verified read's, which does not wait for the apply lock) invalidates
// the baseline after the fence passed, while the apply installs its files.
// The in-place op is then not run: the apply stays scheduled, reports the
// stale baseline at stage in_place, lands no plan, and causes no second
// reload.
func TestAnInPlaceOpOnAStaleWorkerBaselineInvalidatesThePod(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute })
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	reloads := fakeReloads(e.fake)

	fs3 := fs2.clone()
	fs3["maps/host.map"] += "s.example be-s\n"
	m := e.c.manifest("plan-3", fs3)
	m.InPlaceOps, m.WorkerOpsPlanID = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "s.example", Value: "be-s"}}, "plan-3w"
	var once sync.Once
	d.setHook(func(op diskOp) error {
		if op.Op == "exchange" && strings.HasSuffix(op.Path, "/maps/host.map") {
			once.Do(func() { e.a.led.invalidate() })
		}
		return nil
	})
	res := e.c.apply(m, fs3)
	if !res.OK || res.Mode != ResultScheduled || res.Error == nil || res.Error.Stage != StageInPlace ||
		res.Error.Message != msgInPlaceStale || res.AppliedPlanID != "" {
		t.Errorf("%+v %+v", res, res.Error)
	}
	if n := fakeReloads(e.fake); n != reloads {
		t.Errorf("a second reload: %d → %d", reloads, n)
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "add map") {
			t.Errorf("the in-place op was sent: %q", cmd)
		}
	}
}

func TestAFallbackReloadInsideTheWindowRunsNoInPlaceOps(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "rejected.example be-r\ninplace.example be-i\n"
	// set map of a key the worker lacks is refused: "entry not found".
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapSet, Path: "maps/host.map", Key: "rejected.example", Value: "be-r"})
	m.InPlaceOps, m.WorkerOpsPlanID = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "inplace.example", Value: "be-i"}}, "plan-2w"
	res := e.c.apply(m, fs2)
	if !res.OK || res.Mode != ResultScheduled || res.Error != nil {
		t.Fatalf("%+v", res)
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "add map") {
			t.Errorf("an in-place op ran after a fallback: %q", cmd)
		}
	}
}

func TestTheScheduledReloadFiresWhenTheWindowPasses(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = 500 * time.Millisecond }, nil)
	_, _, res2 := e.landThenSchedule(t)
	// The reload records the running plan before the pacer records its
	// result in last_apply: wait for both.
	waitFor(t, "the pacer", func() bool {
		st := e.c.state("")
		return st.RunningPlanID == "plan-2" && st.LastApply != nil && st.LastApply.Mode == ResultReload
	})
	st := e.c.state("")
	if st.ReloadPendingAt != "" || st.Generation != 2 || st.LKGPlanID != "plan-2" || st.WorkerOpsPlanID != "plan-2" {
		t.Errorf("state %+v", st)
	}
	if la := st.LastApply; la == nil || la.PlanID != "plan-2" || !la.OK || la.Mode != ResultReload || la.Reload == nil ||
		!la.Reload.Performed || res2.Reload == nil || res2.Reload.Performed {
		t.Errorf("last_apply %+v", la)
	}
	if metricValue(e.a, "apply_total", ResultReload) != 2 {
		t.Error("apply_total{reload}")
	}
}

// A scheduled reload HAProxy refuses puts back the tree the pending
// reload's applies found, and the baseline they began with: the previous
// worker kept serving it.
func TestAFailedScheduledReloadRestoresTheBaselineItsAppliesFound(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = 500 * time.Millisecond }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	fs2["notes/new.txt"] = "n\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2); res.Mode != ResultScheduled {
		t.Fatalf("%+v", res)
	}
	waitFor(t, "the pacer", func() bool {
		la := e.c.state("").LastApply
		return la != nil && !la.OK
	})
	st := e.c.state("")
	if la := st.LastApply; la.PlanID != "plan-2" || la.Mode != ResultRejected || la.Error == nil || la.Error.Stage != StageScheduledReload {
		t.Errorf("last_apply %+v", la)
	}
	if st.AppliedPlanID != "plan-1" || st.LKGPlanID != "plan-1" || st.RunningPlanID != "plan-1" || st.ReloadPendingAt != "" || st.Generation != 2 {
		t.Errorf("state %+v", st)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("tree %v", e.disk(t))
	}
	if metricValue(e.a, "apply_rejected_total", StageScheduledReload) != 1 {
		t.Error("apply_rejected_total{scheduled_reload}")
	}
}

// A failed pacer reload is a finished transaction: the state says idle, so
// the next start runs no crash recovery (no reload, no invalidation) for an
// apply that was never interrupted. The agent is killed, not stopped: a
// clean stop compacts the log away, and only a start that replays the log
// can show that its records close what they opened.
func TestAFailedScheduledReloadLeavesNoTransactionForTheNextStart(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = 500 * time.Millisecond }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2); res.Mode != ResultScheduled {
		t.Fatalf("%+v", res)
	}
	waitFor(t, "the pacer", func() bool {
		la := e.c.state("").LastApply
		return la != nil && !la.OK
	})
	if ps := readStateFile(t, e.cfg.BaseDir); ps.ReloadOwed || ps.LastApply == nil || ps.LastApply.OK {
		t.Errorf("state file: reload owed %v, last_apply %+v", ps.ReloadOwed, ps.LastApply)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	var reloads int
	e.fake.With(func(m *FakeModel) { reloads = m.Reloads })
	worker := e.fake.Worker()
	e.killAndRestart(t)
	e.fake.With(func(m *FakeModel) {
		if m.Reloads != reloads {
			t.Errorf("the restart reloaded HAProxy (%d reloads, then %d): a crash recovery ran", reloads, m.Reloads)
		}
	})
	if e.fake.Worker() != worker || !sameSet(e.disk(t), fs) {
		t.Error("the restart changed the worker or the tree")
	}
	if st := e.c.state(""); st.RunningPlanID != "plan-1" || st.LKGPlanID != "plan-1" {
		t.Errorf("state after restart %+v", st)
	}
}

// scheduledThenStopped lands plan-1, schedules a reload of plan-2 (whose
// files are then on disk) and stops the agent, so that only the test calls
// firePendingReload; the pending reload is then due. hook, if set, runs
// before every reload.
func scheduledThenStopped(t *testing.T, hook func()) (e *testEnv, fs2 fileSet) {
	t.Helper()
	e = newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, func(a *Agent, _ *FakeHAProxy) {
		a.deps.beforeReload = hook
	})
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 = fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2); res.Mode != ResultScheduled {
		t.Fatalf("%+v", res)
	}
	e.stop()
	e.a.clockOffset.Store(int64(2 * time.Minute))
	return e, fs2
}

// untouchedByThePacer checks that firePendingReload changed nothing: the
// accepted files stay, HAProxy was not reloaded (when reloads is >= 0), and
// the scheduled apply is still the last result, still pending.
func untouchedByThePacer(t *testing.T, e *testEnv, fs2 fileSet, reloads int) {
	t.Helper()
	if !sameSet(e.disk(t), fs2) {
		t.Errorf("the accepted plan-2 files were rolled back: %v", e.disk(t))
	}
	if reloads >= 0 {
		e.fake.With(func(m *FakeModel) {
			if m.Reloads != reloads {
				t.Errorf("HAProxy was reloaded: %d reloads, then %d", reloads, m.Reloads)
			}
		})
	}
	ps := readStateFile(t, e.cfg.BaseDir)
	if ps.LastApply == nil || ps.LastApply.PlanID != "plan-2" || ps.LastApply.Mode != ResultScheduled ||
		ps.Applied.ID != "plan-2" || ps.Pending.ID != "plan-2" {
		t.Errorf("state file %+v, last_apply %+v", ps, ps.LastApply)
	}
}

// endsWhileWaiting is a context that is live when first asked and ended
// from then on: the pacer passed its first check, then shutdown began
// while it waited for the apply lock.
type endsWhileWaiting struct {
	context.Context
	checks atomic.Int32
}

func (c *endsWhileWaiting) Err() error {
	if c.checks.Add(1) > 1 {
		return context.Canceled
	}
	return nil
}

// The pacer's select may pick its ticker after shutdown began; a reload
// tried then would fail on the ended context and its abort would roll back
// files an apply had accepted. Once shutdown has begun the pacer fires
// nothing: the files stay and the reload stays pending.
func TestThePacerDoesNotFireOnceShutdownHasBegun(t *testing.T) {
	t.Run("ended before the pacer wakes", func(t *testing.T) {
		e, fs2 := scheduledThenStopped(t, nil)
		var reloads int
		e.fake.With(func(m *FakeModel) { reloads = m.Reloads })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		e.a.fireScheduled(ctx)
		untouchedByThePacer(t, e, fs2, reloads)
		if pending := e.a.led.state().Pending; pending.ID != "plan-2" {
			t.Errorf("the pending reload was consumed: %+v", pending)
		}
	})
	t.Run("ended while it waits for the apply lock", func(t *testing.T) {
		e, fs2 := scheduledThenStopped(t, nil)
		var reloads int
		e.fake.With(func(m *FakeModel) { reloads = m.Reloads })
		e.a.fireScheduled(&endsWhileWaiting{Context: context.Background()})
		untouchedByThePacer(t, e, fs2, reloads)
		if pending := e.a.led.state().Pending; pending.ID != "plan-2" {
			t.Errorf("the pending reload was consumed: %+v", pending)
		}
	})
	t.Run("ended during the reload", func(t *testing.T) {
		var cancel atomic.Pointer[context.CancelFunc]
		e, fs2 := scheduledThenStopped(t, func() {
			if f := cancel.Load(); f != nil {
				(*f)()
			}
		})
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		cancel.Store(&stop)
		e.a.fireScheduled(ctx)
		// The reload was cut short with no verdict: nothing is rolled back
		// and no result is recorded.
		untouchedByThePacer(t, e, fs2, -1)
	})
}

// TestAnAbortKeepsThePendingReloadOfTheAppliesBeforeIt: an apply that
// joins a pending reload and fails puts back only its own files; the
// scheduled apply before it was answered, and its files and its pending
// reload stay.
func TestAnAbortKeepsThePendingReloadOfTheAppliesBeforeIt(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	_, fs2, scheduled := e.landThenSchedule(t)
	fs3 := fs2.clone()
	fs3["blocked/file.txt"] = "x\n"
	fs3["maps/host.map"] += "three.example be-3\n"
	os.MkdirAll(filepath.Join(e.cfg.BaseDir, "blocked/file.txt"), 0o755)
	res := e.c.apply(e.c.manifest("plan-3", fs3), fs3)
	if res.OK || res.Error == nil || res.Error.Stage != StageWrite || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("%+v %+v", res, res.Error)
	}
	if st := e.c.state(""); st.ReloadPendingAt != scheduled.Reload.ScheduledAt || st.AppliedPlanID != "plan-2" {
		t.Errorf("pending %q applied %q", st.ReloadPendingAt, st.AppliedPlanID)
	}
	if ps := readStateFile(t, e.cfg.BaseDir); ps.Pending.ID != "plan-2" {
		t.Errorf("state file pending %+v", ps.Pending)
	}
	if got := e.disk(t); !sameSet(got, fs2) {
		t.Errorf("tree %v", got)
	}
}

// ---------------------------------------------------------------------------
// Read-back.

func TestADivergenceReloadPersistsTheClearedJournal(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "Out of memory.", cmd == "show map maps/host.map" }
	})
	fs2 := fs.clone()
	fs2["maps/host.map"] += "d.example be-d\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "d.example", Value: "be-d"})
	if res.Mode != ResultRuntime {
		t.Fatalf("%+v", res)
	}
	waitFor(t, "the repair", func() bool {
		return metricValue(e.a, "map_divergence_total") == 1 && len(readStateFile(t, e.cfg.BaseDir).Journal) == 0
	})
	st := e.c.state("")
	if st.RunningPlanID != "plan-2" || st.LKGPlanID != "plan-2" || st.AppliedPlanID != "plan-2" || st.InvariantViolation != "" {
		t.Errorf("state %+v", st)
	}
}

// TestReadBackDoesNotHoldUpTheNextApply: the read-back asks HAProxy for
// the map without the apply lock, so an apply sent while HAProxy answers
// slowly lands at once; and since that apply moved the applied pair, the
// read-back gives no verdict on a listing it overtook.
func TestReadBackDoesNotHoldUpTheNextApply(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	listing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if cmd == "show map maps/host.map" {
				once.Do(func() { close(listing); <-release })
			}
			return "", false
		}
	})
	fs2 := fs.clone()
	fs2["maps/host.map"] += "r.example be-r\n"
	e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "r.example", Value: "be-r"})
	<-listing
	fs3 := fs2.clone()
	fs3["maps/host.map"] += "s.example be-s\n"
	done := make(chan ApplyResult, 1)
	go func() {
		done <- e.land(t, "plan-3", fs3, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "s.example", Value: "be-s"})
	}()
	select {
	case res := <-done:
		if res.Mode != ResultRuntime {
			t.Errorf("%+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Error("the apply waited for the read-back's listing")
	}
	close(release)
	awaitReadBacks(e.a)
	if metricValue(e.a, "map_divergence_total") != 0 {
		t.Error("a divergence was found on an overtaken listing")
	}
}

func TestDivergenceCounterName(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.MetricsListen = "127.0.0.1:0" }, nil)
	text := scrape(t, e.a)
	if !strings.Contains(text, "\n# TYPE haptic_agent_map_divergence_total counter\nhaptic_agent_map_divergence_total 0\n") {
		t.Errorf("exposition:\n%s", text)
	}
}

// scrape reads GET /metrics.
func scrape(t testing.TB, a *Agent) string {
	t.Helper()
	resp, err := http.Get("http://" + a.metricsLn.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != metricsContentType {
		t.Fatalf("metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// Deferred deletes through an apply.

// seedBackend gives the fake worker a published backend with servers.
func seedBackend(fake *FakeHAProxy, name string, servers ...string) {
	fake.With(func(m *FakeModel) {
		if m.Backends == nil {
			m.Backends = map[string]*FakeBackend{}
		}
		be := &FakeBackend{Profile: "defaults", Mode: "http", Published: true}
		for _, s := range servers {
			be.Servers = append(be.Servers, &FakeServer{Name: s, Address: "10.0.0.1", Port: 80, Weight: 1, State: "ready", Enabled: true})
		}
		m.Backends[name] = be
	})
}

func TestDeferralsRemoveServersAndBackendsOffTheApplyPath(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	seedBackend(e.fake, "be-old", "s1")
	release := make(chan struct{})
	var order []string
	var mu sync.Mutex
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if strings.HasPrefix(cmd, "wait ") && strings.Contains(cmd, "srv-removable") {
				<-release
			}
			if strings.HasPrefix(cmd, "del ") {
				mu.Lock()
				order = append(order, cmd)
				mu.Unlock()
			}
			return "", false
		}
	})
	fs2 := fs.clone()
	fs2["notes/gone.txt"] = "the backend is gone\n"
	res := e.land(t, "plan-2", fs2,
		Op{Kind: OpBackendUnpublish, Backend: "be-old"},
		Op{Kind: OpServerDisable, Backend: "be-old", Server: "s1"},
		Op{Kind: OpServerWaitRemovable, Backend: "be-old", Server: "s1", TimeoutMs: 1000},
		Op{Kind: OpServerDel, Backend: "be-old", Server: "s1"},
		Op{Kind: OpBackendWaitRemovable, Backend: "be-old", TimeoutMs: 1000},
		Op{Kind: OpBackendDel, Backend: "be-old"},
	)
	// The apply answered while the queue's wait is still held.
	if res.Mode != ResultRuntime || len(res.OpResults) != 2 {
		t.Fatalf("%+v", res)
	}
	st := e.c.state("")
	if !slices.Equal(st.PendingDeletes.Servers, []string{"be-old/s1"}) || !slices.Equal(st.PendingDeletes.Backends, []string{"be-old"}) {
		t.Errorf("pending %+v", st.PendingDeletes)
	}
	if !e.fake.HasBackend("be-old") {
		t.Fatal("deleted on the apply path")
	}
	close(release)
	waitFor(t, "the deletes", func() bool { return !e.fake.HasBackend("be-old") })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{"del server be-old/s1", "del backend be-old"}) {
		t.Errorf("delete order %q", order)
	}
	waitFor(t, "the queue to empty", func() bool {
		p := e.c.state("").PendingDeletes
		return len(p.Servers) == 0 && len(p.Backends) == 0
	})
	if metricValue(e.a, "deferred_deletes_total", "server", "done") != 1 || metricValue(e.a, "deferred_deletes_total", "backend", "done") != 1 {
		t.Error("deferred_deletes_total")
	}
}

func TestDeferralsRefuseMoreThanTheCapThroughAnApply(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	var ops []Op
	for i := range MaxPendingServerDeletes + 1 {
		ops = append(ops, Op{Kind: OpServerDel, Backend: "be-a", Server: fmt.Sprintf("s%d", i)})
	}
	fs2 := fs.clone()
	fs2["notes/x.txt"] = "x\n"
	m := e.c.manifest("plan-2", fs2)
	m.Ops, m.OpBatches = ops[:1000], [][]Op{ops[1000:]}
	res := e.c.apply(m, fs2)
	if res.Mode != ResultReload || len(res.OpResults) != 0 {
		t.Errorf("%+v", res)
	}
	if metricValue(e.a, "invariant_violations_total", invOpsExecutable) != 1 {
		t.Error("ops_executable")
	}
	if p := e.c.state("").PendingDeletes; len(p.Servers) != 0 {
		t.Errorf("pending %v", p)
	}
}

func TestDeferralsRefuseAnUnsafeNameThroughAnApply(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/x.txt"] = "x\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpServerDel, Backend: "be-a", Server: "s1;del backend be-a"})
	if res.Mode != ResultReload || metricValue(e.a, "invariant_violations_total", invOpsExecutable) != 1 {
		t.Errorf("%+v", res)
	}
	if p := e.c.state("").PendingDeletes; len(p.Servers) != 0 || len(p.Backends) != 0 {
		t.Errorf("pending %v", p)
	}
}

// ---------------------------------------------------------------------------
// Drain, metrics, invariants (agent level).

func TestMetricsAreServedOnMetricsListen(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.MetricsListen = "127.0.0.1:0" }, nil)
	text := scrape(t, e.a)
	for _, family := range []string{"haptic_agent_apply_total", "haptic_agent_apply_rejected_total",
		"haptic_agent_invariant_violations_total", "haptic_agent_reloads_total", "haptic_agent_rollbacks_total",
		"haptic_agent_deferred_deletes_total", "haptic_agent_op_errors_total", "haptic_agent_map_divergence_total",
		"haptic_agent_generation"} {
		if !strings.Contains(text, "# HELP "+family+" ") || !strings.Contains(text, "# TYPE "+family+" ") {
			t.Errorf("family %s missing", family)
		}
	}
	resp, err := http.Post("http://"+e.a.metricsLn.Addr().String()+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics %d", resp.StatusCode)
	}
}

func TestMetricsExpositionOfARunningAgentParsesBack(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.MetricsListen, c.AgentVersion = "127.0.0.1:0", "v1.4.2-test" }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "m.example be-m\n"
	e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "m.example", Value: "be-m"})
	m := e.c.manifest("plan-3", fs2)
	m.Token.LeaderEpoch = 0
	e.c.post(applyRequest{manifest: m, files: fs2})
	awaitReadBacks(e.a)

	families, err := parseExposition(scrape(t, e.a))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"haptic_agent_apply_total", "haptic_agent_apply_rejected_total", "haptic_agent_invariant_violations_total",
		"haptic_agent_reloads_total", "haptic_agent_rollbacks_total", "haptic_agent_deferred_deletes_total",
		"haptic_agent_op_errors_total", "haptic_agent_map_divergence_total", "haptic_agent_generation",
		"haptic_agent_auth_failures_total", "haptic_agent_connections_refused_total", "haptic_agent_state_log_broken",
		"haptic_agent_disk_behind", "haptic_agent_late_mount", "haptic_agent_build_info"}
	var names []string
	values := map[string]uint64{}
	for _, f := range families {
		names = append(names, f.name)
		for _, s := range f.series {
			key := f.name
			for _, l := range s.labels {
				key += fmt.Sprintf(",%s=%s", l.name, l.value)
			}
			values[key] = s.value
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("families %v", names)
	}
	for key, v := range map[string]uint64{
		"haptic_agent_apply_total,mode=reload":                         1,
		"haptic_agent_apply_total,mode=runtime":                        1,
		"haptic_agent_apply_total,mode=rejected":                       0,
		"haptic_agent_apply_rejected_total,stage=fencing":              1,
		"haptic_agent_reloads_total,result=ok":                         1,
		"haptic_agent_reloads_total,result=failed":                     0,
		"haptic_agent_rollbacks_total":                                 0,
		"haptic_agent_map_divergence_total":                            0,
		"haptic_agent_generation":                                      2,
		"haptic_agent_deferred_deletes_total,kind=server,outcome=done": 0,
		"haptic_agent_invariant_violations_total,name=recovery_reload": 0,
		"haptic_agent_state_log_broken":                                0,
		"haptic_agent_op_errors_total,kind=map_add":                    0,
		"haptic_agent_build_info,version=v1.4.2-test":                  1,
	} {
		if got, ok := values[key]; !ok || got != v {
			t.Errorf("%s = %d (present %v), want %d", key, got, ok, v)
		}
	}
}

func TestInvariantViolationIsCountedLoggedAndReported(t *testing.T) {
	logs := &lockedBuffer{}
	e := newTestEnv(t, func(c *AgentConfig) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}, nil)
	fs := seedFiles()
	res := e.land(t, "plan-1", fs)
	// A runtime op the agent cannot compile (a key with a space) breaks
	// ops_executable: Diff never sends one.
	fs1 := fs.clone()
	fs1["maps/host.map"] += "a b be-x\n"
	if res1 := e.land(t, "plan-1b", fs1, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "a b", Value: "be-x"}); res1.Mode != ResultReload {
		t.Fatalf("%+v", res1)
	}
	st := e.c.state("")
	if st.InvariantViolation != invOpsExecutable || metricValue(e.a, "invariant_violations_total", invOpsExecutable) != 1 {
		t.Errorf("invariant %q", st.InvariantViolation)
	}
	if !strings.Contains(logs.String(), `"level":"ERROR","msg":"invariant violated","invariant":"ops_executable"`) {
		t.Errorf("logs:\n%s", logs.String())
	}
	fs = fs1
	// The agent keeps serving.
	fs2 := fs.clone()
	fs2["maps/host.map"] += "k.example be-k\n"
	if res2 := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "k.example", Value: "be-k"}); res2.Mode != ResultRuntime || res.Mode != ResultReload {
		t.Errorf("%+v", res2)
	}
	if code, _ := getText(t, e.a, PathReadyz); code != 200 {
		t.Errorf("readyz %d", code)
	}
}

func TestDrainSocketAnswersTheDrain(t *testing.T) {
	drain := filepath.Join(shortTempDir(t), "drain.sock")
	e := newTestEnv(t, func(c *AgentConfig) {
		c.DrainSocket = drain
		c.DrainQuietPeriod, c.DrainMaxWait = 100*time.Millisecond, 2*time.Second
		c.DrainIgnoreFrontends = []string{"status,stats"}
	}, nil)
	// The agent's user only: any other could hold the drain's connections.
	if fi, err := os.Lstat(drain); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Fatalf("drain socket mode %v, want 0600", fi.Mode())
	}
	e.fake.With(func(m *FakeModel) { m.Frontends = map[string]uint64{"http-in": 7, "status": 100} })
	resp, err := unixClient(drain).Get("http://agent" + PathDrain)
	if err != nil {
		t.Fatal(err)
	}
	var dr DrainResult
	json.NewDecoder(resp.Body).Decode(&dr)
	resp.Body.Close()
	if resp.StatusCode != 200 || dr.Reason != DrainReasonQuiet || dr.Connections != 7 {
		t.Errorf("%d %+v", resp.StatusCode, dr)
	}
	e.stop()
	if _, err := os.Lstat(drain); !os.IsNotExist(err) {
		t.Errorf("the drain socket is still there: %v", err)
	}
}

func TestFailedInvariantsChecksEveryAfterFinishInvariant(t *testing.T) {
	m := &Manifest{Files: seedFiles().manifestFiles()}
	ok := &ApplyResult{OK: true, Mode: ResultNoop}
	tree := map[string]FileAt{}
	for _, f := range m.Files {
		tree[f.Path] = FileAt{Digest: f.Digest, Proof: f.Proof, Size: f.Size}
	}
	if got := failedInvariants(ok, m, 2, &agentState{Generation: 3}, tree); len(got) != 0 {
		t.Errorf("%v", got)
	}
	bad := &ApplyResult{OK: true, Mode: ResultRuntime, Reload: &ReloadInfo{ScheduledAt: "x"}}
	st := &agentState{Generation: 3, Journal: []journalEntry{{Path: "x"}}}
	want := []string{invGenerationMonotonic, invDiskIsTheDesiredSet, invRuntimeModeDoesNotReload, invJournalOnlyWhileDiverged}
	if got := failedInvariants(bad, m, 1, st, nil); !slices.Equal(got, want) {
		t.Errorf("%v", got)
	}
	for mode, r := range map[string]*ApplyResult{
		invReloadModeReloads: {Mode: ResultReload, Reload: &ReloadInfo{ScheduledAt: "x"}},
		invNoopRunsNoOps:     {Mode: ResultNoop, OpResults: []OpResult{{Kind: OpMapAdd, OK: true}}},
	} {
		if got := failedInvariants(r, m, 0, &agentState{}, nil); !slices.Equal(got, []string{mode}) {
			t.Errorf("%s: %v", mode, got)
		}
	}
}

// TestLastApplyIsTheWholeAnswerOfAScheduledReload: a controller that got
// "scheduled" polls the state and takes last_apply as the final result,
// baseline included, so last_apply carries the pairs, token, last-known-good
// and worker the reload left, and that worker's inventory.
func TestLastApplyIsTheWholeAnswerOfAScheduledReload(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = 300 * time.Millisecond }, nil)
	_, _, scheduled := e.landThenSchedule(t)
	waitFor(t, "the scheduled reload", func() bool { return e.c.state("").RunningPlanID == "plan-2" })
	st := e.c.state("")
	la := st.LastApply
	if la == nil || la.PlanID != "plan-2" || !la.OK || la.Mode != ResultReload {
		t.Fatalf("last_apply %+v", la)
	}
	if la.AppliedPlanID != "plan-2" || la.AppliedPlanProof != scheduled.AppliedPlanProof || la.RunningPlanID != "plan-2" ||
		la.WorkerOpsPlanID != "plan-2" || la.WorkerOpsPlanProof != scheduled.AppliedPlanProof || la.LKGPlanID != "plan-2" ||
		la.AppliedToken != st.AppliedToken || la.HAProxy != st.HAProxy || !la.HAProxy.HasWorkerIdentity() {
		t.Errorf("last_apply's baseline %+v, state %+v", la, st)
	}
	if la.Inventory == nil || !slices.Contains(la.Inventory.Maps, "maps/host.map") {
		t.Errorf("last_apply's inventory %+v", la.Inventory)
	}
}
