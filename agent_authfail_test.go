// Tests of the accounting of failed authentication (agent_authfail.go):
// every failure is counted, the log lines are rate-limited and report how
// many failures they swallowed, an address that keeps failing is answered
// later and later up to a bound, the table of addresses is bounded, and an
// IPv6 client is tracked by its /64.

package haptic

import (
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestFailedAuthenticationIsCountedLoggedAndSlowed drives the API with a
// wrong password: every failure is counted, one line is logged for the
// burst, the answers of an address that keeps failing come later and later
// up to a bound, and a success forgets the address's failures.
func TestFailedAuthenticationIsCountedLoggedAndSlowed(t *testing.T) {
	logs := &lockedBuffer{}
	const base, maxDelay = 40 * time.Millisecond, 160 * time.Millisecond
	e := newTestEnv(t, func(c *AgentConfig) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}, func(a *Agent, _ *FakeHAProxy) {
		a.authFail.interval = time.Hour
		a.authFail.free = 2
		a.authFail.base, a.authFail.maxDelay = base, maxDelay
	})
	wrong := newAgentClient(t, e.a)
	wrong.pass = "guess"
	// The n-th failure waits: 0, 0, 40, 80, 160, 160, 160, 160 ms.
	want := []time.Duration{0, 0, base, 2 * base, maxDelay, maxDelay, maxDelay, maxDelay}
	for i, min := range want {
		start := time.Now()
		code, _, body := wrong.do("GET", PathState, nil, "")
		took := time.Since(start)
		if code != http.StatusUnauthorized || string(body) != "unauthorized\n" {
			t.Fatalf("failure %d: %d %q", i+1, code, body)
		}
		if took < min {
			t.Errorf("failure %d answered after %s, want at least %s", i+1, took, min)
		}
		if took > maxDelay+2*time.Second {
			t.Errorf("failure %d answered after %s: the delay is not bounded", i+1, took)
		}
	}
	if got := e.a.metrics.authFailures.value(authSchemeBasic); got != uint64(len(want)) {
		t.Errorf("auth_failures_total{scheme=basic} = %d, want %d", got, len(want))
	}
	if n := strings.Count(logs.String(), `"msg":"authentication failed"`); n != 1 {
		t.Errorf("%d log lines for %d failures within one interval, want 1:\n%s", n, len(want), logs)
	}
	if !strings.Contains(logs.String(), `"scheme":"basic"`) || !strings.Contains(logs.String(), `"remote":"127.0.0.1:`) {
		t.Errorf("the log line does not say who failed how:\n%s", logs)
	}

	// Authenticating forgets the failures: the next failure is free again.
	if st := e.c.state(""); st.APIVersion != APIVersion {
		t.Fatalf("%+v", st)
	}
	e.a.authFail.mu.Lock()
	left := len(e.a.authFail.byAddr)
	e.a.authFail.mu.Unlock()
	if left != 0 {
		t.Errorf("%d addresses still tracked after a success", left)
	}
	if d := e.a.authFail.delayFor(1); d != 0 {
		t.Errorf("the first failure waits %s", d)
	}
}

// fakeClock is a settable clock for authFailures.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time           { return c.t }
func (c *fakeClock) add(d time.Duration)      { c.t = c.t.Add(d) }
func requestFrom(remote string) *http.Request { return &http.Request{RemoteAddr: remote} }

func TestAuthFailureLogLinesAreRateLimitedWithTheSuppressedCount(t *testing.T) {
	logs := &lockedBuffer{}
	counted := 0
	f := newAuthFailures(slog.New(slog.NewJSONHandler(logs, nil)), func(string) { counted++ })
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	f.now = clock.now
	for range 5 {
		f.failed(requestFrom("192.0.2.1:4000"), authSchemeBasic)
		clock.add(time.Second)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 {
		t.Fatalf("%d lines for 5 failures within %s:\n%s", n, authFailLogInterval, logs)
	}
	clock.add(authFailLogInterval)
	f.failed(requestFrom("192.0.2.2:4000"), authSchemeTLS)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], `"suppressed_since_last_line":4`) || !strings.Contains(lines[1], `"scheme":"tls"`) {
		t.Errorf("the second line does not report the 4 suppressed failures:\n%s", logs)
	}
	if counted != 6 {
		t.Errorf("counted %d failures, want 6", counted)
	}
}

func TestAuthFailureDelaysAreBoundedAndPerAddress(t *testing.T) {
	f := newAuthFailures(slog.New(slog.DiscardHandler), func(string) {})
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	f.now = clock.now
	var last time.Duration
	for i := range 40 {
		last = f.failed(requestFrom("192.0.2.1:4000"), authSchemeBasic)
		if i < authFailFree && last != 0 {
			t.Fatalf("failure %d waits %s", i+1, last)
		}
	}
	if last != authFailMaxDelay {
		t.Errorf("the 40th failure waits %s, want the bound %s", last, authFailMaxDelay)
	}
	if d := f.failed(requestFrom("192.0.2.99:4000"), authSchemeBasic); d != 0 {
		t.Errorf("another address waits %s for its first failure", d)
	}
	// A minute without failures forgets them.
	clock.add(authFailWindow + time.Second)
	if d := f.failed(requestFrom("192.0.2.1:4001"), authSchemeBasic); d != 0 {
		t.Errorf("after the window the first failure waits %s", d)
	}
}

func TestAuthFailureTableIsBounded(t *testing.T) {
	f := newAuthFailures(slog.New(slog.DiscardHandler), func(string) {})
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	f.now = clock.now
	f.maxAddrs = 3
	for _, addr := range []string{"192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1"} {
		if d := f.failed(requestFrom(addr), authSchemeBasic); d != 0 {
			t.Fatalf("%s waits %s", addr, d)
		}
	}
	// Full of recent failures: an untracked address gets the longest delay.
	if d := f.failed(requestFrom("192.0.2.4:1"), authSchemeBasic); d != authFailMaxDelay {
		t.Errorf("an untracked address waits %s, want %s", d, authFailMaxDelay)
	}
	if n := len(f.byAddr); n != 3 {
		t.Errorf("%d addresses tracked, want at most 3", n)
	}
	// Once the tracked failures are old, a full table makes room.
	clock.add(authFailWindow + authFailPruneEvery)
	if d := f.failed(requestFrom("192.0.2.4:1"), authSchemeBasic); d != 0 {
		t.Errorf("after pruning, a new address waits %s", d)
	}
	if n := len(f.byAddr); n != 1 {
		t.Errorf("%d addresses tracked after pruning, want 1", n)
	}
}

func TestPeerKeyGroupsAnIPv6Slash64(t *testing.T) {
	tests := []struct {
		remote string
		want   string // "" = no key
	}{
		{"192.0.2.7:5555", "192.0.2.7/32"},
		{"[::ffff:192.0.2.7]:5555", "192.0.2.7/32"},
		{"[2001:db8:1:2::1]:5555", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::9]:1", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:1", "fe80::/64"},
		{"192.0.2.7", "192.0.2.7/32"},
		{"@", ""},
		{"", ""},
	}
	for _, tc := range tests {
		p, ok := peerKey(tc.remote)
		switch {
		case tc.want == "" && ok:
			t.Errorf("%q: key %s, want none", tc.remote, p)
		case tc.want != "" && (!ok || p != netip.MustParsePrefix(tc.want)):
			t.Errorf("%q: key %s %v, want %s", tc.remote, p, ok, tc.want)
		}
	}
}
