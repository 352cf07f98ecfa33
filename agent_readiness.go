// This file owns whether the agent can reach HAProxy right now, as opposed
// to whether it has finished starting (Ready): what it is waiting for
// while HAProxy is not there yet, the monitor that watches both sockets
// once it is, and the answers that depend on it (GET /readyz, which also
// reports a broken state log, a state read before initialisation, a
// verified state read).

package haptic

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

const (
	// haproxyWatchInterval is how often the monitor connects to the worker
	// and master sockets. A connect is the cheapest probe that notices a
	// process that is gone (the socket file removed, or nobody listening
	// on it); it sends no command, so it never shows up in HAProxy's
	// command history or competes with an apply for the CLI.
	haproxyWatchInterval = time.Second
	// haproxyWatchDialTimeout bounds one connect: a listener whose backlog
	// is full answers late, and the monitor must not fall behind.
	haproxyWatchDialTimeout = time.Second
	// haproxyLostAfter is how many probes in a row must fail before the
	// agent reports HAProxy lost: a reload replaces the worker and its
	// socket, and one failed connect in that window is not an outage. Two
	// failures at one-second intervals turn readiness off within about two
	// seconds of HAProxy going away; one success turns it back on.
	haproxyLostAfter = 2
	// stateInitGrace is how long a state read waits for an initialisation
	// that HAProxy does not hold up (the agent is hashing its files or
	// recovering): a controller that reads right after a restart gets the
	// state, not an error.
	stateInitGrace = 2 * time.Second
	stateInitPoll  = 50 * time.Millisecond // how often such a read looks again
)

// haproxyWatch is what the agent knows about reaching HAProxy: two
// strings, each written by one loop (the startup probe, the watch) and read
// by the handlers.
type haproxyWatch struct {
	waiting atomic.Value // before initialisation: why the last startup probe failed; "" once HAProxy answered
	lost    atomic.Value // after initialisation: why HAProxy is unreachable; "" while it answers
}

// setWaiting records why the startup probe failed ("" once it succeeded).
func (a *Agent) setWaiting(err error) {
	msg := ""
	if err != nil {
		msg = fmt.Sprintf("agent is waiting for HAProxy (worker socket %s, master socket %s): %v",
			a.paths.worker, a.paths.master, err)
	}
	a.haproxy.waiting.Store(msg)
}

// probeSockets connects to the worker and the master socket once each and
// says which one does not answer.
func (a *Agent) probeSockets(ctx context.Context) error {
	for _, s := range []struct{ role, path string }{{"worker", a.paths.worker}, {"master", a.paths.master}} {
		conn, err := (&net.Dialer{Timeout: haproxyWatchDialTimeout}).DialContext(ctx, "unix", s.path)
		if err != nil {
			return fmt.Errorf("the HAProxy %s socket %s does not answer: %w", s.role, s.path, err)
		}
		conn.Close()
	}
	return nil
}

// watchHAProxy probes both sockets every haproxyWatchInterval once the
// agent is initialised, until ctx ends, and flips what /readyz answers. A
// change is logged once, not every probe.
func (a *Agent) watchHAProxy(ctx context.Context) {
	select {
	case <-a.initialized:
	case <-ctx.Done():
		return
	}
	failures, lost := 0, "" // consecutive failed probes; what a.haproxy.lost holds
	every(ctx, haproxyWatchInterval, nil, func() {
		err := a.probeSockets(ctx)
		if ctx.Err() != nil {
			return
		}
		was := lost
		if err == nil {
			failures, lost = 0, ""
		} else if failures++; failures >= haproxyLostAfter {
			lost = err.Error()
		}
		a.haproxy.lost.Store(lost)
		switch {
		case was == "" && lost != "":
			a.logger.Warn("HAProxy is unreachable; /readyz answers 503 until it is back", "err", lost)
		case was != "" && lost == "":
			a.logger.Info("HAProxy is reachable again; /readyz answers 200")
		}
	})
}

// handleReadyz answers 200 "ready" once initialised while HAProxy answers,
// 503 "initialising" before, and 503 with the reason when HAProxy went away
// after startup: a pod whose HAProxy is gone must leave the load balancer
// and be seen, whatever its agent last applied. So must one whose state log
// is broken (its agent refuses every apply until a new snapshot is written:
// the compaction that follows an apply's answer), and one whose tree does
// not hold files its agent answered for.
func (a *Agent) handleReadyz(w http.ResponseWriter, r *http.Request) {
	lost, _ := a.haproxy.lost.Load().(string)
	broken, behind, stuck := a.led.faults()
	late := a.files.lateMount()
	switch {
	case !a.Ready():
		writeText(w, http.StatusServiceUnavailable, "initialising")
	case lost != "":
		writeText(w, http.StatusServiceUnavailable, "haproxy unreachable: "+lost)
	case broken != nil:
		writeText(w, http.StatusServiceUnavailable, msgLogBroken+": "+broken.Error())
	case behind != nil:
		writeText(w, http.StatusServiceUnavailable, msgDiskBehind+": "+behind.Error())
	case stuck != nil:
		writeText(w, http.StatusServiceUnavailable, msgLogStuck+": "+stuck.Error())
	case late != nil:
		writeText(w, http.StatusServiceUnavailable, msgLateMount+": "+late.Error())
	default:
		writeText(w, http.StatusOK, "ready")
	}
}

// awaitInitialised waits for initialisation on behalf of a state read. It
// returns "" once initialised, or the message of the 503 to answer: at
// once while HAProxy does not answer the startup probe, after
// stateInitGrace otherwise. ok is false when the request ended first.
func (a *Agent) awaitInitialised(ctx context.Context) (message string, ok bool) {
	grace := time.After(stateInitGrace)
	tick := time.NewTicker(stateInitPoll)
	defer tick.Stop()
	for {
		if waiting, _ := a.haproxy.waiting.Load().(string); waiting != "" && !a.Ready() {
			return waiting, true
		}
		select {
		case <-a.initialized:
			return "", true
		case <-ctx.Done():
			return "", false
		case <-grace:
			return msgAgentInitialising, true
		case <-tick.C:
		}
	}
}
