// This file owns what happens to an apply after its answer, or between
// applies (agent.md §9.20, §9.22, §9.23): the pacing window and the pending
// reload, the pacer that fires it, and the background read-back that checks
// HAProxy holds what a runtime apply meant and repairs a divergence with a
// reload. Everything here takes the apply lock before touching files or
// HAProxy, so it never interleaves with an apply.
package haptic

import (
	"context"
	"errors"
	"fmt"
	"time"
)

const pacerInterval = 100 * time.Millisecond

// schedulePendingReloadLocked queues a reload of ref for due and wakes the
// pacer. Callers hold the apply lock and a.mu.
func (a *Agent) schedulePendingReloadLocked(due time.Time, ref planRef) {
	a.st.ReloadPendingAt = due
	a.st.PendingReloadPlanID, a.st.PendingReloadPlanProof = ref.ID, ref.Proof
	a.saveLocked()
	a.wakePacer()
}

// coalesceIntoPendingReload re-points the pending reload at ref. The due
// time never moves and the reload is never cancelled.
func (a *Agent) coalesceIntoPendingReload(ref planRef) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.PendingReloadPlanID, a.st.PendingReloadPlanProof = ref.ID, ref.Proof
	a.saveLocked()
	return a.st.ReloadPendingAt
}

// clearPendingLocked forgets the pending reload: any reload attempt consumes
// it, and an abort rolls back the files it would load.
func (a *Agent) clearPendingLocked() {
	a.st.ReloadPendingAt = time.Time{}
	a.st.PendingReloadPlanID, a.st.PendingReloadPlanProof = "", ""
}

func (a *Agent) wakePacer() {
	select {
	case a.pacerWake <- struct{}{}:
	default:
	}
}

// runPacer wakes every 100 ms, or at once when woken, until ctx ends.
func (a *Agent) runPacer(ctx context.Context) {
	t := time.NewTicker(pacerInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.pacerWake:
		}
		a.firePendingReload(ctx)
	}
}

// firePendingReload performs the pending reload once it is due. It never
// runs before initialisation: rolling the tree back before HAProxy is up
// would be guessing. The generation does not change; the controller learns
// the verdict from last_apply.
//
// Nor does it run once ctx has ended: runPacer's select may pick the ticker
// over ctx.Done(), and a reload attempted during shutdown fails on the
// cancelled context, whose abort would roll back files an apply had
// accepted. A pending reload does not survive a restart anyway (agent.md
// §4.3). The check is repeated once the apply lock is held, since shutdown
// may begin while an apply holds it.
func (a *Agent) firePendingReload(ctx context.Context) {
	if !a.Ready() || ctx.Err() != nil {
		return
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	a.mu.Lock()
	ref, due := a.st.pending(), a.st.ReloadPendingAt
	a.mu.Unlock()
	if ref.ID == "" || ref.Proof == "" || due.IsZero() || a.now().Before(due) {
		return
	}
	run := &applyRun{
		m:      &Manifest{PlanID: ref.ID, Mode: ModeReload},
		start:  a.now(),
		result: ApplyResult{PlanID: ref.ID, OK: true, Mode: ResultReload, At: a.now().UTC().Format(time.RFC3339)},
		reason: "scheduled",
	}
	info, err := a.performReload(ctx, ref)
	run.result.Reload = info
	if err != nil && ctx.Err() != nil && !errors.Is(err, errReloadRejected) {
		// Shutdown cut the reload short, so there is no verdict to act on
		// (as for the read-back, §9.23): the accepted files stay, and the
		// next process starts with an unknown baseline and reloads. Only
		// HAProxy's own refusal still rolls back, so that a configuration
		// it rejected is not left for the next start.
		a.logger.Warn("the scheduled reload was cut short by shutdown; the accepted files stay", "plan_id", ref.ID, "err", err)
		return
	}
	if err != nil {
		a.logger.Warn("the scheduled reload failed", "plan_id", ref.ID, "err", err)
		a.abort(ctx, run, StageScheduledReload, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !run.result.OK {
		a.st.setApplied(planRef{})
	}
	// abort left the phase "aborted"; a failed pacer reload is complete
	// once its result is recorded, as finish does for an apply. A persisted
	// "aborted" would make the next start run a crash recovery (§4.4): a
	// reload and an invalidation for an apply that was not interrupted.
	a.st.Phase, a.st.InFlightPlanID = phaseIdle, ""
	run.result.Timing.OpsMs = a.msSince(run.start)
	run.result.Timing.TotalMs = run.result.Timing.OpsMs
	a.applyResultLocked(&run.result)
	last := cloneResult(run.result)
	a.st.LastApply = &last
	a.saveLocked()
	a.metrics.applyTotal.inc(run.result.Mode)
	a.logger.Info("scheduled reload", "plan_id", ref.ID, "ok", run.result.OK)
}

// startReadBack checks, in the background, that HAProxy holds what the
// runtime apply of ref meant. Read-backs are counted and awaited at
// shutdown; none starts once the agent is stopping.
func (a *Agent) startReadBack(c *compiledOps, ref planRef) {
	a.bgMu.Lock()
	if a.stopping {
		a.bgMu.Unlock()
		return
	}
	a.readbacks.Add(1)
	a.bgMu.Unlock()
	go func() {
		defer a.readbacks.Done()
		a.readBack(c, ref)
	}()
}

func (a *Agent) isStopping() bool {
	a.bgMu.Lock()
	defer a.bgMu.Unlock()
	return a.stopping
}

// readBack runs under the apply lock, so no apply rewrites the files it
// compares. It gives no verdict when a later apply or an invalidation moved
// the applied pair, or when the agent is stopping.
func (a *Agent) readBack(c *compiledOps, ref planRef) {
	if a.isStopping() {
		return
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.mu.Lock()
	current := a.st.applied()
	a.mu.Unlock()
	if current != ref {
		return
	}
	ctx := a.baseCtx
	err := a.divergence(ctx, c)
	if err == nil || ctx.Err() != nil {
		return
	}
	a.metrics.mapDivergence.inc()
	a.logger.Warn("the running worker diverges from the applied plan; repairing with a reload", "plan_id", ref.ID, "err", err)
	a.mu.Lock()
	due := a.lastReload.Add(a.cfg.ReloadIntervalMin)
	if a.now().Before(due) {
		a.schedulePendingReloadLocked(due, ref)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if _, err := a.performReload(ctx, ref); err != nil {
		a.logger.Error("the repair reload failed; the baseline is invalidated", "err", err)
		a.invalidateBaseline()
	}
	a.save()
}

// divergence compares what the worker holds with what the batch touched:
// every touched backend must still answer, and every touched map's keys
// must match the map file on disk. A map too big to list is unverified,
// not diverged.
func (a *Agent) divergence(ctx context.Context, c *compiledOps) error {
	for _, be := range c.backendsTouched {
		if c.deleting[be] {
			continue
		}
		if _, err := a.rt.serverNames(ctx, be); err != nil {
			return fmt.Errorf("backend %s: %w", be, err)
		}
	}
	for _, path := range c.maps {
		running, err := a.rt.mapEntries(ctx, path)
		if errors.Is(err, errTooManyEntries) {
			continue
		}
		if err != nil {
			return fmt.Errorf("map %s: %w", path, err)
		}
		content, err := a.readHeld(path)
		if err != nil {
			return fmt.Errorf("map %s: %w", path, err)
		}
		desired := ParseMapEntries(string(content))
		if len(desired) > MaxMapEntries {
			continue
		}
		if !sameMapKeys(running, desired) {
			return fmt.Errorf("map %s: the running entries differ from the file", path)
		}
	}
	return nil
}

// sameMapKeys compares key sets only: equal entry counts and every desired
// key present among the running ones.
func sameMapKeys(running map[string][]string, desired []MapEntry) bool {
	n := 0
	for _, values := range running {
		n += len(values)
	}
	if n != len(desired) {
		return false
	}
	for _, e := range desired {
		if _, ok := running[e.Key]; !ok {
			return false
		}
	}
	return true
}
