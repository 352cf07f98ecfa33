// state.go owns `haptic agent state` and `haptic agent health`: the two
// read-only commands an operator or a kubelet runs inside the pod. They reach
// the agent through its admin socket by default, which needs no credentials
// and keeps working when the network TLS identity has expired. They never
// fetch the plan blob and never write.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/haptic-agent/haptic"
)

// healthTimeout bounds `haptic agent health`. The admin socket is found by
// the defaults of `haptic agent` (agent.go).
const healthTimeout = 5 * time.Second

func runAgentState(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("agent state", "haptic agent state [--base-dir DIR] [--admin-socket PATH | --url URL | --agents-dns URL] "+
		"[--tls-cert FILE --tls-key FILE] [--tls-ca FILE] [--tls-server-name NAME] [--verify] [--files] [--output text|json] [--timeout D]\n"+
		"With --url or --agents-dns: "+credsHaptic+", else "+credsDataplane+" (HTTP Basic).", s)
	baseDir := fs.String("base-dir", defaultBaseDir, "the agent's base directory; locates the admin socket")
	adminSocket := fs.String("admin-socket", defaultAdminSocket, "the agent's admin socket, relative to --base-dir unless absolute")
	url := fs.String("url", "", "read one agent over TCP instead, e.g. https://pod-ip:5555")
	var dnsURL string
	fleetFlag(fs, &dnsURL)
	var tlsFlags clientTLSFlags
	tlsFlags.register(fs)
	verify := fs.Bool("verify", false, "make the agent re-hash its files and re-check the HAProxy worker first (verify=1)")
	files := fs.Bool("files", false, "add the table of held files (text output)")
	output := fs.String("output", "text", "text or json")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of each request")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	switch {
	case len(positional) > 0:
		return usageError(fs, "unexpected argument %q", positional[0])
	case *output != "text" && *output != "json":
		return usageError(fs, "--output must be text or json")
	case *timeout <= 0:
		return usageError(fs, "--timeout must be positive, got %s", *timeout)
	case *url != "" && dnsURL != "":
		return usageError(fs, "--url names one agent and --agents-dns a fleet; give one")
	case dnsURL != "" && (*files || *output != "text"):
		return usageError(fs, "--agents-dns prints one row per pod; --files and --output json read one agent (--url)")
	case tlsFlags.set() && *url == "" && dnsURL == "":
		return usageError(fs, "the --tls-* flags need an https --url or --agents-dns; the admin socket speaks plain HTTP")
	}

	creds := credentialsFrom(s.getenv)
	tlsConfig, err := tlsFlags.tlsConfig()
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent state: %v\n", err)
		return exitFailure
	}
	read := haptic.StateRead{Verify: *verify}
	if dnsURL != "" {
		return runFleetState(ctx, s, dnsURL, fleetTLS(tlsConfig, dnsURL), creds, read, *timeout)
	}
	cfg := &haptic.ClientConfig{BaseURL: "http://localhost", UnixSocket: localPath(*baseDir, *adminSocket), Timeout: *timeout}
	if *url != "" {
		cfg = &haptic.ClientConfig{BaseURL: *url, Username: creds.user, Password: creds.pass, Timeout: *timeout, TLS: tlsConfig}
	}
	client, err := haptic.NewClient(cfg)
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent state: %v\n", err)
		return exitFailure
	}
	defer client.Close()
	start := time.Now()
	state, err := client.State(ctx, read)
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent state: %s\n", explainErr(err, creds, time.Since(start)))
		return exitFailure
	}
	if *output == "json" {
		out, _ := json.MarshalIndent(state, "", "  ") // a state holds no value encoding/json refuses
		s.out.Write(append(out, '\n'))
		return exitOK
	}
	printState(s.out, state, *files)
	return exitOK
}

// printState writes the text layout: one "key: value" line per fact, an empty
// id or proof as "-", then optionally the file table. A multi-line error
// message (HAProxy's log of a refused reload) shows HAProxy's alerts and
// warnings first and continues on lines indented by four spaces, so every key
// still starts a line.
func printState(w io.Writer, st *haptic.State, withFiles bool) {
	fmt.Fprintf(w, "agent: %s (api %d)\n", orDash(st.AgentVersion), st.APIVersion)
	fmt.Fprintf(w, "haproxy: %s worker pid %d\n", orDash(st.HAProxy.Version), st.HAProxy.WorkerPID)
	fmt.Fprintf(w, "generation: %d\n", st.Generation)
	fmt.Fprintf(w, "applied: %s proof %s token %d/%d\n", orDash(st.AppliedPlanID), orDash(st.AppliedPlanProof),
		st.AppliedToken.LeaderEpoch, st.AppliedToken.RenderSeq)
	fmt.Fprintf(w, "running: %s proof %s\n", orDash(st.RunningPlanID), orDash(st.RunningPlanProof))
	fmt.Fprintf(w, "worker ops: %s proof %s\n", orDash(st.WorkerOpsPlanID), orDash(st.WorkerOpsPlanProof))
	fmt.Fprintf(w, "lkg: %s proof %s\n", orDash(st.LKGPlanID), orDash(st.LKGPlanProof))
	fmt.Fprintf(w, "reload pending: %s\n", orNone(st.ReloadPendingAt))
	fmt.Fprintf(w, "pending deletes: %d servers, %d backends\n", len(st.PendingDeletes.Servers), len(st.PendingDeletes.Backends))
	if la := st.LastApply; la != nil {
		line := fmt.Sprintf("%s %s ok=%t at %s", orDash(la.PlanID), orDash(la.Mode), la.OK, orDash(la.At))
		if la.Error != nil {
			line += fmt.Sprintf(" error %s: %s", la.Error.Stage, strings.Join(haproxyLines(la.Error.Message), "\n"))
		}
		fmt.Fprintf(w, "last apply: %s\n", strings.ReplaceAll(strings.TrimRight(line, "\n"), "\n", "\n    "))
	} else {
		fmt.Fprint(w, "last apply: none\n")
	}
	fmt.Fprintf(w, "invariant: %s\n", orNone(st.InvariantViolation))
	if !withFiles {
		return
	}
	fmt.Fprint(w, "\n")
	if len(st.Files) == 0 {
		// A bare header would read as a table that failed to print.
		fmt.Fprint(w, "no files held yet\n")
		return
	}
	paths := slices.Sorted(maps.Keys(st.Files))
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprint(tw, "PATH\tSIZE\tDIGEST\tPROOF\n")
	for _, p := range paths {
		f := st.Files[p]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", p, f.Size, orDash(f.Digest), orDash(f.Proof))
	}
	tw.Flush()
}

// orNone prints an absent value as "none".
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// runAgentHealth is the exec liveness probe: silent success, or one line
// of reason and exit 1.
func runAgentHealth(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("agent health", "haptic agent health [--base-dir DIR] [--admin-socket PATH]", s)
	baseDir := fs.String("base-dir", defaultBaseDir, "the agent's base directory; locates the admin socket")
	adminSocket := fs.String("admin-socket", defaultAdminSocket, "the agent's admin socket, relative to --base-dir unless absolute")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) > 0 {
		return usageError(fs, "unexpected argument %q", positional[0])
	}
	client, err := haptic.NewClient(&haptic.ClientConfig{BaseURL: "http://localhost",
		UnixSocket: localPath(*baseDir, *adminSocket), Timeout: healthTimeout})
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent health: %v\n", err)
		return exitFailure
	}
	defer client.Close()
	start := time.Now()
	if err := client.Health(ctx); err != nil {
		// In the words `agent state` uses for the same socket.
		fmt.Fprintf(s.err, "haptic agent health: %s\n", explainErr(err, agentCredentials{}, time.Since(start)))
		return exitFailure
	}
	return exitOK
}
