// push.go owns `haptic push`: a one-off push of a directory of rendered
// files to one or many agents, named one by one or all by one DNS name
// (fleet.go). Each agent gets its own Deploy (the whole state → diff →
// apply → resend → re-diff loop), at most --parallel at a time, each within
// --timeout and all within --deadline; with --canary, a few first and the
// rest only if those passed. It prints one line per agent, once: what the
// pod did and why as it finishes, or, for an agent that needs attention
// (it failed, did not do what --expect says, is not ready after a canary
// push, or acknowledged with an error), in the summary by outcome, beside
// the agents left untouched. Its exit status says which of those happened.
// It decides nothing itself: what each pod does is Diff's answer for that
// pod's own baseline.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/haptic-agent/haptic"
)

// Defaults of a push, and why.
const (
	// defaultPushParallel is how many agents one push reaches at a time.
	// An agent spends most of a push waiting (on HAProxy, on its disk's
	// fsyncs, on a reload), not computing, and the push itself only sends
	// bytes; so the bound is what keeps a fleet push short when some
	// agents are slow or hung: with 20 ms per HAProxy command, 1,000 agents
	// took 21 s at 8 and 12 s at 64, and 24 hung agents among 300 cost
	// 32 s at 8, since they held the few slots in turn. A bad render
	// reaching 64 pods at once is bounded by the agent: HAProxy refuses it
	// at the reload and each pod rolls back to its last-known-good files.
	defaultPushParallel = 64
	// defaultPushTimeout bounds one agent's whole push (state, apply,
	// resend, plan store). It is above the longest apply an agent may
	// legitimately take, a reload within the agent's --reload-timeout
	// (60 s by default) plus its writes, so that a slow reload is reported
	// as what it did rather than as a timeout.
	defaultPushTimeout = 90 * time.Second
	// pushStateTimeout bounds each state read within an agent's push. A
	// state read needs no HAProxy work, so an agent that accepts the
	// connection and does not answer it within this is hung, and costs
	// this long rather than the whole --timeout.
	pushStateTimeout = 10 * time.Second
	// defaultPushDeadline bounds the whole push: agents not reached by
	// then are reported as not pushed, those in flight are stopped.
	defaultPushDeadline = 10 * time.Minute
	// progressInterval is how often the progress line on a terminal is
	// redrawn while nothing finishes, so that the elapsed times move.
	progressInterval = 500 * time.Millisecond
)

// exitAckError is push's own exit status: every agent took the plan, and
// at least one answer carried an error beside its ACK (its files are not
// in place yet: the agent retries, and is not ready until they are). The
// plan stands on every pod, so this is not a failure (1), which wins when
// both happen; nor is it the plain success (0) a script must not mistake
// it for while pods are not ready.
const exitAckError = 3

// pushExitText documents push's exit statuses in its -h.
const pushExitText = "Exit status: 0 every agent took the plan (as --expect says); " +
	"1 some agent did not (it failed, did not do what --expect says, is not ready after a canary push, or was left untouched); 2 a usage error;\n" +
	"3 every agent took the plan and some answered with an error beside the ACK (its files not in place yet: the agent retries, " +
	"and is not ready until they are). 1 wins over 3."

// Outcomes of one agent's push, in the order the summary prints them.
// The first five are the agent's result modes; failed is every error and
// every NACK.
const outcomeFailed = "failed"

var pushOutcomes = []string{haptic.ResultRuntime, haptic.ResultFileOnly, haptic.ResultReload,
	haptic.ResultScheduled, haptic.ResultNoop, outcomeFailed}

// expectable are the outcomes --expect accepts.
var expectable = []string{haptic.ResultRuntime, haptic.ResultFileOnly, haptic.ResultReload, haptic.ResultScheduled, haptic.ResultNoop}

// pushOptions is how a push runs and reports.
type pushOptions struct {
	parallel int
	timeout  time.Duration   // per agent
	deadline time.Duration   // the whole push
	expect   map[string]bool // expected outcomes; nil = any
	canary   int             // agents pushed first, the rest only if they all pass; 0 = none
	quiet    bool            // only exceptions and the summary
	terminal bool            // stdout is a terminal: draw progress in place
	columns  int             // terminal width for the progress line
}

// pushFlags are the flags of `haptic push`; the deployment test parses the
// push Job's arguments with them.
type pushFlags struct {
	agents      agentClientFlags
	dnsURL      string
	o           pushOptions
	expect      string
	epoch       uint64
	previousDir string
}

func (f *pushFlags) register(fs *flag.FlagSet) {
	f.agents.register(fs, "URL of an agent to push to, e.g. https://10.0.0.7:5555; repeatable")
	fleetFlag(fs, &f.dnsURL)
	fs.IntVar(&f.o.canary, "canary", 0, "push this many agents first (the first given, or the first addresses of --agents-dns in order); "+
		"the rest are left untouched unless every one of them took the plan, did what --expect says and is ready after it")
	fs.IntVar(&f.o.parallel, "parallel", defaultPushParallel, "how many agents are pushed to at the same time")
	fs.DurationVar(&f.o.timeout, "timeout", defaultPushTimeout, "how long one agent's push may take; each state read within it at most "+pushStateTimeout.String())
	fs.DurationVar(&f.o.deadline, "deadline", defaultPushDeadline, "how long the whole push may take; agents not reached by then are not pushed")
	fs.StringVar(&f.expect, "expect", "", "comma-separated outcomes every agent must have, of "+strings.Join(expectable, ", ")+
		"; an agent with another outcome fails the push")
	fs.BoolVar(&f.o.quiet, "quiet", false, "print the summary alone: the agents that need attention and the counts, without the lines of the others")
	fs.Uint64Var(&f.epoch, "leader-epoch", 0, "fencing epoch of the applies; 0 uses each pod's current epoch (at least 1)")
	fs.StringVar(&f.previousDir, "previous", "", "the directory the agents hold, as pushed last: a changed file then travels as the changed bytes only, to the agents that hold exactly that render, and they are not asked for their stored plan")
}

// validate checks the flags and the arguments after parsing, and fills
// o.expect. Its error is a usage error.
func (f *pushFlags) validate(positional []string) error {
	switch {
	case len(f.agents.urls) == 0 && f.dnsURL == "":
		return errors.New("at least one --agent, or --agents-dns, is required")
	case len(f.agents.urls) > 0 && f.dnsURL != "":
		return errFleetTwice
	case f.o.canary < 0:
		return fmt.Errorf("--canary must not be negative, got %d", f.o.canary)
	case f.o.parallel < 1:
		return fmt.Errorf("--parallel must be at least 1, got %d", f.o.parallel)
	case f.o.timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", f.o.timeout)
	case f.o.deadline <= 0:
		return fmt.Errorf("--deadline must be positive, got %s", f.o.deadline)
	case len(positional) != 1:
		return fmt.Errorf("want one directory, got %s", countOf(len(positional), "argument"))
	}
	if f.expect != "" {
		f.o.expect = map[string]bool{}
		for v := range strings.SplitSeq(f.expect, ",") {
			if v = strings.TrimSpace(v); !slices.Contains(expectable, v) {
				return fmt.Errorf("--expect %q is not one of %s", v, strings.Join(expectable, ", "))
			}
			f.o.expect[v] = true
		}
	}
	for i, u := range f.agents.urls {
		// Two Deploys against one pod would fence each other.
		if slices.Contains(f.agents.urls[:i], u) {
			return fmt.Errorf("--agent %s is given twice", u)
		}
	}
	return nil
}

func runPush(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("push", "haptic push (--agent URL [--agent URL ...] | --agents-dns URL) [--canary N] [--parallel N] [--timeout D] [--deadline D] [--expect OUTCOMES] [--quiet] [--leader-epoch N] [--previous DIR] [TLS flags] DIR\n"+
		"Environment: "+credsHaptic+", else "+credsDataplane+" (HTTP Basic).\n"+pushExitText, s)
	f := pushFlags{o: pushOptions{terminal: s.terminal, columns: terminalColumns(s.getenv)}}
	f.register(fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if err := f.validate(positional); err != nil {
		return usageError(fs, "%v", err)
	}
	agents, o := &f.agents, f.o
	// The previous render holds the bytes a patch is cut from: the plan an
	// agent stores carries no file contents. It is read while the next one
	// is read and encoded: for a large map each is a parse and a hash of
	// every entry.
	var previous *haptic.Plan
	var previousErr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		if f.previousDir != "" {
			previous, previousErr = haptic.PlanFromDir(f.previousDir)
		}
	}()
	// A directory, not a plan file: an agent that lacks a file asks for its
	// bytes, and only a directory has them.
	next, err := haptic.PlanFromDir(positional[0])
	var blob []byte
	if err == nil {
		blob, err = haptic.EncodePlanBlob(next)
	}
	<-read
	if err != nil {
		fmt.Fprintf(s.err, "haptic push: %s\n", errText(err))
		return exitFailure
	}
	if previousErr != nil {
		fmt.Fprintf(s.err, "haptic push: --previous: %s\n", errText(previousErr))
		return exitFailure
	}
	// The change from the previous render is prepared once, for every
	// agent that holds it.
	var prepared *haptic.PreparedDeploy
	if previous != nil {
		prepared = haptic.PrepareDeploy(previous, next)
	}
	tlsConfig, err := agents.tlsConfig()
	urls := agents.urls
	if err == nil && f.dnsURL != "" {
		urls, err = fleetURLs(ctx, s.lookup, f.dnsURL)
		tlsConfig = fleetTLS(tlsConfig, f.dnsURL)
	}
	if err != nil {
		fmt.Fprintf(s.err, "haptic push: %v\n", err)
		return exitFailure
	}
	creds := credentialsFrom(s.getenv)

	r := pushAll(ctx, s.out, urls, o, func(ctx context.Context, url string, canary bool) pushResult {
		cfg := agents.clientConfig(url, tlsConfig, creds)
		cfg.Timeout, cfg.PerPodApplyTimeout = min(pushStateTimeout, o.timeout), o.timeout
		res := pushOne(ctx, cfg, next, previous, prepared, blob, f.epoch)
		if canary && res.err == nil && res.result.OK {
			res.notReady = readiness(ctx, cfg, creds)
		}
		return res
	}, creds)
	r.printSummary(next.ID)
	switch {
	case !r.allAsExpected():
		return exitFailure
	case len(r.ackErrors) > 0:
		return exitAckError
	}
	return exitOK
}

// readiness asks an agent whether it is ready: "" when it is, else why not
// (the agent's own words, or why it could not be asked).
func readiness(ctx context.Context, cfg *haptic.ClientConfig, creds agentCredentials) string {
	client, err := haptic.NewClient(cfg)
	if err != nil {
		return err.Error()
	}
	defer client.Close()
	start := time.Now()
	err = client.Ready(ctx)
	var he *haptic.HTTPError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &he) && he.Status == http.StatusServiceUnavailable:
		return he.Body
	}
	return explainErr(err, creds, time.Since(start))
}

// pushResult is what one agent's push returns: the agent's answer (nil
// when there is none), the decision the push expects the pod to follow
// and the pod's state it read first (nil when it could not read it), and
// the error; for a canary that took the plan, why it is not ready after
// it ("" = ready).
type pushResult struct {
	result   *haptic.ApplyResult
	decision *haptic.Decision
	before   *haptic.State
	err      error
	notReady string
}

// pushOne deploys next to one agent. It reads the pod's state first, to
// know the pod's epoch and what Deploy will decide for it (the reasons a
// reload prints), and hands Deploy the pod's baseline, so that the state
// Deploy reads again is without the blob.
//
// Without an explicit epoch it takes the pod's own (at least 1), as the
// example does: an operator's push then continues the pod's token rather
// than being fenced as stale, and a pod a newer controller leads still
// refuses it (stale_epoch) if the controller moves on meanwhile.
//
// A pod whose applied plan is the previous render (plan ids follow
// contents, so it holds exactly those bytes) shares the push's preparation
// and is read without its stored blob: its baseline costs it nothing, and
// a changed file travels as a patch. Any other pod's stored blob is read,
// decoded once, and prepared for that pod alone.
//
// prepared is PrepareDeploy(previous, next), nil without a previous render.
func pushOne(ctx context.Context, cfg *haptic.ClientConfig, next, previous *haptic.Plan, prepared *haptic.PreparedDeploy, blob []byte, epoch uint64) pushResult {
	client, err := haptic.NewClient(cfg)
	if err != nil {
		return pushResult{err: err}
	}
	defer client.Close()
	state, err := client.State(ctx, haptic.StateRead{Plan: prepared == nil})
	if err != nil {
		return pushResult{err: err}
	}
	opts := haptic.DeployOptions{LeaderEpoch: epoch, PlanBlob: blob, Prepared: prepared}
	if previous != nil && state.AppliedPlanID == previous.ID {
		opts.Applied = previous
	} else {
		if prepared != nil && state.HoldsAppliedPlan() {
			if state, err = client.State(ctx, haptic.StateRead{Plan: true}); err != nil {
				return pushResult{err: err}
			}
		}
		if base, err := haptic.BaselineFromState(state); err == nil {
			opts.Applied = base.Applied
		}
		// The decoded plan stands for the blob from here on.
		state.AppliedPlan = nil
		opts.Prepared = haptic.PrepareDeploy(opts.Applied, next)
	}
	if opts.LeaderEpoch == 0 {
		opts.LeaderEpoch = max(1, state.AppliedToken.LeaderEpoch)
	}
	decision, _ := asDeployed(state, next, opts.Prepared.Decision(state), nil)
	result, err := haptic.Deploy(ctx, client, next, opts)
	return pushResult{result: result, decision: &decision, before: state, err: err}
}

// pushAll runs push for every URL on at most o.parallel goroutines, each
// within o.timeout, all within o.deadline, prints the line of each agent
// that needs no attention as it finishes (unless o.quiet; the others wait
// for the summary), and on a terminal keeps a progress line of the agents
// still pending below them.
//
// With a canary, the first o.canary URLs are pushed first, and the rest
// only when every canary took the plan, did what --expect says and is
// ready after it; otherwise the rest are left untouched, so that a bad
// render HAProxy accepts reaches the canaries and no more.
func pushAll(ctx context.Context, out io.Writer, urls []string, o pushOptions,
	push func(ctx context.Context, url string, canary bool) pushResult, creds agentCredentials) *progress {
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	p := newProgress(out, len(urls), o)
	defer p.stop()
	canaries := urls[:min(o.canary, len(urls))]
	rest := urls[len(canaries):]
	if len(canaries) > 0 {
		pushEach(ctx, p, canaries, o, push, true, creds)
		if len(rest) == 0 {
			return p
		}
		if p.counts[outcomeFailed] > 0 || len(p.unexpected) > 0 || len(p.notReady) > 0 {
			p.untouched = rest
			return p
		}
		p.say(fmt.Sprintf("canary: passed on %s (took the plan as expected, ready after it); pushing the other %d",
			countOf(len(canaries), "agent"), len(rest)))
	}
	pushEach(ctx, p, rest, o, push, false, creds)
	return p
}

// pushEach is one round of pushAll: every URL of urls, canaries or not.
func pushEach(ctx context.Context, p *progress, urls []string, o pushOptions,
	push func(ctx context.Context, url string, canary bool) pushResult, canary bool, creds agentCredentials) {
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range min(o.parallel, len(urls)) {
		wg.Go(func() {
			for url := range jobs {
				start := time.Now()
				p.started(url, start)
				var res pushResult
				if ctx.Err() != nil {
					res.err = errNotReached
				} else {
					actx, acancel := context.WithTimeout(ctx, o.timeout)
					res = push(actx, url, canary)
					acancel()
				}
				outcome, line := describeOutcome(res, creds, time.Since(start), ctx.Err() != nil, o)
				if res.notReady != "" {
					line += "; not ready after the push: " + res.notReady
				}
				ackError := res.err == nil && res.result.OK && res.result.Error != nil
				p.finished(url, url+": "+line, outcome, res.notReady != "", ackError)
			}
		})
	}
	for _, url := range urls {
		jobs <- url
	}
	close(jobs)
	wg.Wait()
}

// errNotReached is the error of an agent whose turn came after the
// deadline.
var errNotReached = errors.New("not pushed: the push's --deadline passed before this agent's turn")

// describeOutcome is one agent's outcome and its line: what the pod did
// and why, or why it did not take the plan. A NACK (ok:false) did not
// take it: the pod rolled back to its last-known-good files.
func describeOutcome(res pushResult, creds agentCredentials, took time.Duration, pastDeadline bool, o pushOptions) (string, string) {
	switch {
	case errors.Is(res.err, errNotReached):
		return outcomeFailed, fmt.Sprintf("error: not pushed: the --deadline of %s passed before this agent's turn", o.deadline)
	case res.err != nil && pastDeadline && (errors.Is(res.err, context.DeadlineExceeded) || errors.Is(res.err, context.Canceled)):
		return outcomeFailed, fmt.Sprintf("error: stopped after %s: the --deadline of %s passed", seconds(took), o.deadline)
	case res.err != nil:
		return outcomeFailed, "error: " + explainErr(res.err, creds, took)
	}
	line, ok := pushLine(res)
	if !ok {
		return outcomeFailed, line
	}
	return res.result.Mode, line
}

// pushLine is one agent's outcome, starting with the mode: why it
// reloaded (the decision's reasons), the op kinds a runtime apply ran, the
// reload's time, and the error an ACK may carry; or, for a NACK, the
// stage, what serves now, and HAProxy's words, alerts first, one per line.
// ok is false for a NACK.
func pushLine(res pushResult) (string, bool) {
	result, d := res.result, res.decision
	if !result.OK {
		stage, message := "", ""
		if result.Error != nil {
			stage, message = result.Error.Stage, result.Error.Message
		}
		line := fmt.Sprintf("rejected at stage %q; %s", stage, servingAfter(result, res.before))
		if lines := haproxyLines(message); len(lines) > 0 {
			line += ":\n    " + strings.Join(lines, "\n    ")
		}
		return line, false
	}
	var why string
	switch result.Mode {
	case haptic.ResultRuntime:
		why = opKinds(result.OpResults)
	case haptic.ResultReload, haptic.ResultScheduled:
		why = reloadWhy(result, d)
	case haptic.ResultFileOnly:
		why = "files written, nothing for HAProxy to do"
		if d != nil && d.Verdict == haptic.VerdictFileOnly && len(d.Reasons) > 0 {
			why = strings.Join(d.Reasons, "; ")
		}
	case haptic.ResultNoop:
		why = "the pod already holds this plan"
	}
	line := result.Mode
	if why != "" {
		line += ": " + why
	}
	switch r := result.Reload; {
	case r != nil && r.Performed:
		line += fmt.Sprintf("; reloaded in %d ms, worker pid %d", r.TookMs, r.WorkerPID)
	case r != nil && r.ScheduledAt != "":
		line += "; reload scheduled at " + r.ScheduledAt
	}
	if result.Error != nil {
		line += "; " + result.Error.Message
	}
	return line, true
}

// servingAfter says what HAProxy serves after a NACK, as far as the answer
// tells. The agent names a running plan only where it can vouch for what
// the worker loaded: one HAProxy kept (it refused the reload, or nothing
// reached it) still serves the configuration from before the push; one
// the apply may have changed (its ops ran, or its reload may have taken
// effect) is named only once the recovery reload of the restored files
// succeeded. Without a running plan nothing is claimed; before is the
// pod's state read first, which tells a pod that never ran a pushed plan
// (its first push) from one that lost track of it in this one.
func servingAfter(r *haptic.ApplyResult, before *haptic.State) string {
	switch {
	case r.Rollback != nil && r.Rollback.Reloaded && r.RunningPlanID != "":
		return fmt.Sprintf("the previous configuration is serving again (plan %s): HAProxy reloaded the restored files", r.RunningPlanID)
	case r.Rollback != nil && r.Rollback.Reloaded:
		return "the previous configuration is serving again: HAProxy reloaded the restored files"
	case r.RunningPlanID != "":
		return fmt.Sprintf("the previous configuration is still serving (plan %s)", r.RunningPlanID)
	case before != nil && before.RunningPlanID == "":
		return "the pod ran no pushed plan before this push, and the agent names none now"
	}
	return "the agent no longer names a running plan, so what HAProxy serves now is not known (haptic agent state shows its worker)"
}

// opKinds names the ops a runtime apply ran, in order, a run of one kind
// as "kind ×n".
func opKinds(results []haptic.OpResult) string {
	var parts []string
	for i := 0; i < len(results); {
		j := i
		for j < len(results) && results[j].Kind == results[i].Kind {
			j++
		}
		if n := j - i; n > 1 {
			parts = append(parts, fmt.Sprintf("%s ×%d", results[i].Kind, n))
		} else {
			parts = append(parts, results[i].Kind)
		}
		i = j
	}
	return strings.Join(parts, ", ")
}

// reloadWhy is why a pod reloaded: the decision's reasons when the push
// decided to reload, and otherwise what the agent's answer shows (an op
// HAProxy refused, or an agent that could not run the ops against its
// baseline and reloaded instead).
func reloadWhy(result *haptic.ApplyResult, d *haptic.Decision) string {
	if d != nil && d.Verdict == haptic.VerdictReload && len(d.Reasons) > 0 {
		return strings.Join(d.Reasons, "; ")
	}
	for _, op := range result.OpResults {
		if !op.OK {
			return fmt.Sprintf("HAProxy refused %s (%s), so the agent reloaded instead", op.Kind, strings.Join(haproxyLines(op.Output), " "))
		}
	}
	if d != nil && d.Verdict != haptic.VerdictReload {
		return fmt.Sprintf("the push decided %s, but the agent reloaded (its baseline moved during the push, or it could not run the ops against it)", d.Verdict)
	}
	return "the agent's baseline is unknown"
}

// printSummary prints the counts by outcome, the agents that failed and
// those --expect did not allow (each group sorted by URL), and the final
// line. It runs once every push has finished.
func (p *progress) printSummary(planID string) {
	counts := make([]string, 0, len(pushOutcomes))
	for _, k := range pushOutcomes {
		counts = append(counts, fmt.Sprintf("%s %d", k, p.counts[k]))
	}
	fmt.Fprintf(p.out, "summary: %s\n", strings.Join(counts, ", "))
	list := func(title string, lines []string) {
		if len(lines) == 0 {
			return
		}
		slices.Sort(lines)
		fmt.Fprintf(p.out, "%s:\n", title)
		for _, l := range lines {
			fmt.Fprintf(p.out, "  %s\n", strings.ReplaceAll(l, "\n", "\n  "))
		}
	}
	list("failed", p.failedLines)
	if p.o.expect != nil {
		expected := slices.DeleteFunc(slices.Clone(pushOutcomes), func(k string) bool { return !p.o.expect[k] })
		list("unexpected (--expect "+strings.Join(expected, ",")+")", p.unexpected)
	}
	list("not ready after the push", p.notReady)
	list("acknowledged with an error", p.ackErrors)
	if len(p.untouched) > 0 {
		why := nonZero(tally{p.counts[outcomeFailed], "failed"}, tally{len(p.unexpected), "not as --expect says"},
			tally{len(p.notReady), "not ready after the push"})
		list(fmt.Sprintf("untouched (the canary of %d stopped the push: %s)", p.done, strings.Join(why, ", ")), p.untouched)
	}
	line := fmt.Sprintf("plan %s: %d of %d agent(s) took it", planID, p.done-p.counts[outcomeFailed], p.total)
	for _, t := range nonZero(tally{len(p.unexpected), "not as --expect says"}, tally{len(p.notReady), "not ready after it"},
		tally{len(p.ackErrors), "with an error in the ACK"}, tally{len(p.untouched), "left untouched"}) {
		line += ", " + t
	}
	fmt.Fprintln(p.out, line)
}

// allAsExpected reports whether every agent took the plan as --expect
// says, ready after it where that was asked, and none was left untouched.
func (p *progress) allAsExpected() bool {
	return p.counts[outcomeFailed] == 0 && len(p.unexpected) == 0 && len(p.notReady) == 0 && len(p.untouched) == 0
}

// tally is a count and what it counts.
type tally struct {
	n    int
	what string
}

// nonZero is "n what" for each tally above zero.
func nonZero(tallies ...tally) []string {
	var out []string
	for _, t := range tallies {
		if t.n > 0 {
			out = append(out, fmt.Sprintf("%d %s", t.n, t.what))
		}
	}
	return out
}
