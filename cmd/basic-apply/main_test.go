// Tests of the example program (renderplan.md §12.7). They own no HAProxy
// behaviour; the end-to-end test runs the program against the fake HAProxy
// and an in-process agent, exactly as a user runs it against a pod.
package main

import (
	"bytes"
	"errors"
	"log"
	"os"
	"reflect"
	"strings"
	"testing"

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
	defaults := map[string]string{
		"HAPTIC_AGENT_URL":  "http://localhost:5555",
		"HAPTIC_AGENT_USER": "admin",
		"HAPTIC_AGENT_PASS": "admin",
	}
	for name, def := range defaults {
		empty := func(string) string { return "" }
		if got := envOr(empty, name, def); got != def {
			t.Errorf("%s unset: %q, want the default %q", name, got, def)
		}
		set := func(n string) string {
			if n == name {
				return "from-env"
			}
			return ""
		}
		if got := envOr(set, name, def); got != "from-env" {
			t.Errorf("%s set: %q, want the variable's value", name, got)
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
