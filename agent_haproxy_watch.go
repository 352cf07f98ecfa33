// This file owns whether the agent can reach HAProxy right now, as opposed
// to whether it has finished starting (Ready): why it is still waiting
// while HAProxy is not there yet, and the monitor that connects to both
// sockets once it is and flips what /readyz answers.
//
// It never sends HAProxy a command (a connect is the whole probe) and never
// touches the state or the tree.

package haptic

import (
	"context"
	"fmt"
	"net"
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
