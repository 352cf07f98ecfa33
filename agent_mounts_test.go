// Tests of a tree that spans mounts (agent_mounts.go): the mount table's
// parsing, and, in a private mount namespace, agents whose base directory
// and general/ (and maps/) are bind mounts of directories of one
// filesystem, as a container runtime makes of named volumes: link(2) and
// rename(2) between them fail with EXDEV although they share a device.

package haptic

import (
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mountInfoFile writes a mount table: the root filesystem, a malformed
// line, then one line per point (a directory of a volume, its root within
// the device chosen by the point's index unless given as "point=root").
func mountInfoFile(t *testing.T, points ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\nshort line\n")
	for i, p := range points {
		point, root, ok := strings.Cut(p, "=")
		if !ok {
			root = fmt.Sprintf("/volumes/%d", i)
		}
		fmt.Fprintf(&b, "%d 22 8:1 %s %s rw - ext4 /dev/sda1 rw\n", 30+i, root, point)
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mi, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return mi
}

// TestProbeMountsReadsTheMountTable: the mount points strictly below the
// base (field 5, octal escapes decoded) are the tree's mounts, deepest
// first and the base last; a point listed twice is the later mount; a
// point that is a single file is refused with a reason.
func TestProbeMountsReadsTheMountTable(t *testing.T) {
	base, _ := filepath.EvalSymlinks(t.TempDir())
	for _, d := range []string{"general", "maps", "maps/big", "with space\tand tab"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	os.WriteFile(filepath.Join(base, "haproxy.cfg"), nil, 0o644)
	escaped := strings.NewReplacer(" ", `\040`, "\t", `\011`).Replace(base + "/with space\tand tab")
	for _, tc := range []struct {
		name   string
		points []string
		roots  []string // relative to base; "" is the base
		err    string
	}{
		{"none below", []string{base, base + "2", "/elsewhere"}, []string{""}, ""},
		{"one below", []string{base + "/general"}, []string{"general", ""}, ""},
		{"nested, deepest first", []string{base + "/maps", base + "/general", base + "/maps/big"}, []string{"maps/big", "general", "maps", ""}, ""},
		{"escaped", []string{escaped}, []string{"with space\tand tab", ""}, ""},
		{"absent points are hidden", []string{base + "/gone"}, []string{""}, ""},
		{"a single file", []string{base + "/haproxy.cfg"}, nil,
			base + "/haproxy.cfg is a single file mounted inside " + base + ": a file mounted on its own cannot be replaced atomically"},
	} {
		ms, err := probeMounts(mountInfoFile(t, tc.points...), base, osDisk{})
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		var roots []string
		for _, m := range ms {
			rel, _ := filepath.Rel(base, m.root)
			roots = append(roots, strings.TrimPrefix(rel, "."))
		}
		if err != nil || !slices.Equal(roots, tc.roots) {
			t.Errorf("%s: %q %v, want %q", tc.name, roots, err, tc.roots)
		}
	}
	if got := unescapeMountField(`a\040b\x\12`); got != `a b\x\12` {
		t.Errorf("unescapeMountField kept malformed escapes as %q", got)
	}
	if ms, err := probeMounts("/nonexistent/mountinfo", base, osDisk{}); err != nil || len(ms) != 1 {
		t.Errorf("without a mount table: %v %v", ms, err)
	}
}

// TestEachMountGetsItsOwnTempAndBackupDirs: every mount gets .haptic-tmp
// and .haptic-lkg; a part for a path on a mount is staged in that mount's
// temp directory, its undo link is made in that mount's link directory,
// and the sweep empties every mount's.
func TestEachMountGetsItsOwnTempAndBackupDirs(t *testing.T) {
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	os.MkdirAll(filepath.Join(dir, "general"), 0o755)
	ts := newTestStore(t, func(c *fileStoreConfig) {
		c.Base, c.MountInfo = dir, mountInfoFile(t, dir+"/general")
	})
	for _, root := range []string{dir, dir + "/general"} {
		for _, name := range []string{storeTempDir, storeLinkDir} {
			if fi, err := os.Lstat(filepath.Join(root, name)); err != nil || !fi.IsDir() {
				t.Errorf("%s/%s: %v", root, name, err)
			}
		}
	}
	ts.write(t, "general/page.http", "old page\n")
	ts.write(t, "maps/host.map", "old map\n")
	// Parts too large to ride in the record are staged in a temp file of
	// their path's mount.
	big := strings.Repeat("x", maxInlineBytes+1)
	for rel, want := range map[string]string{"general/big.bin": filepath.Join(dir, "general", storeTempDir), "big.bin": filepath.Join(dir, storeTempDir)} {
		f, err := ts.stage(rel, strings.NewReader(big), nil, DigestString(big), int64(len(big)), FileAt{}, budget())
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(f.tmp) != want {
			t.Errorf("%s staged at %s, want in %s", rel, f.tmp, want)
		}
	}
	changes := []fileChange{{Path: "general/page.http"}, {Path: "maps/host.map"}}
	if err := ts.linkUndo(changes, map[string]FileAt{}, linkAll); err != nil {
		t.Fatal(err)
	}
	if d := filepath.Dir(changes[0].Undo); d != filepath.Join(dir, "general", storeLinkDir) {
		t.Errorf("general/page.http linked at %s", changes[0].Undo)
	}
	if d := filepath.Dir(changes[1].Undo); d != filepath.Join(dir, storeLinkDir) {
		t.Errorf("maps/host.map linked at %s", changes[1].Undo)
	}
	if err := ts.sweep(nil); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{dir, dir + "/general"} {
		for _, name := range []string{storeTempDir, storeLinkDir} {
			if entries, _ := os.ReadDir(filepath.Join(root, name)); len(entries) != 0 {
				t.Errorf("%s/%s keeps %d entries after the sweep", root, name, len(entries))
			}
		}
	}
}

// ---------------------------------------------------------------------------
// In a private mount namespace, on real bind mounts.

// bindMountTree makes a base directory and each of subs below it a bind
// mount of a directory of its own, all of one filesystem, and returns the
// base. It runs in a private mount namespace (runInMountNamespace).
func bindMountTree(t *testing.T, subs ...string) string {
	t.Helper()
	root, _ := filepath.EvalSymlinks(t.TempDir())
	base := filepath.Join(root, "base")
	for i, sub := range append([]string{""}, subs...) {
		src, dst := filepath.Join(root, fmt.Sprintf("volume-%d", i)), filepath.Join(base, sub)
		bindMount(t, src, dst)
	}
	return base
}

// bindMount mounts the directory src (created if needed) at dst (created
// if needed), and unmounts it when the test ends.
func bindMount(t *testing.T, src, dst string) {
	t.Helper()
	for _, d := range []string{src, dst} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount here (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dst, syscall.MNT_DETACH) })
}

// mountedSet is the first set of a tree on mounts: the seed, a map on
// maps/ and an error page on general/.
func mountedSet() fileSet {
	fs := seedFiles()
	fs["general/503.http"] = "HTTP/1.0 503 Service Unavailable\r\n\r\nbusy\n"
	return fs
}

// TestGeneralOnItsOwnMountIsWrittenAndRolledBack runs the agent on a base
// directory whose general/ and maps/ are volumes of their own. Everything
// works as on one filesystem: a refused config puts every mount back as
// the refused apply found it, ACKed changes on any mount stay, every part
// and undo link of a file is made inside the mount that holds it, a mount
// below the base that is a single file is refused at start, a mount that
// appears after the start fails an apply cleanly, and a record made on a
// volume that is gone at the next start is never acted on.
func TestGeneralOnItsOwnMountIsWrittenAndRolledBack(t *testing.T) {
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestGeneralOnItsOwnMountIsWrittenAndRolledBack")
		return
	}
	t.Run("a refused config puts every mount back", func(t *testing.T) {
		base := bindMountTree(t, "general", "maps")
		var ops opRecorder
		e := newTestEnvWithDisk(t, ops.disk(), func(c *AgentConfig) { c.BaseDir = base })
		set := mountedSet()
		e.land(t, "plan-1", set)
		before := e.c.state("?plan=0")
		next := set.clone()
		next["general/503.http"] += "changed\n"
		next["maps/host.map"] += "new.example be-b\n"
		next[ConfigFilePath] += "bogus\n"
		e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
		ops.reset()
		res := e.c.apply(reloadManifest(e, "plan-bad", next), next)
		e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
		if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Rollback == nil || !res.Rollback.Performed {
			t.Fatalf("the refused config: %s", jsonOf(res))
		}
		if got := e.disk(t); !sameSet(got, set) {
			t.Errorf("the tree after the refusal:\n%s", describeSetDiff(got, set))
		}
		samePairs(t, "after the refusal", e.c.state("?plan=0"), before)
		// Each changed file was staged and linked aside within the mount
		// that holds it: the link's name carries the digest of its path.
		for rel, root := range map[string]string{ConfigFilePath: base, "general/503.http": base + "/general", "maps/host.map": base + "/maps"} {
			link := filepath.Join(root, storeLinkDir) + "/"
			if !ops.saw("create", filepath.Join(root, storeTempDir)) || !ops.sawSuffix("link", link, "-"+DigestString(filepath.Join(base, rel))) {
				t.Errorf("%s: not staged in %s/%s or not linked aside in %s; the operations:\n%s", rel, root, storeTempDir, link, &ops)
			}
		}
	})
	t.Run("a refusal keeps the ACKs of every mount", func(t *testing.T) {
		base := bindMountTree(t, "general", "maps")
		e := newTestEnvWithDisk(t, nil, func(c *AgentConfig) { c.BaseDir = base })
		set := mountedSet()
		e.land(t, "plan-1", set)
		set, _ = ackEntries(t, e.c, set, "ack", 3)
		page := set.clone()
		page["general/503.http"] = "HTTP/1.0 503 Service Unavailable\r\n\r\nback soon\n"
		if res := e.c.apply(e.c.manifest("plan-page", page), page); !res.OK || res.Mode != ResultFileOnly {
			t.Fatalf("the file_only change on general/: %s", jsonOf(res))
		}
		set = page
		before := e.c.state("?plan=0")
		bad := set.clone()
		bad["general/503.http"] += "refused\n"
		bad["maps/host.map"] += "refused.example be-b\n"
		bad[ConfigFilePath] += "bogus\n"
		e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
		res := e.c.apply(reloadManifest(e, "plan-bad", bad), bad)
		e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
		if res.OK || res.Error == nil || res.Error.Stage != StageReload {
			t.Fatalf("the refused config: %s", jsonOf(res))
		}
		if got := e.disk(t); !sameSet(got, set) {
			t.Errorf("the tree after the refusal is not the ACKed set:\n%s", describeSetDiff(got, set))
		}
		samePairs(t, "after the refusal", e.c.state("?plan=0"), before)
		workerHoldsMapOf(t, e.fake, set)
	})
	t.Run("a single file mounted below the base is refused at start", func(t *testing.T) {
		base := bindMountTree(t, "general")
		src := filepath.Join(t.TempDir(), "503.http")
		os.WriteFile(src, []byte("page\n"), 0o644)
		dst := filepath.Join(base, "general/503.http")
		os.WriteFile(dst, nil, 0o644)
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
			t.Skipf("cannot bind-mount a file here (%v)", err)
		}
		t.Cleanup(func() { syscall.Unmount(dst, syscall.MNT_DETACH) })
		cfg := testAgentConfig(t, nil)
		cfg.BaseDir, cfg.WorkerSocket, cfg.MasterSocket = base, "w.sock", "m.sock"
		a, err := NewAgent(cfg)
		want := "--base-dir: " + dst + " is a single file mounted inside " + base + ": a file mounted on its own cannot be replaced atomically"
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			if a != nil {
				a.led.close()
			}
			t.Fatalf("NewAgent: %v, want %q", err, want)
		}
	})
	t.Run("a mount that appears after the start fails the apply cleanly", func(t *testing.T) {
		base := bindMountTree(t, "general")
		logs := newLogCounter(testLogger().Handler())
		e := newTestEnvWithDisk(t, nil, func(c *AgentConfig) { c.BaseDir, c.MetricsListen, c.Logger = base, "127.0.0.1:0", slog.New(logs) })
		set := mountedSet()
		e.land(t, "plan-1", set)
		bindMount(t, filepath.Join(filepath.Dir(base), "volume-late"), filepath.Join(base, "extra"))
		before := e.snapshot(t)
		next := set.clone()
		next["a/first.txt"] = "installed before the path on the new mount\n"
		next["extra/new.txt"] = "on a mount the agent did not see\n"
		res := e.c.apply(e.c.manifest("plan-late", next), next)
		point := "mounted at " + filepath.Join(base, "extra")
		if res.OK || res.Error == nil || !strings.Contains(res.Error.Message, `"extra/new.txt"`) || !strings.Contains(res.Error.Message, point) {
			t.Fatalf("the apply across a new mount: %s, want the path and %q", jsonOf(res), point)
		}
		if got := e.disk(t); !sameSet(got, set) {
			t.Errorf("the tree after the refusal:\n%s", describeSetDiff(got, set))
		}
		// An operator's new volume is neither a bug nor a change behind the
		// agent's back: no invariant, but its own gauge, log line and
		// readiness until a restart sees it.
		if st := e.c.state("?plan=0"); st.InvariantViolation != "" || st.AppliedPlanID != before.st.AppliedPlanID {
			t.Errorf("after the apply: invariant %q, applied %q", st.InvariantViolation, st.AppliedPlanID)
		}
		if !strings.Contains(scrape(t, e.a), "\nhaptic_agent_late_mount 1\n") {
			t.Error("the gauge does not say a mount appeared")
		}
		if n := logs.count("a mount appeared under the tree after the agent started; pushes that touch it are refused, and the agent is not ready, until it restarts"); n != 1 {
			t.Errorf("the late mount was logged %d times", n)
		}
		if code, body := getText(t, e.a, PathReadyz); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, msgLateMount+": ") || !strings.Contains(body, point) {
			t.Errorf("readyz after the late mount: %d %q", code, body)
		}
		// The next start probes the mounts again, and the apply lands.
		e.restart(t)
		if res := e.c.apply(e.c.manifest("plan-late", next), next); !res.OK {
			t.Fatalf("after a restart: %s", jsonOf(res))
		}
		if got := e.disk(t); !sameSet(got, next) {
			t.Errorf("the tree after the restart's apply:\n%s", describeSetDiff(got, next))
		}
	})
	t.Run("a mount made between an ACK's record and its install: a restart pays the ACK onto it", func(t *testing.T) {
		base := bindMountTree(t, "general")
		d := &hookDisk{}
		e := newTestEnvWithDisk(t, d, func(c *AgentConfig) { c.BaseDir = base })
		set := mountedSet()
		e.land(t, "plan-1", set)
		// maps/ becomes a volume of its own just as the runtime apply
		// renames its map: the rename crosses into it.
		d.setHook(func(op diskOp) error {
			if op.Op == "exchange" && strings.HasSuffix(op.Path, "/maps/host.map") {
				return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EXDEV}
			}
			return nil
		})
		next, op := mapEntryChange(set, "late.example", "be-a")
		res := e.c.apply(e.c.manifest("plan-late", next, op), next)
		if !res.OK || res.Error == nil || !strings.HasPrefix(res.Error.Message, msgFilesOwed) {
			t.Fatalf("the apply whose install crosses the new mount: %s", jsonOf(res))
		}
		d.setHook(nil)
		volume := filepath.Join(filepath.Dir(base), "volume-maps")
		os.MkdirAll(volume, 0o755)
		os.WriteFile(filepath.Join(volume, "host.map"), []byte(set["maps/host.map"]), 0o640)
		stopAsKilled(t, base, e.stop)
		bindMount(t, volume, filepath.Join(base, "maps"))
		e.restartStopped(t)
		if st := e.c.state("?plan=0"); st.AppliedPlanID != "plan-late" || st.AppliedPlanProof != res.AppliedPlanProof {
			t.Errorf("after the start the agent holds %q %s, want the ACKed plan-late %s", st.AppliedPlanID, st.AppliedPlanProof, res.AppliedPlanProof)
		}
		if got := e.disk(t); !sameSet(got, next) {
			t.Errorf("the ACKed map is not on the volume mounted now:\n%s", describeSetDiff(got, next))
		}
		if code, body := getText(t, e.a, PathReadyz); code != http.StatusOK {
			t.Errorf("readyz after the start: %d %q", code, body)
		}
	})
	t.Run("a record on a volume mounted in another's place is paid onto it", func(t *testing.T) {
		base := bindMountTree(t, "general")
		e := newTestEnvWithDisk(t, nil, func(c *AgentConfig) { c.BaseDir = base })
		set := mountedSet()
		e.land(t, "plan-1", set)
		page := set.clone()
		page["general/503.http"] = "a page the record names\n"
		if res := e.c.apply(e.c.manifest("plan-page", page), page); !res.OK {
			t.Fatalf("the change on general/: %s", jsonOf(res))
		}
		stopAsKilled(t, base, e.stop)
		// Another volume, holding the page from before the ACK, takes
		// general/'s place while the agent is down.
		general := filepath.Join(base, "general")
		if err := syscall.Unmount(general, 0); err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(filepath.Dir(base), "volume-other")
		os.MkdirAll(other, 0o755)
		os.WriteFile(filepath.Join(other, "503.http"), []byte(set["general/503.http"]), 0o640)
		bindMount(t, other, general)
		e.restartStopped(t)
		st := e.c.state("?plan=0")
		if st.AppliedPlanID != "plan-page" {
			t.Errorf("after the start the applied plan is %q, want the ACKed plan-page", st.AppliedPlanID)
		}
		if _, err := os.Stat(filepath.Join(base, logFileName+damagedSuffix)); err == nil {
			t.Error("the log was set aside, and the ACK with it")
		}
		if got := e.disk(t); !sameSet(got, page) {
			t.Errorf("the ACKed page is not on the volume mounted now:\n%s", describeSetDiff(got, page))
		}
		if res := e.c.apply(e.c.manifest("plan-after", page), page); !res.OK {
			t.Errorf("the next push: %s", jsonOf(res))
		}
	})
}

// opRecorder records the file operations of an agent's disk, for a test to
// ask where they happened.
type opRecorder struct {
	mu  sync.Mutex
	ops []diskOp
}

func (r *opRecorder) disk() disk {
	d := &hookDisk{}
	d.setHook(func(op diskOp) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ops = append(r.ops, op)
		return nil
	})
	return d
}

func (r *opRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = nil
}

// saw reports whether an operation op ran on a path that starts with
// prefix.
func (r *opRecorder) saw(op, prefix string) bool { return r.sawSuffix(op, prefix, "") }

// sawSuffix reports whether an operation op ran on a path that starts with
// prefix and ends with suffix.
func (r *opRecorder) sawSuffix(op, prefix, suffix string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.ops, func(o diskOp) bool {
		return o.Op == op && strings.HasPrefix(o.Path, prefix) && strings.HasSuffix(o.Path, suffix)
	})
}

func (r *opRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, o := range r.ops {
		fmt.Fprintf(&b, "  %s %s\n", o.Op, o.Path)
	}
	return b.String()
}

// TestRealGeneralOnItsOwnMountIsWrittenAndRolledBack is the first two cases
// of TestGeneralOnItsOwnMountIsWrittenAndRolledBack against a real HAProxy
// (HAPTIC_HAPROXY), whose general/ and maps/ are bind mounts of their own
// made before the agent starts: a config HAProxy refuses puts every mount
// back as the refused apply found it, ACKed runtime and file_only changes
// on any mount included, and the worker keeps serving every ACKed entry.
func TestRealGeneralOnItsOwnMountIsWrittenAndRolledBack(t *testing.T) {
	if os.Getenv("HAPTIC_HAPROXY") == "" {
		t.Skip("HAPTIC_HAPROXY is not set; real-HAProxy tests skipped")
	}
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestRealGeneralOnItsOwnMountIsWrittenAndRolledBack")
		return
	}
	e := startRealLedgerEnv(t, 20*time.Second)
	e.stopAgent()
	// maps/ keeps its files on its new volume; general/ starts empty.
	for _, sub := range []string{"general", "maps"} {
		src := e.h.Dir + "-" + sub
		t.Cleanup(func() { os.RemoveAll(src) })
		os.MkdirAll(src, 0o755)
		entries, _ := os.ReadDir(filepath.Join(e.h.Dir, sub))
		for _, en := range entries {
			b, err := os.ReadFile(filepath.Join(e.h.Dir, sub, en.Name()))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(src, en.Name()), b, 0o644)
		}
		bindMount(t, src, filepath.Join(e.h.Dir, sub))
	}
	e.startAgent(t)
	if n := len(e.a.files.mounts); n != 3 {
		t.Fatalf("the agent found %d mounts, want 3", n)
	}
	set := e.fs.clone()
	set["general/503.http"] = "HTTP/1.0 503 Service Unavailable\r\n\r\nbusy\n"
	e.land(t, "plan-1", set)
	refuse := func(what string, set fileSet) {
		t.Helper()
		before := e.c.state("?plan=0")
		bad := set.clone()
		bad["general/503.http"] += "refused\n"
		bad["maps/host.map"] += "refused.example be-b\n"
		bad[ConfigFilePath] = strings.Replace(set[ConfigFilePath], "frontend status\n", "frontend status\n    bogus_keyword\n", 1)
		m := e.c.manifest("plan-bad-"+what, bad)
		m.Mode = ModeReload
		if res := e.c.apply(m, bad); res.OK || res.Error == nil || res.Error.Stage != StageReload {
			t.Fatalf("%s: the refused config: %s\n%s", what, jsonOf(res), e.h.Output())
		}
		if got := diskSet(t, e.h.Dir); !sameSet(got, set) {
			t.Errorf("%s: the tree after the refusal:\n%s", what, describeSetDiff(got, set))
		}
		samePairs(t, what+": after the refusal", e.c.state("?plan=0"), before)
		workerServesMapOf(t, e.h, set)
	}
	refuse("after a reload", set)

	set, _ = ackEntries(t, e.c, set, "ack", 3)
	page := set.clone()
	page["general/503.http"] = "HTTP/1.0 503 Service Unavailable\r\n\r\nback soon\n"
	if res := e.c.apply(e.c.manifest("plan-page", page), page); !res.OK || res.Mode != ResultFileOnly {
		t.Fatalf("the file_only change on general/: %s", jsonOf(res))
	}
	refuse("after runtime ACKs", page)
}
