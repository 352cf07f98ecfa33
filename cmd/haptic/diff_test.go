// Tests of `haptic plan` and `haptic diff`: the plan of a testdata
// directory, the offline verdicts with their exit statuses and lines, plan
// files as inputs, and the live diff against an agent.

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/haptic-agent/haptic"
)

func TestPlanCommand(t *testing.T) {
	r := runCLI(t, nil, "plan", testDir("shop-v1"))
	if r.code != exitOK || r.err != "" {
		t.Fatalf("code %d stderr %q", r.code, r.err)
	}
	want, err := haptic.PlanFromDir(testDir("shop-v1"))
	if err != nil {
		t.Fatal(err)
	}
	var got haptic.Plan
	if err := json.Unmarshal([]byte(r.out), &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != want.ID || string(got.Canonical()) != string(want.Canonical()) {
		t.Errorf("printed plan %s differs from PlanFromDir's %s", got.ID, want.ID)
	}
	if !strings.HasPrefix(r.out, "{\n  \"schemaVersion\": 1,\n  \"id\": \""+want.ID+"\",\n") || !strings.HasSuffix(r.out, "}\n") {
		t.Errorf("not indented JSON with a trailing newline: %q", r.out[:min(80, len(r.out))])
	}

	r = runBinary(t, nil, "plan", testDir("no-config"))
	if r.code != exitFailure || r.err != "haptic plan: plan from "+testDir("no-config")+": no haproxy.cfg\n" {
		t.Errorf("no config: code %d stderr %q", r.code, r.err)
	}
	r = runBinary(t, nil, "plan", testDir("no-config"), testDir("shop-v1"))
	if r.code != exitUsage || !strings.HasPrefix(r.err, "haptic plan: want one directory, got 2 arguments\n") {
		t.Errorf("two directories: code %d stderr %q", r.code, r.err)
	}
}

func TestDiffCommand(t *testing.T) {
	v1, v2 := planOf(t, "shop-v1"), planOf(t, "shop-v2")
	v3 := planOf(t, "shop-v3")
	for _, c := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"map entry added: runtime", []string{testDir("shop-v1"), testDir("shop-v2")}, exitOK,
			"plan " + v1 + " -> " + v2 + "\n" +
				"verdict: runtime\n" +
				`op: {"kind":"map_add","path":"maps/host.map","key":"blog.example.com","value":"web-servers"}` + "\n"},
		{"map entry removed: runtime", []string{testDir("shop-v2"), testDir("shop-v1")}, exitOK,
			"plan " + v2 + " -> " + v1 + "\n" +
				"verdict: runtime\n" +
				`op: {"kind":"map_del","path":"maps/host.map","key":"blog.example.com"}` + "\n"},
		{"nothing changed: noop", []string{testDir("shop-v1"), testDir("shop-v1")}, exitOK,
			"plan " + v1 + " -> " + v1 + "\n" +
				"verdict: noop\n"},
		{"config changed: reload naming the section", []string{testDir("shop-v2"), testDir("shop-v3")}, exitFailure,
			"plan " + v2 + " -> " + v3 + "\n" +
				"verdict: reload\n" +
				"reason: core section backend web-servers changed\n"},
		{"flags after the directories", []string{testDir("shop-v1"), testDir("shop-v2"), "--haproxy-version", "3.0"}, exitOK,
			"plan " + v1 + " -> " + v2 + "\n" +
				"verdict: runtime\n" +
				`op: {"kind":"map_add","path":"maps/host.map","key":"blog.example.com","value":"web-servers"}` + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"diff"}, c.args...)...)
			if r.code != c.code || r.out != c.out || r.err != "" {
				t.Errorf("code %d stderr %q stdout\n%s\nwant code %d stdout\n%s", r.code, r.err, r.out, c.code, c.out)
			}
		})
	}

	t.Run("plan files", func(t *testing.T) {
		dir := t.TempDir()
		jsonFile := filepath.Join(dir, "v1.json")
		writePlanJSON(t, jsonFile, testDir("shop-v1"))
		blobFile := filepath.Join(dir, "v2.blob")
		p, err := haptic.PlanFromDir(testDir("shop-v2"))
		if err != nil {
			t.Fatal(err)
		}
		blob, err := haptic.EncodePlanBlob(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(blobFile, blob, 0o644); err != nil {
			t.Fatal(err)
		}
		r := runCLI(t, nil, "diff", jsonFile, blobFile)
		if r.code != exitOK || !strings.HasPrefix(r.out, "plan "+v1+" -> "+v2+"\nverdict: runtime\nop: ") {
			t.Errorf("plan JSON against a blob: code %d stderr %q stdout %q", r.code, r.err, r.out)
		}
		r = runCLI(t, nil, "diff", jsonFile, testDir("shop-v3"))
		if r.code != exitFailure || !strings.Contains(r.out, "verdict: reload\n") {
			t.Errorf("plan JSON against a directory: code %d stderr %q stdout %q", r.code, r.err, r.out)
		}
	})

	// Errors are exit 2, whatever their cause, so that 1 always means reload.
	stale := filepath.Join(t.TempDir(), "stale.json")
	writePlanJSON(t, stale, testDir("shop-v1"))
	content, _ := os.ReadFile(stale)
	os.WriteFile(stale, []byte(strings.Replace(string(content), "shop.example.com", "shop.example.org", 1)), 0o644)
	unknown := filepath.Join(t.TempDir(), "unknown.json")
	os.WriteFile(unknown, []byte(`{"schemaVersion":1,"sections":null,"backends":null,"profiles":null,"maps":null,"files":null,"extra":1}`), 0o644)
	for _, c := range []struct {
		name string
		args []string
		err  string
	}{
		{"one argument", []string{testDir("shop-v1")}, "want OLD and NEW, got 1 argument\n"},
		{"missing directory", []string{testDir("shop-v1"), testDir("absent")}, "haptic diff: stat "},
		// Each path that is wrong is named, not only the first one read.
		{"both missing", []string{testDir("absent"), testDir("gone")}, "haptic diff: stat " + testDir("absent") + ": " +
			"no such file or directory\nhaptic diff: stat " + testDir("gone") + ": no such file or directory\n"},
		{"no config", []string{testDir("no-config"), testDir("shop-v1")}, "no haproxy.cfg"},
		{"stale plan id", []string{stale, testDir("shop-v1")}, "does not match its content"},
		{"unknown plan field", []string{unknown, testDir("shop-v1")}, `unknown field "extra"`},
		{"unreadable version", []string{"--haproxy-version", "latest", testDir("shop-v1"), testDir("shop-v2")}, `--haproxy-version "latest" is not a version`},
		{"two agents", []string{"--agent", "http://a:1", "--agent", "http://b:1", testDir("shop-v1")}, "diff takes one --agent"},
		{"version with an agent", []string{"--agent", "http://a:1", "--haproxy-version", "3.0", testDir("shop-v1")}, "--haproxy-version is the agent's own"},
		{"agent unreachable", []string{"--agent", "http://127.0.0.1:1", testDir("shop-v1")}, "haptic diff: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"diff"}, c.args...)...)
			if r.code != exitUsage || !strings.Contains(r.err, c.err) || r.out != "" {
				t.Errorf("code %d stderr %q stdout %q; want 2 and %q", r.code, r.err, r.out, c.err)
			}
		})
	}
}

func TestDiffCommandAgainstAnAgent(t *testing.T) {
	agent := startCLIAgent(t, nil)
	env := map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": testAgentPass}
	v1, v2 := planOf(t, "shop-v1"), planOf(t, "shop-v2")

	// A fresh pod has no baseline: everything reloads.
	r := runCLI(t, env, "diff", "--agent", agent.URL(), testDir("shop-v1"))
	if r.code != exitFailure || r.out != "plan - -> "+v1+"\nverdict: reload\nreason: no baseline\n" {
		t.Errorf("fresh pod: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}

	if r := runCLI(t, env, "push", "--agent", agent.URL(), testDir("shop-v1")); r.code != exitOK {
		t.Fatalf("push: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	// The pod now holds v1 and its plan: the map change reaches the worker.
	r = runCLI(t, env, "diff", testDir("shop-v2"), "--agent", agent.URL())
	want := "plan " + v1 + " -> " + v2 + "\nverdict: runtime\n" +
		`op: {"kind":"map_add","path":"maps/host.map","key":"blog.example.com","value":"web-servers"}` + "\n"
	if r.code != exitOK || r.out != want {
		t.Errorf("after the push: code %d stderr %q stdout\n%s\nwant\n%s", r.code, r.err, r.out, want)
	}
	// A diff never writes: the pod still holds v1.
	if st := agentState(t, agent); st.AppliedPlanID != v1 {
		t.Errorf("applied %s after a diff, want %s", st.AppliedPlanID, v1)
	}
	// The plan the pod holds is noop, the word push then prints, here
	// read with the agent's own credential variables.
	r = runBinary(t, map[string]string{"DATAPLANE_USERNAME": testAgentUser, "DATAPLANE_PASSWORD": testAgentPass},
		"diff", "--agent", agent.URL(), testDir("shop-v1"))
	if r.code != exitOK || r.out != "plan "+v1+" -> "+v1+"\nverdict: noop\n" {
		t.Errorf("the held plan: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	r = runBinary(t, map[string]string{"DATAPLANE_USERNAME": testAgentUser, "DATAPLANE_PASSWORD": testAgentPass},
		"push", "--agent", agent.URL(), testDir("shop-v1"))
	if r.code != exitOK || !strings.Contains(r.out, ": noop: the pod already holds this plan\n") {
		t.Errorf("push with DATAPLANE_* credentials: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	r = runBinary(t, nil, "push", "--agent", agent.URL(), testDir("shop-v1"))
	if r.code != exitFailure || !strings.Contains(r.out, "error: the agent refused the request (HTTP 401: unauthorized); no HTTP Basic credentials were sent: "+
		"neither HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS nor DATAPLANE_USERNAME/DATAPLANE_PASSWORD is set\n") {
		t.Errorf("push without credentials: code %d stdout %q", r.code, r.out)
	}

	r = runCLI(t, map[string]string{"HAPTIC_AGENT_USER": testAgentUser, "HAPTIC_AGENT_PASS": "wrong"},
		"diff", "--agent", agent.URL(), testDir("shop-v2"))
	if r.code != exitUsage || r.err != "haptic diff: the agent refused the credentials from HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS (HTTP 401: unauthorized); "+
		"client commands read HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS first, then DATAPLANE_USERNAME/DATAPLANE_PASSWORD\n" {
		t.Errorf("wrong password: code %d stderr %q", r.code, r.err)
	}
}

func TestLiveDecisionExplainsAnUnknownBaseline(t *testing.T) {
	next, err := haptic.PlanFromDir(testDir("shop-v2"))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := haptic.PlanFromDir(testDir("shop-v1"))
	if err != nil {
		t.Fatal(err)
	}
	blob, err := haptic.EncodePlanBlob(prev)
	if err != nil {
		t.Fatal(err)
	}
	held := haptic.State{APIVersion: haptic.APIVersion, AppliedPlanID: prev.ID, AppliedPlanProof: "a:1", RunningPlanID: prev.ID,
		WorkerOpsPlanID: prev.ID, WorkerOpsPlanProof: "a:1", AppliedPlan: blob, HAProxy: haptic.HAProxyInfo{Version: "3.0.11"},
		Inventory: haptic.InventoryOf(prev), Features: []string{haptic.FeatureRuntimeBatches}, AgentOps: haptic.ComposableOps()}
	for _, c := range []struct {
		name    string
		mutate  func(*haptic.State)
		verdict string
		note    string
	}{
		{"held plan", func(*haptic.State) {}, haptic.VerdictRuntime, ""},
		{"no blob", func(s *haptic.State) { s.AppliedPlan = nil }, haptic.VerdictReload, "holds no plan for its applied plan " + prev.ID},
		{"corrupt blob", func(s *haptic.State) { s.AppliedPlan = []byte("junk") }, haptic.VerdictReload, "stored plan is unreadable"},
		{"other major", func(s *haptic.State) { s.APIVersion = 2 }, haptic.VerdictReload, "speaks API 2, not 1"},
		{"no worker-ops proof", func(s *haptic.State) { s.WorkerOpsPlanProof = "" }, haptic.VerdictReload, "no proof of its applied or worker baseline"},
		{"no applied proof", func(s *haptic.State) { s.AppliedPlanProof = "" }, haptic.VerdictReload, "no proof of its applied or worker baseline"},
		{"older agent without map_add", func(s *haptic.State) {
			s.AgentOps = slices.DeleteFunc(haptic.ComposableOps(), func(k string) bool { return k == haptic.OpMapAdd })
		},
			haptic.VerdictReload, "the agent cannot run map_add"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := held
			c.mutate(&state)
			d, notes := liveDecision(&state, next)
			if d.Verdict != c.verdict || (c.note == "") != (len(notes) == 0) || (c.note != "" && !strings.Contains(notes[0], c.note)) {
				t.Errorf("verdict %s notes %q, want %s and a note with %q", d.Verdict, notes, c.verdict, c.note)
			}
		})
	}
}

// planOf is the id of a testdata directory's plan.
func planOf(t *testing.T, dir string) string {
	t.Helper()
	p, err := haptic.PlanFromDir(testDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// writePlanJSON writes what `haptic plan dir` prints to path.
func writePlanJSON(t *testing.T, path, dir string) {
	t.Helper()
	r := runCLI(t, nil, "plan", dir)
	if r.code != exitOK {
		t.Fatalf("plan %s: %q", dir, r.err)
	}
	if err := os.WriteFile(path, []byte(r.out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// agentState reads a test agent's state over its admin socket through the
// command itself.
func agentState(t *testing.T, agent *testAgent) haptic.State {
	t.Helper()
	r := runCLI(t, nil, "agent", "state", "--base-dir", agent.base, "--output", "json")
	var st haptic.State
	if err := json.Unmarshal([]byte(r.out), &st); r.code != exitOK || err != nil {
		t.Fatalf("agent state: code %d %v %q", r.code, err, r.err)
	}
	return st
}
