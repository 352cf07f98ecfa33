// Command basic-apply drives a HAPTIC agent end to end, the way a controller
// does: it describes two renders of an HAProxy configuration as plans, asks
// Diff what the pod must do for each, sends the applies, and prints the
// verdicts. Read it first; everything else in the package is the machinery
// behind these calls.
//
// Prerequisites:
//
//   - HAProxy in master-worker mode, with the worker stats socket
//     /etc/haproxy/haproxy-worker.sock and the master CLI socket
//     /etc/haproxy/haproxy-master.sock (the agent's default --worker-socket
//     and --master-socket);
//   - `haptic agent` running on the same file tree, with base directory
//     /etc/haproxy.
//
// The paths are fixed: the configuration the program pushes names
// /etc/haproxy for the worker socket and for default-path origin, so it
// runs only on a pod whose base directory is /etc/haproxy. `haptic demo`
// runs the same two renders in a temporary directory instead. The
// configuration is the contract's example, byte for byte (its digest and
// the plan ids are fixed): it binds *:80 (so HAProxy runs as root), and its
// one backend names the server 192.168.1.10:80, which nothing here runs, so
// `curl -H 'Host: shop.example.com' localhost` answers 503 until a server
// listens there.
//
// Configuration, each used only when non-empty: HAPTIC_AGENT_URL (default
// http://localhost:5555), HAPTIC_AGENT_USER and HAPTIC_AGENT_PASS, else
// the agent's own DATAPLANE_USERNAME and DATAPLANE_PASSWORD, else admin and
// admin.
//
// The program never writes a Manifest by hand: NewManifest copies the proofs
// and expectations the agent fences on from the state it read, and an agent
// refuses a runtime apply that lacks them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/haptic-agent/haptic"
	"github.com/haptic-agent/haptic/internal/example"
)

// The example's renders, shared with `haptic demo` (internal/example): one
// config and two host maps that differ by one entry.
const (
	configPath = haptic.ConfigFilePath // "haproxy.cfg"
	hostMap    = example.HostMap       // a manifest path is the same string HAProxy names the file by
	hostMapV1  = example.HostMapV1
	hostMapV2  = example.HostMapV2
)

// haproxyConfig is the config both renders share (internal/example's
// haproxy.cfg): only the map changes between them, so the second apply
// needs no reload.
var haproxyConfig = example.Config

// buildPlan describes one render: the config as a single core section and
// the host map with its entries, so that Diff can turn a map change into
// runtime ops. It carries digests only; contentOf supplies the bytes.
func buildPlan(hostMapContent string) *haptic.Plan {
	p := &haptic.Plan{
		SchemaVersion: haptic.PlanSchemaVersion,
		Sections: []haptic.Section{{
			Kind:       haptic.SectionKindCore,
			Name:       configPath,
			TextDigest: haptic.DigestString(haproxyConfig),
			Length:     len(haproxyConfig),
		}},
		Maps: map[string]haptic.Map{
			hostMap: {Path: hostMap, Ordered: false, Entries: haptic.ParseMapEntries(hostMapContent)},
		},
		Files: []haptic.PlanFile{
			{Path: configPath, Kind: haptic.FileKindConfig, ReloadOnChange: true,
				Digest: haptic.DigestString(haproxyConfig), Size: int64(len(haproxyConfig))},
			{Path: hostMap, Kind: haptic.FileKindMap, ReloadOnChange: false,
				Digest: haptic.DigestString(hostMapContent), Size: int64(len(hostMapContent))},
		},
	}
	p.ComputeID()
	return p
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, os.Getenv); err != nil {
		log.Fatalf("Error: %v", err)
	}
}

// run applies the two renders in order and prints what the agent did.
func run(ctx context.Context, out io.Writer, getenv func(string) string) error {
	user, pass, source := credentials(getenv)
	client, err := haptic.NewClient(&haptic.ClientConfig{
		BaseURL:  envOr(getenv, "HAPTIC_AGENT_URL", "http://localhost:5555"),
		Username: user,
		Password: pass,
	})
	if err != nil {
		return fmt.Errorf("failed to create the agent client: %w", err)
	}
	defer client.Close()

	state, err := client.State(ctx, haptic.StateRead{})
	var refused *haptic.HTTPError
	if errors.As(err, &refused) && refused.Status == 401 {
		return fmt.Errorf("the agent refused the credentials from %s (HTTP 401); set HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS "+
			"or DATAPLANE_USERNAME/DATAPLANE_PASSWORD to the agent's", source)
	}
	if err != nil {
		return fmt.Errorf("failed to read the agent's state: %w", err)
	}
	example.PrintIntro(out, state)

	first := buildPlan(hostMapV1)
	if err := apply(ctx, out, client, first, nil, state); err != nil {
		return err
	}

	fmt.Fprint(out, "\n")
	second := buildPlan(hostMapV2)
	if state, err = client.State(ctx, haptic.StateRead{}); err != nil {
		return fmt.Errorf("failed to re-read the agent's state: %w", err)
	}
	// The baseline is now the first plan, so the only change is one added
	// map entry.
	if err := apply(ctx, out, client, second, first, state); err != nil {
		return err
	}

	example.PrintDone(out)
	return nil
}

// credentials are the HTTP Basic credentials and where they came from:
// the example's own pair, else the pair the agent itself reads, else the
// defaults. A pair is taken whole.
func credentials(getenv func(string) string) (user, pass, source string) {
	if user, pass = getenv("HAPTIC_AGENT_USER"), getenv("HAPTIC_AGENT_PASS"); user != "" || pass != "" {
		return user, pass, "HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS"
	}
	if user, pass = getenv("DATAPLANE_USERNAME"), getenv("DATAPLANE_PASSWORD"); user != "" || pass != "" {
		return user, pass, "DATAPLANE_USERNAME/DATAPLANE_PASSWORD"
	}
	return "admin", "admin", "the defaults admin/admin"
}

// envOr returns the variable's value, or def when it is empty.
func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// apply moves the pod from prev (the plan this program applied last, nil
// when it has none) to next.
func apply(ctx context.Context, out io.Writer, client *haptic.Client, next, prev *haptic.Plan, state *haptic.State) error {
	// The state was read without the plan blob, so the baseline's plans
	// come from memory, and only where the pod's ids say it holds prev.
	base, err := haptic.BaselineFromState(state)
	if err != nil {
		return fmt.Errorf("failed to build the baseline: %w", err)
	}
	if prev != nil && prev.ID == state.AppliedPlanID {
		base.Applied = prev
		if state.RunningPlanID == prev.ID {
			base.Running = prev
		}
		if state.WorkerOpsPlanID == prev.ID {
			base.WorkerOps = prev
		}
	}

	decision := haptic.Diff(next, base)
	example.PrintDecision(out, next.ID, decision, nil)

	// Rendering again is a new render: same leader, next sequence number.
	token := haptic.Token{
		LeaderEpoch: max(1, state.AppliedToken.LeaderEpoch),
		RenderSeq:   state.AppliedToken.RenderSeq + 1,
	}
	m := haptic.NewManifest(next, decision, state, token)

	// Send no content first: the agent answers with the paths it lacks.
	result, err := client.Apply(ctx, m, nil, nil)
	var missing *haptic.MissingError
	if errors.As(err, &missing) {
		content := contentOf(next)
		parts := make(map[string]io.Reader, len(missing.Missing.Missing))
		for _, path := range missing.Missing.Missing {
			parts[path] = strings.NewReader(content[path])
		}
		result, err = client.Apply(ctx, m, parts, nil)
	}
	if err != nil {
		return handleApplyError(err)
	}
	example.PrintResult(out, result) // a rejected apply is a result: the pod rolled back and still serves
	return nil
}

// handleApplyError explains a fenced apply and wraps every error.
func handleApplyError(err error) error {
	var conflict *haptic.ConflictError
	if errors.As(err, &conflict) {
		log.Printf("The pod is not on the baseline this apply was composed against (%s).", conflict.Reason)
		log.Printf("Re-read /v1/state and diff again; nothing was written.")
	}
	return fmt.Errorf("apply failed: %w", err)
}

// contentOf gives the bytes of each file of p: the config, and the host map
// written back from the plan's entries, which reproduces hostMapV1 and
// hostMapV2 byte for byte.
func contentOf(p *haptic.Plan) map[string]string {
	var hostMapContent strings.Builder
	for _, e := range p.Maps[hostMap].Entries {
		hostMapContent.WriteString(e.Key + " " + e.Value + "\n")
	}
	return map[string]string{
		configPath: haproxyConfig,
		hostMap:    hostMapContent.String(),
	}
}
