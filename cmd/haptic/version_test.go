// Tests of the build's version: the fallback from the link flag to the
// module version, the VCS revision and dev; `haptic version`; the link
// flag's variable as the Dockerfile sets it, in a binary built for real;
// and the agent reporting the version in its state and its metrics.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuildVersionFallsBackFromTheLinkFlagToDev(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "7510591d4e92117f31924f55cc33fff145ccbc9b"
	for _, c := range []struct {
		name   string
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"a release's link flag wins", "v1.2.0", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-x"}, Settings: vcs(rev, "true")}, "v1.2.0"},
		{"go install module@version", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.1.0"}}, "v1.1.0"},
		{"go build in a clone", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261205020225-7510591d4e92+dirty"}, Settings: vcs(rev, "true")},
			"v0.0.0-20261205020225-7510591d4e92+dirty"},
		{"a revision without a module version", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "dev+7510591d4e92"},
		{"the same, with uncommitted changes", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "dev+7510591d4e92-dirty"},
		{"a short revision", "", &debug.BuildInfo{Settings: vcs("abc", "false")}, "dev+abc"},
		{"nothing known", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"no build information", "", nil, "dev"},
	} {
		if got := buildVersion(c.linked, c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestVersionCommandPrintsTheVersionGoAndRevision(t *testing.T) {
	want := "version: " + agentVersion() + "\ngo: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if r := runCLI(t, nil, args...); r.code != exitOK || r.out != want || r.err != "" {
			t.Errorf("haptic %q: code %d stdout %q stderr %q, want %q", args, r.code, r.out, r.err, want)
		}
	}
	if r := runCLI(t, nil, "version", "extra"); r.code != exitUsage || !strings.Contains(r.err, `unexpected argument "extra"`) {
		t.Errorf("an extra argument: code %d stderr %q", r.code, r.err)
	}
	var out strings.Builder
	printVersion(&out, "dev+7510591d4e92-dirty", &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "7510591d4e92117f31924f55cc33fff145ccbc9b"}, {Key: "vcs.modified", Value: "true"}}})
	if !strings.HasSuffix(out.String(), "\nrevision: 7510591d4e92117f31924f55cc33fff145ccbc9b (modified)\n") {
		t.Errorf("with a revision: %q", out.String())
	}
}

// The variable a release's -ldflags "-X main.version=..." sets is the one
// the command reads: the linker ignores a -X that names nothing, so only
// a real build shows it.
func TestTheLinkFlagNamesTheBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	bin := filepath.Join(t.TempDir(), "haptic")
	build := exec.Command(goTool, "build", "-ldflags", "-X main.version=v9.8.7-linked", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "version: v9.8.7-linked\n") {
		t.Errorf("the built binary: %v %q", err, out)
	}
}

// The agent started by the command reports the build's version in its
// state and in haptic_agent_build_info.
func TestTheAgentReportsItsVersion(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v1.2.3-test"
	base := startCLIFake(t).base
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, logWriter := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"agent", "--base-dir", base, "--listen", "127.0.0.1:0", "--metrics-listen", metricsAddr},
			stdio{out: io.Discard, err: logWriter, getenv: func(k string) string {
				return map[string]string{"DATAPLANE_USERNAME": "u", "DATAPLANE_PASSWORD": "p"}[k]
			}})
		logWriter.Close()
	}()
	// The logs are read to the end while the test asks the agent: a log
	// line nobody reads would block the agent.
	type started struct{ Msg, Listen, Version string }
	start := make(chan started, 1)
	go func() {
		lines := bufio.NewScanner(logs)
		for lines.Scan() {
			var rec started
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "agent started" {
				start <- rec
			}
		}
		close(start)
	}()
	rec, ok := <-start
	if !ok {
		t.Fatalf("the agent did not start: exit %d", <-done)
	}
	if rec.Version != "v1.2.3-test" {
		t.Errorf("the start is logged with version %q", rec.Version)
	}
	waitReadyz(t, "http://"+rec.Listen)
	if r := runCLI(t, nil, "agent", "state", "--base-dir", base); !strings.HasPrefix(r.out, "agent: v1.2.3-test (api 1)\n") {
		t.Errorf("agent state: code %d stdout %q stderr %q", r.code, r.out, r.err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nhaptic_agent_build_info{version=\"v1.2.3-test\"} 1\n") {
		t.Errorf("/metrics lacks the build's version:\n%s", body)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d", code)
	}
}
