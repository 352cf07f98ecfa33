// This file bounds what a client can hold on the agent's listeners without
// authenticating: every server reads headers, bodies and idle keep-alive
// connections under a deadline, and every listener holds at most a fixed
// number of connections. The caps are per listener, so that a flood of the
// TCP listeners (the API, whose probes need no credentials, and the
// metrics) never takes the admin socket's connections, or the descriptors
// it needs, and liveness is still answered there.

package haptic

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
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
// net/http's own errors (a refused connection's backoff, a broken client)
// go to the debug log: they are a client's doing, and the metrics count
// what matters.
func (a *Agent) newServer(name string, h http.Handler, base func(net.Listener) context.Context) *http.Server {
	l := a.limits[name]
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		WriteTimeout:      l.write,
		IdleTimeout:       l.idle,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       base,
		ErrorLog:          slog.NewLogLogger(a.logger.Handler(), slog.LevelDebug),
		// HTTP/1.1 only, the agent's wire: an empty map is how net/http is
		// told so.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	if name == listenerAPI {
		srv.ConnContext = withConnAuth
	}
	return srv
}

// capped wraps ln so that it holds at most the listener's maxConns
// connections at once.
func (a *Agent) capped(name string, ln net.Listener) net.Listener {
	return &cappedListener{Listener: ln, name: name, slots: make(chan struct{}, max(1, a.limits[name].maxConns)),
		refused: func() { a.metrics.connsRefused.inc(name) }, logger: a.logger}
}

// cappedListener holds at most cap(slots) connections. At the cap, the
// connection just accepted is closed at once (with a reset, for TCP),
// counted, and Accept reports a temporary error: net/http's Serve then
// waits (5 ms, doubling up to 1 s) before it accepts again, and whatever
// arrives meanwhile waits in the kernel's backlog, costing the agent no
// descriptor, goroutine or buffer. A connection that leaves frees its slot.
//
// Only Serve's accept loop calls Accept, so the log fields need no lock.
type cappedListener struct {
	net.Listener
	name    string
	slots   chan struct{}
	refused func()
	logger  *slog.Logger

	lastLog      time.Time
	refusedSince uint64 // refusals since the last log line
}

func (l *cappedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
		return &cappedConn{Conn: c, slots: l.slots}, nil
	default:
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // a reset: the client learns at once, nothing lingers
	}
	c.Close()
	l.refused()
	l.refusedSince++
	if now := time.Now(); now.Sub(l.lastLog) >= capLogInterval {
		l.logger.Warn("listener at its connection cap; refusing connections", "listener", l.name,
			"cap", cap(l.slots), "refused_since_last_line", l.refusedSince)
		l.lastLog, l.refusedSince = now, 0
	}
	return nil, errAtConnectionCap{l.name}
}

// errAtConnectionCap is the temporary error that makes Serve back off.
type errAtConnectionCap struct{ listener string }

func (e errAtConnectionCap) Error() string {
	return "the " + e.listener + " listener is at its connection cap"
}
func (errAtConnectionCap) Timeout() bool   { return false }
func (errAtConnectionCap) Temporary() bool { return true }

// cappedConn frees its listener's slot once, on the first Close.
type cappedConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}
