// This file owns the run of one admitted apply (runApply), step by step:
// each step takes what the one before returned and returns what it did.
//
// It never takes back an answered apply but in one case: a failure puts
// back only what this run changed, and reloads the worker only where this
// run may have changed it; only when HAProxy refuses that restored tree
// too is the last-known-good set loaded (reloadAfterUndo), and with it go
// the applies answered since that set became last-known-good.

package haptic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// applyInput is one admitted apply: what the manifest asks, the parts and
// plan it brought, who it is, and the state, tree and clock it began with.
// The admission builds it under the apply lock; nothing writes it after.
type applyInput struct {
	ctx    context.Context
	m      *Manifest
	plan   *planUpload   // the plan part, checked; nil without one
	staged []*stagedFile // the parts, by path
	id     applyIdentity // the pairs it lands, its token, schema and blob
	before agentState
	tree   map[string]FileAt
	steps  steps
	// invalidations is the ledger's count when the apply began: a higher
	// one at its end means an invalidation overtook it.
	invalidations uint64
	start         time.Time
	timing        ApplyTiming // staging and admission
}

// runApply is one admitted apply, in the order it becomes durable, which
// every recovery rests on: the paths it changes linked aside
// (linkChanges); one record naming the apply (the state it lands, its
// files' new bytes and their undo) begun, the install's bytes written and
// a runtime apply's ops sent while it syncs, and the sync awaited; what
// HAProxy must do (activate); a counted apply's files installed
// (installCounted); and the end record (end). No rename comes before the sync: an install takes the token only
// the awaited sync returns. A runtime, file_only or noop apply counts from
// that sync on; a reload apply is open, and counts only once its end
// record, synced after its reload took effect, closes it. HAProxy's refusal
// ends in fail, which puts back the tree the apply found.
//
// The caller answers with the outcome's result, and only then compacts a
// log the apply made due: the answer never waits for a snapshot. So a
// runtime apply makes one log sync, a reload apply two, and a promotion to
// last-known-good none of its own.
func (d *applyDeps) runApply(in *applyInput) outcome {
	o := outcome{undone: true, since: in.invalidations} // nothing is installed yet
	ch, err := d.linkChanges(in)
	if err != nil {
		return d.end(in, ch, d.fail(in, ch, linkStage(err), err, o))
	}
	passed("linked")
	start := d.now()
	r := in.record(ch, d.now())
	await, err := d.led.beginApply(r)
	if err != nil {
		return d.end(in, ch, d.fail(in, ch, StageBackup, err, o))
	}
	passed("recorded")
	// While the record syncs: the install's bytes, so that only its renames
	// wait for the sync, and then the ops. Bytes that cannot be written (a
	// full disk) refuse the apply before any op reaches HAProxy.
	unwritten := d.files.prepare(in.staged)
	passed("prepared")
	var ops opsOutcome
	if unwritten == nil && in.steps.act == activateOps {
		ops = d.runtimeOps(in, ch)
		passed("ops")
	}
	done, err := await()
	passed("awaited")
	o.opsRan, o.ops, o.write = ops.ran, ops.took, d.now().Sub(start)-ops.took
	if err == nil || errors.Is(err, errRecordKept) {
		o.seq = r.Seq // the record the end or the undo closes
	}
	if err != nil {
		return d.end(in, ch, d.fail(in, ch, StageBackup, err, o))
	}
	if unwritten != nil {
		return d.end(in, ch, d.fail(in, ch, StageWrite, unwritten, o))
	}
	o.undone = false
	o = d.activate(in, ch, done, ops, o)
	if o.ok && !o.installed && len(ch.changes) > 0 {
		o = d.installCounted(in, ch, done, o)
		passed("installed")
	}
	o = d.end(in, ch, o)
	passed("ended")
	return o
}

// ---------------------------------------------------------------------------
// 1. What the apply changes.

// changeSet is what an apply changes: each path with its new bytes (or
// none, deleted) and how it looked before, linked aside where an undo or
// the journal needs it, and the parts whose bytes the disk already held
// (only their proofs change).
type changeSet struct {
	changes []fileChange
	same    []fileChange
	dels    []string
}

// identity is the apply's identity with its undo: how each changed path
// looked before the apply, and where those bytes are kept (the journal's
// additions, the pending reload's undo and the undo of a refusal are made
// of it). Admission leaves id.undo nil, so the input is never appended to.
func (in *applyInput) identity(ch changeSet) applyIdentity {
	id := in.id
	for _, c := range ch.changes {
		id.undo = append(id.undo, journalEntry{Path: c.Path, At: c.Old, Backup: c.Undo})
	}
	return id
}

// linkChanges lists what the apply changes and links paths aside: for an
// apply that installs before it activates, every path it changes (HAProxy
// may refuse its files); for one that counts from its record, only what
// must stay reachable whatever happens: a path's bytes on its first change
// since the last-known-good plan (the journal's backup), and the base of a
// patch the record carries as a replacement alone. The links are not
// synced: a power loss keeps metadata in the order it was made, so a rename
// that survives brings the links made before it. It syncs each temp
// directory a large part sits in, so that recovery can still rename it into
// place. A revert's changes are the journal's entries.
func (d *applyDeps) linkChanges(in *applyInput) (changeSet, error) {
	var ch changeSet
	byPath := make(map[string]ManifestFile, len(in.m.Files))
	for _, f := range in.m.Files {
		byPath[f.Path] = f
	}
	var largeDirs []string
	for _, f := range in.staged {
		c := fileChange{Path: f.Rel, New: &FileAt{Digest: f.Digest, Proof: byPath[f.Rel].Proof, Size: f.Size}}
		switch {
		case f.unchanged:
			ch.same = append(ch.same, c)
			continue
		case f.tmp != "":
			c.Temp = f.tmp
			largeDirs = appendUnique(largeDirs, filepath.Dir(f.tmp))
		case f.patch != nil:
			c.Data, c.Patch = f.repl, f.patch
		default:
			c.Data = f.inline
		}
		ch.changes = append(ch.changes, c)
	}
	if in.id.revert {
		for _, e := range in.before.Journal {
			ch.changes = append(ch.changes, fileChange{Path: e.Path, New: e.At})
		}
	} else {
		ch.dels = deletions(in.tree, in.m.Files)
		for _, p := range ch.dels {
			ch.changes = append(ch.changes, fileChange{Path: p})
		}
	}
	if len(ch.changes) > MaxFiles {
		return ch, fmt.Errorf("%d changes exceed the %d-file limit", len(ch.changes), MaxFiles)
	}
	journalled := map[string]bool{}
	for _, e := range in.before.Journal {
		journalled[e.Path] = true
	}
	counted := in.steps.countsFromRecord()
	link := func(c *fileChange) bool { return !counted || !journalled[c.Path] || c.Patch != nil }
	if err := d.files.linkUndo(ch.changes, in.tree, link); err != nil {
		return ch, err
	}
	for _, c := range ch.changes {
		if c.New != nil {
			if err := d.files.onItsMount(c.Path); err != nil {
				return ch, err
			}
		}
	}
	for _, dir := range largeDirs {
		if err := d.files.disk.SyncDir(dir); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// linkStage is where a failure to list or link the changes is reported:
// something in the tree in the way of a file is a write's failure, any
// other the backup's.
func linkStage(err error) string {
	if errors.Is(err, errInvalidPath) {
		return StageWrite
	}
	return StageBackup
}

// ---------------------------------------------------------------------------
// 2. The record.

// record is the apply's record: its files' new bytes and their undo, the
// journal's additions, its plan, and the state it lands if it ends as
// planned. Ops may reach the worker before the apply closes (a runtime
// apply's, or in-place ops), so that a start that reads this record with
// nothing after it reloads.
func (in *applyInput) record(ch changeSet, now time.Time) *logRecord {
	id, s := in.identity(ch), in.steps
	r := &logRecord{Files: append(slices.Clip(ch.changes), ch.same...), Open: s.open, Journal: journalAdditions(in.before.Journal, id.undo)}
	in.plan.carry(r)
	opsMayRun := s.act == activateOps || len(in.m.InPlaceOps) > 0 && (s.act == activateJoin || s.act == activateSchedule)
	landed := landing(in.before, id, s, opsMayRun, now)
	r.State = &landed
	return r
}

// ---------------------------------------------------------------------------
// 3. Activation.

// activate does what the apply's files need from HAProxy, as its steps
// say, and returns how it went.
func (d *applyDeps) activate(in *applyInput, ch changeSet, done synced, ops opsOutcome, o outcome) outcome {
	switch in.steps.act {
	case activateOps:
		return d.judgeOps(in, ch, done, ops, o)
	case activateNothing:
		return noopOrFileOnly(ch, o)
	}
	return d.installThenReload(in, ch, done, in.steps.reason, o)
}

// noopOrFileOnly ends an apply that needs nothing from HAProxy: file_only
// when any part was sent or a path deleted, noop otherwise.
func noopOrFileOnly(ch changeSet, o outcome) outcome {
	o.ok, o.mode = true, ResultNoop
	if len(ch.changes)+len(ch.same) > 0 {
		o.mode = ResultFileOnly
	}
	return o
}

// judgeOps finishes a runtime apply. A batch that could not be compiled,
// was refused, or reached another worker (which is adopted) falls back to
// a reload of the desired set; a good one hands its deletes to the queue.
func (d *applyDeps) judgeOps(in *applyInput, ch changeSet, done synced, ops opsOutcome, o outcome) outcome {
	switch {
	case ops.compileErr != nil:
		// Diff keeps out what the worker's version cannot take; one that
		// arrives anyway is that version's limit, not a broken invariant.
		d.invariant(errors.Is(ops.compileErr, errVersionLimit), invOpsExecutable)
		d.logger.Warn("the runtime ops cannot be compiled; reloading instead", "plan_id", in.m.PlanID, "err", ops.compileErr)
		return d.installThenReload(in, ch, done, reasonUnknownOp, o)
	case ops.c.empty():
		return noopOrFileOnly(ch, o)
	}
	o.opResults = ops.results
	switch {
	case errors.Is(ops.err, errWorkerMoved):
		d.logger.Warn("the ops reached another worker", "err", ops.err)
		return d.installThenReload(in, ch, done, reasonWorkerChanged, o)
	case ops.err != nil:
		d.logger.Warn("HAProxy refused a runtime op; reloading the desired set", "plan_id", in.m.PlanID, "err", ops.err)
		return d.installThenReload(in, ch, done, reasonOpRejected, o)
	}
	if err := d.enqueueDeletes(ops.worker, ops.c); err != nil {
		d.logger.Warn("deferred deletes could not be queued", "err", err)
		return d.installThenReload(in, ch, done, reasonDeferredDeleteCommit, o)
	}
	d.led.foldCreated(ops.c.certs, ops.c.caFiles)
	o.ok, o.mode, o.readBack = true, ResultRuntime, ops.c
	return o
}

// installThenReload installs the apply's files before HAProxy loads them:
// every path it changes is linked aside first (its undo), since HAProxy may
// refuse them. A revert puts the journal's set back instead. Then it
// reloads, or joins the pending reload.
func (d *applyDeps) installThenReload(in *applyInput, ch changeSet, done synced, reason reloadReason, o outcome) outcome {
	start := d.now()
	if err := d.files.linkUndo(ch.changes, in.tree, func(c *fileChange) bool { return c.Undo == "" }); err != nil {
		return d.fail(in, ch, StageBackup, err, o)
	}
	o.installed = len(ch.changes) > 0
	stage, err := StageWrite, error(nil)
	if in.id.revert {
		_, err = d.files.putBack(journalSet(in.before.Journal))
		stage = StageRevert
	} else {
		err = d.files.install(done, in.staged, ch.dels)
	}
	o.write += d.now().Sub(start)
	if err != nil {
		return d.fail(in, ch, stage, err, o)
	}
	if in.steps.act == activateJoin {
		o.due = in.before.PendingAt // a pending reload is never moved
		return d.schedule(in, o, true)
	}
	return d.reload(in, ch, reason, o)
}

// reload reloads now, or schedules the reload when the pacing window is
// open. Only for the reason "mode" do in-place ops run too: a fallback
// reload has no valid in-place subset. The tree is made durable while
// HAProxy loads it: the reloaded set becomes the last-known-good, whose
// files the next apply links into its journal, and a link is only as good
// as the bytes it leads to; the syncs cost nothing beside a reload.
func (d *applyDeps) reload(in *applyInput, ch changeSet, reason reloadReason, o outcome) outcome {
	o.reason = reason
	due := d.led.pacingDue(d.reloadIntervalMin)
	open := d.now().Before(due) && !in.id.revert
	d.logger.Info("reload decided", "plan_id", in.m.PlanID, "reason", reason, "scheduled", open)
	if open {
		o.due = due
		return d.schedule(in, o, reason == reasonMode)
	}
	start := d.now()
	info, err := d.reloadDurably(in.ctx)
	o.ops += d.now().Sub(start)
	o.reloadInfo = info
	if err != nil {
		// A reload HAProxy refused did nothing; one without a verdict may
		// still take effect.
		o.reloaded = reloadWithoutVerdict(err)
		o.refused = errors.Is(err, errReloadRejected) && !o.opsRan
		if in.id.revert {
			return d.fail(in, ch, StageRevertReload, err, o)
		}
		return d.fail(in, ch, StageReload, err, o)
	}
	// The new worker loaded the whole set: what invalidated the baseline
	// before it no longer matters.
	o.since = d.led.invalidationCount()
	o.ok, o.mode, o.reloaded = true, ResultReload, true
	if in.id.revert {
		d.metrics.rollbacks.inc()
		o.rollback = &RollbackInfo{Performed: true, Reloaded: true}
	}
	return o
}

// reloadDurably reloads HAProxy and flushes the tree while it loads it.
func (d *applyDeps) reloadDurably(ctx context.Context) (*ReloadInfo, error) {
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		if err := d.files.flush(); err != nil {
			d.logger.Warn("could not make the tree durable", "err", err) // a later compaction tries again
		}
	}()
	info, err := d.reloadWorker(ctx)
	<-flushed
	return info, err
}

// schedule answers an apply whose reload waits for the pacer, and runs its
// in-place ops against the worker that keeps serving until then.
func (d *applyDeps) schedule(in *applyInput, o outcome, inPlace bool) outcome {
	o.reloadInfo = &ReloadInfo{ScheduledAt: o.due.UTC().Format(time.RFC3339Nano)}
	o.ok, o.mode = true, ResultScheduled
	if inPlace && len(in.m.InPlaceOps) > 0 {
		var results []OpResult
		results, o.err = d.runInPlace(in)
		o.opResults, o.inPlace = append(o.opResults, results...), o.err == nil
	}
	notify(d.wake)
	return o
}

// ---------------------------------------------------------------------------
// 4. The install of a counted apply.

// installCounted installs the files of an apply that counts from its record
// (runtime, file_only, noop), unsynced (recovery redoes them from the
// record), before it is answered: whoever reads the disk after an ACK sees
// them. It is acknowledged whatever happens here, and a failure (a full
// disk, an I/O error, a mount made after the start) never takes it back:
// the disk owes its files, which the record's sources (its inline bytes,
// its synced temp files, a patch's base) can still rebuild, until a retry
// puts them in place; the answer says so.
func (d *applyDeps) installCounted(in *applyInput, ch changeSet, done synced, o outcome) outcome {
	start := d.now()
	err := d.files.install(done, in.staged, ch.dels)
	o.write += d.now().Sub(start)
	if err == nil {
		return o
	}
	d.logger.Error("the files of an acknowledged apply could not be installed; the agent retries, and is not ready until they are in place",
		"plan_id", in.m.PlanID, "err", err)
	d.owe(&owedTree{restoreSet: changesSet(ch.changes, false), err: err})
	o.err, o.keepStaged = &ApplyError{Stage: StageWrite, Message: fmt.Sprintf("%s: %v", msgFilesOwed, err)}, true
	return o
}

// ---------------------------------------------------------------------------
// 5. The end.

// end closes the apply with its end record, which lands the apply's tree
// and the state its outcome makes (stateAfter), fills the answer from that
// state, counts it and checks the invariants. The record is synced where
// the apply reloaded: that is when an open apply starts to count. A failed
// apply's undo wrote its end record already: only its final state is
// recorded.
func (d *applyDeps) end(in *applyInput, ch changeSet, o outcome) outcome {
	start := d.now()
	o.overtaken = d.led.invalidationCount() != o.since
	if o.overtaken && o.ok {
		d.logger.Warn("the apply was overtaken by an invalidation; its plan is not recorded as applied", "plan_id", in.m.PlanID)
	}
	r := ApplyResult{PlanID: in.m.PlanID, OK: o.ok, Mode: o.mode, OpResults: o.opResults, Reload: o.reloadInfo,
		Rollback: o.rollback, Error: o.err, At: in.start.UTC().Format(time.RFC3339), Timing: in.timing}
	r.Timing.WriteMs, r.Timing.OpsMs = o.write.Milliseconds(), o.ops.Milliseconds()
	r.Timing.FinishMs, r.Timing.TotalMs = d.msSince(start), d.msSince(in.start)
	o.result = r
	e := ending{before: in.before, id: in.identity(ch), o: o, now: d.now()}
	if o.ok {
		e.seq, e.sync, e.plan = o.seq, o.reloaded || in.steps.open, in.plan
		e.landed = map[string]*FileAt{}
		for _, c := range append(slices.Clip(ch.changes), ch.same...) {
			e.landed[c.Path] = c.New
		}
		if e.resetJournal = o.reloaded && e.id.ref.complete(); !e.resetJournal {
			e.journal = journalAdditions(in.before.Journal, e.id.undo)
		}
	}
	if err := d.led.ended(e); err != nil {
		d.logger.Error("the end of the apply could not be recorded", "plan_id", in.m.PlanID, "err", err)
	}
	// The answer is last_apply exactly, timing included: a controller that
	// lost the answer reads it there.
	d.led.fillResult(&r)
	d.metrics.applyTotal.inc(r.Mode)
	st, tree := d.led.view()
	for _, name := range failedInvariants(&r, in.m, in.before.Generation, &st, tree) {
		d.invariant(false, name)
	}
	o.result = r
	return o
}

// ---------------------------------------------------------------------------
// Failure.

// fail ends a failed apply: the result becomes a NACK, the tree is put back
// as this apply found it, and where the worker may hold what the apply
// undid (its ops ran, its reload took effect or may have), the worker
// reloads the restored tree; only if HAProxy refuses that tree too does the
// agent restore and reload the last-known-good set. The record that says
// the apply is undone (o.seq names the apply's own, 0 for none) is durable
// before any file moves, so that a crash in between finishes the undo
// instead of redoing the apply.
//
// Where the disk refuses that record, an apply whose own record counts at
// the next start (one that counts from its record, then fell back) may
// come back: it is not answered as refused but as of unknown outcome.
// Where the disk is read-only, nothing is reloaded (HAProxy's master
// cannot even keep its socket in a read-only directory, and exits): what
// could not be put back or reloaded is owed, and done once the disk takes
// writes again.
func (d *applyDeps) fail(in *applyInput, ch changeSet, stage string, cause error, o outcome) outcome {
	d.metrics.applyRejected.inc(stage)
	d.metrics.rollbacks.inc()
	o.ok, o.mode = false, ResultRejected
	o.err = &ApplyError{Stage: stage, Message: cause.Error()}
	d.logger.Warn("apply failed; putting back what it changed", "plan_id", in.m.PlanID, "stage", stage, "err", cause)
	touched := o.opsRan || o.reloaded
	readOnly := errors.Is(cause, syscall.EROFS)
	if o.seq != 0 {
		err := d.led.ended(ending{seq: o.seq, sync: true, undo: undoOf(ch.changes), before: in.before, id: in.identity(ch), o: o,
			now: d.now(), reloadOwed: touched})
		if err != nil {
			d.logger.Error("the failed apply could not be recorded; putting its files back anyway", "err", err)
			readOnly = readOnly || errors.Is(err, syscall.EROFS)
			if !in.steps.open {
				o.unknown = err
			}
		}
	}
	var owed *owedTree
	if o.installed {
		undo := changesSet(ch.changes, true)
		_, err := d.files.putBack(undo)
		if o.undone = err == nil; err != nil {
			d.logger.Error("putting the apply's files back failed", "plan_id", in.m.PlanID, "err", err)
		}
		if err != nil && d.files.restorable(undo) {
			readOnly = readOnly || errors.Is(err, syscall.EROFS)
			owed = &owedTree{restoreSet: undo, err: err}
		}
	}
	o.rollback = &RollbackInfo{Performed: o.undone}
	switch {
	case touched && readOnly:
		owed = cmp.Or(owed, &owedTree{err: cause})
		owed.reload = true
	case touched:
		o = d.reloadAfterUndo(in, o)
		o.rollback.Reloaded = o.recovered || o.lkgRestored
	}
	if owed != nil {
		d.owe(owed)
	}
	return o
}

// reloadAfterUndo reloads the tree the undo put back, once the worker may
// hold what the undo took away; if HAProxy refuses it, the last-known-good
// set is restored and reloaded. A reload without a verdict is tried again by the
// pacer, a bounded number of times: a master still busy with a slow reload
// may be serving the set the undo took away.
func (d *applyDeps) reloadAfterUndo(in *applyInput, o outcome) outcome {
	_, err := d.reloadToRecover(in.ctx)
	if err == nil {
		o.recovered = true
	} else if errors.Is(err, errReloadRejected) && o.undone {
		d.logger.Error("HAProxy refused the restored tree too; restoring the last-known-good set", "plan_id", in.m.PlanID, "err", err)
		_, lost := d.files.putBack(journalSet(d.led.state().Journal))
		if lost != nil {
			d.logger.Error("putting the last-known-good set back failed", "plan_id", in.m.PlanID, "err", lost)
		}
		if _, err := d.reloadToRecover(in.ctx); lost == nil && err == nil {
			o.lkgRestored = true
			if err := d.led.lkgRestored(); err != nil {
				d.logger.Warn("the journal's reset could not be recorded; a start finds it describing the set it holds", "err", err)
			}
		}
	}
	if o.recovered || o.lkgRestored {
		return o
	}
	d.invariant(false, invRecoveryReload)
	d.logger.Error("the recovery reload failed; the running plan is unknown", "plan_id", in.m.PlanID)
	// The plan to reload is the one the apply found, once the undo put its
	// tree back (the undo's record, written first, could not name it).
	switch applied := in.before.Applied; {
	case !o.undone || errors.Is(err, errReloadRejected) || !applied.complete() || in.ctx.Err() != nil: // or the agent stops
	case !d.led.takeRepair():
		d.logger.Error("the restored tree could not be reloaded; a new apply must reload it", "attempts", maxRepairReloads)
	default:
		d.led.repairPending(applied, d.now().Add(d.rt.ReloadTimeout))
		notify(d.wake)
	}
	return o
}

// undoOf is how each changed path looked before the apply and where those
// bytes are kept, without the new bytes: what the record of an undo names.
func undoOf(changes []fileChange) []fileChange {
	var out []fileChange
	for _, c := range changes {
		if c.Undo != "" {
			out = append(out, fileChange{Path: c.Path, Old: c.Old, Undo: c.Undo})
		}
	}
	return out
}
