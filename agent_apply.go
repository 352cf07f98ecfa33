// This file owns one apply request, from its manifest to its answer
// (handleApply), and what can refuse it before it runs.
//
// It never decides what HAProxy should do: it executes what the manifest
// asks, and whenever it cannot, it reloads the files on disk.

package haptic

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"mime/multipart"
	"net/http"
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
	rt      *haproxyRuntime
	queue   *deleteQueue
	metrics *agentMetrics
	logger  *slog.Logger
	now     func() time.Time
	nack    knownBad

	reloadIntervalMin   time.Duration
	compactFailures     int       // compactions failed in a row, guarded by applyMu
	compactFailingSince time.Time // when the first of them failed

	// applyMu is the apply lock: whatever reads the state to change it, or
	// changes the tree or HAProxy, holds it (applies, uploads, the pacer,
	// read-backs, verified state reads, the owed retry, the start and the
	// stop). Each of them that writes the log calls compactIfDue before it
	// lets go (the start and the stop compact whatever the log's length),
	// so that no sequence of requests grows the log past what a start reads.
	applyMu sync.Mutex
	// workerMu is the worker-observation lock (agent_worker.go), and
	// guards strays; beforeReload lets internal tests act before a reload.
	workerMu     sync.Mutex
	strays       []string
	beforeReload func()
	// owed is what the disk owes the recorded tree, until a retry puts it
	// in place; retrying: the retry loop runs. Guarded by applyMu.
	owed     *owedTree
	retrying bool
	// ctx is Run's context, which ends when the agent stops; set before
	// any goroutine starts. A scheduled reload wakes the pacer on wake.
	ctx  context.Context
	wake chan struct{}
}

func (d *applyDeps) msSince(t time.Time) int64 { return d.now().Sub(t).Milliseconds() }

// testHookPhase, set only by the phase-table benchmark, is told each point
// on an apply's path to its answer as the apply passes it. In production it
// is nil and costs a comparison per point.
var testHookPhase func(point string)

// passed tells testHookPhase that an apply reached point.
func passed(point string) {
	if testHookPhase != nil {
		testHookPhase(point)
	}
}

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

// handleApply is POST /v1/apply, one apply request's life in the order
// it happens. The manifest is read, taking memory as its bytes arrive, and
// checked; the fence refuses a stale leader before any part is read; the
// parts are staged outside the apply lock, so that a slow upload holds up
// no other apply. Under the lock, admit settles what could still refuse
// the apply and builds its input, runApply runs it, the answer goes out,
// and only then does a log the apply made long enough compact.
func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	if !a.Ready() {
		writeError(w, http.StatusServiceUnavailable, StageStartup, msgAgentInitialising)
		return
	}
	passed("handler")
	held := a.hold(w, r, false)
	defer held.release()
	mr, err := r.MultipartReader()
	if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mediaType != "multipart/form-data" {
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
	passed("manifest")
	start := a.now()
	if code, body := a.deps.fence(m); code != 0 {
		writeJSON(w, code, body)
		return
	}
	p, err := a.stageParts(m, mr, held)
	defer p.discard(a.files.disk)
	if err != nil {
		a.metrics.applyRejected.inc(StageParts)
		code := stagingStatus(err)
		if code >= http.StatusInternalServerError {
			a.logger.Error("apply failed: the agent could not stage the parts", "plan_id", m.PlanID, "err", err)
		} else {
			a.logger.Info("apply refused: parts", "plan_id", m.PlanID, "err", err)
		}
		writeError(w, code, StageParts, err.Error())
		return
	}
	passed("staged")
	a.deps.applyMu.Lock()
	defer a.deps.applyMu.Unlock()
	in, code, body := a.deps.admit(a.deps.ctx, m, p, start)
	var done outcome
	if in != nil {
		passed("admitted")
		done = a.deps.runApply(in)
		code, body = a.deps.answer(in, done)
		p.kept = done.keepStaged
	}
	passed("answering")
	writeJSON(w, code, body)
	http.NewResponseController(w).Flush()
	if done.readBack != nil {
		a.reads.start(done.readBack, in.id.ref)
	}
	a.deps.compactIfDue() // after the answer, which never waits for a snapshot
}

// readManifest reads the first part, which must be the manifest, into the
// request's share of the memory budget, takes what decoding may build
// (decodeManifest bounds it), and decodes it in a decode slot.
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
	if err = held.take((decodedManifestFactor - 1) * len(b)); err == nil {
		err = held.decode(func() (err error) {
			m, err = decodeManifest(b)
			return err
		})
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
		_, err := abs(f.Path)
		if err = cmp.Or(err, checkRuntimePath(f.Kind, f.Path)); err != nil {
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
	return *cloneResult(&k.result), true
}

// ---------------------------------------------------------------------------
// Staging: the parts, read and checked before the apply lock.

// parts is what an apply's body brought besides its manifest, checked.
type parts struct {
	staged    map[string]*stagedFile
	unpatched map[string]bool // paths sent as a patch of a base the agent does not hold
	plan      *planUpload     // the plan part, checked
	planGone  bool            // the plan part is a patch of a plan the agent does not hold
	budget    int             // inline bytes left for the record
	// kept: the temp files of the staged parts are the sources of files
	// owed, and stay.
	kept bool
}

// discard removes the parts' temp files, unless they are kept.
func (p *parts) discard(d disk) {
	if p.kept {
		return
	}
	for _, f := range p.staged {
		f.discard(d)
	}
}

// stageParts reads every part after the manifest: at most MaxFiles file
// parts and one plan part, so the loop ends with the body, or with an error
// at the latest on part MaxFiles+2.
func (a *Agent) stageParts(m *Manifest, mr *multipart.Reader, held *heldBytes) (*parts, error) {
	p := &parts{staged: map[string]*stagedFile{}, unpatched: map[string]bool{}, budget: maxInlinePerApply}
	byPath := make(map[string]*ManifestFile, len(m.Files))
	for i := range m.Files {
		byPath[m.Files[i].Path] = &m.Files[i]
	}
	_, tree := a.led.view()
	sawPlan := false
	for range MaxFiles + 2 {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return p, nil
		}
		if err != nil {
			return p, err
		}
		_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		switch {
		case err != nil:
			err = fmt.Errorf("part has no usable Content-Disposition: %w", err)
		case params["name"] != PartPlan:
			err = a.stageFile(p, params["filename"], part, byPath, tree, held)
		case sawPlan:
			err = fmt.Errorf("part %q appears twice", PartPlan)
		default: // an empty plan part is no plan
			sawPlan = true
			p.plan, err = a.readPlan(held, part, part.Header.Get("Content-Type"), m.PlanID)
			if errors.Is(err, errPlanBaseGone) {
				p.planGone, err = true, nil
			}
		}
		part.Close()
		if err != nil {
			return p, err
		}
	}
	return p, fmt.Errorf("more than %d parts", MaxFiles)
}

// stageFile stages the file part for rel, whole or as a patch of the file
// held.
func (a *Agent) stageFile(p *parts, rel string, part *multipart.Part, byPath map[string]*ManifestFile, tree map[string]FileAt, held *heldBytes) error {
	if len(p.staged)+len(p.unpatched) >= MaxFiles { // every file part read so far is one or the other
		return fmt.Errorf("more than %d parts", MaxFiles)
	}
	if rel == "" {
		return errors.New("a file part carries no filename")
	}
	mf := byPath[rel]
	if mf == nil {
		return fmt.Errorf("part %q is not in the manifest", rel)
	}
	if p.staged[rel] != nil || p.unpatched[rel] {
		return fmt.Errorf("part %q appears twice", rel)
	}
	var r io.Reader = part
	if mf.Size <= maxInlineBytes || mf.Patch != nil {
		r = held.reader(part) // its bytes may stay in memory
	}
	f, err := a.files.stage(rel, r, mf.Patch, mf.Digest, mf.Size, tree[rel], &p.budget)
	if errors.Is(err, errPatchBaseMissing) {
		p.unpatched[rel] = true
		return nil
	}
	if err != nil {
		f.discard(a.files.disk)
		return err
	}
	p.staged[rel] = f
	return nil
}

// ---------------------------------------------------------------------------
// Admission: everything that can still refuse an apply without touching
// anything, under the apply lock.

// admit settles, under the apply lock, what can still refuse the apply:
// what the disk owes is paid first, the fence runs again (it holds only
// while nothing else can change the state it checked), staging is checked
// against a tree that may have changed since, missing parts are asked for,
// and the known-bad cache answers work HAProxy refused a minute ago. Then
// the last-known-good is promoted, which cannot be undone, and the proofs
// are reserved. It returns the apply's input, or the answer of a refusal.
func (d *applyDeps) admit(ctx context.Context, m *Manifest, p *parts, start time.Time) (*applyInput, int, any) {
	admitStart := d.now()
	if err := d.payOwed(ctx); err != nil {
		return nil, owedStatus(err), ApplyError{Stage: StageWrite, Message: err.Error()}
	}
	if code, body := d.fence(m); code != 0 {
		return nil, code, body
	}
	if err := cmp.Or(d.recheckStaged(p), d.keepsWorkerSocket(m, p)); err != nil {
		d.metrics.applyRejected.inc(StageParts)
		return nil, stagingStatus(err), ApplyError{Stage: StageParts, Message: err.Error()}
	}
	if missing := d.missing(m, p); len(missing) > 0 {
		return nil, http.StatusConflict, Missing{Missing: missing}
	}
	work, key, err := workIdentity(m)
	if err != nil {
		d.logger.Warn("could not encode the work identity; the known-bad cache is skipped", "err", err)
	}
	if cached, hit := d.nack.lookup(key, work, d.now()); hit {
		d.logger.Info("apply answered from the known-bad cache", "plan_id", m.PlanID)
		return nil, http.StatusOK, cached
	}
	d.promoteLKG(planRef{m.ValidatedPlanID, m.ValidatedPlanProof})
	id := applyIdentity{token: m.Token, schema: m.PlanSchemaVersion, blob: p.plan != nil}
	if m.Mode == ModeRevertLKG {
		id.revert = true
	} else if id.ref, id.worker, err = d.reserveProofs(m); err != nil {
		return nil, http.StatusInternalServerError, ApplyError{Stage: StageIdentity, Message: err.Error()}
	}
	st, tree := d.led.view()
	if id.revert {
		id.ref = st.LKG
	}
	staged := slices.SortedFunc(maps.Values(p.staged), func(a, b *stagedFile) int { return cmp.Compare(a.Rel, b.Rel) })
	in := &applyInput{ctx: ctx, m: m, plan: p.plan, staged: staged, id: id, before: st, tree: tree, invalidations: d.led.invalidationCount(),
		steps: decideSteps(&st, m, d.now().Before(d.led.pacingDue(d.reloadIntervalMin))), start: start,
		timing: ApplyTiming{StageMs: admitStart.Sub(start).Milliseconds(), AdmitMs: d.msSince(admitStart)}}
	return in, 0, nil
}

// answer is the answer of an apply that ran, and what the known-bad cache
// keeps of it: a refusal of its files by HAProxy, for a minute. An apply
// whose undo the disk would not record is of unknown outcome: a 503 says
// so.
func (d *applyDeps) answer(in *applyInput, done outcome) (int, any) {
	r := done.result
	if done.refused {
		if work, key, _ := workIdentity(in.m); len(work) > 0 {
			d.nack = knownBad{key: key, work: work, until: d.now().Add(nackTTL), result: *cloneResult(&r)}
			d.nack.result.Inventory = nil // an inventory delta rides one answer only
		}
	}
	attrs := []any{"plan_id", in.m.PlanID, "mode", r.Mode, "ok", r.OK,
		"generation", d.led.state().Generation, "total_ms", r.Timing.TotalMs}
	if done.reason != "" {
		attrs = append(attrs, "reload_reason", done.reason)
	}
	if r.Error != nil {
		attrs = append(attrs, "error_stage", r.Error.Stage, "error", r.Error.Message)
	}
	d.logger.Info("apply", attrs...)
	if done.unknown != nil {
		return http.StatusServiceUnavailable, ApplyError{Stage: r.Error.Stage,
			Message: fmt.Sprintf("%s: %s (%v)", msgOutcomeUnknown, r.Error.Message, done.unknown)}
	}
	return http.StatusOK, r
}

const (
	// msgDiskBehind prefixes the refusal of an apply, and readiness, while
	// the tree is not what the agent's state says (an install, an undo or
	// a recovery could not write it) and the agent retries.
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
	// msgFilesOwed prefixes the error of an acknowledged apply whose files
	// could not be installed.
	msgFilesOwed = "acknowledged, but its files are not in place yet: the agent retries, and is not ready until they are"
)

// fence applies the fencing rules to the state as it stands: 0, or the 409
// of a fenced apply.
func (d *applyDeps) fence(m *Manifest) (int, any) {
	st := d.led.state()
	window := d.now().Before(d.led.pacingDue(d.reloadIntervalMin))
	if reason := fenceReason(m, &st, inPlaceWillRun(m, st.reloadPending(), window)); reason != "" {
		d.metrics.applyRejected.inc(rejectedStageFencing)
		d.logger.Info("apply fenced", "plan_id", m.PlanID, "reason", reason)
		return http.StatusConflict, conflictOf(&st, reason)
	}
	return 0, nil
}

// recheckStaged settles, under the apply lock, what staging decided
// against a tree an apply may have changed since: a part found unchanged
// is checked again, and a patch whose base moved is asked for whole.
func (d *applyDeps) recheckStaged(p *parts) error {
	_, tree := d.led.view()
	for rel, f := range p.staged {
		if tree[rel] == f.held {
			continue
		}
		switch {
		case f.patch != nil:
			f.discard(d.files.disk)
			delete(p.staged, rel)
			p.unpatched[rel] = true
		case f.unchanged && !d.files.holds(f.abs, f.Digest, f.Size):
			f.unchanged = false
			if int(f.Size) > p.budget {
				// The record has no room left: its bytes wait, synced, in a
				// temp file like a large part's.
				tmp, err := d.files.writeTemp(rel, f.abs, func(w io.Writer) error { _, err := w.Write(f.inline); return err }, true)
				if err != nil {
					return err
				}
				f.tmp, f.inline = tmp, nil
				continue
			}
			p.budget -= int(f.Size)
		}
	}
	return nil
}

// missing lists what the apply lacks, sorted: the manifest's files
// neither staged nor held with the proof the manifest quotes (a file can be
// skipped only when the controller quotes the proof the agent handed out;
// a revert lands files the agent keeps itself), and "plan" for a plan patch
// whose base is not the stored plan, now that the apply holds the lock
// (another upload may have replaced it since the part was staged).
func (d *applyDeps) missing(m *Manifest, p *parts) []string {
	var out []string
	if p.planGone || p.plan != nil && p.plan.patch != nil && p.plan.patch.BaseDigest != d.led.heldPlanID() {
		out = append(out, PartPlan)
	}
	if m.Mode == ModeRevertLKG {
		return out
	}
	_, tree := d.led.view()
	for _, mf := range m.Files { // a path the tree lacks holds no digest, and validation refused an empty one
		if p.staged[mf.Path] == nil && (p.unpatched[mf.Path] || mf.Proof == "" ||
			tree[mf.Path] != FileAt{Digest: mf.Digest, Proof: mf.Proof, Size: mf.Size}) {
			out = append(out, mf.Path)
		}
	}
	slices.Sort(out)
	return out
}

// promoteLKG makes the applied plan the last-known-good once the
// controller's validation vouches for it, which empties the journal. It
// writes nothing of its own: the apply's record carries it (repairBackups
// says how the journal's links survive a power loss).
func (d *applyDeps) promoteLKG(v planRef) {
	if st := d.led.state(); samePlanRef(v, st.Applied) && st.LKG != v {
		d.led.promote(v)
		d.logger.Info("last-known-good promoted", "plan_id", v.ID)
	}
}

// reserveProofs issues the applied proof, and the worker proof for in-place
// ops.
func (d *applyDeps) reserveProofs(m *Manifest) (ref, worker planRef, err error) {
	inPlace := len(m.InPlaceOps) > 0
	first, err := d.led.reserveProofs(uint64(1 + boolInt(inPlace)))
	if err != nil {
		return ref, worker, err
	}
	if inPlace {
		worker = planRef{m.WorkerOpsPlanID, fmt.Sprintf("a:%d", first+1)}
	}
	return planRef{m.PlanID, fmt.Sprintf("a:%d", first)}, worker, nil
}
