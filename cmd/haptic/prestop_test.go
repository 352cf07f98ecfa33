// Tests of the preStop commands: `haptic agent drain` against a real agent's
// drain socket, and `haptic install`.

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

func TestAgentDrainCommand(t *testing.T) {
	agent := startCLIAgent(t, func(cfg *haptic.AgentConfig) {
		cfg.DrainSocket = defaultDrainSocket // relative to the base, like the command's default
		cfg.DrainQuietPeriod, cfg.DrainMaxWait = 100*time.Millisecond, 2*time.Second
	})
	r := runCLI(t, nil, "agent", "drain", "--base-dir", agent.base)
	if r.code != exitOK || !regexp.MustCompile(`^drain: quiet after [0-9.]+m?s, [0-9]+ connection\(s\)\n$`).MatchString(r.out) {
		t.Errorf("code %d stdout %q stderr %q; want 0 and a quiet drain", r.code, r.out, r.err)
	}

	r = runCLI(t, nil, "agent", "drain", "--base-dir", agent.base, "--drain-socket", "nowhere.sock")
	if r.code != exitFailure || !strings.HasPrefix(r.err, "haptic agent drain: ") || !strings.Contains(r.err, "nowhere.sock") {
		t.Errorf("no socket: code %d stderr %q; want 1 and the reason", r.code, r.err)
	}
	r = runCLI(t, nil, "agent", "drain", "extra")
	if r.code != exitUsage || !strings.Contains(r.err, `unexpected argument "extra"`) {
		t.Errorf("stray argument: code %d stderr %q", r.code, r.err)
	}
}

func TestInstallCopiesTheBinary(t *testing.T) {
	dir := t.TempDir()
	if r := runCLI(t, nil, "install", dir); r.code != exitOK {
		t.Fatalf("code %d stderr %q", r.code, r.err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(self)
	got, err := os.ReadFile(filepath.Join(dir, "haptic"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the installed binary differs from the running one (%v)", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "haptic")); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
	if r := runCLI(t, nil, "install", filepath.Join(dir, "missing")); r.code != exitFailure || !strings.HasPrefix(r.err, "haptic install: ") {
		t.Errorf("a missing directory: code %d stderr %q", r.code, r.err)
	}
	if r := runCLI(t, nil, "install"); r.code != exitUsage {
		t.Errorf("no directory: code %d stderr %q", r.code, r.err)
	}
}
