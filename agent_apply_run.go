// This file owns the run of one admitted apply, in the order it flows:
// what it changes and how each path looked before, its record (the durable
// point, with the runtime ops sent while it syncs), the install,
// activation, the undo of a failure, and the end record. The pacer's
// scheduled reload ends the same way (agent_pacing.go).
//
// It never takes back an apply that was answered: a failure puts back
// only what this run changed, and reloads the worker only where this run
// may have changed it.

package haptic

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// runApply runs the apply to its end and starts the read-back. It returns
// a copy of the result.
func (run *applyRun) runApply() ApplyResult {
	m := run.m
	run.result = ApplyResult{PlanID: m.PlanID, OK: true, At: run.now().UTC().Format(time.RFC3339)}
	st, tree := run.led.view()
	run.before, run.tree = st, tree
	run.invalidations0 = run.led.invalidationCount()
	run.id.token, run.id.schema, run.id.blob = m.Token, m.PlanSchemaVersion, run.plan != nil
	if m.Mode == ModeRevertLKG {
		run.id.ref, run.id.revert = st.LKG, true
	}
	window := run.now().Before(run.led.pacingDue(run.reloadIntervalMin))
	s := decideSteps(&st, m, window)
	o := run.transact(s, st, tree)
	if o.ok && !o.installed && run.id.changed {
		// Counted from its record: its files are renamed into the tree now,
		// before the answer, so that whoever reads the disk after the
		// answer sees them.
		run.installCounted()
	}
	run.finish(s, o)
	if run.result.OK && run.result.Mode == ResultRuntime && run.readBack != nil {
		run.applyDeps.readBack(run.readBack, run.id.ref)
	}
	run.logApply()
	return cloneResult(run.result)
}

func (run *applyRun) logApply() {
	attrs := []any{"plan_id", run.m.PlanID, "mode", run.result.Mode, "ok", run.result.OK,
		"generation", run.led.state().Generation, "total_ms", run.msSince(run.start)}
	if run.reason != "" {
		attrs = append(attrs, "reload_reason", run.reason)
	}
	if run.result.Error != nil {
		attrs = append(attrs, "error_stage", run.result.Error.Stage, "error", run.result.Error.Message)
	}
	run.logger.Info("apply", attrs...)
}

// transact writes the apply's record and activates its files. An apply
// that needs nothing from HAProxy but its ops (or nothing at all) counts
// from its record once it is synced, its ops sent while the sync runs;
// its files are installed after that (installCounted), unsynced, and
// before the answer. It never needs an undo, unless its ops are refused
// and it falls back to a reload.
// Any other apply installs its files first, with its undo, and then
// reloads, schedules or joins a reload.
func (run *applyRun) transact(s steps, st agentState, tree map[string]FileAt) outcome {
	for _, f := range run.staged {
		run.stagedList = append(run.stagedList, f)
	}
	slices.SortFunc(run.stagedList, func(a, b *stagedFile) int { return cmp.Compare(a.Rel, b.Rel) })
	if !run.id.revert {
		run.dels = deletions(tree, run.m.Files)
	}
	run.open = s.open
	early := s.act == activateOps || s.act == activateNothing
	if err := run.describe(st, tree, !early); err != nil {
		stage := StageBackup
		if errors.Is(err, errInvalidPath) {
			stage = StageWrite // something in the tree is in the way of a file
		}
		return run.abort(stage, err, outcome{undone: true})
	}
	writeStart := run.now()
	rec := &logRecord{Files: append(slices.Clip(run.changes), run.same...), Open: s.open, Journal: journalAdditions(st.Journal, run.id.undo)}
	run.plan.carry(rec)
	opsMayRun := s.act == activateOps || len(run.m.InPlaceOps) > 0 && (s.act == activateJoin || s.act == activateSchedule)
	landed := landing(st, run.id, s, opsMayRun, run.now())
	rec.State = &landed
	durable, err := run.led.beginApply(rec)
	if err != nil {
		return run.abort(StageBackup, err, outcome{undone: true})
	}
	run.seq = rec.Seq
	ops := &opsOutcome{}
	if s.act == activateOps {
		ops = run.runtimeOps()
	}
	if err := durable(); err != nil {
		// Nothing was renamed: only the worker may hold this apply, and
		// its record is gone, unless the disk kept it.
		if !errors.Is(err, errRecordKept) {
			run.seq = 0
		}
		return run.abort(StageBackup, err, outcome{undone: true, opsRan: ops.ran})
	}
	run.timing.WriteMs = (run.now().Sub(writeStart) - ops.took).Milliseconds()
	o := outcome{opsRan: ops.ran}
	opsStart := run.now()
	defer func() { run.timing.OpsMs = (run.now().Sub(opsStart) + ops.took).Milliseconds() }()
	switch s.act {
	case activateOps:
		return run.afterOps(ops, o)
	case activateNothing:
		return run.settled(o)
	}
	o, ok := run.installNow(o)
	switch {
	case !ok:
		return o
	case s.act == activateJoin:
		o.due = st.PendingAt
		return run.schedule(o, true)
	}
	return run.reload(s.reason, o)
}

// installNow installs the apply's files before it activates them: every
// path it changes is linked aside first (its undo), since HAProxy may
// refuse them. A revert puts the journal's set back instead. A failure
// aborts the run: ok is false.
func (run *applyRun) installNow(o outcome) (_ outcome, ok bool) {
	if err := run.files.linkUndo(run.changes, run.tree, func(c *fileChange) bool { return c.Undo == "" }); err != nil {
		return run.abort(StageBackup, err, o), false
	}
	run.noteUndo()
	o.installed = run.id.changed
	writeStart := run.now()
	stage, err := StageWrite, error(nil)
	if run.id.revert {
		stage, err = StageRevert, run.restore(wantsOf(run.changes, false), journalSources(run.before.Journal))
	} else {
		err = run.files.install(run.stagedList, run.dels)
	}
	run.timing.WriteMs += run.msSince(writeStart)
	if err != nil {
		return run.abort(stage, err, o), false
	}
	return o, true
}

// installCounted installs the files of an apply that counts from its
// record (runtime, file_only, noop). It is acknowledged whatever happens
// here, and a failure (a full disk, an I/O error, a mount made after the
// start) never takes it back: the disk owes its files, which the record's
// sources (its inline bytes, its synced temp files, a patch's base) can
// still rebuild, until a retry puts them in place; the answer says so.
func (run *applyRun) installCounted() {
	err := run.files.install(run.stagedList, run.dels)
	if err == nil {
		return
	}
	run.staged = nil // its temp files are sources of what is owed
	run.logger.Error("the files of an acknowledged apply could not be installed; the agent retries, and is not ready until they are in place",
		"plan_id", run.m.PlanID, "err", err)
	run.result.Error = &ApplyError{Stage: StageWrite, Message: fmt.Sprintf("%s: %v", msgFilesOwed, err)}
	run.owe(&owedTree{wants: wantsOf(run.changes, false), sources: sourcesOf(run.changes), err: err})
}

// msgFilesOwed prefixes the error of an acknowledged apply whose files
// could not be installed.
const msgFilesOwed = "acknowledged, but its files are not in place yet: the agent retries, and is not ready until they are"

// owedTree is what the disk owes the tree the ledger records: the files of
// an answered apply whose install failed, or what recovery could not put
// back at start. While it is owed the agent is not ready, every apply tries
// it again first and so does a loop every owedRetryInterval, and nothing
// that could drop the records or links it needs (a compaction, a sweep)
// runs.
type owedTree struct {
	wants   []want
	sources map[FileAt][]source
	// reload: HAProxy must load the tree once it is in place (recovery
	// changed files a worker may have loaded before the agent started).
	reload bool
	err    error // why it is owed
}

// owedRetryInterval is how often an owed tree is tried again.
const owedRetryInterval = time.Second

// owe records what the disk owes (beside what it owed already), and
// starts the retries. The caller holds the apply lock.
func (d *applyDeps) owe(t *owedTree) {
	if d.owed == nil {
		d.owed = &owedTree{sources: map[FileAt][]source{}}
	}
	for key, list := range t.sources {
		d.owed.sources[key] = append(d.owed.sources[key], list...)
	}
	d.owed.wants = append(d.owed.wants, t.wants...)
	d.owed.reload = d.owed.reload || t.reload
	d.owed.err = t.err
	d.led.fallBehind(t.err)
	d.metrics.diskBehind.set(1)
	d.retry()
}

// payOwed does, under the apply lock, what the disk owes: the owed tree,
// then a new snapshot, which mends a broken log and proves the disk takes
// writes again, and only then the reload HAProxy owes, so that nothing
// reloads onto a tree the agent cannot write. Every apply calls it before
// it reads the tree, and so does the retry loop. It returns the error that
// still stands.
func (d *applyDeps) payOwed(ctx context.Context) error {
	if d.owed == nil && d.led.brokenBy() == nil && d.led.compactionFailed() == nil {
		return nil
	}
	var err error
	if d.owed != nil {
		if _, err = d.files.restore(d.owed.wants, d.owed.sources); err == nil {
			d.owed.wants = nil
		}
	}
	if err == nil {
		err = d.compact()
	}
	if err != nil {
		switch {
		case d.owed != nil:
			d.owed.err = err
			d.led.fallBehind(err)
			return fmt.Errorf("%s: %w", msgDiskBehind, err)
		case d.led.brokenBy() != nil:
			return fmt.Errorf("%s: %w", msgLogBroken, err)
		}
		return fmt.Errorf("%s: %w", msgLogStuck, err)
	}
	if d.owed != nil {
		// A worker that started while files were owed (HAProxy restarted)
		// loaded the tree without them: it must load them now. A reload
		// that gets no verdict, HAProxy away, is tried again.
		if d.owed.reload || !d.sameWorker(ctx) {
			if err := d.reloadRecovered(ctx); err != nil && !errors.Is(err, errReloadRejected) {
				d.owed.reload, d.owed.err = true, err
				d.led.fallBehind(fmt.Errorf("HAProxy has not loaded the tree yet: %w", err))
				return fmt.Errorf("%s: HAProxy has not loaded the tree yet: %w", msgDiskBehind, err)
			}
		}
		d.owed = nil
		d.led.fallBehind(nil)
		d.metrics.diskBehind.set(0)
		d.logger.Info("the tree is what the agent's state says again")
	}
	return nil
}

// retry starts the loop that pays what the disk owes, unless it runs. The
// caller holds the apply lock.
func (d *applyDeps) retry() {
	if !d.retrying {
		d.retrying = true
		go d.retryOwed(d.ctx())
	}
}

// sameWorker reports whether the worker that answers now is the one the
// agent expects.
func (d *applyDeps) sameWorker(ctx context.Context) bool {
	info, err := d.rt.info(ctx)
	return err == nil && d.led.state().Worker.SameWorker(info)
}

// reloadRecovered reloads the tree recovery put back, and records what
// the worker then runs: a recovery reload that failed vouches for nothing.
func (d *applyDeps) reloadRecovered(ctx context.Context) error {
	_, err := d.worker.reload(ctx)
	if err != nil {
		d.logger.Error("the recovery reload failed; the running plan is unknown", "err", err)
		d.invariant(false, invRecoveryReload)
	}
	d.led.forget(func(s *agentState) {
		s.Running, s.WorkerOps = planRef{}, planRef{}
		if err == nil && s.Applied.complete() {
			s.Running, s.WorkerOps = s.Applied, s.Applied
		}
		clearPending(s)
	})
	return err
}

// retryOwed pays what the disk owes every owedRetryInterval until it is
// paid or the agent stops.
func (d *applyDeps) retryOwed(ctx context.Context) {
	t := time.NewTicker(owedRetryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		d.lock()
		stop := ctx.Err() != nil || d.payOwed(ctx) == nil
		d.retrying = !stop
		d.applyMu.Unlock()
		if stop {
			return
		}
	}
}

// describe lists what the apply changes and links paths aside: with undo,
// every path it changes (the apply may be refused after its install);
// otherwise only what must stay reachable whatever happens: a path's bytes
// on its first change since the last-known-good plan (the journal's
// backup), and the base of a patch the record carries as a replacement
// alone. It syncs each temp directory a large part sits in, so that
// recovery can still rename it into place. A revert's changes are the
// journal's entries.
func (run *applyRun) describe(st agentState, tree map[string]FileAt, undo bool) error {
	byPath := make(map[string]ManifestFile, len(run.m.Files))
	for _, f := range run.m.Files {
		byPath[f.Path] = f
	}
	var changes, same []fileChange
	var largeDirs []string
	for _, f := range run.stagedList {
		mf := byPath[f.Rel]
		c := fileChange{Path: f.Rel, New: &FileAt{Digest: f.Digest, Proof: mf.Proof, Size: f.Size}}
		switch {
		case f.unchanged:
			same = append(same, c) // its proof changes, nothing else
			continue
		case f.tmp != "":
			c.Temp = f.tmp
			largeDirs = appendUnique(largeDirs, filepath.Dir(f.tmp))
		case f.patch != nil:
			c.Data, c.Patch = f.repl, f.patch
		default:
			c.Data = f.inline
		}
		changes = append(changes, c)
	}
	for _, p := range run.dels {
		changes = append(changes, fileChange{Path: p})
	}
	if run.id.revert {
		changes = append(changes, journalChanges(st.Journal)...)
	}
	if len(changes) > MaxFiles {
		return fmt.Errorf("%d changes exceed the %d-file limit", len(changes), MaxFiles)
	}
	journalled := map[string]bool{}
	for _, e := range st.Journal {
		journalled[e.Path] = true
	}
	link := func(c *fileChange) bool { return undo || !journalled[c.Path] || c.Patch != nil }
	if err := run.files.linkUndo(changes, tree, link); err != nil {
		return err
	}
	for _, c := range changes {
		if c.New != nil {
			if err := run.files.onItsMount(c.Path); err != nil {
				return err
			}
		}
	}
	run.id.changed = len(changes) > 0
	run.changes, run.same = changes, same
	run.noteUndo()
	for _, dir := range largeDirs {
		if err := run.files.disk.SyncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// noteUndo records how each changed path looked before the apply, and
// where its bytes are kept: the journal's additions, the pending reload's
// undo and the undo of a refusal are made of it.
func (run *applyRun) noteUndo() {
	run.id.undo = nil
	for _, c := range run.changes {
		run.id.undo = append(run.id.undo, journalEntry{Path: c.Path, At: c.Old, Backup: c.Undo})
	}
}

// stagedContent is what the apply puts at rel, before its renames: the
// staged part, else the held file. A path the apply deletes has no
// content, as it has none once the apply is installed.
func (run *applyRun) stagedContent(rel string) ([]byte, error) {
	if f := run.staged[rel]; f != nil && !f.unchanged {
		if f.tmp != "" {
			return readAllLimited(run.files.disk, f.tmp, MaxApplyBodyBytes)
		}
		var b bytes.Buffer
		err := run.files.writeStaged(f, &b)
		return b.Bytes(), err
	}
	if slices.ContainsFunc(run.changes, func(c fileChange) bool { return c.Path == rel && c.New == nil }) {
		return nil, fmt.Errorf("%q: %w (the apply deletes it)", rel, fs.ErrNotExist)
	}
	return run.files.readHeld(rel)
}

// settled ends an apply that needs nothing from HAProxy: file_only when
// any part was sent or a path deleted, noop otherwise.
func (run *applyRun) settled(o outcome) outcome {
	o.ok, o.mode = true, ResultNoop
	if len(run.changes)+len(run.same) > 0 {
		o.mode = ResultFileOnly
	}
	return o
}

// ---------------------------------------------------------------------------
// Activation.

// opsOutcome is how the runtime ops ended, and how long they took.
type opsOutcome struct {
	compileErr error
	c          *compiledOps
	worker     HAProxyInfo
	results    []OpResult
	err        error
	ran        bool // a line reached the worker
	took       time.Duration
}

// runtimeOps compiles the manifest's runtime ops from the staged content
// and runs them on the worker the agent expects.
func (run *applyRun) runtimeOps() *opsOutcome {
	start := run.now()
	c, err := run.compile(run.m.RuntimeOps(), run.stagedContent)
	if err != nil {
		return &opsOutcome{compileErr: err, took: run.now().Sub(start)}
	}
	out := &opsOutcome{c: c}
	if !c.empty() {
		out.worker, out.results, out.ran, out.err = run.execute(c.programs)
	}
	out.took = run.now().Sub(start)
	return out
}

// afterOps finishes a runtime apply. A batch that could not be compiled,
// was refused, or reached another worker (which is adopted) falls back to
// a reload of the desired set; a good one hands its deletes to the queue.
func (run *applyRun) afterOps(ops *opsOutcome, o outcome) outcome {
	switch {
	case ops.compileErr != nil:
		// Diff keeps out what the worker's version cannot take; one that
		// arrives anyway is that version's limit, not a broken invariant.
		run.invariant(errors.Is(ops.compileErr, errVersionLimit), invOpsExecutable)
		run.logger.Warn("the runtime ops cannot be compiled; reloading instead", "plan_id", run.m.PlanID, "err", ops.compileErr)
		return run.fallback(reasonUnknownOp, o)
	case ops.c.empty():
		return run.settled(o)
	}
	run.result.OpResults = append(run.result.OpResults, ops.results...)
	switch {
	case errors.Is(ops.err, errWorkerMoved):
		run.logger.Warn("the ops reached another worker", "err", ops.err)
		return run.fallback(reasonWorkerChanged, o)
	case ops.err != nil:
		run.metrics.opErrors.inc(firstFailedKind(ops.results))
		run.logger.Warn("HAProxy refused a runtime op; reloading the desired set", "plan_id", run.m.PlanID, "err", ops.err)
		return run.fallback(reasonOpRejected, o)
	}
	if err := run.enqueueDeletes(ops.worker, ops.c); err != nil {
		run.logger.Warn("deferred deletes could not be queued", "err", err)
		return run.fallback(reasonDeferredDeleteCommit, o)
	}
	run.led.foldCreated(ops.c.certs, ops.c.caFiles)
	run.readBack = ops.c
	o.ok, o.mode = true, ResultRuntime
	return o
}

// fallback reloads the desired set of a runtime apply whose ops did not
// land: its files are installed first, with their undo, since HAProxy may
// refuse them.
func (run *applyRun) fallback(reason string, o outcome) outcome {
	o, ok := run.installNow(o)
	if !ok {
		return o
	}
	return run.reload(reason, o)
}

// compiledOps is a batch ready to run, with the notes the read-back and
// the inventory need.
type compiledOps struct {
	programs []program
	servers  []serverRef
	backends []string

	maps, backendsTouched, certs, caFiles []string
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
	c := &compiledOps{servers: servers, backends: backends}
	term := run.rt.terminator()
	for i := range inline {
		p, err := compileOp(&inline[i], content, term)
		if err != nil {
			return nil, err
		}
		c.programs = append(c.programs, p)
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
// ran on and whether any line reached it. A batch of deletes alone sends
// no line, so the worker is checked on its own. A worker other than the
// expected one is adopted (which invalidates the baseline) and reported as
// errWorkerMoved, and so is a worker a concurrent verified read adopted
// while the ops ran.
func (run *applyRun) execute(programs []program) (HAProxyInfo, []OpResult, bool, error) {
	expected := run.led.state().Worker
	if len(programs) == 0 {
		observed, err := run.worker.check(run.ctx)
		if err != nil {
			err = fmt.Errorf("%w: %w", errWorkerMoved, err)
		}
		return observed, nil, false, err
	}
	var results []OpResult
	for start := 0; start < len(programs); start += MaxOpsPerApply {
		chunk := programs[start:min(start+MaxOpsPerApply, len(programs))]
		res, observed, err := run.rt.executeAs(run.ctx, chunk, &expected)
		if errors.Is(err, errWorkerMoved) {
			run.worker.adopt(run.ctx, observed)
			return observed, results, true, err
		}
		results = append(results, res...)
		if err != nil {
			return observed, results, true, err
		}
	}
	if now := run.led.state().Worker; !now.SameWorker(expected) {
		return now, results, true, fmt.Errorf("%w: %w", errWorkerMoved, workerChangedError(expected, now))
	}
	return expected, results, true, nil
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

// reload reloads now, or schedules the reload when the pacing window is
// open. Only for the reason "mode" do in-place ops run too: a fallback
// reload has no valid in-place subset.
func (run *applyRun) reload(reason string, o outcome) outcome {
	run.reason = reason
	due := run.led.pacingDue(run.reloadIntervalMin)
	open := run.now().Before(due) && !run.id.revert
	run.logger.Info("reload decided", "plan_id", run.m.PlanID, "reason", reason, "scheduled", open)
	if open {
		o.due = due
		return run.schedule(o, reason == reasonMode)
	}
	info, err := run.reloadDurably(run.ctx)
	run.result.Reload = info
	if err != nil {
		// A reload HAProxy refused did nothing; one without a verdict may
		// still take effect.
		o.reloaded = reloadWithoutVerdict(err)
		run.refused = errors.Is(err, errReloadRejected) && !o.opsRan
		return run.abort(StageReload, err, o)
	}
	// The new worker loaded the whole set: what invalidated the baseline
	// before it no longer matters.
	run.invalidations0 = run.led.invalidationCount()
	o.ok, o.mode, o.reloaded = true, ResultReload, true
	if run.id.revert {
		run.metrics.rollbacks.inc()
		run.result.Rollback = &RollbackInfo{Performed: true, Reloaded: true}
	}
	return o
}

// schedule answers an apply whose reload waits for the pacer, and runs its
// in-place ops against the worker that keeps serving until then.
func (run *applyRun) schedule(o outcome, inPlace bool) outcome {
	if st := run.led.state(); st.reloadPending() {
		o.due = st.PendingAt // a pending reload is never moved
	}
	run.result.Reload = &ReloadInfo{ScheduledAt: o.due.UTC().Format(time.RFC3339Nano)}
	o.ok, o.mode = true, ResultScheduled
	if inPlace {
		o.inPlace = run.runInPlace()
	}
	run.pokePacer()
	return o
}

// runInPlace runs the in-place ops in a single execution. Any failure
// invalidates the baseline; the apply stays OK and never triggers a second
// reload.
func (run *applyRun) runInPlace() bool {
	m := run.m
	if len(m.InPlaceOps) == 0 {
		return false
	}
	fail := func(err error) bool {
		run.result.Error = &ApplyError{Stage: StageInPlace, Message: err.Error()}
		run.led.invalidate()
		run.logger.Warn("in-place ops failed; the baseline is invalidated", "plan_id", m.PlanID, "err", err)
		return false
	}
	if st := run.led.state(); !samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, st.WorkerOps) {
		return fail(errors.New(msgInPlaceStale))
	}
	c, err := run.compile(m.InPlaceOps, run.files.readHeld)
	if err != nil {
		run.invariant(errors.Is(err, errVersionLimit), invOpsExecutable)
		return fail(err)
	}
	worker, results, _, err := run.execute(c.programs)
	run.result.OpResults = append(run.result.OpResults, results...)
	if err == nil {
		err = run.enqueueDeletes(worker, c)
	} else if !errors.Is(err, errWorkerMoved) {
		run.metrics.opErrors.inc(firstFailedKind(results))
	}
	if err != nil {
		return fail(err)
	}
	run.led.foldCreated(c.certs, c.caFiles)
	return true
}

// ---------------------------------------------------------------------------
// Failure.

// abort ends a failed run: the result becomes a NACK, the tree is put back
// as this apply found it, and where the worker may hold what the apply
// undid (its ops ran, its reload took effect or may have), the worker
// reloads the restored tree; only if HAProxy refuses that tree too does the
// agent restore and reload the last-known-good set. The record that says
// the apply is undone is durable before any file moves, so that a crash
// in between finishes the undo instead of redoing the apply.
//
// Where the disk refuses that record, an apply whose own record counts at
// the next start (one answered at its durable point, that then fell back)
// may come back: it is not answered as refused but as of unknown outcome
// (unknown). Where the disk is read-only, nothing is reloaded (HAProxy's
// master cannot even keep its socket in a read-only directory, and exits):
// what could not be put back or reloaded is owed, and done once the disk
// takes writes again.
func (run *applyRun) abort(stage string, cause error, o outcome) outcome {
	run.metrics.applyRejected.inc(stage)
	run.metrics.rollbacks.inc()
	r := &run.result
	r.OK, r.Mode = false, ResultRejected
	r.Error = &ApplyError{Stage: stage, Message: cause.Error()}
	r.Rollback = &RollbackInfo{Performed: o.undone}
	run.logger.Warn("apply failed; putting back what it changed", "plan_id", run.m.PlanID, "stage", stage, "err", cause)
	touched := o.opsRan || o.reloaded
	readOnly := errors.Is(cause, syscall.EROFS)
	if run.seq != 0 {
		err := run.led.endApply(ending{seq: run.seq, sync: true, undo: undoOf(run.changes)}, func(s *agentState) {
			*s = settle(*s, run.before, run.id, o, run.now())
			s.ReloadOwed = touched
		})
		run.seq = 0
		if err != nil {
			run.logger.Error("the failed apply could not be recorded; putting its files back anyway", "err", err)
			readOnly = readOnly || errors.Is(err, syscall.EROFS)
			if !run.open {
				run.unknown = err
			}
		}
	}
	var owed *owedTree
	if o.installed {
		wants, sources := wantsOf(run.changes, true), sourcesOf(run.changes)
		err := run.restore(wants, sources)
		o.undone = err == nil
		r.Rollback.Performed = o.undone
		if err != nil && run.files.restorable(wants, sources) {
			readOnly = readOnly || errors.Is(err, syscall.EROFS)
			owed = &owedTree{wants: wants, sources: sources, err: err}
		}
	}
	switch {
	case touched && readOnly:
		owed = cmp.Or(owed, &owedTree{err: cause})
		owed.reload = true
	case touched:
		o = run.recover(o)
		r.Rollback.Reloaded = o.recovered || o.lkgRestored
	}
	if owed != nil {
		run.owe(owed)
	}
	return o
}

// restore puts paths back as wants says, from sources, and logs what it
// could not put back.
func (run *applyRun) restore(wants []want, sources map[FileAt][]source) error {
	_, err := run.files.restore(wants, sources)
	if err != nil {
		run.logger.Error("putting files back failed", "plan_id", run.m.PlanID, "err", err)
	}
	return err
}

// recover reloads the restored tree, once the worker may hold what the
// undo took away; if HAProxy refuses it, the last-known-good set is
// restored and reloaded. A reload without a verdict is tried again by the
// pacer, a bounded number of times.
func (run *applyRun) recover(o outcome) outcome {
	if _, err := run.worker.reloadToRecover(run.ctx); err == nil {
		o.recovered = true
	} else if errors.Is(err, errReloadRejected) && o.undone {
		run.logger.Error("HAProxy refused the restored tree too; restoring the last-known-good set", "plan_id", run.m.PlanID, "err", err)
		st := run.led.state()
		lkg := run.restore(wantsOf(journalChanges(st.Journal), false), journalSources(st.Journal)) == nil
		if _, err := run.worker.reloadToRecover(run.ctx); lkg && err == nil {
			o.lkgRestored = true
			run.led.commit(&logRecord{ResetJournal: true}, false, func(s *agentState) {})
		}
	}
	if !o.recovered && !o.lkgRestored {
		run.invariant(false, invRecoveryReload)
		run.logger.Error("the recovery reload failed; the running plan is unknown", "plan_id", run.m.PlanID)
		run.scheduleRepair()
	}
	return o
}

// scheduleRepair asks the pacer to reload the tree once more after a
// recovery reload that got no verdict: a master still busy with a slow
// reload may be serving the set the undo took away, and the agent keeps
// trying, a bounded number of times, until it serves the restored one.
func (run *applyRun) scheduleRepair() {
	st := run.led.state()
	if !st.Applied.complete() || run.ctx.Err() != nil {
		return
	}
	if !run.led.takeRepair() {
		run.logger.Error("the restored tree could not be reloaded; a new apply must reload it", "attempts", maxRepairReloads)
		return
	}
	run.led.forget(func(s *agentState) {
		s.Pending, s.PendingAt = s.Applied, run.now().Add(run.worker.reloadTimeout)
	})
	run.pokePacer()
}

// wantsOf is what each change's path must hold: its new bytes, or with old
// the bytes it held before.
func wantsOf(changes []fileChange, old bool) []want {
	out := make([]want, len(changes))
	for i, c := range changes {
		out[i] = want{Path: c.Path, At: c.New}
		if old {
			out[i].At = c.Old
		}
	}
	return out
}

// undoOf is how each changed path looked before the apply and where those
// bytes are kept, without the new bytes.
func undoOf(changes []fileChange) []fileChange {
	var out []fileChange
	for _, c := range changes {
		if c.Undo != "" {
			out = append(out, fileChange{Path: c.Path, Old: c.Old, Undo: c.Undo})
		}
	}
	return out
}

// sourcesOf is every place the changes name bytes in.
func sourcesOf(changes []fileChange) map[FileAt][]source {
	out := map[FileAt][]source{}
	addChangeSources(out, changes)
	return out
}

func journalChanges(j []journalEntry) []fileChange {
	out := make([]fileChange, len(j))
	for i, e := range j {
		out[i] = fileChange{Path: e.Path, New: e.At}
	}
	return out
}

func journalSources(j []journalEntry) map[FileAt][]source {
	out := map[FileAt][]source{}
	for _, e := range j {
		if e.At != nil {
			key := FileAt{Digest: e.At.Digest, Size: e.At.Size}
			out[key] = append(out[key], source{path: e.Backup})
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// The end.

// finish closes the run with its end record, which lands the apply's tree
// and the state its outcome makes (settle), fills the answer from that
// state, counts it and checks the invariants. The record is synced where
// the apply reloaded: that is when an open apply starts to count. A run
// whose undo already wrote its end record only records its final state.
func (run *applyRun) finish(s steps, o outcome) {
	finishStart := run.now()
	if o.overtaken = run.led.invalidationCount() != run.invalidations0; o.overtaken && o.ok {
		run.logger.Warn("the apply was overtaken by an invalidation; its plan is not recorded as applied", "plan_id", run.m.PlanID)
	}
	run.result.Mode = cmp.Or(o.mode, run.result.Mode)
	run.result.Timing = run.timing
	run.result.Timing.FinishMs = run.msSince(finishStart)
	run.result.Timing.TotalMs = run.msSince(run.start)
	o.result = run.result
	prev := run.before.Generation
	change := func(st *agentState) { *st = settle(*st, run.before, run.id, o, run.now()) }
	var err error
	switch {
	case o.ok:
		delta := map[string]*FileAt{}
		for _, c := range append(slices.Clip(run.changes), run.same...) {
			delta[c.Path] = c.New
		}
		reset := o.reloaded && run.id.ref.complete()
		var journal []journalEntry
		if !reset {
			journal = journalAdditions(run.before.Journal, run.id.undo)
		}
		err = run.led.endApply(ending{seq: run.seq, ok: true, sync: o.reloaded || s.open, landed: delta, journal: journal,
			resetJournal: reset, plan: run.plan}, change)
	case run.seq != 0:
		err = run.led.endApply(ending{seq: run.seq, sync: true}, change)
	default:
		run.led.forget(change)
	}
	if err != nil {
		run.logger.Error("the end of the apply could not be recorded", "plan_id", run.m.PlanID, "err", err)
	}
	// The answer is last_apply exactly, timing included: a controller that
	// lost the answer reads it there.
	run.led.fillResult(&run.result)
	run.metrics.applyTotal.inc(run.result.Mode)
	st, tree := run.led.view()
	run.metrics.generation.set(st.Generation)
	for _, name := range failedInvariants(&run.result, run.m, prev, &st, tree) {
		run.invariant(false, name)
	}
}

// journalAdditions are the entries of undo for paths journal lacks.
func journalAdditions(journal, undo []journalEntry) []journalEntry {
	var out []journalEntry
	for _, e := range undo {
		if !slices.ContainsFunc(journal, func(j journalEntry) bool { return j.Path == e.Path }) {
			out = append(out, e)
		}
	}
	return out
}

// compactIfDue writes a new snapshot once the log is long, a write failed,
// or old versions linked aside take too much room. The files its records
// could redo are made durable first, and the links no record will need any
// more go once the snapshot is. A compaction that fails is retried every
// owedRetryInterval, and the agent is not ready meanwhile.
func (d *applyDeps) compactIfDue() {
	if d.led.compactDue() || d.files.linkedBytes() > maxLinkedBytes {
		if d.compact() != nil {
			d.retry()
		}
	}
}

// compact makes the tree durable and rewrites the state as a snapshot. It
// is refused while files are owed: the records are what can still rebuild
// them, so they are paid first.
func (d *applyDeps) compact() error {
	if d.owed != nil && len(d.owed.wants) > 0 {
		return fmt.Errorf("the tree is not what the log can redo yet: %w", d.owed.err)
	}
	err := d.files.flush()
	if err != nil {
		d.logger.Warn("could not compact the agent's state: the tree is not durable", "err", err)
	} else {
		err = d.led.compact()
	}
	if d.led.stuck(err); err != nil {
		return err
	}
	st := d.led.state()
	keep := map[string]bool{}
	for _, e := range append(st.Journal, st.PendingUndo...) {
		keep[e.Backup] = true
	}
	if err := d.files.sweep(keep); err != nil {
		d.logger.Warn("could not sweep the agent's links", "err", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Invariants.

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
			check(treeHoldsExactly(tree, m.Files), invDiskIsTheDesiredSet)
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
