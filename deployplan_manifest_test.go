// Tests of the two helpers that connect Diff to the wire on the controller
// side (deployplan.go): BaselineFromState, which turns an agent's State into
// the Baseline the next Diff runs against (the applied plan decoded from its
// blob, the running and worker-ops plans set only where the state names the
// applied plan for them, the capabilities, pending deletes and inventory),
// and NewManifest, which turns a Decision into the manifest a controller
// sends (the fencing fields copied from the state, ops split into batches,
// and a reload instead of ops when the state lacks a proof they need). The
// plan fixtures are in deployplan_test.go.

package haptic

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// BaselineFromState.

func TestBaselineFromState(t *testing.T) {
	plan := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))), withMap(routeMap, false, mapEntries("a", "be-a")...))
	blob, err := EncodePlanBlob(plan)
	if err != nil {
		t.Fatal(err)
	}
	other := basePlan(withCore("frontend#1", "frontend f\n"))
	otherBlob, err := EncodePlanBlob(other)
	if err != nil {
		t.Fatal(err)
	}
	// stateOf is a state whose applied, running and worker-ops pairs all
	// name plan, with its blob.
	stateOf := func(change func(*State)) *State {
		s := &State{
			HAProxy:            HAProxyInfo{Version: "3.4.3"},
			AppliedPlanID:      plan.ID,
			AppliedPlanProof:   "proof-applied",
			RunningPlanID:      plan.ID,
			RunningPlanProof:   "proof-running",
			WorkerOpsPlanID:    plan.ID,
			WorkerOpsPlanProof: "proof-worker",
			AppliedPlan:        blob,
			AppliedPlanStored:  true,
		}
		if change != nil {
			change(s)
		}
		return s
	}
	decoded := throughPlanBlob(t, plan)
	for _, tc := range []struct {
		name  string
		state *State
		check func(t *testing.T, b *Baseline, err error)
	}{
		{"blob of the applied, running and worker-ops plan", stateOf(nil), func(t *testing.T, b *Baseline, err error) {
			if err != nil || !reflect.DeepEqual(b.Applied, decoded) || b.Running != b.Applied || b.WorkerOps != b.Applied {
				t.Fatalf("err %v; Applied %v, Running %v, WorkerOps %v", err, b.Applied != nil, b.Running != nil, b.WorkerOps != nil)
			}
			wantVerdict(t, Diff(plan, b), VerdictFileOnly)
		}},
		{"a reload is pending", stateOf(func(s *State) {
			s.RunningPlanID, s.WorkerOpsPlanID, s.ReloadPendingAt = "older", "older", "2025-01-01T00:00:00Z"
		}), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.Applied == nil || b.Running != nil || b.WorkerOps != nil || !b.ReloadPending {
				t.Fatalf("err %v; Applied %v, Running %v, WorkerOps %v, ReloadPending %v", err, b.Applied != nil, b.Running != nil, b.WorkerOps != nil, b.ReloadPending)
			}
		}},
		{"worker moved by in-place ops", stateOf(func(s *State) {
			s.RunningPlanID, s.WorkerOpsPlanID = "older", "moved"
		}), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.Applied == nil || b.Running != nil || b.WorkerOps != nil {
				t.Fatalf("err %v; Running %v, WorkerOps %v", err, b.Running != nil, b.WorkerOps != nil)
			}
		}},
		{"after a runtime apply", stateOf(func(s *State) { s.RunningPlanID = "older" }), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.Applied == nil || b.Running != nil || b.WorkerOps != b.Applied {
				t.Fatalf("err %v; Running %v, WorkerOps is Applied %v", err, b.Running != nil, b.WorkerOps == b.Applied)
			}
		}},
		{"no blob", stateOf(func(s *State) { s.AppliedPlan, s.AppliedPlanStored = nil, false }), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.Applied != nil {
				t.Fatalf("err %v, Applied %v", err, b.Applied != nil)
			}
			wantReasonsExactly(t, Diff(plan, b), "no baseline")
		}},
		{"a blob for another plan", stateOf(func(s *State) { s.AppliedPlan = otherBlob }), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.Applied != nil || b.Running != nil || b.WorkerOps != nil {
				t.Fatalf("err %v, Applied %v", err, b.Applied != nil)
			}
		}},
		{"a corrupt blob", stateOf(func(s *State) { s.AppliedPlan = []byte("not zstd") }), func(t *testing.T, b *Baseline, err error) {
			if b != nil || err == nil || !strings.Contains(err.Error(), "decoding the applied plan") {
				t.Fatalf("baseline %v, err %v", b, err)
			}
		}},
		{"caps", stateOf(func(s *State) { s.AgentOps = []string{OpMapSet} }), func(t *testing.T, b *Baseline, err error) {
			if want := CapsFor("3.4.3", []string{OpMapSet}); err != nil || !reflect.DeepEqual(b.Caps, want) {
				t.Fatalf("err %v, Caps %+v, want %+v", err, b.Caps, want)
			}
		}},
		{"pending deletes", stateOf(func(s *State) {
			s.PendingDeletes = PendingDeletes{Servers: []string{"a/1", "a/2", "b/1"}, Backends: []string{"c", "d"}}
		}), func(t *testing.T, b *Baseline, err error) {
			if err != nil || b.PendingServerDeletes != 3 || b.PendingBackendDeletes != 2 {
				t.Fatalf("err %v, pending %d servers, %d backends", err, b.PendingServerDeletes, b.PendingBackendDeletes)
			}
		}},
		{"inventory", stateOf(func(s *State) {
			s.Inventory = Inventory{Generation: 4, Maps: []string{routeMap}, Certs: []string{certPath}, CAFiles: []string{caPath},
				CRLFiles: []string{"ca/crl.pem"}, CRTLists: []string{listPath}}
		}), func(t *testing.T, b *Baseline, err error) {
			want := Inventory{Generation: 4, Maps: []string{routeMap}, Certs: []string{certPath}, CAFiles: []string{caPath},
				CRLFiles: []string{"ca/crl.pem"}, CRTLists: []string{listPath}}
			if err != nil || !reflect.DeepEqual(b.Inventory, want) {
				t.Fatalf("err %v, Inventory %+v", err, b.Inventory)
			}
		}},
		{"nil state", nil, func(t *testing.T, b *Baseline, err error) {
			if b != nil || err == nil {
				t.Fatalf("baseline %v, err %v", b, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := BaselineFromState(tc.state)
			tc.check(t, b, err)
		})
	}
	t.Run("the inventory's lists are copies", func(t *testing.T) {
		inventory := func() Inventory {
			return Inventory{Maps: []string{routeMap}, Certs: []string{certPath}, CAFiles: []string{caPath},
				CRLFiles: []string{"ca/crl.pem"}, CRTLists: []string{listPath}}
		}
		state := stateOf(func(s *State) { s.Inventory = inventory() })
		b, err := BaselineFromState(state)
		if err != nil {
			t.Fatal(err)
		}
		inv := &state.Inventory
		for _, list := range [][]string{inv.Maps, inv.Certs, inv.CAFiles, inv.CRLFiles, inv.CRTLists} {
			list[0] = "changed"
		}
		if !reflect.DeepEqual(b.Inventory, inventory()) {
			t.Fatalf("the baseline's inventory follows the state: %+v", b.Inventory)
		}
	})
}

// ---------------------------------------------------------------------------
// NewManifest.

func TestNewManifest(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))))
	token := Token{LeaderEpoch: 3, RenderSeq: 9}
	fullState := func() *State {
		return &State{
			AppliedPlanID: prev.ID, AppliedPlanProof: "proof-applied", AppliedToken: Token{LeaderEpoch: 3, RenderSeq: 8},
			RunningPlanID: prev.ID, WorkerOpsPlanID: prev.ID, WorkerOpsPlanProof: "proof-worker",
		}
	}
	mapOps := func(n int) []Op {
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = mapSetOp(routeMap, fmt.Sprint("k", i), "v")
		}
		return ops
	}
	runtime := Diff(next, baseOf(prev))
	wantVerdict(t, runtime, VerdictRuntime)
	big := Decision{Verdict: VerdictRuntime, Mode: ModeAuto, Ops: mapOps(1500), Chunks: 2, Files: ManifestFiles(next)}
	withInPlace := big
	withInPlace.InPlace = mapOps(400)
	withInPlace.WorkerPlan = prev.Clone()
	withInPlace.WorkerPlan.ID = "worker-after-ops"
	reloadNext := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))), withCore("frontend#1", "frontend f\n"))
	reloadBase := baseOf(prev)
	reloadBase.WorkerOps = prev
	reloadInPlace := Diff(reloadNext, reloadBase)
	if reloadInPlace.Verdict != VerdictReload || len(reloadInPlace.InPlace) == 0 {
		t.Fatalf("the reload fixture gives %s with %d in-place ops", reloadInPlace.Verdict, len(reloadInPlace.InPlace))
	}

	for _, tc := range []struct {
		name  string
		next  *Plan
		d     Decision
		state *State
		check func(t *testing.T, m *Manifest)
	}{
		{"runtime", next, runtime, fullState(), func(t *testing.T, m *Manifest) {
			s := fullState()
			if m.IdentityVersion != 1 || m.PlanID != next.ID || m.PlanSchemaVersion != next.SchemaVersion || m.Token != token ||
				m.ExpectedPrevPlanID != s.AppliedPlanID || m.ExpectedPrevPlanProof != s.AppliedPlanProof || m.ExpectedPrevToken != s.AppliedToken ||
				m.ExpectedWorkerOpsPlanID != s.WorkerOpsPlanID || m.ExpectedWorkerOpsPlanProof != s.WorkerOpsPlanProof {
				t.Fatalf("manifest %+v", m)
			}
			if m.Mode != ModeAuto || !reflect.DeepEqual(m.Ops, runtime.Ops) || m.OpBatches != nil || !reflect.DeepEqual(m.Files, runtime.Files) {
				t.Fatalf("mode %s, ops %d, batches %d", m.Mode, len(m.Ops), len(m.OpBatches))
			}
			if &m.Files[0] != &runtime.Files[0] {
				t.Fatal("files are copied, want d.Files shared")
			}
		}},
		{"1500 ops", next, big, fullState(), func(t *testing.T, m *Manifest) {
			if m.Mode != ModeAuto || len(m.Ops) != 1000 || len(m.OpBatches) != 1 || len(m.OpBatches[0]) != 500 {
				t.Fatalf("mode %s, ops %d, batches %d", m.Mode, len(m.Ops), len(m.OpBatches))
			}
		}},
		{"1500 ops with 400 in place", next, withInPlace, fullState(), func(t *testing.T, m *Manifest) {
			if m.Mode != ModeAuto || len(m.Ops) != 600 || len(m.OpBatches) != 1 || len(m.OpBatches[0]) != 900 ||
				len(m.InPlaceOps) != 400 || m.WorkerOpsPlanID != "worker-after-ops" || m.WorkerOpsPlanProof != "" {
				t.Fatalf("mode %s, ops %d, batches %d, in place %d, worker ops %q/%q", m.Mode, len(m.Ops), len(m.OpBatches),
					len(m.InPlaceOps), m.WorkerOpsPlanID, m.WorkerOpsPlanProof)
			}
		}},
		{"no applied proof", next, big, func() *State { s := fullState(); s.AppliedPlanProof = ""; return s }(), func(t *testing.T, m *Manifest) {
			if m.Mode != ModeReload || m.Ops != nil || m.OpBatches != nil {
				t.Fatalf("mode %s, ops %d, batches %d", m.Mode, len(m.Ops), len(m.OpBatches))
			}
		}},
		{"no worker-ops proof", next, withInPlace, func() *State { s := fullState(); s.WorkerOpsPlanProof = ""; return s }(), func(t *testing.T, m *Manifest) {
			if m.Mode != ModeReload || m.Ops != nil || m.InPlaceOps != nil || m.WorkerOpsPlanID != "" {
				t.Fatalf("mode %s, ops %d, in place %d, worker ops id %q", m.Mode, len(m.Ops), len(m.InPlaceOps), m.WorkerOpsPlanID)
			}
		}},
		{"reload decision with in-place ops", reloadNext, reloadInPlace, fullState(), func(t *testing.T, m *Manifest) {
			if m.Mode != ModeReload || m.Ops != nil || !reflect.DeepEqual(m.InPlaceOps, reloadInPlace.InPlace) ||
				m.WorkerOpsPlanID != reloadInPlace.WorkerPlan.ID {
				t.Fatalf("mode %s, ops %d, in place %d, worker ops id %q", m.Mode, len(m.Ops), len(m.InPlaceOps), m.WorkerOpsPlanID)
			}
		}},
		// The fields NewManifest leaves empty are checked on every row below.
		{"left empty", next, runtime, fullState(), func(t *testing.T, m *Manifest) {}},
		{"nil state", next, runtime, nil, func(t *testing.T, m *Manifest) {
			if m.Mode != ModeReload || m.ExpectedPrevPlanID != "" || m.ExpectedPrevPlanProof != "" || m.ExpectedPrevToken != (Token{}) ||
				m.ExpectedWorkerOpsPlanID != "" || m.ExpectedWorkerOpsPlanProof != "" || m.Ops != nil || m.InPlaceOps != nil {
				t.Fatalf("manifest %+v", m)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManifest(tc.next, tc.d, tc.state, token)
			if m == nil {
				t.Fatal("NewManifest returned nil")
			}
			tc.check(t, m)
			// "left empty", on every row.
			if m.PlanProof != "" || m.WorkerOpsPlanProof != "" || m.ValidatedPlanID != "" || m.ValidatedPlanProof != "" || m.Mode == ModeRevertLKG {
				t.Fatalf("a field NewManifest leaves empty is set: %+v", m)
			}
			for _, f := range m.Files {
				if f.Patch != nil {
					t.Fatalf("%s carries a patch", f.Path)
				}
			}
			if err := m.ValidateOpBatches(); err != nil {
				t.Fatalf("ValidateOpBatches: %v", err)
			}
		})
	}
	if m := NewManifest(nil, runtime, fullState(), token); m != nil {
		t.Fatalf("NewManifest(nil, ...) = %+v, want nil", m)
	}
}
