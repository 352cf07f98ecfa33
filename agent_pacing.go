// This file owns what happens after an apply's answer, or between applies:
// the pacer that fires a scheduled reload once the pacing window has
// passed, and the background read-back that checks HAProxy holds what a
// runtime apply meant and repairs a divergence with a reload. Both take
// the apply lock before touching files or HAProxy, so they never
// interleave with an apply.
//
// Neither takes back an answered apply on a guess: a scheduled reload that
// HAProxy refuses puts back the tree the pending reload's applies found (their
// answers said the reload was still to come), and one cut short by the
// agent's own shutdown changes nothing.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

const pacerInterval = 100 * time.Millisecond

// every calls f every interval, and at once on each wake (a nil wake
// never fires), until ctx ends: the loop of the pacer, the delete queue,
// the HAProxy watch and the retry of what the disk owes.
func every(ctx context.Context, interval time.Duration, wake <-chan struct{}, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		f()
	}
}

// fireScheduled is the pacer: it performs the pending reload once it is
// due. It never runs before initialisation, nor once ctx has ended
// (checked again under the apply lock, since shutdown may begin while an
// apply holds it): a reload cut short by shutdown has no verdict to act
// on, and the pending reload survives the restart instead. The generation
// does not change; the controller learns the verdict from last_apply.
func (a *Agent) fireScheduled(ctx context.Context) {
	d := a.deps
	if st := d.led.state(); !a.Ready() || ctx.Err() != nil || !st.reloadPending() {
		return // an idle tick takes no lock, so its release compacts nothing: the owed retry paces that
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

// readBacks runs the background read-backs: counted, awaited at shutdown,
// and none starts once the agent is stopping.
type readBacks struct {
	deps *applyDeps

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

// start checks, in the background, that HAProxy holds what the runtime
// apply of ref meant.
func (b *readBacks) start(c *compiledOps, ref planRef) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopping {
		return
	}
	b.wg.Go(func() { b.check(c, ref) })
}

// stop refuses new read-backs and waits for the running ones.
func (b *readBacks) stop() {
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	b.wg.Wait()
}

// maxReadBackBytes bounds the maps a read-back lists: a larger one is
// left unverified, so that no apply makes HAProxy dump hundreds of
// thousands of entries, nor the agent parse them.
const maxReadBackBytes = 1 << 20

// check lists what HAProxy holds without the apply lock, so that the next
// apply does not wait for HAProxy's answer, then takes the lock to compare
// with the files, so that no apply rewrites them meanwhile. It gives no
// verdict when a later apply or an invalidation moved the applied pair (an
// apply that ran while the listing did moved it too), or when the agent is
// stopping.
func (b *readBacks) check(c *compiledOps, ref planRef) {
	d := b.deps
	ctx := d.ctx
	if ctx.Err() != nil { // Run ends its context before it stops the read-backs
		return
	}
	_, tree := d.led.view()
	running, err := listTouched(ctx, d.rt, c, tree)
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	defer d.compactIfDue()
	if d.led.state().Applied != ref || ctx.Err() != nil || d.owed != nil {
		return
	}
	if err == nil {
		err = divergence(d.files, running)
	}
	if err == nil {
		return
	}
	d.metrics.mapDivergence.inc()
	d.logger.Warn("the running worker diverges from the applied plan; repairing with a reload", "plan_id", ref.ID, "err", err)
	if due := d.led.pacingDue(d.reloadIntervalMin); d.now().Before(due) {
		d.led.repairPending(ref, due)
		notify(d.wake)
		return
	}
	if _, err := d.reloadDurably(ctx); err != nil {
		d.logger.Error("the repair reload failed; the baseline is invalidated", "err", err)
		d.led.invalidate()
		return
	}
	if err := d.led.reloadedAs(ref, nil); err != nil {
		d.logger.Error("the repair reload could not be recorded", "plan_id", ref.ID, "err", err)
	}
}

// listTouched reads what the worker holds of what the batch touched: every
// touched backend must still answer, and each touched map no larger than
// maxReadBackBytes is listed. A map too big to list is unverified, not
// diverged.
func listTouched(ctx context.Context, rt *haproxyRuntime, c *compiledOps, tree map[string]FileAt) (map[string]map[string][]string, error) {
	for _, be := range c.backendsTouched {
		if slices.Contains(c.backends, be) { // being deleted
			continue
		}
		if _, err := rt.serverNames(ctx, be); err != nil {
			return nil, fmt.Errorf("backend %s: %w", be, err)
		}
	}
	out := map[string]map[string][]string{}
	for _, path := range c.maps {
		if tree[path].Size > maxReadBackBytes {
			continue
		}
		entries, err := rt.mapEntries(ctx, path)
		switch {
		case errors.Is(err, errTooManyEntries):
			continue
		case err != nil:
			return nil, fmt.Errorf("map %s: %w", path, err)
		}
		out[path] = entries
	}
	return out, nil
}

// divergence compares each listed map's keys with its file on disk.
func divergence(files *fileStore, running map[string]map[string][]string) error {
	for path, entries := range running {
		content, err := files.readHeld(path)
		if err != nil {
			return fmt.Errorf("map %s: %w", path, err)
		}
		if !sameMapKeys(entries, ParseMapEntries(string(content))) {
			return fmt.Errorf("map %s: the running entries differ from the file", path)
		}
	}
	return nil
}

// sameMapKeys compares the key sets and the entry counts: a key the worker
// holds that the file lacks is a divergence as much as a missing one.
func sameMapKeys(running map[string][]string, desired []MapEntry) bool {
	n, keys := 0, map[string]bool{}
	for _, values := range running {
		n += len(values)
	}
	for _, e := range desired {
		if _, ok := running[e.Key]; !ok {
			return false
		}
		keys[e.Key] = true
	}
	return n == len(desired) && len(keys) == len(running)
}
