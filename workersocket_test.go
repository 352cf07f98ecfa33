// Tests of the stats socket rule: which addresses a configuration's
// global section declares and a worker's show cli sockets lists, judged
// against the agent's worker socket; and the rule at work in an apply on
// the fake HAProxy, refusing a render before anything is installed.

package haptic

import (
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
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
// A revert, which installs no staged part, is not judged; where the live
// configuration does not name the agent's socket the same render reloads.
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
	t.Run("a revert installs none", func(t *testing.T) {
		e := newTestEnv(t, nil, nil)
		set := seedFiles()
		set[ConfigFilePath] = "global\n    stats socket " + e.fake.WorkerSocket() + "\n" + set[ConfigFilePath]
		e.land(t, "plan-1", set)
		next := set.clone()
		next["notes/created.txt"] = "created\n"
		m := e.revertManifest("plan-2", applyFileOnly(t, e.c, "plan-2", next).AppliedPlanProof)
		elsewhere := set.clone()
		elsewhere[ConfigFilePath] = strings.Replace(set[ConfigFilePath], e.fake.WorkerSocket(), "/var/run/haproxy/admin.sock", 1)
		m.Files = elsewhere.manifestFiles()
		if code, body := e.c.post(applyRequest{manifest: m, files: elsewhere}); code == http.StatusBadRequest {
			t.Errorf("a revert carrying a config part is refused: %s", body)
		}
	})
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

// TestFakeStatsSocketsFollowTheReload holds the fake to what HAProxy does
// when a reload moves the stats socket (TestFakeMatchesRealHAProxy compares
// the listings): the former worker's socket file stays with nobody
// accepting on it, the new worker answers on its own socket and lists it
// through the master, and a reload back binds the worker socket afresh,
// leaving the other file behind.
func TestFakeStatsSocketsFollowTheReload(t *testing.T) {
	for _, version := range []string{"2.6.12", "3.0.11", "3.4.3"} {
		t.Run("v"+version, func(t *testing.T) {
			f := startTestFake(t, version)
			other := filepath.Join(filepath.Dir(f.WorkerSocket()), "other.sock")
			sockets := []string{"unix@" + other}
			f.With(func(m *FakeModel) { m.OnReload = func(m *FakeModel) { m.StatsSockets = sockets } })
			reload := func() {
				t.Helper()
				pid := f.Worker().WorkerPID
				socketExchange(t, f.MasterSocket(), "reload;quit\n", 5*time.Second)
				waitFor(t, "the reload", func() bool { return f.Worker().WorkerPID != pid })
			}
			refused := func(path string) bool {
				conn, err := net.Dial("unix", path)
				if err == nil {
					conn.Close()
				}
				_, statErr := os.Lstat(path)
				return errors.Is(err, syscall.ECONNREFUSED) && statErr == nil
			}

			reload()
			if !refused(f.WorkerSocket()) {
				t.Errorf("the former worker's socket %s is not a file nobody accepts on", f.WorkerSocket())
			}
			if reply, _ := socketExchange(t, other, "show info\n", 5*time.Second); !strings.Contains(reply, "Pid: ") {
				t.Errorf("the new worker does not answer on %s: %q", other, reply)
			}
			if reply, _ := socketExchange(t, f.MasterSocket(), "@1 show cli sockets;quit\n", 5*time.Second); !strings.Contains(reply, "unix@"+other+" admin all\n") ||
				strings.Contains(reply, f.WorkerSocket()) {
				t.Errorf("@1 show cli sockets: %q", reply)
			}

			sockets = nil
			reload()
			if reply, _ := socketExchange(t, f.WorkerSocket(), "show info\n", 5*time.Second); !strings.Contains(reply, "Pid: ") {
				t.Errorf("the worker socket does not answer after the reload back: %q", reply)
			}
			if !refused(other) {
				t.Errorf("%s is not left behind with nobody accepting on it", other)
			}
		})
	}
}

// TestAWorkerOffTheAgentsSocketIsRolledBackWithinSeconds: on the fake, in
// each dialect, a render whose new worker listens on other.sock only (the
// configuration it replaces names no socket, so nothing refuses it before
// the reload) is answered within seconds, not after the 60 s reload
// timeout: a NACK at stage reload naming the agent's socket and the
// worker's, rolled back and reloaded, the old set on disk, the worker
// socket answering, and other.sock removed once nobody accepts on it.
func TestAWorkerOffTheAgentsSocketIsRolledBackWithinSeconds(t *testing.T) {
	for _, version := range []string{"2.6.12", "3.0.11", "3.4.3"} {
		t.Run("v"+version, func(t *testing.T) {
			e := newTestEnvOn(t, version, func(c *AgentConfig) { c.ReloadTimeout = 60 * time.Second }, nil)
			other := filepath.Join(filepath.Dir(e.fake.WorkerSocket()), "other.sock")
			e.fake.With(func(m *FakeModel) {
				load := m.OnReload
				m.OnReload = func(m *FakeModel) {
					load(m)
					m.StatsSockets = nil
					if cfg, _ := os.ReadFile(filepath.Join(e.cfg.BaseDir, ConfigFilePath)); strings.Contains(string(cfg), other) {
						m.StatsSockets = []string{"unix@" + other}
					}
				}
			})
			set := seedFiles()
			e.land(t, "plan-1", set)
			next := set.clone()
			next[ConfigFilePath] = "global\n    stats socket " + other + "\n" + set[ConfigFilePath]

			start := time.Now()
			res := e.c.apply(reloadManifest(e, "plan-elsewhere", next), next)
			if took := time.Since(start); took > mismatchBound {
				t.Errorf("the push took %v, more than %v", took, mismatchBound)
			}
			if res.OK || res.Error == nil || res.Error.Stage != StageReload ||
				!strings.Contains(res.Error.Message, e.fake.WorkerSocket()) || !strings.Contains(res.Error.Message, "unix@"+other) {
				t.Errorf("answer %s: want a NACK at stage reload naming %s and unix@%s", jsonOf(res), e.fake.WorkerSocket(), other)
			}
			if res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
				t.Errorf("rollback %s: want the restored set reloaded", jsonOf(res.Rollback))
			}
			if got := e.disk(t); !sameSet(got, set) {
				t.Errorf("the tree is not the set before the push: %v", got.paths())
			}
			if reply, _ := socketExchange(t, e.fake.WorkerSocket(), "show info\n", 5*time.Second); !strings.Contains(reply, "Pid: ") {
				t.Errorf("no worker answers the agent's socket: %q", reply)
			}
			if _, err := os.Lstat(other); !os.IsNotExist(err) {
				t.Errorf("%s is left behind (%v)", other, err)
			}
		})
	}
}

// TestRemoveStraysRemovesOnlySocketsNobodyAcceptsOn: of the paths a worker
// the agent could not reach listed, removeStrays removes a socket file
// nobody accepts on, and one whose listener closes a moment later (the
// replaced worker stopping); it keeps a socket still accepting, a regular
// file at such a path, and minds a path that is gone.
func TestRemoveStraysRemovesOnlySocketsNobodyAcceptsOn(t *testing.T) {
	dir := shortTempDir(t)
	listen := func(name string) *net.UnixListener {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		return ln
	}
	listen("dead.sock").Close()
	live := listen("live.sock")
	defer live.Close()
	closing := listen("closing.sock")
	time.AfterFunc(3*awaitWorkerPoll, func() { closing.Close() })
	if err := os.WriteFile(filepath.Join(dir, "file.sock"), []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &applyDeps{logger: testLogger()}
	for _, name := range []string{"dead.sock", "live.sock", "closing.sock", "file.sock", "gone.sock"} {
		d.strays = append(d.strays, filepath.Join(dir, name))
	}
	d.removeStrays()
	for name, kept := range map[string]bool{"dead.sock": false, "live.sock": true, "closing.sock": false, "file.sock": true} {
		if _, err := os.Lstat(filepath.Join(dir, name)); (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", name, err == nil, kept)
		}
	}
	if d.strays != nil {
		t.Errorf("strays %v are kept after their removal", d.strays)
	}
}

// TestASlowWorkerTheAgentReachesByAnotherPathIsWaitedFor: the agent dials
// HAProxy's worker socket by another path (a hard link standing for the
// agent's own mount of the base directory), so the master's listing never
// names the agent's path. A new worker whose first answers are cut for
// longer than the grace is still waited for, and adopted: only a socket
// that refuses connections is asked about.
func TestASlowWorkerTheAgentReachesByAnotherPathIsWaitedFor(t *testing.T) {
	fake := startTestFake(t, "")
	view := filepath.Join(shortTempDir(t), "haproxy-worker.sock")
	if err := os.Link(fake.WorkerSocket(), view); err != nil {
		t.Skipf("cannot link the worker socket: %v", err)
	}
	cfg := testAgentConfig(t, fake)
	cfg.WorkerSocket = view
	loadOnReload(fake, cfg.BaseDir)
	a, _ := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	set := seedFiles()
	c.apply(c.manifest("plan-1", set), set)

	var cutUntil time.Time
	fake.With(func(m *FakeModel) {
		load := m.OnReload
		m.OnReload = func(m *FakeModel) {
			load(m)
			cutUntil = time.Now().Add(2 * workerSocketGrace)
		}
		m.CutReply = func(line string) (int, bool) {
			return 0, strings.Contains(line, "show info") && time.Now().Before(cutUntil)
		}
	})
	next := set.clone()
	next[ConfigFilePath] += "# 2\n"
	m := c.manifest("plan-2", next)
	m.Mode = ModeReload
	if res := c.apply(m, next); !res.OK || res.Mode != ResultReload || res.HAProxy.WorkerPID != fake.Worker().WorkerPID {
		t.Errorf("the slow worker was not waited for: %s", jsonOf(res))
	}
}
