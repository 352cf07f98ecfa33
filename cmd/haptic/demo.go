// demo.go owns `haptic demo`: the basic-apply example's two renders, run in
// one process against an agent it starts beside a fake HAProxy (the
// default) or a real HAProxy binary in master-worker mode. Everything it
// starts lives in one temporary directory and is stopped and removed
// before it returns, on success, on failure and on SIGINT.
//
// The example (cmd/basic-apply) drives the agent call by call; the demo
// drives the same two renders (internal/example, written as directories and
// read with PlanFromDir) through the controller loop, Deploy, the way
// `haptic push` does, and prints the same output: one flow at two levels of
// the API.

package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/haptic-agent/haptic"
	"github.com/haptic-agent/haptic/internal/example"
)

// demoBootConfig is what a real HAProxy starts with before the first
// render, like a pod's image config: the worker stats socket the agent
// needs and one listener (HAProxy refuses to start without any).
const demoBootConfig = `global
    stats socket <dir>/haproxy-worker.sock mode 600 level admin
    default-path origin <dir>

frontend boot
    mode http
    bind unix@<dir>/boot.sock
    http-request return status 200
`

// Bounds of the demo's waits. HAProxy starts in well under a second; the
// agent's own shutdown grace is 15 s.
const (
	demoReadyTimeout    = 30 * time.Second
	demoReadyPoll       = 50 * time.Millisecond
	demoAgentStopWait   = 20 * time.Second
	demoHAProxyStopWait = 5 * time.Second
)

func runDemo(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("demo", "haptic demo [--haproxy PATH]", s)
	haproxyBin := fs.String("haproxy", "", "a real HAProxy binary to run in master-worker mode; default: the fake HAProxy")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) > 0 {
		return usageError(fs, "unexpected argument %q", positional[0])
	}
	// The agent logs only what needs attention unless LOG_LEVEL says more.
	logger, err := newLogger(s.err, s.getenv("LOG_LEVEL"), slog.LevelWarn)
	if err != nil {
		return usageError(fs, "%v", err)
	}
	if *haproxyBin == "" {
		// The first line of the output names the fake's HAProxy version,
		// which reads like a real one; stdout stays the example's output.
		fmt.Fprint(s.err, demoFakeNote)
	}
	if err := demo(ctx, s.out, *haproxyBin, logger); err != nil {
		fmt.Fprintf(s.err, "haptic demo: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// demoFakeNote tells the operator that the demo's HAProxy is not a real one.
const demoFakeNote = "haptic demo: the HAProxy here is the in-process fake (haptic.FakeHAProxy), which serves no traffic; " +
	"run haptic demo --haproxy /path/to/haproxy for a real one\n"

// demo runs the whole flow. Every resource is released by a deferred call
// registered right after it is acquired, so an error at any step cleans up
// exactly what was started.
func demo(ctx context.Context, out io.Writer, haproxyBin string, logger *slog.Logger) (err error) {
	// Short: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "hdemo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	base := filepath.Join(dir, "base")
	renders := []string{filepath.Join(dir, "render-1"), filepath.Join(dir, "render-2")}
	if err := os.Mkdir(base, 0o755); err != nil {
		return err
	}
	for i, hostMap := range []string{example.HostMapV1, example.HostMapV2} {
		if err := example.WriteRender(renders[i], example.ConfigIn(base), hostMap); err != nil {
			return err
		}
	}

	var exited <-chan struct{} // closed when a real HAProxy exits; nil for the fake
	if haproxyBin == "" {
		fake, err := example.StartFake(base)
		if err != nil {
			return err
		}
		defer fake.Close()
	} else {
		var h *demoHAProxy
		if h, err = startDemoHAProxy(haproxyBin, base); err != nil {
			return err
		}
		exited = h.exited
		// HAProxy's own words are what explain a failed demo on a real
		// binary; they are printed only then (not when the operator
		// interrupted it), once HAProxy has stopped writing them.
		defer func() {
			h.stop()
			if err != nil && !errors.Is(err, context.Canceled) {
				err = fmt.Errorf("%w\nHAProxy output:\n%s", err, h.output.String())
			}
		}()
	}

	password := rand.Text()
	agent, err := haptic.NewAgent(haptic.AgentConfig{BaseDir: base, Listen: "127.0.0.1:0",
		MasterSocket: filepath.Join(base, "haproxy-master.sock"), WorkerSocket: filepath.Join(base, "haproxy-worker.sock"),
		Username: "demo", Password: password, AgentVersion: agentVersion(), Logger: logger})
	if err != nil {
		return err
	}
	runCtx, stopAgent := context.WithCancel(ctx)
	// stopped is closed once Run has returned, with its error in runErr, so
	// that the readiness wait and the cleanup can both observe it.
	stopped := make(chan struct{})
	var runErr error
	go func() {
		runErr = agent.Run(runCtx)
		close(stopped)
	}()
	defer func() {
		stopAgent()
		select {
		case <-stopped:
		case <-time.After(demoAgentStopWait):
		}
	}()
	if err = waitDemoReady(ctx, agent, stopped, func() error { return runErr }, exited); err != nil {
		return err
	}

	client, err := haptic.NewClient(&haptic.ClientConfig{BaseURL: "http://" + agent.Addr(), Username: "demo", Password: password})
	if err != nil {
		return err
	}
	defer client.Close()
	return demoRenders(ctx, out, client, renders)
}

// demoHAProxy is a real HAProxy master process the demo started. output
// collects both its pipes: exec writes to one writer given for both from
// one goroutine at a time, and exited closes only once those writes ended.
type demoHAProxy struct {
	cmd    *exec.Cmd
	output strings.Builder
	exited chan struct{}
}

// startDemoHAProxy starts bin in master-worker mode in the foreground, with
// the master CLI socket the agent reloads through, on the boot config.
func startDemoHAProxy(bin, base string) (*demoHAProxy, error) {
	cfg := filepath.Join(base, haptic.ConfigFilePath)
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(demoBootConfig, "<dir>", base)), 0o644); err != nil {
		return nil, err
	}
	h := &demoHAProxy{exited: make(chan struct{})}
	h.cmd = exec.Command(bin, "-W", "-db", "-S", filepath.Join(base, "haproxy-master.sock")+",level,admin", "-f", cfg)
	h.cmd.Dir = base
	h.cmd.Stdout, h.cmd.Stderr = &h.output, &h.output
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		h.cmd.Wait()
		close(h.exited)
	}()
	return h, nil
}

// stop terminates the master (which stops its workers), then kills it if
// it has not exited in time.
func (h *demoHAProxy) stop() {
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(demoHAProxyStopWait):
		h.cmd.Process.Kill()
		<-h.exited
	}
}

// waitDemoReady waits until the agent has found HAProxy and adopted its
// worker, and fails early when the agent or HAProxy stops first.
func waitDemoReady(ctx context.Context, agent *haptic.Agent, stopped <-chan struct{}, runErr func() error, exited <-chan struct{}) error {
	deadline := time.NewTimer(demoReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(demoReadyPoll)
	defer tick.Stop()
	for !agent.Ready() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			if ctx.Err() != nil {
				return ctx.Err() // Run ends cleanly when it is cancelled
			}
			return fmt.Errorf("the agent stopped before it was ready: %v", runErr())
		case <-exited:
			return errors.New("HAProxy exited before the agent was ready")
		case <-deadline.C:
			return fmt.Errorf("the agent did not find HAProxy within %s", demoReadyTimeout)
		case <-tick.C:
		}
	}
	return nil
}

// demoRenders pushes each render in turn and prints the example's output.
func demoRenders(ctx context.Context, out io.Writer, client *haptic.Client, renders []string) error {
	state, err := client.State(ctx, haptic.StateRead{})
	if err != nil {
		return fmt.Errorf("failed to read the agent's state: %w", err)
	}
	example.PrintIntro(out, state)
	for i, dir := range renders {
		if i > 0 {
			fmt.Fprint(out, "\n")
		}
		next, err := haptic.PlanFromDir(dir)
		if err != nil {
			return err
		}
		// What Deploy will decide, printed before it acts: the same state,
		// the same rules.
		state, err := client.State(ctx, haptic.StateRead{Plan: true})
		if err != nil {
			return fmt.Errorf("failed to read the agent's state: %w", err)
		}
		decision, notes := liveDecision(state, next)
		example.PrintDecision(out, next.ID, decision, notes)
		result, err := haptic.Deploy(ctx, client, next, haptic.DeployOptions{LeaderEpoch: max(1, state.AppliedToken.LeaderEpoch)})
		if err != nil {
			return fmt.Errorf("apply failed: %w", err)
		}
		example.PrintResult(out, result)
		if !result.OK {
			return errors.New("the agent rejected the render; its files and HAProxy are back on the last-known-good set")
		}
	}
	example.PrintDone(out)
	return nil
}
