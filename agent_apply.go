// This file owns the apply pipeline of agent.md §9, in the order one apply
// flows through it: reading and checking the manifest, the fence, staging
// the parts, the missing answer, the known-bad cache, LKG promotion, role
// proofs, the write transaction, activation (runtime ops, in-place ops or a
// reload), the reload itself, worker checks, abort and rollback, and the
// commit. Pacing and read-back live in agent_pacing.go.
//
// It never decides what HAProxy should do: it executes exactly what the
// manifest asks, and whenever it cannot, it reloads the files on disk.
package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"time"
)

// Reload reasons, logged with every reload decision (agent.md §9.18).
const (
	reasonMode                 = "mode"
	reasonUnknownBaseline      = "unknown_baseline"
	reasonUnknownOp            = "unknown_op"
	reasonWorkerChanged        = "worker_changed"
	reasonOpRejected           = "op_rejected"
	reasonDeferredDeleteCommit = "deferred_delete_commit"
)

// Invariant names (agent.md §14), a closed set.
const (
	invGenerationMonotonic       = "generation_monotonic"
	invDiskIsTheDesiredSet       = "disk_is_the_desired_set"
	invRuntimeModeDoesNotReload  = "runtime_mode_does_not_reload"
	invReloadModeReloads         = "reload_mode_reloads"
	invNoopRunsNoOps             = "noop_runs_no_ops"
	invJournalOnlyWhileDiverged  = "journal_only_while_diverged"
	invMountProbeFoundEveryMount = "mount_probe_found_every_mount"
	invOpsExecutable             = "ops_executable"
	invRecoveryReload            = "recovery_reload"
)

const (
	nackTTL            = 60 * time.Second
	awaitWorkerPoll    = 100 * time.Millisecond
	msgInPlaceStale    = "in-place ops were composed against a different worker baseline"
	msgNoNewWorker     = "the new worker did not answer show info after the reload"
	msgProofsExhausted = "agent role proof sequence exhausted"
)

// applyRun is one apply in flight, from the fence to the answer.
type applyRun struct {
	m      *Manifest
	revert bool
	start  time.Time
	timing ApplyTiming

	staged    map[string]*stagedFile
	unpatched map[string]bool
	sawPlan   bool
	blob      []byte

	work    []byte
	workKey string

	appliedProof, workerProof string
	invalidationsAtStart      uint64

	txn      *fileTxn
	result   ApplyResult
	opsRan   bool
	reason   string
	readBack *compiledOps

	remember   bool // a deterministic refusal to cache once the result is final
	abortStage string
}

func (run *applyRun) stagedList() []*stagedFile {
	out := make([]*stagedFile, 0, len(run.staged))
	for _, f := range run.staged {
		out = append(out, f)
	}
	return out
}

func (run *applyRun) discardStaged() {
	for _, f := range run.staged {
		f.discard()
	}
}

func (run *applyRun) appliedRef() planRef { return planRef{run.m.PlanID, run.appliedProof} }

func (a *Agent) msSince(t time.Time) int64 { return a.now().Sub(t).Milliseconds() }

// ---------------------------------------------------------------------------
// The handler.

// handleApply is POST /v1/apply: everything up to the clock start, then the
// rest under the apply lock.
func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	if !a.Ready() {
		writeError(w, http.StatusServiceUnavailable, StageStartup, msgAgentInitialising)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxApplyBodyBytes)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, StageRequest, err.Error())
		return
	}
	m, err := readManifest(mr)
	if err == nil {
		normaliseLegacy(m)
		err = validateManifest(m, a.cfg.ConfigFile, a.files.Abs)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, StageManifest, err.Error())
		return
	}
	autoDowngrade(m)
	run := &applyRun{m: m, revert: m.Mode == ModeRevertLKG, start: a.now(),
		staged: map[string]*stagedFile{}, unpatched: map[string]bool{}}
	code, body := a.admitAndRun(run, mr)
	writeJSON(w, code, body)
}

// readManifest reads the first part, which must be the manifest.
func readManifest(mr *multipart.Reader) (*Manifest, error) {
	part, err := mr.NextRawPart()
	if err != nil {
		return nil, fmt.Errorf("no manifest part: %w", err)
	}
	defer part.Close()
	if name := part.FormName(); name != PartManifest {
		return nil, fmt.Errorf("first part is %q, expected %q", name, PartManifest)
	}
	b, err := io.ReadAll(io.LimitReader(part, MaxPlanBlobBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if len(b) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("manifest exceeds the %d-byte limit", MaxPlanBlobBytes)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("invalid manifest: %w", err)
	}
	return &m, nil
}

// normaliseLegacy forces a manifest without exact identity to reload and
// drops everything that needs exact identity (agent.md §9.3). An unknown or
// revert mode is left for validation to refuse, never turned into a write.
func normaliseLegacy(m *Manifest) {
	if m.IdentityVersion == ExactIdentityVersion {
		return
	}
	if m.Mode == ModeAuto {
		m.Mode = ModeReload
	}
	m.Ops, m.OpBatches, m.InPlaceOps = nil, nil, nil
	m.ExpectedWorkerOpsPlanID, m.ExpectedPrevPlanProof, m.ExpectedWorkerOpsPlanProof = "", "", ""
	m.WorkerOpsPlanID, m.WorkerOpsPlanProof = "", ""
	m.ValidatedPlanID, m.ValidatedPlanProof = "", ""
}

// validateManifest runs the checks of agent.md §9.4 in order; the first
// failure wins. abs applies the path rules and refuses reserved paths, so a
// manifest naming a socket is refused here rather than at staging.
func validateManifest(m *Manifest, config string, abs func(string) (string, error)) error {
	if err := m.ValidateOpBatches(); err != nil {
		return err
	}
	inPlace := len(m.InPlaceOps) > 0
	switch {
	case m.PlanID == "":
		return errors.New("plan_id is empty")
	case len(m.Files) > MaxFiles:
		return fmt.Errorf("%d files exceed the %d-file limit", len(m.Files), MaxFiles)
	case inPlace && (m.ExpectedWorkerOpsPlanID == "" || m.WorkerOpsPlanID == ""):
		return errors.New("in-place ops need expected_worker_ops_plan_id and worker_ops_plan_id")
	case inPlace && m.ExpectedWorkerOpsPlanProof == "":
		return errors.New("in-place ops need an exact expected worker plan proof")
	case (m.ValidatedPlanID == "") != (m.ValidatedPlanProof == ""):
		return errors.New("validated plan id and proof must be set together")
	case m.Mode == ModeRevertLKG && (m.IdentityVersion != ExactIdentityVersion || m.PlanProof == ""):
		return errors.New("a revert needs the refused plan proof")
	case m.Mode != ModeAuto && m.Mode != ModeReload && m.Mode != ModeRevertLKG:
		return fmt.Errorf("unknown mode %q", m.Mode)
	}
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if _, err := abs(f.Path); err != nil {
			return err
		}
		if seen[f.Path] {
			return fmt.Errorf("path %q appears twice in the manifest", f.Path)
		}
		seen[f.Path] = true
		if f.Digest == "" {
			return fmt.Errorf("file %q has no digest", f.Path)
		}
	}
	if m.Mode != ModeRevertLKG && !seen[config] {
		return fmt.Errorf("the manifest does not list the config file %q", config)
	}
	return nil
}

// autoDowngrade turns an auto apply that does not prove its worker baseline
// into a reload: such an apply never runs runtime ops (agent.md §9.5).
func autoDowngrade(m *Manifest) {
	if m.Mode == ModeAuto && m.ExpectedWorkerOpsPlanProof == "" && len(m.InPlaceOps) == 0 {
		m.Mode = ModeReload
		m.Ops, m.OpBatches = nil, nil
	}
}

// admitAndRun is everything after the clock start, under the apply lock.
func (a *Agent) admitAndRun(run *applyRun, mr *multipart.Reader) (int, any) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	defer run.discardStaged()
	m := run.m

	if reason := a.fence(m); reason != "" {
		a.metrics.applyRejected.inc(rejectedStageFencing)
		a.mu.Lock()
		c := a.conflictLocked(reason)
		a.mu.Unlock()
		a.logger.Info("apply fenced", "plan_id", m.PlanID, "reason", reason)
		return http.StatusConflict, c
	}
	if err := a.stageParts(run, mr); err != nil {
		a.metrics.applyRejected.inc(StageParts)
		a.logger.Info("apply refused: parts", "plan_id", m.PlanID, "err", err)
		return http.StatusBadRequest, ApplyError{Stage: StageParts, Message: err.Error()}
	}
	run.timing.StageMs = a.msSince(run.start)
	admitStart := a.now()
	if !run.revert {
		if missing := a.missingParts(run); len(missing) > 0 {
			return http.StatusConflict, Missing{Missing: missing}
		}
	}
	work, key, err := workIdentity(m)
	if err != nil {
		a.logger.Warn("could not encode the work identity; the known-bad cache is skipped", "err", err)
	}
	run.work, run.workKey = work, key
	a.mu.Lock()
	cached, hit := a.lookupNackLocked(run.workKey, run.work)
	a.mu.Unlock()
	if hit {
		a.logger.Info("apply answered from the known-bad cache", "plan_id", m.PlanID)
		return http.StatusOK, cached
	}
	if err := a.promoteLKG(m); err != nil {
		return http.StatusInternalServerError, ApplyError{Stage: StageLKG, Message: err.Error()}
	}
	if !run.revert {
		if err := a.reserveProofs(run); err != nil {
			return http.StatusInternalServerError, ApplyError{Stage: StageIdentity, Message: err.Error()}
		}
	}
	run.timing.AdmitMs = a.msSince(admitStart)
	result := a.runApply(run)
	result.Timing.TotalMs = a.msSince(run.start)
	return http.StatusOK, result
}

// ---------------------------------------------------------------------------
// Fencing (agent.md §9.7).

func (a *Agent) fence(m *Manifest) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	window := a.now().Before(a.lastReload.Add(a.cfg.ReloadIntervalMin))
	return fenceReason(m, &a.st, inPlaceWillRun(m, a.st.reloadPending(), window))
}

// inPlaceWillRun reports whether the manifest's in-place ops will run: a
// reload is pending, or this reload apply lands inside the pacing window.
func inPlaceWillRun(m *Manifest, reloadPending, windowOpen bool) bool {
	return len(m.InPlaceOps) > 0 && (reloadPending || (m.Mode == ModeReload && windowOpen))
}

// fenceReason applies the seven rules in order; "" means the manifest passes.
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

// ---------------------------------------------------------------------------
// Staging (agent.md §9.8) and the missing answer (§9.9).

func (a *Agent) stageParts(run *applyRun, mr *multipart.Reader) error {
	byPath := make(map[string]*ManifestFile, len(run.m.Files))
	for i := range run.m.Files {
		byPath[run.m.Files[i].Path] = &run.m.Files[i]
	}
	fileParts := 0
	// At most MaxFiles file parts and one plan part: the loop ends with the
	// body, or with an error at the latest on part MaxFiles+2.
	for range MaxFiles + 2 {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		err = a.stagePart(run, part, byPath, &fileParts)
		part.Close()
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("more than %d parts", MaxFiles)
}

func (a *Agent) stagePart(run *applyRun, part *multipart.Part, byPath map[string]*ManifestFile, fileParts *int) error {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return fmt.Errorf("part has no usable Content-Disposition: %w", err)
	}
	if params["name"] == PartPlan {
		if run.sawPlan {
			return fmt.Errorf("part %q appears twice", PartPlan)
		}
		run.sawPlan = true
		b, err := io.ReadAll(io.LimitReader(part, MaxPlanBlobBytes+1))
		if err != nil {
			return err
		}
		if len(b) > MaxPlanBlobBytes {
			return fmt.Errorf("plan blob exceeds the %d-byte limit", MaxPlanBlobBytes)
		}
		if len(b) > 0 {
			run.blob = b
		}
		return nil
	}
	if *fileParts >= MaxFiles {
		return fmt.Errorf("more than %d parts", MaxFiles)
	}
	*fileParts++
	rel := params["filename"]
	if rel == "" {
		return errors.New("a file part carries no filename")
	}
	mf := byPath[rel]
	if mf == nil {
		return fmt.Errorf("part %q is not in the manifest", rel)
	}
	if run.staged[rel] != nil || run.unpatched[rel] {
		return fmt.Errorf("part %q appears twice", rel)
	}
	var f *stagedFile
	if mf.Patch != nil {
		f, err = a.files.StagePatch(rel, part, mf.Patch, mf.Digest, mf.Size)
		if errors.Is(err, errPatchBaseMissing) {
			run.unpatched[rel] = true
			return nil
		}
	} else {
		f, err = a.files.Stage(rel, part, mf.Digest, mf.Size)
	}
	if err != nil {
		return err
	}
	run.staged[rel] = f
	return nil
}

// missingParts lists the files neither staged nor held with the proof the
// manifest quotes. After a restart no file carries a proof.
func (a *Agent) missingParts(run *applyRun) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var missing []string
	for _, mf := range run.m.Files {
		if run.staged[mf.Path] != nil {
			continue
		}
		held, ok := a.tree[mf.Path]
		if !run.unpatched[mf.Path] && ok && mf.Proof != "" &&
			held.Proof == mf.Proof && held.Digest == mf.Digest && held.Size == mf.Size {
			continue
		}
		missing = append(missing, mf.Path)
	}
	slices.Sort(missing)
	return missing
}

// ---------------------------------------------------------------------------
// The known-bad cache (agent.md §9.10).

// workIdentity is the work the manifest asks for, without its fencing
// fields and without patches: a set counts as the same work however it
// arrived. Field order and the absence of omitempty are part of the key.
func workIdentity(m *Manifest) ([]byte, string, error) {
	files := make([]ManifestFile, len(m.Files))
	for i, f := range m.Files {
		f.Patch = nil
		files[i] = f
	}
	w := struct {
		IdentityVersion            int            `json:"identity_version"`
		PlanID                     string         `json:"plan_id"`
		PlanProof                  string         `json:"plan_proof"`
		PlanSchemaVersion          int            `json:"plan_schema_version"`
		Files                      []ManifestFile `json:"files"`
		Ops                        []Op           `json:"ops"`
		OpBatches                  [][]Op         `json:"op_batches"`
		InPlaceOps                 []Op           `json:"in_place_ops"`
		ExpectedWorkerOpsPlanID    string         `json:"expected_worker_ops_plan_id"`
		ExpectedWorkerOpsPlanProof string         `json:"expected_worker_ops_plan_proof"`
		WorkerOpsPlanID            string         `json:"worker_ops_plan_id"`
		Mode                       string         `json:"mode"`
	}{m.IdentityVersion, m.PlanID, m.PlanProof, m.PlanSchemaVersion, files, m.Ops, m.OpBatches,
		m.InPlaceOps, m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof, m.WorkerOpsPlanID, m.Mode}
	b, err := json.Marshal(&w)
	if err != nil {
		return nil, "", err
	}
	return b, DigestString(string(b)), nil
}

// lookupNackLocked answers a cached NACK only for byte-equal work within
// its 60 seconds: digests are 64-bit and may collide. An expired record is
// dropped on lookup.
func (a *Agent) lookupNackLocked(key string, work []byte) (ApplyResult, bool) {
	n := a.st.Nack
	if n == nil || len(work) == 0 {
		return ApplyResult{}, false
	}
	if a.now().After(n.Until) {
		a.st.Nack = nil
		a.saveLocked()
		return ApplyResult{}, false
	}
	if len(n.work) == 0 || n.ManifestDigest != key || !bytes.Equal(n.work, work) || n.Result == nil {
		return ApplyResult{}, false
	}
	return cloneResult(*n.Result), true
}

// rememberNackLocked keeps HAProxy's verdict on this work for 60 seconds.
func (a *Agent) rememberNackLocked(run *applyRun) {
	res := cloneResult(run.result)
	res.Inventory = nil // an inventory delta rides one answer only
	a.st.Nack = &nackRecord{
		ManifestDigest: run.workKey,
		Reason:         run.abortStage,
		Until:          a.now().Add(nackTTL),
		Result:         &res,
		work:           slices.Clone(run.work),
	}
	a.saveLocked()
}

// ---------------------------------------------------------------------------
// LKG promotion (agent.md §9.11) and role proofs (§9.12).

// promoteLKG makes the applied plan the rollback baseline once the
// controller's validation vouches for it. It runs only after every refusal
// point, because clearing the journal cannot be undone.
func (a *Agent) promoteLKG(m *Manifest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := planRef{m.ValidatedPlanID, m.ValidatedPlanProof}
	if !samePlanRef(v, a.st.applied()) || a.st.lkg() == v {
		return nil
	}
	oldLKG := a.st.lkg()
	a.st.setLKG(v)
	if err := a.clearJournalLocked(); err != nil {
		a.st.setLKG(oldLKG)
		return err
	}
	a.logger.Info("last-known-good promoted", "plan_id", v.ID)
	return nil
}

// reserveProofs issues the applied proof, and the worker proof when
// in-place ops are present. The counter is persisted, so a proof is never
// reissued, not even across restarts.
func (a *Agent) reserveProofs(run *applyRun) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	need := uint64(1)
	if len(run.m.InPlaceOps) > 0 {
		need = 2
	}
	if a.st.ProofGeneration > math.MaxUint64-need {
		return errors.New(msgProofsExhausted)
	}
	a.st.ProofGeneration++
	run.appliedProof = fmt.Sprintf("a:%d", a.st.ProofGeneration)
	if need == 2 {
		a.st.ProofGeneration++
		run.workerProof = fmt.Sprintf("a:%d", a.st.ProofGeneration)
	}
	return a.saveLocked()
}

// ---------------------------------------------------------------------------
// The run (agent.md §9.13).

// runApply runs the transaction, commits, stores the blob and starts the
// read-back. It returns a copy of the result.
func (a *Agent) runApply(run *applyRun) ApplyResult {
	ctx := a.baseCtx
	m := run.m
	run.result = ApplyResult{PlanID: m.PlanID, OK: true, At: a.now().UTC().Format(time.RFC3339)}
	a.mu.Lock()
	run.invalidationsAtStart = a.invalidations
	a.st.InFlightPlanID = m.PlanID
	a.st.Phase = phaseStaged
	err := a.saveLocked()
	a.mu.Unlock()
	switch {
	case err != nil:
		a.abort(ctx, run, StageBackup, err)
	case run.revert:
		a.revertLKG(ctx, run)
	default:
		a.transact(ctx, run)
	}

	finishStart := a.now()
	a.finish(run)
	a.mu.Lock()
	if run.remember {
		a.rememberNackLocked(run)
	}
	a.handleBlobLocked(run)
	a.mu.Unlock()
	if run.result.OK && run.result.Mode == ResultRuntime && run.readBack != nil {
		a.startReadBack(run.readBack, run.appliedRef())
	}
	run.result.Timing.FinishMs = a.msSince(finishStart)
	a.logApply(run)
	return cloneResult(run.result)
}

func (a *Agent) logApply(run *applyRun) {
	a.mu.Lock()
	gen := a.st.Generation
	a.mu.Unlock()
	attrs := []any{"plan_id", run.m.PlanID, "mode", run.result.Mode, "ok", run.result.OK,
		"generation", gen, "total_ms", a.msSince(run.start)}
	if run.reason != "" {
		attrs = append(attrs, "reload_reason", run.reason)
	}
	if run.result.Error != nil {
		attrs = append(attrs, "error_stage", run.result.Error.Stage, "error", run.result.Error.Message)
	}
	a.logger.Info("apply", attrs...)
}

// transact writes the file set under the journal and activates it.
func (a *Agent) transact(ctx context.Context, run *applyRun) {
	if err := a.setPhase(phaseVerified); err != nil {
		a.abort(ctx, run, StageBackup, err)
		return
	}
	a.mu.Lock()
	dels := deletions(a.st.ManifestPaths, run.m.Files)
	journal := a.st.Journal.clone()
	a.mu.Unlock()
	run.txn = a.files.begin(run.stagedList(), dels)

	writeStart := a.now()
	err := run.txn.Backup(&journal)
	a.mu.Lock()
	// Even a partial journal is kept: its entries describe paths that are
	// still as they were, and abort restores and clears them.
	a.st.Journal = journal
	if err == nil {
		// The paths this apply may create are owned from the moment they may
		// exist on disk: a reload clears the journal before the commit
		// records the new set, and a crash in between must not leave files
		// no later apply would ever delete. A rollback drops the created
		// ones again (restoreJournal).
		a.st.ManifestPaths = slices.Compact(slices.Sorted(slices.Values(
			append(slices.Clone(a.st.ManifestPaths), manifestPaths(run.m.Files)...))))
		a.st.Phase = phaseBackedUp
		err = a.saveLocked()
	}
	a.mu.Unlock()
	if err != nil {
		a.abort(ctx, run, StageBackup, err)
		return
	}
	if err := run.txn.Write(); err != nil {
		a.abort(ctx, run, StageWrite, err)
		return
	}
	run.timing.WriteMs = a.msSince(writeStart)
	a.setPhase(phaseWritten)
	a.observeTree(run)

	opsStart := a.now()
	a.activate(ctx, run)
	run.timing.OpsMs = a.msSince(opsStart)
}

// observeTree records what the transaction wrote without re-hashing: the
// bytes were verified when they were staged.
func (a *Agent) observeTree(run *applyRun) {
	byPath := make(map[string]ManifestFile, len(run.m.Files))
	for _, f := range run.m.Files {
		byPath[f.Path] = f
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	tree := make(map[string]FileAt, len(a.tree)+len(run.staged))
	for p, at := range a.tree {
		tree[p] = at
	}
	for p := range run.staged {
		mf := byPath[p]
		tree[p] = FileAt{Digest: mf.Digest, Proof: mf.Proof, Size: mf.Size}
	}
	for _, p := range run.txn.deletes {
		delete(tree, p)
	}
	a.setTreeLocked(tree)
}

// ---------------------------------------------------------------------------
// Activation (agent.md §9.14–§9.17).

// activate picks what the written files need, first match wins.
func (a *Agent) activate(ctx context.Context, run *applyRun) {
	a.mu.Lock()
	pending := a.st.reloadPending()
	baseline := a.st.applied()
	a.mu.Unlock()
	switch {
	case pending:
		due := a.coalesceIntoPendingReload(run.appliedRef())
		run.result.Mode = ResultScheduled
		run.result.Reload = &ReloadInfo{ScheduledAt: formatDue(due)}
		a.setPhase(phaseScheduled)
		a.runInPlace(ctx, run)
	case run.m.Mode == ModeReload:
		a.reload(ctx, run, reasonMode)
	case baseline.ID == "" || baseline.Proof == "":
		a.reload(ctx, run, reasonUnknownBaseline)
	default:
		c, err := a.compile(run.m.RuntimeOps())
		if err != nil {
			a.invariant(false, invOpsExecutable)
			a.logger.Warn("the runtime ops cannot be compiled; reloading instead", "plan_id", run.m.PlanID, "err", err)
			a.reload(ctx, run, reasonUnknownOp)
			return
		}
		if c.empty() {
			a.settle(run)
			return
		}
		a.runOps(ctx, run, c)
	}
}

func formatDue(due time.Time) string { return due.UTC().Format(time.RFC3339Nano) }

// settle finishes an apply that needs nothing from HAProxy.
func (a *Agent) settle(run *applyRun) {
	run.result.Mode = ResultNoop
	if run.txn.Changes() > 0 {
		run.result.Mode = ResultFileOnly
	}
	a.setPhase(phaseApplied)
}

// compiledOps is a batch ready to run, with the notes the read-back and
// the inventory need.
type compiledOps struct {
	programs []program
	servers  []serverRef
	backends []string

	maps, backendsTouched, certs, caFiles []string
	deleting                              map[string]bool
}

func (c *compiledOps) empty() bool {
	return len(c.programs) == 0 && len(c.servers) == 0 && len(c.backends) == 0
}

// compile splits the deletes off, has the queue check them, and compiles
// every inline op before anything is sent (agent.md §9.15).
func (a *Agent) compile(ops []Op) (*compiledOps, error) {
	inline, servers, backends := splitDeletes(ops)
	if err := a.queue.Check(servers, backends); err != nil {
		return nil, err
	}
	c := &compiledOps{servers: servers, backends: backends, deleting: map[string]bool{}}
	term := a.rt.terminator()
	for i := range inline {
		p, err := compileOp(&inline[i], a.readHeld, term)
		if err != nil {
			return nil, err
		}
		c.programs = append(c.programs, p)
	}
	for _, be := range backends {
		c.deleting[be] = true
	}
	for _, op := range ops {
		switch op.Kind {
		case OpMapAdd, OpMapSet, OpMapDel, OpMapReplace:
			c.maps = appendUnique(c.maps, op.Path)
		case OpCertNew:
			c.certs = appendUnique(c.certs, op.Path)
		case OpCANew:
			c.caFiles = appendUnique(c.caFiles, op.Path)
		case OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight,
			OpServerSetState, OpServerWaitRemovable, OpShutdownSessions, OpServerDel:
			c.backendsTouched = appendUnique(c.backendsTouched, op.Backend)
		}
	}
	return c, nil
}

func appendUnique(s []string, v string) []string {
	if v == "" || slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// readHeld reads a written file by its manifest path, for the ops that
// carry a file's content (map_replace, cert_*, ca_*).
func (a *Agent) readHeld(rel string) ([]byte, error) {
	abs, err := a.files.Abs(rel)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxApplyBodyBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxApplyBodyBytes {
		return nil, fmt.Errorf("%q exceeds %d bytes", rel, MaxApplyBodyBytes)
	}
	return b, nil
}

// runOps runs the manifest's ops between two worker checks (agent.md §9.16).
func (a *Agent) runOps(ctx context.Context, run *applyRun, c *compiledOps) {
	if _, err := a.checkWorker(ctx); err != nil {
		a.logger.Warn("worker check before the ops failed", "err", err)
		a.reload(ctx, run, reasonWorkerChanged)
		return
	}
	captured := a.expectedWorker()
	results, err := a.executeChunks(ctx, run, c.programs)
	run.result.OpResults = append(run.result.OpResults, results...)
	if err != nil {
		a.mu.Lock()
		a.st.setWorkerOps(planRef{}) // part of a batch may have landed
		a.mu.Unlock()
		a.metrics.opErrors.inc(firstFailedKind(results))
		a.logger.Warn("HAProxy refused a runtime op; reloading the desired set", "plan_id", run.m.PlanID, "err", err)
		a.reload(ctx, run, reasonOpRejected)
		return
	}
	if err := a.recheckWorker(ctx, captured); err != nil {
		a.logger.Warn("worker check after the ops failed", "err", err)
		a.reload(ctx, run, reasonWorkerChanged)
		return
	}
	if err := a.enqueueDeletes(captured, c); err != nil {
		a.logger.Warn("deferred deletes could not be queued", "err", err)
		a.reload(ctx, run, reasonDeferredDeleteCommit)
		return
	}
	a.foldCreated(c)
	run.result.Mode = ResultRuntime
	run.readBack = c
	a.setPhase(phaseApplied)
}

// executeChunks runs the programs MaxOpsPerApply at a time, stopping at the
// first failing chunk.
func (a *Agent) executeChunks(ctx context.Context, run *applyRun, programs []program) ([]OpResult, error) {
	var results []OpResult
	for start := 0; start < len(programs); start += MaxOpsPerApply {
		chunk := programs[start:min(start+MaxOpsPerApply, len(programs))]
		run.opsRan = true
		res, err := a.rt.execute(ctx, chunk)
		results = append(results, res...)
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

// firstFailedKind attributes a failed batch to its first failed op.
func firstFailedKind(results []OpResult) string {
	for _, r := range results {
		if !r.OK {
			return r.Kind
		}
	}
	return "unknown"
}

// recheckWorker is the second worker check: the worker must still be the
// one the ops were sent to (a concurrent verified read may have adopted a
// new one already).
func (a *Agent) recheckWorker(ctx context.Context, captured HAProxyInfo) error {
	observed, err := a.checkWorker(ctx)
	if err != nil {
		return err
	}
	if !observed.SameWorker(captured) {
		return workerChangedError(captured, observed)
	}
	return nil
}

func workerChangedError(from, to HAProxyInfo) error {
	return fmt.Errorf("worker changed from pid %d (start %d) to pid %d (start %d)",
		from.WorkerPID, from.WorkerStartTimeUnixMicros, to.WorkerPID, to.WorkerStartTimeUnixMicros)
}

func (a *Agent) expectedWorker() HAProxyInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.ExpectedWorker
}

// enqueueDeletes hands the removal half of the deletes to the queue, only
// after the inline half succeeded and the worker was re-checked.
func (a *Agent) enqueueDeletes(worker HAProxyInfo, c *compiledOps) error {
	if len(c.servers) == 0 && len(c.backends) == 0 {
		return nil
	}
	if err := a.queue.Enqueue(worker, c.servers, c.backends); err != nil {
		return err
	}
	a.queue.Wake()
	return nil
}

// foldCreated adds the certificates and CA files this batch created to the
// inventory, copying the slices an earlier answer may share.
func (a *Agent) foldCreated(c *compiledOps) {
	a.mu.Lock()
	defer a.mu.Unlock()
	inv := &a.inventory
	changed := false
	add := func(list []string, v string) []string {
		if slices.Contains(list, v) {
			return list
		}
		changed = true
		out := append(cloneSlice(list), v)
		slices.Sort(out)
		return out
	}
	for _, p := range c.certs {
		inv.Certs = add(inv.Certs, p)
	}
	for _, p := range c.caFiles {
		inv.CAFiles = add(inv.CAFiles, p)
	}
	if changed {
		inv.Generation++
	}
}

// runInPlace runs the in-place ops against the worker that keeps serving
// until the pending reload fires (agent.md §9.17). Any failure invalidates
// the baseline; the apply stays OK and never triggers a second reload.
func (a *Agent) runInPlace(ctx context.Context, run *applyRun) {
	m := run.m
	if len(m.InPlaceOps) == 0 {
		return
	}
	fail := func(err error) {
		run.result.Error = &ApplyError{Stage: StageInPlace, Message: err.Error()}
		a.invalidateBaseline()
		a.logger.Warn("in-place ops failed; the baseline is invalidated", "plan_id", m.PlanID, "err", err)
	}
	a.mu.Lock()
	workerOps := a.st.workerOps()
	a.mu.Unlock()
	if !samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, workerOps) {
		fail(errors.New(msgInPlaceStale))
		return
	}
	c, err := a.compile(m.InPlaceOps)
	if err != nil {
		a.invariant(false, invOpsExecutable)
		fail(err)
		return
	}
	captured := a.expectedWorker()
	if _, err := a.checkWorker(ctx); err != nil {
		fail(err)
		return
	}
	if len(c.programs) > 0 {
		run.opsRan = true
		results, err := a.rt.execute(ctx, c.programs)
		run.result.OpResults = append(run.result.OpResults, results...)
		if err != nil {
			a.metrics.opErrors.inc(firstFailedKind(results))
			fail(err)
			return
		}
	}
	if err := a.recheckWorker(ctx, captured); err != nil {
		fail(err)
		return
	}
	if err := a.enqueueDeletes(captured, c); err != nil {
		fail(err)
		return
	}
	a.foldCreated(c)
	a.mu.Lock()
	a.st.setWorkerOps(planRef{m.WorkerOpsPlanID, run.workerProof})
	a.saveLocked()
	a.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Reloads (agent.md §9.18, §9.21).

// reload reloads now, or schedules the reload when the pacing window is open.
func (a *Agent) reload(ctx context.Context, run *applyRun, reason string) {
	run.reason = a.reloadReason(run, reason)
	a.mu.Lock()
	due := a.lastReload.Add(a.cfg.ReloadIntervalMin)
	open := a.now().Before(due)
	if open {
		a.schedulePendingReloadLocked(due, run.appliedRef())
	}
	a.mu.Unlock()
	a.logger.Info("reload decided", "plan_id", run.m.PlanID, "reason", reason, "scheduled", open)
	if open {
		run.result.Mode = ResultScheduled
		run.result.Reload = &ReloadInfo{ScheduledAt: formatDue(due)}
		a.setPhase(phaseScheduled)
		// A fallback reload has no valid in-place subset.
		if reason == reasonMode {
			a.runInPlace(ctx, run)
		}
		return
	}
	info, err := a.performReload(ctx, run.appliedRef())
	run.result.Reload = info
	if err != nil {
		a.abort(ctx, run, StageReload, err)
		return
	}
	run.result.Mode = ResultReload
	a.setPhase(phaseReloaded)
}

// reloadFailure is a reload HAProxy refused: its text is HAProxy's startup
// log, and it wraps errReloadRejected so that the failure counts as
// deterministic.
type reloadFailure struct {
	msg string
	err error
}

func (e *reloadFailure) Error() string { return e.msg }
func (e *reloadFailure) Unwrap() error { return e.err }

// performReload reloads HAProxy through the master and adopts the new
// worker, holding the worker-observation lock throughout, then records the
// plan the new worker loaded. An empty ref promotes nothing.
func (a *Agent) performReload(ctx context.Context, ref planRef) (*ReloadInfo, error) {
	a.mu.Lock()
	a.clearPendingLocked()
	a.mu.Unlock()

	a.workerMu.Lock()
	info, err := a.reloadAndAwait(ctx)
	a.workerMu.Unlock()
	if err != nil {
		return info, err
	}
	a.recordReload(ref)
	return info, nil
}

// reloadAndAwait sends the reload and waits for the new worker.
// ReloadTimeout bounds the whole of it (agent.md §9.21 step 5), but the
// runtime layer enforces it on the reload itself and answers the timeout
// verdicts of runtime.md §6.2 ("reload: no reply within <t>", "reload: no
// new worker within <t>", both errReloadTimeout). A context of our own
// around rt.reload would expire first, since the runtime's deadline starts
// only after its show proc baseline, and turn those verdicts into transport
// errors of varying text. So only the wait for the new worker gets a
// deadline here: what remains of ReloadTimeout since the reload began.
func (a *Agent) reloadAndAwait(ctx context.Context) (*ReloadInfo, error) {
	prev := a.expectedWorker()
	if a.hooks.beforeReload != nil {
		a.hooks.beforeReload()
	}
	start := time.Now()
	log, err := a.rt.reload(ctx)
	info := &ReloadInfo{Performed: true, OK: err == nil, Output: log}
	if err != nil {
		info.TookMs = time.Since(start).Milliseconds()
		a.metrics.reloads.inc("failed")
		if errors.Is(err, errReloadRejected) {
			msg := log
			if msg == "" {
				msg = errReloadRejected.Error()
			}
			return info, &reloadFailure{msg: msg, err: err}
		}
		info.Performed = false
		return info, err
	}
	a.metrics.reloads.inc("ok")
	wctx, cancel := context.WithDeadline(ctx, start.Add(a.cfg.ReloadTimeout))
	worker, err := a.awaitNewWorker(wctx, prev)
	cancel()
	info.TookMs = time.Since(start).Milliseconds()
	if err != nil {
		info.OK = false
		return info, err
	}
	// The inventory refresh is not part of the reload: it runs under the
	// caller's context, not what is left of the reload timeout.
	a.adoptWorker(ctx, worker)
	info.WorkerPID = worker.WorkerPID
	return info, nil
}

// awaitNewWorker polls show info until a worker other than prev answers.
// Ops are never sent to the outgoing worker.
func (a *Agent) awaitNewWorker(ctx context.Context, prev HAProxyInfo) (HAProxyInfo, error) {
	t := time.NewTicker(awaitWorkerPoll)
	defer t.Stop()
	for {
		info, err := a.rt.info(ctx)
		if err == nil && info.HasWorkerIdentity() && !prev.SameWorker(info) {
			return info, nil
		}
		select {
		case <-ctx.Done():
			return HAProxyInfo{}, errors.New(msgNoNewWorker)
		case <-t.C:
		}
	}
}

// adoptWorker records a new worker, refreshes the inventory and retires the
// deferred deletes queued for the old one. Callers hold the
// worker-observation lock.
//
// The inventory's generation is taken when the listing is stored, under the
// state mutex, not before the read: the state mutex is released across the
// read, and an apply may fold the certificates it created into the
// inventory (a generation of its own, reported on its ACK) meanwhile. A
// generation computed before the read would then be issued twice, and the
// new worker's listing would never ride an answer.
func (a *Agent) adoptWorker(ctx context.Context, info HAProxyInfo) {
	inv, err := a.rt.inventory(ctx, 0)
	a.mu.Lock()
	a.st.ExpectedWorker = info
	if err == nil {
		inv.Generation = a.inventory.Generation + 1
		a.inventory = inv
	} else {
		a.logger.Warn("could not refresh the runtime inventory after adopting a worker", "err", err)
	}
	a.saveLocked()
	a.mu.Unlock()
	a.queue.SetWorker(info)
}

// recordReload notes a successful reload: the worker now runs ref, and a
// complete ref becomes the last-known-good plan, which clears the journal.
// The promotion stands only if the cleared journal was saved, as in
// promoteLKG: otherwise the journal and its backups are still what a
// rollback restores, and they lead back to the old LKG, not to ref. The
// reload itself happened, so the running and worker-ops pairs stay; the
// next successful save persists them.
func (a *Agent) recordReload(ref planRef) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastReload = a.now()
	a.st.setRunning(ref)
	a.st.setWorkerOps(ref)
	if ref.ID == "" || ref.Proof == "" {
		a.saveLocked()
		return
	}
	oldLKG := a.st.lkg()
	a.st.setLKG(ref)
	if err := a.clearJournalLocked(); err != nil {
		a.st.setLKG(oldLKG)
		a.logger.Error("the reloaded plan is not the last-known-good: its journal could not be cleared", "plan_id", ref.ID, "lkg_plan_id", oldLKG.ID, "err", err)
	}
}

// ---------------------------------------------------------------------------
// Worker checks (agent.md §9.19).

// checkWorker reads the worker's identity and adopts a foreign worker, which
// invalidates the baseline: the new worker loaded whatever was on disk.
func (a *Agent) checkWorker(ctx context.Context) (HAProxyInfo, error) {
	a.workerMu.Lock()
	defer a.workerMu.Unlock()
	info, err := a.rt.info(ctx)
	if err != nil {
		return info, err
	}
	prev := a.expectedWorker()
	if prev.SameWorker(info) {
		return info, nil
	}
	a.adoptWorker(ctx, info)
	a.mu.Lock()
	a.st.setRunning(planRef{})
	a.invalidateLocked()
	a.saveLocked()
	a.mu.Unlock()
	err = workerChangedError(prev, info)
	a.logger.Warn("a foreign worker was adopted; the baseline is invalidated", "err", err)
	return info, err
}

// ---------------------------------------------------------------------------
// Revert, abort and restore (agent.md §9.24, §9.25, §6.8).

// revertLKG restores the last-known-good set and reloads it.
func (a *Agent) revertLKG(ctx context.Context, run *applyRun) {
	a.setPhase(phaseBackedUp)
	if err := a.restoreJournal(); err != nil {
		a.abort(ctx, run, StageRevert, err)
		return
	}
	a.metrics.rollbacks.inc()
	run.result.Rollback = &RollbackInfo{Performed: true}
	a.mu.Lock()
	lkg := a.st.lkg()
	a.mu.Unlock()
	info, err := a.performReload(ctx, lkg)
	run.result.Reload = info
	if err != nil {
		a.abort(ctx, run, StageRevertReload, err)
		return
	}
	run.result.Rollback.Reloaded = true
	run.result.Mode = ResultReload
}

// abort rolls the tree back to the last-known-good set and turns the result
// into a NACK. The failed reload, if any, stays in result.reload.
func (a *Agent) abort(ctx context.Context, run *applyRun, stage string, cause error) {
	a.setPhase(phaseAborted)
	a.metrics.applyRejected.inc(stage)
	a.metrics.rollbacks.inc()
	r := &run.result
	r.OK, r.Mode = false, ResultRejected
	r.Error = &ApplyError{Stage: stage, Message: cause.Error()}
	r.Rollback = &RollbackInfo{}
	run.discardStaged()
	a.mu.Lock()
	a.clearPendingLocked()
	a.mu.Unlock()
	a.logger.Warn("apply aborted; restoring the last-known-good set", "plan_id", run.m.PlanID, "stage", stage, "err", cause)
	if err := a.restoreJournal(); err != nil {
		a.logger.Error("restoring the last-known-good set failed", "err", err)
		return
	}
	r.Rollback.Performed = true
	if run.opsRan {
		a.mu.Lock()
		lkg := a.st.lkg()
		a.mu.Unlock()
		if _, err := a.performReload(ctx, lkg); err != nil {
			a.invariant(false, invRecoveryReload)
			a.logger.Error("the recovery reload after the abort failed", "err", err)
		} else {
			r.Rollback.Reloaded = true
		}
	}
	if errors.Is(cause, errReloadRejected) && len(run.work) > 0 {
		run.remember, run.abortStage = true, stage
	}
}

// restoreJournal puts the last-known-good set back, recomputes the
// ownership set and the tree from it, and clears the journal. A restored
// file whose bytes did not change keeps its proof, so the next apply need
// not resend it.
func (a *Agent) restoreJournal() error {
	a.mu.Lock()
	journal := a.st.Journal.clone()
	owned := cloneSlice(a.st.ManifestPaths)
	a.mu.Unlock()
	if err := a.files.Restore(journal); err != nil {
		return err
	}
	set := restoredOwnership(owned, journal)
	tree, err := a.files.HashTree(set)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	keepProofs(a.tree, tree)
	a.setTreeLocked(tree)
	a.st.ManifestPaths = set
	a.st.TreeDigest = treeDigest(tree)
	return a.clearJournalLocked()
}

// restoredOwnership is the ownership set after a restore: the owned paths
// minus the ones the journal created, plus every path it brought back.
//
// agent.md §6.8 says "plus the deleted entries"; a modified entry is added
// too, because a path first modified and then deleted by a later apply
// (the first journal entry wins, so its kind stays "modified") is restored
// to disk by the rollback, and without ownership it would stay there
// forever: no later apply could delete it.
func restoredOwnership(owned []string, j backupJournal) []string {
	created := map[string]bool{}
	var out []string
	for _, e := range j.Entries {
		switch e.Kind {
		case journalCreated:
			created[e.Path] = true
		case journalDeleted, journalModified:
			out = append(out, e.Path)
		}
	}
	for _, p := range owned {
		if !created[p] {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ---------------------------------------------------------------------------
// Commit (agent.md §9.26).

func (a *Agent) finish(run *applyRun) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prevGen := a.st.Generation
	if run.result.OK {
		a.st.Generation++
		a.commitLocked(run)
	} else {
		a.st.setApplied(planRef{})
	}
	a.st.Phase, a.st.InFlightPlanID = phaseIdle, ""
	run.result.Timing = run.timing
	a.applyResultLocked(&run.result)
	last := cloneResult(run.result)
	a.st.LastApply = &last
	a.saveLocked()
	a.metrics.applyTotal.inc(run.result.Mode)
	a.metrics.generation.set(a.st.Generation)
	a.checkInvariantsLocked(run, prevGen)
}

func (a *Agent) commitLocked(run *applyRun) {
	m := run.m
	ref := run.appliedRef()
	if run.revert {
		ref = a.st.lkg()
	} else {
		a.st.PlanSchemaVersion = m.PlanSchemaVersion
		a.st.ManifestPaths = manifestPaths(m.Files)
		a.st.TreeDigest = treeDigest(a.tree)
	}
	if a.invalidations != run.invalidationsAtStart {
		a.st.setApplied(planRef{})
		return
	}
	a.st.setApplied(ref)
	a.st.AppliedToken = m.Token
	// While a reload is pending only an in-place batch moves the worker baseline.
	if !a.st.reloadPending() {
		a.st.setWorkerOps(ref)
	}
}

func manifestPaths(files []ManifestFile) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Path
	}
	slices.Sort(out)
	return out
}

// handleBlobLocked stores the apply's plan blob, or re-binds the stored one
// to the new applied proof (agent.md §10.2). A failed apply stores nothing.
func (a *Agent) handleBlobLocked(run *applyRun) {
	if !run.result.OK {
		return
	}
	if run.blob != nil {
		err := a.storePlanBlobLocked(run.appliedRef(), run.blob)
		if err != nil && !errors.Is(err, errPlanMoved) {
			a.logger.Warn("could not store the plan blob", "plan_id", run.m.PlanID, "err", err)
		}
		return
	}
	a.rebindPlanBlobLocked(run.m.PlanID)
}

// ---------------------------------------------------------------------------
// Invariants (agent.md §14).

// invariant counts, logs and remembers a broken invariant. It never panics.
func (a *Agent) invariant(ok bool, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.invariantLocked(ok, name)
}

func (a *Agent) invariantLocked(ok bool, name string) {
	if ok {
		return
	}
	a.metrics.invariantViolations.inc(name)
	a.logger.Error("invariant violated", "invariant", name)
	a.lastInvariant = name
}

// invariantInputs is what the after-finish invariants look at.
type invariantInputs struct {
	ok, revert                 bool
	prevGeneration, generation uint64
	result                     *ApplyResult
	files                      []ManifestFile
	tree                       map[string]FileAt
	journalEntries             int
	applied, lkg               planRef
	crossDevice                uint64
}

// failedInvariants returns the names of the after-finish invariants that
// do not hold, in the order of agent.md §14.
func failedInvariants(in invariantInputs) []string {
	var failed []string
	check := func(ok bool, name string) {
		if !ok {
			failed = append(failed, name)
		}
	}
	if in.ok {
		check(in.generation == in.prevGeneration+1, invGenerationMonotonic)
		if !in.revert {
			check(treeHoldsExactly(in.tree, in.files), invDiskIsTheDesiredSet)
		}
	}
	if r := in.result; r != nil {
		switch r.Mode {
		case ResultRuntime:
			check(r.Reload == nil || (!r.Reload.Performed && r.Reload.ScheduledAt == ""), invRuntimeModeDoesNotReload)
		case ResultReload:
			check(r.Reload != nil && r.Reload.Performed, invReloadModeReloads)
		case ResultNoop:
			check(len(r.OpResults) == 0, invNoopRunsNoOps)
		}
	}
	check(in.journalEntries == 0 || in.applied != in.lkg, invJournalOnlyWhileDiverged)
	check(in.crossDevice == 0, invMountProbeFoundEveryMount)
	return failed
}

// treeHoldsExactly reports whether tree holds exactly files, with equal
// digest, proof and size.
func treeHoldsExactly(tree map[string]FileAt, files []ManifestFile) bool {
	if len(tree) != len(files) {
		return false
	}
	for _, f := range files {
		if tree[f.Path] != (FileAt{Digest: f.Digest, Proof: f.Proof, Size: f.Size}) {
			return false
		}
	}
	return true
}

func (a *Agent) checkInvariantsLocked(run *applyRun, prevGen uint64) {
	in := invariantInputs{
		ok:             run.result.OK,
		revert:         run.revert,
		prevGeneration: prevGen,
		generation:     a.st.Generation,
		result:         &run.result,
		files:          run.m.Files,
		tree:           a.tree,
		journalEntries: len(a.st.Journal.Entries),
		applied:        a.st.applied(),
		lkg:            a.st.lkg(),
		crossDevice:    a.files.crossDevice.Load(),
	}
	for _, name := range failedInvariants(in) {
		a.invariantLocked(false, name)
	}
}
