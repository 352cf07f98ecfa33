// This file owns the background read-back after a runtime apply: what
// HAProxy holds of what the ops touched, compared with the files, and a
// divergence repaired by a reload of the applied plan.
//
// It never holds the apply lock while HAProxy lists (the next apply would
// wait), never compares without it (an apply could rewrite the files), and
// gives no verdict once a later apply moved the applied pair or the agent
// is stopping.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

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
