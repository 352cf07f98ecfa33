// This file owns what the agent knows of the running HAProxy worker:
// checking that the one answering is the one it expects, adopting a new
// one, reloading, and refusing a configuration whose worker the agent
// could not reach. Everything here holds the worker-observation lock
// (workerMu) from observing a worker to adopting it, so that a verified
// state read never adopts a worker in the middle of a reload.
//
// It never changes the tree's files (only the sockets such a worker left
// behind), and never says which plan a worker runs: the apply's outcome
// does (stateAfter).

package haptic

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

const (
	awaitWorkerPoll   = 100 * time.Millisecond
	workerSocketGrace = time.Second // a new worker silent this long on the agent's socket is asked about
	maxStrayDials     = 10          // dials removeStrays waits for a replaced worker to stop listening

	maxRecoveryReloads  = 64                     // attempts of a recovery reload while the master is busy or re-executing
	recoveryReloadPause = 200 * time.Millisecond // between two of them
)

// errNoNewWorker: HAProxy reported the reload done, but no new worker
// answered within the reload timeout.
var errNoNewWorker = errors.New("the new worker did not answer show info after the reload")

// reloadWithoutVerdict reports a reload that HAProxy may still carry out
// although the agent got no verdict: it timed out, HAProxy said it was busy
// with another one, or it reported success without a new worker answering.
// A reload that never reached the master (a transport error) or that
// HAProxy refused did nothing.
func reloadWithoutVerdict(err error) bool {
	return errors.Is(err, errReloadTimeout) || errors.Is(err, errReloadBusy) || errors.Is(err, errNoNewWorker)
}

// keepsWorkerSocket refuses, before anything is installed, a staged
// configuration whose worker would not listen on the agent's worker socket
// (losesWorkerSocket says when that can be told); a revert installs none.
func (d *applyDeps) keepsWorkerSocket(m *Manifest, p *parts) error {
	f := p.staged[d.files.config]
	if f == nil || m.Mode == ModeRevertLKG {
		return nil
	}
	live, err := d.files.disk.Open(f.abs)
	if err != nil {
		return nil // no configuration to learn the deployment's socket from
	}
	defer live.Close()
	staged := io.Reader(bytes.NewReader(f.inline))
	if from := cmp.Or(f.tmp, f.built); from != "" {
		file, err := d.files.disk.Open(from)
		if err != nil {
			return nil
		}
		defer file.Close()
		staged = file
	}
	return losesWorkerSocket(live, staged, d.rt.WorkerSocket)
}

// checkWorker reads the worker's identity and adopts a foreign worker, which
// invalidates the baseline: the new worker loaded whatever was on disk.
func (d *applyDeps) checkWorker(ctx context.Context) (HAProxyInfo, error) {
	d.workerMu.Lock()
	defer d.workerMu.Unlock()
	info, err := d.rt.info(ctx)
	if err != nil {
		return info, err
	}
	return info, d.observedWorkerLocked(ctx, info)
}

// observedWorkerLocked compares a worker identity with the expected one and
// adopts it as foreign when it differs.
func (d *applyDeps) observedWorkerLocked(ctx context.Context, info HAProxyInfo) error {
	prev := d.led.state().Worker
	if prev.SameWorker(info) {
		return nil
	}
	var inv *Inventory
	if _, got, err := d.rt.listWorker(ctx, 0, false); err == nil {
		inv = &got
	} else {
		d.logger.Warn("could not refresh the runtime inventory after adopting a worker", "err", err)
	}
	d.led.adoptWorker(info, inv, true)
	d.queue.setWorker(info)
	err := workerChangedError(prev, info)
	d.logger.Warn("a foreign worker was adopted; the baseline is invalidated", "err", err)
	return err
}

// adoptWorker adopts a worker an exchange found answering instead of the
// expected one.
func (d *applyDeps) adoptWorker(ctx context.Context, info HAProxyInfo) {
	if info.HasWorkerIdentity() {
		d.workerMu.Lock()
		defer d.workerMu.Unlock()
		d.observedWorkerLocked(ctx, info)
	}
}

func workerChangedError(from, to HAProxyInfo) error {
	return fmt.Errorf("worker changed from pid %d (start %d) to pid %d (start %d)",
		from.WorkerPID, from.WorkerStartTimeUnixMicros, to.WorkerPID, to.WorkerStartTimeUnixMicros)
}

// reloadWorker sends the reload through the master and adopts the new worker,
// holding the worker-observation lock throughout. The reload timeout bounds
// the whole of it, but the runtime layer enforces it on the reload itself
// and answers its own timeout verdicts; a context of our own around the
// reload would expire first and turn those verdicts into transport errors
// of varying text. So only the wait for the new worker gets a deadline
// here: what remains of the timeout since the reload began.
func (d *applyDeps) reloadWorker(ctx context.Context) (*ReloadInfo, error) {
	d.workerMu.Lock()
	defer d.workerMu.Unlock()
	prev := d.led.state().Worker
	if d.beforeReload != nil {
		d.beforeReload()
	}
	start := time.Now()
	log, err := d.rt.reload(ctx)
	info := &ReloadInfo{Performed: true, OK: err == nil, Output: log}
	if err != nil {
		info.TookMs = time.Since(start).Milliseconds()
		d.metrics.reloads.inc("failed")
		if errors.Is(err, errReloadRejected) {
			// HAProxy's startup log says why; the error still counts as a
			// refusal, which is deterministic.
			return info, &runtimeError{msg: cmp.Or(log, errReloadRejected.Error()), kind: []error{err}}
		}
		info.Performed = false
		return info, err
	}
	d.metrics.reloads.inc("ok")
	wctx, cancel := context.WithDeadline(ctx, start.Add(d.rt.ReloadTimeout))
	worker, inv, err := d.awaitNewWorker(wctx, prev)
	cancel()
	info.TookMs = time.Since(start).Milliseconds()
	if err != nil {
		info.OK = false
		return info, err
	}
	d.led.adoptWorker(worker, inv, false)
	d.led.reloaded(d.now())
	d.queue.setWorker(worker)
	info.WorkerPID = worker.WorkerPID
	d.removeStrays()
	return info, nil
}

// reloadToRecover reloads after an undo, when the worker may hold what the
// undo took away: ops that ran, or a reload whose outcome is unknown (no
// verdict within the reload timeout: HAProxy may still be loading the set
// the undo took off the disk). A master still busy with that reload answers
// "another reload is in progress", or does not answer while it re-executes,
// so the attempt is repeated until the reload timeout has passed once more.
// Only HAProxy's own refusal ends it early.
func (d *applyDeps) reloadToRecover(ctx context.Context) (info *ReloadInfo, err error) {
	deadline := time.Now().Add(d.rt.ReloadTimeout)
	for range maxRecoveryReloads {
		info, err = d.reloadWorker(ctx)
		if err == nil || errors.Is(err, errReloadRejected) || time.Now().After(deadline) || !pause(ctx, recoveryReloadPause) {
			return info, err
		}
	}
	return info, err
}

// awaitNewWorker polls until a worker other than prev answers, and returns
// it with its inventory (nil when a listing failed). Each poll reads the
// identity and the inventory on one line, so the inventory is the adopted
// worker's own. A line that fails as a whole (a cut or oversized reply) is
// followed by the identity alone: a listing the worker cannot answer costs
// the inventory, never the reload. Ops never go to the outgoing worker.
// A worker off the agent's socket never answers: once the socket refuses
// after a grace, the master's word on the worker's sockets ends the wait
// (listensElsewhere). One that accepts may be HAProxy's by another path
// (the agent's own mount of the base directory), which no listing names.
func (d *applyDeps) awaitNewWorker(ctx context.Context, prev HAProxyInfo) (HAProxyInfo, *Inventory, error) {
	t := time.NewTicker(awaitWorkerPoll)
	defer t.Stop()
	for ask := time.Now().Add(workerSocketGrace); ; {
		info, inv, err := d.rt.listWorker(ctx, 0, true)
		if errors.Is(err, errNoIdentity) {
			info, _ = d.rt.info(ctx) // no identity on error
		}
		if info.HasWorkerIdentity() && !prev.SameWorker(info) {
			if err != nil {
				d.logger.Warn("could not refresh the runtime inventory of the new worker", "err", err)
				return info, nil, nil
			}
			return info, &inv, nil
		}
		if (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist)) && time.Now().After(ask) {
			ask = time.Now().Add(workerSocketGrace)
			if bound, err := d.rt.listensElsewhere(ctx); err != nil {
				d.strays = bound
				return HAProxyInfo{}, nil, err
			}
		}
		select {
		case <-ctx.Done():
			return HAProxyInfo{}, nil, errNoNewWorker
		case <-t.C:
		}
	}
}

// removeStrays removes the sockets a worker the agent could not reach bound
// (HAProxy unlinks none when a worker stops) once a reload replaced it and
// nobody accepts on them: that worker stops a moment after its successor.
func (d *applyDeps) removeStrays() {
	for _, path := range d.strays {
		for range maxStrayDials {
			conn, err := net.Dial("unix", path)
			if err == nil {
				conn.Close()
				time.Sleep(awaitWorkerPoll)
				continue
			}
			if fi, lerr := os.Lstat(path); errors.Is(err, syscall.ECONNREFUSED) && lerr == nil && fi.Mode().Type() == os.ModeSocket {
				d.logger.Info("removing the socket of a worker the agent could not reach", "path", path, "err", os.Remove(path))
			}
			break
		}
	}
	d.strays = nil
}
