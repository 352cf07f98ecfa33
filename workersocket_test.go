// Tests of the stats socket rule: which addresses a configuration's
// global section declares and a worker's show cli sockets lists, judged
// against the agent's worker socket; and the rule at work in an apply on
// the fake HAProxy, refusing a render before anything is installed.

package haptic

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const agentSocket = "/run/hap/haproxy-worker.sock"

func TestCheckWorkerSocket(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/run/hap", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	realDir := t.TempDir()
	linked := filepath.Join(dir, "linked")
	if err := os.Symlink(realDir, linked); err != nil {
		t.Fatal(err)
	}
	const (
		declared = "declared"
		unknown  = "unknown"
		other    = "other"
	)
	cases := []struct {
		name, config, socket, want string
	}{
		{"the agent's path", "global\n    stats socket /run/hap/haproxy-worker.sock mode 600 level admin\n", "", declared},
		{"among others", "global\n  stats socket ipv4@127.0.0.1:9999\n  stats socket /run/hap/haproxy-worker.sock\n", "", declared},
		{"unix@", "global\n  stats socket unix@/run/hap/haproxy-worker.sock level admin\n", "", declared},
		{"stream+unix@", "global\n  stats socket stream+unix@/run/hap/haproxy-worker.sock\n", "", declared},
		{"uxst@", "global\n  stats socket uxst@/run/hap/haproxy-worker.sock\n", "", declared},
		{"not cleaned", "global\n  stats socket /run/hap/./haproxy-worker.sock\n", "", declared},
		{"through a link to the same directory", "global\n  stats socket " + linked + "/w.sock\n", realDir + "/w.sock", declared},
		{"a second global section", "global\n  log stdout local0\nfrontend f\n  bind :80\nglobal\n  stats socket /run/hap/haproxy-worker.sock\n", "", declared},
		{"a comment glued to the path", "global\n  stats socket /run/hap/haproxy-worker.sock#the agent's\n", "", declared},
		{"an unindented line", "global\nstats socket /run/hap/haproxy-worker.sock\n", "", declared},

		{"another path", "global\n  stats socket /var/run/haproxy.sock mode 600 level admin\n", "", other},
		{"another name in the directory", "global\n  stats socket /run/hap/admin.sock\n", "", other},
		{"a TCP socket", "global\n  stats socket ipv4@127.0.0.1:9999 level admin\n", "", other},
		{"an address without family", "global\n  stats socket 127.0.0.1:9999\n", "", other},
		{"an abstract socket", "global\n  stats socket abns@haproxy\n", "", other},
		{"the agent's path behind a comment", "global\n  stats socket /var/run/haproxy.sock # /run/hap/haproxy-worker.sock\n", "", other},
		{"the agent's path commented out", "global\n  # stats socket /run/hap/haproxy-worker.sock\n  stats socket /var/run/haproxy.sock\n", "", other},
		{"the agent's path outside global", "global\n  stats socket /var/run/haproxy.sock\nlisten stats\n  stats socket /run/hap/haproxy-worker.sock\n", "", other},
		{"a dangling link's directory", "global\n  stats socket " + dir + "/link/haproxy-worker.sock\n", "", other},

		{"none", "global\n  log stdout local0\n", "", unknown},
		{"none in global", "defaults\n  mode http\nlisten stats\n  stats socket /var/run/haproxy.sock\n", "", unknown},
		{"relative", "global\n  stats socket unix@haproxy.sock\n", "", unknown},
		{"inherited", "global\n  stats socket fd@3\n", "", unknown},
		{"a socket pair", "global\n  stats socket sockpair@4\n", "", unknown},
		{"quoted", "global\n  stats socket \"/var/run/haproxy.sock\"\n", "", unknown},
		{"an environment variable", "global\n  stats socket ${SOCK}\n", "", unknown},
		{"a line too long", "global\n  stats socket /var/run/haproxy.sock\n#" + strings.Repeat("x", maxConfigLineBytes) + "\n", "", unknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			socket := c.socket
			if socket == "" {
				socket = agentSocket
			}
			err := CheckWorkerSocket(strings.NewReader(c.config), socket)
			got := other
			switch {
			case err == nil:
				got = declared
			case errors.Is(err, ErrSocketUnknown):
				got = unknown
			case !strings.Contains(err.Error(), socket) || !strings.Contains(err.Error(), "stats socket "):
				t.Errorf("the mismatch %q does not name the agent's socket and the declared ones", err)
			}
			if got != c.want {
				t.Errorf("%s, want %s (%v)", got, c.want, err)
			}
		})
	}
}

func TestLosesWorkerSocket(t *testing.T) {
	const (
		mine   = "global\n  stats socket /run/hap/haproxy-worker.sock level admin\n"
		theirs = "global\n  stats socket /var/run/haproxy/admin.sock level admin\n"
		quoted = "global\n  stats socket \"/var/run/haproxy/admin.sock\"\n"
		none   = "global\n  log stdout local0\n"
	)
	cases := []struct {
		live, staged string
		refused      bool
	}{
		{mine, theirs, true},
		{mine, mine, false},
		{mine, quoted, false},
		{mine, none, false},
		{theirs, theirs, false}, // the deployment does not name the agent's socket in this file at this path
		{none, theirs, false},
		{quoted, theirs, false},
	}
	for _, c := range cases {
		err := losesWorkerSocket(strings.NewReader(c.live), strings.NewReader(c.staged), agentSocket)
		if (err != nil) != c.refused {
			t.Errorf("live %q, staged %q: %v, want refused %v", c.live, c.staged, err, c.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), agentSocket) || !strings.Contains(err.Error(), "/var/run/haproxy/admin.sock")) {
			t.Errorf("the refusal %q does not name both sockets", err)
		}
	}
}

// TestSocketsElsewhereReadsEachVersionsListing: the replies are @1 show cli
// sockets as HAProxy 2.6.12, 3.0.11 and 3.4.0 answered it (3.4 lists the
// master's sockpair@ first), through trimReply.
func TestSocketsElsewhereReadsEachVersionsListing(t *testing.T) {
	const other = "/tmp/d/other.sock"
	cases := []struct {
		name, reply string
		bound       []string // nil: no verdict
	}{
		{"2.6 elsewhere", "# socket lvl processes\nunix@/tmp/d/other.sock admin all\nsockpair@5 admin all", []string{other}},
		{"3.0 elsewhere", "# socket lvl processes\nunix@/tmp/d/other.sock admin all\nsockpair@8 admin all", []string{other}},
		{"3.4 elsewhere", "# socket lvl processes\nsockpair@8 admin all\nunix@/tmp/d/other.sock admin all", []string{other}},
		{"a TCP socket too", "# socket lvl processes\nunix@/tmp/d/other.sock admin all\nipv4@127.0.0.1:19999 admin all\nsockpair@4 admin all", []string{other}},
		{"no stats socket at all", "# socket lvl processes\nsockpair@8 admin all", []string{}},
		{"the agent's among them", "# socket lvl processes\nunix@/tmp/d/other.sock admin all\nunix@/tmp/d/haproxy-worker.sock admin all\nsockpair@5 admin all", nil},
		{"a relative path", "# socket lvl processes\nunix@/tmp/d/other.sock admin all\nunix@rel.sock admin all\nsockpair@5 admin all", nil},
		{"no such worker", "Can't find the target PID matching the prefix '@!99999'", nil},
		{"empty", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bound, err := socketsElsewhere(c.reply, "/tmp/d/haproxy-worker.sock")
			if c.bound == nil {
				if err != nil || bound != nil {
					t.Errorf("a verdict (%v, %v) where there is none", bound, err)
				}
				return
			}
			if !errors.Is(err, errNoNewWorker) || !reloadWithoutVerdict(err) || !strings.Contains(err.Error(), "/tmp/d/haproxy-worker.sock") {
				t.Fatalf("error %v: want an errNoNewWorker naming the agent's socket", err)
			}
			if !slices.Equal(bound, c.bound) && len(bound)+len(c.bound) > 0 {
				t.Errorf("bound %q, want %q", bound, c.bound)
			}
			for _, p := range c.bound {
				if !strings.Contains(err.Error(), "unix@"+p) {
					t.Errorf("error %q does not name unix@%s", err, p)
				}
			}
		})
	}
}

// TestARenderOffTheAgentsSocketIsRefusedBeforeAnythingIsInstalled: on the
// fake, whose configuration declares the agent's worker socket, a render
// declaring another one is refused at stage parts whether it arrives small
// (in memory), large (a temp file) or as a patch of a large config (a
// built file): nothing is written, nothing reloaded, the rejection counted.
// Where the live configuration does not name the agent's socket the same
// render reloads.
func TestARenderOffTheAgentsSocketIsRefusedBeforeAnythingIsInstalled(t *testing.T) {
	for _, size := range []string{"small", "large", "patched"} {
		t.Run(size, func(t *testing.T) {
			e := newTestEnv(t, nil, nil)
			mine := "global\n    stats socket " + e.fake.WorkerSocket() + " mode 600 level admin\n"
			if size != "small" {
				mine += strings.Repeat("# padding\n", maxInlineBytes/10+1)
			}
			set := seedFiles()
			set[ConfigFilePath] = mine + set[ConfigFilePath]
			e.land(t, "plan-1", set)
			reloads := func() (n int) {
				e.fake.With(func(m *FakeModel) { n = m.Reloads })
				return n
			}
			was, before := reloads(), e.disk(t)

			next := set.clone()
			next[ConfigFilePath] = strings.Replace(set[ConfigFilePath], e.fake.WorkerSocket(), "/var/run/haproxy/admin.sock", 1)
			req := applyRequest{manifest: reloadManifest(e, "plan-elsewhere", next), files: next}
			if size == "patched" {
				req.manifest, req.override = patched(e, "plan-elsewhere", set, next)
			}
			code, body := e.c.post(req)
			if code != http.StatusBadRequest {
				t.Fatalf("answer %d %s, want 400", code, body)
			}
			if ae := applyErr(t, body); ae.Stage != StageParts || !strings.Contains(ae.Message, e.fake.WorkerSocket()) ||
				!strings.Contains(ae.Message, "/var/run/haproxy/admin.sock") {
				t.Errorf("error %+v: want stage parts naming both sockets", ae)
			}
			if got := e.disk(t); !sameSet(got, before) {
				t.Errorf("the tree changed: %v", got.paths())
			}
			if reloads() != was {
				t.Errorf("a reload ran")
			}
			if got := metricValue(e.a, "apply_rejected_total", StageParts); got != 1 {
				t.Errorf("apply_rejected_total{stage=parts} = %d, want 1", got)
			}
		})
	}
	t.Run("the live configuration names another socket", func(t *testing.T) {
		e := newTestEnv(t, nil, nil)
		set := seedFiles()
		set[ConfigFilePath] = "global\n    stats socket /srv/elsewhere/haproxy-worker.sock\n" + set[ConfigFilePath]
		e.land(t, "plan-1", set)
		next := set.clone()
		next[ConfigFilePath] = strings.Replace(set[ConfigFilePath], "/srv/elsewhere/", "/var/run/haproxy/", 1)
		if res := e.c.apply(reloadManifest(e, "plan-2", next), next); !res.OK || res.Mode != ResultReload {
			t.Errorf("the render was not reloaded: %s", jsonOf(res))
		}
	})
}
