// Tests of the agent's readiness (agent_readiness.go): /readyz waits at
// startup for both HAProxy sockets and stays true after a failed recovery
// reload; a state read before startup finishes says what the agent waits
// for, or waits and gives up with its caller; and after startup /readyz
// and verified state reads follow HAProxy going away and coming back, on
// the fake and on a real HAProxy.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadinessWaitsForEveryCondition(t *testing.T) {
	fake := startTestFake(t, "")
	for _, missing := range []string{"worker", "master"} {
		t.Run("without the "+missing, func(t *testing.T) {
			dir := shortTempDir(t)
			cfg := testAgentConfig(t, fake)
			cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
			a, _ := launchTestAgent(t, cfg, false)
			link := func(target, name string) {
				if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			if missing == "worker" {
				link(fake.MasterSocket(), "m.sock")
			} else {
				link(fake.WorkerSocket(), "w.sock")
			}
			for range 4 { // several probe rounds
				if code, body := getText(t, a, PathReadyz); code != http.StatusServiceUnavailable || body != "initialising\n" {
					t.Fatalf("readyz = %d %q", code, body)
				}
				if a.Ready() {
					t.Fatal("ready without the " + missing)
				}
				time.Sleep(150 * time.Millisecond)
			}
			if code, body := getText(t, a, PathHealthz); code != http.StatusOK || body != "ok\n" {
				t.Errorf("healthz before ready = %d %q", code, body)
			}
			if missing == "worker" {
				link(fake.WorkerSocket(), "w.sock")
			} else {
				link(fake.MasterSocket(), "m.sock")
			}
			waitFor(t, "readiness", a.Ready)
			if code, body := getText(t, a, PathReadyz); code != http.StatusOK || body != "ready\n" {
				t.Errorf("readyz = %d %q", code, body)
			}
		})
	}
}

func TestReadinessStaysTrueAfterAFailedRecoveryReload(t *testing.T) {
	fake, cfg, c, _ := landedThenStopped(t)
	editState(t, cfg.BaseDir, func(s *agentState, _ map[string]FileAt) { s.ReloadOwed = true })
	fake.With(func(m *FakeModel) { m.ReloadFails = true })

	a, _ := launchTestAgent(t, cfg, true)
	c = newAgentClient(t, a)
	if code, body := getText(t, a, PathReadyz); code != http.StatusOK || body != "ready\n" {
		t.Errorf("readyz = %d %q", code, body)
	}
	st := c.state("")
	if st.InvariantViolation != "recovery_reload" || metricValue(a, "invariant_violations_total", "recovery_reload") != 1 {
		t.Errorf("invariant %q", st.InvariantViolation)
	}
	// The tree is the applied plan's, but a recovery reload that failed
	// vouches for no worker.
	if st.RunningPlanID != "" || st.WorkerOpsPlanID != "" || st.AppliedPlanID != "plan-1" {
		t.Errorf("after a failed recovery reload: running %q worker ops %q applied %q", st.RunningPlanID, st.WorkerOpsPlanID, st.AppliedPlanID)
	}
	// A later apply neither takes readiness away nor needs a restart.
	fake.With(func(m *FakeModel) { m.ReloadFails = false })
	fs := seedFiles()
	if res := c.apply(c.manifest("plan-3", fs), fs); !res.OK || res.Mode != ResultReload {
		t.Errorf("apply after recovery: %+v", res)
	}
	if !a.Ready() {
		t.Error("readiness went back to false")
	}
}

// While HAProxy does not answer the startup probe, a state read answers at
// once with a 503 that names what the agent waits for; once HAProxy is
// there, the same read answers the initialised state.
func TestStateSaysWhatTheAgentWaitsFor(t *testing.T) {
	fake := startTestFake(t, "")
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	a, _ := launchTestAgent(t, cfg, false)
	c := newAgentClient(t, a)
	var code int
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		start := time.Now()
		code, _, body = c.do("GET", PathState, nil, "")
		if took := time.Since(start); took > stateInitGrace/2 {
			t.Errorf("the read took %s while HAProxy is away", took)
		}
		if code != http.StatusServiceUnavailable || !bytes.Contains(body, []byte(msgAgentInitialising)) {
			break // the first probe has failed: the read now says why
		}
	}
	var e ApplyError
	if code != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Stage != StageStartup ||
		!strings.HasPrefix(e.Message, "agent is waiting for HAProxy (worker socket "+cfg.WorkerSocket) ||
		!strings.Contains(e.Message, "no such file or directory") {
		t.Fatalf("state while HAProxy is away: %d %s", code, body)
	}
	os.Symlink(fake.WorkerSocket(), cfg.WorkerSocket)
	os.Symlink(fake.MasterSocket(), cfg.MasterSocket)
	for deadline := time.Now().Add(10 * time.Second); !a.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent never became ready")
		}
	}
	if st := c.state(""); st.HAProxy.WorkerPID != fake.Worker().WorkerPID || st.APIVersion != 1 {
		t.Errorf("state: %+v", st)
	}
}

func TestStateWaitRespectsCancellation(t *testing.T) {
	fake := startTestFake(t, "")
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	// A worker socket that accepts and never answers: the startup probe
	// neither succeeds nor fails, so a state read waits out its grace
	// (one whose probe fails is answered at once, with why).
	ln, err := net.Listen("unix", cfg.WorkerSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	a, _ := launchTestAgent(t, cfg, false)

	ctx, cancel := context.WithCancel(context.Background())
	// The recorder starts at status 0 instead of its implicit 200: any
	// WriteHeader, Write or Flush sets a status, so 0 means nothing was
	// written at all.
	rec := httptest.NewRecorder()
	rec.Code = 0
	req := httptest.NewRequestWithContext(ctx, "GET", "http://agent"+PathState, nil)
	done := make(chan struct{})
	go func() { a.handleState(rec, req); close(done) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not return on cancellation")
	}
	if rec.Code != 0 || rec.Flushed || rec.Body.Len() != 0 {
		t.Errorf("a cancelled state read wrote %d %q", rec.Code, rec.Body.String())
	}
	// Over the network the client sees no answer at all.
	rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer rcancel()
	hreq, _ := http.NewRequestWithContext(rctx, "GET", "http://"+a.Addr()+PathState, nil)
	hreq.SetBasicAuth("haptic", "s3cret")
	if resp, err := http.DefaultClient.Do(hreq); err == nil {
		resp.Body.Close()
		t.Errorf("got an answer: %d", resp.StatusCode)
	}
}

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
