// This file accounts for failed authentication on the network API: every
// failure is counted in a metric and logged at most once per interval (with
// the number of failures the interval swallowed), and every address has a
// budget of Basic credential checks (a certificate cannot be guessed) that
// its failures spend and time refills. A request from an address whose
// budget is spent is refused unchecked, so that the guesses of one address
// stay bounded however many connections it opens and whatever succeeds from
// it, a controller's own new connections included. It must never hold a
// connection to slow a client down: each held connection is a slot of the
// API's capped pool, and a flood of them locked the controller out.

package haptic

import (
	"log/slog"
	"maps"
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
// before it is reconfigured, and then waits at most one refill.
const (
	// At most one log line per interval, however many failures: 30,000
	// wrong passwords at 20,000 a second would otherwise be 30,000 lines.
	authFailLogInterval = 10 * time.Second
	// authFailBurst failures of one address are checked at once; then one
	// more every authFailRefill: at most 10 guesses a minute per address.
	authFailBurst  = 10
	authFailRefill = 6 * time.Second
	// maxAuthFailAddrs bounds the per-address table. The addresses it
	// cannot hold share one more budget, so that spreading guesses over
	// more addresses does not make them unbounded.
	maxAuthFailAddrs = 4096
	// authFailPruneEvery spaces the scans that drop whole budgets from a
	// full table, so that a flood of new addresses cannot make every
	// request scan it.
	authFailPruneEvery = time.Second
)

// authFailures is the agent's failed-authentication accounting.
type authFailures struct {
	logger   *slog.Logger
	count    func(scheme string) // the metric
	now      func() time.Time    // tests move it
	maxAddrs int                 // maxAuthFailAddrs; tests shrink it

	mu         sync.Mutex
	byAddr     map[netip.Prefix]*time.Time // when each address's budget is whole again
	overflow   time.Time                   // the same, shared by the addresses the table cannot hold
	lastLog    time.Time
	suppressed uint64 // failures since the last log line, not logged
	lastPrune  time.Time
}

func newAuthFailures(logger *slog.Logger, count func(scheme string)) *authFailures {
	return &authFailures{logger: logger, count: count, now: time.Now, maxAddrs: maxAuthFailAddrs, byAddr: map[netip.Prefix]*time.Time{}}
}

// take spends one check of r's address's budget before its credentials are
// checked, so that concurrent guesses cannot all pass a check made before
// any of them failed. When the budget is spent it returns false and how
// long until the next check is allowed.
func (f *authFailures) take(r *http.Request) (bool, time.Duration) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	whole := f.budgetLocked(r, now)
	from := *whole
	if from.Before(now) {
		from = now
	}
	if wait := from.Sub(now) - (authFailBurst-1)*authFailRefill; wait > 0 {
		return false, wait
	}
	*whole = from.Add(authFailRefill)
	return true, 0
}

// giveBack returns the check a request that authenticated took: a success
// costs nothing, and forgives none of the address's failures.
func (f *authFailures) giveBack(r *http.Request) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	whole := f.budgetLocked(r, now)
	*whole = whole.Add(-authFailRefill)
}

// budgetLocked is the budget of r's address: its entry in the table, made
// when missing, or the shared one when the address has no usable key or
// the table is full.
func (f *authFailures) budgetLocked(r *http.Request, now time.Time) *time.Time {
	key, keyed := peerKey(r.RemoteAddr)
	if !keyed {
		return &f.overflow
	}
	if whole, ok := f.byAddr[key]; ok {
		return whole
	}
	if len(f.byAddr) >= f.maxAddrs && now.Sub(f.lastPrune) >= authFailPruneEvery {
		f.lastPrune = now
		maps.DeleteFunc(f.byAddr, func(_ netip.Prefix, whole *time.Time) bool { return !whole.After(now) })
	}
	if len(f.byAddr) >= f.maxAddrs {
		return &f.overflow
	}
	whole := new(time.Time)
	f.byAddr[key] = whole
	return whole
}

// failed counts one failed authentication from r's peer and logs it unless
// a line was written within the interval.
func (f *authFailures) failed(r *http.Request, scheme string, checked bool) {
	f.count(scheme)
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.lastLog.IsZero() && now.Sub(f.lastLog) < authFailLogInterval {
		f.suppressed++
		return
	}
	f.logger.Warn("authentication failed", "remote", r.RemoteAddr, "scheme", scheme,
		"credentials_checked", checked, "suppressed_since_last_line", f.suppressed)
	f.lastLog, f.suppressed = now, 0
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
