// This file owns the agent's state: what it promised the controller (the
// applied, running, worker-ops and last-known-good pairs, the token, the
// generation and proofs), the tree it holds on disk with each file's proof,
// the runtime inventory, and what it must remember only while it runs (the
// known-bad record, the pacing clock, the counter that tells an apply it
// was overtaken). One type, the ledger, holds all of it behind one mutex;
// every change is a method named for what happened, and every change that
// the agent may report is written to the log before anyone can read it.
//
// It never talks to HAProxy and never touches the tree: callers do the I/O
// and tell the ledger what happened. The decisions (fencing, the outcome of
// a commit or an abort) are plain functions of a snapshot, below the type.

package haptic

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// Transaction phases, as an older agent persisted them. This agent keeps an
// apply's progress in the log instead (an open intent), but still recovers
// a state file an older agent left in the middle of an apply.
const (
	phaseIdle      = ""
	phaseStaged    = "staged"
	phaseVerified  = "verified"
	phaseBackedUp  = "backed_up"
	phaseWritten   = "written"
	phaseApplied   = "applied"
	phaseReloaded  = "reloaded"
	phaseScheduled = "scheduled"
	phaseCommitted = "committed"
	phaseAborted   = "aborted"
)

// phaseMayHaveWritten reports whether an apply interrupted in this phase may
// have begun writing the tree, so that recovery must restore the journal.
func phaseMayHaveWritten(phase string) bool {
	switch phase {
	case phaseBackedUp, phaseWritten, phaseApplied, phaseReloaded, phaseScheduled, phaseAborted:
		return true
	}
	return false
}

const (
	planBlobFile    = ".haptic-agent-plan.bin"
	planBlobPattern = ".haptic-agent-plan-*"
	privateFileMode = 0o600
)

// agentState is the persisted state: the snapshot's JSON object, fields in
// this order, and what log records change. There are no digests of file
// contents beyond the tree's: disk is the authority and tree_digest is one
// observation of it, re-checked at every start.
type agentState struct {
	Generation             uint64         `json:"generation"`
	ProofGeneration        uint64         `json:"proof_generation"`
	PlanSchemaVersion      int            `json:"plan_schema_version"`
	AppliedPlanID          string         `json:"applied_plan_id"`
	AppliedPlanProof       string         `json:"applied_plan_proof,omitempty"`
	RunningPlanID          string         `json:"running_plan_id"`
	RunningPlanProof       string         `json:"running_plan_proof,omitempty"`
	WorkerOpsPlanID        string         `json:"worker_ops_plan_id"`
	WorkerOpsPlanProof     string         `json:"worker_ops_plan_proof,omitempty"`
	LKGPlanID              string         `json:"lkg_plan_id"`
	LKGPlanProof           string         `json:"lkg_plan_proof,omitempty"`
	AppliedToken           Token          `json:"applied_token"`
	ManifestPaths          []string       `json:"manifest_paths,omitempty"`
	TreeDigest             string         `json:"tree_digest,omitempty"`
	ExpectedWorker         HAProxyInfo    `json:"expected_worker"`
	Journal                backupJournal  `json:"journal"`
	Phase                  string         `json:"phase,omitempty"`
	InFlightPlanID         string         `json:"in_flight_plan_id,omitempty"`
	PendingReloadPlanID    string         `json:"pending_reload_plan_id,omitempty"`
	PendingReloadPlanProof string         `json:"pending_reload_plan_proof,omitempty"`
	PlanBlobPlanID         string         `json:"plan_blob_plan_id,omitempty"`
	PlanBlobPlanProof      string         `json:"plan_blob_plan_proof,omitempty"`
	Nack                   *nackRecord    `json:"nack,omitempty"`
	LastApply              *ApplyResult   `json:"last_apply,omitempty"`
	ReloadPendingAt        time.Time      `json:"reload_pending_at,omitzero"`
	PendingDeletes         PendingDeletes `json:"pending_deletes"`

	// TreeChangedAt is when an apply last changed the tree on disk: a
	// worker that started later loaded this tree.
	TreeChangedAt time.Time `json:"tree_changed_at,omitzero"`
	// Files is the tree with each file's proof; only the snapshot holds it
	// whole, records carry the entries that changed.
	Files map[string]FileAt `json:"files,omitempty"`
	// LogSeq is the last log record the snapshot includes.
	LogSeq uint64 `json:"log_seq,omitempty"`
}

// nackRecord is the known-bad cache's one record. It lives in memory only:
// the cache is empty after every start.
type nackRecord struct {
	ManifestDigest string       `json:"manifest_digest"`
	Reason         string       `json:"reason"`
	Until          time.Time    `json:"until"`
	Result         *ApplyResult `json:"result"`
	work           []byte
}

// planRef is one (plan id, role proof) pair.
type planRef struct{ ID, Proof string }

// samePlanRef is the exact-identity comparison: both proofs non-empty, ids
// equal, proofs equal.
func samePlanRef(a, b planRef) bool {
	return a.Proof != "" && b.Proof != "" && a.ID == b.ID && a.Proof == b.Proof
}

func (p planRef) complete() bool { return p.ID != "" && p.Proof != "" }

func (s *agentState) applied() planRef   { return planRef{s.AppliedPlanID, s.AppliedPlanProof} }
func (s *agentState) running() planRef   { return planRef{s.RunningPlanID, s.RunningPlanProof} }
func (s *agentState) workerOps() planRef { return planRef{s.WorkerOpsPlanID, s.WorkerOpsPlanProof} }
func (s *agentState) lkg() planRef       { return planRef{s.LKGPlanID, s.LKGPlanProof} }

func (s *agentState) pending() planRef {
	return planRef{s.PendingReloadPlanID, s.PendingReloadPlanProof}
}

func (s *agentState) setApplied(p planRef)   { s.AppliedPlanID, s.AppliedPlanProof = p.ID, p.Proof }
func (s *agentState) setRunning(p planRef)   { s.RunningPlanID, s.RunningPlanProof = p.ID, p.Proof }
func (s *agentState) setWorkerOps(p planRef) { s.WorkerOpsPlanID, s.WorkerOpsPlanProof = p.ID, p.Proof }
func (s *agentState) setLKG(p planRef)       { s.LKGPlanID, s.LKGPlanProof = p.ID, p.Proof }

func (s *agentState) setPending(p planRef, due time.Time) {
	s.PendingReloadPlanID, s.PendingReloadPlanProof, s.ReloadPendingAt = p.ID, p.Proof, due
}

// reloadPending reports whether a scheduled reload is waiting for the pacer.
func (s *agentState) reloadPending() bool { return !s.ReloadPendingAt.IsZero() }

// ---------------------------------------------------------------------------
// The ledger.

// ledger is the one owner of the agent's state.
type ledger struct {
	logger *slog.Logger
	disk   disk
	paths  agentPaths
	files  *fileStore
	queue  *deleteQueue // Pending is a leaf lock, safe to take under mu

	mu        sync.Mutex
	st        agentState // the state as the agent reports it
	persisted agentState // the state the log and snapshot hold
	tree      map[string]FileAt
	blob      []byte
	log       *stateLog
	broken    error // the last write that failed; the log is not trusted for promises until one succeeds

	// Changes that wait for a sync: links no durable record needs once the
	// records written so far are durable, and the tree version a verified
	// read compares against.
	dropAfterSync []string
	treeVersion   uint64
	intentOpen    bool
	// intentSync is the intent's sync while it runs beside the apply's
	// ops; every other use of the log waits for it first.
	intentSync *intentSync

	// In memory only: gone after a restart by design.
	inventory         Inventory
	inventoryReported uint64
	invalidations     uint64
	nack              *nackRecord
	lastReload        time.Time
	lastInvariant     string
	repairs           int // repair reloads scheduled since the last good reload
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

// errLedgerBroken prefixes the refusal of a promise while the log cannot
// be written: the agent answers, but promises nothing it could not keep.
var errLedgerBroken = errors.New("the agent's state cannot be written")

// newLedger opens the state at the configured paths: the snapshot and the
// log replayed, nothing repaired yet (recover does that, once the file
// store exists and before HAProxy is probed).
func newLedger(d disk, paths agentPaths, files *fileStore, queue *deleteQueue, logger *slog.Logger) (*ledger, *loadedLog, error) {
	loaded, err := loadLog(d, paths.state)
	if err != nil {
		return nil, nil, err
	}
	w, err := openStateLog(d, paths.state, loaded.bytes, loaded.count)
	if err != nil {
		return nil, nil, fmt.Errorf("open the state log: %w", err)
	}
	l := &ledger{logger: logger, disk: d, paths: paths, files: files, queue: queue,
		st: loaded.st, tree: loaded.tree, log: w}
	if l.tree == nil {
		l.tree = map[string]FileAt{}
	}
	l.persisted = cloneState(l.st)
	l.persisted.LogSeq = loaded.seq
	l.blob = l.loadBlob(loaded)
	return l, loaded, nil
}

// loadBlob reads the stored plan blob when the state names one: the bytes
// the latest record carried, or the blob file. A read failure forgets the
// binding with a warning.
func (l *ledger) loadBlob(loaded *loadedLog) []byte {
	s := &l.st
	if s.PlanBlobPlanID == "" || s.PlanBlobPlanProof == "" {
		return nil
	}
	if b, ok := loaded.redo[redoBlobPath]; ok && len(b) > 0 {
		return b
	}
	b, err := readAllLimited(l.disk, l.paths.planBlob, MaxPlanBlobBytes)
	if err == nil && len(b) == 0 {
		err = errors.New("stored blob is empty")
	}
	if err != nil {
		l.logger.Warn("could not read the stored plan blob; it is forgotten", "path", l.paths.planBlob, "err", err)
		s.PlanBlobPlanID, s.PlanBlobPlanProof = "", ""
		return nil
	}
	return b
}

// redoBlobPath names the plan blob among a commit's redo entries; no
// manifest path can start with a dot.
const redoBlobPath = ".plan"

// ---------------------------------------------------------------------------
// Startup. What the log says was in flight is finished first, from the
// disk alone; then the tree is hashed and what it can still prove is kept;
// then the worker is probed and what it runs is recorded.

// recoverTree finishes what the previous process left in flight: a
// rollback is completed, an apply's intent is undone (the tree becomes the
// committed set again), and the bytes of committed files that a power loss
// may have taken are rewritten from the records that carried them. It
// reports whether HAProxy must reload what is on disk, because the worker
// may hold an interrupted apply's ops or files. It runs before anything
// else touches the tree.
func (l *ledger) recoverTree(loaded *loadedLog) (reload bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	files := l.files
	var restored *backupJournal
	switch {
	case loaded.back != nil:
		l.logger.Warn("a rollback was interrupted; finishing it")
		restored = loaded.back
	case loaded.intent != nil:
		l.logger.Warn("an apply was interrupted; putting the tree back as it was before it")
		if err := files.applyUndo(loaded.intent.Undo); err != nil {
			l.logger.Error("undoing the interrupted apply failed", "err", err)
		}
		reload = true
	case phaseMayHaveWritten(l.st.Phase):
		// An older agent's state file, in the middle of an apply.
		l.logger.Warn("an apply was interrupted; recovering", "phase", l.st.Phase)
		j := l.st.Journal
		restored = &j
	case l.st.Phase != phaseIdle:
		l.logger.Warn("an apply was interrupted; recovering", "phase", l.st.Phase)
		reload = true
	}
	next := cloneState(l.st)
	next.Phase, next.InFlightPlanID = phaseIdle, ""
	owned := next.ManifestPaths
	inJournal := map[string]bool{}
	if restored != nil {
		if err := files.restore(*restored); err != nil {
			l.logger.Error("restoring the journal during recovery failed", "err", err)
		}
		for _, e := range restored.Entries {
			inJournal[e.Path] = true
		}
		owned = restoredOwnership(owned, *restored)
		next.ManifestPaths = owned
		l.dropAfterSync = append(l.dropAfterSync, restored.backups()...)
		next.Journal = backupJournal{}
		next.setApplied(planRef{})
		next.setWorkerOps(planRef{})
		next.setRunning(planRef{})
		reload = true
	}
	if loaded.intent != nil {
		l.dropAfterSync = append(l.dropAfterSync, undoLinks(loaded.intent.Undo)...)
	}
	if l.redo(loaded, owned, inJournal) {
		// After a power loss HAProxy may have started before the agent and
		// loaded the tree the redo just changed: the worker is vouched for
		// only once it loads the tree as it is now.
		l.logger.Warn("committed files a crash took were rewritten; HAProxy reloads them")
		next.TreeChangedAt = time.Now()
		reload = true
	}
	if err := files.flush(); err != nil {
		l.logger.Error("making the recovered tree durable failed", "err", err)
	}
	l.st = next
	return reload
}

// redo rewrites each committed file whose bytes a record carried and that
// the disk no longer holds, and removes each committed deletion a power
// loss undid. A path a restored journal brought back is the journal's. It
// reports whether it changed the tree.
func (l *ledger) redo(loaded *loadedLog, owned []string, inJournal map[string]bool) (changed bool) {
	isOwned := make(map[string]bool, len(owned))
	for _, p := range owned {
		isOwned[p] = true
	}
	for _, p := range slices.Sorted(maps.Keys(loaded.redo)) {
		data := loaded.redo[p]
		at, ok := l.tree[p]
		if p == redoBlobPath || !isOwned[p] || inJournal[p] || !ok || at.Digest != DigestString(string(data)) {
			continue
		}
		abs, err := l.files.abs(p)
		var rewrote bool
		if err == nil {
			rewrote, err = l.files.rewrite(p, abs, data)
		}
		changed = changed || rewrote
		if err != nil {
			l.logger.Error("rewriting a committed file failed", "path", p, "err", err)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(loaded.gone)) {
		if isOwned[p] {
			continue
		}
		if abs, err := l.files.abs(p); err == nil {
			if _, err := l.files.disk.Lstat(abs); err == nil {
				changed = true
			}
		}
		if err := l.files.unlink(p); err != nil && !errors.Is(err, errInvalidPath) {
			l.logger.Error("removing a deleted file failed", "path", p, "err", err)
		}
	}
	return changed
}

// adoptTree compares the hashed tree with the one the state recorded. An
// equal tree keeps everything the state proves about it: the applied pair
// and token, the LKG pair, the plan blob's binding, the journal, and each
// file's proof. A tree that changed while the agent was away makes the
// applied plan unknown: the applied, running and worker-ops pairs, the
// file proofs, a pending reload and the blob's proof are forgotten.
func (l *ledger) adoptTree(tree map[string]FileAt) (kept bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	digest := treeDigest(tree)
	next := cloneState(l.st)
	kept = next.TreeDigest == digest && next.TreeDigest != ""
	if kept {
		keepProofs(l.tree, tree)
	} else {
		if next.TreeDigest != "" {
			l.logger.Warn("the tree changed while the agent was away; the applied plan is unknown",
				"state_digest", next.TreeDigest, "disk_digest", digest)
		}
		next.setApplied(planRef{})
		next.setRunning(planRef{})
		next.setWorkerOps(planRef{})
		next.setPending(planRef{}, time.Time{})
		next.PlanBlobPlanProof = ""
		next.TreeDigest = digest
	}
	l.tree = tree
	l.treeVersion++
	l.st = next
	return kept
}

// adoptWorkerAtStart records the worker the startup probe found, and its
// inventory. The same worker keeps the running and worker-ops pairs and a
// scheduled reload. Another one that started after the tree last changed
// loaded that tree: it runs the applied plan, and a scheduled reload
// already happened. Anything else runs something the agent cannot vouch
// for.
func (l *ledger) adoptWorkerAtStart(info HAProxyInfo, inv Inventory) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inventory = inv
	l.st = workerAtStart(l.st, info)
}

// workerAtStart is the decision of adoptWorkerAtStart.
func workerAtStart(s agentState, observed HAProxyInfo) agentState {
	next := cloneState(s)
	switch {
	case s.ExpectedWorker.SameWorker(observed):
	case !s.TreeChangedAt.IsZero() && observed.WorkerStartTimeUnixMicros > s.TreeChangedAt.UnixMicro() &&
		s.applied().complete():
		next.setRunning(s.applied())
		next.setWorkerOps(s.applied())
		next.setPending(planRef{}, time.Time{})
	default:
		next.setRunning(planRef{})
		next.setWorkerOps(planRef{})
	}
	next.ExpectedWorker = observed
	return next
}

// reloadedAtStart records the recovery reload: the new worker loaded the
// tree, which is the applied plan's when the state still knows it.
func (l *ledger) reloadedAtStart(ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	if ok && next.applied().complete() {
		next.setRunning(next.applied())
		next.setWorkerOps(next.applied())
	} else {
		next.setRunning(planRef{})
		next.setWorkerOps(planRef{})
	}
	next.setPending(planRef{}, time.Time{})
	l.st = next
}

// started writes the state startup arrived at as a fresh snapshot, so that
// the state file alone holds it and the log starts empty. A disk too full
// for that is logged, not fatal: the agent must start on a full disk, and
// the log still holds the truth.
func (l *ledger) started() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.write(recordState, &l.st, true); err != nil {
		return
	}
	if err := l.compact(); err != nil {
		l.logger.Warn("could not compact the agent's state at startup", "err", err)
	}
}

// ---------------------------------------------------------------------------
// Writing. Every state change goes through write: it becomes one record,
// durable when sync is set. promise changes the state only once the record
// is written; forget changes it in any case, because what it forgets must
// not be reported even when the disk refuses the record (the next start
// re-derives it from the tree and the worker anyway).

// recordOpt adds what a record carries besides state fields.
type recordOpt func(*logRecord)

func (l *ledger) write(kind string, next *agentState, sync bool, opts ...recordOpt) error {
	if err := l.awaitIntentSync(); err != nil {
		return err
	}
	set, err := changedFields(&l.persisted, next)
	if err != nil {
		return err
	}
	r := &logRecord{Seq: l.nextSeq(), Kind: kind, Set: set}
	for _, o := range opts {
		o(r)
	}
	if len(r.Set) == 0 && len(r.Tree) == 0 && r.Undo == nil && r.Redo == nil && r.Gone == nil && r.Back == nil && kind == recordState {
		if sync {
			return l.syncLog()
		}
		return nil
	}
	if err := l.log.append(r, sync); err != nil {
		l.broken = err
		l.logger.Error("could not write the agent's state", "kind", kind, "err", err)
		return fmt.Errorf("%w: %w", errLedgerBroken, err)
	}
	l.broken = nil
	l.persisted = cloneState(*next)
	l.persisted.LogSeq = r.Seq
	if sync {
		l.afterSync()
	}
	return nil
}

func (l *ledger) nextSeq() uint64 {
	l.persisted.LogSeq++
	return l.persisted.LogSeq
}

func (l *ledger) syncLog() error {
	if err := l.awaitIntentSync(); err != nil {
		return err
	}
	if err := l.log.sync(); err != nil {
		l.broken = err
		return fmt.Errorf("%w: %w", errLedgerBroken, err)
	}
	l.afterSync()
	return nil
}

// afterSync drops the links that only records now superseded needed.
func (l *ledger) afterSync() {
	if len(l.dropAfterSync) == 0 {
		return
	}
	l.files.dropLinks(l.dropAfterSync)
	l.dropAfterSync = nil
}

// sync makes every record written so far durable.
func (l *ledger) sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.syncLog()
}

// save writes the reported state as one synced record: whatever an earlier
// write could not persist is persisted now.
func (l *ledger) save() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.write(recordState, &l.st, true)
}

// promise writes next and adopts it only if the write succeeded.
func (l *ledger) promise(kind string, next agentState, sync bool, opts ...recordOpt) error {
	if err := l.write(kind, &next, sync, opts...); err != nil {
		return err
	}
	l.st = next
	return nil
}

// forget adopts next at once and writes it as well as it can.
func (l *ledger) forget(next agentState) error {
	l.st = next
	return l.write(recordState, &next, false)
}

func withTree(delta map[string]*FileAt) recordOpt {
	return func(r *logRecord) {
		if len(delta) > 0 {
			r.Tree = delta
		}
	}
}

// compactIfFull writes a new snapshot once the log is long: the files whose
// bytes rode in records are made durable first, so that no record the
// snapshot replaces is still needed to recover them.
func (l *ledger) compactIfFull() error {
	if !l.log.full() || l.intentOpen {
		return nil
	}
	return l.compact()
}

func (l *ledger) compact() error {
	if err := l.awaitIntentSync(); err != nil {
		return err
	}
	if err := l.files.flush(); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	if l.blob != nil && l.st.PlanBlobPlanID != "" {
		if err := l.writeBlobFile(l.blob, true); err != nil {
			return fmt.Errorf("compact: %w", err)
		}
	}
	snap := cloneState(l.persisted)
	snap.Files = maps.Clone(l.tree)
	snap.PendingDeletes = l.queue.pending()
	if err := l.log.compact(&snap); err != nil {
		l.logger.Error("could not compact the agent's state log", "err", err)
		return err
	}
	l.afterSync()
	return nil
}

// writeBlobFile replaces the plan blob file, durably when asked (the
// rename too).
func (l *ledger) writeBlobFile(blob []byte, durable bool) error {
	if err := replaceFile(l.disk, l.paths.planBlob, planBlobPattern, privateFileMode, bytes.NewReader(blob)); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return l.disk.SyncDir(parentDir(l.paths.planBlob))
}

// close compacts (so that the state file alone holds the state after a
// clean stop) and closes the log.
func (l *ledger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.log == nil {
		return
	}
	l.awaitIntentSync()
	if !l.intentOpen {
		l.compact()
	}
	l.log.close()
}

// ---------------------------------------------------------------------------
// Reading. Readers take copies under the lock and never hold it across I/O.

// view is a copy of the state for decisions and answers.
func (l *ledger) view() agentState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cloneState(l.st)
}

func (l *ledger) expectedWorker() HAProxyInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.ExpectedWorker
}

func (l *ledger) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.Generation
}

func (l *ledger) invalidationCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.invalidations
}

func (l *ledger) conflict(reason string) Conflict {
	l.mu.Lock()
	defer l.mu.Unlock()
	return conflictOf(&l.st, reason)
}

// conflictOf builds the 409 answer of a fenced apply from a state.
//
// The 409, the state answer and every apply result report the same
// promises (the applied, running, worker-ops and last-known-good pairs and
// the token), copied field by field here, in stateAnswer and in
// fillResultLocked. The copies stay: the three wire types keep their
// fields flat, in the order of their JSON, so that a reader of haptic.go
// sees each answer as it travels and a caller can build one with a
// composite literal; an embedded struct would hide both.
func conflictOf(s *agentState, reason string) Conflict {
	return Conflict{
		AppliedPlanID: s.AppliedPlanID, AppliedPlanProof: s.AppliedPlanProof,
		AppliedToken:  s.AppliedToken,
		RunningPlanID: s.RunningPlanID, RunningPlanProof: s.RunningPlanProof,
		WorkerOpsPlanID: s.WorkerOpsPlanID, WorkerOpsPlanProof: s.WorkerOpsPlanProof,
		LKGPlanID: s.LKGPlanID, LKGPlanProof: s.LKGPlanProof,
		Reason: reason,
	}
}

// planStored reports whether the stored blob belongs to the applied pair.
func planStored(s *agentState) bool {
	return s.PlanBlobPlanID != "" && s.PlanBlobPlanID == s.AppliedPlanID &&
		s.PlanBlobPlanProof != "" && s.PlanBlobPlanProof == s.AppliedPlanProof
}

// stateAnswer builds the answer of GET /v1/state.
func (l *ledger) stateAnswer(agentVersion string, withPlan bool) State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.st
	out := State{
		APIVersion:         APIVersion,
		AgentVersion:       agentVersion,
		PlanSchemaVersion:  s.PlanSchemaVersion,
		AgentOps:           slices.Clone(opKinds[:]),
		Features:           []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches},
		HAProxy:            s.ExpectedWorker,
		Generation:         s.Generation,
		AppliedPlanID:      s.AppliedPlanID,
		AppliedPlanProof:   s.AppliedPlanProof,
		RunningPlanID:      s.RunningPlanID,
		RunningPlanProof:   s.RunningPlanProof,
		WorkerOpsPlanID:    s.WorkerOpsPlanID,
		WorkerOpsPlanProof: s.WorkerOpsPlanProof,
		AppliedToken:       s.AppliedToken,
		LKGPlanID:          s.LKGPlanID,
		LKGPlanProof:       s.LKGPlanProof,
		AppliedPlanStored:  planStored(s),
		Files:              maps.Clone(l.tree),
		Inventory:          cloneInventory(l.inventory),
		PendingDeletes:     l.queue.pending(),
		InvariantViolation: l.lastInvariant,
	}
	if out.Files == nil {
		out.Files = map[string]FileAt{}
	}
	if out.AppliedPlanStored && withPlan {
		out.AppliedPlan = l.blob
	}
	if s.reloadPending() {
		out.ReloadPendingAt = s.ReloadPendingAt.UTC().Format(time.RFC3339Nano)
	}
	if s.LastApply != nil {
		la := cloneResult(*s.LastApply)
		out.LastApply = &la
	}
	return out
}

// fillResult copies the baseline into a result. The inventory rides only
// the first answer after it changed.
func (l *ledger) fillResult(r *ApplyResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fillResultLocked(r)
}

func (l *ledger) fillResultLocked(r *ApplyResult) {
	s := &l.st
	r.AppliedPlanID, r.AppliedPlanProof = s.AppliedPlanID, s.AppliedPlanProof
	r.RunningPlanID, r.RunningPlanProof = s.RunningPlanID, s.RunningPlanProof
	r.WorkerOpsPlanID, r.WorkerOpsPlanProof = s.WorkerOpsPlanID, s.WorkerOpsPlanProof
	r.AppliedToken = s.AppliedToken
	r.LKGPlanID, r.LKGPlanProof = s.LKGPlanID, s.LKGPlanProof
	r.HAProxy = s.ExpectedWorker
	if l.inventory.Generation > l.inventoryReported {
		inv := cloneInventory(l.inventory)
		r.Inventory = &inv
		l.inventoryReported = l.inventory.Generation
	}
}

// missing lists the manifest's files neither staged nor held with the
// proof the manifest quotes.
func (l *ledger) missing(m *Manifest, staged map[string]*stagedFile, unpatched map[string]bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, mf := range m.Files {
		if staged[mf.Path] != nil {
			continue
		}
		held, ok := l.tree[mf.Path]
		if !unpatched[mf.Path] && ok && mf.Proof != "" &&
			held.Proof == mf.Proof && held.Digest == mf.Digest && held.Size == mf.Size {
			continue
		}
		out = append(out, mf.Path)
	}
	slices.Sort(out)
	return out
}

// ---------------------------------------------------------------------------
// The known-bad cache: HAProxy's own verdict on a set of bytes, for a minute.

// lookupNack answers a cached NACK only for byte-equal work within its
// minute: digests are 64-bit and may collide. An expired record is dropped.
func (l *ledger) lookupNack(key string, work []byte, now time.Time) (ApplyResult, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nack
	if n == nil || len(work) == 0 {
		return ApplyResult{}, false
	}
	if now.After(n.Until) {
		l.nack = nil
		return ApplyResult{}, false
	}
	if len(n.work) == 0 || n.ManifestDigest != key || !bytes.Equal(n.work, work) || n.Result == nil {
		return ApplyResult{}, false
	}
	return cloneResult(*n.Result), true
}

func (l *ledger) rememberNack(key, stage string, work []byte, result ApplyResult, until time.Time) {
	res := cloneResult(result)
	res.Inventory = nil // an inventory delta rides one answer only
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nack = &nackRecord{ManifestDigest: key, Reason: stage, Until: until, Result: &res, work: slices.Clone(work)}
}

// ---------------------------------------------------------------------------
// Transitions of an apply, in the order an apply meets them.

// promoteLKG makes the applied plan the rollback baseline once the
// controller's validation vouches for it. The journal's backups go once
// the cleared journal is durable.
func (l *ledger) promoteLKG(v planRef) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !samePlanRef(v, l.st.applied()) || l.st.lkg() == v {
		return false, nil
	}
	next := cloneState(l.st)
	old := next.Journal
	next.setLKG(v)
	next.Journal = backupJournal{}
	if err := l.promise(recordState, next, false); err != nil {
		return false, err
	}
	l.dropAfterSync = append(l.dropAfterSync, old.backups()...)
	return true, nil
}

// promoteLKGAndSettle is promoteLKG, then settleFiles outside the lock.
func (l *ledger) promoteLKGAndSettle(v planRef) (bool, error) {
	promoted, err := l.promoteLKG(v)
	if promoted {
		l.settleFiles()
	}
	return promoted, err
}

// reserveProofs issues the applied proof, and the worker proof when asked.
// The counter reaches the disk with the apply's own record, which is
// synced before any answer reports a proof, so a proof is never reported
// twice, not even across a power loss.
func (l *ledger) reserveProofs(worker bool) (applied, workerProof string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	need := uint64(1)
	if worker {
		need = 2
	}
	if l.st.ProofGeneration > math.MaxUint64-need {
		return "", "", errors.New(msgProofsExhausted)
	}
	l.st.ProofGeneration++
	applied = fmt.Sprintf("a:%d", l.st.ProofGeneration)
	if worker {
		l.st.ProofGeneration++
		workerProof = fmt.Sprintf("a:%d", l.st.ProofGeneration)
	}
	return applied, workerProof, nil
}

// intend opens a change of the tree: it writes the intent record with its
// undo and starts its sync, and the returned durable waits for that sync.
// The apply calls durable before its first rename, so that a crash at any
// later point puts the tree back. Between the two it may already send its
// ops, which hides one round trip to HAProxy inside the sync: a process
// crash keeps the written record (the page cache outlives the agent), and a
// machine crash takes the worker's runtime changes down with it, so neither
// can leave ops in a worker that no record explains.
func (l *ledger) intend(planID string, undo []undoEntry) (durable func() error, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	err = l.promise(recordIntent, next, false, func(r *logRecord) {
		r.Undo = undo
		if r.Undo == nil {
			r.Undo = []undoEntry{}
		}
	})
	if err != nil {
		return nil, err
	}
	l.intentOpen = true
	p := &intentSync{done: make(chan struct{})}
	l.intentSync = p
	go func(log *stateLog) {
		p.err = log.sync()
		close(p.done)
	}(l.log)
	return func() error {
		<-p.done
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.intentSync == p {
			l.intentSync = nil
		}
		if p.err != nil {
			l.broken = p.err
			l.logger.Error("could not sync the agent's state", "kind", recordIntent, "err", p.err)
			return fmt.Errorf("%w: %w", errLedgerBroken, p.err)
		}
		l.afterSync()
		return nil
	}, nil
}

// intentSync is one intent's sync running in the background. Its result
// belongs to the apply that wrote the intent: others may wait for it, and
// fail with it, but only that apply's durable takes it, so a failure is
// never consumed by a write that happened to come first.
type intentSync struct {
	done chan struct{}
	err  error
}

// awaitIntentSync waits for the intent's sync, if one runs: a use of the
// log after a failed one fails too, since the kernel may have dropped the
// intent's unsynced bytes.
func (l *ledger) awaitIntentSync() error {
	p := l.intentSync
	if p == nil {
		return nil
	}
	<-p.done
	if p.err != nil {
		l.broken = p.err
		return fmt.Errorf("%w: %w", errLedgerBroken, p.err)
	}
	return nil
}

// observe records what a transaction wrote, without re-hashing: the bytes
// were verified when they were staged. It is what readers see at once; the
// commit makes it durable.
func (l *ledger) observe(delta map[string]*FileAt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	applyTreeDelta(l.tree, delta)
	l.treeVersion++
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

// pacingDue is the end of the pacing window: a reload asked for before it
// is scheduled at it.
func (l *ledger) pacingDue(interval time.Duration) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastReload.Add(interval)
}

// schedule queues a reload of ref for due. A pending reload is never moved
// or cancelled by a later apply: coalescing re-points it and keeps its due.
func (l *ledger) schedule(ref planRef, due time.Time) (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	if next.reloadPending() {
		due = next.ReloadPendingAt
	}
	next.setPending(ref, due)
	return due, l.promise(recordState, next, false)
}

// pending returns the scheduled reload, if any.
func (l *ledger) pending() (planRef, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.pending(), l.st.ReloadPendingAt
}

// clearPending forgets the pending reload: any reload attempt consumes it,
// and an abort rolls back the files it would load.
func (l *ledger) clearPending() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.st.reloadPending() && l.st.PendingReloadPlanID == "" {
		return
	}
	next := cloneState(l.st)
	next.setPending(planRef{}, time.Time{})
	l.forget(next)
}

// clearWorkerOps forgets the worker baseline: part of a batch may have
// landed.
func (l *ledger) clearWorkerOps() {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	next.setWorkerOps(planRef{})
	l.forget(next)
}

// invalidate forgets the applied and worker baselines: the next auto apply
// must reload. The counter lets an apply in flight see it was overtaken.
func (l *ledger) invalidate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.invalidateLocked()
}

func (l *ledger) invalidateLocked() {
	next := cloneState(l.st)
	next.setApplied(planRef{})
	next.setWorkerOps(planRef{})
	l.invalidations++
	l.forget(next)
}

// adoptWorker records a worker the agent did not start: it loaded whatever
// was on disk, so nothing it runs can be vouched for. inv is its listing,
// nil when it could not be read.
func (l *ledger) adoptForeignWorker(info HAProxyInfo, inv *Inventory) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setInventoryLocked(inv)
	next := cloneState(l.st)
	next.ExpectedWorker = info
	next.setRunning(planRef{})
	next.setApplied(planRef{})
	next.setWorkerOps(planRef{})
	l.invalidations++
	l.forget(next)
}

// adoptReloadedWorker records the worker a reload started.
func (l *ledger) adoptReloadedWorker(info HAProxyInfo, inv *Inventory) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setInventoryLocked(inv)
	next := cloneState(l.st)
	next.ExpectedWorker = info
	l.forget(next)
}

// setInventoryLocked stores a new listing under its own generation, taken
// here and not before the read: an apply may fold the certificates it
// created into the inventory while the listing is read, and a generation
// computed earlier would then be issued twice.
func (l *ledger) setInventoryLocked(inv *Inventory) {
	if inv == nil {
		return
	}
	fresh := *inv
	fresh.Generation = l.inventory.Generation + 1
	l.inventory = fresh
}

// recordReload notes a successful reload: the worker now runs ref, and a
// complete ref becomes the last-known-good plan, which clears the journal.
// The promotion stands only once the cleared journal is written: otherwise
// the journal and its backups are still what a rollback restores, and
// they lead back to the old LKG, not to ref. The reload itself happened,
// so the running and worker-ops pairs stay either way. Without promote the
// promotion is left to the apply's commit.
func (l *ledger) recordReload(ref planRef, now time.Time, promote bool) (promoted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastReload = now
	l.repairs = 0
	next := cloneState(l.st)
	next.setRunning(ref)
	next.setWorkerOps(ref)
	next.setPending(planRef{}, time.Time{})
	if !ref.complete() || !promote {
		l.forget(next)
		return false
	}
	old := next.Journal
	withLKG := next
	withLKG.setLKG(ref)
	withLKG.Journal = backupJournal{}
	if err := l.promise(recordState, withLKG, false); err != nil {
		l.logger.Error("the reloaded plan is not the last-known-good: its journal could not be cleared",
			"plan_id", ref.ID, "lkg_plan_id", next.LKGPlanID, "err", err)
		l.st = next
		return false
	}
	l.dropAfterSync = append(l.dropAfterSync, old.backups()...)
	return true
}

// settleFiles makes every file the store installed without a sync durable.
// It runs when a plan becomes the last-known-good: its files are what the
// next apply links into the journal, and a link is only as durable as the
// bytes it leads to. Syncing here, on a reload's path, keeps those syncs off
// the next runtime apply's.
func (l *ledger) settleFiles() {
	if err := l.files.flush(); err != nil {
		l.logger.Warn("could not make the tree durable", "err", err)
	}
}

// forgetRunning forgets what the worker runs: a reload may be taking
// effect that the agent has no verdict on.
func (l *ledger) forgetRunning() {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	next.setRunning(planRef{})
	next.setWorkerOps(planRef{})
	l.invalidations++
	l.forget(next)
}

// recordWorkerOps notes in-place ops that brought the worker to ref.
func (l *ledger) recordWorkerOps(ref planRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	next.setWorkerOps(ref)
	l.forget(next)
}

// foldCreated adds the certificates and CA files a batch created to the
// inventory, copying the slices an earlier answer may share.
func (l *ledger) foldCreated(certs, caFiles []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	inv := &l.inventory
	changed := false
	add := func(list []string, v string) []string {
		if slices.Contains(list, v) {
			return list
		}
		changed = true
		out := append(slices.Clone(list), v)
		slices.Sort(out)
		return out
	}
	for _, p := range certs {
		inv.Certs = add(inv.Certs, p)
	}
	for _, p := range caFiles {
		inv.CAFiles = add(inv.CAFiles, p)
	}
	if changed {
		inv.Generation++
	}
}

// noteInvariant remembers the most recent broken invariant for the state
// answer.
func (l *ledger) noteInvariant(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastInvariant = name
}

// ---------------------------------------------------------------------------
// The end of an apply: commit, rollback and abort.

// commit makes an apply's outcome durable in one synced record and only
// then visible: the new files' bytes that were not synced ride in it, and
// the links only the apply's undo needed are dropped afterwards. A failed
// commit changes nothing: the caller aborts.
func (l *ledger) commit(o outcome, c commitWrites) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := settle(l.st, o, l.invalidations)
	delta := c.delta
	if c.restored != nil {
		delta = l.restoreLocked(&next, c.restored)
	}
	// A plan the apply reloaded becomes the last-known-good in the same
	// record: the journal it clears is what a commit that cannot be written
	// rolls back through.
	var promotedBackups []string
	if o.ok && o.promote.complete() {
		promotedBackups = next.Journal.backups()
		next.setLKG(o.promote)
		next.Journal = backupJournal{}
	}
	redo := slices.Clone(c.redo)
	storeBlob := o.blob != nil && next.PlanBlobPlanID == o.ref.ID && next.PlanBlobPlanProof == o.ref.Proof
	if storeBlob {
		// The file serves a process crash at once; the record's copy serves
		// a power loss until the next compaction writes the file durably.
		// A blob too large for a record is made durable on its own.
		err := l.writeBlobFile(o.blob, len(o.blob) > maxInlineBytes)
		if err == nil && len(o.blob) <= maxInlineBytes {
			redo = append(redo, redoEntry{Path: redoBlobPath, Data: o.blob})
		}
		if err != nil {
			l.logger.Warn("could not store the plan blob", "plan_id", o.ref.ID, "err", err)
			next.PlanBlobPlanID, next.PlanBlobPlanProof = l.st.PlanBlobPlanID, l.st.PlanBlobPlanProof
			storeBlob = false
		}
	}
	err := l.promise(recordCommit, next, true, withTree(delta), func(r *logRecord) {
		r.Redo = redo
		r.Gone = c.gone
	})
	if err != nil {
		return err
	}
	if storeBlob {
		l.blob = slices.Clone(o.blob)
	}
	l.intentOpen = false
	applyTreeDelta(l.tree, delta)
	l.treeVersion++
	l.files.dropLinks(c.dropAfter)
	l.files.dropLinks(promotedBackups)
	l.compactIfFull()
	return nil
}

// commitWrites are what a commit's record carries besides the state: the
// tree entries the apply changed (or the tree a rollback restored), the
// bytes of files installed without a sync, the deleted paths, and the
// links to drop once the record is durable.
type commitWrites struct {
	delta     map[string]*FileAt
	restored  *restoredTree
	redo      []redoEntry
	gone      []string
	dropAfter []string
}

// restoreLocked puts the tree a rollback restored into next: its hashes
// (keeping the proofs of unchanged entries), its ownership and the cleared
// journal, whose backups go once the record is durable. It returns the
// tree delta for the record.
func (l *ledger) restoreLocked(next *agentState, restored *restoredTree) map[string]*FileAt {
	tree := restored.tree
	keepProofs(restored.before, tree)
	keepProofs(l.tree, tree)
	delta := treeDelta(l.tree, tree)
	l.dropAfterSync = append(l.dropAfterSync, next.Journal.backups()...)
	next.ManifestPaths = restored.owned
	next.TreeDigest = treeDigest(tree)
	next.Journal = backupJournal{}
	next.TreeChangedAt = time.Now()
	return delta
}

// beginRollback makes the rollback to the last-known-good set durable
// before any file moves, so that a crash in the middle of it is finished
// at the next start rather than left as a mix.
func (l *ledger) beginRollback(j backupJournal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := cloneState(l.st)
	jc := j.clone()
	err := l.promise(recordRollback, next, true, func(r *logRecord) { r.Back = &jc })
	if err == nil {
		l.intentOpen = true
	}
	return err
}

// treeDelta is what turns old into fresh.
func treeDelta(old, fresh map[string]FileAt) map[string]*FileAt {
	delta := map[string]*FileAt{}
	for p, at := range fresh {
		if prev, ok := old[p]; !ok || prev != at {
			v := at
			delta[p] = &v
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

// finishRun records the end of a run that did not commit: the outcome of
// settle and, when a rollback restored the last-known-good set, that tree,
// its ownership and the cleared journal (whose backups go once this is
// durable), in one synced record. One record, so that no restart can see
// the restored tree under the applied pair the rollback replaced.
func (l *ledger) finishRun(o outcome, restored *restoredTree) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := settle(l.st, o, l.invalidations)
	var delta map[string]*FileAt
	if restored != nil {
		delta = l.restoreLocked(&next, restored)
		applyTreeDelta(l.tree, delta)
		l.treeVersion++
	}
	l.intentOpen = false
	l.st = next
	return l.write(recordAbort, &next, true, withTree(delta))
}

// setJournal records the journal an apply's backup grew. It is written with
// the apply's intent, which follows at once.
func (l *ledger) setJournal(j backupJournal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st.Journal = j.clone()
}

// treeCopy returns a copy of the tree.
func (l *ledger) treeCopy() map[string]FileAt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.tree)
}

// observed is the set a verified read hashes, and the tree version it
// compares against: the committed ownership set plus the paths an apply in
// flight has already written, so that an observation made between an
// apply's write and its commit never drops the files that apply installed.
func (l *ledger) observed() ([]string, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	paths := slices.Clone(l.st.ManifestPaths)
	for p := range l.tree {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return slices.Compact(paths), l.treeVersion
}

// refreshed adopts a verified read's observation unless the tree changed
// since version. While an apply is in flight the observation is not
// written: the apply's commit records the tree it leaves.
func (l *ledger) refreshed(fresh map[string]FileAt, version uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.treeVersion != version {
		return false
	}
	keepProofs(l.tree, fresh)
	delta := treeDelta(l.tree, fresh)
	l.tree = fresh
	l.treeVersion++
	next := cloneState(l.st)
	next.TreeDigest = treeDigest(fresh)
	if l.intentOpen {
		l.st = next
		return true
	}
	l.st = next
	l.write(recordState, &next, false, withTree(delta))
	return true
}

// ---------------------------------------------------------------------------
// Plan blobs.

// errPlanMoved reports that a blob was offered for a pair that is no longer
// the applied pair.
var errPlanMoved = errors.New("the plan is no longer the applied plan")

// storeBlob stores the blob of the applied pair: its file, durably, and
// then its binding.
func (l *ledger) storeBlob(ref planRef, blob []byte) (PlanMoved, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	moved := PlanMoved{AppliedPlanID: l.st.AppliedPlanID, AppliedPlanProof: l.st.AppliedPlanProof}
	if !samePlanRef(l.st.applied(), ref) {
		return moved, errPlanMoved
	}
	if err := l.writeBlobFile(blob, true); err != nil {
		return moved, err
	}
	next := cloneState(l.st)
	next.PlanBlobPlanID, next.PlanBlobPlanProof = ref.ID, ref.Proof
	if err := l.promise(recordState, next, true); err != nil {
		return moved, err
	}
	l.blob = slices.Clone(blob)
	return moved, nil
}

// ---------------------------------------------------------------------------
// The decisions: plain functions of a state.

// outcome is how an apply (or a scheduled reload, or a revert) ended.
type outcome struct {
	result ApplyResult
	ok     bool

	ref       planRef // the applied pair this apply records
	token     Token
	schema    int
	paths     []string // the manifest's paths, sorted; nil for a revert or a scheduled reload
	tree      string   // the tree digest after the apply
	landsTree bool     // a non-revert apply: its paths become the ownership set

	revert         bool
	scheduled      bool   // a scheduled reload fired by the pacer, not an apply
	invalidations0 uint64 // the invalidation counter when the run began

	// refused: HAProxy itself refused the reload and the previous worker
	// keeps serving, untouched (no op ran). If the rollback also put back
	// exactly the tree the apply started from (restoredTree), the baseline
	// the apply started from holds again: before.
	refused      bool
	restoredTree bool
	before       agentState

	blob []byte // the apply's plan part

	// promote: the apply reloaded this pair, which becomes the
	// last-known-good with the commit.
	promote planRef
}

// settle is the state after an outcome. An OK apply bumps the generation
// and records its applied pair, token and tree; one that an invalidation
// overtook records its tree but not its pair. A failed apply clears the
// applied pair, except a refused reload that left everything as it was,
// which restores the baseline it started from. A scheduled reload never
// moves the generation; a failed one clears the applied pair.
func settle(s agentState, o outcome, invalidations uint64) agentState {
	next := cloneState(s)
	next.Phase, next.InFlightPlanID = phaseIdle, ""
	last := cloneResult(o.result)
	last.Inventory = nil
	next.LastApply = &last
	switch {
	case o.scheduled:
		if !o.ok {
			next.setApplied(planRef{})
		}
		return next
	case !o.ok:
		if o.refused && o.restoredTree {
			next.setApplied(o.before.applied())
			next.setRunning(o.before.running())
			next.setWorkerOps(o.before.workerOps())
			return next
		}
		next.setApplied(planRef{})
		return next
	}
	next.Generation++
	ref := o.ref
	if o.revert {
		ref = next.lkg()
	}
	if o.landsTree {
		next.PlanSchemaVersion = o.schema
		next.ManifestPaths = slices.Clone(o.paths)
		next.TreeDigest = o.tree
		next.TreeChangedAt = time.Now()
	}
	if invalidations != o.invalidations0 {
		next.setApplied(planRef{})
		return next
	}
	next.setApplied(ref)
	next.AppliedToken = o.token
	// While a reload is pending only an in-place batch moves the worker
	// baseline.
	if !next.reloadPending() {
		next.setWorkerOps(ref)
	}
	// The controller sends the blob only when the plan changes: a re-landed
	// plan keeps handing out the stored one under its new proof.
	switch {
	case o.blob != nil:
		next.PlanBlobPlanID, next.PlanBlobPlanProof = ref.ID, ref.Proof
	case next.PlanBlobPlanID == ref.ID && ref.Proof != "":
		next.PlanBlobPlanProof = ref.Proof
	}
	return next
}

// inPlaceWillRun reports whether the manifest's in-place ops will run: a
// reload is pending, or this reload apply lands inside the pacing window.
func inPlaceWillRun(m *Manifest, reloadPending, windowOpen bool) bool {
	return len(m.InPlaceOps) > 0 && (reloadPending || (m.Mode == ModeReload && windowOpen))
}

// fenceReason applies the seven fencing rules in order; "" means the
// manifest passes.
//
//  1. A token from an older leader epoch than the applied one is stale.
//  2. A revert is checked against nothing but the plan it refuses.
//  3. The previous plan must be the applied one (unknown_baseline when the
//     agent has none).
//  4. So must the previous token.
//  5. An exact apply that is not a reload needs the applied plan's proof.
//  6. An exact reload needs it too when the agent holds one.
//  7. An auto apply, or in-place ops that will run, need the exact worker
//     baseline they were composed against.
func fenceReason(m *Manifest, s *agentState, inPlaceRuns bool) string {
	exact := m.IdentityVersion == ExactIdentityVersion
	switch {
	case m.Token.LeaderEpoch < s.AppliedToken.LeaderEpoch:
		return ReasonStaleEpoch
	case m.Mode == ModeRevertLKG:
		if !carriesRefusedPlan(planRef{m.PlanID, m.PlanProof}, s) {
			return ReasonRevertTargetMismatch
		}
		return ""
	case m.ExpectedPrevPlanID != s.AppliedPlanID:
		if s.AppliedPlanID == "" {
			return ReasonUnknownBaseline
		}
		return ReasonPrevMismatch
	case m.ExpectedPrevToken != s.AppliedToken:
		return ReasonPrevMismatch
	case exact && m.Mode != ModeReload && (m.ExpectedPrevPlanProof == "" || m.ExpectedPrevPlanProof != s.AppliedPlanProof):
		return ReasonPrevMismatch
	case exact && m.Mode == ModeReload && s.AppliedPlanProof != "" && m.ExpectedPrevPlanProof != s.AppliedPlanProof:
		return ReasonPrevMismatch
	case (m.Mode == ModeAuto || inPlaceRuns) &&
		!samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, s.workerOps()):
		return ReasonWorkerOpsMismatch
	}
	return ""
}

// carriesRefusedPlan: a revert names the plan being refused, which is the
// applied or the worker-ops plan and cannot be the plan the worker runs.
func carriesRefusedPlan(ref planRef, s *agentState) bool {
	return ref.Proof != "" && !samePlanRef(ref, s.running()) &&
		(samePlanRef(ref, s.applied()) || samePlanRef(ref, s.workerOps()))
}

// fence checks a manifest against the current state and the pacing window.
func (l *ledger) fence(m *Manifest, now time.Time, interval time.Duration) (string, Conflict) {
	l.mu.Lock()
	defer l.mu.Unlock()
	window := now.Before(l.lastReload.Add(interval))
	reason := fenceReason(m, &l.st, inPlaceWillRun(m, l.st.reloadPending(), window))
	if reason == "" {
		return "", Conflict{}
	}
	return reason, conflictOf(&l.st, reason)
}

func cloneInventory(inv Inventory) Inventory {
	return Inventory{
		Generation: inv.Generation,
		Maps:       slices.Clone(inv.Maps),
		Certs:      slices.Clone(inv.Certs),
		CAFiles:    slices.Clone(inv.CAFiles),
		CRLFiles:   slices.Clone(inv.CRLFiles),
		CRTLists:   slices.Clone(inv.CRTLists),
	}
}

// cloneResult copies a result deeply enough that the copy shares nothing
// mutable with the original.
func cloneResult(r ApplyResult) ApplyResult {
	r.OpResults = slices.Clone(r.OpResults)
	if r.Reload != nil {
		v := *r.Reload
		r.Reload = &v
	}
	if r.Rollback != nil {
		v := *r.Rollback
		r.Rollback = &v
	}
	if r.Error != nil {
		v := *r.Error
		r.Error = &v
	}
	if r.Inventory != nil {
		v := cloneInventory(*r.Inventory)
		r.Inventory = &v
	}
	return r
}
