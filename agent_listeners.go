// This file bounds what a client can hold on the agent's listeners without
// authenticating: every server reads headers, bodies and idle keep-alive
// connections under a deadline, and every listener holds at most a fixed
// number of connections. The caps are per listener, so that a flood of the
// TCP listeners (the API, whose probes need no credentials, and the
// metrics) never takes the admin socket's connections, or the descriptors
// it needs, and liveness is still answered there; and at the cap, the
// addresses of clients that have not authenticated share the slots.

package haptic

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Listener names: the server names of Run's errors and the label values of
// haptic_agent_connections_refused_total.
const (
	listenerAPI     = "api"
	listenerMetrics = "metrics"
	listenerAdmin   = "admin"
	listenerDrain   = "drain"
)

// Connection caps. A controller keeps at most two idle connections per
// agent and a Prometheus server one; probes and `haptic agent state` open
// one at a time. Together the caps stay far below any descriptor limit a
// pod runs with (the 20,000 of the flood that exhausted an uncapped agent),
// leaving descriptors for the tree, the staging files and HAProxy's
// sockets.
const (
	maxAPIConns     = 256
	maxMetricsConns = 32
	maxAdminConns   = 32
	maxDrainConns   = 32
	maxHeaderBytes  = 64 << 10         // the agent's requests carry a few hundred bytes
	capLogInterval  = 10 * time.Second // at most one "at its connection cap" line per listener
)

// listenerLimits is one server's connection cap and timeouts; tests shorten
// them in the agent's field.
type listenerLimits struct {
	maxConns   int
	readHeader time.Duration // the request line and headers
	read       time.Duration // the whole request, body included
	write      time.Duration // the answer
	idle       time.Duration // a keep-alive connection between requests
}

// defaultListenerLimits are the limits of each server. The API reads an
// apply body of up to 64 MiB and may answer after a 60 s reload; the others
// read bodiless GETs, and the drain answers after at most drainMaxWait.
// Every server closes an idle keep-alive connection: without it, the
// metrics listener kept one open for as long as the client liked.
func defaultListenerLimits(drainMaxWait time.Duration) map[string]listenerLimits {
	return map[string]listenerLimits{ // maxConns, readHeader, read, write, idle
		listenerAPI:     {maxAPIConns, 10 * time.Second, 2 * time.Minute, 3 * time.Minute, 2 * time.Minute},
		listenerMetrics: {maxMetricsConns, 10 * time.Second, 30 * time.Second, 30 * time.Second, 2 * time.Minute},
		listenerAdmin:   {maxAdminConns, 10 * time.Second, 30 * time.Second, 15 * time.Second, 30 * time.Second},
		listenerDrain:   {maxDrainConns, 10 * time.Second, 30 * time.Second, drainMaxWait + serverGrace, 30 * time.Second},
	}
}

// newServer builds the HTTP/1.1 server of one listener with its limits.
// net/http's own errors (a broken client) go to the debug log: they are a
// client's doing, and the metrics count what matters.
func (a *Agent) newServer(name string, h http.Handler, base func(net.Listener) context.Context) *http.Server {
	l := a.limits[name]
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		WriteTimeout:      l.write,
		IdleTimeout:       l.idle,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       base,
		ConnContext:       withConnAuth,
		ErrorLog:          slog.NewLogLogger(a.logger.Handler(), slog.LevelDebug),
		// HTTP/1.1 only, the agent's wire: an empty map is how net/http is
		// told so.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
}

// capped wraps ln so that it holds at most the listener's maxConns.
func (a *Agent) capped(name string, ln net.Listener) net.Listener {
	return &cappedListener{Listener: ln, name: name, max: max(1, a.limits[name].maxConns),
		refused: func() { a.metrics.connsRefused.inc(name) }, logger: a.logger, waiting: map[netip.Prefix][]*cappedConn{}}
}

// cappedListener holds at most max connections. At the cap, a new one
// takes the place of one that has not authenticated (victim), or is
// refused; the loser is reset and counted. Unauthenticated, a client is but
// its address: first come, first served, 600 slow headers from 8 addresses
// kept pushes out for 4-10 s. Accept refuses in a loop, never with an
// error: Serve's backoff after one kept a controller queued for 8 s.
type cappedListener struct {
	net.Listener
	name    string
	max     int
	refused func() // the metric
	logger  *slog.Logger

	mu      sync.Mutex
	held    int
	waiting map[netip.Prefix][]*cappedConn // the unauthenticated connections held, per address in accept order

	lastLog      time.Time // these only Serve's accept loop writes
	refusedSince uint64    // refused or evicted since the last log line
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cc := &cappedConn{Conn: c, l: l}
		cc.peer, _ = peerKey(c.RemoteAddr().String())
		var loser *cappedConn // nil (a free slot), cc (refused), or the victim
		l.mu.Lock()
		if l.held >= l.max {
			if loser = victim(l.waiting, cc.peer); loser == nil {
				loser = cc
			} else {
				l.forgetLocked(loser, true)
			}
		}
		if loser != cc {
			l.held++
			l.waiting[cc.peer] = append(l.waiting[cc.peer], cc)
		}
		l.mu.Unlock()
		if loser == nil {
			return cc, nil
		}
		if tc, ok := loser.Conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset: the client learns at once, nothing lingers
		}
		loser.Conn.Close()
		l.refused()
		l.refusedSince++
		if now := time.Now(); now.Sub(l.lastLog) >= capLogInterval {
			l.logger.Warn("listener at its connection cap; refusing connections", "listener", l.name,
				"cap", l.max, "refused_since_last_line", l.refusedSince)
			l.lastLog, l.refusedSince = now, 0
		}
		if loser != cc {
			return cc, nil
		}
	}
}

// victim is the oldest waiting connection of the address waiting on the
// most, when that is at least two more than peer's, so that an eviction
// narrows the gap, never swaps a slot back and forth; else nil. An
// attacker so needs an address per slot to keep a controller out.
func victim(waiting map[netip.Prefix][]*cappedConn, peer netip.Prefix) *cappedConn {
	var most []*cappedConn
	for _, w := range waiting {
		if len(w) > len(most) {
			most = w
		}
	}
	if len(most) < len(waiting[peer])+2 {
		return nil
	}
	return most[0]
}

// forgetLocked takes c off its address's waiting list, and frees its slot
// once when it leaves (closed or evicted).
func (l *cappedListener) forgetLocked(c *cappedConn, leaves bool) {
	if leaves && !c.gone {
		c.gone, l.held = true, l.held-1
	}
	w := slices.DeleteFunc(l.waiting[c.peer], func(o *cappedConn) bool { return o == c })
	if l.waiting[c.peer] = w; len(w) == 0 {
		delete(l.waiting, c.peer)
	}
}

// cappedConn owns whether a request on its connection authenticated.
type cappedConn struct {
	net.Conn
	l      *cappedListener
	peer   netip.Prefix
	authed atomic.Bool // set under l.mu: an eviction sees it, or comes first
	gone   bool        // closed or evicted; guarded by l.mu
}

// authenticate marks c authenticated, or reports false when it was evicted
// first. A nil c (not capped) always authenticates.
func (c *cappedConn) authenticate() bool {
	if c == nil || c.authed.Load() {
		return true
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.authed.Store(true)
	c.l.forgetLocked(c, false)
	return !c.gone
}

func (c *cappedConn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c, true)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
