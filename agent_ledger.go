// This file owns the agent's state: what it promised the controller (the
// plan pairs, the token, the generation and the proofs), the tree it holds
// on disk with each file's proof, and what it knows only while it runs (the
// worker's inventory, the pacing clock, the invalidation counter). One type,
// the ledger, holds it behind one mutex. A change it promises is written to
// the log before anyone can read it; a change that forgets is visible at
// once and written as well as the disk allows, since what it forgets must
// never be reported again.
//
// It never talks to HAProxy and never touches the tree: callers do the I/O
// and tell the ledger what happened. The decisions over a state are plain
// functions (agent_apply_steps.go).

package haptic

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"mime"
	"slices"
	"sync"
	"time"
)

// planBlobFile holds the stored plan blob as of the last snapshot; records
// carry a newer one until the next.
const planBlobFile = ".haptic-agent-plan.bin"

// planRef is one (plan id, role proof) pair.
type planRef struct {
	ID    string `json:"id,omitempty"`
	Proof string `json:"proof,omitempty"`
}

func (p planRef) complete() bool { return p.ID != "" && p.Proof != "" }

// samePlanRef is exact identity, which a pair without a proof never has.
func samePlanRef(a, b planRef) bool { return a.Proof != "" && a == b }

// agentState is the persisted state: what every record carries, and with
// the tree and the journal, what a snapshot holds.
type agentState struct {
	Generation      uint64      `json:"generation"`
	ProofGeneration uint64      `json:"proof_generation"`
	SchemaVersion   int         `json:"plan_schema_version,omitempty"`
	Applied         planRef     `json:"applied,omitzero"`    // what is on disk
	Running         planRef     `json:"running,omitzero"`    // what the worker loaded at its last reload
	WorkerOps       planRef     `json:"worker_ops,omitzero"` // what the worker holds, counting runtime ops
	LKG             planRef     `json:"lkg,omitzero"`        // what revert_lkg restores
	Token           Token       `json:"applied_token"`
	Worker          HAProxyInfo `json:"expected_worker"`
	Pending         planRef     `json:"pending_reload,omitzero"` // the plan a scheduled reload loads
	PendingAt       time.Time   `json:"pending_reload_at,omitzero"`
	// PendingUndo is how each path the pending reload's applies changed
	// looked before the first of them, and PendingBase the applied pair
	// then: what a refused scheduled reload puts back.
	PendingUndo []journalEntry `json:"pending_undo,omitempty"`
	PendingBase planRef        `json:"pending_base,omitzero"`
	Blob        planRef        `json:"plan_blob,omitzero"` // the pair the stored plan blob belongs to
	// TreeChangedAt is when an apply last changed the tree: a worker that
	// started later loaded this tree.
	TreeChangedAt time.Time `json:"tree_changed_at,omitzero"`
	// ReloadOwed: the worker may hold changes that are not on disk (runtime
	// ops of an apply not yet closed, an undo not yet reloaded), so the
	// next start reloads.
	ReloadOwed bool         `json:"reload_owed,omitempty"`
	LastApply  *ApplyResult `json:"last_apply,omitempty"`
	// Journal is how each path looked when the last-known-good plan became
	// current; records carry only the entries they add.
	Journal []journalEntry `json:"-"`
}

func (s *agentState) reloadPending() bool { return !s.PendingAt.IsZero() }

// clone copies s deeply enough that a change of one never shows in the other.
func (s agentState) clone() agentState {
	s.Journal, s.PendingUndo = slices.Clone(s.Journal), slices.Clone(s.PendingUndo)
	s.LastApply = cloneResult(s.LastApply)
	return s
}

// ledger is the one owner of the agent's state.
type ledger struct {
	logger   *slog.Logger
	blobPath string

	mu   sync.Mutex
	st   agentState
	tree map[string]FileAt
	// plan is the canonical JSON of the stored plan (st.Blob), the base of
	// the next plan patch; blob is its plan blob as it came, nil until
	// storedBlob encodes it. blob is replaced, never changed in place: state
	// answers write it out without the lock.
	plan []byte
	blob []byte
	// blobSaved: the blob file holds blob; otherwise only records do (the
	// blob, or the patches since it), and the next snapshot writes the file.
	blobSaved bool
	log       *stateLog
	seq       uint64
	// resetPending: the journal was emptied (a promotion) and no record has
	// said so yet; the next one does.
	resetPending bool
	// broken is the last failed write: the kernel may have dropped what an
	// unsynced record held, so nothing is appended until a compaction has
	// rewritten the whole state.
	broken error
	// stuckBy is why the last compaction failed (a full disk, say), until
	// one succeeds: the log grows toward what a start reads, so the agent
	// is not ready and retries.
	stuckBy error
	// applying: an apply is between its record and its end. Other changes
	// wait in memory for the end record, which carries them, so that no
	// record written in between can undo the apply's on replay.
	applying bool
	// behind: the tree is not what the state says (writing it failed, and
	// is retried). The tree the ledger holds is the one the state says: no
	// observation of the disk replaces it meanwhile.
	behind      error
	treeVersion uint64

	// In memory only: gone after a restart by design.
	inventory         Inventory
	inventoryReported uint64
	invalidations     uint64
	lastReload        time.Time
	lastInvariant     string
	repairs           int
}

// errLedgerBroken prefixes a write refused while the log cannot be
// trusted: the agent answers, but promises nothing it could not keep.
var errLedgerBroken = errors.New("could not write the agent's state")

// newLedger opens the state at statePath: the snapshot and the log
// replayed, nothing repaired yet (the agent's start does that). A record
// that names a path on a volume mounted since is acted on like any other:
// every byte recovery puts back is checked by its digest, wherever it is
// found, so an ACK is paid onto the tree as it is mounted now.
func newLedger(d disk, statePath, blobPath string, logAhead int64, logger *slog.Logger) (*ledger, *loadedLog, error) {
	loaded, err := loadLog(d, statePath)
	if err != nil {
		return nil, nil, err
	}
	if loaded.damage != "" {
		// The damaged files are kept for inspection; the log restarts empty
		// and the start writes a snapshot of what it keeps.
		for _, p := range []string{logPathFor(statePath), statePath} {
			if err := setAside(d, p); err != nil {
				return nil, nil, fmt.Errorf("set the damaged state aside: %w", err)
			}
		}
		loaded.good, loaded.zeroed, loaded.count = 0, 0, 0
	}
	w, err := openStateLog(d, statePath, loaded.good, loaded.zeroed, logAhead, loaded.count)
	if err != nil {
		return nil, nil, fmt.Errorf("open the state log: %w", err)
	}
	l := &ledger{logger: logger, blobPath: blobPath, st: loaded.st, tree: loaded.tree, log: w, seq: loaded.seq}
	if l.st.Blob.complete() {
		base, saved := loaded.blob, loaded.blob == nil
		if saved {
			base, err = readAllLimited(d, blobPath, MaxPlanBlobBytes)
		}
		if err == nil {
			l.plan, err = heldPlanOf(base, loaded.patches, l.st.Blob.ID)
		}
		if err != nil {
			logger.Warn("could not read the stored plan; it is forgotten", "path", blobPath, "err", err)
			l.st.Blob = planRef{}
		} else if len(loaded.patches) == 0 {
			l.blob, l.blobSaved = base, saved
		}
	}
	return l, loaded, nil
}

// heldPlanOf is the canonical JSON of plan id, rebuilt from the last blob
// the agent stored and the patches it took since, in order. The blob may
// be newer than the first of them: a compaction writes the blob file
// before the snapshot that drops the records, and may be cut in between.
// So the patches count from the first one cut from the blob's plan. Only
// the end is hashed: a patch spliced into anything but its own base cannot
// give the id's bytes, and a plan that is not exactly the stored one is
// forgotten, never held.
func heldPlanOf(blob []byte, patches []*PlanPatch, id string) ([]byte, error) {
	p, err := DecodePlanBlob(blob)
	if err != nil {
		return nil, err
	}
	js := p.Canonical()
	from := slices.IndexFunc(patches, func(pp *PlanPatch) bool { return pp.BaseDigest == p.ID })
	if from < 0 {
		from = len(patches)
	}
	for _, pp := range patches[from:] {
		if js, err = splicePlan(nil, js, pp); err != nil {
			return nil, err
		}
	}
	if got := Digest(js); got != id {
		return nil, fmt.Errorf("the stored blob and the patches since make plan %q, not plan %q", got, id)
	}
	return js, nil
}

// ---------------------------------------------------------------------------
// Writing.

// write appends r, synced when asked. The caller holds mu.
func (l *ledger) write(r *logRecord, sync bool) error {
	if l.broken != nil {
		return fmt.Errorf("%w: %w", errLedgerBroken, l.broken)
	}
	r.Seq, r.Durable = l.seq+1, l.log.synced
	r.ResetJournal = r.ResetJournal || l.resetPending
	if err := l.log.append(r, sync); err != nil {
		l.logger.Error("could not write the agent's state", "kind", r.Kind, "err", err)
		if sync && !errors.Is(err, errLogFull) { // a refused record wrote nothing
			l.breakLog(err)
		}
		return fmt.Errorf("%w: %w", errLedgerBroken, err)
	}
	l.seq, l.resetPending = r.Seq, false
	return nil
}

// breakLog stops the log after a failed sync (see broken). The caller holds
// mu.
func (l *ledger) breakLog(err error) {
	l.broken = err
	l.logger.Error("the agent's state log is broken: it records nothing, so every apply is refused, until a new snapshot is written", "err", err)
}

// commit writes r with the state change makes of the current one, and
// adopts that state (and r's tree entries) once the record is written.
func (l *ledger) commit(r *logRecord, sync bool, change func(*agentState)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := l.st.clone()
	l.changeState(&next, change)
	r.Kind, r.State = recordState, &next
	if err := l.write(r, sync); err != nil {
		return err
	}
	l.adopt(next, r)
	return nil
}

func (l *ledger) adopt(next agentState, r *logRecord) {
	if r.ResetJournal {
		next.Journal = nil
	}
	l.st = next
	if len(r.Tree) > 0 {
		applyTreeDelta(l.tree, r.Tree)
		l.treeVersion++
	}
}

// changeState applies change to next. A last_apply it sets becomes the
// whole answer of that apply, baseline and inventory, as a controller that
// polls the state for the verdict of a scheduled reload takes it.
func (l *ledger) changeState(next *agentState, change func(*agentState)) {
	prev := next.LastApply
	change(next)
	if la := next.LastApply; la != nil && la != prev {
		fillBaseline(la, next)
		la.Inventory = cloneInventory(&l.inventory)
	}
}

// forget changes the state at once and writes it as well as it can: what
// it forgets must not be reported even when the disk refuses the record
// (the next start re-derives it from the tree and the worker anyway).
// The caller holds mu.
func (l *ledger) forget(change func(*agentState)) {
	change(&l.st)
	if !l.applying {
		l.write(&logRecord{Kind: recordState, State: &l.st}, false)
	}
}

// synced is the proof that an apply's record is on the disk. Only the wait
// on the record's sync (beginApply's await) makes one, and each install of
// the apply's files takes one: no rename can come before the sync.
type synced struct{ seq uint64 }

// beginApply writes an apply's record and starts its sync; await waits for
// the sync. Between the two the apply may already send its runtime ops,
// which hides one round trip to HAProxy inside the sync: a process crash
// keeps the written record (the page cache outlives the agent), and a
// power loss takes the worker's runtime changes down with it, so neither
// leaves ops in a worker that no record explains.
func (l *ledger) beginApply(r *logRecord) (await func() (synced, error), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Kind = recordApply
	start := l.log.bytes
	if err := l.write(r, false); err != nil {
		return nil, err
	}
	l.applying = true
	done := make(chan error, 1)
	go func() {
		err := l.log.f.Sync()
		passed("synced")
		done <- err
	}()
	return func() (synced, error) {
		err := <-done
		l.mu.Lock()
		defer l.mu.Unlock()
		if err == nil {
			l.log.synced = max(l.log.synced, r.Seq)
			return synced{r.Seq}, nil
		}
		// The apply fails and nothing was renamed: its record is cut off,
		// so that no start redoes an apply that was refused.
		l.logger.Error("could not sync the agent's state", "kind", recordApply, "err", err)
		l.breakLog(err)
		if cutErr := l.log.cutBack(start); cutErr != nil {
			return synced{}, fmt.Errorf("%w: %w (%w: %w)", errLedgerBroken, err, errRecordKept, cutErr)
		}
		l.applying = false // no record of it is left to close
		return synced{}, fmt.Errorf("%w: %w", errLedgerBroken, err)
	}, nil
}

// errRecordKept: a record that should have been cut off could not be, and
// may count at the next start.
var errRecordKept = errors.New("the record could not be cut off")

// ending is how an apply ends, as its end record says it, and what
// settles the state it leaves.
type ending struct {
	// seq is the apply's record the end record closes; 0 records the final
	// state of an apply that has none, or whose undo closed it already.
	seq  uint64
	sync bool
	// An apply that landed (o.ok): its tree entries and journal additions
	// (its own record carries them for replay), whether the journal starts
	// afresh, and its plan blob.
	landed       map[string]*FileAt
	journal      []journalEntry
	resetJournal bool
	plan         *planUpload
	// undo: an undone apply's links made after its record (a runtime
	// apply's when it fell back to a reload), which the record cannot name:
	// the end record does, so that recovery finds the bytes it puts back.
	undo []fileChange
	// The state it leaves is stateAfter over the state as it stands (which
	// holds whatever else changed meanwhile); reloadOwed: the worker may
	// hold what the undo took away, so a start before its recovery reloads.
	before     agentState
	id         applyIdentity
	o          outcome
	now        time.Time
	reloadOwed bool
}

// ended closes an apply with the state its outcome makes. A failed write
// still adopts the state: the apply is over either way, and its record,
// counted or not on replay, tells the rest.
func (l *ledger) ended(e ending) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := l.st.clone()
	l.changeState(&next, func(s *agentState) {
		*s = stateAfter(*s, e.before, e.id, e.o, e.now)
		s.ReloadOwed = e.reloadOwed
	})
	if e.seq == 0 {
		l.forget(func(s *agentState) { *s = next })
		return nil
	}
	l.applying = false
	r := &logRecord{Kind: recordEnd, End: e.seq, OK: e.o.ok, State: &next, ResetJournal: e.resetJournal, Files: e.undo}
	err := l.write(r, e.sync)
	if e.o.ok {
		next.Journal = append(next.Journal, e.journal...)
		applyTreeDelta(l.tree, e.landed)
		l.treeVersion++
		if e.plan != nil {
			l.plan, l.blob, l.blobSaved = e.plan.json, e.plan.blob, false
		}
	}
	l.adopt(next, r)
	return err
}

// recovered records what the worker runs after a recovery reload: the
// applied plan once it took effect, nothing the agent can vouch for
// otherwise.
func (l *ledger) recovered(ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forget(func(s *agentState) {
		s.Running, s.WorkerOps = planRef{}, planRef{}
		if ok && s.Applied.complete() {
			s.Running, s.WorkerOps = s.Applied, s.Applied
		}
		clearPending(s)
	})
}

// lkgRestored records that the last-known-good set is on disk and loaded
// again: the journal, which described the way back to it, starts afresh.
// The record needs no sync: a start that misses it finds the journal's
// entries describing the set it holds.
func (l *ledger) lkgRestored() error {
	return l.commit(&logRecord{ResetJournal: true}, false, func(*agentState) {})
}

// repairPending schedules a reload of ref at at, which the pacer fires:
// the repair of a worker a read-back found diverging, or of a recovery
// reload that got no verdict.
func (l *ledger) repairPending(ref planRef, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forget(func(s *agentState) { s.Pending, s.PendingAt = ref, at })
}

// reloadedAs records, synced, that the worker loaded ref by a reload the
// pacer or a repair made: it runs ref, ref is the last-known-good, and the
// journal starts afresh. last, when set, is that reload's answer, as a
// controller polling for a scheduled reload's verdict reads it.
func (l *ledger) reloadedAs(ref planRef, last *ApplyResult) error {
	return l.commit(&logRecord{ResetJournal: true}, true, func(s *agentState) {
		s.Running, s.WorkerOps, s.LKG = ref, ref, ref
		if last != nil {
			clearPending(s)
			s.LastApply = last
		}
	})
}

// scheduledRefused records, synced, a scheduled reload HAProxy refused or
// gave no verdict on: the tree back as the pending reload's applies found
// it (tree), the applied pair before them where that worked, the worker's
// pairs where a reload without a verdict was followed by a recovery
// reload, and the answer (last).
func (l *ledger) scheduledRefused(st agentState, tree map[string]*FileAt, restored, noVerdict bool, last ApplyResult, now time.Time) error {
	return l.commit(&logRecord{Tree: tree}, true, func(s *agentState) {
		s.Applied = planRef{}
		if restored {
			s.Applied = st.PendingBase
		}
		if noVerdict {
			s.Running, s.WorkerOps = planRef{}, planRef{}
			if last.Rollback.Reloaded {
				s.Running, s.WorkerOps = s.Applied, s.Applied
			}
		}
		s.TreeChangedAt = now
		clearPending(s)
		s.LastApply = cloneResult(&last)
	})
}

// compact writes the state as a fresh snapshot and empties the log. The
// caller has made every file the log's records could redo durable first.
func (l *ledger) compact() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Blob.complete() && !l.blobSaved {
		blob, err := l.storedBlob()
		if err == nil {
			err = l.log.replace(l.blobPath, blob)
		}
		if err != nil {
			return fmt.Errorf("write the plan blob: %w", err)
		}
		l.blobSaved = true
	}
	snap := &logRecord{Seq: l.seq, Kind: recordSnapshot, State: &l.st, Journal: l.st.Journal, Tree: treeDelta(nil, l.tree)}
	if err := l.log.compact(snap); err != nil {
		return err // the caller logs it, once per run of failures
	}
	l.resetPending = false
	if l.broken != nil {
		l.logger.Info("the agent's state log records again: a new snapshot holds the whole state")
	}
	l.broken = nil
	return nil
}

// promote makes v the last-known-good plan and empties the journal, in
// memory: the next record carries both, the state and the journal's reset.
func (l *ledger) promote(v planRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st.LKG, l.st.Journal, l.resetPending = v, nil, true
}

// reserveProofs takes the next n proof numbers and returns the first. The
// counter reaches the disk with the apply's own record, which is synced
// before any answer reports a proof, so a proof is never reported twice,
// not even across a power loss.
func (l *ledger) reserveProofs(n uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.ProofGeneration > ^uint64(0)-n {
		return 0, errors.New(msgProofsExhausted)
	}
	l.st.ProofGeneration += n
	return l.st.ProofGeneration - n + 1, nil
}

// compactDue reports whether the log should be compacted: it is long, a
// write failed and only a new snapshot can be trusted again, or the last
// compaction failed.
func (l *ledger) compactDue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.applying && (l.log.full() || l.broken != nil || l.stuckBy != nil)
}

// keepLogAhead keeps zeros written past the log's end (keepAhead),
// never while an apply is in flight: its end record would wait behind
// them.
func (l *ledger) keepLogAhead() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.applying || l.broken != nil {
		return
	}
	if err := l.log.keepAhead(); err != nil {
		l.breakLog(err)
	}
}

// mustCompact reports a log that must be compacted before anything else
// writes to it: broken, stuck, or overdue.
func (l *ledger) mustCompact() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken != nil || l.stuckBy != nil || l.log.overdue()
}

// stuck records how the last compaction ended: err, or nil once one
// succeeded.
func (l *ledger) stuck(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stuckBy = err
}

// fallBehind records that the tree does not hold what an answered apply
// landed (err), or, with nil, that it does again.
func (l *ledger) fallBehind(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.behind = err
}

// faults are the ledger's reasons not to be ready, each nil when it does not
// hold: the broken log, the tree behind the state, the failed compaction.
func (l *ledger) faults() (broken, behind, stuck error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken, l.behind, l.stuckBy
}

func (l *ledger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log.f.Close()
}

func applyTreeDelta(tree map[string]FileAt, delta map[string]*FileAt) {
	for p, at := range delta {
		if at == nil {
			delete(tree, p)
		} else {
			tree[p] = *at
		}
	}
}

// restart adopts the state, tree and inventory the start arrived at, in
// memory: the start's snapshot writes them.
func (l *ledger) restart(st agentState, tree map[string]FileAt, inv Inventory) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st, l.tree, l.inventory = st, tree, inv
	l.inventory.Generation = 1
	l.treeVersion++
}

// ---------------------------------------------------------------------------
// Reading. Readers take copies under the lock and never hold it across I/O.

func (l *ledger) view() (agentState, map[string]FileAt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.clone(), maps.Clone(l.tree)
}

func (l *ledger) state() agentState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.clone()
}

// conflictOf is the 409 answer of a fenced apply. The 409, the state answer
// and every apply result report the same pairs, copied field by field: the
// wire types keep their fields flat, in the order of their JSON, so that a
// reader sees each answer as it travels.
func conflictOf(s *agentState, reason string) Conflict {
	return Conflict{
		AppliedPlanID: s.Applied.ID, AppliedPlanProof: s.Applied.Proof, AppliedToken: s.Token,
		RunningPlanID: s.Running.ID, RunningPlanProof: s.Running.Proof,
		WorkerOpsPlanID: s.WorkerOps.ID, WorkerOpsPlanProof: s.WorkerOps.Proof,
		LKGPlanID: s.LKG.ID, LKGPlanProof: s.LKG.Proof, Reason: reason,
	}
}

// stateAnswer builds the answer of GET /v1/state.
func (l *ledger) stateAnswer(agentVersion string, withPlan bool, pending PendingDeletes) State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.st
	out := State{
		APIVersion: APIVersion, AgentVersion: agentVersion, PlanSchemaVersion: s.SchemaVersion,
		AgentOps: slices.Clone(opKinds[:]), Features: []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches, FeaturePlanPatch},
		HAProxy: s.Worker, Generation: s.Generation,
		AppliedPlanID: s.Applied.ID, AppliedPlanProof: s.Applied.Proof,
		RunningPlanID: s.Running.ID, RunningPlanProof: s.Running.Proof,
		WorkerOpsPlanID: s.WorkerOps.ID, WorkerOpsPlanProof: s.WorkerOps.Proof,
		AppliedToken: s.Token, LKGPlanID: s.LKG.ID, LKGPlanProof: s.LKG.Proof,
		AppliedPlanStored: s.Blob.complete() && s.Blob == s.Applied,
		Files:             maps.Clone(l.tree), Inventory: *cloneInventory(&l.inventory),
		PendingDeletes: pending, InvariantViolation: l.lastInvariant, LastApply: cloneResult(s.LastApply),
	}
	if out.AppliedPlanStored && withPlan {
		// A blob that does not encode is left out: the reader then sees
		// applied_plan_stored without a plan, as for one it did not ask.
		out.AppliedPlan, _ = l.storedBlob()
	}
	if s.reloadPending() {
		out.ReloadPendingAt = s.PendingAt.UTC().Format(time.RFC3339Nano)
	}
	return out
}

// fillResult copies the baseline into a result. The inventory rides only
// the first answer after it changed.
func (l *ledger) fillResult(r *ApplyResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fillBaseline(r, &l.st)
	if l.inventory.Generation > l.inventoryReported {
		r.Inventory = cloneInventory(&l.inventory)
		l.inventoryReported = l.inventory.Generation
	}
}

func fillBaseline(r *ApplyResult, s *agentState) {
	r.AppliedPlanID, r.AppliedPlanProof, r.AppliedToken = s.Applied.ID, s.Applied.Proof, s.Token
	r.RunningPlanID, r.RunningPlanProof = s.Running.ID, s.Running.Proof
	r.WorkerOpsPlanID, r.WorkerOpsPlanProof = s.WorkerOps.ID, s.WorkerOps.Proof
	r.LKGPlanID, r.LKGPlanProof = s.LKG.ID, s.LKG.Proof
	r.HAProxy = s.Worker
}

// ---------------------------------------------------------------------------
// The worker, the inventory and the pacing clock.

// invalidate forgets the applied and worker-ops baselines: the next auto
// apply must reload. The counter lets an apply in flight see it was overtaken.
func (l *ledger) invalidate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.invalidations++
	l.forget(func(s *agentState) { s.Applied, s.WorkerOps = planRef{}, planRef{} })
}

func (l *ledger) invalidationCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.invalidations
}

// adoptWorker records the worker that answers now and its listing (nil
// when it could not be read). A worker the agent did not start loaded
// whatever was on disk, so nothing it runs can be vouched for.
func (l *ledger) adoptWorker(info HAProxyInfo, inv *Inventory, foreign bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if inv != nil {
		fresh := *inv
		// The generation is taken here, not before the read: an apply may
		// fold certificates into the inventory meanwhile.
		fresh.Generation = l.inventory.Generation + 1
		l.inventory = fresh
	}
	if foreign {
		l.invalidations++
	}
	l.forget(func(s *agentState) {
		s.Worker = info
		if foreign {
			s.Applied, s.Running, s.WorkerOps = planRef{}, planRef{}, planRef{}
		}
	})
}

// foldCreated adds the certificates and CA files a batch created to the
// inventory, copying the slices an earlier answer may share.
func (l *ledger) foldCreated(certs, caFiles []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	inv := &l.inventory
	changed := false
	add := func(list *[]string, created []string) {
		for _, v := range created {
			if !slices.Contains(*list, v) {
				*list, changed = slices.Sorted(slices.Values(append(slices.Clone(*list), v))), true
			}
		}
	}
	add(&inv.Certs, certs)
	add(&inv.CAFiles, caFiles)
	if changed {
		inv.Generation++
	}
}

// reloaded notes a reload that took effect, for the pacing window and the
// bound on repair reloads.
func (l *ledger) reloaded(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastReload, l.repairs = now, 0
}

// pacingDue is the end of the pacing window: a reload asked for before it
// is scheduled at it.
func (l *ledger) pacingDue(interval time.Duration) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastReload.Add(interval)
}

// maxRepairReloads bounds the repair reloads scheduled after recovery
// reloads that got no verdict, until a reload succeeds.
const maxRepairReloads = 5

// takeRepair counts one more repair reload, if the bound allows it.
func (l *ledger) takeRepair() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.repairs >= maxRepairReloads {
		return false
	}
	l.repairs++
	return true
}

func (l *ledger) noteInvariant(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastInvariant = name
}

// ---------------------------------------------------------------------------
// The tree a state read re-hashes, and the plan blob.

// observed is the ownership set a verified read hashes, and the tree
// version it compares against.
func (l *ledger) observed() ([]string, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.tree)), l.treeVersion
}

// refreshed adopts a verified read's observation unless the tree changed
// since version or an apply is in flight (its end records the tree it
// leaves). Entries whose bytes did not change keep their proofs.
func (l *ledger) refreshed(fresh map[string]FileAt, version uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.treeVersion != version || l.applying || l.behind != nil {
		return
	}
	keepProofs(l.tree, fresh)
	if delta := treeDelta(l.tree, fresh); len(delta) > 0 {
		l.tree = fresh
		l.treeVersion++
		l.write(&logRecord{Kind: recordState, State: &l.st, Tree: delta}, false)
	}
}

// treeDelta is what turns old into fresh.
func treeDelta(old, fresh map[string]FileAt) map[string]*FileAt {
	delta := map[string]*FileAt{}
	for p, at := range fresh {
		if prev, ok := old[p]; !ok || prev != at {
			delta[p] = &at
		}
	}
	for p := range old {
		if _, ok := fresh[p]; !ok {
			delta[p] = nil
		}
	}
	return delta
}

// keepProofs carries each proof of old over to the fresh observation of
// the same path when digest and size did not change: the bytes are the ones
// the proof vouched for.
func keepProofs(old, fresh map[string]FileAt) {
	for p, at := range fresh {
		if prev, ok := old[p]; ok && prev.Digest == at.Digest && prev.Size == at.Size {
			at.Proof = prev.Proof
			fresh[p] = at
		}
	}
}

// planUpload is a plan as an apply's plan part or a PUT /v1/plan body
// brought it, checked: its canonical JSON, and the form it came in, which
// is what a record of it carries.
type planUpload struct {
	json  []byte
	blob  []byte     // a whole blob, kept byte for byte
	patch *PlanPatch // or the splices of the held plan it came as
}

// errPlanBaseGone: a plan patch is cut from a plan the agent does not hold
// (any more). Nothing is wrong with the request: the controller is asked
// for the whole blob, as for a file whose patch base is gone.
var errPlanBaseGone = errors.New("the plan patch is cut from a plan the agent does not hold")

// takePlan checks a plan that travels for plan planID: a PlanPatch when
// its Content-Type is application/json, a blob otherwise. A blob is
// decoded (checkPlanBlob); a patch is only spliced into the held plan's
// JSON and hashed: the held JSON was checked when it arrived whole, and a
// plan id is by definition the hash of the plan's canonical JSON.
func (l *ledger) takePlan(b []byte, contentType, planID string) (*planUpload, error) {
	if mt, _, _ := mime.ParseMediaType(contentType); mt != "application/json" {
		js, err := checkPlanBlob(b, planID)
		if err != nil {
			return nil, err
		}
		return &planUpload{json: js, blob: b}, nil
	}
	var patch PlanPatch
	if err := json.Unmarshal(b, &patch); err != nil {
		return nil, fmt.Errorf("plan patch does not decode: %w", err)
	}
	l.mu.Lock()
	id, base := l.heldPlanLocked(), l.plan
	l.mu.Unlock()
	if id == "" || patch.BaseDigest != id {
		return nil, errPlanBaseGone
	}
	js, err := splicePlan(nil, base, &patch)
	if err != nil {
		return nil, err
	}
	if got := Digest(js); got != planID {
		return nil, fmt.Errorf("plan patch makes a plan whose content hashes to %q, not plan %q", got, planID)
	}
	return &planUpload{json: js, patch: &patch}, nil
}

// carry puts the plan on r as it came, whole or as its patch.
func (up *planUpload) carry(r *logRecord) {
	if up != nil {
		r.Blob, r.PlanPatch = up.blob, up.patch
	}
}

var errPlanMoved = errors.New("the plan is no longer the applied plan")

// storePlan stores the plan of the applied pair: a synced record carries
// it, whole or as its patch, until the next snapshot writes its blob's
// file. A patch whose base is no longer the held plan is errPlanBaseGone.
func (l *ledger) storePlan(ref planRef, up *planUpload) (PlanMoved, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	moved := PlanMoved{AppliedPlanID: l.st.Applied.ID, AppliedPlanProof: l.st.Applied.Proof}
	if !samePlanRef(l.st.Applied, ref) {
		return moved, errPlanMoved
	}
	if up.patch != nil && up.patch.BaseDigest != l.heldPlanLocked() {
		return moved, errPlanBaseGone
	}
	if l.st.Blob == ref && l.heldPlanLocked() == ref.ID {
		return moved, nil // held already: an id is the hash of the plan's content
	}
	next := l.st.clone()
	next.Blob = ref
	r := &logRecord{Kind: recordState, State: &next}
	up.carry(r)
	if err := l.write(r, true); err != nil {
		return moved, err
	}
	l.plan, l.blob, l.blobSaved = up.json, up.blob, false
	l.adopt(next, r)
	return moved, nil
}

// heldPlanID is the id of the stored plan, "" when there is none.
func (l *ledger) heldPlanID() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldPlanLocked()
}

// heldPlanLocked is heldPlanID for a caller that holds mu.
func (l *ledger) heldPlanLocked() string {
	if !l.st.Blob.complete() || l.plan == nil {
		return ""
	}
	return l.st.Blob.ID
}

// storedBlob is the stored plan's blob, encoded from its JSON the first
// time a state read or a snapshot needs it after the plan came as a patch:
// most applies are never read back whole, and compressing megabytes of
// JSON on each would cost more than the patch saved. The caller holds mu.
func (l *ledger) storedBlob() ([]byte, error) {
	if l.blob == nil {
		blob, err := planBlobOf(l.plan, l.st.Blob.ID)
		if err != nil {
			l.logger.Error("could not encode the stored plan's blob", "err", err)
			return nil, err
		}
		l.blob = blob
	}
	return l.blob, nil
}

// cloneInventory and cloneResult copy deeply enough that the copy shares
// nothing mutable with the original; nil stays nil.
func cloneInventory(inv *Inventory) *Inventory {
	if inv == nil {
		return nil
	}
	return &Inventory{Generation: inv.Generation, Maps: slices.Clone(inv.Maps), Certs: slices.Clone(inv.Certs),
		CAFiles: slices.Clone(inv.CAFiles), CRLFiles: slices.Clone(inv.CRLFiles), CRTLists: slices.Clone(inv.CRTLists)}
}

func cloneResult(r *ApplyResult) *ApplyResult {
	if r == nil {
		return nil
	}
	c := *r
	c.OpResults = slices.Clone(c.OpResults)
	clonePtr(&c.Reload)
	clonePtr(&c.Rollback)
	clonePtr(&c.Error)
	c.Inventory = cloneInventory(c.Inventory)
	return &c
}

func clonePtr[T any](p **T) {
	if *p != nil {
		v := **p
		*p = &v
	}
}
