// Test harness of the command: it runs subcommands in-process through run,
// with captured output and a scripted environment, and starts real agents
// on fake HAProxies for the commands that talk to one. Dispatch and flag
// parsing tests live here too.

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// runMainEnv makes the test binary run the command's main instead of the
// tests, so that a test can start the command as a process and signal it.
const runMainEnv = "HAPTIC_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// cliResult is one in-process run of the command.
type cliResult struct {
	code     int
	out, err string
}

// runCLI runs the command with args and the given environment.
func runCLI(t testing.TB, env map[string]string, args ...string) cliResult {
	t.Helper()
	return runCLIContext(t, context.Background(), env, args...)
}

func runCLIContext(t testing.TB, ctx context.Context, env map[string]string, args ...string) cliResult {
	t.Helper()
	return runCLIResolving(t, ctx, nil, env, args...)
}

// runCLIResolving runs the command with lookup as its resolver of
// --agents-dns names.
func runCLIResolving(t testing.TB, ctx context.Context, lookup lookupFunc, env map[string]string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(ctx, args, stdio{out: &out, err: &errOut, getenv: func(k string) string { return env[k] }, lookup: lookup})
	return cliResult{code: code, out: out.String(), err: errOut.String()}
}

// runBinary runs the command as a process, the test binary running main
// (see TestMain), with only the given environment besides the process's
// own PATH and HOME, and returns its exit status and output.
func runBinary(t testing.TB, env map[string]string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running %v: %v", args, err)
	}
	return cliResult{code: code, out: out.String(), err: errOut.String()}
}

// testDir is a directory of testdata/dirs.
func testDir(name string) string {
	return filepath.Join("..", "..", "testdata", "dirs", name)
}

// Credentials of the agents the tests start.
const (
	testAgentUser = "haptic"
	testAgentPass = "s3cret"
)

// testAgent is a real agent on a fake HAProxy, on a short temp base dir.
type testAgent struct {
	*haptic.Agent
	fake *haptic.FakeHAProxy
	base string
}

// URL is the agent's API base URL.
func (a *testAgent) URL() string { return "http://" + a.Addr() }

// cliFake is a fake HAProxy serving the agent's default socket names in a
// short base directory (unix socket paths are limited to 107 bytes).
type cliFake struct {
	fake *haptic.FakeHAProxy
	base string
}

func startCLIFake(t testing.TB) cliFake {
	t.Helper()
	base, err := os.MkdirTemp("", "hc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	fake, err := haptic.StartFakeHAProxy(base, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Close() })
	return cliFake{fake: fake, base: base}
}

// startCLIAgent starts a fake HAProxy and an agent on one base directory,
// with the admin socket on, and waits until the agent is ready. The fake
// reads no configuration, so its reload "loads" every map file of the
// testdata renders from the base directory, as a real worker would.
func startCLIAgent(t testing.TB, mutate func(*haptic.AgentConfig)) *testAgent {
	t.Helper()
	hap := startCLIFake(t)
	base, fake := hap.base, hap.fake
	fake.With(func(m *haptic.FakeModel) {
		m.OnReload = func(m *haptic.FakeModel) {
			content, err := os.ReadFile(filepath.Join(base, "maps", "host.map"))
			if err != nil {
				return
			}
			if m.Maps == nil {
				m.Maps = map[string][]haptic.MapEntry{}
			}
			m.Maps["maps/host.map"] = haptic.ParseMapEntries(string(content))
		}
	})
	cfg := haptic.AgentConfig{
		BaseDir:      base,
		MasterSocket: fake.MasterSocket(),
		WorkerSocket: fake.WorkerSocket(),
		Listen:       "127.0.0.1:0",
		AdminSocket:  defaultAdminSocket,
		Username:     testAgentUser,
		Password:     testAgentPass,
		Logger:       discardLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	agent, err := haptic.NewAgent(cfg)
	if err != nil {
		t.Fatalf("NewAgent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancellation")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !agent.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not become ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &testAgent{Agent: agent, fake: fake, base: base}
}

// discardLogger keeps the agents' logs out of the test output.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestRunDispatchesAndRefusesUnknownCommands(t *testing.T) {
	for _, c := range []struct {
		args    []string
		code    int
		errPart string
		outPart string
	}{
		{nil, exitUsage, "Usage:", ""},
		{[]string{"frobnicate"}, exitUsage, `haptic: unknown command "frobnicate"`, ""},
		{[]string{"help"}, exitOK, "", "haptic push --agent URL"},
		{[]string{"plan", "-h"}, exitOK, "Usage: haptic plan DIR", ""},
		{[]string{"plan"}, exitUsage, "haptic plan: want one directory, got 0 arguments\nRun \"haptic plan -h\" for usage.\n", ""},
		{[]string{"push", "--frobnicate"}, exitUsage, "haptic push: flag provided but not defined: -frobnicate\nRun \"haptic push -h\" for usage.\n", ""},
	} {
		r := runCLI(t, nil, c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.errPart) || !strings.Contains(r.out, c.outPart) {
			t.Errorf("haptic %q: code %d, stdout %q, stderr %q; want code %d, stderr with %q, stdout with %q",
				c.args, r.code, r.out, r.err, c.code, c.errPart, c.outPart)
		}
	}
}

func TestParseArgsTakesFlagsAnywhere(t *testing.T) {
	for _, c := range []struct {
		args       []string
		positional []string
		version    string
	}{
		{[]string{"a", "b"}, []string{"a", "b"}, "def"},
		{[]string{"--v", "3.0", "a", "b"}, []string{"a", "b"}, "3.0"},
		{[]string{"a", "--v", "3.0", "b"}, []string{"a", "b"}, "3.0"},
		{[]string{"a", "b", "--v=3.0"}, []string{"a", "b"}, "3.0"},
		{[]string{"a", "--", "--v", "b"}, []string{"a", "--v", "b"}, "def"},
		{nil, nil, "def"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		v := fs.String("v", "def", "")
		got, err := parseArgs(fs, c.args)
		if err != nil || !reflect.DeepEqual(got, c.positional) || *v != c.version {
			t.Errorf("parseArgs(%q) = %q, %v, v=%q; want %q, v=%q", c.args, got, err, *v, c.positional, c.version)
		}
	}
}

func TestLocalPathResolvesAgainstTheBaseDir(t *testing.T) {
	for _, c := range []struct{ base, p, want string }{
		{"/etc/haproxy", ".haptic-agent.sock", "/etc/haproxy/.haptic-agent.sock"},
		{"/etc/haproxy", "run/admin.sock", "/etc/haproxy/run/admin.sock"},
		{"/etc/haproxy", "/run/haptic/admin.sock", "/run/haptic/admin.sock"},
		{"/etc/haproxy", "", ""},
	} {
		if got := localPath(c.base, c.p); got != c.want {
			t.Errorf("localPath(%q, %q) = %q, want %q", c.base, c.p, got, c.want)
		}
	}
}
