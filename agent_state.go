// This file owns the agent's persistent state (agent.md §5, §10): the state
// file's shape, its atomic saves, the plan-blob file, and the small pieces of
// state bookkeeping every other part of the agent shares — role-proof pairs,
// the tree, the inventory, invalidation and the answer of GET /v1/state. It
// never talks to HAProxy; everything here runs under the state mutex, which
// is never held across HAProxy I/O or hashing.
package haptic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"
)

// Transaction phases (agent.md §5.2). "committed" is never written; a state
// file holding it is treated as idle.
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
	stateTempPattern = ".haptic-agent-state-*"
	planBlobFile     = ".haptic-agent-plan.bin"
	planBlobPattern  = ".haptic-agent-plan-*"
	privateFileMode  = 0o600
)

// agentState is the state file: one JSON object, fields in this order
// (agent.md §5.1). There are no per-file digests: disk is the authority and
// tree_digest is one observation of it.
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
}

// nackRecord is the known-bad cache's one record (agent.md §9.10). The work
// bytes are not persisted, so a record read back after a restart can never
// hit; adoptDisk clears it anyway.
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

func (s *agentState) applied() planRef   { return planRef{s.AppliedPlanID, s.AppliedPlanProof} }
func (s *agentState) running() planRef   { return planRef{s.RunningPlanID, s.RunningPlanProof} }
func (s *agentState) workerOps() planRef { return planRef{s.WorkerOpsPlanID, s.WorkerOpsPlanProof} }
func (s *agentState) lkg() planRef       { return planRef{s.LKGPlanID, s.LKGPlanProof} }

func (s *agentState) setApplied(p planRef)   { s.AppliedPlanID, s.AppliedPlanProof = p.ID, p.Proof }
func (s *agentState) setRunning(p planRef)   { s.RunningPlanID, s.RunningPlanProof = p.ID, p.Proof }
func (s *agentState) setWorkerOps(p planRef) { s.WorkerOpsPlanID, s.WorkerOpsPlanProof = p.ID, p.Proof }
func (s *agentState) setLKG(p planRef)       { s.LKGPlanID, s.LKGPlanProof = p.ID, p.Proof }

func (s *agentState) pending() planRef {
	return planRef{s.PendingReloadPlanID, s.PendingReloadPlanProof}
}

// reloadPending reports whether a scheduled reload is waiting for the pacer.
func (s *agentState) reloadPending() bool { return !s.ReloadPendingAt.IsZero() }

// loadState reads the state file. A missing file is the empty state; a file
// that cannot be read or parsed is fatal, because guessing would risk
// deleting files the agent does not own.
func loadState(path string) (agentState, error) {
	var st agentState
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse %s: %w", path, err)
	}
	if st.Phase == phaseCommitted {
		st.Phase = phaseIdle
	}
	slices.Sort(st.ManifestPaths)
	st.ManifestPaths = slices.Compact(st.ManifestPaths)
	return st, nil
}

// saveLocked persists the whole state, the journal and a snapshot of the
// deferred-delete queue included. Callers hold a.mu.
func (a *Agent) saveLocked() error {
	a.st.PendingDeletes = a.queue.Pending()
	b, err := json.Marshal(&a.st)
	if err != nil {
		return err
	}
	if err := replaceFile(a.paths.state, stateTempPattern, privateFileMode, bytes.NewReader(b)); err != nil {
		a.logger.Error("could not save the state file", "path", a.paths.state, "err", err)
		return err
	}
	if a.hooks.stopAtPhase != "" && a.st.Phase == a.hooks.stopAtPhase {
		a.logger.Warn("stopping at a persisted phase for a crash test", "phase", a.st.Phase)
		select {} // the test kills the process here
	}
	return nil
}

// save takes the state mutex and persists.
func (a *Agent) save() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.saveLocked()
}

// setPhase records the transaction phase and persists the whole state, the
// journal included (agent.md §5.2).
func (a *Agent) setPhase(phase string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.Phase = phase
	return a.saveLocked()
}

// setTreeLocked replaces the in-memory tree and moves the tree version, so
// that a verified read that hashed before this change does not adopt its
// older observation.
func (a *Agent) setTreeLocked(tree map[string]FileAt) {
	a.tree = tree
	a.treeVersion++
}

// invalidateLocked forgets the applied and worker baselines: the next auto
// apply must reload. The counter lets an apply in flight see that it was
// overtaken (agent.md §9.19).
func (a *Agent) invalidateLocked() {
	a.st.setApplied(planRef{})
	a.st.setWorkerOps(planRef{})
	a.invalidations++
}

func (a *Agent) invalidateBaseline() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.invalidateLocked()
}

// clearJournalLocked empties the journal, persists that, and only then
// deletes the backups, so that a crash in between never leaves a persisted
// journal pointing at deleted backups.
func (a *Agent) clearJournalLocked() error {
	old := a.st.Journal
	a.st.Journal = backupJournal{}
	if err := a.saveLocked(); err != nil {
		a.st.Journal = old
		return err
	}
	a.files.dropBackups(old)
	return nil
}

// conflictLocked builds the 409 answer of a fenced apply from the current state.
func (a *Agent) conflictLocked(reason string) Conflict {
	s := &a.st
	return Conflict{
		AppliedPlanID: s.AppliedPlanID, AppliedPlanProof: s.AppliedPlanProof,
		AppliedToken:  s.AppliedToken,
		RunningPlanID: s.RunningPlanID, RunningPlanProof: s.RunningPlanProof,
		WorkerOpsPlanID: s.WorkerOpsPlanID, WorkerOpsPlanProof: s.WorkerOpsPlanProof,
		LKGPlanID: s.LKGPlanID, LKGPlanProof: s.LKGPlanProof,
		Reason: reason,
	}
}

// planStoredLocked reports whether the stored blob belongs to the applied pair.
func (a *Agent) planStoredLocked() bool {
	s := &a.st
	return s.PlanBlobPlanID != "" && s.PlanBlobPlanID == s.AppliedPlanID &&
		s.PlanBlobPlanProof != "" && s.PlanBlobPlanProof == s.AppliedPlanProof
}

// stateLocked builds the answer of GET /v1/state (agent.md §8.3).
func (a *Agent) stateLocked(withPlan bool) State {
	s := &a.st
	files := make(map[string]FileAt, len(a.tree))
	for p, at := range a.tree {
		files[p] = at
	}
	out := State{
		APIVersion:         APIVersion,
		AgentVersion:       a.cfg.AgentVersion,
		PlanSchemaVersion:  s.PlanSchemaVersion,
		AgentOps:           opKinds(),
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
		AppliedPlanStored:  a.planStoredLocked(),
		Files:              files,
		Inventory:          cloneInventory(a.inventory),
		PendingDeletes:     a.queue.Pending(),
		InvariantViolation: a.lastInvariant,
	}
	if out.AppliedPlanStored && withPlan {
		out.AppliedPlan = a.blob
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

// applyResultLocked copies the baseline into a result. The inventory rides
// only the first answer after it changed (agent.md §9.26).
func (a *Agent) applyResultLocked(r *ApplyResult) {
	s := &a.st
	r.AppliedPlanID, r.AppliedPlanProof = s.AppliedPlanID, s.AppliedPlanProof
	r.RunningPlanID, r.RunningPlanProof = s.RunningPlanID, s.RunningPlanProof
	r.WorkerOpsPlanID, r.WorkerOpsPlanProof = s.WorkerOpsPlanID, s.WorkerOpsPlanProof
	r.AppliedToken = s.AppliedToken
	r.LKGPlanID, r.LKGPlanProof = s.LKGPlanID, s.LKGPlanProof
	r.HAProxy = s.ExpectedWorker
	if a.inventory.Generation > a.inventoryReported {
		inv := cloneInventory(a.inventory)
		r.Inventory = &inv
		a.inventoryReported = a.inventory.Generation
	}
}

func cloneInventory(inv Inventory) Inventory {
	return Inventory{
		Generation: inv.Generation,
		Maps:       cloneSlice(inv.Maps),
		Certs:      cloneSlice(inv.Certs),
		CAFiles:    cloneSlice(inv.CAFiles),
		CRLFiles:   cloneSlice(inv.CRLFiles),
		CRTLists:   cloneSlice(inv.CRTLists),
	}
}

// cloneResult copies a result deeply enough that the copy shares nothing
// mutable with the original.
func cloneResult(r ApplyResult) ApplyResult {
	r.OpResults = cloneSlice(r.OpResults)
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

// ---------------------------------------------------------------------------
// Plan blobs (agent.md §10).

// loadPlanBlob reads the stored blob at startup when the state names one; a
// read failure forgets the binding with a warning.
func (a *Agent) loadPlanBlob() {
	s := &a.st
	if s.PlanBlobPlanID == "" || s.PlanBlobPlanProof == "" {
		return
	}
	b, err := os.ReadFile(a.paths.planBlob)
	if err == nil && (len(b) == 0 || len(b) > MaxPlanBlobBytes) {
		err = fmt.Errorf("stored blob is %d bytes", len(b))
	}
	if err != nil {
		a.logger.Warn("could not read the stored plan blob; it is forgotten", "path", a.paths.planBlob, "err", err)
		s.PlanBlobPlanID, s.PlanBlobPlanProof = "", ""
		return
	}
	a.blob = b
}

// errPlanMoved reports that a blob was offered for a pair that is no longer
// the applied pair.
var errPlanMoved = errors.New("the plan is no longer the applied plan")

// storePlanBlobLocked writes the blob only for the applied pair.
func (a *Agent) storePlanBlobLocked(ref planRef, blob []byte) error {
	if !samePlanRef(a.st.applied(), ref) {
		return errPlanMoved
	}
	if err := replaceFile(a.paths.planBlob, planBlobPattern, privateFileMode, bytes.NewReader(blob)); err != nil {
		return err
	}
	a.blob = slices.Clone(blob)
	a.st.PlanBlobPlanID, a.st.PlanBlobPlanProof = ref.ID, ref.Proof
	return a.saveLocked()
}

// rebindPlanBlobLocked moves the stored blob's proof to the new applied
// proof when an apply re-landed the same plan without sending the blob: the
// controller sends it only when the plan changes.
func (a *Agent) rebindPlanBlobLocked(planID string) {
	s := &a.st
	if a.blob == nil || s.PlanBlobPlanID != planID || s.AppliedPlanID != planID ||
		s.AppliedPlanProof == "" || s.PlanBlobPlanProof == s.AppliedPlanProof {
		return
	}
	s.PlanBlobPlanProof = s.AppliedPlanProof
	a.saveLocked()
}
