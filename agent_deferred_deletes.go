// This file owns the deferred-delete queue. Deleting a server or a backend
// can finish only once it carries no traffic, which can take seconds, so an
// apply runs the traffic-stopping half inline and hands the removals to this
// queue, which runs them off the apply path on worker sessions.
//
// It must never hold its mutex across HAProxy I/O or while counting an
// outcome, never run an item on another worker than the one it was queued
// for (the reloaded configuration no longer has those objects), and never
// count a backend deleted until its absence is confirmed.

package haptic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// serverRef names one server.
type serverRef struct{ Backend, Server string }

// splitDeletes divides an apply's ops: server_del and backend_del are
// deferred, the waits and shutdown_sessions are dropped (the queue issues
// its own, after the inline half stopped the traffic), the rest stays
// inline in order.
func splitDeletes(ops []Op) (inline []Op, servers []serverRef, backends []string) {
	for _, op := range ops {
		switch op.Kind {
		case OpServerDel:
			servers = append(servers, serverRef{Backend: op.Backend, Server: op.Server})
		case OpBackendDel:
			backends = append(backends, op.Backend)
		case OpServerWaitRemovable, OpBackendWaitRemovable, OpShutdownSessions:
		default:
			inline = append(inline, op)
		}
	}
	return inline, servers, backends
}

// Queue timing. The per-item waits are HAProxy-side ("wait 2000 …"), each
// inside the session's 30 s command deadline.
const (
	deferredWaitMs      = 2000            // wait budget of one srv-removable / be-removable check
	deferredQueueTick   = 2 * time.Second // the loop's ticker, besides wake-ups
	backendAlreadyGone  = "[3]: Failed. No such backend."
	deferredKindServer  = "server"
	deferredKindBackend = "backend"
)

// errDeferralOverflow refuses deletes past the queue's caps
// (MaxPendingServerDeletes, MaxPendingBackendDeletes), in flight included.
var errDeferralOverflow = errors.New("deferred delete queue is full")

// deleteItem is one queued delete, stamped with the worker it was meant for.
type deleteItem struct {
	kind, name string // deferredKindServer and "backend/server", or deferredKindBackend and the backend
	worker     HAProxyInfo
	generation uint64
	tries      int
}

// deleteQueue runs deferred deletes one at a time, each on its own worker
// session bound to the worker recorded at enqueue. Its mutex is a leaf, so
// setWorker, enqueue, check and pending never wait for a session command.
type deleteQueue struct {
	rt     *haproxyRuntime // its Logger is the queue's
	count  func(kind, outcome string)
	wakeup chan struct{}

	mu         sync.Mutex
	worker     HAProxyInfo
	generation uint64
	servers    []*deleteItem
	backends   []*deleteItem
	inFlight   *deleteItem
}

// newDeleteQueue builds the queue; count (never blocking) is told every
// outcome: "done", "deferred", "abandoned" or "superseded".
func newDeleteQueue(rt *haproxyRuntime, count func(kind, outcome string)) *deleteQueue {
	return &deleteQueue{rt: rt, count: count, wakeup: make(chan struct{}, 1)}
}

// check accepts deletes before anything executes: every name passes the
// token grammar and the queue stays within its caps, counting the item in
// flight. A refusal is a compile error (the apply reloads).
func (q *deleteQueue) check(servers []serverRef, backends []string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, _, err := q.admit(servers, backends)
	return err
}

// enqueue queues deletes after the inline half succeeded, only for the
// queue's current worker (an outgoing one's objects are gone on reload).
func (q *deleteQueue) enqueue(worker HAProxyInfo, servers []serverRef, backends []string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	newServers, newBackends, err := q.admit(servers, backends)
	if err != nil {
		return err
	}
	if !q.worker.SameWorker(worker) {
		return fmt.Errorf("%w: queue worker pid %d (start %d), enqueue for pid %d (start %d)", errWorkerGone,
			q.worker.WorkerPID, q.worker.WorkerStartTimeUnixMicros, worker.WorkerPID, worker.WorkerStartTimeUnixMicros)
	}
	for _, name := range newServers {
		q.servers = append(q.servers, &deleteItem{kind: deferredKindServer, name: name, worker: worker, generation: q.generation})
	}
	for _, name := range newBackends {
		q.backends = append(q.backends, &deleteItem{kind: deferredKindBackend, name: name, worker: worker, generation: q.generation})
	}
	return nil
}

// admit validates names and capacity (under q.mu) and returns the deletes
// not already pending, each once.
func (q *deleteQueue) admit(servers []serverRef, backends []string) (newServers, newBackends []string, err error) {
	names := make([]string, len(servers))
	for i, s := range servers {
		if err := cmp.Or(checkToken("backend", s.Backend), checkToken("server", s.Server)); err != nil {
			return nil, nil, err
		}
		names[i] = s.Backend + "/" + s.Server
	}
	if err := checkTokens("backend", backends); err != nil {
		return nil, nil, err
	}
	pendingServers, pendingBackends := q.pendingLocked()
	newServers, newBackends = unseen(pendingServers, names), unseen(pendingBackends, backends)
	if len(pendingServers)+len(newServers) > MaxPendingServerDeletes {
		return nil, nil, fmt.Errorf("%w: %d pending and %d new server deletes exceed %d",
			errDeferralOverflow, len(pendingServers), len(newServers), MaxPendingServerDeletes)
	}
	if len(pendingBackends)+len(newBackends) > MaxPendingBackendDeletes {
		return nil, nil, fmt.Errorf("%w: %d pending and %d new backend deletes exceed %d",
			errDeferralOverflow, len(pendingBackends), len(newBackends), MaxPendingBackendDeletes)
	}
	return newServers, newBackends, nil
}

// unseen returns the names not pending, each once.
func unseen(pending, names []string) []string {
	seen := make(map[string]bool, len(pending)+len(names))
	for _, name := range pending {
		seen[name] = true
	}
	var out []string
	for _, name := range names {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

// wake makes the loop drain now rather than at its next tick.
func (q *deleteQueue) wake() { notify(q.wakeup) }

// notify wakes the loop that waits on ch, never blocking: one pending
// wake-up is as good as many.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setWorker adopts the running worker. For the same worker (pid and start
// time) nothing changes; a new worker retires everything queued for the
// old one, counted superseded. An item in flight finishes on its old
// connection and is never requeued.
func (q *deleteQueue) setWorker(info HAProxyInfo) {
	q.mu.Lock()
	if q.worker.SameWorker(info) {
		q.mu.Unlock()
		return
	}
	q.worker = info
	q.generation++
	dropped := slices.Concat(q.servers, q.backends)
	q.servers, q.backends = nil, nil
	q.mu.Unlock()
	for _, it := range dropped {
		q.rt.Logger.Info("deferred delete superseded by a new worker", "kind", it.kind, "name", it.name)
		q.count(it.kind, "superseded")
	}
}

// pending lists the item in flight (when it belongs to the current worker)
// and the queued ones; never nil slices.
func (q *deleteQueue) pending() PendingDeletes {
	q.mu.Lock()
	defer q.mu.Unlock()
	servers, backends := q.pendingLocked()
	return PendingDeletes{Servers: servers, Backends: backends}
}

func (q *deleteQueue) pendingLocked() (servers, backends []string) {
	servers, backends = []string{}, []string{}
	items := slices.Concat(q.servers, q.backends)
	if it := q.inFlight; it != nil && it.generation == q.generation {
		items = slices.Insert(items, 0, it)
	}
	for _, it := range items {
		if it.kind == deferredKindBackend {
			backends = append(backends, it.name)
		} else {
			servers = append(servers, it.name)
		}
	}
	return servers, backends
}

// start drains the queue on every wake-up and every tick until ctx ends.
func (q *deleteQueue) start(ctx context.Context) {
	every(ctx, deferredQueueTick, q.wakeup, func() { q.drain(ctx) })
}

// drain processes, one at a time in FIFO order, as many servers and then
// backends as were queued when it began; requeued items wait for the next
// round.
func (q *deleteQueue) drain(ctx context.Context) {
	q.mu.Lock()
	counts := []int{len(q.servers), len(q.backends)}
	q.mu.Unlock()
	for i, list := range []*[]*deleteItem{&q.servers, &q.backends} {
		for range counts[i] {
			if ctx.Err() != nil || !q.runNext(ctx, list) {
				return
			}
		}
	}
}

// runNext takes the head of one list, runs it without the lock, and records
// the outcome. It reports false when the list was empty.
func (q *deleteQueue) runNext(ctx context.Context, list *[]*deleteItem) bool {
	q.mu.Lock()
	if len(*list) == 0 {
		q.mu.Unlock()
		return false
	}
	it := (*list)[0]
	*list, q.inFlight = (*list)[1:], it
	q.mu.Unlock()

	err := q.run(ctx, it)

	q.mu.Lock()
	q.inFlight = nil
	outcome := ""
	switch {
	case err == nil:
		outcome = "done"
	case ctx.Err() != nil && it.generation == q.generation:
		// The agent is stopping: not a failure of the item. It goes back
		// to the head, untried, and is never counted done.
		*list = slices.Insert(*list, 0, it)
	case it.generation != q.generation || errors.Is(err, errWorkerGone):
		outcome = "superseded"
	default:
		it.tries++
		if it.tries >= MaxDeferredAttempts {
			outcome = "abandoned"
		} else {
			outcome = "deferred"
			*list = append(*list, it)
		}
	}
	q.mu.Unlock()

	switch outcome {
	case "done":
		q.rt.Logger.Info("deferred delete done", "kind", it.kind, "name", it.name)
	case "abandoned":
		q.rt.Logger.Warn("deferred delete abandoned", "kind", it.kind, "name", it.name, "attempts", it.tries, "error", err)
	case "":
		return true
	default:
		q.rt.Logger.Info("deferred delete "+outcome, "kind", it.kind, "name", it.name, "attempts", it.tries, "error", err)
	}
	q.count(it.kind, outcome)
	return true
}

// run performs one item's commands on a session of its own.
func (q *deleteQueue) run(ctx context.Context, it *deleteItem) error {
	s, err := q.rt.openWorker(ctx, it.worker)
	if err != nil {
		return err
	}
	defer s.Close()
	if it.kind == deferredKindBackend {
		return q.deleteBackend(s, it)
	}
	return q.deleteServer(s, it)
}

// send runs one session command for an item, refusing once the item's
// worker has been superseded.
func (q *deleteQueue) send(s *workerSession, it *deleteItem, cmd string) (string, error) {
	q.mu.Lock()
	stale := it.generation != q.generation
	q.mu.Unlock()
	if stale {
		return "", fmt.Errorf("%w: superseded before %q", errWorkerGone, cmd)
	}
	return s.execute(cmd)
}

// sendJudged runs a command and judges its reply by the single-command rules.
func (q *deleteQueue) sendJudged(s *workerSession, it *deleteItem, c command) error {
	reply, err := q.send(s, it, c.Text)
	if err != nil {
		return err
	}
	return sessionVerdict(reply, c)
}

// deleteServer: wait until removable (shutting the sessions down when the
// wait expires), then delete.
func (q *deleteQueue) deleteServer(s *workerSession, it *deleteItem) error {
	wait := command{Text: "wait " + strconv.Itoa(deferredWaitMs) + " srv-removable " + it.name, Expect: expectDone}
	err := q.sendJudged(s, it, wait)
	if errors.Is(err, errWaitExpired) {
		if err := q.sendJudged(s, it, command{Text: "shutdown sessions server " + it.name}); err != nil {
			return err
		}
		err = q.sendJudged(s, it, wait)
	}
	if err != nil {
		return err
	}
	return q.sendJudged(s, it, command{Text: "del server " + it.name, Expect: "Server deleted"})
}

// deleteBackend: a backend's deletion counts only when confirmed by its
// absence, because the reply to "del backend" alone is not trusted: 3.4.0
// prints in it the messages earlier commands left on the worker thread (a
// del server's "Server deleted."), so only its severity is read.
func (q *deleteQueue) deleteBackend(s *workerSession, it *deleteItem) error {
	reply, err := q.send(s, it, "wait "+strconv.Itoa(deferredWaitMs)+" be-removable "+it.name)
	if err != nil {
		return err
	}
	if reply == backendAlreadyGone {
		return nil
	}
	if err := sessionVerdict(reply, command{Text: "wait", Expect: expectDone}); err != nil {
		return err
	}
	reply, err = q.send(s, it, "del backend "+it.name)
	if err != nil {
		return err
	}
	for _, seg := range splitSegments(reply) {
		if err := classify(seg); err != nil {
			return fmt.Errorf("%w: %s", err, seg)
		}
	}
	reply, err = q.send(s, it, "wait 1 be-removable "+it.name)
	if err != nil {
		return err
	}
	if reply != backendAlreadyGone {
		return fmt.Errorf("%w: backend %s still present after del backend: %q", errUnreadableResponse, it.name, reply)
	}
	return nil
}
