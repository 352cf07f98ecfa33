// This file owns the pacer: the loop that fires a reload an apply
// scheduled (or a repair asked for) once the pacing window has passed, and
// what a refused scheduled reload puts back. It takes the apply lock before
// it touches files or HAProxy, so it never interleaves with an apply.
//
// It never takes back an answer on a guess: a `scheduled` answer said the
// reload was still to come and its verdict would come in last_apply, so a
// reload HAProxy refuses (or gives no verdict on) puts back the tree the
// pending reload's applies found, and one cut short by the agent's own
// shutdown changes nothing.

package haptic

import (
	"context"
	"errors"
	"time"
)

const pacerInterval = 100 * time.Millisecond

// fireScheduled is the pacer: it performs the pending reload once it is
// due. It never runs before initialisation, nor once ctx has ended
// (checked again under the apply lock, since shutdown may begin while an
// apply holds it): a reload cut short by shutdown has no verdict to act
// on, and the pending reload survives the restart instead. The generation
// does not change; the controller learns the verdict from last_apply.
func (a *Agent) fireScheduled(ctx context.Context) {
	d := a.deps
	if st := d.led.state(); !a.Ready() || ctx.Err() != nil || !st.reloadPending() {
		return // an idle tick takes no lock and writes nothing
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	defer d.compactIfDue()
	st := d.led.state()
	if ctx.Err() != nil || !st.Pending.complete() || !st.reloadPending() || d.now().Before(st.PendingAt) {
		return
	}
	if d.payOwed(ctx) != nil {
		return // HAProxy would load a tree that is not the one the state names
	}
	ref, start := st.Pending, d.now()
	info, err := d.reloadDurably(ctx)
	result := ApplyResult{PlanID: ref.ID, OK: true, Mode: ResultReload, At: start.UTC().Format(time.RFC3339), Reload: info}
	result.Timing.OpsMs = d.msSince(start)
	if err != nil && ctx.Err() != nil && !errors.Is(err, errReloadRejected) {
		d.logger.Warn("the scheduled reload was cut short by shutdown; the accepted files stay", "plan_id", ref.ID, "err", err)
		return
	}
	if err == nil {
		result.Timing.TotalMs = d.msSince(start)
		if err := d.led.reloadedAs(ref, cloneResult(&result)); err != nil {
			d.logger.Error("the scheduled reload could not be recorded", "plan_id", ref.ID, "err", err)
		}
	} else {
		result = d.undoPending(ctx, st, result, err)
	}
	d.led.fillResult(&result)
	d.metrics.applyTotal.inc(result.Mode)
	d.logger.Info("scheduled reload", "plan_id", ref.ID, "ok", result.OK)
}

// undoPending ends a scheduled reload that failed: the tree goes back to
// how the pending reload's applies found it, and the applied pair to the
// one before them. HAProxy's refusal left the previous worker serving; a
// reload without a verdict may still take effect, so the worker reloads the
// restored tree.
func (d *applyDeps) undoPending(ctx context.Context, st agentState, result ApplyResult, cause error) ApplyResult {
	d.logger.Warn("the scheduled reload failed; putting back the tree its applies found", "plan_id", st.Pending.ID, "err", cause)
	d.metrics.applyRejected.inc(StageScheduledReload)
	d.metrics.rollbacks.inc()
	result.OK, result.Mode = false, ResultRejected
	result.Error = &ApplyError{Stage: StageScheduledReload, Message: cause.Error()}
	_, err := d.files.putBack(journalSet(st.PendingUndo))
	result.Rollback = &RollbackInfo{Performed: err == nil}
	if err != nil {
		d.logger.Error("putting back the scheduled reload's files failed", "err", err)
	}
	if reloadWithoutVerdict(cause) {
		_, rerr := d.reloadToRecover(ctx)
		result.Rollback.Reloaded = rerr == nil
		d.invariant(rerr == nil, invRecoveryReload) // the worker may serve the set the undo took away
	}
	tree := map[string]*FileAt{}
	for _, e := range st.PendingUndo {
		tree[e.Path] = e.At
	}
	if err := d.led.scheduledRefused(st, tree, err == nil, reloadWithoutVerdict(cause), result, d.now()); err != nil {
		d.logger.Error("the failed scheduled reload could not be recorded", "plan_id", st.Pending.ID, "err", err)
	}
	return result
}
