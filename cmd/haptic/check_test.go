// Tests of `haptic check`: the socket check with no HAProxy at hand, and
// HAProxy's own check on a real binary (HAPTIC_HAPROXY) of a render whose
// files are named at a base directory that does not exist here.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkRender writes a render whose haproxy.cfg declares socket as its
// stats socket and names its map relative to base (default-path origin;
// "" leaves HAProxy's default, the working directory), with extra appended to its defaults section, and returns its directory.
func checkRender(t *testing.T, base, socket, extra string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := "global\n"
	if socket != "" {
		cfg += "    stats socket " + socket + " mode 600 level admin\n"
	}
	if base != "" {
		cfg += "    default-path origin " + base + "\n"
	}
	cfg += "\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n" + extra +
		"\nfrontend http-in\n    bind 127.0.0.1:8080\n    use_backend %[req.hdr(host),lower,map(maps/host.map,default)]\n\nbackend default\n    http-request return status 404\n"
	for name, content := range map[string]string{"haproxy.cfg": cfg, "maps/host.map": "shop.example.com default\n"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCheckJudgesTheStatsSocketWithoutHAProxy(t *testing.T) {
	base := filepath.Join(t.TempDir(), "pod")
	noHAProxy := map[string]string{"PATH": t.TempDir()}
	for _, c := range []struct {
		name, socket string
		args         []string
		code         int
		want         []string
	}{
		{"the agent's socket", base + "/haproxy-worker.sock", nil, exitOK,
			[]string{"skipped haproxy -c: no haproxy on PATH", "ok      stats socket: haproxy.cfg declares the agent's worker socket " + base + "/haproxy-worker.sock"}},
		{"another socket", "/var/run/haproxy.sock", nil, exitFailure,
			[]string{"FAILED  stats socket: the configuration declares stats socket /var/run/haproxy.sock, not the agent's worker socket " + base + "/haproxy-worker.sock"}},
		{"an absolute --worker-socket", "/run/hap/w.sock", []string{"--worker-socket", "/run/hap/w.sock"}, exitOK,
			[]string{"ok      stats socket"}},
		{"no stats socket", "", nil, exitOK, []string{"unknown stats socket: cannot tell", "declares no stats socket"}},
		{"a --haproxy that is not there", base + "/haproxy-worker.sock", []string{"--haproxy", "/nonexistent/haproxy"}, exitFailure,
			[]string{"FAILED  haproxy -c: stat /nonexistent/haproxy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"check", "--base-dir", base}, c.args...), checkRender(t, base, c.socket, ""))
			r := runCLI(t, noHAProxy, args...)
			if r.code != c.code {
				t.Errorf("exit %d, want %d\n%s%s", r.code, c.code, r.out, r.err)
			}
			for _, w := range c.want {
				if !strings.Contains(r.out, w) {
					t.Errorf("output lacks %q:\n%s", w, r.out)
				}
			}
		})
	}
	if r := runCLI(t, noHAProxy, "check"); r.code != exitUsage {
		t.Errorf("no directory: exit %d, want %d", r.code, exitUsage)
	}
	if r := runCLI(t, noHAProxy, "check", t.TempDir()); r.code != exitFailure || !strings.Contains(r.err, "haproxy.cfg") {
		t.Errorf("a directory without haproxy.cfg: exit %d, want %d naming haproxy.cfg: %s", r.code, exitFailure, r.err)
	}
}

// TestRealCheckRunsHAProxysOwnCheck: the render names its map relative to
// a base directory that does not exist on this machine, so HAProxy finds
// it only in the copy the check points the base directory at. A good
// render passes both checks, and so does one without default-path, whose
// map HAProxy reads from its working directory; a keyword HAProxy does not know fails, with
// HAProxy's words naming the render's own file; without --haproxy the
// haproxy on PATH runs; a render off the agent's socket passes HAProxy and
// fails the socket check.
func TestRealCheckRunsHAProxysOwnCheck(t *testing.T) {
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set; real-HAProxy tests skipped")
	}
	base := filepath.Join(t.TempDir(), "pod")
	socket := base + "/haproxy-worker.sock"
	check := func(render string) cliResult {
		return runCLI(t, map[string]string{"PATH": t.TempDir()}, "check", "--haproxy", bin, "--base-dir", base, render)
	}

	good := check(checkRender(t, base, socket, ""))
	if good.code != exitOK || !strings.Contains(good.out, "ok      haproxy -c ("+bin+")") {
		t.Errorf("the good render: exit %d\n%s%s", good.code, good.out, good.err)
	}

	if cwd := check(checkRender(t, "", socket, "")); cwd.code != exitOK {
		t.Errorf("the render without default-path: exit %d\n%s%s", cwd.code, cwd.out, cwd.err)
	}

	render := checkRender(t, base, socket, "    bogus_keyword here\n")
	bad := check(render)
	if bad.code != exitFailure || !strings.Contains(bad.out, "FAILED  haproxy -c") ||
		!strings.Contains(bad.out, "bogus_keyword") || !strings.Contains(bad.out, filepath.Join(render, "haproxy.cfg")) {
		t.Errorf("the bad render: exit %d\n%s%s", bad.code, bad.out, bad.err)
	}

	onPath := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(onPath, "haproxy")); err != nil {
		t.Fatal(err)
	}
	found := runCLI(t, map[string]string{"PATH": t.TempDir() + ":" + onPath}, "check", "--base-dir", base, checkRender(t, base, socket, ""))
	if found.code != exitOK || !strings.Contains(found.out, "ok      haproxy -c ("+filepath.Join(onPath, "haproxy")+")") {
		t.Errorf("the haproxy on PATH: exit %d\n%s%s", found.code, found.out, found.err)
	}

	elsewhere := check(checkRender(t, base, "/var/run/haproxy.sock", ""))
	if elsewhere.code != exitFailure || !strings.Contains(elsewhere.out, "ok      haproxy -c") ||
		!strings.Contains(elsewhere.out, "FAILED  stats socket") {
		t.Errorf("the render off the agent's socket: exit %d\n%s%s", elsewhere.code, elsewhere.out, elsewhere.err)
	}
}

func TestIntoCopyMovesOnlyPathsUnderTheBase(t *testing.T) {
	const base, dst = "/etc/haproxy", "/tmp/c"
	for in, want := range map[string]string{
		"default-path origin /etc/haproxy\n":         "default-path origin /tmp/c\n",
		"default-path origin /etc/haproxy":           "default-path origin /tmp/c",
		"  bind :443 crt /etc/haproxy/certs/a.pem\n": "  bind :443 crt /tmp/c/certs/a.pem\n",
		`map("/etc/haproxy/maps/x.map",default)`:     `map("/tmp/c/maps/x.map",default)`,
		"map(/etc/haproxy,x)":                        "map(/tmp/c,x)",
		"errorfile 503 /etc/haproxy2/503.http\n":     "errorfile 503 /etc/haproxy2/503.http\n",
		"errorfile 503 /usr/share/haproxy/503.http":  "errorfile 503 /usr/share/haproxy/503.http",
	} {
		if got := string(intoCopy([]byte(in), base, dst)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
