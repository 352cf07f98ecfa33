// This file owns what the agent owes its state between applies: files of an
// acknowledged apply the disk refused, what recovery could not put back at
// start, the reload HAProxy must then do, and the compaction
// (agent_compact.go) a broken or stuck log is due. Every apply pays what is
// owed first, and so does a loop every owedRetryInterval; while anything is
// owed the agent is not ready and says why.
//
// It never drops what an owed ACK still needs: no compaction (which empties
// the log the owed files are rebuilt from) runs until they are in place.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// owedTree is what the disk owes the tree the ledger records: the files of
// an answered apply whose install failed, or what recovery could not put
// back at start.
type owedTree struct {
	restoreSet
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
		d.owed = &owedTree{restoreSet: restoreSet{sources: map[FileAt][]source{}}}
	}
	for key, list := range t.sources {
		d.owed.sources[key] = append(d.owed.sources[key], list...)
	}
	d.owed.wants = append(d.owed.wants, t.wants...)
	d.owed.reload = d.owed.reload || t.reload
	d.owed.err = t.err
	d.led.fallBehind(t.err)
	d.retryOwed()
}

// payOwed does, under the apply lock, what the disk owes: the owed tree,
// then a new snapshot, which mends a broken log and proves the disk takes
// writes again, and only then the reload HAProxy owes, so that nothing
// reloads onto a tree the agent cannot write. Every apply and upload calls
// it before it reads the tree, and so does the retry loop. It returns the
// error that still stands.
func (d *applyDeps) payOwed(ctx context.Context) error {
	if d.owed == nil && !d.led.mustCompact() {
		return nil
	}
	var err error
	if d.owed != nil {
		if _, err = d.files.putBack(d.owed.restoreSet); err == nil {
			d.owed.wants = nil
		}
	}
	if err == nil {
		err = d.compact()
	}
	if err != nil {
		switch broken, _, _ := d.led.faults(); {
		case d.owed != nil:
			d.owed.err = err
			d.led.fallBehind(err)
			return fmt.Errorf("%s: %w", msgDiskBehind, err)
		case broken != nil:
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
		d.logger.Info("the tree is what the agent's state says again")
	}
	return nil
}

// retryOwed starts, unless it runs, the loop that pays what the disk owes
// every owedRetryInterval until it is paid or the agent stops. The caller
// holds the apply lock.
func (d *applyDeps) retryOwed() {
	if d.retrying {
		return
	}
	d.retrying = true
	ctx, paid := context.WithCancel(d.ctx)
	go every(ctx, owedRetryInterval, nil, func() {
		d.applyMu.Lock()
		defer d.applyMu.Unlock()
		if d.payOwed(ctx) == nil {
			d.retrying = false
			paid()
			d.compactIfDue() // the reload HAProxy owed may have written a record
		}
	})
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
	_, err := d.reloadWorker(ctx)
	if err != nil {
		d.logger.Error("the recovery reload failed; the running plan is unknown", "err", err)
		d.invariant(false, invRecoveryReload)
	}
	d.led.recovered(err == nil)
	return err
}
