// Tests of `haptic push`: agents on fake HAProxies taking a reload, a
// runtime change and a no-op, each line saying why; the summary, --expect
// and --quiet; the time limits against hung agents; the progress line on a
// terminal; the exit status when an agent does not take the plan; a
// canary not ready after the push; the usage errors.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// pushEnv is the environment that carries the test agents' credentials.
var pushEnv = map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": testAgentPass}

// agentLines are the lines of a push's output that start with one of the
// URLs, sorted.
func agentLines(out string, urls ...string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		for _, u := range urls {
			if strings.HasPrefix(l, u+": ") {
				lines = append(lines, l)
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// copyDir copies a testdata directory into a temp directory, with extra
// text appended to its haproxy.cfg.
func copyDir(t testing.TB, name, appendConfig string) string {
	t.Helper()
	dst := t.TempDir()
	src := testDir(name)
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == "haproxy.cfg" {
			b = append(b, appendConfig...)
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestPushCommandToTwoAgents(t *testing.T) {
	a, b := startCLIAgent(t, nil), startCLIAgent(t, nil)
	v1, v2 := planOf(t, "shop-v1"), planOf(t, "shop-v2")
	withAPI := copyDir(t, "shop-v2", "\nbackend api-servers\n    server api1 192.168.1.20:80\n")

	for _, step := range []struct {
		dir, id string
		line    string // per agent, after "<url>: "
		summary string
	}{
		{testDir("shop-v1"), v1, `reload: no baseline; reloaded in \d+ ms, worker pid \d+`,
			"summary: runtime 0, file_only 0, reload 2, scheduled 0, noop 0, failed 0"},
		{testDir("shop-v2"), v2, `runtime: map_add`,
			"summary: runtime 2, file_only 0, reload 0, scheduled 0, noop 0, failed 0"},
		{testDir("shop-v2"), v2, `noop: the pod already holds this plan`,
			"summary: runtime 0, file_only 0, reload 0, scheduled 0, noop 2, failed 0"},
		{withAPI, planOfDir(t, withAPI), `reload: core section backend api-servers added; reloaded in \d+ ms, worker pid \d+`,
			"summary: runtime 0, file_only 0, reload 2, scheduled 0, noop 0, failed 0"},
	} {
		r := runBinary(t, pushEnv, "push", "--agent", a.URL(), "--agent", b.URL(), "--parallel", "2", step.dir)
		if r.code != exitOK || r.err != "" {
			t.Fatalf("push %s: code %d stderr %q stdout %q", step.dir, r.code, r.err, r.out)
		}
		lines := strings.Split(strings.TrimSuffix(r.out, "\n"), "\n")
		if len(lines) != 4 || lines[2] != step.summary || lines[3] != fmt.Sprintf("plan %s: 2 of 2 agent(s) took it", step.id) {
			t.Fatalf("push %s printed %q", step.dir, lines)
		}
		// One line per agent, in the order they finished.
		got := agentLines(r.out, a.URL(), b.URL())
		for i, url := range slices.Sorted(slices.Values([]string{a.URL(), b.URL()})) {
			if i >= len(got) || !regexp.MustCompile("^"+regexp.QuoteMeta(url)+": "+step.line+"$").MatchString(got[i]) {
				t.Errorf("push %s: lines %q, want %s: %s", step.dir, got, url, step.line)
			}
		}
		for _, agent := range []*testAgent{a, b} {
			if st := agentState(t, agent); st.AppliedPlanID != step.id || !st.AppliedPlanStored {
				t.Errorf("after push %s: applied %s stored %t, want %s stored", step.dir, st.AppliedPlanID, st.AppliedPlanStored, step.id)
			}
		}
	}
	if got := a.fake.MapEntries("maps/host.map"); len(got) != 2 {
		t.Errorf("the worker's map holds %v, want both entries", got)
	}
}

// planOfDir is the plan id of a directory.
func planOfDir(t *testing.T, dir string) string {
	t.Helper()
	p, err := haptic.PlanFromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// An unexpected reload on one pod among several fails the push and is
// named under the summary; --quiet prints only that and the summary.
func TestPushCommandExpectAndQuiet(t *testing.T) {
	a, b, c := startCLIAgent(t, nil), startCLIAgent(t, nil), startCLIAgent(t, nil)
	if r := runCLI(t, pushEnv, "push", "--agent", a.URL(), "--agent", b.URL(), testDir("shop-v1")); r.code != exitOK {
		t.Fatalf("first push: %d %q", r.code, r.out)
	}
	// c never took shop-v1: it has no baseline, so shop-v2 reloads it.
	args := []string{"push", "--agent", a.URL(), "--agent", b.URL(), "--agent", c.URL(), "--expect", "runtime", "--quiet", testDir("shop-v2")}
	r := runBinary(t, pushEnv, args...)
	want := "summary: runtime 2, file_only 0, reload 1, scheduled 0, noop 0, failed 0\n" +
		"unexpected (--expect runtime):\n" +
		"  " + c.URL() + ": reload: no baseline; reloaded in "
	if r.code != exitFailure || !strings.HasPrefix(r.out, want) ||
		!strings.HasSuffix(r.out, fmt.Sprintf("plan %s: 3 of 3 agent(s) took it, 1 not as --expect says\n", planOf(t, "shop-v2"))) {
		t.Errorf("--expect runtime --quiet: code %d stdout\n%s\nwant it to start\n%s", r.code, r.out, want)
	}
	if strings.Contains(r.out, a.URL()) || strings.Contains(r.out, b.URL()) {
		t.Errorf("--quiet printed the agents that did what was expected:\n%s", r.out)
	}

	// Pods already on the plan answer noop; a set of outcomes allows both.
	r = runBinary(t, pushEnv, "push", "--agent", a.URL(), "--agent", c.URL(), "--expect", "runtime,noop", testDir("shop-v2"))
	if r.code != exitOK || !strings.Contains(r.out, "noop 2, failed 0\n") {
		t.Errorf("--expect runtime,noop: code %d stdout\n%s", r.code, r.out)
	}
	r = runCLI(t, nil, "push", "--agent", a.URL(), "--expect", "reloaded", testDir("shop-v2"))
	if r.code != exitUsage || !strings.Contains(r.err, `--expect "reloaded" is not one of runtime, file_only, reload, scheduled, noop`) {
		t.Errorf("a bad --expect: code %d stderr %q", r.code, r.err)
	}
}

// hungAgent accepts connections and never answers them, until the test
// ends.
func hungAgent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return "http://" + ln.Addr().String()
}

// applyHangs fronts a real agent: every request passes through except the
// apply, which is never answered.
func applyHangs(t *testing.T, agent *testAgent) string {
	t.Helper()
	target, _ := url.Parse(agent.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == haptic.PathApply {
			// The request's context ends with the connection only once the
			// body is read.
			io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A hung agent costs its --timeout and no more, whichever step hangs, and
// the line says which step and after how long; hung agents do not hold up
// the others; the --deadline stops the push.
func TestPushCommandTimeLimits(t *testing.T) {
	good, stuck := startCLIAgent(t, nil), startCLIAgent(t, nil)
	hung := []string{hungAgent(t), hungAgent(t), hungAgent(t)}
	applyHung := applyHangs(t, stuck)
	args := []string{"push", "--timeout", "1s", "--agent", good.URL(), "--agent", applyHung}
	for _, h := range hung {
		args = append(args, "--agent", h)
	}
	start := time.Now()
	r := runBinary(t, pushEnv, append(args, testDir("shop-v1"))...)
	took := time.Since(start)
	if r.code != exitFailure || !strings.Contains(r.out, "summary: runtime 0, file_only 0, reload 1, scheduled 0, noop 0, failed 4\n") {
		t.Errorf("code %d stdout\n%s", r.code, r.out)
	}
	stateTimeout := regexp.MustCompile(`: error: timed out after 1\.\ds waiting for GET /v1/state \(the state read\): the agent did not answer\n`)
	for _, h := range hung {
		if !regexp.MustCompile("(?m)^  " + regexp.QuoteMeta(h) + stateTimeout.String()).MatchString(r.out) {
			t.Errorf("hung agent %s: stdout\n%s", h, r.out)
		}
	}
	applyTimeout := `: error: timed out after 1\.\ds waiting for POST /v1/apply \(the apply\): the agent did not answer`
	if !regexp.MustCompile("(?m)^  " + regexp.QuoteMeta(applyHung) + applyTimeout + "$").MatchString(r.out) {
		t.Errorf("an agent whose apply hangs: stdout\n%s", r.out)
	}
	// All of them at once (the default parallelism): about one timeout.
	if took > 5*time.Second {
		t.Errorf("the push took %s with a 1 s --timeout", took)
	}

	// One at a time, the deadline stops the push: the agent in flight is
	// stopped, the ones after it are not pushed.
	args = []string{"push", "--parallel", "1", "--timeout", "1s", "--deadline", "1500ms"}
	for _, h := range hung {
		args = append(args, "--agent", h)
	}
	r = runBinary(t, pushEnv, append(args, testDir("shop-v1"))...)
	if r.code != exitFailure ||
		!strings.Contains(r.out, hung[0]+": error: timed out after 1.") ||
		!regexp.MustCompile(regexp.QuoteMeta(hung[1])+`: error: stopped after 0\.\ds: the --deadline of 1\.5s passed\n`).MatchString(r.out) ||
		!strings.Contains(r.out, hung[2]+": error: not pushed: the --deadline of 1.5s passed before this agent's turn\n") {
		t.Errorf("--deadline: code %d stdout\n%s", r.code, r.out)
	}
}

// On a terminal the push keeps one progress line, redrawn in place, that
// names the agents still pending; elsewhere it prints plain lines.
func TestPushCommandProgress(t *testing.T) {
	good := startCLIAgent(t, nil)
	hung := hungAgent(t)
	args := []string{"push", "--timeout", "1500ms", "--agent", good.URL(), "--agent", hung, testDir("shop-v1")}
	var out, errOut strings.Builder
	code := run(context.Background(), args, stdio{out: &out, err: &errOut, terminal: true,
		getenv: func(k string) string {
			if k == "COLUMNS" {
				return "200"
			}
			return pushEnv[k]
		}})
	text := out.String()
	if code != exitFailure || !strings.Contains(text, clearLine+"[1/2 done, 0 failed] pending 1: "+hung+" ") {
		t.Errorf("code %d: no progress line naming the hung agent alone:\n%q", code, text)
	}
	// The agents' lines and the summary are whole lines after the last
	// redraw is cleared.
	last := strings.LastIndex(text, clearLine)
	if tail := text[last+len(clearLine):]; !strings.HasPrefix(tail, "summary: ") && !strings.HasPrefix(tail, hung+": error: ") {
		t.Errorf("after the last progress line: %q", tail)
	}
	r := runCLI(t, nil, "push", "--timeout", "1s", "--agent", hung, testDir("shop-v1"))
	if strings.Contains(r.out, "\x1b[") || strings.Contains(r.out, "\r") {
		t.Errorf("escape sequences when stdout is not a terminal: %q", r.out)
	}
}

func TestPushCommandFailsWhenAnAgentDoesNotTakeThePlan(t *testing.T) {
	a := startCLIAgent(t, nil)
	down := "http://127.0.0.1:1"
	r := runCLI(t, pushEnv, "push", "--agent", down, "--agent", a.URL(), testDir("shop-v1"))
	if r.code != exitFailure {
		t.Errorf("code %d, want 1", r.code)
	}
	if !strings.Contains(r.out, down+": error: cannot reach the agent for GET /v1/state (the state read): ") ||
		!strings.Contains(r.out, a.URL()+": reload: no baseline; reloaded in ") ||
		!strings.Contains(r.out, "failed:\n  "+down+": error: ") ||
		!strings.HasSuffix(r.out, ": 1 of 2 agent(s) took it\n") {
		t.Errorf("stdout %q", r.out)
	}

	// A rejected reload is a NACK: the pod rolled back and did not take it,
	// and the plan it ran before still serves. HAProxy's message is
	// printed once, in the summary: its alerts and warnings first, one per
	// line; its notices left out.
	a.fake.With(func(m *haptic.FakeModel) {
		m.ReloadFails = true
		m.ReloadLog = "[NOTICE]   (7) : haproxy version is 3.0.11\n[NOTICE]   (7) : path to executable is /usr/sbin/haproxy\n" +
			"[ALERT]    (7) : config : parsing [haproxy.cfg:18] : unknown keyword 'inter5s'\n" +
			"[ALERT]    (7) : config : Fatal errors found in configuration.\n[WARNING]  (7) : Loading failure!"
	})
	r = runBinary(t, pushEnv, "push", "--agent", a.URL(), testDir("shop-v3"))
	want := "summary: runtime 0, file_only 0, reload 0, scheduled 0, noop 0, failed 1\nfailed:\n" +
		"  " + a.URL() + ": rejected at stage \"reload\"; the previous configuration is still serving (plan " + planOf(t, "shop-v1") + "):\n" +
		"      [ALERT] (7) : config : parsing [haproxy.cfg:18] : unknown keyword 'inter5s'\n" +
		"      [ALERT] (7) : config : Fatal errors found in configuration.\n" +
		"      [WARNING] (7) : Loading failure!\n"
	if r.code != exitFailure || !strings.HasPrefix(r.out, want) || strings.Contains(r.out, "NOTICE") ||
		strings.Count(r.out, "unknown keyword") != 1 || !strings.HasSuffix(r.out, ": 0 of 1 agent(s) took it\n") {
		t.Errorf("rejected reload: code %d stdout\n%s\nwant it to start\n%s", r.code, r.out, want)
	}
	// The last apply in the agent's state shows the same order.
	st := runBinary(t, nil, "agent", "state", "--base-dir", a.base)
	if !strings.Contains(st.out, "error reload: [ALERT] (7) : config : parsing [haproxy.cfg:18] : unknown keyword 'inter5s'\n    [ALERT]") ||
		strings.Contains(st.out, "NOTICE") {
		t.Errorf("agent state after the rejected reload:\n%s", st.out)
	}
}

// ackWithError fronts a real agent and adds to each ACK of an apply the
// error of files not yet in place, as an agent whose disk refused the
// install answers: the apply stands, and the agent retries.
func ackWithError(t *testing.T, agent *testAgent) string {
	t.Helper()
	target, _ := url.Parse(agent.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != haptic.PathApply || resp.StatusCode != http.StatusOK {
			return nil
		}
		var result haptic.ApplyResult
		body, err := io.ReadAll(resp.Body)
		if err != nil || json.Unmarshal(body, &result) != nil {
			return fmt.Errorf("not an apply result: %q", body)
		}
		if result.OK {
			result.Error = &haptic.ApplyError{Stage: string(haptic.StageWrite), Message: filesOwed + ": write maps/host.map: no space left on device"}
		}
		body, _ = json.Marshal(result)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}

// An ACK whose files are not in place yet is not a plain success: the
// answer's error is shown once, under the summary, and the push exits 3;
// an agent that failed beside it makes it 1.
func TestPushExitsThreeOnAnAcknowledgedError(t *testing.T) {
	a, b := startCLIAgent(t, nil), startCLIAgent(t, nil)
	owed := ackWithError(t, a)
	r := runBinary(t, pushEnv, "push", "--agent", owed, "--agent", b.URL(), testDir("shop-v1"))
	want := "summary: runtime 0, file_only 0, reload 2, scheduled 0, noop 0, failed 0\n" +
		"acknowledged with an error:\n" +
		"  " + owed + ": reload: no baseline; reloaded in "
	if r.code != exitAckError || !strings.Contains(r.out, want) ||
		!strings.Contains(r.out, "; "+filesOwed+": write maps/host.map: no space left on device\n") ||
		strings.Count(r.out, owed) != 1 ||
		!strings.HasSuffix(r.out, fmt.Sprintf("plan %s: 2 of 2 agent(s) took it, 1 with an error in the ACK\n", planOf(t, "shop-v1"))) {
		t.Errorf("code %d, want %d; stdout\n%s\nwant it to hold\n%s", r.code, exitAckError, r.out, want)
	}
	// The ACK stands: the pod holds the plan.
	if st := agentState(t, a); st.AppliedPlanID != planOf(t, "shop-v1") {
		t.Errorf("applied %q", st.AppliedPlanID)
	}
	// A failure wins over an acknowledged error.
	r = runBinary(t, pushEnv, "push", "--agent", owed, "--agent", "http://127.0.0.1:1", testDir("shop-v2"))
	if r.code != exitFailure || !strings.Contains(r.out, "\nfailed:\n") || !strings.Contains(r.out, "\nacknowledged with an error:\n") {
		t.Errorf("with a failed agent too: code %d, want %d; stdout\n%s", r.code, exitFailure, r.out)
	}
	// -h documents the statuses.
	if h := runCLI(t, nil, "push", "-h"); h.code != exitOK || !strings.Contains(h.err, "3 every agent took the plan and some answered with an error beside the ACK") ||
		!strings.Contains(h.err, "1 wins over 3") {
		t.Errorf("push -h: %q", h.err)
	}
}

func TestPushAllBoundsParallelism(t *testing.T) {
	urls := make([]string, 20)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://agent-%02d", i)
	}
	for _, parallel := range []int{1, 3, 8, 50} {
		var running, peak atomic.Int32
		var mu sync.Mutex
		seen := map[string]bool{}
		var out strings.Builder
		o := pushOptions{parallel: parallel, timeout: time.Minute, deadline: time.Minute}
		r := pushAll(context.Background(), &out, urls, o, func(ctx context.Context, url string, _ bool) pushResult {
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			seen[url] = true
			mu.Unlock()
			if strings.HasSuffix(url, "7") {
				return pushResult{err: errors.New("connection refused")}
			}
			return pushResult{result: &haptic.ApplyResult{OK: true, Mode: haptic.ResultRuntime,
				OpResults: []haptic.OpResult{{Kind: haptic.OpMapAdd, OK: true}}}}
		}, agentCredentials{})
		if want := min(parallel, len(urls)); int(peak.Load()) > want {
			t.Errorf("parallel %d: %d pushes at once", parallel, peak.Load())
		}
		if len(seen) != len(urls) || r.counts[outcomeFailed] != 2 || r.counts[haptic.ResultRuntime] != len(urls)-2 {
			t.Errorf("parallel %d: reached %d agents, counts %v; want %d and 2 failed", parallel, len(seen), r.counts, len(urls))
		}
		// Each agent's line is printed once: a failure's in the summary.
		r.printSummary("p1")
		for _, url := range urls {
			if n := strings.Count(out.String(), url+": "); n != 1 {
				t.Errorf("parallel %d: %s is named %d times, want once", parallel, url, n)
			}
		}
		if !strings.Contains(out.String(), "\nfailed:\n  http://agent-07: error: connection refused\n  http://agent-17: error: connection refused\n") ||
			!strings.HasPrefix(out.String(), "http://agent-") || !strings.Contains(out.String(), "http://agent-00: runtime: map_add\n") {
			t.Errorf("parallel %d: output %q", parallel, out.String())
		}
	}
}

func TestPushLine(t *testing.T) {
	reload := &haptic.Decision{Verdict: haptic.VerdictReload, Reasons: []string{"backend api-servers added", "file errors/503.http changed and is declared reload-on-change"}}
	runtime := &haptic.Decision{Verdict: haptic.VerdictRuntime}
	for _, c := range []struct {
		result   *haptic.ApplyResult
		decision *haptic.Decision
		line     string
		ok       bool
	}{
		{&haptic.ApplyResult{OK: true, Mode: "reload", Reload: &haptic.ReloadInfo{Performed: true, OK: true, TookMs: 87, WorkerPID: 12}},
			reload, "reload: backend api-servers added; file errors/503.http changed and is declared reload-on-change; reloaded in 87 ms, worker pid 12", true},
		{&haptic.ApplyResult{OK: true, Mode: "scheduled", Reload: &haptic.ReloadInfo{ScheduledAt: "2026-03-01T10:00:05Z"}},
			reload, "scheduled: backend api-servers added; file errors/503.http changed and is declared reload-on-change; reload scheduled at 2026-03-01T10:00:05Z", true},
		{&haptic.ApplyResult{OK: true, Mode: "reload", OpResults: []haptic.OpResult{{Kind: "map_add", OK: true}, {Kind: "map_set", OK: false, Output: "[3]: no such map"}},
			Reload: &haptic.ReloadInfo{Performed: true, OK: true, TookMs: 5, WorkerPID: 3}},
			runtime, "reload: HAProxy refused map_set ([3]: no such map), so the agent reloaded instead; reloaded in 5 ms, worker pid 3", true},
		{&haptic.ApplyResult{OK: true, Mode: "reload", Reload: &haptic.ReloadInfo{Performed: true, OK: true, TookMs: 5, WorkerPID: 3}},
			runtime, "reload: the push decided runtime, but the agent reloaded (its baseline moved during the push, or it could not run the ops against it); reloaded in 5 ms, worker pid 3", true},
		{&haptic.ApplyResult{OK: true, Mode: "runtime", OpResults: []haptic.OpResult{{Kind: "map_add", OK: true}, {Kind: "map_add", OK: true}, {Kind: "server_set_weight", OK: true}}},
			runtime, "runtime: map_add ×2, server_set_weight", true},
		{&haptic.ApplyResult{OK: true, Mode: "noop"}, nil, "noop: the pod already holds this plan", true},
		{&haptic.ApplyResult{OK: true, Mode: "file_only"}, &haptic.Decision{Verdict: haptic.VerdictFileOnly, Reasons: []string{"map maps/x.map is not loaded at runtime, its file is written only"}},
			"file_only: map maps/x.map is not loaded at runtime, its file is written only", true},
		// An ACK that carries an error shows it.
		{&haptic.ApplyResult{OK: true, Mode: "runtime", OpResults: []haptic.OpResult{{Kind: "map_add", OK: true}},
			Error: &haptic.ApplyError{Stage: "write", Message: filesOwed + ": no space left on device"}},
			runtime, "runtime: map_add; " + filesOwed + ": no space left on device", true},
		// A NACK says what serves now, then HAProxy's message, once.
		{&haptic.ApplyResult{OK: false, Mode: haptic.ResultRejected, RunningPlanID: "p1", Rollback: &haptic.RollbackInfo{Performed: true},
			Error: &haptic.ApplyError{Stage: "reload", Message: "line one\nline two\n"}},
			nil, "rejected at stage \"reload\"; the previous configuration is still serving (plan p1):\n    line one\n    line two", false},
		{&haptic.ApplyResult{OK: false, Mode: haptic.ResultRejected, Error: &haptic.ApplyError{Stage: "write"}},
			nil, "rejected at stage \"write\"; the agent no longer names a running plan, so what HAProxy serves now is not known (haptic agent state shows its worker)", false},
	} {
		if line, ok := pushLine(pushResult{result: c.result, decision: c.decision}); line != c.line || ok != c.ok {
			t.Errorf("pushLine = %q, %t; want %q, %t", line, ok, c.line, c.ok)
		}
	}
}

// filesOwed is how the agent's answer starts for an ACK whose files are
// not in place yet.
const filesOwed = "acknowledged, but its files are not in place yet: the agent retries, and is not ready until they are"

// What a refused push says serves now: only what the answer (and the
// state read before it) can vouch for.
func TestServingAfterARefusal(t *testing.T) {
	fresh, ran := &haptic.State{}, &haptic.State{RunningPlanID: "p0"}
	for _, c := range []struct {
		name   string
		result haptic.ApplyResult
		before *haptic.State
		want   string
	}{
		{"HAProxy refused the reload: the worker it kept serves on",
			haptic.ApplyResult{RunningPlanID: "p0", Rollback: &haptic.RollbackInfo{Performed: true}}, ran,
			"the previous configuration is still serving (plan p0)"},
		{"ops had run: the restored files were reloaded",
			haptic.ApplyResult{RunningPlanID: "p0", Rollback: &haptic.RollbackInfo{Performed: true, Reloaded: true}}, ran,
			"the previous configuration is serving again (plan p0): HAProxy reloaded the restored files"},
		{"restored and reloaded on a pod that ran no plan before",
			haptic.ApplyResult{Rollback: &haptic.RollbackInfo{Performed: true, Reloaded: true}}, fresh,
			"the previous configuration is serving again: HAProxy reloaded the restored files"},
		{"a first push refused",
			haptic.ApplyResult{Rollback: &haptic.RollbackInfo{Performed: true}}, fresh,
			"the pod ran no pushed plan before this push, and the agent names none now"},
		{"the recovery reload failed: the agent vouches for nothing",
			haptic.ApplyResult{Rollback: &haptic.RollbackInfo{Performed: true}}, ran,
			"the agent no longer names a running plan, so what HAProxy serves now is not known (haptic agent state shows its worker)"},
		{"nothing read before, nothing named after",
			haptic.ApplyResult{}, nil,
			"the agent no longer names a running plan, so what HAProxy serves now is not known (haptic agent state shows its worker)"},
	} {
		if got := servingAfter(&c.result, c.before); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestPushCommandUsage(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no agent", []string{testDir("shop-v1")}, exitUsage, "at least one --agent, or --agents-dns, is required"},
		{"both ways", []string{"--agent", "http://a:1", "--agents-dns", "http://agents.test:1", testDir("shop-v1")}, exitUsage,
			"--agent and --agents-dns name the fleet two ways; give one"},
		{"negative canary", []string{"--agent", "http://a:1", "--canary", "-1", testDir("shop-v1")}, exitUsage, "--canary must not be negative, got -1"},
		{"not a fleet URL", []string{"--agents-dns", "agents.test:5555", testDir("shop-v1")}, exitFailure,
			`haptic push: --agents-dns "agents.test:5555" is not a URL such as https://haptic-agent.namespace.svc:5555`},
		{"no directory", []string{"--agent", "http://a:1"}, exitUsage, "want one directory, got 0 arguments"},
		{"two directories", []string{"--agent", "http://a:1", "a", "b"}, exitUsage, "want one directory, got 2 arguments"},
		{"zero parallel", []string{"--agent", "http://a:1", "--parallel", "0", testDir("shop-v1")}, exitUsage, "--parallel must be at least 1"},
		{"zero timeout", []string{"--agent", "http://a:1", "--timeout", "0s", testDir("shop-v1")}, exitUsage, "--timeout must be positive"},
		{"zero deadline", []string{"--agent", "http://a:1", "--deadline", "0s", testDir("shop-v1")}, exitUsage, "--deadline must be positive"},
		{"same agent twice", []string{"--agent", "http://a:1", "--agent", "http://a:1", testDir("shop-v1")}, exitUsage, "--agent http://a:1 is given twice"},
		{"not a directory", []string{"--agent", "http://a:1", testDir("absent")}, exitFailure, "haptic push: plan from "},
		{"previous not a directory", []string{"--agent", "http://a:1", "--previous", testDir("absent"), testDir("shop-v1")}, exitFailure, "haptic push: --previous: plan from "},
		// The next render's error is the one reported when both fail.
		{"neither a directory", []string{"--agent", "http://a:1", "--previous", testDir("absent"), testDir("gone")}, exitFailure, "haptic push: plan from "},
		{"key without certificate", []string{"--agent", "https://a:1", "--tls-key", "k.pem", testDir("shop-v1")}, exitFailure, "--tls-cert and --tls-key go together"},
		{"TLS over http", []string{"--agent", "http://127.0.0.1:1", "--tls-server-name", "agent", testDir("shop-v1")}, exitFailure, "must be https when TLS is set"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"push"}, c.args...)...)
			if r.code != c.code || !strings.Contains(r.err+r.out, c.err) || strings.Contains(r.err, "haptic: ") {
				t.Errorf("code %d stderr %q stdout %q; want %d and %q", r.code, r.err, r.out, c.code, c.err)
			}
		})
	}
}

// TestPushSendsPatchesCutFromThePreviousRender: with --previous naming the
// render the agent holds, a one-entry change in a large map travels as the
// changed bytes only; without it, the whole map travels.
func TestPushSendsPatchesCutFromThePreviousRender(t *testing.T) {
	agent := startCLIAgent(t, nil)
	target, _ := url.Parse(agent.URL())
	var applyBytes atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(target)
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == haptic.PathApply {
			body, _ := io.ReadAll(r.Body)
			applyBytes.Add(int64(len(body)))
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			r.ContentLength = int64(len(body))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)

	// A large map: the change must be small against it.
	var m strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&m, "host-%05d.example.com be-%d\n", i, i%7)
	}
	v1 := copyDir(t, "shop-v1", "")
	if err := os.WriteFile(filepath.Join(v1, "maps/host.map"), []byte(m.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := copyDir(t, "shop-v1", "")
	if err := os.WriteFile(filepath.Join(v2, "maps/host.map"), []byte(m.String()+"new.example.com be-new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runBinary(t, pushEnv, "push", "--agent", counted.URL, v1); r.code != exitOK {
		t.Fatalf("push v1: %d %q %q", r.code, r.out, r.err)
	}
	applyBytes.Store(0)
	r := runBinary(t, pushEnv, "push", "--agent", counted.URL, "--previous", v1, v2)
	if r.code != exitOK || !strings.Contains(r.out, ": runtime: map_add") {
		t.Fatalf("push v2 with --previous: %d %q %q", r.code, r.out, r.err)
	}
	size := int64(m.Len())
	if sent := applyBytes.Load(); sent >= size/4 {
		t.Errorf("the apply sent %d bytes for a one-entry change in a %d-byte map", sent, size)
	}
	if got := agent.fake.MapEntries("maps/host.map"); !slices.ContainsFunc(got, func(e haptic.MapEntry) bool { return e.Key == "new.example.com" }) {
		t.Errorf("the worker lacks the new entry")
	}
	// Without --previous the map travels whole.
	v3 := copyDir(t, "shop-v1", "")
	os.WriteFile(filepath.Join(v3, "maps/host.map"), []byte(m.String()+"new.example.com be-new\nthird.example.com be-3\n"), 0o644)
	applyBytes.Store(0)
	if r := runBinary(t, pushEnv, "push", "--agent", counted.URL, v3); r.code != exitOK {
		t.Fatalf("push v3: %d %q %q", r.code, r.out, r.err)
	}
	if sent := applyBytes.Load(); sent < size {
		t.Errorf("without --previous the apply sent %d bytes, want the whole %d-byte map", sent, size)
	}
}

// stateReads fronts a real agent and records the query of every state read.
func stateReads(t *testing.T, agent *testAgent) (string, func() []string) {
	t.Helper()
	target, _ := url.Parse(agent.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var reads []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == haptic.PathState {
			mu.Lock()
			reads = append(reads, "?"+r.URL.RawQuery)
			mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(reads)
	}
}

// TestPushWithPreviousReadsNoBlobFromPodsThatHoldIt: a pod that holds the
// previous render is never asked for its stored blob; a pod that holds
// another render is asked once, and its blob is the baseline the line's
// reasons come from.
func TestPushWithPreviousReadsNoBlobFromPodsThatHoldIt(t *testing.T) {
	a, b := startCLIAgent(t, nil), startCLIAgent(t, nil)
	for agent, dir := range map[*testAgent]string{a: "shop-v1", b: "shop-v3"} {
		if r := runBinary(t, pushEnv, "push", "--agent", agent.URL(), testDir(dir)); r.code != exitOK {
			t.Fatalf("push %s: %d %q %q", dir, r.code, r.out, r.err)
		}
	}
	aURL, aReads := stateReads(t, a)
	bURL, bReads := stateReads(t, b)
	r := runBinary(t, pushEnv, "push", "--agent", aURL, "--agent", bURL, "--previous", testDir("shop-v1"), testDir("shop-v2"))
	if r.code != exitOK {
		t.Fatalf("push: %d %q %q", r.code, r.out, r.err)
	}
	if got := agentLines(r.out, aURL); len(got) != 1 || got[0] != aURL+": runtime: map_add" {
		t.Errorf("the pod holding the previous render: %q", got)
	}
	if got := agentLines(r.out, bURL); len(got) != 1 || !strings.HasPrefix(got[0], bURL+": reload: ") || strings.Contains(got[0], "no baseline") {
		t.Errorf("the pod holding another render: %q, want a reload with the reasons from its own baseline", got)
	}
	// The push's read and Deploy's, both without the blob; for the other
	// pod the push reads the blob once, and Deploy then needs none.
	if got := aReads(); !slices.Equal(got, []string{"?plan=0", "?plan=0"}) {
		t.Errorf("state reads of the pod holding the previous render: %q", got)
	}
	if got := bReads(); !slices.Equal(got, []string{"?plan=0", "?", "?plan=0"}) {
		t.Errorf("state reads of the pod holding another render: %q", got)
	}
	for _, agent := range []*testAgent{a, b} {
		if st := agentState(t, agent); st.AppliedPlanID != planOfDir(t, testDir("shop-v2")) {
			t.Errorf("applied %s, want shop-v2's plan", st.AppliedPlanID)
		}
	}
}

// bigMapDir writes shop-v1 with a host map of 236,000 tenants (the
// platform of the big-map benchmarks at the repository root), the tenant
// in the middle pointing at backend.
func bigMapDir(b testing.TB, backend string) string {
	dir := copyDir(b, "shop-v1", "")
	var m strings.Builder
	for i := range 236_000 {
		value := fmt.Sprintf("backend_%d", i%32)
		if i == 118_000 {
			value = backend
		}
		fmt.Fprintf(&m, "tenant-%06d.example.com %s\n", i, value)
	}
	if err := os.WriteFile(filepath.Join(dir, "maps/host.map"), []byte(m.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkPushOneEntryBigMap times `haptic push --previous` of a one-entry
// change of that map to one agent on the fake HAProxy, back and forth, end
// to end: the command runs as its own process (reading both directories,
// encoding the blob, the deploy and the blob's upload). It reports the
// median push in milliseconds. Run it with
//
//	go test -run '^$' -bench BenchmarkPushOneEntryBigMap -benchtime 5x ./cmd/haptic/
func BenchmarkPushOneEntryBigMap(b *testing.B) {
	agent := startCLIAgent(b, nil)
	dirs := [2]string{bigMapDir(b, "backend_0"), bigMapDir(b, "backend_moved")}
	if r := runBinary(b, pushEnv, "push", "--agent", agent.URL(), dirs[0]); r.code != exitOK {
		b.Fatalf("push: %d %q %q", r.code, r.out, r.err)
	}
	var took []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		r := runBinary(b, pushEnv, "push", "--agent", agent.URL(), "--previous", dirs[i%2], dirs[(i+1)%2])
		took = append(took, time.Since(start))
		if r.code != exitOK || !strings.Contains(r.out, ": runtime: map_set") {
			b.Fatalf("push: %d %q %q", r.code, r.out, r.err)
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "push-ms")
}

// notReadyAfterApply fronts a real agent: every request passes through,
// and once an apply has, /readyz answers 503 why, as an agent whose disk
// owes the files it acknowledged does.
func notReadyAfterApply(t *testing.T, agent *testAgent, why string) string {
	t.Helper()
	target, _ := url.Parse(agent.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	var applied atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == haptic.PathReadyz && applied.Load() {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
		if r.URL.Path == haptic.PathApply {
			applied.Store(true)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A canary that took the plan and is not ready after it stops the push,
// through the command's own wiring: the push asks each canary's /readyz
// once its apply is answered, prints the agent's reason, and leaves the
// agents after the canaries untouched.
func TestPushCommandStopsAtACanaryNotReadyAfterThePush(t *testing.T) {
	a, b := startCLIAgent(t, nil), startCLIAgent(t, nil)
	const why = "the agent's tree is not yet what its state says: no space left on device"
	canary := notReadyAfterApply(t, a, why)
	r := runCLI(t, pushEnv, "push", "--canary", "1", "--agent", canary, "--agent", b.URL(), testDir("shop-v1"))
	if st := agentState(t, b); st.Generation != 0 || st.AppliedPlanID != "" {
		t.Errorf("the agent after the canary was pushed: generation %d, applied %q", st.Generation, st.AppliedPlanID)
	}
	took := regexp.QuoteMeta(canary) + `: reload: no baseline; reloaded in \d+ ms, worker pid \d+; not ready after the push: ` + regexp.QuoteMeta(why)
	matchLines(t, r.out,
		`summary: runtime 0, file_only 0, reload 1, scheduled 0, noop 0, failed 0`,
		`not ready after the push:`,
		`  `+took,
		`untouched \(the canary of 1 stopped the push: 1 not ready after the push\):`,
		`  `+regexp.QuoteMeta(b.URL()),
		`plan `+planOf(t, "shop-v1")+`: 1 of 2 agent\(s\) took it, 1 not ready after it, 1 left untouched`)
	if r.code != exitFailure {
		t.Errorf("code %d, want %d", r.code, exitFailure)
	}
}
