// This file owns the drain: the wait a preStop hook makes on GET /drain
// until the worker stops accepting new connections. Both containers of a
// pod call it at once, so concurrent callers share one run (a hand-written
// single-flight) and all get its result.
//
// The single-flight lock is a leaf, so it can never take part in a
// deadlock: it guards only which run is in flight, is never held while the
// counter is read, and no other lock is taken under it.

package haptic

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// drainPollInterval is how often a drain reads the connection counter. A
// show stat costs HAProxy little; ten reads a second see a new connection
// soon enough for quiet periods counted in seconds.
const drainPollInterval = 100 * time.Millisecond

// drainer runs drains for one agent.
type drainer struct {
	count        func(ctx context.Context) (uint64, error) // accepted connections, less the ignored frontends
	quiet        time.Duration
	maxWait      time.Duration
	stop         <-chan struct{} // closed when the agent stops; a running drain then answers cancelled
	pollInterval time.Duration   // drainPollInterval; tests shrink it before the first drain

	mu   sync.Mutex
	run  *drainRun // the run in flight; nil when idle
	runs uint64    // runs started so far
}

// drainRun is one shared run. result is written once, before done closes.
type drainRun struct {
	start  time.Time
	done   chan struct{}
	result DrainResult
	last   atomic.Uint64 // the last counter value read, for callers that leave early
}

func newDrainer(count func(ctx context.Context) (uint64, error), quiet, maxWait time.Duration, stop <-chan struct{}) *drainer {
	return &drainer{count: count, quiet: quiet, maxWait: maxWait, stop: stop, pollInterval: drainPollInterval}
}

// drain runs one drain, or joins the one in flight; every caller waiting
// until the run ends gets the same DrainResult. A caller whose ctx ends
// first stops waiting and gets cancelled with the time and count so far; the
// run goes on for the others. A caller arriving after a run ended starts a
// new one: a second preStop (say after a failed first attempt) must watch the
// traffic afresh, not reuse an old verdict.
func (d *drainer) drain(ctx context.Context) DrainResult {
	d.mu.Lock()
	r := d.run
	if r == nil {
		r = &drainRun{start: time.Now(), done: make(chan struct{})}
		d.run = r
		d.runs++
		go func() {
			r.result = d.watch(r)
			// Retired before the callers wake, so that the next caller
			// starts afresh.
			d.mu.Lock()
			d.run = nil
			d.mu.Unlock()
			close(r.done)
		}()
	}
	d.mu.Unlock()

	select {
	case <-r.done:
		return r.result
	case <-ctx.Done():
		return drainResult(DrainReasonCancelled, r.start, r.last.Load())
	}
}

// watch is the drain loop. Its reads carry a context that ends at the bound
// or when the agent stops, so a worker that hangs on show stat cannot hold
// the preStop hook past DrainMaxWait.
func (d *drainer) watch(r *drainRun) DrainResult {
	ctx, cancel := context.WithDeadline(context.Background(), r.start.Add(d.maxWait))
	defer cancel()
	go func() {
		select {
		case <-d.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	stopped := func() bool {
		select {
		case <-d.stop:
			return true
		default:
			return false
		}
	}
	end := func(reason string, n uint64) DrainResult { return drainResult(reason, r.start, n) }

	// A counter that cannot be read at all (the worker is gone, the socket
	// is wrong) gives the hook nothing to wait for: answer at once rather
	// than hold the pod's termination for the whole bound.
	if stopped() {
		return end(DrainReasonCancelled, 0)
	}
	last, err := d.count(ctx)
	switch {
	case err != nil && stopped():
		return end(DrainReasonCancelled, 0)
	case err != nil:
		return end(DrainReasonUnavailable, 0)
	}
	r.last.Store(last)
	changed := time.Now()

	poll := time.NewTicker(d.pollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done(): // at the bound, or when the agent stops
			if stopped() {
				return end(DrainReasonCancelled, last)
			}
			return end(DrainReasonBound, last)
		case <-poll.C:
		}
		n, err := d.count(ctx)
		if err == nil && n != last {
			last, changed = n, time.Now()
			r.last.Store(n)
		}
		now := time.Now()
		switch {
		case stopped():
			return end(DrainReasonCancelled, last)
		case err != nil && ctx.Err() == context.DeadlineExceeded:
			// The read was cut off by the bound, not by a failing worker.
			return end(DrainReasonBound, last)
		case err != nil:
			return end(DrainReasonUnavailable, last)
		case now.Sub(changed) >= d.quiet:
			// Quiet wins over the bound when both hold: the traffic did stop.
			return end(DrainReasonQuiet, last)
		case now.Sub(r.start) >= d.maxWait:
			return end(DrainReasonBound, last)
		}
	}
}

// drainResult is the answer for a run that began at start: waited rounded to
// the millisecond, in Go's duration notation ("1.5s"), the form the
// upstream agent answers with.
func drainResult(reason string, start time.Time, connections uint64) DrainResult {
	return DrainResult{
		Reason:      reason,
		Waited:      time.Since(start).Round(time.Millisecond).String(),
		Connections: connections,
	}
}

// drainIgnoreSet turns --drain-ignore-frontend values into the set of
// frontend names the connection counter leaves out, nil when it is empty.
// The flag is repeatable and each value may also be a comma-separated list,
// as the upstream agent's flag accepts; blanks around names and empty items
// (a trailing comma) are dropped.
func drainIgnoreSet(values []string) map[string]bool {
	var set map[string]bool
	for name := range strings.SplitSeq(strings.Join(values, ","), ",") {
		if name = strings.TrimSpace(name); name != "" {
			if set == nil {
				set = map[string]bool{}
			}
			set[name] = true
		}
	}
	return set
}
