// Tests of the example program: its configuration and map keep their pinned
// sizes and digests, buildPlan builds the exact plan shape with pinned ids,
// an empty environment variable falls back to its default, and a conflict is
// logged with its reason and wrapped in the returned error. They own no
// HAProxy behaviour; the end-to-end test runs the program against the fake
// HAProxy and an in-process agent, exactly as a user runs it against a pod.

package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// The ids of the two example plans, computed once and pinned: a change is
// a change of the example's contract, never a reason to re-pin.
const (
	firstPlanID  = "13a1e37c09e75b27"
	secondPlanID = "fd2a2b050facad14"
)

func TestBasicApplyPlans(t *testing.T) {
	if len(haproxyConfig) != 434 {
		t.Errorf("haproxyConfig is %d bytes, want 434", len(haproxyConfig))
	}
	if got := haptic.DigestString(haproxyConfig); got != "cbaa3ea320b734e3" {
		t.Errorf("haproxyConfig digest %s, want cbaa3ea320b734e3", got)
	}
	if strings.Contains(haproxyConfig, "\t") || !strings.HasSuffix(haproxyConfig, "\n") {
		t.Error("haproxyConfig must be indented with spaces and end in a newline")
	}
	if !strings.Contains(haproxyConfig, "map("+hostMap+",web-servers)") {
		t.Error("the use_backend line must name hostMap")
	}
	for _, m := range []struct {
		content, digest string
		size            int
	}{
		{hostMapV1, "1bd55fb5d7aa0354", 29},
		{hostMapV2, "0b7e2e6ee2c4092d", 58},
	} {
		if len(m.content) != m.size || haptic.DigestString(m.content) != m.digest {
			t.Errorf("map %q: %d bytes digest %s, want %d bytes digest %s",
				m.content, len(m.content), haptic.DigestString(m.content), m.size, m.digest)
		}
	}

	for _, c := range []struct {
		content, id string
	}{
		{hostMapV1, firstPlanID},
		{hostMapV2, secondPlanID},
	} {
		p := buildPlan(c.content)
		want := &haptic.Plan{
			SchemaVersion: haptic.PlanSchemaVersion,
			ID:            c.id,
			Sections: []haptic.Section{{Kind: haptic.SectionKindCore, Name: "haproxy.cfg",
				TextDigest: "cbaa3ea320b734e3", Length: 434}},
			Maps: map[string]haptic.Map{"maps/host.map": {Path: "maps/host.map", Ordered: false,
				Entries: haptic.ParseMapEntries(c.content)}},
			Files: []haptic.PlanFile{
				{Path: "haproxy.cfg", Kind: haptic.FileKindConfig, ReloadOnChange: true,
					Digest: "cbaa3ea320b734e3", Size: 434},
				{Path: "maps/host.map", Kind: haptic.FileKindMap, ReloadOnChange: false,
					Digest: haptic.DigestString(c.content), Size: int64(len(c.content))},
			},
		}
		if !reflect.DeepEqual(p, want) {
			t.Errorf("buildPlan(%q) =\n%+v\nwant\n%+v", c.content, p, want)
		}
		if p.Backends != nil || p.Profiles != nil || p.CRTLists != nil {
			t.Error("Backends, Profiles and CRTLists must be nil")
		}
		canonical := string(p.Canonical())
		if !strings.Contains(canonical, `"backends":null,"profiles":null`) || strings.Contains(canonical, "crtLists") {
			t.Errorf("canonical encoding %s", canonical)
		}
		clone := p.Clone()
		clone.ComputeID()
		if clone.ID != p.ID {
			t.Errorf("Clone().ComputeID() = %s, want %s", clone.ID, p.ID)
		}
	}
	if firstPlanID == secondPlanID {
		t.Error("the two renders must have different ids")
	}

	// contentOf reproduces both maps byte for byte from the plan.
	for _, content := range []string{hostMapV1, hostMapV2} {
		files := contentOf(buildPlan(content))
		if files[configPath] != haproxyConfig || files[hostMap] != content || len(files) != 2 {
			t.Errorf("contentOf(buildPlan(%q)) = %q", content, files)
		}
	}
}

func TestBasicApplyGetenv(t *testing.T) {
	empty := func(string) string { return "" }
	if got := envOr(empty, "HAPTIC_AGENT_URL", "http://localhost:5555"); got != "http://localhost:5555" {
		t.Errorf("HAPTIC_AGENT_URL unset: %q, want the default", got)
	}
	if got := envOr(func(string) string { return "from-env" }, "HAPTIC_AGENT_URL", "x"); got != "from-env" {
		t.Errorf("HAPTIC_AGENT_URL set: %q, want the variable's value", got)
	}
	// The example's pair first, then the agent's own, then admin/admin.
	for _, c := range []struct {
		env                  map[string]string
		user, pass, variable string
	}{
		{nil, "admin", "admin", "the defaults admin/admin"},
		{map[string]string{"DATAPLANE_USERNAME": "ops", "DATAPLANE_PASSWORD": "pw"}, "ops", "pw", "DATAPLANE_USERNAME/DATAPLANE_PASSWORD"},
		{map[string]string{"HAPTIC_AGENT_USER": "me", "HAPTIC_AGENT_PASS": "x", "DATAPLANE_USERNAME": "ops", "DATAPLANE_PASSWORD": "pw"},
			"me", "x", "HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS"},
	} {
		user, pass, source := credentials(func(k string) string { return c.env[k] })
		if user != c.user || pass != c.pass || source != c.variable {
			t.Errorf("%v: %q %q from %q, want %q %q from %q", c.env, user, pass, source, c.user, c.pass, c.variable)
		}
	}
}

func TestBasicApplyEndToEnd(t *testing.T) {
	// A short directory: the fake's unix socket paths are limited to 107
	// bytes.
	base, err := os.MkdirTemp("", "ba")
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the agent stops before the fake and the
	// directory go.
	t.Cleanup(func() { os.RemoveAll(base) })
	fake, err := haptic.StartFakeHAProxy(base, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Close() })
	// The fake reads no configuration: its reload loads the host map from
	// the agent's base directory into the worker, as HAProxy would, so the
	// inventory lists the map after the first reload.
	fake.With(func(m *haptic.FakeModel) {
		m.OnReload = func(m *haptic.FakeModel) {
			content, err := os.ReadFile(filepath.Join(base, hostMap))
			if err != nil {
				return
			}
			if m.Maps == nil {
				m.Maps = map[string][]haptic.MapEntry{}
			}
			m.Maps[hostMap] = haptic.ParseMapEntries(string(content))
		}
	})
	agent := startExampleAgent(t, haptic.AgentConfig{BaseDir: base, MasterSocket: fake.MasterSocket(), WorkerSocket: fake.WorkerSocket()})
	checkExampleOutput(t, runExample(t, agent), fake.Version())
	if got := fake.MapEntries(hostMap); !reflect.DeepEqual(got, haptic.ParseMapEntries(hostMapV2)) {
		t.Errorf("the worker's map holds %v, want the second render's entries", got)
	}

	ctx := t.Context()
	client, err := haptic.NewClient(&haptic.ClientConfig{BaseURL: "http://" + agent.Addr(), Username: "admin", Password: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	state, err := client.State(ctx, haptic.StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if state.AppliedPlanID != secondPlanID || state.RunningPlanID != firstPlanID {
		t.Errorf("applied %s running %s, want the second plan applied on the first plan's worker", state.AppliedPlanID, state.RunningPlanID)
	}
}

// startExampleAgent runs an agent on cfg with the example's default
// credentials, on a loopback port, and waits until it is ready; cleanup
// stops it.
func startExampleAgent(t *testing.T, cfg haptic.AgentConfig) *haptic.Agent {
	t.Helper()
	cfg.Listen, cfg.Username, cfg.Password = "127.0.0.1:0", "admin", "admin"
	cfg.Logger = slog.New(slog.DiscardHandler)
	agent, err := haptic.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); !agent.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not become ready")
		}
	}
	return agent
}

// runExample runs the program against agent, as `go run ./cmd/basic-apply`
// does, with only HAPTIC_AGENT_URL set: the credentials are the defaults.
func runExample(t *testing.T, agent *haptic.Agent) string {
	t.Helper()
	getenv := func(name string) string {
		if name == "HAPTIC_AGENT_URL" {
			return "http://" + agent.Addr()
		}
		return ""
	}
	var out bytes.Buffer
	if err := run(t.Context(), &out, getenv); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	return out.String()
}

// checkExampleOutput holds the program's output to its lines, every one
// literal but the reload's timing and pid.
func checkExampleOutput(t *testing.T, out, haproxyVersion string) {
	t.Helper()
	want := []string{
		`Agent dev drives HAProxy ` + haproxyVersion + `, applied plan ""`,
		``,
		`Applying plan ` + firstPlanID + `: reload (0 runtime op(s))`,
		`  reason: no baseline`,
		`  mode: reload, applied plan: ` + firstPlanID,
		`  HAProxy reloaded in <took_ms> ms, worker pid <worker_pid>`,
		``,
		`Applying plan ` + secondPlanID + `: runtime (1 runtime op(s))`,
		`  mode: runtime, applied plan: ` + secondPlanID,
		`  op map_add: ok=true`,
		`  no reload: the change reached the running worker`,
		``,
		`Example completed successfully!`,
	}
	reloadLine := regexp.MustCompile(`^  HAProxy reloaded in \d+ ms, worker pid \d+$`)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want) || !strings.HasSuffix(out, "\n") {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		if lines[i] != w && !(strings.Contains(w, "<took_ms>") && reloadLine.MatchString(lines[i])) {
			t.Errorf("line %d %q, want %q", i+1, lines[i], w)
		}
	}
}

func TestBasicApplyConflictError(t *testing.T) {
	var logged bytes.Buffer
	log.SetOutput(&logged)
	log.SetFlags(0)
	t.Cleanup(func() {
		log.SetOutput(os.Stderr)
		log.SetFlags(log.LstdFlags)
	})

	conflict := &haptic.ConflictError{Conflict: haptic.Conflict{Reason: haptic.ReasonPrevMismatch, AppliedPlanID: "plan-9"}}
	err := handleApplyError(conflict)
	var ce *haptic.ConflictError
	if !strings.HasPrefix(err.Error(), "apply failed:") || !errors.As(err, &ce) || ce != conflict {
		t.Errorf("handleApplyError(conflict) = %v, want it to wrap the conflict", err)
	}
	lines := strings.Split(strings.TrimSuffix(logged.String(), "\n"), "\n")
	want := []string{
		"The pod is not on the baseline this apply was composed against (prev_mismatch).",
		"Re-read /v1/state and diff again; nothing was written.",
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("logged %q, want %q", lines, want)
	}

	logged.Reset()
	other := errors.New("connection refused")
	err = handleApplyError(other)
	if !strings.HasPrefix(err.Error(), "apply failed:") || !errors.Is(err, other) {
		t.Errorf("handleApplyError(other) = %v, want it to wrap the error", err)
	}
	if logged.Len() != 0 {
		t.Errorf("logged %q for a non-conflict error", logged.String())
	}
}
