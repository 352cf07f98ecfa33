// Tests of `haptic push`: two agents on two fake HAProxies taking a reload
// and then a runtime change, one line per agent, the exit status when one
// agent does not take the plan, and the usage errors.
package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

func TestPushCommandToTwoAgents(t *testing.T) {
	a, b := startCLIAgent(t, nil), startCLIAgent(t, nil)
	env := map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": testAgentPass}
	v1, v2 := planOf(t, "shop-v1"), planOf(t, "shop-v2")

	for _, step := range []struct {
		dir, id string
		line    string // per agent, after "<url>: "
	}{
		{"shop-v1", v1, `reload, 0 op\(s\), reloaded in \d+ ms, worker pid \d+`},
		{"shop-v2", v2, `runtime, 1 op\(s\), no reload`},
	} {
		r := runCLI(t, env, "push", "--agent", a.URL(), "--agent", b.URL(), "--parallel", "2", testDir(step.dir))
		if r.code != exitOK || r.err != "" {
			t.Fatalf("push %s: code %d stderr %q stdout %q", step.dir, r.code, r.err, r.out)
		}
		lines := strings.Split(strings.TrimSuffix(r.out, "\n"), "\n")
		if len(lines) != 3 || lines[2] != fmt.Sprintf("plan %s: 2 of 2 agent(s) took it", step.id) {
			t.Fatalf("push %s printed %q", step.dir, lines)
		}
		// One line per agent, in the order they finished.
		agentLines := slices.Sorted(slices.Values(lines[:2]))
		for i, url := range slices.Sorted(slices.Values([]string{a.URL(), b.URL()})) {
			if !regexp.MustCompile("^" + regexp.QuoteMeta(url) + ": " + step.line + "$").MatchString(agentLines[i]) {
				t.Errorf("push %s: line %q, want %s: %s", step.dir, agentLines[i], url, step.line)
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

func TestPushCommandFailsWhenAnAgentDoesNotTakeThePlan(t *testing.T) {
	a := startCLIAgent(t, nil)
	env := map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": testAgentPass}
	down := "http://127.0.0.1:1"
	r := runCLI(t, env, "push", "--agent", down, "--agent", a.URL(), testDir("shop-v1"))
	if r.code != exitFailure {
		t.Errorf("code %d, want 1", r.code)
	}
	if !strings.Contains(r.out, down+": error: ") || !strings.Contains(r.out, a.URL()+": reload, 0 op(s), reloaded in ") ||
		!strings.HasSuffix(r.out, ": 1 of 2 agent(s) took it\n") {
		t.Errorf("stdout %q", r.out)
	}

	// A rejected reload is a NACK: the pod rolled back and did not take it.
	a.fake.With(func(m *haptic.FakeModel) {
		m.ReloadFails = true
		m.ReloadLog = "[ALERT] (1) : config : parsing [haproxy.cfg:18] : unknown keyword 'inter5s'"
	})
	r = runCLI(t, env, "push", "--agent", a.URL(), testDir("shop-v3"))
	if r.code != exitFailure || !strings.Contains(r.out, a.URL()+`: rejected at stage "reload": `) ||
		!strings.Contains(r.out, "unknown keyword 'inter5s'") || !strings.HasSuffix(r.out, ": 0 of 1 agent(s) took it\n") {
		t.Errorf("rejected reload: code %d stdout %q", r.code, r.out)
	}

	r = runCLI(t, map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": "wrong"},
		"push", "--agent", a.URL(), testDir("shop-v1"))
	if r.code != exitFailure || !strings.Contains(r.out, "error: agent returned HTTP 401") {
		t.Errorf("wrong password: code %d stdout %q", r.code, r.out)
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
		took := pushAll(context.Background(), &out, urls, parallel, func(ctx context.Context, url string) (*haptic.ApplyResult, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			seen[url] = true
			mu.Unlock()
			if strings.HasSuffix(url, "7") {
				return nil, errors.New("connection refused")
			}
			return &haptic.ApplyResult{OK: true, Mode: haptic.ResultRuntime, OpResults: []haptic.OpResult{{Kind: haptic.OpMapAdd, OK: true}}}, nil
		})
		if want := min(parallel, len(urls)); int(peak.Load()) > want {
			t.Errorf("parallel %d: %d pushes at once", parallel, peak.Load())
		}
		if len(seen) != len(urls) || took != len(urls)-2 {
			t.Errorf("parallel %d: reached %d agents, %d took it; want %d and %d", parallel, len(seen), took, len(urls), len(urls)-2)
		}
		if lines := strings.Count(out.String(), "\n"); lines != len(urls) {
			t.Errorf("parallel %d: %d lines, want one per agent", parallel, lines)
		}
		if !strings.Contains(out.String(), "http://agent-07: error: connection refused\n") ||
			!strings.Contains(out.String(), "http://agent-00: runtime, 1 op(s), no reload\n") {
			t.Errorf("parallel %d: output %q", parallel, out.String())
		}
	}
}

func TestPushLine(t *testing.T) {
	for _, c := range []struct {
		result *haptic.ApplyResult
		err    error
		line   string
		ok     bool
	}{
		{&haptic.ApplyResult{OK: true, Mode: "reload", Reload: &haptic.ReloadInfo{Performed: true, OK: true, TookMs: 87, WorkerPID: 12}},
			nil, "reload, 0 op(s), reloaded in 87 ms, worker pid 12", true},
		{&haptic.ApplyResult{OK: true, Mode: "scheduled", Reload: &haptic.ReloadInfo{ScheduledAt: "2026-03-01T10:00:05Z"}},
			nil, "scheduled, 0 op(s), reload scheduled at 2026-03-01T10:00:05Z", true},
		{&haptic.ApplyResult{OK: true, Mode: "noop"}, nil, "noop, 0 op(s), no reload", true},
		{&haptic.ApplyResult{OK: false, Mode: haptic.ResultRejected, Error: &haptic.ApplyError{Stage: "reload", Message: "line one\nline two\n"}},
			nil, `rejected at stage "reload": line one / line two`, false},
		{nil, errors.New("agent rejected the apply (stale_epoch): its applied plan is \"x\" at epoch 9/seq 1"),
			`error: agent rejected the apply (stale_epoch): its applied plan is "x" at epoch 9/seq 1`, false},
	} {
		if line, ok := pushLine(c.result, c.err); line != c.line || ok != c.ok {
			t.Errorf("pushLine = %q, %t; want %q, %t", line, ok, c.line, c.ok)
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
		{"no agent", []string{testDir("shop-v1")}, exitUsage, "at least one --agent is required"},
		{"no directory", []string{"--agent", "http://a:1"}, exitUsage, "want one directory, got 0 arguments"},
		{"zero parallel", []string{"--agent", "http://a:1", "--parallel", "0", testDir("shop-v1")}, exitUsage, "--parallel must be at least 1"},
		{"same agent twice", []string{"--agent", "http://a:1", "--agent", "http://a:1", testDir("shop-v1")}, exitUsage, "--agent http://a:1 is given twice"},
		{"not a directory", []string{"--agent", "http://a:1", testDir("absent")}, exitFailure, "haptic push: "},
		{"key without certificate", []string{"--agent", "https://a:1", "--tls-key", "k.pem", testDir("shop-v1")}, exitFailure, "a client certificate and its key go together"},
		{"TLS over http", []string{"--agent", "http://127.0.0.1:1", "--tls-server-name", "agent", testDir("shop-v1")}, exitFailure, "must be https when TLS is set"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"push"}, c.args...)...)
			if r.code != c.code || !strings.Contains(r.err+r.out, c.err) {
				t.Errorf("code %d stderr %q stdout %q; want %d and %q", r.code, r.err, r.out, c.code, c.err)
			}
		})
	}
}
