// Tests of `haptic demo`: its output is the example program's line by line
// (a first apply that reloads with the single reason "no baseline", then a
// runtime apply of one map_add without a reload), on the fake HAProxy and,
// when HAPTIC_HAPROXY names one, on a real binary; and it leaves nothing
// behind.

package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// checkDemoOutput matches out against the example's expected output, with
// the ids computed from the plans and only versions, timings and pids
// free.
func checkDemoOutput(t *testing.T, out string) {
	t.Helper()
	id := `([0-9a-f]{16})`
	want := []string{
		`Agent \S+ drives HAProxy \S+, applied plan ""`,
		``,
		`Applying plan ` + id + `: reload \(0 runtime op\(s\)\)`,
		`  reason: no baseline`,
		`  mode: reload, applied plan: ` + id,
		`  HAProxy reloaded in \d+ ms, worker pid \d+`,
		``,
		`Applying plan ` + id + `: runtime \(1 runtime op\(s\)\)`,
		`  mode: runtime, applied plan: ` + id,
		`  op map_add: ok=true`,
		`  no reload: the change reached the running worker`,
		``,
		`Example completed successfully!`,
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want) || !strings.HasSuffix(out, "\n") {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
	}
	var ids []string
	for i, pattern := range want {
		m := regexp.MustCompile("^" + pattern + "$").FindStringSubmatch(lines[i])
		if m == nil {
			t.Errorf("line %d %q does not match %q", i+1, lines[i], pattern)
			continue
		}
		ids = append(ids, m[1:]...)
	}
	// Each apply reports the plan it was asked to apply; the two differ.
	if len(ids) == 4 && (ids[0] != ids[1] || ids[2] != ids[3] || ids[0] == ids[2]) {
		t.Errorf("plan ids %q: each apply must report its own plan, and the two renders differ", ids)
	}
}

// demoLeftovers lists the demo's temporary directories that exist now.
func demoLeftovers(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), "hdemo*"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func TestDemoCommand(t *testing.T) {
	before := demoLeftovers(t)
	r := runCLI(t, nil, "demo")
	if r.code != exitOK || r.err != demoFakeNote {
		t.Fatalf("code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
	checkDemoOutput(t, r.out)
	if after := demoLeftovers(t); len(after) > len(before) {
		t.Errorf("the demo left %q behind", after)
	}
	if r := runCLI(t, nil, "demo", "extra"); r.code != exitUsage || !strings.Contains(r.err, `unexpected argument "extra"`) {
		t.Errorf("stray argument: code %d stderr %q", r.code, r.err)
	}
	if r := runCLI(t, nil, "demo", "--haproxy", "/nonexistent/haproxy"); r.code != exitFailure ||
		!strings.HasPrefix(r.err, "haptic demo: starting /nonexistent/haproxy") {
		t.Errorf("missing binary: code %d stderr %q", r.code, r.err)
	}
	if after := demoLeftovers(t); len(after) > len(before) {
		t.Errorf("a failed demo left %q behind", after)
	}
}

func TestDemoReportsHAProxyOutputWhenItFails(t *testing.T) {
	before := demoLeftovers(t)
	bin := filepath.Join(t.TempDir(), "haproxy")
	script := "#!/bin/sh\necho \"[ALERT] (1) : config : parsing [haproxy.cfg:2] : unknown keyword 'statz'\" >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "demo", "--haproxy", bin)
	want := "haptic demo: HAProxy exited before the agent was ready\nHAProxy output:\n[ALERT] (1) : config : parsing [haproxy.cfg:2] : unknown keyword 'statz'\n"
	if r.code != exitFailure || !strings.HasPrefix(r.err, want) || r.out != "" {
		t.Errorf("code %d stdout %q stderr %q; want 1 and %q", r.code, r.out, r.err, want)
	}
	if after := demoLeftovers(t); len(after) > len(before) {
		t.Errorf("a failed demo left %q behind", after)
	}
}

func TestDemoStopsWhenCancelled(t *testing.T) {
	before := demoLeftovers(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := runCLIContext(t, ctx, nil, "demo")
	if r.code != exitFailure || !strings.Contains(r.err, "context canceled") {
		t.Errorf("cancelled demo: code %d stderr %q", r.code, r.err)
	}
	if after := demoLeftovers(t); len(after) > len(before) {
		t.Errorf("a cancelled demo left %q behind", after)
	}
}

func TestDemoRealHAProxy(t *testing.T) {
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set; real-HAProxy tests skipped")
	}
	before := demoLeftovers(t)
	r := runCLI(t, nil, "demo", "--haproxy", bin)
	if r.code != exitOK {
		t.Fatalf("code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
	checkDemoOutput(t, r.out)
	if after := demoLeftovers(t); len(after) > len(before) {
		t.Errorf("the demo left %q behind", after)
	}
}
