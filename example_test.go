// Examples of the package as a controller uses it, run by go test with
// their output checked: the whole conversation with one pod (Example, which
// the README quotes word for word, and a test here keeps it so), Deploy's
// loop over renders, an agent embedded beside the fake HAProxy, Diff
// explaining a reload, and the plan PlanFromDir reads from a directory.

package haptic_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
	"github.com/haptic-agent/haptic/internal/example"
)

// Example asks a pod what it would do with a render and why, applies it
// step by step, then deploys the next render in one call. The pod is an
// agent beside the fake HAProxy; the renders are the example's haproxy.cfg
// and host map, the second render one map entry longer.
func Example() {
	ctx := context.Background()
	pod := startPod() // an agent beside the fake HAProxy, and the example's two renders as directories
	defer pod.stop()

	client, err := haptic.NewClient(&haptic.ClientConfig{
		BaseURL: pod.url, Username: pod.user, Password: pod.pass})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	first, err := haptic.PlanFromDir(pod.renders[0]) // or build a *haptic.Plan in your generator, then ComputeID
	if err != nil {
		log.Fatal(err)
	}

	// Ask first: what would this pod do, and why?
	state, err := client.State(ctx, haptic.StateRead{Plan: true})
	if err != nil {
		log.Fatal(err)
	}
	base, _ := haptic.BaselineFromState(state) // an error only means "no baseline": Diff then reloads
	decision := haptic.Diff(first, base)
	fmt.Println(decision.Verdict, decision.Reasons)

	// Step by step, as cmd/basic-apply does: the manifest carries the proofs the agent fences on.
	m := haptic.NewManifest(first, decision, state,
		haptic.Token{LeaderEpoch: 1, RenderSeq: state.AppliedToken.RenderSeq + 1})
	result, err := client.Apply(ctx, m, nil, nil) // no bytes yet: the agent names the files it lacks
	var missing *haptic.MissingError
	if errors.As(err, &missing) {
		parts := map[string]io.Reader{}
		for _, f := range first.Files {
			if slices.Contains(missing.Missing.Missing, f.Path) {
				parts[f.Path] = strings.NewReader(f.Content)
			}
		}
		result, err = client.Apply(ctx, m, parts, nil)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.OK, result.Mode)

	// Or all of it in one call: state → Diff → NewManifest → Apply → resend → re-diff.
	// Applied is our copy of what the pod holds: a large file that changed a little travels as a patch.
	next, err := haptic.PlanFromDir(pod.renders[1])
	if err != nil {
		log.Fatal(err)
	}
	result, err = haptic.Deploy(ctx, client, next, haptic.DeployOptions{LeaderEpoch: 1, Applied: first})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.OK, result.Mode) // runtime, file_only, reload, scheduled or noop
	for _, op := range result.OpResults {
		fmt.Println(op.Kind, op.OK)
	}
	// Output:
	// reload [no baseline]
	// true reload
	// true runtime
	// map_add true
}

// ExampleDeploy brings one pod to each render in turn, the controller's
// loop: Deploy reads the pod's state, diffs, applies, resends the parts the
// agent lacks and re-diffs when the pod moved. A NACK is a result, not an
// error: the pod rolled back and still serves. Passing the previous render
// as Applied lets a large file that changed a little travel as a patch.
func ExampleDeploy() {
	ctx := context.Background()
	pod := startPod()
	defer pod.stop()
	client, err := haptic.NewClient(&haptic.ClientConfig{BaseURL: pod.url, Username: pod.user, Password: pod.pass})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	var applied *haptic.Plan // our copy of what the pod holds: none yet
	for _, dir := range pod.renders {
		next, err := haptic.PlanFromDir(dir)
		if err != nil {
			log.Fatal(err)
		}
		result, err := haptic.Deploy(ctx, client, next, haptic.DeployOptions{LeaderEpoch: 1, Applied: applied})
		if err != nil {
			log.Fatal(err) // a conflict with a newer leader, a transport or HTTP error
		}
		if !result.OK {
			log.Fatalf("rejected at stage %s: %s", result.Error.Stage, result.Error.Message)
		}
		fmt.Println(result.Mode, len(result.OpResults), "op(s), token", result.AppliedToken.RenderSeq)
		applied = next
	}
	// Output:
	// reload 0 op(s), token 1
	// runtime 1 op(s), token 2
}

// ExampleNewAgent embeds an agent in a program, beside the fake HAProxy as
// a controller's own tests would run it. The agent binds only the listeners
// its configuration names, and turns Ready once it has found HAProxy.
func ExampleNewAgent() {
	base, err := os.MkdirTemp("", "hex") // short: a unix socket path holds at most 107 bytes
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(base)
	fake, err := haptic.StartFakeHAProxy(base, "3.0.11") // the sockets, on the agent's default names
	if err != nil {
		log.Fatal(err)
	}
	defer fake.Close()

	agent, err := haptic.NewAgent(haptic.AgentConfig{BaseDir: base, Listen: "127.0.0.1:0",
		Username: "admin", Password: "admin", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- agent.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	for deadline := time.Now().Add(10 * time.Second); !agent.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("the agent did not find HAProxy within 10s")
		}
	}

	client, err := haptic.NewClient(&haptic.ClientConfig{BaseURL: "http://" + agent.Addr(), Username: "admin", Password: "admin"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	state, err := client.State(ctx, haptic.StateRead{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("haproxy", state.HAProxy.Version, "worker is the fake's:", state.HAProxy.SameWorker(fake.Worker()))
	fmt.Printf("applied plan %q: the first push reloads\n", state.AppliedPlanID)
	// Output:
	// haproxy 3.0.11 worker is the fake's: true
	// applied plan "": the first push reloads
}

// ExampleDiff shows Diff explaining a reload. A directory's plan declares
// no backend records, so a change to haproxy.cfg reloads and the reason
// names the section that changed, while an added map entry alone reaches
// the running worker as one runtime op.
func ExampleDiff() {
	const config = `global
    stats socket /etc/haproxy/haproxy-worker.sock mode 600 level admin
    default-path origin /etc/haproxy

frontend http-in
    bind *:80
    use_backend %[req.hdr(host),lower,map(maps/host.map,web)]

backend web
    server web1 192.168.1.10:80
`
	old := planOf(map[string]string{"haproxy.cfg": config, "maps/host.map": "shop.example.com web\n"})
	// The pod holds old and its HAProxy 3.0 worker loaded it: the baseline
	// `haptic diff OLD NEW` assumes.
	base := &haptic.Baseline{Applied: old, Running: old, WorkerOps: old,
		Inventory: haptic.InventoryOf(old), Caps: haptic.CapsFor("3.0", haptic.ComposedOps())}

	mapOnly := planOf(map[string]string{"haproxy.cfg": config,
		"maps/host.map": "shop.example.com web\nblog.example.com web\n"})
	d := haptic.Diff(mapOnly, base)
	fmt.Println(d.Verdict)
	for _, op := range d.Ops {
		fmt.Println("  op:", op.Kind, op.Path, op.Key, op.Value)
	}

	withBackend := planOf(map[string]string{
		"haproxy.cfg":   strings.Replace(config, "192.168.1.10:80", "192.168.1.11:80", 1) + "\nbackend api\n    server api1 192.168.1.20:80\n",
		"maps/host.map": "shop.example.com web\nblog.example.com api\n"})
	d = haptic.Diff(withBackend, base)
	fmt.Println(d.Verdict)
	for _, r := range d.Reasons {
		fmt.Println("  reason:", r)
	}
	// Output:
	// runtime
	//   op: map_add maps/host.map blog.example.com web
	// reload
	//   reason: core section backend web changed
	//   reason: core section backend api added
}

// ExamplePlanFromDir reads a directory of rendered files by convention:
// haproxy.cfg cut into one section per top-level header, *.map files as
// maps, any other file as a general file that reloads on change, and
// dot-names skipped.
func ExamplePlanFromDir() {
	dir, err := os.MkdirTemp("", "render")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	writeFiles(dir, map[string]string{
		"haproxy.cfg": "global\n    maxconn 1000\n\n" +
			"# every site\nfrontend http-in\n    bind *:80\n    use_backend %[req.hdr(host),lower,map(maps/host.map,web)]\n\n" +
			"backend web\n    errorfile 503 errors/503.http\n    server web1 192.168.1.10:80\n",
		"maps/host.map":   "# host backend\nshop.example.com web\nblog.example.com web\n",
		"errors/503.http": "HTTP/1.0 503 Service Unavailable\r\n\r\n",
		".git/HEAD":       "ref: refs/heads/main\n",
	})

	plan, err := haptic.PlanFromDir(dir)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range plan.Sections {
		fmt.Printf("section %s %q\n", s.Kind, s.Name)
	}
	for _, f := range plan.Files {
		fmt.Printf("file %s: %s, reload on change %t\n", f.Path, f.Kind, f.ReloadOnChange)
	}
	for _, e := range plan.Maps["maps/host.map"].Entries {
		fmt.Printf("map entry %s -> %s\n", e.Key, e.Value)
	}
	// Output:
	// section core "global"
	// section core "frontend http-in"
	// section core "backend web"
	// file errors/503.http: general, reload on change true
	// file haproxy.cfg: config, reload on change true
	// file maps/host.map: map, reload on change false
	// map entry shop.example.com -> web
	// map entry blog.example.com -> web
}

// pod is an agent beside the fake HAProxy, in a temporary directory, with
// the example's two renders written beside it.
type pod struct {
	url, user, pass string
	renders         [2]string
	stop            func()
}

// startPod starts the fake HAProxy and an agent with the defaults
// (DefaultAgentConfig) but for the listen address and Basic credentials,
// and waits until the agent has found HAProxy. An example has no
// testing.T: a failure panics.
func startPod() *pod {
	// Short: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "hex")
	must(err)
	base := filepath.Join(dir, "base")
	must(os.Mkdir(base, 0o755))
	p := &pod{user: "admin", pass: "admin",
		renders: [2]string{filepath.Join(dir, "render-1"), filepath.Join(dir, "render-2")}}
	for i, hostMap := range []string{example.HostMapV1, example.HostMapV2} {
		must(example.WriteRender(p.renders[i], example.Config, hostMap))
	}
	fake, err := example.StartFake(base)
	must(err)
	agent, err := haptic.NewAgent(haptic.AgentConfig{BaseDir: base, Listen: "127.0.0.1:0",
		Username: p.user, Password: p.pass, Logger: slog.New(slog.DiscardHandler)})
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- agent.Run(ctx) }()
	p.url = "http://" + agent.Addr()
	p.stop = func() {
		cancel()
		must(<-stopped)
		fake.Close()
		os.RemoveAll(dir)
	}
	for deadline := time.Now().Add(10 * time.Second); !agent.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			p.stop()
			panic("the agent did not find the fake HAProxy within 10s")
		}
	}
	return p
}

// planOf is PlanFromDir over a temporary directory holding files.
func planOf(files map[string]string) *haptic.Plan {
	dir, err := os.MkdirTemp("", "render")
	must(err)
	defer os.RemoveAll(dir)
	writeFiles(dir, files)
	p, err := haptic.PlanFromDir(dir)
	must(err)
	return p
}

// writeFiles writes each file, by its slash-separated path, under dir.
func writeFiles(dir string, files map[string]string) { must(example.WriteFiles(dir, files)) }

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// The README's controller snippet is Example's body, its Output comment
// included, so that the code a reader copies is code that runs and prints
// what the README says: this fails when the two differ.
func TestREADMEQuotesExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	body, ok := exampleBody(string(src))
	if !ok {
		t.Fatal("example_test.go has no func Example() { ... // Output: ... }")
	}
	snippet, ok := readmeSnippet(string(readme), "## The package in a controller")
	if !ok {
		t.Fatal("README.md has no ```go block under \"## The package in a controller\"")
	}
	if snippet != body {
		got, want := strings.Split(snippet, "\n"), strings.Split(body, "\n")
		for i := range max(len(got), len(want)) {
			g, w := "(end)", "(end)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if g != w {
				t.Fatalf("README.md's controller snippet differs from Example's body at line %d:\nREADME:  %q\nExample: %q\n"+
					"copy the body of Example (one tab less) into the README", i+1, g, w)
			}
		}
	}
}

// exampleBody is the body of func Example, its Output comment included,
// one level of indentation removed and trailing blanks trimmed.
func exampleBody(src string) (string, bool) {
	_, rest, ok := strings.Cut(src, "\nfunc Example() {\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, "\n}\n")
	if !ok || !strings.Contains(body, "\n\t// Output:\n") {
		return "", false
	}
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(strings.TrimPrefix(l, "\t"), " \t")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n"), true
}

// readmeSnippet is the first ```go block after heading, its lines'
// trailing blanks trimmed.
func readmeSnippet(readme, heading string) (string, bool) {
	_, rest, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "```go\n")
	if !ok {
		return "", false
	}
	block, _, ok := strings.Cut(rest, "\n```")
	if !ok {
		return "", false
	}
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n"), true
}
