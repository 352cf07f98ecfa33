// This file owns what happens to an apply after its answer, or between
// applies: the pacer that fires a scheduled reload once the pacing window
// has passed, and the background read-back that checks HAProxy holds what
// a runtime apply meant and repairs a divergence with a reload. Both take
// the apply lock before touching files or HAProxy, so they never
// interleave with an apply, and both end the way an apply does: in the
// run's commit or abort.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

const pacerInterval = 100 * time.Millisecond

// pacer fires scheduled reloads.
type pacer struct {
	deps  *applyDeps
	ready func() bool
	wake  chan struct{}
}

func newPacer(deps *applyDeps, ready func() bool) *pacer {
	return &pacer{deps: deps, ready: ready, wake: make(chan struct{}, 1)}
}

// poke wakes the pacer at once.
func (p *pacer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run wakes every 100 ms, or at once when poked, until ctx ends.
func (p *pacer) run(ctx context.Context) {
	t := time.NewTicker(pacerInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.wake:
		}
		p.fire(ctx)
	}
}

// fire performs the pending reload once it is due. It never runs before
// initialisation: rolling the tree back before HAProxy is up would be
// guessing. The generation does not change; the controller learns the
// verdict from last_apply.
//
// Nor does it run once ctx has ended: run's select may pick the ticker
// over ctx.Done(), and a reload attempted during shutdown fails on the
// cancelled context, whose abort would roll back files an apply had
// accepted; the pending reload survives the restart instead. The check is
// repeated once the apply lock is held, since shutdown may begin while an
// apply holds it.
func (p *pacer) fire(ctx context.Context) {
	d := p.deps
	if !p.ready() || ctx.Err() != nil {
		return
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	ref, due := d.led.pending()
	if !ref.complete() || due.IsZero() || d.now().Before(due) {
		return
	}
	run := newApplyRun(d, ctx, &Manifest{PlanID: ref.ID, Mode: ModeReload})
	run.appliedProof = ref.Proof
	run.reason = reasonScheduled
	run.before = d.led.view()
	run.beforeTree = d.led.treeCopy()
	run.invalidations0 = d.led.invalidationCount()
	run.result = ApplyResult{PlanID: ref.ID, OK: true, Mode: ResultReload, At: d.now().UTC().Format(time.RFC3339)}
	info, err := d.worker.reload(ctx, ref)
	run.result.Reload = info
	if err != nil && ctx.Err() != nil && !errors.Is(err, errReloadRejected) {
		// Shutdown cut the reload short, so there is no verdict to act on
		// (as for the read-back): the accepted files stay, and the pending
		// reload stays for the next start. Only HAProxy's own refusal still
		// rolls back, so that a configuration it rejected is not left for
		// the next start.
		d.led.schedule(ref, due)
		d.logger.Warn("the scheduled reload was cut short by shutdown; the accepted files stay", "plan_id", ref.ID, "err", err)
		return
	}
	if err != nil {
		d.logger.Warn("the scheduled reload failed", "plan_id", ref.ID, "err", err)
		run.refused = errors.Is(err, errReloadRejected)
		run.reloadUnknown = reloadWithoutVerdict(err)
		run.abort(StageScheduledReload, err)
	}
	run.timing.OpsMs = d.msSince(run.start)
	o := run.outcome()
	o.scheduled = true
	if err := d.led.finishRun(o, run.restored); err != nil {
		d.logger.Error("the scheduled reload could not be recorded", "plan_id", ref.ID, "err", err)
	}
	d.led.fillResult(&run.result)
	d.metrics.applyTotal.inc(run.result.Mode)
	d.logger.Info("scheduled reload", "plan_id", ref.ID, "ok", run.result.OK)
}

// ---------------------------------------------------------------------------
// Read-back.

// readBacks runs the background read-backs: counted, awaited at shutdown,
// and none starts once the agent is stopping.
type readBacks struct {
	deps  *applyDeps
	pacer *pacer
	base  func() context.Context

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

// start checks, in the background, that HAProxy holds what the runtime
// apply of ref meant.
func (b *readBacks) start(c *compiledOps, ref planRef) {
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		b.check(c, ref)
	}()
}

// stop refuses new read-backs and waits for the running ones.
func (b *readBacks) stop() {
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *readBacks) isStopping() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopping
}

// check runs under the apply lock, so no apply rewrites the files it
// compares. It gives no verdict when a later apply or an invalidation moved
// the applied pair, or when the agent is stopping.
func (b *readBacks) check(c *compiledOps, ref planRef) {
	d := b.deps
	if b.isStopping() {
		return
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	if st := d.led.view(); st.applied() != ref {
		return
	}
	ctx := b.base()
	err := divergence(ctx, d.rt, d.files, c)
	if err == nil || ctx.Err() != nil {
		return
	}
	d.metrics.mapDivergence.inc()
	d.logger.Warn("the running worker diverges from the applied plan; repairing with a reload", "plan_id", ref.ID, "err", err)
	due := d.led.pacingDue(d.reloadIntervalMin)
	if d.now().Before(due) {
		if _, err := d.led.schedule(ref, due); err == nil {
			b.pacer.poke()
		}
		return
	}
	if _, err := d.worker.reload(ctx, ref); err != nil {
		d.logger.Error("the repair reload failed; the baseline is invalidated", "err", err)
		d.led.invalidate()
	}
	// The reload cleared the journal; that is durable before the backups go.
	d.led.save()
}

// divergence compares what the worker holds with what the batch touched:
// every touched backend must still answer, and every touched map's keys
// must match the map file on disk. A map too big to list is unverified,
// not diverged.
func divergence(ctx context.Context, rt *haproxyRuntime, files *fileStore, c *compiledOps) error {
	for _, be := range c.backendsTouched {
		if c.deleting[be] {
			continue
		}
		if _, err := rt.serverNames(ctx, be); err != nil {
			return fmt.Errorf("backend %s: %w", be, err)
		}
	}
	for _, path := range c.maps {
		running, err := rt.mapEntries(ctx, path)
		if errors.Is(err, errTooManyEntries) {
			continue
		}
		if err != nil {
			return fmt.Errorf("map %s: %w", path, err)
		}
		content, err := files.readHeld(path)
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
