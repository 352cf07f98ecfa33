// Tests of the limits on the agent's listeners (agent_listeners.go): a
// flood of idle connections is capped per listener and timed out, and
// spares the admin socket; a request whose headers never finish is cut
// off; and every listener has a cap and every timeout by default.

package haptic

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors here: %v", err)
	}
	return len(entries)
}

// floodConn is one client connection of a flood: it sent one keep-alive
// request and then stays idle.
type floodConn struct {
	c        net.Conn
	r        *bufio.Reader
	answered bool
}

// flood opens n connections to addr and sends each one GET of path.
func flood(t *testing.T, addr, path string, n int) []*floodConn {
	t.Helper()
	conns := make([]*floodConn, 0, n)
	for range n {
		c, err := net.Dial("tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // refused so fast that the connect itself saw the reset
		}
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
		// A refused connection may already be reset: the write error
		// shows up as a read error below.
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: agent\r\n\r\n")
		conns = append(conns, &floodConn{c: c, r: bufio.NewReader(c)})
	}
	return conns
}

// readAnswers reads one answer on every connection, waiting at most d in
// all, and counts the connections that got one.
func readAnswers(conns []*floodConn, d time.Duration) int {
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, fc := range conns {
		wg.Go(func() {
			fc.c.SetReadDeadline(deadline)
			resp, err := http.ReadResponse(fc.r, nil)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			fc.answered = resp.StatusCode == http.StatusOK
		})
	}
	wg.Wait()
	n := 0
	for _, fc := range conns {
		if fc.answered {
			n++
		}
	}
	return n
}

// TestAConnectionFloodIsCappedTimedOutAndSparesTheAdminSocket opens many
// idle keep-alive connections to the metrics listener and to the API's
// unauthenticated /healthz: each listener holds at most its cap of them, so
// the agent's descriptors stay bounded, the admin socket keeps answering
// liveness, and the connections it did take are closed once idle.
func TestAConnectionFloodIsCappedTimedOutAndSparesTheAdminSocket(t *testing.T) {
	const capConns, floodConns = 8, 40
	const idle = 500 * time.Millisecond
	dir := shortTempDir(t)
	admin := filepath.Join(dir, "admin.sock")
	e := newTestEnv(t, func(c *AgentConfig) {
		c.MetricsListen = "127.0.0.1:0"
		c.AdminSocket = admin
	}, func(a *Agent, _ *FakeHAProxy) {
		for _, name := range []string{listenerAPI, listenerMetrics} {
			l := a.limits[name]
			l.maxConns, l.idle = capConns, idle
			a.limits[name] = l
		}
	})
	e.c.hc.CloseIdleConnections()
	before := openFDs(t)

	metrics := flood(t, e.a.metricsLn.Addr().String(), "/metrics", floodConns)
	api := flood(t, e.a.Addr(), PathHealthz, floodConns)
	// Before any idle timeout: at most the cap was answered on each.
	gotMetrics, gotAPI := readAnswers(metrics, idle/2), readAnswers(api, idle/2)
	held := openFDs(t) - before
	t.Logf("answered %d metrics and %d API connections of %d each; %d more descriptors", gotMetrics, gotAPI, floodConns, held)
	if gotMetrics == 0 || gotMetrics > capConns || gotAPI == 0 || gotAPI > capConns {
		t.Errorf("answered %d metrics and %d API connections, want 1..%d each", gotMetrics, gotAPI, capConns)
	}
	// The flood's own client ends take 2×40 descriptors; the agent may add
	// its capped connections, not one per flood connection.
	if limit := 2*floodConns + 2*capConns + 8; held > limit {
		t.Errorf("%d more descriptors during the flood, want at most %d", held, limit)
	}

	// Liveness on the admin socket is untouched by the flood.
	resp, err := unixClient(admin).Get("http://agent" + PathHealthz)
	if err != nil {
		t.Fatalf("admin /healthz during the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("admin /healthz during the flood: %d", resp.StatusCode)
	}
	for _, name := range []string{listenerAPI, listenerMetrics} {
		if n := e.a.metrics.connsRefused.value(name); n == 0 {
			t.Errorf("connections_refused_total{listener=%q} = 0", name)
		}
	}

	// The connections that were answered are closed once idle.
	for _, fc := range append(metrics, api...) {
		if !fc.answered {
			continue
		}
		fc.c.SetReadDeadline(time.Now().Add(idle + 3*time.Second))
		if _, err := fc.r.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("an idle connection was not closed by the agent: %v", err)
			break
		}
	}
}

// TestASlowHeaderIsCutOff: a connection that never finishes its request
// headers is closed after the header timeout, on every TCP listener.
func TestASlowHeaderIsCutOff(t *testing.T) {
	const readHeader = 300 * time.Millisecond
	e := newTestEnv(t, func(c *AgentConfig) { c.MetricsListen = "127.0.0.1:0" }, func(a *Agent, _ *FakeHAProxy) {
		for _, name := range []string{listenerAPI, listenerMetrics} {
			l := a.limits[name]
			l.readHeader = readHeader
			a.limits[name] = l
		}
	})
	for name, addr := range map[string]string{listenerAPI: e.a.Addr(), listenerMetrics: e.a.metricsLn.Addr().String()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ag")
		start := time.Now()
		c.SetReadDeadline(start.Add(readHeader + 3*time.Second))
		_, err = io.ReadAll(c)
		if took := time.Since(start); err != nil || took > readHeader+2*time.Second {
			t.Errorf("%s: a half-sent header was held %s (%v)", name, took, err)
		}
	}
}

// TestTheDefaultLimitsBoundEveryListener: every server has a cap, a header,
// a read, a write and an idle timeout; the API keeps the timeouts
// controllers are built against (10 s for the headers, 2 min to read a
// request, as long as the client waits for an apply, 3 min to write the
// answer, 2 min idle), and the drain may answer after its longest wait.
func TestTheDefaultLimitsBoundEveryListener(t *testing.T) {
	limits := defaultListenerLimits(10 * time.Second)
	for _, name := range []string{listenerAPI, listenerMetrics, listenerAdmin, listenerDrain} {
		l, ok := limits[name]
		if !ok || l.maxConns <= 0 || l.readHeader <= 0 || l.read <= 0 || l.write <= 0 || l.idle <= 0 {
			t.Errorf("%s: %+v", name, l)
		}
	}
	api := limits[listenerAPI]
	if api.readHeader != 10*time.Second || api.read != 2*time.Minute || api.write != 3*time.Minute || api.idle != 2*time.Minute {
		t.Errorf("api: %+v", api)
	}
	if d := limits[listenerDrain]; d.write != 10*time.Second+serverGrace {
		t.Errorf("drain: %+v", d)
	}
	if total := maxAPIConns + maxMetricsConns + maxAdminConns + maxDrainConns; total > 1024 {
		t.Errorf("the caps add up to %d connections", total)
	}
}
