// This file owns the apply pipeline, in the order one apply flows through
// it: reading and checking the manifest, the fence, staging the parts, the
// missing answer, the known-bad cache, LKG promotion, role proofs, the
// write transaction, activation (runtime ops, in-place ops or a reload),
// abort and rollback, and the one commit that every apply, scheduled
// reload and read-back repair ends in. Pacing and read-back live in
// agent_pacing.go, the worker checks and reloads in agent_worker.go.
//
// It never decides what HAProxy should do: it executes exactly what the
// manifest asks, and whenever it cannot, it reloads the files on disk.

package haptic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

// Reload reasons, logged with every reload decision.
const (
	reasonMode                 = "mode"
	reasonUnknownBaseline      = "unknown_baseline"
	reasonUnknownOp            = "unknown_op"
	reasonWorkerChanged        = "worker_changed"
	reasonOpRejected           = "op_rejected"
	reasonDeferredDeleteCommit = "deferred_delete_commit"
	reasonScheduled            = "scheduled"
	reasonRepair               = "read_back_repair"
)

// Invariant names, a closed set.
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
	msgInPlaceStale    = "in-place ops were composed against a different worker baseline"
	msgProofsExhausted = "agent role proof sequence exhausted"
)

// applyDeps are the collaborators every run works with; the agent builds
// them once.
type applyDeps struct {
	led     *ledger
	files   *fileStore
	worker  *workerTracker
	rt      *haproxyRuntime
	queue   *deleteQueue
	metrics *agentMetrics
	logger  *slog.Logger

	now               func() time.Time
	reloadIntervalMin time.Duration
	configFile        string

	// applyMu serialises applies, the pacer's reload and read-backs.
	applyMu sync.Mutex
	// readBack starts the background check of a runtime apply; pokePacer
	// wakes the pacer once a reload is scheduled.
	readBack  func(c *compiledOps, ref planRef)
	pokePacer func()
}

func (d *applyDeps) msSince(t time.Time) int64 { return d.now().Sub(t).Milliseconds() }

// invariant counts, logs and remembers a broken invariant. It never panics.
func (d *applyDeps) invariant(ok bool, name string) {
	if ok {
		return
	}
	d.metrics.invariantViolations.inc(name)
	d.logger.Error("invariant violated", "invariant", name)
	d.led.noteInvariant(name)
}

// applyRun is one apply in flight, from the fence to the answer; a
// scheduled reload and a read-back repair are runs too, so that every one
// of them ends in the same commit and abort.
type applyRun struct {
	*applyDeps
	ctx    context.Context
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
	invalidations0            uint64
	before                    agentState // the state when the run began
	beforeTree                map[string]FileAt

	txn         *fileTxn
	finishStart time.Time
	result      ApplyResult
	opsRan      bool
	reason      string
	readBack    *compiledOps
	restored    *restoredTree // what an abort put back

	remember   bool // a deterministic refusal to cache once the result is final
	abortStage string
	refused    bool // HAProxy refused the reload itself
	// reloadUnknown: a reload failed without HAProxy's verdict (a timeout,
	// a master that went away), so it may still take effect.
	reloadUnknown bool
	// reloaded: the apply's own reload took effect; its plan becomes the
	// last-known-good with the commit.
	reloaded bool
}

// restoredTree is the tree a rollback left: its ownership set and hashes,
// and the tree before the run, whose proofs a restored file keeps.
type restoredTree struct {
	owned  []string
	tree   map[string]FileAt
	before map[string]FileAt
}

func newApplyRun(d *applyDeps, ctx context.Context, m *Manifest) *applyRun {
	return &applyRun{applyDeps: d, ctx: ctx, m: m, revert: m.Mode == ModeRevertLKG, start: d.now(),
		staged: map[string]*stagedFile{}, unpatched: map[string]bool{}}
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
		f.discard(run.files.disk)
	}
}

func (run *applyRun) appliedRef() planRef { return planRef{run.m.PlanID, run.appliedProof} }

// ---------------------------------------------------------------------------
// The handler.

// handleApply is POST /v1/apply: the manifest is read and checked, the
// clock starts, and everything that reads or changes the state runs under
// the apply lock.
func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	if !a.Ready() {
		writeError(w, http.StatusServiceUnavailable, StageStartup, msgAgentInitialising)
		return
	}
	if !a.enterApply(r.Context()) {
		return // the client gave up while applies ahead of it ran
	}
	defer a.leaveApply()
	r.Body = &stallGuard{ReadCloser: http.MaxBytesReader(w, r.Body, MaxApplyBodyBytes),
		rc: http.NewResponseController(w), stall: a.stallTimeout}
	mr, err := r.MultipartReader()
	if err == nil && !isFormData(r.Header.Get("Content-Type")) {
		// MultipartReader also takes multipart/mixed; the apply body is a
		// form, and only a form's parts carry the names it is read by.
		err = http.ErrNotMultipart
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, StageRequest, err.Error())
		return
	}
	m, err := readManifest(mr)
	if err == nil {
		normaliseLegacy(m)
		err = validateManifest(m, a.cfg.ConfigFile, a.files.abs)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, StageManifest, err.Error())
		return
	}
	autoDowngrade(m)
	run := newApplyRun(a.deps, a.baseCtx, m)
	defer run.discardStaged()
	code, body := run.admitAndRun(mr)
	writeJSON(w, code, body)
}

// stallGuard ends an upload that makes no progress: every read must bring
// bytes within stall, or it fails with a message that says so. Parts are
// read under the apply lock, so a client that stops sending would otherwise
// hold every other apply up for the server's whole read timeout.
type stallGuard struct {
	io.ReadCloser
	rc    *http.ResponseController
	stall time.Duration
}

func (g *stallGuard) Read(p []byte) (int, error) {
	if g.stall > 0 {
		g.rc.SetReadDeadline(time.Now().Add(g.stall))
	}
	n, err := g.ReadCloser.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("the upload stalled: no bytes for %s", g.stall)
	}
	return n, err
}

// ---------------------------------------------------------------------------
// Reading and checking the manifest.

// isFormData reports whether a Content-Type is multipart/form-data.
func isFormData(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "multipart/form-data"
}

// readManifest reads the first part, which must be the manifest, and
// decodes it (decodeManifest).
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
	return decodeManifest(b)
}

// normaliseLegacy forces a manifest without exact identity to reload and
// drops everything that needs exact identity: without role proofs the
// agent cannot tell which plan the worker runs, so runtime ops, in-place ops
// and the validated pair would be trusted on a name alone. An unknown or
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

// validateManifest checks a decoded manifest before anything is staged, in
// a fixed order so that a bad manifest always gets the same answer: op
// batches, plan id, file count, the in-place and validated pairs, the mode,
// then every file's path, kind and digest, and the config file's presence.
// The first failure wins. abs applies the path rules and refuses reserved paths, so a
// manifest naming a socket is refused here rather than at staging.
func validateManifest(m *Manifest, config string, abs func(string) (string, error)) error {
	if err := m.ValidateOpBatches(); err != nil {
		return err
	}
	inPlace := len(m.InPlaceOps) > 0
	switch {
	case m.PlanID == "":
		return errPlanIDEmpty
	case len(m.Files) > MaxFiles:
		return tooManyFiles(len(m.Files))
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
		if err := checkRuntimePath(f.Kind, f.Path); err != nil {
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
// into a reload: ops are only safe against the worker they were diffed
// against, so an apply that cannot prove that worker never runs them.
func autoDowngrade(m *Manifest) {
	if m.Mode == ModeAuto && m.ExpectedWorkerOpsPlanProof == "" && len(m.InPlaceOps) == 0 {
		m.Mode = ModeReload
		m.Ops, m.OpBatches = nil, nil
	}
}

// ---------------------------------------------------------------------------
// The known-bad cache's key.

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

// ---------------------------------------------------------------------------
// Admission: everything that can still refuse an apply without touching
// anything.

// admitAndRun fences, stages, checks the parts and the known-bad cache,
// promotes the LKG, reserves the proofs and runs the apply, all under the
// apply lock: the fence holds only while nothing else can change the state
// it checked. A stalled upload cannot hold the lock for long: staging ends
// when the client sends nothing for stallTimeout.
func (run *applyRun) admitAndRun(mr *multipart.Reader) (int, any) {
	m := run.m
	run.applyMu.Lock()
	defer run.applyMu.Unlock()
	if code, body, fenced := run.fence(); fenced {
		return code, body
	}
	if err := run.stageParts(mr); err != nil {
		run.metrics.applyRejected.inc(StageParts)
		code := stagingStatus(err)
		if code >= http.StatusInternalServerError {
			run.logger.Error("apply failed: the agent could not stage the parts", "plan_id", m.PlanID, "err", err)
		} else {
			run.logger.Info("apply refused: parts", "plan_id", m.PlanID, "err", err)
		}
		return code, ApplyError{Stage: StageParts, Message: err.Error()}
	}
	run.timing.StageMs = run.msSince(run.start)
	admitStart := run.now()
	if !run.revert {
		if missing := run.led.missing(m, run.staged, run.unpatched); len(missing) > 0 {
			return http.StatusConflict, Missing{Missing: missing}
		}
	}
	work, key, err := workIdentity(m)
	if err != nil {
		run.logger.Warn("could not encode the work identity; the known-bad cache is skipped", "err", err)
	}
	run.work, run.workKey = work, key
	if cached, hit := run.led.lookupNack(run.workKey, run.work, run.now()); hit {
		run.logger.Info("apply answered from the known-bad cache", "plan_id", m.PlanID)
		return http.StatusOK, cached
	}
	// LKG promotion runs only after every refusal point, because clearing
	// the journal cannot be undone.
	promoted, err := run.led.promoteLKGAndSettle(planRef{m.ValidatedPlanID, m.ValidatedPlanProof})
	if err != nil {
		return http.StatusInternalServerError, ApplyError{Stage: StageLKG, Message: err.Error()}
	}
	if promoted {
		run.logger.Info("last-known-good promoted", "plan_id", m.ValidatedPlanID)
	}
	if !run.revert {
		run.appliedProof, run.workerProof, err = run.led.reserveProofs(len(m.InPlaceOps) > 0)
		if err != nil {
			return http.StatusInternalServerError, ApplyError{Stage: StageIdentity, Message: err.Error()}
		}
	}
	run.timing.AdmitMs = run.msSince(admitStart)
	result := run.runApply()
	return http.StatusOK, result
}

// fence answers 409 with the current state when a fencing rule refuses the
// manifest. Nothing is written, the LKG is not promoted, the journal is
// not touched.
func (run *applyRun) fence() (int, any, bool) {
	reason, c := run.led.fence(run.m, run.now(), run.reloadIntervalMin)
	if reason == "" {
		return 0, nil, false
	}
	run.metrics.applyRejected.inc(rejectedStageFencing)
	run.logger.Info("apply fenced", "plan_id", run.m.PlanID, "reason", reason)
	return http.StatusConflict, c, true
}

// stageParts reads every part after the manifest: at most MaxFiles file
// parts and one plan part, so the loop ends with the body, or with an error
// at the latest on part MaxFiles+2.
func (run *applyRun) stageParts(mr *multipart.Reader) error {
	byPath := make(map[string]*ManifestFile, len(run.m.Files))
	for i := range run.m.Files {
		byPath[run.m.Files[i].Path] = &run.m.Files[i]
	}
	fileParts := 0
	for range MaxFiles + 2 {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		err = run.stagePart(part, byPath, &fileParts)
		part.Close()
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("more than %d parts", MaxFiles)
}

func (run *applyRun) stagePart(part *multipart.Part, byPath map[string]*ManifestFile, fileParts *int) error {
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
		f, err = run.files.stagePatch(rel, part, mf.Patch, mf.Digest, mf.Size)
		if errors.Is(err, errPatchBaseMissing) {
			run.unpatched[rel] = true
			return nil
		}
	} else {
		f, err = run.files.stage(rel, part, mf.Digest, mf.Size)
	}
	if err != nil {
		return err
	}
	run.staged[rel] = f
	return nil
}

// ---------------------------------------------------------------------------
// The run.

// runApply runs the transaction and its commit, and starts the read-back.
// It returns a copy of the result.
func (run *applyRun) runApply() ApplyResult {
	m := run.m
	run.result = ApplyResult{PlanID: m.PlanID, OK: true, At: run.now().UTC().Format(time.RFC3339)}
	run.invalidations0 = run.led.invalidationCount()
	run.before = run.led.view()
	run.beforeTree = run.led.treeCopy()
	if run.revert {
		run.revertLKG()
	} else {
		run.transact()
	}
	run.finishStart = run.now()
	run.finish()
	if run.result.OK && run.result.Mode == ResultRuntime && run.readBack != nil && run.applyDeps.readBack != nil {
		run.applyDeps.readBack(run.readBack, run.appliedRef())
	}
	run.logApply()
	return cloneResult(run.result)
}

func (run *applyRun) logApply() {
	attrs := []any{"plan_id", run.m.PlanID, "mode", run.result.Mode, "ok", run.result.OK,
		"generation", run.led.generation(), "total_ms", run.msSince(run.start)}
	if run.reason != "" {
		attrs = append(attrs, "reload_reason", run.reason)
	}
	if run.result.Error != nil {
		attrs = append(attrs, "error_stage", run.result.Error.Stage, "error", run.result.Error.Message)
	}
	run.logger.Info("apply", attrs...)
}

// transact writes the file set and activates it. Before the first rename,
// the journal keeps how every touched path looked under the LKG plan, and
// an intent record, synced, keeps how it looked just before this apply; so
// a crash at any later point is put back at the next start.
func (run *applyRun) transact() {
	dels := deletions(run.before.ManifestPaths, run.m.Files)
	run.txn = run.files.begin(run.stagedList(), dels)
	if err := run.files.markUnchanged(run.txn); err != nil {
		run.abort(StageBackup, err)
		return
	}
	st := run.led.view()
	act := chooseActivation(&st, run.m)
	writeStart := run.now()
	var early *opsOutcome
	if run.txn.touches() || run.mayRunOps() {
		var err error
		if early, err = run.intend(act); err != nil {
			run.abort(StageBackup, err)
			return
		}
	}
	if err := run.txn.write(); err != nil {
		run.abort(StageWrite, err)
		return
	}
	run.timing.WriteMs = (run.now().Sub(writeStart) - early.duration()).Milliseconds()
	run.led.observe(run.treeDelta())

	opsStart := run.now()
	run.activate(act, early)
	run.timing.OpsMs = (run.now().Sub(opsStart) + early.duration()).Milliseconds()
}

// intend reaches the transaction's first durable point: the journal's
// backup links and their directories, then the intent record. Runtime ops
// are sent while the intent syncs, compiled from the staged parts, and
// their outcome is returned: the worker's round trip hides inside the
// sync, and a refusal still falls back to a reload once the files are
// written. A sync that fails after the ops ran aborts the apply, and the
// abort reloads the restored set.
func (run *applyRun) intend(act activation) (*opsOutcome, error) {
	journal := run.before.Journal.clone()
	err := run.txn.backup(&journal)
	// Even a partial journal is kept: its entries describe paths that are
	// still as they were, and abort restores and clears them.
	run.led.setJournal(journal)
	if err == nil {
		err = run.files.syncDirs(run.txn.linkDirs)
	}
	if err != nil {
		return nil, err
	}
	durable, err := run.led.intend(run.m.PlanID, run.txn.undo)
	if err != nil {
		return nil, err
	}
	var ops *opsOutcome
	if act == activateOps {
		ops = run.runtimeOps(run.stagedContent)
	}
	return ops, durable()
}

// stagedContent is what the apply puts at rel, before its renames: the
// staged part, else (an unchanged or unsent file) the held file. A path the
// apply deletes has no content, as it has none once the apply is written.
func (run *applyRun) stagedContent(rel string) ([]byte, error) {
	if _, deleted := slices.BinarySearch(run.txn.deletes, rel); deleted {
		return nil, fmt.Errorf("%q: %w (the apply deletes it)", rel, fs.ErrNotExist)
	}
	if f := run.staged[rel]; f != nil && !f.unchanged {
		if f.inline != nil {
			return f.inline, nil
		}
		return readAllLimited(run.files.disk, f.tmp, MaxApplyBodyBytes)
	}
	return run.files.readHeld(rel)
}

// mayRunOps reports whether activation may send ops to the worker: then a
// crash before the commit must end in a reload, which an open intent asks
// for. A reload alone needs none: the worker it starts loads the committed
// tree, which a restart recognises by the worker's start time.
func (run *applyRun) mayRunOps() bool {
	return len(run.m.RuntimeOps()) > 0 || len(run.m.InPlaceOps) > 0
}

// treeDelta is what the transaction did to the tree: each sent path holds
// the manifest's digest, proof and size (unchanged parts included), each
// deleted path is gone.
func (run *applyRun) treeDelta() map[string]*FileAt {
	byPath := make(map[string]ManifestFile, len(run.m.Files))
	for _, f := range run.m.Files {
		byPath[f.Path] = f
	}
	delta := make(map[string]*FileAt, len(run.staged)+len(run.txn.deletes))
	for p := range run.staged {
		mf := byPath[p]
		delta[p] = &FileAt{Digest: mf.Digest, Proof: mf.Proof, Size: mf.Size}
	}
	for _, p := range run.txn.deletes {
		delta[p] = nil
	}
	return delta
}

// ---------------------------------------------------------------------------
// Activation.

// activation is what an apply's files need from HAProxy.
type activation int

const (
	activateScheduled       activation = iota // a reload is pending: join it, and run the in-place ops
	activateReload                            // the manifest asks for a reload
	activateUnknownBaseline                   // no applied plan to run ops against: reload
	activateOps                               // run the runtime ops; with none, nothing to do
)

// chooseActivation picks what the written files need, first match wins.
func chooseActivation(st *agentState, m *Manifest) activation {
	switch {
	case st.reloadPending():
		return activateScheduled
	case m.Mode == ModeReload:
		return activateReload
	case !st.applied().complete():
		return activateUnknownBaseline
	}
	return activateOps
}

// activate does what act needs, once the files are written; ops is the
// outcome of runtime ops already sent, if any.
func (run *applyRun) activate(act activation, ops *opsOutcome) {
	switch act {
	case activateScheduled:
		st := run.led.view()
		due, err := run.led.schedule(run.appliedRef(), st.ReloadPendingAt)
		if err != nil {
			run.abort(StageWrite, err)
			return
		}
		run.result.Mode = ResultScheduled
		run.result.Reload = &ReloadInfo{ScheduledAt: formatDue(due)}
		run.runInPlace()
	case activateReload:
		run.reload(reasonMode)
	case activateUnknownBaseline:
		run.reload(reasonUnknownBaseline)
	default:
		if ops == nil {
			ops = run.runtimeOps(run.files.readHeld)
		}
		run.afterOps(ops)
	}
}

// opsOutcome is how the runtime ops ended, and how long they took.
type opsOutcome struct {
	compileErr error
	c          *compiledOps
	worker     HAProxyInfo
	results    []OpResult
	err        error
	took       time.Duration
}

// duration is how long the ops took; none ran for a nil outcome.
func (o *opsOutcome) duration() time.Duration {
	if o == nil {
		return 0
	}
	return o.took
}

// runtimeOps compiles the manifest's runtime ops from content and runs
// them on the worker the agent expects. Each line of commands reads the
// worker's identity on its own connection before its commands, so the
// check and the ops are one exchange.
func (run *applyRun) runtimeOps(content func(string) ([]byte, error)) *opsOutcome {
	start := run.now()
	c, err := run.compile(run.m.RuntimeOps(), content)
	if err != nil {
		return &opsOutcome{compileErr: err, took: run.now().Sub(start)}
	}
	if c.empty() {
		return &opsOutcome{c: c, took: run.now().Sub(start)}
	}
	worker, results, err := run.execute(c.programs)
	return &opsOutcome{c: c, worker: worker, results: results, err: err, took: run.now().Sub(start)}
}

// afterOps finishes a runtime apply: a batch
// that could not be compiled, was refused, or reached another worker (which
// is adopted) falls back to a reload; a good one hands its deletes to the
// queue.
func (run *applyRun) afterOps(o *opsOutcome) {
	if o.compileErr != nil {
		run.invariant(false, invOpsExecutable)
		run.logger.Warn("the runtime ops cannot be compiled; reloading instead", "plan_id", run.m.PlanID, "err", o.compileErr)
		run.reload(reasonUnknownOp)
		return
	}
	if o.c.empty() {
		run.settle()
		return
	}
	run.result.OpResults = append(run.result.OpResults, o.results...)
	switch {
	case errors.Is(o.err, errWorkerMoved):
		run.logger.Warn("the ops reached another worker", "err", o.err)
		run.reload(reasonWorkerChanged)
		return
	case o.err != nil:
		run.led.clearWorkerOps() // part of a batch may have landed
		run.metrics.opErrors.inc(firstFailedKind(o.results))
		run.logger.Warn("HAProxy refused a runtime op; reloading the desired set", "plan_id", run.m.PlanID, "err", o.err)
		run.reload(reasonOpRejected)
		return
	}
	if err := run.enqueueDeletes(o.worker, o.c); err != nil {
		run.logger.Warn("deferred deletes could not be queued", "err", err)
		run.reload(reasonDeferredDeleteCommit)
		return
	}
	run.led.foldCreated(o.c.certs, o.c.caFiles)
	run.result.Mode = ResultRuntime
	run.readBack = o.c
}

func formatDue(due time.Time) string { return due.UTC().Format(time.RFC3339Nano) }

// settle finishes an apply that needs nothing from HAProxy.
func (run *applyRun) settle() {
	run.result.Mode = ResultNoop
	if run.txn.changes() > 0 {
		run.result.Mode = ResultFileOnly
	}
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
// every inline op before anything is sent: a batch whose last op cannot be
// compiled sends nothing.
func (run *applyRun) compile(ops []Op, content func(string) ([]byte, error)) (*compiledOps, error) {
	inline, servers, backends := splitDeletes(ops)
	if err := run.queue.check(servers, backends); err != nil {
		return nil, err
	}
	c := &compiledOps{servers: servers, backends: backends, deleting: map[string]bool{}}
	term := run.rt.terminator()
	for i := range inline {
		p, err := compileOp(&inline[i], content, term)
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

// execute runs the programs MaxOpsPerApply at a time on the expected
// worker, stopping at the first failing chunk, and returns the worker they
// ran on. A batch of deletes alone sends no line, so the worker is checked
// on its own. A worker other than the expected one is adopted (which
// invalidates the baseline) and reported as errWorkerMoved, and so is a
// worker a concurrent verified read adopted while the ops ran; ops that
// reached a worker the agent then reloads away are not reported.
func (run *applyRun) execute(programs []program) (HAProxyInfo, []OpResult, error) {
	expected := run.led.expectedWorker()
	if len(programs) == 0 {
		observed, err := run.worker.check(run.ctx)
		if err == nil {
			return observed, nil, nil
		}
		return observed, nil, fmt.Errorf("%w: %w", errWorkerMoved, err)
	}
	var results []OpResult
	for start := 0; start < len(programs); start += MaxOpsPerApply {
		chunk := programs[start:min(start+MaxOpsPerApply, len(programs))]
		run.opsRan = true
		res, observed, err := run.rt.executeAs(run.ctx, chunk, &expected)
		if errors.Is(err, errWorkerMoved) {
			run.worker.adopt(run.ctx, observed)
			return observed, results, err
		}
		results = append(results, res...)
		if err != nil {
			return observed, results, err
		}
	}
	if now := run.led.expectedWorker(); !now.SameWorker(expected) {
		return now, results, fmt.Errorf("%w: %w", errWorkerMoved, workerChangedError(expected, now))
	}
	return expected, results, nil
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

// enqueueDeletes hands the removal half of the deletes to the queue, only
// after the inline half succeeded and the worker was re-checked.
func (run *applyRun) enqueueDeletes(worker HAProxyInfo, c *compiledOps) error {
	if len(c.servers) == 0 && len(c.backends) == 0 {
		return nil
	}
	if err := run.queue.enqueue(worker, c.servers, c.backends); err != nil {
		return err
	}
	run.queue.wake()
	return nil
}

// runInPlace runs the in-place ops against the worker that keeps serving
// until the pending reload fires, in a single execution. Any failure
// invalidates the baseline; the apply stays OK and never triggers a second
// reload.
func (run *applyRun) runInPlace() {
	m := run.m
	if len(m.InPlaceOps) == 0 {
		return
	}
	fail := func(err error) {
		run.result.Error = &ApplyError{Stage: StageInPlace, Message: err.Error()}
		run.led.invalidate()
		run.logger.Warn("in-place ops failed; the baseline is invalidated", "plan_id", m.PlanID, "err", err)
	}
	st := run.led.view()
	if !samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, st.workerOps()) {
		fail(errors.New(msgInPlaceStale))
		return
	}
	c, err := run.compile(m.InPlaceOps, run.files.readHeld)
	if err != nil {
		run.invariant(false, invOpsExecutable)
		fail(err)
		return
	}
	worker, results, err := run.execute(c.programs)
	run.result.OpResults = append(run.result.OpResults, results...)
	if err != nil {
		if !errors.Is(err, errWorkerMoved) {
			run.metrics.opErrors.inc(firstFailedKind(results))
		}
		fail(err)
		return
	}
	if err := run.enqueueDeletes(worker, c); err != nil {
		fail(err)
		return
	}
	run.led.foldCreated(c.certs, c.caFiles)
	run.led.recordWorkerOps(planRef{m.WorkerOpsPlanID, run.workerProof})
}

// ---------------------------------------------------------------------------
// Reloads.

// reload reloads now, or schedules the reload when the pacing window is
// open. Only for the reason "mode" do in-place ops run too: a fallback
// reload has no valid in-place subset.
func (run *applyRun) reload(reason string) {
	run.reason = run.reloadReason(reason)
	due := run.led.pacingDue(run.reloadIntervalMin)
	open := run.now().Before(due)
	run.logger.Info("reload decided", "plan_id", run.m.PlanID, "reason", reason, "scheduled", open)
	if open {
		due, err := run.led.schedule(run.appliedRef(), due)
		if err != nil {
			run.abort(StageReload, err)
			return
		}
		run.pokePacer()
		run.result.Mode = ResultScheduled
		run.result.Reload = &ReloadInfo{ScheduledAt: formatDue(due)}
		if reason == reasonMode {
			run.runInPlace()
		}
		return
	}
	info, err := run.worker.reloadForApply(run.ctx, run.appliedRef())
	run.result.Reload = info
	if err != nil {
		run.refused = errors.Is(err, errReloadRejected)
		run.reloadUnknown = reloadWithoutVerdict(err)
		run.abort(StageReload, err)
		return
	}
	run.reloaded = true
	run.result.Mode = ResultReload
}

// ---------------------------------------------------------------------------
// Revert, abort and rollback.

// revertLKG restores the last-known-good set and reloads it.
func (run *applyRun) revertLKG() {
	if err := run.rollback(); err != nil {
		run.abort(StageRevert, err)
		return
	}
	run.metrics.rollbacks.inc()
	run.result.Rollback = &RollbackInfo{Performed: true}
	st := run.led.view()
	info, err := run.worker.reload(run.ctx, st.lkg())
	run.result.Reload = info
	if err != nil {
		run.abort(StageRevertReload, err)
		return
	}
	run.result.Rollback.Reloaded = true
	run.result.Mode = ResultReload
}

// abort rolls the tree back to the last-known-good set and turns the result
// into a NACK. The failed reload, if any, stays in result.reload.
func (run *applyRun) abort(stage string, cause error) {
	run.metrics.applyRejected.inc(stage)
	run.metrics.rollbacks.inc()
	r := &run.result
	r.OK, r.Mode = false, ResultRejected
	r.Error = &ApplyError{Stage: stage, Message: cause.Error()}
	r.Rollback = &RollbackInfo{}
	run.discardStaged()
	run.led.clearPending()
	run.logger.Warn("apply aborted; restoring the last-known-good set", "plan_id", run.m.PlanID, "stage", stage, "err", cause)
	if err := run.rollback(); err != nil {
		run.logger.Error("restoring the last-known-good set failed", "err", err)
		return
	}
	r.Rollback.Performed = true
	// The worker holds what the rollback undid when ops ran, when the
	// apply's own reload took effect (and its commit then failed), or when
	// a reload's outcome is unknown (HAProxy may still be loading the set
	// the rollback took away): it must load the restored set again. Until it
	// has, the agent vouches for no running plan.
	if run.opsRan || run.reloadUnknown || run.reloaded {
		st := run.led.view()
		if _, err := run.worker.reloadToRecover(run.ctx, st.lkg()); err != nil {
			run.invariant(false, invRecoveryReload)
			run.led.forgetRunning()
			run.logger.Error("the recovery reload after the abort failed; the running plan is unknown", "err", err)
			run.scheduleRepair(st.lkg())
		} else {
			r.Rollback.Reloaded = true
		}
	}
	if errors.Is(cause, errReloadRejected) && len(run.work) > 0 {
		run.remember, run.abortStage = true, stage
	}
}

// scheduleRepair asks the pacer to reload the restored set once more after
// a recovery reload that got no verdict either: a master still busy with a
// slow reload may be serving the set the rollback took away, and the agent
// keeps trying, a bounded number of times, until it serves the restored
// one.
func (run *applyRun) scheduleRepair(lkg planRef) {
	if !lkg.complete() || run.ctx.Err() != nil {
		return
	}
	if !run.led.takeRepair() {
		run.logger.Error("the restored set could not be reloaded; a new apply must reload it", "attempts", maxRepairReloads)
		return
	}
	if _, err := run.led.schedule(lkg, run.now().Add(run.worker.reloadTimeout)); err == nil && run.pokePacer != nil {
		run.pokePacer()
	}
}

// rollback puts the last-known-good set back: the rollback is durable
// before any file moves, the files are restored and their directories
// synced, and the tree the restore left is hashed for the commit. A restored
// file whose bytes did not change keeps its proof, so the next apply need
// not resend it.
func (run *applyRun) rollback() error {
	st := run.led.view()
	if err := run.led.beginRollback(st.Journal); err != nil {
		// Nothing moved yet: the intent, if any, still puts the tree back
		// at the next start. Restore anyway, so that this process serves
		// the last-known-good set now.
		run.logger.Error("the rollback could not be recorded; restoring anyway", "err", err)
	}
	if err := run.files.restore(st.Journal); err != nil {
		return err
	}
	if err := run.files.flush(); err != nil {
		return err
	}
	owned := restoredOwnership(run.before.ManifestPaths, st.Journal)
	tree, err := run.files.hashTree(owned)
	if err != nil {
		return err
	}
	run.restored = &restoredTree{owned: owned, tree: tree, before: run.beforeTree}
	return nil
}

// restoredOwnership is the ownership set after a restore: the owned paths
// minus the ones the journal created, plus every path it brought back. The
// owned paths are those before the apply, so a refusal leaves ownership as
// it was: a path the refused set named, never written because something
// stood in its way, is not owned.
//
// A modified entry is added too, because a path first modified and then
// deleted by a later apply (the first journal entry wins, so its kind stays
// "modified") is restored to disk by the rollback, and without ownership it
// would stay there forever: no later apply could delete it.
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
// Commit.

// finish ends every run in one durable record: an OK apply commits (and
// answers OK only once its commit is durable; a commit that cannot be
// written aborts the apply instead), anything else records its rollback
// and the failure.
func (run *applyRun) finish() {
	if run.result.OK {
		if err := run.commit(); err != nil {
			run.abort(StageWrite, fmt.Errorf("could not record the apply: %w", err))
		} else {
			run.afterFinish()
			return
		}
	}
	o := run.outcome()
	if err := run.led.finishRun(o, run.restored); err != nil {
		run.logger.Error("the failed apply could not be recorded", "plan_id", run.m.PlanID, "err", err)
	}
	if run.remember {
		run.led.rememberNack(run.workKey, run.abortStage, run.work, run.result, run.now().Add(nackTTL))
	}
	run.afterFinish()
}

// commit records an OK apply: the bytes of the files it installed without
// a sync ride in the record, the paths it deleted are named, and the links
// only its undo needed go once the record is durable.
func (run *applyRun) commit() error {
	o := run.outcome()
	c := commitWrites{restored: run.restored}
	if run.txn != nil {
		c.delta = run.treeDelta()
		var synced []*stagedFile
		budget := maxInlinePerApply
		for _, f := range run.txn.installs {
			switch {
			case !f.installed:
			case f.inline != nil && len(f.inline) <= budget:
				c.redo = append(c.redo, redoEntry{Path: f.Rel, Data: f.inline})
				budget -= len(f.inline)
			default:
				synced = append(synced, f)
			}
		}
		c.gone = run.txn.deletes
		c.dropAfter = undoLinks(run.txn.undo)
		if err := run.files.syncInstalled(synced); err != nil {
			return err
		}
	}
	if err := run.led.commit(o, c); err != nil {
		return err
	}
	if o.promote.complete() {
		// The next apply links the new last-known-good's files into its
		// journal, and a link is only as durable as the bytes it leads to.
		run.led.settleFiles()
	}
	return nil
}

// outcome describes how the run ended, for the ledger's settle. The
// result's timing is final here: the record keeps it as last_apply, and the
// answer says the same.
func (run *applyRun) outcome() outcome {
	run.result.Timing = run.timing
	if !run.finishStart.IsZero() {
		run.result.Timing.FinishMs = run.msSince(run.finishStart)
	}
	run.result.Timing.TotalMs = run.msSince(run.start)
	o := outcome{
		result: run.result, ok: run.result.OK, ref: run.appliedRef(), token: run.m.Token,
		schema: run.m.PlanSchemaVersion, revert: run.revert, invalidations0: run.invalidations0,
		refused: run.refused && !run.opsRan, before: run.before, blob: run.blob,
	}
	if run.reloaded {
		o.promote = run.appliedRef()
	}
	if !run.revert && run.txn != nil {
		o.landsTree = true
		o.paths = manifestPaths(run.m.Files)
		o.tree = treeDigestOf(run.led.treeCopy(), o.paths)
	}
	if run.restored != nil {
		o.restoredTree = treeDigest(run.restored.tree) == run.before.TreeDigest
	}
	return o
}

// treeDigestOf folds the entries of paths in tree.
func treeDigestOf(tree map[string]FileAt, paths []string) string {
	sub := make(map[string]FileAt, len(paths))
	for _, p := range paths {
		if at, ok := tree[p]; ok {
			sub[p] = at
		}
	}
	return treeDigest(sub)
}

func manifestPaths(files []ManifestFile) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Path
	}
	slices.Sort(out)
	return out
}

// afterFinish fills the answer from the state, counts it and checks the
// invariants.
func (run *applyRun) afterFinish() {
	prevGen := run.before.Generation
	run.led.fillResult(&run.result)
	run.metrics.applyTotal.inc(run.result.Mode)
	st := run.led.view()
	run.metrics.generation.set(st.Generation)
	if run.m.Mode == ModeReload && run.reason == reasonScheduled {
		return
	}
	in := invariantInputs{
		ok:             run.result.OK,
		revert:         run.revert,
		prevGeneration: prevGen,
		generation:     st.Generation,
		result:         &run.result,
		files:          run.m.Files,
		tree:           run.led.treeCopy(),
		journalEntries: len(st.Journal.Entries),
		applied:        st.applied(),
		lkg:            st.lkg(),
		crossDevice:    run.files.crossDevice.Load(),
	}
	for _, name := range failedInvariants(in) {
		run.invariant(false, name)
	}
}

// ---------------------------------------------------------------------------
// Invariants.

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
// do not hold, in a fixed order so that a log line or metric names them
// the same way every time.
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
