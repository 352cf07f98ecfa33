// This file owns the admission of one apply, in the order it flows:
// reading and checking the manifest, the fence, staging the parts, the
// missing answer, the known-bad cache, last-known-good promotion and role
// proofs. The run that follows is agent_apply_run.go's; the decisions both
// follow are agent_apply_steps.go's.
//
// It never decides what HAProxy should do: it executes what the manifest
// asks, and whenever it cannot, it reloads the files on disk. A failure
// undoes exactly its own apply, never one that was answered.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

// Invariant names, a closed set.
const (
	invGenerationMonotonic      = "generation_monotonic"
	invDiskIsTheDesiredSet      = "disk_is_the_desired_set"
	invRuntimeModeDoesNotReload = "runtime_mode_does_not_reload"
	invReloadModeReloads        = "reload_mode_reloads"
	invNoopRunsNoOps            = "noop_runs_no_ops"
	invJournalOnlyWhileDiverged = "journal_only_while_diverged"
	invOpsExecutable            = "ops_executable"
	invRecoveryReload           = "recovery_reload"
)

const (
	nackTTL            = 60 * time.Second
	msgInPlaceStale    = "in-place ops were composed against a different worker baseline"
	msgProofsExhausted = "agent role proof sequence exhausted"
)

// lock takes the apply lock: whatever reads the state to change it, or
// changes the tree or HAProxy, holds it.
func (d *applyDeps) lock() { d.applyMu.Lock() }

// unlock compacts the log when it is due, whoever wrote to it, and releases
// the apply lock. Every writer of the log ends through here, so no sequence
// of requests can grow the log past what a start reads.
func (d *applyDeps) unlock() {
	d.compactIfDue()
	d.applyMu.Unlock()
}

// owedStatus is the status of a push refused because the disk owes
// something: 507 when the disk is full, 503 otherwise.
func owedStatus(err error) int {
	if isNoSpace(err) {
		return http.StatusInsufficientStorage
	}
	return http.StatusServiceUnavailable
}

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
	now     func() time.Time
	nack    knownBad

	reloadIntervalMin time.Duration

	// applyMu serialises applies, the pacer's reload and read-backs.
	applyMu sync.Mutex
	// owed is what the disk owes the recorded tree, until a retry puts it
	// in place; retrying: the retry loop runs. Guarded by applyMu.
	owed     *owedTree
	retrying bool
	// readBack starts the background check of a runtime apply; pokePacer
	// wakes the pacer once a reload is scheduled; ctx is the agent's
	// context, which ends when it stops.
	readBack  func(c *compiledOps, ref planRef)
	pokePacer func()
	ctx       func() context.Context
}

func (d *applyDeps) msSince(t time.Time) int64 { return d.now().Sub(t).Milliseconds() }

// invariant counts, logs and remembers a broken invariant. It never panics.
func (d *applyDeps) invariant(ok bool, name string) {
	if !ok {
		d.metrics.invariantViolations.inc(name)
		d.logger.Error("invariant violated", "invariant", name)
		d.led.noteInvariant(name)
	}
}

// ---------------------------------------------------------------------------
// The handler, and reading and checking the manifest.

// handleApply is POST /v1/apply: the manifest is read and checked, the
// clock starts, the parts are read and staged, and everything that reads
// or changes the state runs under the apply lock. The answer is written
// once: at the apply's durable point for an apply answered before its
// files are installed, at its end otherwise.
func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	if !a.Ready() {
		writeError(w, http.StatusServiceUnavailable, StageStartup, msgAgentInitialising)
		return
	}
	held := &heldBytes{budget: a.memory, ctx: r.Context()}
	defer held.release()
	read := a.limits[listenerAPI].read
	r.Body = &stallGuard{ReadCloser: http.MaxBytesReader(w, r.Body, MaxApplyBodyBytes),
		rc: http.NewResponseController(w), stall: a.stallTimeout, whole: read, until: time.Now().Add(read)}
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
	m, err := readManifest(mr, held)
	if err == nil {
		normaliseLegacy(m)
		err = validateManifest(m, a.cfg.ConfigFile, a.files.abs)
	}
	if err != nil {
		writeError(w, clientFaultStatus(err), StageManifest, err.Error())
		return
	}
	autoDowngrade(m)
	answered := false
	respond := func(code int, body any) {
		if !answered {
			answered = true
			writeJSON(w, code, body)
			http.NewResponseController(w).Flush()
		}
	}
	run := &applyRun{applyDeps: a.deps, ctx: a.baseCtx, m: m, start: a.now(), staged: map[string]*stagedFile{},
		unpatched: map[string]bool{}, respond: respond, held: held, takePlan: a.takePlan}
	defer run.discardStaged()
	respond(run.admit(mr))
}

// stallGuard ends an upload that makes no progress, and one that takes
// longer than the whole request may: every read must bring bytes within
// stall, and the request ends at until whatever its pace. (A deadline set
// per read replaces the server's own for the whole request, so the guard
// keeps that one too: a client trickling a byte every few seconds would
// otherwise hold its upload open for as long as it liked.)
type stallGuard struct {
	io.ReadCloser
	rc    *http.ResponseController
	stall time.Duration
	whole time.Duration
	until time.Time
}

func (g *stallGuard) Read(p []byte) (int, error) {
	deadline := g.until
	if g.stall > 0 && time.Now().Add(g.stall).Before(deadline) {
		deadline = time.Now().Add(g.stall)
	}
	g.rc.SetReadDeadline(deadline)
	n, err := g.ReadCloser.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		if time.Now().Before(g.until) {
			err = fmt.Errorf("the upload stalled: no bytes for %s", g.stall)
		} else {
			err = fmt.Errorf("the upload took longer than the %s a request may", g.whole)
		}
	}
	return n, err
}

func isFormData(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "multipart/form-data"
}

// readManifest reads the first part, which must be the manifest, into the
// request's share of the memory budget, and decodes it in a decode slot
// (decodeManifest bounds what decoding may build).
func readManifest(mr *multipart.Reader, held *heldBytes) (m *Manifest, err error) {
	part, err := mr.NextRawPart()
	if err != nil {
		return nil, fmt.Errorf("no manifest part: %w", err)
	}
	defer part.Close()
	if name := part.FormName(); name != PartManifest {
		return nil, fmt.Errorf("first part is %q, expected %q", name, PartManifest)
	}
	b, err := io.ReadAll(io.LimitReader(held.reader(part), MaxPlanBlobBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if len(b) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("manifest exceeds the %d-byte limit", MaxPlanBlobBytes)
	}
	err = held.decode(func() (err error) {
		m, err = decodeManifest(b)
		return err
	})
	if err == nil {
		err = held.take((decodedManifestFactor - 1) * len(b))
	}
	return m, err
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
// a fixed order so that a bad manifest always gets the same answer; the
// first failure wins. abs applies the path rules and refuses reserved
// paths, so a manifest naming a socket is refused here rather than at
// staging.
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
// The known-bad cache: HAProxy's own verdict on a set of bytes, for a minute.

// knownBad holds one refusal. It lives in memory only, so it is empty after
// every start, and only the apply lock's holder touches it.
type knownBad struct {
	key    string
	work   []byte
	until  time.Time
	result ApplyResult
}

// workIdentity is the work the manifest asks for, without its fencing
// fields and without patches: a set counts as the same work however it
// arrived. Field order and the absence of omitempty are part of the key.
func workIdentity(m *Manifest) ([]byte, string, error) {
	files := slices.Clone(m.Files)
	for i := range files {
		files[i].Patch = nil
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

// lookup answers a refusal only for byte-equal work within its minute:
// digests are 64-bit and may collide.
func (k *knownBad) lookup(key string, work []byte, now time.Time) (ApplyResult, bool) {
	if k.work == nil || len(work) == 0 || now.After(k.until) || k.key != key || !bytes.Equal(k.work, work) {
		return ApplyResult{}, false
	}
	return cloneResult(k.result), true
}

// ---------------------------------------------------------------------------
// Admission: everything that can still refuse an apply without touching
// anything.

// applyRun is one apply in flight.
type applyRun struct {
	*applyDeps
	ctx       context.Context
	m         *Manifest
	start     time.Time
	timing    ApplyTiming
	staged    map[string]*stagedFile
	unpatched map[string]bool
	plan      *planUpload // the plan part, checked
	planGone  bool        // the plan part is a patch of a plan the agent does not hold
	sawPlan   bool
	budget    int // inline bytes left for the record

	id             applyIdentity
	before         agentState
	tree           map[string]FileAt // the tree the run began with
	stagedList     []*stagedFile     // the staged files, by path
	dels           []string          // the paths it deletes
	invalidations0 uint64
	result         ApplyResult
	readBack       *compiledOps
	reason         string       // why it reloaded
	seq            uint64       // its record, once written
	changes        []fileChange // the paths it changes
	same           []fileChange // parts sent whose bytes the disk already held: only their proofs change
	// refused: HAProxy itself refused this apply's files, a verdict on
	// them worth remembering for a minute.
	refused bool
	// respond writes the answer once; later calls do nothing.
	respond func(code int, body any)
	// held is the request's share of the memory budget, and takePlan checks
	// a plan part within it.
	held     *heldBytes
	takePlan func(held *heldBytes, b []byte, contentType, planID string) (*planUpload, error)
	// open: its record counts only once a second record closes it ok.
	open bool
	// unknown: the disk refused the record of its undo, and its own record
	// may count at the next start: its outcome is not known until the
	// agent can write again.
	unknown error
}

func (run *applyRun) discardStaged() {
	for _, f := range run.staged {
		f.discard(run.files.disk)
	}
}

// admit fences, stages, checks the parts and the known-bad cache, promotes
// the LKG, reserves the proofs and runs the apply. The parts are read and
// staged before the apply lock is taken, so that a slow upload holds up no
// other apply; everything after runs under it, and the fence is checked
// again there: it holds only while nothing else can change the state it
// checked. A fenced apply is refused before its parts are read.
func (run *applyRun) admit(mr *multipart.Reader) (int, any) {
	m := run.m
	if code, body := run.fence(); code != 0 {
		return code, body
	}
	run.budget = maxInlinePerApply
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
	run.lock()
	defer run.unlock()
	admitStart := run.now()
	if err := run.payOwed(run.ctx); err != nil {
		return owedStatus(err), ApplyError{Stage: StageWrite, Message: err.Error()}
	}
	if code, body := run.fence(); code != 0 {
		return code, body
	}
	if err := run.recheckStaged(); err != nil {
		return stagingStatus(err), ApplyError{Stage: StageParts, Message: err.Error()}
	}
	if missing := run.missing(); len(missing) > 0 {
		return http.StatusConflict, Missing{Missing: missing}
	}
	work, key, err := workIdentity(m)
	if err != nil {
		run.logger.Warn("could not encode the work identity; the known-bad cache is skipped", "err", err)
	}
	if cached, hit := run.nack.lookup(key, work, run.now()); hit {
		run.logger.Info("apply answered from the known-bad cache", "plan_id", m.PlanID)
		return http.StatusOK, cached
	}
	// Promotion runs only after every refusal point, because clearing the
	// journal cannot be undone.
	run.promoteLKG(planRef{m.ValidatedPlanID, m.ValidatedPlanProof})
	if m.Mode != ModeRevertLKG {
		if err := run.reserveProofs(); err != nil {
			return http.StatusInternalServerError, ApplyError{Stage: StageIdentity, Message: err.Error()}
		}
	}
	run.timing.AdmitMs = run.msSince(admitStart)
	result := run.runApply()
	if run.refused && len(work) > 0 {
		run.nack = knownBad{key: key, work: work, until: run.now().Add(nackTTL), result: cloneResult(result)}
		run.nack.result.Inventory = nil // an inventory delta rides one answer only
	}
	// The answer goes out before a compaction the apply made due (unlock):
	// it must not wait for a snapshot.
	if run.unknown != nil {
		run.respond(http.StatusServiceUnavailable, ApplyError{Stage: result.Error.Stage,
			Message: fmt.Sprintf("%s: %s (%v)", msgOutcomeUnknown, result.Error.Message, run.unknown)})
	}
	run.respond(http.StatusOK, result)
	return http.StatusOK, result
}

const (
	// msgDiskBehind prefixes the refusal of an apply, and readiness, while
	// the tree is not what the agent's state says (an install after the
	// answer, an undo or a recovery could not write it) and the agent retries.
	msgDiskBehind = "the agent's tree is not yet what its state says"
	// msgLogBroken: likewise while the state log is broken.
	msgLogBroken = "the agent's state log is broken"
	// msgLogStuck: likewise while a compaction fails (a full disk, say).
	msgLogStuck = "the agent's state log cannot be compacted"
	// msgLateMount prefixes readiness once a mount made after the start
	// refused a push, until the agent restarts.
	msgLateMount = "a mount appeared under the tree after the agent started"
	// msgOutcomeUnknown prefixes the answer of a failed apply whose undo the
	// disk would not record.
	msgOutcomeUnknown = "the apply's outcome is unknown until the agent can write its disk again: it failed, and the disk refused the record of its undo"
)

// fence applies the fencing rules to the state as it stands: 0, or the 409
// of a fenced apply.
func (run *applyRun) fence() (int, any) {
	m := run.m
	st := run.led.state()
	window := run.now().Before(run.led.pacingDue(run.reloadIntervalMin))
	if reason := fenceReason(m, &st, inPlaceWillRun(m, st.reloadPending(), window)); reason != "" {
		run.metrics.applyRejected.inc(rejectedStageFencing)
		run.logger.Info("apply fenced", "plan_id", m.PlanID, "reason", reason)
		return http.StatusConflict, conflictOf(&st, reason)
	}
	return 0, nil
}

// recheckStaged settles, under the apply lock, what staging decided
// against a tree an apply may have changed since: a part found unchanged
// is checked again, and a patch whose base moved is asked for whole.
func (run *applyRun) recheckStaged() error {
	_, tree := run.led.view()
	for rel, f := range run.staged {
		if tree[rel] == f.held {
			continue
		}
		switch {
		case f.patch != nil:
			f.discard(run.files.disk)
			delete(run.staged, rel)
			run.unpatched[rel] = true
		case f.unchanged && !run.files.holds(f.abs, f.Digest, f.Size):
			f.unchanged = false
			if int(f.Size) > run.budget {
				// The record has no room left: its bytes wait, synced, in a
				// temp file like a large part's.
				tmp, err := run.files.writeTemp(rel, f.abs, func(w io.Writer) error { _, err := w.Write(f.inline); return err }, true)
				if err != nil {
					return err
				}
				f.tmp, f.inline = tmp, nil
				continue
			}
			run.budget -= int(f.Size)
		}
	}
	return nil
}

// stageParts reads every part after the manifest: at most MaxFiles file
// parts and one plan part, so the loop ends with the body, or with an error
// at the latest on part MaxFiles+2.
func (run *applyRun) stageParts(mr *multipart.Reader) error {
	byPath := make(map[string]*ManifestFile, len(run.m.Files))
	for i := range run.m.Files {
		byPath[run.m.Files[i].Path] = &run.m.Files[i]
	}
	_, tree := run.led.view()
	for range MaxFiles + 2 {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		err = run.stagePart(part, byPath, tree)
		part.Close()
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("more than %d parts", MaxFiles)
}

func (run *applyRun) stagePart(part *multipart.Part, byPath map[string]*ManifestFile, tree map[string]FileAt) error {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return fmt.Errorf("part has no usable Content-Disposition: %w", err)
	}
	if params["name"] == PartPlan {
		if run.sawPlan {
			return fmt.Errorf("part %q appears twice", PartPlan)
		}
		run.sawPlan = true
		b, err := readPlan(run.held.reader(part))
		if err != nil || len(b) == 0 {
			return err // an empty plan part is no plan
		}
		run.plan, err = run.takePlan(run.held, b, part.Header.Get("Content-Type"), run.m.PlanID)
		if errors.Is(err, errPlanBaseGone) {
			run.planGone, err = true, nil
		}
		return err
	}
	if len(run.staged)+len(run.unpatched) >= MaxFiles { // every file part read so far is one or the other
		return fmt.Errorf("more than %d parts", MaxFiles)
	}
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
	var r io.Reader = part
	if mf.Size <= maxInlineBytes || mf.Patch != nil {
		r = run.held.reader(part) // its bytes may stay in memory
	}
	if mf.Patch != nil {
		f, err = run.files.stagePatch(rel, r, mf.Patch, mf.Digest, mf.Size, tree[rel], &run.budget)
		if errors.Is(err, errPatchBaseMissing) {
			run.unpatched[rel] = true
			return nil
		}
	} else {
		f, err = run.files.stage(rel, r, mf.Digest, mf.Size, &run.budget)
	}
	if err != nil {
		f.discard(run.files.disk)
		return err
	}
	f.held = tree[rel]
	run.staged[rel] = f
	return nil
}

// missing lists what the apply lacks, sorted: the manifest's files
// neither staged nor held with the proof the manifest quotes (a file can be
// skipped only when the controller quotes the proof the agent handed out;
// a revert lands files the agent keeps itself), and "plan" for a plan patch
// whose base is not the stored plan, now that the apply holds the lock
// (another upload may have replaced it since the part was staged).
func (run *applyRun) missing() []string {
	var out []string
	if run.planGone || run.plan != nil && run.plan.patch != nil && run.plan.patch.BaseDigest != run.led.heldPlanID() {
		out = append(out, PartPlan)
	}
	if run.m.Mode == ModeRevertLKG {
		return out
	}
	_, tree := run.led.view()
	for _, mf := range run.m.Files {
		held, ok := tree[mf.Path]
		if run.staged[mf.Path] == nil && (run.unpatched[mf.Path] || !ok || mf.Proof == "" ||
			held != FileAt{Digest: mf.Digest, Proof: mf.Proof, Size: mf.Size}) {
			out = append(out, mf.Path)
		}
	}
	slices.Sort(out)
	return out
}

// promoteLKG makes the applied plan the last-known-good once the
// controller's validation vouches for it, which empties the journal. It
// writes nothing of its own: the apply's record carries it. The journal
// the apply starts links the tree's files as they are, installed perhaps
// without a sync; until a compaction syncs them, the log holds their bytes,
// and a start makes a backup a power loss tore again from them.
func (run *applyRun) promoteLKG(v planRef) {
	if st := run.led.state(); samePlanRef(v, st.Applied) && st.LKG != v {
		run.led.promote(v)
		run.logger.Info("last-known-good promoted", "plan_id", v.ID)
	}
}

// reserveProofs issues the applied proof, and the worker proof for in-place
// ops. The counter reaches the disk with the apply's own record, which is
// synced before any answer reports a proof, so a proof is never reported
// twice, not even across a power loss.
func (run *applyRun) reserveProofs() error {
	need := uint64(1 + boolInt(len(run.m.InPlaceOps) > 0))
	run.led.mu.Lock()
	defer run.led.mu.Unlock()
	s := &run.led.st
	if s.ProofGeneration > ^uint64(0)-need {
		return errors.New(msgProofsExhausted)
	}
	run.id.ref = planRef{run.m.PlanID, fmt.Sprintf("a:%d", s.ProofGeneration+1)}
	if need == 2 {
		run.id.worker = planRef{run.m.WorkerOpsPlanID, fmt.Sprintf("a:%d", s.ProofGeneration+2)}
	}
	s.ProofGeneration += need
	return nil
}
