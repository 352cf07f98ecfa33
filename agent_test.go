// Tests of the agent as a whole, against the fake HAProxy: the seed flow
// (a first apply that reloads, then a map entry added at runtime), the
// configuration NewAgent accepts, refuses or fills in, and the exact
// answers of the handlers and the admin socket. The shared harness is in
// harness_test.go; authentication, readiness, the ledger, the apply
// pipeline and pacing each have their own test file beside their code.

package haptic

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The seed flow: first apply = full file set + reload, second = one map_add
// at runtime.

// totalInvariantViolations sums every invariant series.
func totalInvariantViolations(a *Agent) uint64 {
	var n uint64
	for _, name := range []string{invGenerationMonotonic, invDiskIsTheDesiredSet, invRuntimeModeDoesNotReload,
		invReloadModeReloads, invNoopRunsNoOps, invJournalOnlyWhileDiverged,
		invOpsExecutable, invRecoveryReload} {
		n += a.metrics.invariantViolations.value(name)
	}
	return n
}

func TestSeedFlowReloadsThenAddsAMapEntryAtRuntime(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, nil)
	loadOnReload(fake, a.files.base)
	c := newAgentClient(t, a)

	fs := seedFiles()
	res := c.apply(c.manifest("plan-1", fs), fs)
	if !res.OK || res.Mode != ResultReload || res.Reload == nil || !res.Reload.Performed || !res.Reload.OK {
		t.Fatalf("first apply: %+v", res)
	}
	if res.AppliedPlanID != "plan-1" || res.RunningPlanID != "plan-1" || res.LKGPlanID != "plan-1" || res.AppliedPlanProof != "a:1" {
		t.Fatalf("first apply baseline: %+v", res)
	}
	if got := diskSet(t, a.files.base); !sameSet(got, fs) {
		t.Fatalf("disk after the first apply: %v", got)
	}
	pid := fake.Worker().WorkerPID

	fs2 := fs.clone()
	fs2["maps/host.map"] += "example.org be-b\n"
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.org", Value: "be-b"}
	res = c.apply(c.manifest("plan-2", fs2, op), fs2)
	if !res.OK || res.Mode != ResultRuntime || res.Reload != nil {
		t.Fatalf("second apply: %+v", res)
	}
	if len(res.OpResults) != 1 || !res.OpResults[0].OK || res.OpResults[0].Kind != OpMapAdd {
		t.Fatalf("op results: %+v", res.OpResults)
	}
	if fake.Worker().WorkerPID != pid {
		t.Fatal("the runtime apply reloaded")
	}
	if got := fake.MapEntries("maps/host.map"); len(got) != 2 || got[1].Key != "example.org" {
		t.Fatalf("map entries: %v", got)
	}
	st := c.state("")
	if st.Generation != 2 || st.AppliedPlanID != "plan-2" || st.RunningPlanID != "plan-1" || st.WorkerOpsPlanID != "plan-2" {
		t.Fatalf("state: %+v", st)
	}
	if st.InvariantViolation != "" || totalInvariantViolations(a) != 0 {
		t.Fatalf("invariant: %q", st.InvariantViolation)
	}
	awaitReadBacks(a)
	if metricValue(a, "map_divergence_total") != 0 {
		t.Fatal("the read-back found a divergence")
	}
}

// ---------------------------------------------------------------------------
// Configuration.

func TestNewAgentValidatesTheConfiguration(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	emptyTLS := t.TempDir()
	longDir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	os.MkdirAll(longDir, 0o755)
	tests := []struct {
		name   string
		mutate func(*AgentConfig)
		want   string
	}{
		{"empty base dir", func(c *AgentConfig) { c.BaseDir = "" }, "--base-dir is required"},
		{"bad config", func(c *AgentConfig) { c.ConfigFile = "../haproxy.cfg" },
			`--config: invalid manifest path: "../haproxy.cfg" has a component starting with a dot`},
		{"absolute config", func(c *AgentConfig) { c.ConfigFile = "/etc/haproxy/haproxy.cfg" },
			`--config: invalid manifest path: "/etc/haproxy/haproxy.cfg" is absolute`},
		{"interval 61s", func(c *AgentConfig) { c.ReloadIntervalMin = 61 * time.Second },
			"--reload-interval-min 1m1s is outside 0..60s"},
		{"interval 2m", func(c *AgentConfig) { c.ReloadIntervalMin = 2 * time.Minute },
			"--reload-interval-min 2m0s is outside 0..60s"},
		{"negative interval", func(c *AgentConfig) { c.ReloadIntervalMin = -time.Second },
			"--reload-interval-min -1s is outside 0..60s"},
		{"timeout -1s", func(c *AgentConfig) { c.ReloadTimeout = -time.Second },
			"--reload-timeout must be between 0 and 1m0s, got -1s"},
		{"timeout 61s", func(c *AgentConfig) { c.ReloadTimeout = 61 * time.Second },
			"--reload-timeout must be between 0 and 1m0s, got 1m1s"},
		{"negative quiet", func(c *AgentConfig) { c.DrainQuietPeriod = -time.Second },
			"--drain-quiet-period must not be negative, got -1s"},
		{"negative max wait", func(c *AgentConfig) { c.DrainMaxWait = -time.Second },
			"--drain-max-wait must not be negative, got -1s"},
		{"max wait 6m", func(c *AgentConfig) { c.DrainMaxWait = 6 * time.Minute },
			"--drain-max-wait must be at most 5m0s, got 6m0s"},
		{"quiet over max", func(c *AgentConfig) { c.DrainQuietPeriod = 3 * time.Second; c.DrainMaxWait = 2 * time.Second },
			"--drain-quiet-period 3s exceeds --drain-max-wait 2s"},
		{"file mode beyond the permission bits", func(c *AgentConfig) { c.FileMode = 0o4640 },
			"--file-mode 04640 is outside 0400..0777 or not readable by its owner"},
		{"file mode its owner cannot read", func(c *AgentConfig) { c.FileMode = 0o240 },
			"--file-mode 0240 is outside 0400..0777 or not readable by its owner"},
		{"TLS without client name", func(c *AgentConfig) { c.TLSDir = emptyTLS },
			"--tls-client-name is required with --tls-dir"},
		{"half Basic (user)", func(c *AgentConfig) { c.Password = "" },
			"DATAPLANE_USERNAME and DATAPLANE_PASSWORD must be set together"},
		{"half Basic (password)", func(c *AgentConfig) { c.Username = "" },
			"DATAPLANE_USERNAME and DATAPLANE_PASSWORD must be set together"},
		{"no auth", func(c *AgentConfig) { c.Username, c.Password = "", "" },
			"no authentication configured: use --tls-dir, or set DATAPLANE_USERNAME and DATAPLANE_PASSWORD, or pass --insecure-no-auth"},
		{"base dir not a directory", func(c *AgentConfig) { c.BaseDir = notDir },
			"--base-dir: " + notDir + " is not a directory"},
		{"admin socket too long", func(c *AgentConfig) { c.BaseDir = longDir; c.AdminSocket = "admin-socket-name.sock" },
			"--admin-socket: " + filepath.Join(longDir, "admin-socket-name.sock") + " exceeds the 107-byte unix socket path limit"},
		{"drain socket too long", func(c *AgentConfig) { c.BaseDir = longDir; c.DrainSocket = "drain-socket-name.sock" },
			"--drain-socket: " + filepath.Join(longDir, "drain-socket-name.sock") + " exceeds the 107-byte unix socket path limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validTestConfig(t)
			tc.mutate(&cfg)
			err := newTestAgentOrError(t, cfg)
			if err == nil || err.Error() != tc.want {
				t.Errorf("NewAgent = %v\nwant        %s", err, tc.want)
			}
		})
	}
	t.Run("missing base dir", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.BaseDir = filepath.Join(cfg.BaseDir, "absent")
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--base-dir: ") || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("NewAgent = %v", err)
		}
	})
	t.Run("unusable TLS dir", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.TLSDir, cfg.TLSClientName = emptyTLS, "controller"
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--tls-dir: ") {
			t.Errorf("NewAgent = %v", err)
		}
	})
	t.Run("bad listen", func(t *testing.T) {
		cfg := validTestConfig(t)
		cfg.Listen = "256.0.0.1:bad"
		err := newTestAgentOrError(t, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "--listen: ") {
			t.Errorf("NewAgent = %v", err)
		}
	})
}

func TestNewAgentFillsDefaults(t *testing.T) {
	cfg := validTestConfig(t)
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	got := a.cfg
	if got.ReloadTimeout != 60*time.Second || got.DrainQuietPeriod != 2*time.Second || got.DrainMaxWait != 10*time.Second {
		t.Errorf("durations: %v %v %v", got.ReloadTimeout, got.DrainQuietPeriod, got.DrainMaxWait)
	}
	if got.ConfigFile != "haproxy.cfg" || got.MasterSocket != "haproxy-master.sock" || got.WorkerSocket != "haproxy-worker.sock" ||
		got.StateFile != ".haptic-agent.json" || got.AgentVersion != "dev" || got.Logger == nil {
		t.Errorf("names: %+v", got)
	}
	base := cfg.BaseDir
	want := agentPaths{
		config: filepath.Join(base, "haproxy.cfg"), state: filepath.Join(base, ".haptic-agent.json"),
		master: filepath.Join(base, "haproxy-master.sock"), worker: filepath.Join(base, "haproxy-worker.sock"),
		planBlob: filepath.Join(base, ".haptic-agent-plan.bin"), log: filepath.Join(base, ".haptic-agent.log"),
	}
	if a.paths != want {
		t.Errorf("paths = %+v\nwant %+v", a.paths, want)
	}
	// The listen default is the flag's; it is not bound here.
	c := AgentConfig{}
	fillAgentDefaults(&c)
	if c.Listen != ":5555" || c.AdminSocket != "" || c.DrainSocket != "" || c.MetricsListen != "" || c.TLSDir != "" {
		t.Errorf("off-by-default fields: %+v", c)
	}
	// Absolute socket paths stay as given.
	cfg = validTestConfig(t)
	cfg.MasterSocket = "/run/haproxy/master.sock"
	p, err := resolveAgentPaths(&cfg)
	if err != nil || p.master != "/run/haproxy/master.sock" {
		t.Errorf("absolute master socket: %q %v", p.master, err)
	}
}

func TestValidateDrainFillsDefaultsAndRejectsAnInvertedWindow(t *testing.T) {
	q, m, err := validateDrain(0, 0)
	if err != nil || q != 2*time.Second || m != 10*time.Second {
		t.Errorf("defaults: %v %v %v", q, m, err)
	}
	q, m, err = validateDrain(time.Second, 5*time.Minute)
	if err != nil || q != time.Second || m != 5*time.Minute {
		t.Errorf("max bound: %v %v %v", q, m, err)
	}
	if _, _, err := validateDrain(11*time.Second, 0); err == nil || err.Error() != "--drain-quiet-period 11s exceeds --drain-max-wait 10s" {
		t.Errorf("inverted window: %v", err)
	}
	if _, _, err := validateDrain(0, 5*time.Minute+time.Millisecond); err == nil || err.Error() != "--drain-max-wait must be at most 5m0s, got 5m0.001s" {
		t.Errorf("over 5m: %v", err)
	}
}

func TestLocalSocketsCannotReplaceAgentFilesOrOtherSockets(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*AgentConfig)
		want   string // with <base> for the base directory
	}{
		{"master and admin", func(c *AgentConfig) { c.AdminSocket = "haproxy-master.sock" },
			"--master-socket and --admin-socket share <base>/haproxy-master.sock; choose distinct file and socket paths"},
		{"state file and config", func(c *AgentConfig) { c.StateFile = "haproxy.cfg" },
			"--config and --state-file share <base>/haproxy.cfg; choose distinct file and socket paths"},
		{"worker and drain", func(c *AgentConfig) { c.DrainSocket = "./sub/../haproxy-worker.sock" },
			"--worker-socket and --drain-socket share <base>/haproxy-worker.sock; choose distinct file and socket paths"},
		{"absolute and relative", func(c *AgentConfig) { c.StateFile = filepath.Join(c.BaseDir, "x.sock"); c.AdminSocket = "x.sock" },
			"--state-file and --admin-socket share <base>/x.sock; choose distinct file and socket paths"},
		{"drain and admin", func(c *AgentConfig) { c.DrainSocket = "a.sock"; c.AdminSocket = "a.sock" },
			"--drain-socket and --admin-socket share <base>/a.sock; choose distinct file and socket paths"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validTestConfig(t)
			tc.mutate(&cfg)
			err := newTestAgentOrError(t, cfg)
			want := strings.ReplaceAll(tc.want, "<base>", cfg.BaseDir)
			if err == nil || err.Error() != want {
				t.Errorf("NewAgent = %v\nwant        %s", err, want)
			}
		})
	}
}

func TestLocalSocketCannotReplaceRegularFiles(t *testing.T) {
	cfg := validTestConfig(t)
	dir, err := os.MkdirTemp("", "ha")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "admin.sock")
	os.WriteFile(path, []byte("precious"), 0o644)
	cfg.AdminSocket = path
	err = newTestAgentOrError(t, cfg)
	want := "local agent socket " + path + " is occupied by a non-socket file; choose another path"
	if err == nil || err.Error() != want {
		t.Errorf("NewAgent = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Errorf("the file was touched: %q", b)
	}
	// A stale socket is replaced.
	os.Remove(path)
	cfg.AdminSocket = filepath.Join(dir, "stale.sock")
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.adminLn.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	a.close()
	if fi, err := os.Lstat(cfg.AdminSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no stale socket left to test with: %v", err)
	}
	a, err = NewAgent(cfg)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	fi, _ := os.Lstat(cfg.AdminSocket)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin socket mode %v", fi.Mode())
	}
	a.close()
}

// ---------------------------------------------------------------------------
// Handlers.

func TestLocalAgentStateSocketRejectsMutations(t *testing.T) {
	fake := startTestFake(t, "")
	admin := filepath.Join(shortTempDir(t), "admin.sock")
	cfg := testAgentConfig(t, fake)
	cfg.AdminSocket = admin
	_, stop := launchTestAgent(t, cfg, true)
	uc := unixClient(admin)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"POST", PathApply, 404}, {"PUT", PathPlan, 404}, {"POST", PathState, 405},
		{"GET", PathState, 200}, {"GET", PathHealthz, 200}, {"GET", PathReadyz, 404},
	} {
		req, _ := http.NewRequest(tc.method, "http://agent"+tc.path, strings.NewReader("x"))
		resp, err := uc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s = %d %s", tc.method, tc.path, resp.StatusCode, b)
		}
		if tc.want == 200 && tc.path == PathState {
			var st State
			if err := json.Unmarshal(b, &st); err != nil || st.APIVersion != 1 {
				t.Errorf("admin state: %v %s", err, b)
			}
		}
	}
	stop()
	if _, err := os.Lstat(admin); !os.IsNotExist(err) {
		t.Errorf("the admin socket is still there: %v", err)
	}
}

func TestHandlersAnswerExactBodies(t *testing.T) {
	fake := startTestFake(t, "")
	ready := startTestAgent(t, fake, nil)
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	starting, _ := launchTestAgent(t, cfg, false)

	const text, js = "text/plain; charset=utf-8", "application/json"
	tests := []struct {
		name         string
		a            *Agent
		method, path string
		contentType  string
		body         string
		wantCode     int
		wantType     string
		wantBody     string
	}{
		{"healthz", ready, "GET", PathHealthz, "", "", 200, text, "ok\n"},
		{"healthz while starting", starting, "GET", PathHealthz, "", "", 200, text, "ok\n"},
		{"readyz", ready, "GET", PathReadyz, "", "", 200, text, "ready\n"},
		{"readyz while starting", starting, "GET", PathReadyz, "", "", 503, text, "initialising\n"},
		{"unknown path", ready, "GET", "/v1/nothing", "", "", 404, text, "404 page not found\n"},
		{"wrong method", ready, "POST", PathState, "", "", 405, text, "Method Not Allowed\n"},
		{"apply before ready", starting, "POST", PathApply, "text/plain", "x", 503, js,
			`{"stage":"startup","message":"agent is initialising"}` + "\n"},
		{"plan before ready", starting, "PUT", PathPlan + "?plan_id=a&proof=b", "", "x", 503, js,
			`{"stage":"startup","message":"agent is initialising"}` + "\n"},
		{"not multipart", ready, "POST", PathApply, "application/json", "{}", 400, js,
			`{"stage":"request","message":"request Content-Type isn't multipart/form-data"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newAgentClient(t, tc.a)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			code, h, b := c.do(tc.method, tc.path, body, tc.contentType)
			if code != tc.wantCode || h.Get("Content-Type") != tc.wantType || string(b) != tc.wantBody {
				t.Errorf("got %d %q %q\nwant %d %q %q", code, h.Get("Content-Type"), b, tc.wantCode, tc.wantType, tc.wantBody)
			}
		})
	}
}

// TestASecondAgentOnTheTreeIsRefused: a second agent on a tree another
// agent holds exits at once, naming the tree and the holder's pid, also
// after a lock file in the tree was removed or replaced (the lock once
// lived in .haptic-agent.lock, and a second agent then started beside the
// first); once the first stops, the tree takes an agent again.
func TestASecondAgentOnTheTreeIsRefused(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	_, stop := launchTestAgent(t, cfg, true)
	second := cfg
	second.AdminSocket, second.DrainSocket = "", ""
	base, _ := filepath.EvalSymlinks(cfg.BaseDir)
	want := fmt.Sprintf("--base-dir %s: the tree is held by another process (flock: ", base)
	if err := newTestAgentOrError(t, second); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a second agent on the tree: %v, want an error starting %q", err, want)
	}
	lockFile := filepath.Join(cfg.BaseDir, ".haptic-agent.lock")
	os.Remove(lockFile)
	if err := newTestAgentOrError(t, second); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a second agent after the lock file was removed: %v, want an error starting %q", err, want)
	}
	os.WriteFile(lockFile, nil, 0o600)
	if err := newTestAgentOrError(t, second); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a second agent after the lock file was replaced: %v, want an error starting %q", err, want)
	}
	stop()
	if err := newTestAgentOrError(t, second); err != nil {
		t.Errorf("an agent on the tree the first one left: %v", err)
	}
}
