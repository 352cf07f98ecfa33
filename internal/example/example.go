// Package example is what cmd/basic-apply and `haptic demo` share: the
// example's two renders (one haproxy.cfg, two host maps that differ by one
// entry) and the words both print, line for line, so that the two programs
// show one flow and cannot drift apart. The package's own tests, and the
// root package's, read the same haproxy.cfg.
package example

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/haptic-agent/haptic"
)

// Config is the haproxy.cfg both renders share, for a pod whose base
// directory is /etc/haproxy: only the host map changes between the renders,
// so the second apply needs no reload. It routes by the Host header through
// HostMap, so an added entry reaches the running worker as one map_add.
//
//go:embed haproxy.cfg
var Config string

// HostMap is the map's path: a manifest path is the same string HAProxy
// names the file by (default-path origin is the base directory).
const HostMap = "maps/host.map"

// The host map of the first and of the second render: one entry added.
const (
	HostMapV1 = "shop.example.com web-servers\n"
	HostMapV2 = "shop.example.com web-servers\nblog.example.com web-servers\n"
)

// ConfigIn is Config for an HAProxy whose base directory is dir, its
// frontend bound to a unix socket there so that nothing needs a privileged
// port (the demo runs unprivileged, beside whatever else listens on :80).
func ConfigIn(dir string) string {
	return strings.NewReplacer("/etc/haproxy", dir, "bind *:80", "bind unix@"+dir+"/http-in.sock").Replace(Config)
}

// WriteRender writes one render as a directory, the input of
// haptic.PlanFromDir: config as haproxy.cfg and hostMap as HostMap.
func WriteRender(dir, config, hostMap string) error {
	return WriteFiles(dir, map[string]string{haptic.ConfigFilePath: config, HostMap: hostMap})
}

// WriteFiles writes each file under dir by its slash-separated path,
// creating the directories between.
func WriteFiles(dir string, files map[string]string) error {
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// StartFake starts the fake HAProxy on the agent's default socket names in
// base. The fake reads no configuration, so its reload "loads" the host map
// from base, as a real worker would: that is how the runtime inventory lists
// the map after the first reload, and why the second render can reach the
// worker as a map_add.
func StartFake(base string) (*haptic.FakeHAProxy, error) {
	fake, err := haptic.StartFakeHAProxy(base, "")
	if err != nil {
		return nil, err
	}
	fake.With(func(m *haptic.FakeModel) {
		m.OnReload = func(m *haptic.FakeModel) {
			content, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(HostMap)))
			if err != nil {
				delete(m.Maps, HostMap)
				return
			}
			if m.Maps == nil {
				m.Maps = map[string][]haptic.MapEntry{}
			}
			m.Maps[HostMap] = haptic.ParseMapEntries(string(content))
		}
	})
	return fake, nil
}

// PrintIntro prints the agent and the plan it holds before the first
// render, and a blank line.
func PrintIntro(out io.Writer, state *haptic.State) {
	fmt.Fprintf(out, "Agent %s drives HAProxy %s, applied plan %q\n\n", state.AgentVersion, state.HAProxy.Version, state.AppliedPlanID)
}

// PrintDecision prints what Diff decided for one render, before it is
// applied: the verdict, then each note about the pod (a caveat that changed
// the decision) and each reason.
func PrintDecision(out io.Writer, planID string, d haptic.Decision, notes []string) {
	fmt.Fprintf(out, "Applying plan %s: %s (%d runtime op(s))\n", planID, d.Verdict, len(d.Ops))
	for _, n := range notes {
		fmt.Fprintf(out, "  note: %s\n", n)
	}
	for _, r := range d.Reasons {
		fmt.Fprintf(out, "  reason: %s\n", r)
	}
}

// PrintResult prints one apply's answer. A rejected apply (ok:false) is a
// result, not an error: the pod rolled back and still serves.
func PrintResult(out io.Writer, result *haptic.ApplyResult) {
	if !result.OK {
		stage, message := "", ""
		if result.Error != nil {
			stage, message = result.Error.Stage, result.Error.Message
		}
		fmt.Fprintf(out, "  rejected at stage %q: %s\n", stage, message)
		return
	}
	fmt.Fprintf(out, "  mode: %s, applied plan: %s\n", result.Mode, result.AppliedPlanID)
	for _, r := range result.OpResults {
		fmt.Fprintf(out, "  op %s: ok=%t", r.Kind, r.OK)
		if r.Output != "" {
			fmt.Fprint(out, " "+r.Output)
		}
		fmt.Fprint(out, "\n")
	}
	if result.Reload != nil && result.Reload.Performed {
		fmt.Fprintf(out, "  HAProxy reloaded in %d ms, worker pid %d\n", result.Reload.TookMs, result.Reload.WorkerPID)
	} else {
		fmt.Fprint(out, "  no reload: the change reached the running worker\n")
	}
}

// PrintDone ends a successful run: a blank line and the last line.
func PrintDone(out io.Writer) {
	fmt.Fprint(out, "\nExample completed successfully!\n")
}
