// This file owns the decisions of an apply, as plain functions over data:
// the fence, what the written files need from HAProxy, the state an apply
// records before it touches the tree, and the state each way it can end
// leaves. They take the state, the manifest and the clock and return values;
// runApply (agent_apply_run.go) does the I/O they ask for, in the order
// its body states. Tables test them without a disk or a socket.

package haptic

import (
	"maps"
	"slices"
	"time"
)

// activation is what an apply's files need from HAProxy.
type activation int

const (
	activateNothing  activation = iota // file_only or noop
	activateOps                        // run the runtime ops
	activateReload                     // reload now
	activateSchedule                   // reload at the end of the pacing window
	activateJoin                       // a reload is pending: join it
)

// steps is what one apply will do, decided before it touches anything.
type steps struct {
	act    activation
	reason reloadReason // why it reloads
	// open: the apply counts only once a record says its reload took
	// effect, so that a crash before that puts the tree back.
	open bool
}

// countsFromRecord: the apply counts once its record is synced, its files
// installed after its ops and needing no undo (unless its ops are refused
// and it falls back to a reload).
func (s steps) countsFromRecord() bool { return s.act == activateOps || s.act == activateNothing }

// Reload reasons, logged with every reload decision as reload_reason: the
// agent's own reason, not the controller's (Diff's reasons, whatever they
// were, are the controller's to log). A fallback is a runtime apply's
// reload once its ops did not land.
type reloadReason string

const (
	reasonMode                 reloadReason = "mode"                   // the manifest asked for a reload
	reasonUnknownBaseline      reloadReason = "unknown_baseline"       // the agent holds no applied plan to run ops against
	reasonUnknownOp            reloadReason = "unknown_op"             // fallback: the ops could not be compiled
	reasonWorkerChanged        reloadReason = "worker_changed"         // fallback: they reached another worker
	reasonOpRejected           reloadReason = "op_rejected"            // fallback: HAProxy refused one
	reasonDeferredDeleteCommit reloadReason = "deferred_delete_commit" // fallback: the queue would not take their deletes
	reasonRevert               reloadReason = "revert_lkg"             // a revert
)

// decideSteps picks what the written files need, first match wins. A reload
// waits for the end of an open pacing window, except a revert's.
func decideSteps(st *agentState, m *Manifest, windowOpen bool) steps {
	reload := func(reason reloadReason) steps {
		if windowOpen {
			return steps{act: activateSchedule, reason: reason}
		}
		return steps{act: activateReload, reason: reason, open: true}
	}
	switch {
	case m.Mode == ModeRevertLKG:
		return steps{act: activateReload, reason: reasonRevert, open: true}
	case st.reloadPending():
		return steps{act: activateJoin}
	case m.Mode == ModeReload:
		return reload(reasonMode)
	case !st.Applied.complete():
		return reload(reasonUnknownBaseline)
	case len(m.RuntimeOps()) > 0:
		return steps{act: activateOps}
	}
	return steps{act: activateNothing}
}

// fenceReason applies the fencing rules Manifest lists, in order; ""
// means the manifest passes. inPlaceRuns: the manifest's in-place ops will
// run (inPlaceWillRun).
func fenceReason(m *Manifest, s *agentState, inPlaceRuns bool) string {
	exact := m.IdentityVersion == ExactIdentityVersion
	switch {
	case m.Token.LeaderEpoch < s.Token.LeaderEpoch:
		return ReasonStaleEpoch
	case m.Mode == ModeRevertLKG:
		// A revert names the plan being refused, which is the applied or the
		// worker-ops plan and cannot be the plan the worker runs.
		ref := planRef{m.PlanID, m.PlanProof}
		if ref.Proof == "" || samePlanRef(ref, s.Running) || !samePlanRef(ref, s.Applied) && !samePlanRef(ref, s.WorkerOps) {
			return ReasonRevertTargetMismatch
		}
		return ""
	case m.ExpectedPrevPlanID != s.Applied.ID:
		if s.Applied.ID == "" {
			return ReasonUnknownBaseline
		}
		return ReasonPrevMismatch
	case m.ExpectedPrevToken != s.Token,
		exact && m.Mode != ModeReload && (m.ExpectedPrevPlanProof == "" || m.ExpectedPrevPlanProof != s.Applied.Proof),
		exact && m.Mode == ModeReload && s.Applied.Proof != "" && m.ExpectedPrevPlanProof != s.Applied.Proof:
		return ReasonPrevMismatch
	case (m.Mode == ModeAuto || inPlaceRuns) &&
		!samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, s.WorkerOps):
		return ReasonWorkerOpsMismatch
	}
	return ""
}

// inPlaceWillRun reports whether the manifest's in-place ops will run: a
// reload is pending, or this reload apply lands inside the pacing window.
func inPlaceWillRun(m *Manifest, reloadPending, windowOpen bool) bool {
	return len(m.InPlaceOps) > 0 && (reloadPending || (m.Mode == ModeReload && windowOpen))
}

// ---------------------------------------------------------------------------
// How an apply ends.

// applyIdentity is what an apply records about itself.
type applyIdentity struct {
	ref    planRef // the applied pair it lands: its plan and applied proof, or the LKG for a revert
	worker planRef // the worker pair its in-place ops reach
	token  Token
	schema int
	blob   bool // it carried its plan blob
	revert bool
	undo   []journalEntry // how each path it changed looked before it
}

// outcome is how a run ended.
type outcome struct {
	ok   bool
	mode string // the result's mode
	// The worker: whether any op reached it, and whether the apply's own
	// reload took effect or may have (no verdict came).
	opsRan, reloaded bool
	// installed: the apply changed the tree, even if it then put it back.
	installed bool
	// inPlace: in-place ops brought the worker to the identity's worker pair.
	inPlace bool
	// due: the pending reload's time, for a scheduled or joined apply.
	due time.Time
	// After a failure: the tree is what the apply found (undone, or never
	// changed), and the worker reloaded it (recovered) or, that refused,
	// the last-known-good set (lkgRestored).
	undone, recovered, lkgRestored bool
	// overtaken: an invalidation happened during the run, after its own
	// reload if it had one; since is the invalidation count it is measured
	// from, the apply's start or its own reload.
	overtaken bool
	since     uint64
	// What the answer reports: set by the step that produced it.
	seq        uint64 // the record an apply that lands closes
	opResults  []OpResult
	reloadInfo *ReloadInfo
	rollback   *RollbackInfo
	err        *ApplyError
	reason     reloadReason  // why it reloaded
	refused    bool          // HAProxy refused its files
	unknown    error         // the disk refused the record of its undo
	readBack   *compiledOps  // a runtime apply's ops
	keepStaged bool          // its staged temp files are the sources of owed files
	write, ops time.Duration // writing and syncing; ops, or the reload instead
	// result is the answer, once end has built it: the state's last_apply.
	result ApplyResult
}

// landing is the state an apply records before it touches the tree: the
// state it leaves if it ends as planned. opsMayRun: runtime or in-place
// ops may reach the worker before the apply closes, so that a start that
// reads this record with nothing after it reloads.
func landing(cur agentState, id applyIdentity, s steps, opsMayRun bool, now time.Time) agentState {
	o := outcome{ok: true, opsRan: s.act == activateOps, reloaded: s.act == activateReload}
	if o.opsRan {
		o.mode = ResultRuntime
	}
	if s.act == activateSchedule || s.act == activateJoin {
		o.due = now
		if cur.reloadPending() {
			o.due = cur.PendingAt
		}
	}
	next := stateAfter(cur, cur, id, o, now)
	next.ReloadOwed = opsMayRun
	return next
}

// stateAfter is the state a run leaves. cur is the state as it stands (other
// changes may have come in meanwhile), before the state the run began
// with.
//
// An OK apply bumps the generation and lands its pair, token and tree; one
// an invalidation overtook lands its tree but not its pair. A failed one
// leaves the generation and the token. It keeps the applied pair it began
// with where the tree is still the one it found (it was undone, or never
// changed), and the worker pairs where the worker is untouched (no op
// reached it, HAProxy refused its reload and the previous worker serves
// on) or reloaded the tree it found; a worker it may have changed otherwise
// runs nothing the agent can vouch for.
func stateAfter(cur, before agentState, id applyIdentity, o outcome, now time.Time) agentState {
	next := cur.clone()
	next.ReloadOwed = false
	if o.result.PlanID != "" {
		next.LastApply = cloneResult(&o.result)
		next.LastApply.Inventory = nil
	}
	// A worker that started after this moment loaded the tree the run left:
	// an OK apply records its set (whether or not the disk already held it),
	// and a failed one may have changed files before it put them back.
	if o.ok || o.installed {
		next.TreeChangedAt = now
	}
	if !o.ok {
		next.Applied = planRef{}
		if o.undone && !o.overtaken {
			next.Applied = before.Applied
		}
		if o.opsRan || o.reloaded {
			next.Running, next.WorkerOps = planRef{}, planRef{}
		}
		if o.recovered {
			next.Running, next.WorkerOps = before.Applied, before.Applied
		}
		if o.lkgRestored {
			next.Applied, next.Running, next.WorkerOps = cur.LKG, cur.LKG, cur.LKG
		}
		if o.recovered || o.lkgRestored {
			clearPending(&next)
		}
		return next
	}
	next.Generation++
	if !id.revert {
		next.SchemaVersion = id.schema
	}
	if o.reloaded {
		next.Running, next.WorkerOps = id.ref, id.ref
		clearPending(&next)
		if id.ref.complete() {
			next.LKG = id.ref
		}
	}
	if !o.due.IsZero() {
		if !next.reloadPending() {
			next.PendingBase = before.Applied
		}
		next.Pending, next.PendingAt = id.ref, o.due
		next.PendingUndo = append(next.PendingUndo, journalAdditions(next.PendingUndo, id.undo)...)
	}
	if o.overtaken {
		next.Applied, next.WorkerOps = planRef{}, planRef{}
		return next
	}
	next.Applied, next.Token = id.ref, id.token
	switch {
	case o.inPlace:
		next.WorkerOps = id.worker
	case o.opsRan && !o.reloaded && o.mode != ResultRuntime:
		next.WorkerOps = planRef{} // part of a refused batch may have landed, and the reload is still to come
	case !next.reloadPending():
		next.WorkerOps = id.ref
	}
	// The controller sends the blob only when the plan changes: a re-landed
	// plan keeps handing out the stored one under its new proof.
	if id.blob || next.Blob.ID == id.ref.ID && id.ref.Proof != "" {
		next.Blob = id.ref
	}
	return next
}

func clearPending(s *agentState) {
	s.Pending, s.PendingAt, s.PendingUndo, s.PendingBase = planRef{}, time.Time{}, nil, planRef{}
}

// journalAdditions are the entries of undo for paths journal lacks, the
// first for each path: a journal keeps a path's oldest version.
func journalAdditions(journal, undo []journalEntry) []journalEntry {
	var out []journalEntry
	for _, e := range undo {
		has := func(j journalEntry) bool { return j.Path == e.Path }
		if !slices.ContainsFunc(journal, has) && !slices.ContainsFunc(out, has) {
			out = append(out, e)
		}
	}
	return out
}

// workerAtStart is what the worker the start finds says about the pairs.
// The same worker keeps them and a scheduled reload. Another one that
// started after the tree last changed loaded that tree: it runs the applied
// plan, and a scheduled reload already happened. Anything else (a PID
// reused by another process is another worker) runs something the agent
// cannot vouch for.
func workerAtStart(s agentState, observed HAProxyInfo) agentState {
	next := s.clone()
	switch {
	case s.Worker.SameWorker(observed):
	case !s.TreeChangedAt.IsZero() && observed.WorkerStartTimeUnixMicros > s.TreeChangedAt.UnixMicro() && s.Applied.complete():
		next.Running, next.WorkerOps = s.Applied, s.Applied
		clearPending(&next)
	default:
		next.Running, next.WorkerOps = planRef{}, planRef{}
	}
	next.Worker = observed
	return next
}

// treeAtStart is what the hashed tree says about the state: the same tree
// as recorded keeps every pair and each file's proof; a tree that changed
// while the agent was away makes the applied plan unknown, and with it the
// running and worker pairs, a pending reload and the blob's binding.
func treeAtStart(s agentState, recorded, hashed map[string]FileAt) agentState {
	next := s.clone()
	kept := len(recorded) == len(hashed)
	for p, at := range recorded {
		kept = kept && hashed[p].Digest == at.Digest && hashed[p].Size == at.Size
	}
	if kept {
		keepProofs(recorded, hashed)
		return next
	}
	next.Applied, next.Running, next.WorkerOps, next.Blob = planRef{}, planRef{}, planRef{}, planRef{}
	clearPending(&next)
	return next
}

// damagedAtStart is the state the agent starts from when its history is
// damaged: nothing it records can be trusted to describe the tree or the
// worker, so every pair and the journal are forgotten and the next push
// reloads; the tree is kept as it stands; and the generation, the proofs
// and the token go on from the highest the readable records hold (replay
// keeps the highest proof counter of every record, counted or not), so that
// none the agent may have given is given again.
func damagedAtStart(read agentState) agentState {
	return agentState{Generation: read.Generation, ProofGeneration: read.ProofGeneration, Token: read.Token, Worker: read.Worker}
}

// ownedPaths is the sorted union of the tree's paths and those touched.
func ownedPaths(tree map[string]FileAt, touched []string) []string {
	out := slices.AppendSeq(slices.Clone(touched), maps.Keys(tree))
	slices.Sort(out)
	return slices.Compact(out)
}

// failedInvariants returns the names of the after-finish invariants that
// do not hold, in a fixed order.
func failedInvariants(r *ApplyResult, m *Manifest, prevGeneration uint64, st *agentState, tree map[string]FileAt) []string {
	var failed []string
	check := func(ok bool, name string) {
		if !ok {
			failed = append(failed, name)
		}
	}
	if r.OK {
		check(st.Generation == prevGeneration+1, invGenerationMonotonic)
		if m.Mode != ModeRevertLKG {
			exact := len(tree) == len(m.Files)
			for _, f := range m.Files {
				exact = exact && tree[f.Path] == (FileAt{Digest: f.Digest, Proof: f.Proof, Size: f.Size})
			}
			check(exact, invDiskIsTheDesiredSet)
		}
	}
	switch r.Mode {
	case ResultRuntime:
		check(r.Reload == nil || (!r.Reload.Performed && r.Reload.ScheduledAt == ""), invRuntimeModeDoesNotReload)
	case ResultReload:
		check(r.Reload != nil && r.Reload.Performed, invReloadModeReloads)
	case ResultNoop:
		check(len(r.OpResults) == 0, invNoopRunsNoOps)
	}
	check(len(st.Journal) == 0 || st.Applied != st.LKG, invJournalOnlyWhileDiverged)
	return failed
}
