// This file owns compaction: the state rewritten as a snapshot and the log
// emptied once it is long, a write failed, or links aside take too much
// room, then the links no record needs swept. It needs both the file store
// (the tree made durable first) and the ledger, so it is in neither.
//
// It never compacts while files are owed (the records still rebuild them),
// and never sweeps a link before the snapshot that frees it is durable.

package haptic

import (
	"fmt"
	"time"
)

// compactIfDue writes a new snapshot once the log is long, a write failed,
// or old versions linked aside take too much room, and keeps the log's
// zeros ahead of its end. A compaction that fails is retried every
// owedRetryInterval, and the agent is not ready meanwhile.
func (d *applyDeps) compactIfDue() {
	if (d.led.compactDue() || d.files.linkedBytes() > maxLinkedBytes) && d.compact() != nil {
		d.retryOwed()
	}
	d.led.keepLogAhead()
}

// compact makes the tree durable, rewrites the state as a snapshot, and
// only then sweeps the links no record will need any more. It is refused
// while files are owed: the records still rebuild them.
func (d *applyDeps) compact() error {
	if d.owed != nil && len(d.owed.wants) > 0 {
		return fmt.Errorf("the tree is not what the log can redo yet: %w", d.owed.err)
	}
	err := d.files.flush()
	if err == nil {
		err = d.led.compact()
	}
	// Logged when a run of failures starts and ends: once 9,900 lines in 100 s.
	switch {
	case err != nil && d.compactFailures == 0:
		d.logger.Error("could not compact the agent's state; retrying, logged again once it works", "err", err)
		d.compactFailingSince = d.now()
	case err == nil && d.compactFailures > 0:
		d.logger.Info("the agent's state compacts again", "failed_compactions", d.compactFailures,
			"failing_for", d.now().Sub(d.compactFailingSince).Round(time.Millisecond).String())
	}
	if d.compactFailures++; err == nil {
		d.compactFailures = 0
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
