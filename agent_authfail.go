// This file accounts for failed authentication on the network API: every
// failure is counted in a metric, logged at most once per interval (with
// the number of failures the interval swallowed), and an address that keeps
// failing has its 401 answers delayed, so that guessing the credentials
// costs time. A request that authenticates is never delayed.

package haptic

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Authentication schemes, the label values of the failure metric.
const (
	authSchemeBasic = "basic"
	authSchemeTLS   = "tls"
)

// Failed-authentication accounting. A controller that has its credentials
// never fails; one that has the old ones after a rotation fails a few times
// before it is reconfigured, and is not slowed for that.
const (
	// authFailLogInterval: at most one log line per interval, however many
	// failures (30,000 wrong passwords at 20,000 a second would otherwise
	// be 30,000 lines, or none at all).
	authFailLogInterval = 10 * time.Second
	// authFailWindow: an address's failures are forgotten after this long
	// without one.
	authFailWindow = time.Minute
	// authFailFree: failures of one address within the window answered
	// at once.
	authFailFree = 5
	// authFailBaseDelay doubles with every further failure, up to
	// authFailMaxDelay. The delay holds one connection of the API's
	// capped pool, so it stays short: it only has to make guessing slow.
	authFailBaseDelay = 100 * time.Millisecond
	authFailMaxDelay  = 2 * time.Second
	// maxAuthFailAddrs bounds the per-address table. When it is full of
	// recent failures, an address it cannot track gets the longest delay
	// on every failure: only failures are slowed, so a controller that
	// authenticates is never hurt by it.
	maxAuthFailAddrs = 4096
	// authFailPruneEvery spaces the scans that drop forgotten addresses
	// from a full table, so that a flood of new addresses cannot make every
	// failure scan it.
	authFailPruneEvery = time.Second
)

// authFailures is the agent's failed-authentication accounting. Its
// tunables are fields so that tests can shorten them.
type authFailures struct {
	logger   *slog.Logger
	count    func(scheme string) // the metric
	now      func() time.Time
	interval time.Duration // authFailLogInterval
	window   time.Duration // authFailWindow
	free     int           // authFailFree
	base     time.Duration // authFailBaseDelay
	maxDelay time.Duration // authFailMaxDelay
	maxAddrs int           // maxAuthFailAddrs

	mu         sync.Mutex
	byAddr     map[netip.Prefix]*addrFailures
	lastLog    time.Time
	suppressed uint64 // failures since the last log line, not logged
	lastPrune  time.Time
}

// addrFailures is one address's recent failures.
type addrFailures struct {
	count int
	last  time.Time
}

func newAuthFailures(logger *slog.Logger, count func(scheme string)) *authFailures {
	return &authFailures{
		logger: logger, count: count, now: time.Now,
		interval: authFailLogInterval, window: authFailWindow, free: authFailFree,
		base: authFailBaseDelay, maxDelay: authFailMaxDelay, maxAddrs: maxAuthFailAddrs,
		byAddr: map[netip.Prefix]*addrFailures{},
	}
}

// failed records one failed authentication from r's peer, logs it unless a
// line was written within the interval, and returns how long to wait before
// answering.
func (f *authFailures) failed(r *http.Request, scheme string) time.Duration {
	f.count(scheme)
	key, keyed := peerKey(r.RemoteAddr)
	now := f.now()

	f.mu.Lock()
	defer f.mu.Unlock()
	n, delay := 0, f.maxDelay
	if e := f.entryLocked(key, keyed, now); e != nil {
		if now.Sub(e.last) > f.window {
			e.count = 0
		}
		e.count++
		e.last = now
		n, delay = e.count, f.delayFor(e.count)
	}
	if !f.lastLog.IsZero() && now.Sub(f.lastLog) < f.interval {
		f.suppressed++
		return delay
	}
	f.logger.Warn("authentication failed", "remote", r.RemoteAddr, "scheme", scheme,
		"failures_from_address", n, "suppressed_since_last_line", f.suppressed, "delay", delay)
	f.lastLog, f.suppressed = now, 0
	return delay
}

// entryLocked finds or makes the entry of key; nil when the address has no
// usable key or the table is full.
func (f *authFailures) entryLocked(key netip.Prefix, keyed bool, now time.Time) *addrFailures {
	if !keyed {
		return nil
	}
	if e, ok := f.byAddr[key]; ok {
		return e
	}
	if len(f.byAddr) >= f.maxAddrs && now.Sub(f.lastPrune) >= authFailPruneEvery {
		f.lastPrune = now
		for k, e := range f.byAddr {
			if now.Sub(e.last) > f.window {
				delete(f.byAddr, k)
			}
		}
	}
	if len(f.byAddr) >= f.maxAddrs {
		return nil
	}
	e := &addrFailures{}
	f.byAddr[key] = e
	return e
}

// delayFor is the wait before the n-th failure's answer: none for the free
// failures, then base, doubling, up to maxDelay.
func (f *authFailures) delayFor(n int) time.Duration {
	if n <= f.free {
		return 0
	}
	d := f.base
	for i := f.free + 1; i < n && d > 0 && d < f.maxDelay; i++ {
		d *= 2
	}
	return min(d, f.maxDelay)
}

// succeeded forgets the failures of r's peer: a controller that fixed its
// credentials is not slowed for its earlier mistakes.
func (f *authFailures) succeeded(r *http.Request) {
	key, keyed := peerKey(r.RemoteAddr)
	if !keyed {
		return
	}
	f.mu.Lock()
	delete(f.byAddr, key)
	f.mu.Unlock()
}

// peerKey is the table key of a remote address: the IPv4 address, or the
// /64 of an IPv6 address, since one host commonly holds a whole /64 and
// could otherwise change address on every attempt.
func peerKey(remote string) (netip.Prefix, bool) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}, false
	}
	addr = addr.Unmap().WithZone("")
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, err := addr.Prefix(bits)
	return p, err == nil
}

// waitBeforeRefusal sleeps d, or until ctx ends.
func waitBeforeRefusal(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
