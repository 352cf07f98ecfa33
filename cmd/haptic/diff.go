// diff.go owns `haptic plan` and `haptic diff`: loading a plan from a
// directory or a file, the offline baseline, the live baseline of an agent,
// and printing a decision. It never writes to an agent: `diff --agent`
// reads the state and stops there.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/haptic-agent/haptic"
)

// defaultDiffHAProxyVersion is the HAProxy an offline diff assumes when
// --haproxy-version is not given: the current 3.x, the version the fake
// HAProxy (and so `haptic demo`) speaks, with every runtime capability
// (dynamic servers, init-state, dynamic backends). A fleet on an older
// HAProxy passes its version, and the diff then reloads where that version
// cannot change things at runtime.
const defaultDiffHAProxyVersion = "3.4"

func runPlan(args []string, s stdio) int {
	fs := newFlagSet("plan", "haptic plan DIR", s)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) != 1 {
		return usageError(fs, "want one directory, got %s", countOf(len(positional), "argument"))
	}
	p, err := haptic.PlanFromDir(positional[0])
	if err != nil {
		fmt.Fprintf(s.err, "haptic plan: %s\n", errText(err))
		return exitFailure
	}
	out, _ := json.MarshalIndent(p, "", "  ") // a plan holds no value encoding/json refuses
	s.out.Write(append(out, '\n'))
	return exitOK
}

// runDiff prints what a pod would do to go from one plan to another, and
// answers with its exit status: 0 when the change reaches the running
// worker (runtime), needs no HAProxy action (file_only) or is no change at
// all (noop), 1 when it reloads, 2 when it could not tell.
func runDiff(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("diff", "haptic diff [--haproxy-version V] OLD NEW | haptic diff --agent URL [flags] DIR\n"+
		"OLD, NEW and DIR are each a directory of rendered files, a plan JSON file (haptic plan) or a plan blob.\n"+
		"Environment, with --agent: "+credsHaptic+", else "+credsDataplane+" (HTTP Basic).", s)
	version := fs.String("haproxy-version", defaultDiffHAProxyVersion,
		"HAProxy version an offline diff assumes (what it can change at runtime); with --agent the agent's own version is used")
	var agent agentClientFlags
	agent.register(fs, "URL of a live agent to diff against (its state and stored plan), e.g. https://10.0.0.7:5555")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	versionSet := false
	fs.Visit(func(f *flag.Flag) { versionSet = versionSet || f.Name == "haproxy-version" })

	var (
		from     string
		decision haptic.Decision
		notes    []string
	)
	switch {
	case len(agent.urls) > 1:
		return usageError(fs, "diff takes one --agent; use push to reach several")
	case len(agent.urls) == 1 && versionSet:
		return usageError(fs, "--haproxy-version is the agent's own with --agent")
	case len(agent.urls) == 1 && len(positional) != 1:
		return usageError(fs, "with --agent, want one directory or plan file, got %s", countOf(len(positional), "argument"))
	case len(agent.urls) == 0 && len(positional) != 2:
		return usageError(fs, "want OLD and NEW, got %s", countOf(len(positional), "argument"))
	case len(agent.urls) == 0 && !readableVersion(*version):
		return usageError(fs, "--haproxy-version %q is not a version such as 3.0 or 3.4.3", *version)
	}
	// Every path is read before any error is reported, so that one run
	// names each path that is wrong, not only the first.
	plans := make([]*haptic.Plan, len(positional))
	failed := false
	for i, path := range positional {
		if plans[i], err = loadPlan(path); err != nil {
			fmt.Fprintf(s.err, "haptic diff: %s\n", errText(err))
			failed = true
		}
	}
	if failed {
		return exitUsage
	}
	next := plans[len(plans)-1]
	if len(agent.urls) == 0 {
		from, decision = plans[0].ID, haptic.Diff(next, offlineBaseline(plans[0], *version))
	} else {
		creds := credentialsFrom(s.getenv)
		start := time.Now()
		state, err := readAgentState(ctx, &agent, creds)
		if err != nil {
			fmt.Fprintf(s.err, "haptic diff: %s\n", explainErr(err, creds, time.Since(start)))
			return exitUsage
		}
		from = state.AppliedPlanID
		decision, notes = liveDecision(state, next)
	}
	printDecision(s.out, from, next.ID, decision, notes)
	if decision.Verdict == haptic.VerdictReload {
		return exitFailure
	}
	return exitOK
}

// readableVersion reports whether CapsFor can read a major version from v.
func readableVersion(v string) bool {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	return v != "" && v[0] >= '0' && v[0] <= '9'
}

// offlineBaseline is a pod that applied old and reloaded it: the worker
// holds exactly old (Applied = Running = WorkerOps) and has loaded what old
// declares (InventoryOf), on the given HAProxy version, with an agent that
// executes every op kind and has nothing pending.
func offlineBaseline(old *haptic.Plan, haproxyVersion string) *haptic.Baseline {
	return &haptic.Baseline{Applied: old, Running: old, WorkerOps: old, Inventory: haptic.InventoryOf(old),
		Caps: haptic.CapsFor(haproxyVersion, haptic.ComposedOps())}
}

// readAgentState reads one agent's state with its stored plan, the
// baseline a live diff needs.
func readAgentState(ctx context.Context, agent *agentClientFlags, creds agentCredentials) (*haptic.State, error) {
	tlsConfig, err := agent.tlsConfig()
	if err != nil {
		return nil, err
	}
	client, err := haptic.NewClient(agent.clientConfig(agent.urls[0], tlsConfig, creds))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	return client.State(ctx, haptic.StateRead{Plan: true})
}

// liveDecision is what Deploy decides for a pod in this state (the baseline
// from its state, then Diff), with a note for every reason the baseline was
// dropped, since "no baseline" alone does not tell an operator why.
func liveDecision(state *haptic.State, next *haptic.Plan) (haptic.Decision, []string) {
	var notes []string
	base, err := haptic.BaselineFromState(state)
	switch {
	case err != nil:
		notes = append(notes, fmt.Sprintf("the agent's stored plan is unreadable (%v), so its baseline is unknown", err))
	case base.Applied == nil && state.AppliedPlanID != "":
		notes = append(notes, fmt.Sprintf("the agent holds no plan for its applied plan %s, so its baseline is unknown", state.AppliedPlanID))
	}
	major, missingOps := haptic.CheckSkew(state)
	switch {
	case major:
		notes = append(notes, fmt.Sprintf("the agent speaks API %d, not %d: the whole file set is sent with a reload", state.APIVersion, haptic.APIVersion))
		base = nil
	case len(missingOps) > 0:
		// Not a refusal: Diff reloads where it would need one of them.
		notes = append(notes, fmt.Sprintf("the agent cannot run %s: a change that needs them reloads", strings.Join(missingOps, ", ")))
	}
	return asDeployed(state, next, haptic.Diff(next, base), notes)
}

// asDeployed is what Deploy does with Diff's decision for a pod in this
// state, with a note for each change it makes.
func asDeployed(state *haptic.State, next *haptic.Plan, decision haptic.Decision, notes []string) (haptic.Decision, []string) {
	if !slices.Contains(state.Features, haptic.FeatureRuntimeBatches) && len(decision.Chunk()) > 1 {
		notes = append(notes, fmt.Sprintf("the change needs %d applies and the agent takes one batch per apply: reload", len(decision.Chunk())))
		decision = haptic.Diff(next, nil)
	}
	// NewManifest sends an automatic decision as a reload when the pod cannot
	// prove its baseline: answer what the pod will do.
	if m := haptic.NewManifest(next, decision, state, haptic.Token{}); decision.Mode == haptic.ModeAuto && m.Mode == haptic.ModeReload {
		notes = append(notes, "the agent holds no proof of its applied or worker baseline (it restarted, or a batch failed), so the apply is a reload")
		decision.Verdict, decision.Mode, decision.Ops, decision.Chunks = haptic.VerdictReload, haptic.ModeReload, nil, 0
		if len(m.InPlaceOps) == 0 {
			decision.InPlace, decision.WorkerPlan = nil, nil
		}
	}
	return decision, notes
}

// verdictNoop is what the command calls a render identical to the
// baseline. Diff answers file_only for it by contract, so that a controller
// sends it (the agent then answers noop, having nothing to write); an
// operator asking "what will this push do?" should read the word the push
// then prints.
const verdictNoop = "noop"

// cliVerdict is noop for a plan whose id is the baseline's (ids digest the
// whole content) when Diff found nothing to do, Diff's verdict otherwise.
func cliVerdict(from, to string, d haptic.Decision) string {
	if from != "" && from == to && d.Verdict == haptic.VerdictFileOnly &&
		len(d.Ops) == 0 && len(d.InPlace) == 0 && len(d.Reasons) == 0 {
		return verdictNoop
	}
	return d.Verdict
}

// countOf is "1 argument", "2 arguments".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// printDecision prints a decision one fact per line, each line starting
// with its kind so that scripts can grep it: the plans, notes, the verdict,
// each op and in-place op as its wire JSON, then every reason.
func printDecision(w io.Writer, from, to string, d haptic.Decision, notes []string) {
	fmt.Fprintf(w, "plan %s -> %s\n", orDash(from), to)
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "verdict: %s\n", cliVerdict(from, to, d))
	for _, op := range d.Ops {
		fmt.Fprintf(w, "op: %s\n", opJSON(op))
	}
	for _, op := range d.InPlace {
		fmt.Fprintf(w, "in-place op: %s\n", opJSON(op))
	}
	for _, r := range d.Reasons {
		fmt.Fprintf(w, "reason: %s\n", r)
	}
}

// opJSON is an op as it travels in a manifest; Op has no field
// encoding/json refuses.
func opJSON(op haptic.Op) string {
	b, _ := json.Marshal(op)
	return string(b)
}

// orDash prints an empty id as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// zstdMagic starts every plan blob: a blob is the plan's JSON compressed
// with zstd.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// loadPlan reads a plan from a directory (PlanFromDir), a plan blob (what
// an agent stores), or a plan JSON file (what `haptic plan` prints).
func loadPlan(path string) (*haptic.Plan, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return haptic.PlanFromDir(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, haptic.MaxPlanJSONBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > haptic.MaxPlanJSONBytes {
		return nil, fmt.Errorf("%s: more than %d bytes", path, haptic.MaxPlanJSONBytes)
	}
	var p *haptic.Plan
	if bytes.HasPrefix(data, zstdMagic) {
		p, err = haptic.DecodePlanBlob(data)
	} else {
		p, err = decodePlanJSON(data)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// decodePlanJSON decodes a plan as strictly as a plan blob is decoded
// (unknown fields and trailing data refused, the schema version checked),
// and requires its id to be the id of its content: a hand-edited plan with
// a stale id would make Diff compare the wrong plans. An empty id is
// computed.
func decodePlanJSON(data []byte) (*haptic.Plan, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p haptic.Plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("not a plan: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("not a plan: data after the plan object")
	}
	if p.SchemaVersion != haptic.PlanSchemaVersion {
		return nil, fmt.Errorf("plan schema version %d, want %d", p.SchemaVersion, haptic.PlanSchemaVersion)
	}
	stated := p.ID
	p.ComputeID()
	if stated != "" && stated != p.ID {
		return nil, fmt.Errorf("plan id %s does not match its content (%s)", stated, p.ID)
	}
	return &p, nil
}
