// Tests of `haptic agent state` and `haptic agent health`, the commands an
// operator and a liveness probe run inside the pod: the text layout, the
// files table, JSON output and the exit statuses, against a recorded State
// served on a unix socket exactly as the admin
// socket serves it, over TCP with Basic auth, and against a real agent's
// admin socket.

package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// recordedState is a state with every field the text layout prints set,
// two files, a pending reload and a failed last apply.
func recordedState() haptic.State {
	return haptic.State{
		APIVersion:         1,
		AgentVersion:       "v1.2.3",
		PlanSchemaVersion:  1,
		AgentOps:           []string{haptic.OpMapAdd},
		Features:           []string{haptic.FeatureFilePatch, haptic.FeatureWorkerFence, haptic.FeatureRuntimeBatches},
		HAProxy:            haptic.HAProxyInfo{Version: "3.0.11", WorkerPID: 4242, WorkerStartTimeUnixMicros: 1_700_000_000_000_000},
		Generation:         7,
		AppliedPlanID:      "8d43acb4ce8c3a97",
		AppliedPlanProof:   "a:12",
		RunningPlanID:      "b3c11290ffcd96c7",
		RunningPlanProof:   "a:10",
		WorkerOpsPlanID:    "8d43acb4ce8c3a97",
		WorkerOpsPlanProof: "a:12",
		AppliedToken:       haptic.Token{LeaderEpoch: 3, RenderSeq: 41},
		LKGPlanID:          "",
		Files: map[string]haptic.FileAt{
			"maps/host.map": {Digest: "0b7e2e6ee2c4092d", Proof: "0b7e2e6ee2c4092d", Size: 58},
			"haproxy.cfg":   {Digest: "cbaa3ea320b734e3", Size: 434},
		},
		Inventory:       haptic.Inventory{Generation: 2, Maps: []string{"maps/host.map"}},
		ReloadPendingAt: "2026-03-01T10:00:05.123456789Z",
		PendingDeletes:  haptic.PendingDeletes{Servers: []string{"web/s1", "web/s2"}, Backends: []string{"old"}},
		LastApply: &haptic.ApplyResult{PlanID: "8d43acb4ce8c3a97", OK: false, Mode: "reload", At: "2026-03-01T10:00:00Z",
			Error: &haptic.ApplyError{Stage: "reload", Message: "[ALERT] parsing haproxy.cfg\nunknown keyword"}},
		InvariantViolation: "reload_mode_reloads",
	}
}

const recordedStateText = `agent: v1.2.3 (api 1)
haproxy: 3.0.11 worker pid 4242
generation: 7
applied: 8d43acb4ce8c3a97 proof a:12 token 3/41
running: b3c11290ffcd96c7 proof a:10
worker ops: 8d43acb4ce8c3a97 proof a:12
lkg: - proof -
reload pending: 2026-03-01T10:00:05.123456789Z
pending deletes: 2 servers, 1 backends
last apply: 8d43acb4ce8c3a97 reload ok=false at 2026-03-01T10:00:00Z error reload: [ALERT] parsing haproxy.cfg
    unknown keyword
invariant: reload_mode_reloads
`

const recordedFilesTable = `
PATH           SIZE  DIGEST            PROOF
haproxy.cfg    434   cbaa3ea320b734e3  -
maps/host.map  58    0b7e2e6ee2c4092d  0b7e2e6ee2c4092d
`

// stateServer answers GET /v1/state and GET /healthz like an agent and
// records what it was asked.
type stateServer struct {
	state  haptic.State
	health int // status of /healthz; 0 = 200

	mu      sync.Mutex
	queries []string
	auths   []string
}

func (s *stateServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.queries = append(s.queries, r.URL.RawQuery)
	s.auths = append(s.auths, r.Header.Get("Authorization"))
	s.mu.Unlock()
	switch r.URL.Path {
	case "/healthz":
		if s.health != 0 {
			http.Error(w, "sick", s.health)
			return
		}
		w.Write([]byte("ok\n"))
	case "/v1/state":
		if user, pass, ok := r.BasicAuth(); r.Header.Get("Authorization") != "" && (!ok || user != "ops" || pass != "pw") {
			w.Header().Set("WWW-Authenticate", `Basic realm="haptic-agent"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		json.NewEncoder(w).Encode(s.state)
	default:
		http.NotFound(w, r)
	}
}

func (s *stateServer) last() (query, auth string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[len(s.queries)-1], s.auths[len(s.auths)-1]
}

// serveAdminSocket serves h on <base>/haptic-agent.sock, the default admin
// socket of an agent whose --base-dir is base.
func serveAdminSocket(t *testing.T, h http.Handler) (base string) {
	t.Helper()
	base, err := os.MkdirTemp("", "hs")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(base, defaultAdminSocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		os.RemoveAll(base)
	})
	return base
}

func TestAgentStateCommand(t *testing.T) {
	absent := t.TempDir()
	server := &stateServer{state: recordedState()}
	base := serveAdminSocket(t, server)

	t.Run("text", func(t *testing.T) {
		r := runCLI(t, nil, "agent", "state", "--base-dir", base)
		if r.code != exitOK || r.out != recordedStateText || r.err != "" {
			t.Errorf("code %d stderr %q stdout\n%s\nwant\n%s", r.code, r.err, r.out, recordedStateText)
		}
		// The blob is never fetched, and the unix socket carries no
		// credentials even when they are set.
		if q, auth := server.last(); q != "plan=0" || auth != "" {
			t.Errorf("query %q authorization %q, want plan=0 and none", q, auth)
		}
	})

	t.Run("files and an absolute admin socket", func(t *testing.T) {
		env := map[string]string{"DATAPLANE_USERNAME": "ops", "DATAPLANE_PASSWORD": "pw"}
		r := runCLI(t, env, "agent", "state", "--files", "--admin-socket", filepath.Join(base, defaultAdminSocket))
		if r.code != exitOK || r.out != recordedStateText+recordedFilesTable {
			t.Errorf("code %d stderr %q stdout\n%s\nwant\n%s", r.code, r.err, r.out, recordedStateText+recordedFilesTable)
		}
		if _, auth := server.last(); auth != "" {
			t.Errorf("authorization %q over the admin socket", auth)
		}
	})

	t.Run("json", func(t *testing.T) {
		r := runCLI(t, nil, "agent", "state", "--base-dir", base, "--output", "json", "--files")
		var got haptic.State
		if err := json.Unmarshal([]byte(r.out), &got); err != nil || r.code != exitOK {
			t.Fatalf("code %d, %v: %q", r.code, err, r.out)
		}
		if want := recordedState(); !reflect.DeepEqual(got, want) {
			t.Errorf("decoded %+v, want %+v", got, want)
		}
		if !strings.HasPrefix(r.out, "{\n  \"api_version\": 1,\n") || !strings.HasSuffix(r.out, "}\n") {
			t.Errorf("not two-space indented with a trailing newline: %q", r.out)
		}
	})

	t.Run("verify", func(t *testing.T) {
		if r := runCLI(t, nil, "agent", "state", "--base-dir", base, "--verify"); r.code != exitOK {
			t.Fatalf("code %d stderr %q", r.code, r.err)
		}
		if q, _ := server.last(); q != "verify=1&plan=0" {
			t.Errorf("query %q, want verify=1&plan=0", q)
		}
	})

	t.Run("url with Basic auth", func(t *testing.T) {
		tcp := httptest.NewServer(server)
		defer tcp.Close()
		env := map[string]string{"DATAPLANE_USERNAME": "ops", "DATAPLANE_PASSWORD": "pw"}
		r := runCLI(t, env, "agent", "state", "--url", tcp.URL)
		if r.code != exitOK || r.out != recordedStateText {
			t.Errorf("code %d stderr %q stdout %q", r.code, r.err, r.out)
		}
		if _, auth := server.last(); auth == "" {
			t.Error("no Basic credentials over TCP")
		}
		env["DATAPLANE_PASSWORD"] = "wrong"
		r = runCLI(t, env, "agent", "state", "--url", tcp.URL)
		if r.code != exitFailure || r.out != "" || r.err != "haptic agent state: the agent refused the credentials from DATAPLANE_USERNAME/DATAPLANE_PASSWORD (HTTP 401: unauthorized); "+
			"client commands read HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS first, then DATAPLANE_USERNAME/DATAPLANE_PASSWORD\n" {
			t.Errorf("wrong password: code %d stderr %q stdout %q", r.code, r.err, r.out)
		}
	})

	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no agent", []string{"--base-dir", absent}, exitFailure, "haptic agent state: " + unreachable("GET /v1/state (the state read)", absent)},
		{"bad output", []string{"--base-dir", base, "--output", "yaml"}, exitUsage, "--output must be text or json"},
		{"unknown flag", []string{"--frobnicate"}, exitUsage, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, exitUsage, `unexpected argument "extra"`},
		{"TLS without url", []string{"--tls-ca", "/nonexistent"}, exitUsage,
			"the --tls-* flags need an https --url or --agents-dns; the admin socket speaks plain HTTP"},
		{"the agent's own --tls-dir", []string{"--url", "https://127.0.0.1:1", "--tls-dir", "/nonexistent"}, exitUsage,
			"flag provided but not defined: -tls-dir"},
		{"url and agents-dns", []string{"--url", "http://127.0.0.1:1", "--agents-dns", "http://agents.test:1"}, exitUsage,
			"--url names one agent and --agents-dns a fleet; give one"},
		{"files of a fleet", []string{"--agents-dns", "http://agents.test:1", "--files"}, exitUsage,
			"--agents-dns prints one row per pod; --files and --output json read one agent (--url)"},
		{"a missing CA file", []string{"--url", "https://127.0.0.1:1", "--tls-ca", "/nonexistent/ca.crt"}, exitFailure,
			"haptic agent state: --tls-ca: open /nonexistent/ca.crt: no such file or directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"agent", "state"}, c.args...)...)
			if r.code != c.code || !strings.Contains(r.err, c.err) || r.out != "" {
				t.Errorf("code %d stderr %q stdout %q; want %d and %q", r.code, r.err, r.out, c.code, c.err)
			}
		})
	}

	t.Run("real agent", func(t *testing.T) {
		agent := startCLIAgent(t, nil)
		r := runCLI(t, nil, "agent", "state", "--base-dir", agent.base, "--verify", "--files")
		if r.code != exitOK {
			t.Fatalf("code %d stderr %q", r.code, r.err)
		}
		for _, line := range []string{"agent: dev (api 1)\n", "generation: 0\n", "applied: - proof - token 0/0\n",
			"last apply: none\n", "invariant: none\n\nno files held yet\n"} {
			if !strings.Contains(r.out, line) {
				t.Errorf("output lacks %q:\n%s", line, r.out)
			}
		}
	})
}

// unreachable is the phrasing of every client command for an agent that is
// not there: the request, and the admin socket under base it dialled.
func unreachable(request, base string) string {
	return "cannot reach the agent for " + request + ": dial unix " + filepath.Join(base, defaultAdminSocket) + ": "
}

func TestAgentHealthCommand(t *testing.T) {
	absent := t.TempDir()
	healthy := serveAdminSocket(t, &stateServer{})
	sick := serveAdminSocket(t, &stateServer{health: http.StatusServiceUnavailable})
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"answers 200", []string{"--base-dir", healthy}, exitOK, ""},
		{"absolute socket", []string{"--admin-socket", filepath.Join(healthy, defaultAdminSocket)}, exitOK, ""},
		{"socket absent", []string{"--base-dir", absent}, exitFailure, "haptic agent health: " + unreachable("GET /healthz (the liveness probe)", absent)},
		{"answers 503", []string{"--base-dir", sick}, exitFailure, "haptic agent health: agent returned HTTP 503"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"agent", "health"}, c.args...)...)
			if r.code != c.code || r.out != "" || (c.err == "" && r.err != "") || !strings.HasPrefix(r.err, c.err) {
				t.Errorf("code %d stdout %q stderr %q; want %d and %q", r.code, r.out, r.err, c.code, c.err)
			}
		})
	}

	t.Run("real agent", func(t *testing.T) {
		agent := startCLIAgent(t, nil)
		if r := runCLI(t, nil, "agent", "health", "--base-dir", agent.base); r.code != exitOK || r.err != "" {
			t.Errorf("code %d stderr %q", r.code, r.err)
		}
	})
}

// With the agent running and no HAProxy, every client command answers at
// once with what the agent waits for; once HAProxy goes away under a
// running agent, a verified read fails and says why.
func TestClientCommandsSayHAProxyIsAway(t *testing.T) {
	base, err := os.MkdirTemp("", "hc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	worker, master := filepath.Join(base, "haproxy-worker.sock"), filepath.Join(base, "haproxy-master.sock")
	agent, err := haptic.NewAgent(haptic.AgentConfig{BaseDir: base, WorkerSocket: worker, MasterSocket: master,
		Listen: "127.0.0.1:0", AdminSocket: defaultAdminSocket, Username: testAgentUser, Password: testAgentPass, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + agent.Addr()
	time.Sleep(300 * time.Millisecond) // the first startup probe has failed

	waiting := "agent is waiting for HAProxy (worker socket " + worker + ", master socket " + master + "): "
	for _, c := range []struct {
		args   []string
		stdout bool // the message is on stdout (push's per-agent line)
	}{
		{[]string{"agent", "state", "--base-dir", base}, false},
		{[]string{"agent", "state", "--url", url}, false},
		{[]string{"diff", "--agent", url, testDir("shop-v1")}, false},
		{[]string{"push", "--agent", url, testDir("shop-v1")}, true},
	} {
		start := time.Now()
		r := runBinary(t, pushEnv, c.args...)
		text := r.err
		if c.stdout {
			text = r.out
		}
		if r.code == exitOK || !strings.Contains(text, waiting) || !strings.Contains(text, "(HTTP 503, stage startup)") || time.Since(start) > 5*time.Second {
			t.Errorf("%v took %s: code %d stdout %q stderr %q", c.args, time.Since(start), r.code, r.out, r.err)
		}
	}
	if r := runBinary(t, nil, "agent", "health", "--base-dir", base); r.code != exitOK {
		t.Errorf("health is liveness and must pass: %d %q", r.code, r.err)
	}
	cancel()
	<-done
	done <- nil

	a := startCLIAgent(t, nil)
	if r := runBinary(t, nil, "agent", "state", "--verify", "--base-dir", a.base); r.code != exitOK {
		t.Fatalf("verified state with HAProxy: %d %q", r.code, r.err)
	}
	a.fake.Close()
	r := runBinary(t, nil, "agent", "state", "--verify", "--base-dir", a.base)
	if r.code != exitFailure || !strings.HasPrefix(r.err, "haptic agent state: cannot verify: the HAProxy worker socket "+a.fake.WorkerSocket()+" does not answer: ") {
		t.Errorf("verified state without HAProxy: %d %q", r.code, r.err)
	}
}
