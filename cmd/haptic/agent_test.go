// Tests of `haptic agent`: flags and environment into AgentConfig, the
// usage errors, and the process lifetime (JSON logs, clean stop, exit 1 on
// a configuration NewAgent refuses).

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// parseAgent parses agent flags the way runAgent does.
func parseAgent(t *testing.T, env map[string]string, args ...string) (haptic.AgentConfig, error, string) {
	t.Helper()
	var errOut strings.Builder
	s := stdio{out: io.Discard, err: &errOut, getenv: func(k string) string { return env[k] }}
	cfg, err := parseAgentFlags(newFlagSet("agent", "haptic agent [flags]", s), args, s)
	return cfg, err, errOut.String()
}

func TestAgentCommandParsesFlags(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		cfg, err, _ := parseAgent(t, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Logger == nil {
			t.Error("no logger")
		}
		cfg.Logger = nil
		want := haptic.AgentConfig{
			BaseDir:           "/etc/haproxy",
			ConfigFile:        "haproxy.cfg",
			MasterSocket:      "/etc/haproxy/haproxy-master.sock",
			WorkerSocket:      "/etc/haproxy/haproxy-worker.sock",
			StateFile:         "/etc/haproxy/.haptic-agent.json",
			Listen:            ":5555",
			MetricsListen:     ":9101",
			ReloadIntervalMin: 5 * time.Second,
			ReloadTimeout:     60 * time.Second,
			AdminSocket:       "/etc/haproxy/haptic-agent.sock",
			DrainSocket:       "/etc/haproxy/haptic-drain.sock",
			DrainQuietPeriod:  2 * time.Second,
			DrainMaxWait:      10 * time.Second,
			AgentVersion:      agentVersion(),
		}
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("defaults:\n%+v\nwant\n%+v", cfg, want)
		}
	})

	t.Run("every flag", func(t *testing.T) {
		env := map[string]string{"DATAPLANE_USERNAME": "ops", "DATAPLANE_PASSWORD": "pw", "LOG_LEVEL": "debug"}
		cfg, err, _ := parseAgent(t, env,
			"--base-dir", "/srv/lb",
			"--config", "conf/haproxy.cfg",
			"--master-socket", "run/master.sock",
			"--worker-socket", "/run/haproxy/worker.sock",
			"--listen", "127.0.0.1:6000",
			"--metrics-listen", ":9100",
			"--tls-dir", "/etc/haptic/tls",
			"--tls-client-name", "controller.example.com",
			"--state-file", "state/agent.json",
			"--reload-interval-min", "5s",
			"--reload-timeout", "30s",
			"--admin-socket", "/run/haptic/admin.sock",
			"--drain-socket", "drain.sock",
			"--drain-quiet-period", "1500ms",
			"--drain-max-wait", "1m",
			"--drain-ignore-frontend", "status",
			"--drain-ignore-frontend", "stats, healthz,",
			"--file-mode", "0600",
			"--insecure-no-auth",
		)
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
			t.Error("LOG_LEVEL=debug did not enable debug logs")
		}
		cfg.Logger = nil
		want := haptic.AgentConfig{
			BaseDir:              "/srv/lb",
			ConfigFile:           "conf/haproxy.cfg", // a manifest path: never resolved
			MasterSocket:         "/srv/lb/run/master.sock",
			WorkerSocket:         "/run/haproxy/worker.sock",
			StateFile:            "/srv/lb/state/agent.json",
			Listen:               "127.0.0.1:6000",
			MetricsListen:        ":9100",
			TLSDir:               "/etc/haptic/tls",
			TLSClientName:        "controller.example.com",
			Username:             "ops",
			Password:             "pw",
			InsecureNoAuth:       true,
			ReloadIntervalMin:    5 * time.Second,
			ReloadTimeout:        30 * time.Second,
			AdminSocket:          "/run/haptic/admin.sock",
			DrainSocket:          "/srv/lb/drain.sock",
			DrainQuietPeriod:     1500 * time.Millisecond,
			DrainMaxWait:         time.Minute,
			DrainIgnoreFrontends: []string{"status", "stats", "healthz"},
			FileMode:             0o600,
			AgentVersion:         agentVersion(),
		}
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("flags:\n%+v\nwant\n%+v", cfg, want)
		}
	})

	t.Run("a relative base resolves once, against the working directory", func(t *testing.T) {
		cfg, err, _ := parseAgent(t, nil, "--base-dir", "lb", "--state-file", "state.json")
		if err != nil {
			t.Fatal(err)
		}
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(wd, "lb", "haproxy-master.sock"); cfg.MasterSocket != want {
			t.Errorf("master socket %q, want %q", cfg.MasterSocket, want)
		}
		if want := filepath.Join(wd, "lb", "state.json"); cfg.StateFile != want {
			t.Errorf("state file %q, want %q", cfg.StateFile, want)
		}
	})

	t.Run("empty sockets and metrics stay off", func(t *testing.T) {
		cfg, err, _ := parseAgent(t, nil, "--admin-socket=", "--drain-socket", "", "--metrics-listen", "")
		if err != nil || cfg.AdminSocket != "" || cfg.DrainSocket != "" || cfg.MetricsListen != "" {
			t.Errorf("admin %q drain %q metrics %q err %v, want all off", cfg.AdminSocket, cfg.DrainSocket, cfg.MetricsListen, err)
		}
		if cfg, _, _ := parseAgent(t, nil, "--reload-interval-min", "0s"); cfg.ReloadIntervalMin != 0 {
			t.Errorf("--reload-interval-min 0s gives %s, want no pacing", cfg.ReloadIntervalMin)
		}
	})

	t.Run("AGENT_TLS_DIR and AGENT_TLS_CLIENT_NAME stand in for absent flags", func(t *testing.T) {
		env := map[string]string{"AGENT_TLS_DIR": "/etc/haptic/tls", "AGENT_TLS_CLIENT_NAME": "controller.example.com"}
		for _, c := range []struct {
			name                string
			args                []string
			wantDir, wantClient string
		}{
			{"no flags", nil, "/etc/haptic/tls", "controller.example.com"},
			{"the flags win", []string{"--tls-dir", "/srv/tls", "--tls-client-name", "ctl"}, "/srv/tls", "ctl"},
			{"an explicit empty --tls-dir turns TLS off", []string{"--tls-dir="}, "", "controller.example.com"},
		} {
			cfg, err, _ := parseAgent(t, env, c.args...)
			if err != nil || cfg.TLSDir != c.wantDir || cfg.TLSClientName != c.wantClient {
				t.Errorf("%s: dir %q client %q err %v, want %q %q", c.name, cfg.TLSDir, cfg.TLSClientName, err, c.wantDir, c.wantClient)
			}
		}
	})

	t.Run("LOG_LEVEL", func(t *testing.T) {
		for text, level := range map[string]slog.Level{"": slog.LevelInfo, "debug": slog.LevelDebug,
			"info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
			cfg, err, _ := parseAgent(t, map[string]string{"LOG_LEVEL": text})
			if err != nil {
				t.Fatalf("LOG_LEVEL %q: %v", text, err)
			}
			ctx := context.Background()
			if !cfg.Logger.Enabled(ctx, level) || cfg.Logger.Enabled(ctx, level-1) {
				t.Errorf("LOG_LEVEL %q does not log from %s on", text, level)
			}
		}
	})

	// Usage errors: the error and one line pointing at -h on stderr, exit
	// 2; never the whole flag list, which would bury the error.
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		text string
	}{
		{"bad LOG_LEVEL", map[string]string{"LOG_LEVEL": "verbose"}, nil,
			`LOG_LEVEL "verbose" is not one of debug, info, warn, error`},
		{"unknown flag", nil, []string{"--frobnicate"}, "flag provided but not defined: -frobnicate"},
		{"malformed duration", nil, []string{"--reload-timeout", "soon"}, `invalid value "soon" for flag -reload-timeout: parse error`},
		{"file mode not octal", nil, []string{"--file-mode", "999"}, `invalid value "999" for flag -file-mode: want an octal mode in 0400..0777, such as 0640`},
		{"stray argument", nil, []string{"extra"}, `unexpected argument "extra"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.env, append([]string{"agent"}, c.args...)...)
			if want := "haptic agent: " + c.text + "\nRun \"haptic agent -h\" for usage.\n"; r.code != exitUsage || r.err != want {
				t.Errorf("code %d stderr %q; want 2 and %q", r.code, r.err, want)
			}
		})
	}
}

// -h prints every flag, and the subcommands of `haptic agent`.
func TestAgentCommandHelpListsFlagsAndSubcommands(t *testing.T) {
	r := runCLI(t, nil, "agent", "-h")
	for _, want := range []string{"Usage: haptic agent [flags]\n", "\n  haptic agent state ", "\n  haptic agent health ",
		"\n  haptic agent drain ", "\n  -file-mode value\n"} {
		if r.code != exitOK || !strings.Contains(r.err, want) {
			t.Errorf("haptic agent -h: code %d, stderr lacks %q:\n%s", r.code, want, r.err)
		}
	}
}

// The command's flag defaults are the agent's own, resolved against the
// command's base directory, plus the listeners the command turns on.
func TestAgentCommandDefaultsAreTheAgents(t *testing.T) {
	cfg, err, _ := parseAgent(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := haptic.DefaultAgentConfig()
	want.BaseDir = defaultBaseDir
	want.MetricsListen, want.AdminSocket, want.DrainSocket = defaultMetricsListen, defaultAdminSocket, defaultDrainSocket
	want.ReloadIntervalMin = defaultReloadIntervalMin
	if want, err = want.ResolvePaths(); err != nil {
		t.Fatal(err)
	}
	want.AgentVersion, want.Logger = cfg.AgentVersion, cfg.Logger
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("defaults:\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestAgentCommandRefusesWhatNewAgentRefuses(t *testing.T) {
	base := t.TempDir()
	r := runCLI(t, nil, "agent", "--base-dir", base, "--listen", "127.0.0.1:0")
	want := "haptic agent: no authentication configured: use --tls-dir, or set DATAPLANE_USERNAME and DATAPLANE_PASSWORD, or pass --insecure-no-auth\n"
	if r.code != exitFailure || r.err != want {
		t.Errorf("code %d stderr %q, want 1 and %q", r.code, r.err, want)
	}
}

// waitReadyz polls GET /readyz until it answers 200, for at most 10 s.
func waitReadyz(t *testing.T, url string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	t.Errorf("%s/readyz never answered 200", url)
}

func TestAgentCommandRunsAndStopsCleanly(t *testing.T) {
	base := startCLIFake(t).base

	ctx, cancel := context.WithCancel(context.Background())
	logs, logWriter := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := run(ctx, []string{"agent", "--base-dir", base, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"},
			stdio{out: io.Discard, err: logWriter, getenv: func(k string) string {
				return map[string]string{"DATAPLANE_USERNAME": "u", "DATAPLANE_PASSWORD": "p"}[k]
			}})
		logWriter.Close()
		done <- code
	}()

	// Every line on stderr is a JSON log record. Once the agent has said
	// where it listens, wait for /readyz, then stop it the way SIGTERM
	// does: by cancelling the context.
	lines := bufio.NewScanner(logs)
	var messages []string
	for lines.Scan() {
		var rec struct {
			Msg    string `json:"msg"`
			Listen string `json:"listen"`
		}
		if err := json.Unmarshal(lines.Bytes(), &rec); err != nil {
			t.Errorf("stderr line %q is not a JSON log record: %v", lines.Text(), err)
		}
		messages = append(messages, rec.Msg)
		if rec.Msg == "agent started" {
			go func() {
				waitReadyz(t, "http://"+rec.Listen)
				cancel()
			}()
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d after a clean stop, want 0; logs %q", code, messages)
	}
	if len(messages) < 2 || messages[0] != "agent started" || messages[len(messages)-1] != "agent stopped" {
		t.Errorf("logs %q, want them to start with the start and end with the stop", messages)
	}
}

func TestAgentCommandStopsOnSIGTERMAndSIGINT(t *testing.T) {
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		t.Run(sig.String(), func(t *testing.T) {
			base := startCLIFake(t).base

			// The test binary runs main itself (see TestMain), so the signal
			// reaches the real signal handling of the command.
			cmd := exec.Command(os.Args[0], "agent", "--base-dir", base, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
			cmd.Env = append(os.Environ(), runMainEnv+"=1", "DATAPLANE_USERNAME=u", "DATAPLANE_PASSWORD=p", "LOG_LEVEL=info")
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(stderr)
			var messages []string
			for lines.Scan() {
				var rec struct {
					Msg    string `json:"msg"`
					Listen string `json:"listen"`
				}
				json.Unmarshal(lines.Bytes(), &rec)
				messages = append(messages, rec.Msg)
				if rec.Msg == "agent started" {
					waitReadyz(t, "http://"+rec.Listen)
					cmd.Process.Signal(sig)
				}
			}
			err = cmd.Wait()
			if err != nil {
				t.Errorf("after %s: %v, want exit 0; logs %q", sig, err, messages)
			}
			if len(messages) == 0 || messages[len(messages)-1] != "agent stopped" {
				t.Errorf("logs %q, want the last to be the stop", messages)
			}
		})
	}
}
