// Tests of the agent's readiness after startup: /readyz and verified state
// reads follow HAProxy going away and coming back, on the fake and on a
// real HAProxy.

package haptic

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// awaitReadyz polls GET /readyz until its answer satisfies ok, for at most
// 10 s, and returns the last answer.
func awaitReadyz(t *testing.T, a *Agent, ok func(code int, body string) bool) (int, string) {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, body = getText(t, a, PathReadyz); ok(code, body) {
			break
		}
	}
	return code, body
}

// Readiness follows HAProxy after startup: /readyz turns 503 with the
// reason within seconds of the worker or the master going away, a verified
// state read fails and says why, and both come back with HAProxy.
func TestReadinessFollowsHAProxy(t *testing.T) {
	dir := shortTempDir(t)
	fake, err := StartFakeHAProxy(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Close() })
	a := startTestAgent(t, fake, nil)
	c := newAgentClient(t, a)
	if code, body := getText(t, a, PathReadyz); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("readyz %d %q", code, body)
	}

	for _, gone := range []struct {
		name, socket string
		stop         func()
	}{
		{"worker and master", fake.WorkerSocket(), func() { fake.Close() }},
		{"master", fake.MasterSocket(), func() { fake.StopMaster() }},
	} {
		t.Run(gone.name, func(t *testing.T) {
			stopped := time.Now()
			gone.stop()
			code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code != http.StatusOK })
			if took := time.Since(stopped); code != http.StatusServiceUnavailable ||
				!strings.HasPrefix(body, "haproxy unreachable: the HAProxy ") || !strings.Contains(body, gone.socket) || took > 5*time.Second {
				t.Errorf("readyz %s after HAProxy went away: %d %q", time.Since(stopped), code, body)
			}
			code, _, b := c.do("GET", PathState+"?verify=1", nil, "")
			var e ApplyError
			if code != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e.Stage != StageState ||
				!strings.HasPrefix(e.Message, "cannot verify: the HAProxy ") || !strings.Contains(e.Message, gone.socket) {
				t.Errorf("verified state without HAProxy: %d %s", code, b)
			}
			if st := c.state("?plan=0"); st.APIVersion != 1 {
				t.Errorf("an unverified state read must still answer: %+v", st)
			}

			fake.Close()
			if fake, err = StartFakeHAProxy(dir, ""); err != nil {
				t.Fatal(err)
			}
			if code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK || body != "ready\n" {
				t.Errorf("readyz after HAProxy came back: %d %q", code, body)
			}
			if st := c.state("?verify=1"); st.HAProxy.WorkerPID != fake.Worker().WorkerPID {
				t.Errorf("verified state after HAProxy came back: %+v", st.HAProxy)
			}
		})
	}
}

// restart starts the same HAProxy again on the same directory, once the
// previous process is gone, and waits until it answers.
func (h *realHAProxy) restart(t *testing.T) *realHAProxy {
	t.Helper()
	h.Stop()
	n := &realHAProxy{Dir: h.Dir, bin: h.bin, version: h.version, output: &lockedBuffer{}, exited: make(chan struct{}), fixture: h.fixture}
	n.cmd = exec.Command(h.bin, "-W", "-db", "-S", n.MasterSocket()+",level,admin", "--", filepath.Join(h.Dir, "haproxy.cfg"))
	n.cmd.Stdout, n.cmd.Stderr = n.output, n.output
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(n.Stop)
	n.waitReady(t)
	return n
}

// The readiness items against a real HAProxy: an agent started before
// HAProxy says at once what it waits for; readiness turns off within
// seconds of HAProxy stopping, a verified read fails, and both come back
// when HAProxy starts again.
func TestRealHAProxyReadiness(t *testing.T) {
	h := startRealHAProxy(t)
	h.Stop()
	cfg := testAgentConfig(t, nil)
	cfg.BaseDir = h.Dir
	cfg.WorkerSocket, cfg.MasterSocket = h.WorkerSocket(), h.MasterSocket()
	a, _ := launchTestAgent(t, cfg, false)
	c := newAgentClient(t, a)

	var code int
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, _, body = c.do("GET", PathState, nil, ""); strings.Contains(string(body), "waiting for HAProxy") {
			break
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), h.WorkerSocket()) {
		t.Fatalf("state before HAProxy: %d %s", code, body)
	}

	h = h.restart(t)
	if code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK {
		t.Fatalf("readyz once HAProxy runs: %d %q", code, body)
	}
	pid := c.state("?verify=1").HAProxy.WorkerPID

	stopped := time.Now()
	h.Stop()
	if code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code != http.StatusOK }); code != http.StatusServiceUnavailable ||
		!strings.HasPrefix(body, "haproxy unreachable: ") || time.Since(stopped) > 5*time.Second {
		t.Errorf("readyz %s after HAProxy stopped: %d %q", time.Since(stopped), code, body)
	}
	code, _, body = c.do("GET", PathState+"?verify=1", nil, "")
	var e ApplyError
	if code != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || !strings.HasPrefix(e.Message, "cannot verify: ") {
		t.Errorf("verified state of worker %d after HAProxy stopped: %d %s", pid, code, body)
	}

	h = h.restart(t)
	if code, body := awaitReadyz(t, a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK {
		t.Errorf("readyz once HAProxy is back: %d %q", code, body)
	}
	if st := c.state("?verify=1"); st.HAProxy.WorkerPID == 0 || st.HAProxy.WorkerPID == pid {
		t.Errorf("verified state once HAProxy is back shows worker %d (the old one was %d)", st.HAProxy.WorkerPID, pid)
	}
}
