// push.go owns `haptic push`: a one-off push of a directory of rendered
// files to one or many agents. Each agent gets its own Deploy (the whole
// state → diff → apply → resend → re-diff loop), at most --parallel at a
// time, and one line as it finishes. It decides nothing itself: what each
// pod does is Diff's answer for that pod's own baseline.
package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/haptic-agent/haptic"
)

// defaultPushParallel bounds how many agents one push reaches at a time:
// enough to roll a large fleet quickly, few enough that a bad render
// reaches a handful of pods before the operator sees the first answers.
const defaultPushParallel = 8

func runPush(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("push", "haptic push --agent URL [--agent URL ...] [--parallel N] [--leader-epoch N] [TLS flags] DIR\n"+
		"Environment: HAPTIC_AGENT_USER and HAPTIC_AGENT_PASS (HTTP Basic).", s)
	var agents agentClientFlags
	agents.register(fs, "URL of an agent to push to, e.g. https://10.0.0.7:5555; repeatable")
	parallel := fs.Int("parallel", defaultPushParallel, "how many agents are pushed to at the same time")
	epoch := fs.Uint64("leader-epoch", 0, "fencing epoch of the applies; 0 uses each pod's current epoch (at least 1)")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	switch {
	case len(agents.urls) == 0:
		return usageError(fs, "at least one --agent is required")
	case *parallel < 1:
		return usageError(fs, "--parallel must be at least 1, got %d", *parallel)
	case len(positional) != 1:
		return usageError(fs, "want one directory, got %d arguments", len(positional))
	}
	for i, u := range agents.urls {
		// Two Deploys against one pod would fence each other.
		if slices.Contains(agents.urls[:i], u) {
			return usageError(fs, "--agent %s is given twice", u)
		}
	}
	// A directory, not a plan file: an agent that lacks a file asks for its
	// bytes, and only a directory has them.
	next, err := haptic.PlanFromDir(positional[0])
	if err != nil {
		fmt.Fprintf(s.err, "haptic push: %v\n", err)
		return exitFailure
	}
	blob, err := haptic.EncodePlanBlob(next)
	if err != nil {
		fmt.Fprintf(s.err, "haptic push: %v\n", err)
		return exitFailure
	}
	tlsConfig, err := agents.tlsConfig()
	if err != nil {
		fmt.Fprintf(s.err, "haptic push: %v\n", err)
		return exitFailure
	}

	took := pushAll(ctx, s.out, agents.urls, *parallel, func(ctx context.Context, url string) (*haptic.ApplyResult, error) {
		return pushOne(ctx, agents.clientConfig(url, tlsConfig, s.getenv), next, blob, *epoch)
	})
	fmt.Fprintf(s.out, "plan %s: %d of %d agent(s) took it\n", next.ID, took, len(agents.urls))
	if took != len(agents.urls) {
		return exitFailure
	}
	return exitOK
}

// pushAll runs push for every URL on at most parallel goroutines, prints
// one line per agent as it finishes, and returns how many took the plan.
func pushAll(ctx context.Context, out io.Writer, urls []string, parallel int,
	push func(ctx context.Context, url string) (*haptic.ApplyResult, error)) int {
	jobs := make(chan string)
	var (
		mu   sync.Mutex // serialises the lines and the count
		took int
		wg   sync.WaitGroup
	)
	for range min(parallel, len(urls)) {
		wg.Go(func() {
			for url := range jobs {
				result, err := push(ctx, url)
				line, ok := pushLine(result, err)
				mu.Lock()
				fmt.Fprintf(out, "%s: %s\n", url, line)
				if ok {
					took++
				}
				mu.Unlock()
			}
		})
	}
	for _, url := range urls {
		jobs <- url
	}
	close(jobs)
	wg.Wait()
	return took
}

// pushOne deploys next to one agent. Without an explicit epoch it takes the
// pod's own (at least 1), as the example does: an operator's push then
// continues the pod's token rather than being fenced as stale, and a pod a
// newer controller leads still refuses it (stale_epoch) if the controller
// moves on meanwhile.
func pushOne(ctx context.Context, cfg *haptic.ClientConfig, next *haptic.Plan, blob []byte, epoch uint64) (*haptic.ApplyResult, error) {
	client, err := haptic.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	if epoch == 0 {
		state, err := client.State(ctx, haptic.StateRead{})
		if err != nil {
			return nil, err
		}
		epoch = max(1, state.AppliedToken.LeaderEpoch)
	}
	return haptic.Deploy(ctx, client, next, haptic.DeployOptions{LeaderEpoch: epoch, PlanBlob: blob})
}

// pushLine is one agent's outcome on one line: the mode, the op count and
// the reload, or why the agent did not take the plan. A NACK (ok:false)
// did not take it: the pod rolled back to its last-known-good files.
func pushLine(result *haptic.ApplyResult, err error) (string, bool) {
	switch {
	case err != nil:
		return "error: " + oneLine(err.Error()), false
	case !result.OK:
		stage, message := "", ""
		if result.Error != nil {
			stage, message = result.Error.Stage, result.Error.Message
		}
		return fmt.Sprintf("rejected at stage %q: %s", stage, oneLine(message)), false
	}
	line := fmt.Sprintf("%s, %d op(s), ", result.Mode, len(result.OpResults))
	switch r := result.Reload; {
	case r != nil && r.Performed:
		line += fmt.Sprintf("reloaded in %d ms, worker pid %d", r.TookMs, r.WorkerPID)
	case r != nil && r.ScheduledAt != "":
		line += "reload scheduled at " + r.ScheduledAt
	default:
		line += "no reload"
	}
	return line, true
}

// oneLine folds a multi-line message (HAProxy's log of a refused reload)
// into one line.
func oneLine(s string) string {
	return strings.Join(strings.Split(strings.TrimSpace(s), "\n"), " / ")
}
