// Tests of the example's shared pieces: the demo's config and the words both
// programs print.

package example

import (
	"strings"
	"testing"

	"github.com/haptic-agent/haptic"
)

func TestConfigIn(t *testing.T) {
	const dir = "/tmp/hdemo1/base"
	got := ConfigIn(dir)
	for _, want := range []string{
		"    stats socket " + dir + "/haproxy-worker.sock mode 600 level admin\n",
		"    default-path origin " + dir + "\n",
		"    bind unix@" + dir + "/http-in.sock\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ConfigIn lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "/etc/haproxy") || strings.Contains(got, "*:80") {
		t.Errorf("ConfigIn kept a path or the privileged bind:\n%s", got)
	}
	// Nothing else moves.
	back := strings.NewReplacer(dir+"/http-in.sock", "*:80", "unix@", "", dir, "/etc/haproxy").Replace(got)
	if back != Config {
		t.Errorf("ConfigIn changed more than the paths and the bind:\n%s", got)
	}
}

func TestPrint(t *testing.T) {
	var out strings.Builder
	PrintIntro(&out, &haptic.State{AgentVersion: "dev", HAProxy: haptic.HAProxyInfo{Version: "3.0.11"}})
	PrintDecision(&out, "p1", haptic.Decision{Verdict: haptic.VerdictReload, Reasons: []string{"no baseline"}},
		[]string{"the agent restarted"})
	PrintResult(&out, &haptic.ApplyResult{OK: true, Mode: haptic.ResultReload, AppliedPlanID: "p1",
		Reload: &haptic.ReloadInfo{Performed: true, TookMs: 12, WorkerPID: 42}})
	PrintDecision(&out, "p2", haptic.Decision{Verdict: haptic.VerdictRuntime, Ops: []haptic.Op{{Kind: haptic.OpMapAdd}}}, nil)
	PrintResult(&out, &haptic.ApplyResult{OK: true, Mode: haptic.ResultRuntime, AppliedPlanID: "p2",
		OpResults: []haptic.OpResult{{Kind: haptic.OpMapAdd, OK: true}, {Kind: haptic.OpMapAdd, OK: false, Output: "no such map"}}})
	PrintResult(&out, &haptic.ApplyResult{Error: &haptic.ApplyError{Stage: "reload", Message: "HAProxy refused the config"}})
	PrintResult(&out, &haptic.ApplyResult{})
	PrintDone(&out)
	want := `Agent dev drives HAProxy 3.0.11, applied plan ""

Applying plan p1: reload (0 runtime op(s))
  note: the agent restarted
  reason: no baseline
  mode: reload, applied plan: p1
  HAProxy reloaded in 12 ms, worker pid 42
Applying plan p2: runtime (1 runtime op(s))
  mode: runtime, applied plan: p2
  op map_add: ok=true
  op map_add: ok=false no such map
  no reload: the change reached the running worker
  rejected at stage "reload": HAProxy refused the config
  rejected at stage "": 

Example completed successfully!
`
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}
}
