// Tests of the agent's file store (agent_files.go): path rules, mount
// probing, staging with size and digest checks, patches, the backup journal,
// the write order and restore, and the sweep. They describe mounts through a
// mountinfo file written by the test, so they run without privileges; EXDEV
// is injected through the store's rename hook.

package haptic

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// testStore is a file store over a fresh temp directory whose mount table
// lists the given subdirectories as mount points.
type testStore struct {
	*fileStore
	dir string
}

func newTestStore(t *testing.T, mounts []string, mutate func(*fileStoreConfig)) *testStore {
	t.Helper()
	dir := t.TempDir()
	var info strings.Builder
	fmt.Fprintf(&info, "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
	for i, m := range mounts {
		p := filepath.Join(dir, m)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&info, "%d 22 8:%d / %s rw,relatime - ext4 /dev/sdb%d rw\n", 40+i, 2+i, escapeMountField(p), i)
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mi, []byte(info.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fileStoreConfig{
		Base:      dir,
		Config:    "haproxy.cfg",
		Reserved:  []string{filepath.Join(dir, ".haptic-agent.json"), filepath.Join(dir, "run/master.sock")},
		MountInfo: mi,
		Logger:    testLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := newFileStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testStore{fileStore: s, dir: s.base}
}

// escapeMountField writes a path the way the kernel does in mountinfo.
func escapeMountField(p string) string {
	return strings.NewReplacer(`\`, `\134`, " ", `\040`, "\t", `\011`, "\n", `\012`).Replace(p)
}

func (ts *testStore) write(t *testing.T, rel, content string) {
	t.Helper()
	p := filepath.Join(ts.dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (ts *testStore) read(t *testing.T, rel string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ts.dir, rel))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func (ts *testStore) stageContent(t *testing.T, rel, content string) *stagedFile {
	t.Helper()
	f, err := ts.stage(rel, strings.NewReader(content), DigestString(content), int64(len(content)))
	if err != nil {
		t.Fatalf("stage %s: %v", rel, err)
	}
	return f
}

// tempEntries lists what is left in every mount's .haptic-tmp.
func (ts *testStore) tempEntries(t *testing.T) []string {
	t.Helper()
	var left []string
	for _, m := range ts.mounts {
		entries, err := os.ReadDir(filepath.Join(m, storeTempDir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			left = append(left, filepath.Join(m, storeTempDir, e.Name()))
		}
	}
	return left
}

func TestValidatePath(t *testing.T) {
	long255 := strings.Repeat("a", 251) + ".map"
	tests := []struct {
		rel  string
		want string // "" = accepted
	}{
		{"", `invalid manifest path: "" is empty`},
		{strings.Repeat("a", 256), `invalid manifest path: "` + strings.Repeat("a", 256) + `" exceeds 255 bytes`},
		{"/etc/haproxy/haproxy.cfg", `invalid manifest path: "/etc/haproxy/haproxy.cfg" is absolute`},
		{"a//b", `invalid manifest path: "a//b" is not canonical`},
		{"./a", `invalid manifest path: "./a" is not canonical`},
		{"a/../b", `invalid manifest path: "a/../b" is not canonical`},
		{"a/", `invalid manifest path: "a/" is not canonical`},
		{"a\x00b", `invalid manifest path: "a\x00b" contains NUL`},
		{".hidden", `invalid manifest path: ".hidden" has a component starting with a dot`},
		{"a/.b", `invalid manifest path: "a/.b" has a component starting with a dot`},
		{"..", `invalid manifest path: ".." has a component starting with a dot`},
		{"../haproxy.cfg", `invalid manifest path: "../haproxy.cfg" has a component starting with a dot`},
		{"maps/host.map", ""},
		{long255, ""},
		{"haproxy.cfg", ""},
	}
	for _, tc := range tests {
		err := validatePath(tc.rel)
		if tc.want == "" {
			if err != nil {
				t.Errorf("validatePath(%q) = %v, want nil", tc.rel, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("validatePath(%q) = %v, want %q", tc.rel, err, tc.want)
		}
		if !errors.Is(err, errInvalidPath) {
			t.Errorf("validatePath(%q) does not wrap errInvalidPath", tc.rel)
		}
	}
	if len(long255) != 255 {
		t.Fatalf("test path is %d bytes", len(long255))
	}
}

func TestReservedPathsAreRefused(t *testing.T) {
	ts := newTestStore(t, nil, func(c *fileStoreConfig) {
		c.Reserved = append(c.Reserved, filepath.Join(c.Base, "sockets/worker.sock"))
	})
	// A symlinked directory leading to the reserved socket's parent.
	if err := os.MkdirAll(filepath.Join(ts.dir, "sockets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(ts.dir, "sockets"), filepath.Join(ts.dir, "alias")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"run/master.sock", "sockets/worker.sock", "alias/worker.sock"} {
		_, err := ts.abs(rel)
		want := fmt.Sprintf("invalid manifest path: %q is a reserved path", rel)
		if err == nil || err.Error() != want || !errors.Is(err, errInvalidPath) {
			t.Errorf("abs(%q) = %v, want %q", rel, err, want)
		}
		if _, err := ts.stage(rel, strings.NewReader("x"), DigestString("x"), 1); err == nil || !strings.Contains(err.Error(), "is a reserved path") {
			t.Errorf("stage(%q) = %v, want a reserved-path error", rel, err)
		}
	}
	// The state file is dot-prefixed: the path rules refuse it first.
	if _, err := ts.abs(".haptic-agent.json"); err == nil || !strings.Contains(err.Error(), "starting with a dot") {
		t.Errorf("abs(state file) = %v", err)
	}
	if abs, err := ts.abs("run/other.sock"); err != nil || abs != filepath.Join(ts.dir, "run/other.sock") {
		t.Errorf("abs(run/other.sock) = %q, %v", abs, err)
	}
}

func TestAPathThroughASymbolicLinkIsRefused(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(ts.dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ts.dir, "real", "link")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"real/link/victim", "real/link/new/file"} {
		want := fmt.Sprintf("invalid manifest path: %q passes through a symbolic link", rel)
		if _, err := ts.abs(rel); err == nil || err.Error() != want || !errors.Is(err, errInvalidPath) {
			t.Errorf("abs(%q) = %v, want %q", rel, err, want)
		}
		if _, err := ts.stage(rel, strings.NewReader("x"), DigestString("x"), 1); !errors.Is(err, errInvalidPath) {
			t.Errorf("stage(%q) = %v, want an invalid-path error", rel, err)
		}
		if _, err := ts.digest(rel); !errors.Is(err, errInvalidPath) {
			t.Errorf("digest(%q) = %v, want an invalid-path error", rel, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "victim")); err != nil || string(b) != "keep" {
		t.Errorf("the file outside the base changed: %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("something was created outside the base: %v", entries)
	}
	// A real directory, and one that does not exist yet, are fine.
	for _, rel := range []string{"real/file", "new/dir/file"} {
		if _, err := ts.abs(rel); err != nil {
			t.Errorf("abs(%q) = %v", rel, err)
		}
	}
}

func TestParseMountInfo(t *testing.T) {
	const info = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /etc/haproxy rw - tmpfs tmpfs rw
24 23 0:6 / /etc/haproxy/certs rw - tmpfs tmpfs rw
25 23 0:7 / /etc/haproxy/with\040space rw - tmpfs tmpfs rw
26 23 0:8 / /etc/haproxy/tab\011and\012nl\134bs rw - tmpfs tmpfs rw
27 22 0:9 / /etc/haproxy2 rw - tmpfs tmpfs rw
28 24 0:10 / /etc/haproxy/certs/deep rw - tmpfs tmpfs rw
short line
`
	got, err := parseMountInfo(strings.NewReader(info), "/etc/haproxy")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/etc/haproxy/certs",
		"/etc/haproxy/with space",
		"/etc/haproxy/tab\tand\nnl\\bs",
		"/etc/haproxy/certs/deep",
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseMountInfo = %q, want %q", got, want)
	}
	if got := unescapeMountField(`a\040b\x\12`); got != `a b\x\12` {
		t.Errorf("unescapeMountField kept malformed escapes as %q", got)
	}
}

func TestMountForPicksTheDeepestMount(t *testing.T) {
	ts := newTestStore(t, []string{"certs", "certs/deep", "maps"}, nil)
	tests := []struct{ rel, mount string }{
		{"haproxy.cfg", ""},
		{"certs/a.pem", "certs"},
		{"certs/deep/b.pem", "certs/deep"},
		{"certs/deeper/c.pem", "certs"},
		{"maps/host.map", "maps"},
		{"mapsx/host.map", ""},
	}
	for _, tc := range tests {
		want := filepath.Join(ts.dir, tc.mount)
		if got := ts.mountFor(filepath.Join(ts.dir, tc.rel)); got != want {
			t.Errorf("mountFor(%s) = %s, want %s", tc.rel, got, want)
		}
	}
	if got := ts.mountFor("/elsewhere/x"); got != ts.dir {
		t.Errorf("mountFor(unknown) = %s, want the base", got)
	}
	if ts.mounts[0] != filepath.Join(ts.dir, "certs/deep") || ts.mounts[len(ts.mounts)-1] != ts.dir {
		t.Errorf("mounts not sorted deepest first: %q", ts.mounts)
	}
}

func TestEachMountGetsItsOwnTempAndBackupDirs(t *testing.T) {
	ts := newTestStore(t, []string{"certs", "maps"}, nil)
	if len(ts.mounts) != 3 {
		t.Fatalf("mounts = %q", ts.mounts)
	}
	for _, m := range ts.mounts {
		for _, d := range []string{storeTempDir, storeBackupDir} {
			fi, err := os.Stat(filepath.Join(m, d))
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s/%s: %v %v", m, d, fi, err)
			}
		}
	}
	for _, tc := range []struct{ rel, mount string }{
		{"certs/a.pem", "certs"}, {"maps/host.map", "maps"}, {"haproxy.cfg", ""},
	} {
		f := ts.stageContent(t, tc.rel, "content of "+tc.rel)
		if want := filepath.Join(ts.dir, tc.mount, storeTempDir); filepath.Dir(f.tmp) != want {
			t.Errorf("%s staged in %s, want %s", tc.rel, filepath.Dir(f.tmp), want)
		}
		fi, err := os.Stat(f.tmp)
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("staged %s: %v %v", tc.rel, fi, err)
		}
		f.discard(ts.disk)
	}
	// A mount point that is a single bind-mounted file is skipped.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "single"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(mi, []byte("30 1 0:1 / "+filepath.Join(dir, "single")+" rw - tmpfs tmpfs rw\n"), 0o644)
	s, err := newFileStore(fileStoreConfig{Base: dir, MountInfo: mi, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.mounts) != 1 {
		t.Errorf("a file mount point was kept: %q", s.mounts)
	}
}

func TestGeneralOnItsOwnMountIsWrittenAndRolledBack(t *testing.T) {
	ts := newTestStore(t, []string{"extra"}, nil)
	ts.write(t, "haproxy.cfg", "config v1\n")
	ts.write(t, "extra/blob.bin", "blob v1\n")

	var j backupJournal
	txn := ts.begin([]*stagedFile{
		ts.stageContent(t, "extra/blob.bin", "blob v2\n"),
		ts.stageContent(t, "haproxy.cfg", "config v2\n"),
		ts.stageContent(t, "extra/new.bin", "new\n"),
	}, nil)
	if err := txn.backup(&j); err != nil {
		t.Fatal(err)
	}
	for _, e := range j.Entries {
		if e.Path == "extra/blob.bin" && filepath.Dir(e.Backup) != filepath.Join(ts.dir, "extra", storeBackupDir) {
			t.Errorf("backup of a file on its own mount is in %s", e.Backup)
		}
	}
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	if got, _ := ts.read(t, "extra/blob.bin"); got != "blob v2\n" {
		t.Fatalf("written: %q", got)
	}
	if err := ts.restore(j); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{"haproxy.cfg": "config v1\n", "extra/blob.bin": "blob v1\n"} {
		if got, _ := ts.read(t, rel); got != want {
			t.Errorf("%s after restore = %q, want %q", rel, got, want)
		}
	}
	if _, ok := ts.read(t, "extra/new.bin"); ok {
		t.Error("the created file survived the rollback")
	}
	if ts.crossDevice.Load() != 0 {
		t.Error("a probed mount needed the copy fallback")
	}
}

func TestCrossDeviceRenameFallsBackToACopyAndIsCounted(t *testing.T) {
	var calls int
	ts := newTestStore(t, nil, func(c *fileStoreConfig) {
		c.Rename = func(oldpath, newpath string) error {
			calls++
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.EXDEV}
		}
	})
	f := ts.stageContent(t, "maps/host.map", "a b\n")
	txn := ts.begin([]*stagedFile{f}, nil)
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	if got, _ := ts.read(t, "maps/host.map"); got != "a b\n" {
		t.Errorf("copied content = %q", got)
	}
	fi, _ := os.Stat(filepath.Join(ts.dir, "maps/host.map"))
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("copied mode = %v", fi.Mode())
	}
	if calls != 1 || ts.crossDevice.Load() != 1 {
		t.Errorf("rename calls %d, cross-device count %d", calls, ts.crossDevice.Load())
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
	entries, _ := os.ReadDir(filepath.Join(ts.dir, "maps"))
	if len(entries) != 1 {
		t.Errorf("copy siblings left: %v", entries)
	}
	// The agent turns the count into its invariant after every finish.
	if got := failedInvariants(invariantInputs{crossDevice: ts.crossDevice.Load()}); !slices.Equal(got, []string{"mount_probe_found_every_mount"}) {
		t.Errorf("failed invariants = %q", got)
	}
}

func TestTreeDigestFormat(t *testing.T) {
	if got := treeDigest(nil); got != "ef46db3751d8e999" {
		t.Errorf("empty tree = %s", got)
	}
	tree := map[string]FileAt{
		"maps/host.map": {Digest: DigestString("m"), Size: 1, Proof: "p1"},
		"haproxy.cfg":   {Digest: DigestString("c"), Size: 1},
		"a b":           {Digest: DigestString("x"), Size: 1},
	}
	want := DigestString("a b " + DigestString("x") + "\nhaproxy.cfg " + DigestString("c") + "\nmaps/host.map " + DigestString("m") + "\n")
	if got := treeDigest(tree); got != want {
		t.Errorf("treeDigest = %s, want %s", got, want)
	}
}

func TestHashTreeSkipsAbsentAndNonRegular(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	ts.write(t, "haproxy.cfg", "global\n")
	ts.write(t, "maps/host.map", strings.Repeat("k v\n", 5000))
	os.MkdirAll(filepath.Join(ts.dir, "adir"), 0o755)
	os.Symlink(filepath.Join(ts.dir, "haproxy.cfg"), filepath.Join(ts.dir, "link.cfg"))
	tree, err := ts.hashTree([]string{"haproxy.cfg", "maps/host.map", "absent", "adir", "link.cfg", "../x", "haproxy.cfg/below"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]FileAt{
		"haproxy.cfg":   {Digest: DigestString("global\n"), Size: 7},
		"maps/host.map": {Digest: DigestString(strings.Repeat("k v\n", 5000)), Size: 20000},
	}
	if len(tree) != len(want) {
		t.Errorf("tree = %v", tree)
	}
	for p, at := range want {
		if tree[p] != at {
			t.Errorf("%s = %+v, want %+v", p, tree[p], at)
		}
	}
	paths := make([]string, MaxFiles+1)
	for i := range paths {
		paths[i] = fmt.Sprintf("f%d", i)
	}
	if _, err := ts.hashTree(paths); err == nil || err.Error() != "4097 paths exceed the 4096-file limit" {
		t.Errorf("4097 paths: %v", err)
	}
	if _, err := ts.hashTree(paths[:MaxFiles]); err != nil {
		t.Errorf("4096 paths: %v", err)
	}
}

func TestStageVerifiesSizeAndDigest(t *testing.T) {
	ts := newTestStore(t, []string{"maps"}, nil)
	const content = "example.com be-a\n"
	digest, size := DigestString(content), int64(len(content))
	tests := []struct {
		name, part, want string
	}{
		{"short", content[:5], fmt.Sprintf(`part does not match its manifest digest: "maps/host.map" is 5 bytes, manifest says %d`, size)},
		// Staging copies at most size+1 bytes, so that an oversized part
		// costs no more than one byte over its size: that is the count a
		// longer part reports, however long it is.
		{"long", content + "extra", fmt.Sprintf(`part does not match its manifest digest: "maps/host.map" is %d bytes, manifest says %d`, size+1, size)},
		{"wrong bytes", strings.ToUpper(content), fmt.Sprintf(`part does not match its manifest digest: "maps/host.map" hashes to %s, manifest says %s`, DigestString(strings.ToUpper(content)), digest)},
	}
	for _, tc := range tests {
		_, err := ts.stage("maps/host.map", strings.NewReader(tc.part), digest, size)
		if err == nil || err.Error() != tc.want || !errors.Is(err, errDigestMismatch) || !strings.Contains(err.Error(), "manifest digest") {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
	f := ts.stageContent(t, "maps/host.map", content)
	if b, _ := os.ReadFile(f.tmp); string(b) != content {
		t.Errorf("staged %q", b)
	}
	f.discard(ts.disk)
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("discard left %q", left)
	}
}

func TestStagePatchSplicesTheHeldFile(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	base := "global\n  maxconn 100\ndefaults\n"
	ts.write(t, "haproxy.cfg", base)
	want := "global\n  maxconn 2000\ndefaults\n"
	p := &FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)), Offset: 17, Length: 3}
	repl := "2000"
	f, err := ts.stagePatch("haproxy.cfg", strings.NewReader(repl), p, DigestString(want), int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.tmp); string(b) != want {
		t.Errorf("spliced %q", b)
	}
	f.discard(ts.disk)

	wrongBase := *p
	wrongBase.BaseDigest = DigestString("other")
	if _, err := ts.stagePatch("haproxy.cfg", strings.NewReader(repl), &wrongBase, DigestString(want), int64(len(want))); !errors.Is(err, errPatchBaseMissing) {
		t.Errorf("wrong base digest: %v", err)
	}
	if _, err := ts.stagePatch("absent.cfg", strings.NewReader(repl), p, DigestString(want), int64(len(want))); !errors.Is(err, errPatchBaseMissing) {
		t.Errorf("absent base: %v", err)
	}
	misfit := *p
	misfit.Offset = int64(len(base))
	_, err = ts.stagePatch("haproxy.cfg", strings.NewReader(repl), &misfit, DigestString(want), int64(len(want)))
	if wantErr := fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length 3, base %d bytes`, len(base), len(base)); err == nil || err.Error() != wantErr {
		t.Errorf("misfit: %v", err)
	}
	if _, err := ts.stagePatch("haproxy.cfg", strings.NewReader("2001"), p, DigestString(want), int64(len(want))); err == nil || !strings.Contains(err.Error(), "manifest digest") {
		t.Errorf("wrong bytes: %v", err)
	}
	if _, err := ts.stagePatch("haproxy.cfg", strings.NewReader("20000"), p, DigestString(want), int64(len(want))); err == nil || !strings.Contains(err.Error(), "manifest digest") {
		t.Errorf("long replacement: %v", err)
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}

// A part longer than the manifest says is read to size+1 bytes and no
// further, whole or patched (a patch copies at most its replacement's
// length plus one byte before verifying the spliced result like a whole
// file), so both report the same count: the reader is left holding the rest.
func TestALongPartReportsOneByteOverItsSizeWholeOrPatched(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	base := "global\n  maxconn 100\ndefaults\n"
	ts.write(t, "haproxy.cfg", base)
	want := "global\n  maxconn 2000\ndefaults\n"
	size := int64(len(want))
	msg := fmt.Sprintf(`part does not match its manifest digest: "haproxy.cfg" is %d bytes, manifest says %d`, size+1, size)
	const extra = 1 << 16
	p := &FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)), Offset: 17, Length: 3}

	whole := strings.NewReader(want + strings.Repeat("x", extra))
	_, err := ts.stage("haproxy.cfg", whole, DigestString(want), size)
	if err == nil || err.Error() != msg || !errors.Is(err, errDigestMismatch) {
		t.Errorf("Stage: %v, want %q", err, msg)
	}
	if left := whole.Len(); left != len(want)+extra-int(size+1) {
		t.Errorf("Stage read %d bytes of the part, want %d", len(want)+extra-left, size+1)
	}

	repl := strings.NewReader("2000" + strings.Repeat("x", extra))
	_, err = ts.stagePatch("haproxy.cfg", repl, p, DigestString(want), size)
	if err == nil || err.Error() != msg || !errors.Is(err, errDigestMismatch) {
		t.Errorf("StagePatch: %v, want %q", err, msg)
	}
	if left := repl.Len(); left != extra-1 {
		t.Errorf("StagePatch read %d replacement bytes, want 5", 4+extra-left)
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}

// The fit rule of a patch, row by row: a negative offset or length, a
// replaced range that runs past the base, or a result size that would leave
// the replacement a negative length does not fit, including values whose
// sums overflow int64. Each is the 400 "does not fit its base" text, never
// a seek error (which would also expose the absolute path), and leaves no
// temp file.
func TestStagePatchRefusesAPatchThatDoesNotFitItsBase(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	base := "global\n  maxconn 100\ndefaults\n"
	ts.write(t, "haproxy.cfg", base)
	b := int64(len(base))
	const maxInt = math.MaxInt64
	for _, tc := range []struct {
		name           string
		offset, length int64
		size           int64
	}{
		{"negative offset", -1, 0, b},
		{"negative length", 0, -1, b},
		{"offset past the base", b + 1, 0, b},
		{"offset and length past the base", b - 1, 2, b},
		{"length overflowing with offset 1", 1, maxInt, b},
		{"offset overflowing with length 1", maxInt, 1, b},
		{"both at the maximum", maxInt, maxInt, b},
		{"offset at the maximum", maxInt, 0, b},
		{"size below what the base keeps", 0, 1, b - 2},
		{"negative size", 0, 0, -1},
		{"minimum size", 0, 1, math.MinInt64},
	} {
		p := &FilePatch{BaseDigest: DigestString(base), BaseSize: b, Offset: tc.offset, Length: tc.length}
		_, err := ts.stagePatch("haproxy.cfg", strings.NewReader("x"), p, DigestString(base), tc.size)
		want := fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length %d, base %d bytes`, tc.offset, tc.length, b)
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", tc.name, err, want)
		}
	}
	// The edges that fit: the whole base replaced, and an insertion at its end.
	for _, p := range []*FilePatch{{Offset: 0, Length: b}, {Offset: b, Length: 0}} {
		p.BaseDigest, p.BaseSize = DigestString(base), b
		want := base[:p.Offset] + "x" + base[p.Offset+p.Length:]
		f, err := ts.stagePatch("haproxy.cfg", strings.NewReader("x"), p, DigestString(want), int64(len(want)))
		if err != nil {
			t.Errorf("offset %d length %d: %v", p.Offset, p.Length, err)
			continue
		}
		f.discard(ts.disk)
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}

func TestBackupJournalKeepsTheFirstEntry(t *testing.T) {
	ts := newTestStore(t, nil, nil)
	ts.write(t, "haproxy.cfg", "v1\n")
	ts.write(t, "old.map", "old\n")
	var j backupJournal
	txn := ts.begin([]*stagedFile{ts.stageContent(t, "haproxy.cfg", "v2\n"), ts.stageContent(t, "new.map", "n\n")}, []string{"old.map", "gone.map"})
	if err := txn.backup(&j); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, e := range j.Entries {
		kinds[e.Path] = e.Kind
		if (e.Kind == journalCreated) != (e.Backup == "") {
			t.Errorf("entry %+v", e)
		}
	}
	want := map[string]string{"haproxy.cfg": journalModified, "new.map": journalCreated, "old.map": journalDeleted}
	if !mapsEqual(kinds, want) {
		t.Errorf("journal kinds = %v, want %v", kinds, want)
	}
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	first := slices.Clone(j.Entries)
	// A second apply over the same paths keeps the LKG entries.
	txn2 := ts.begin([]*stagedFile{ts.stageContent(t, "haproxy.cfg", "v3\n"), ts.stageContent(t, "new.map", "n2\n")}, nil)
	if err := txn2.backup(&j); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(j.Entries, first) {
		t.Errorf("second backup changed the journal: %+v", j.Entries)
	}
	for _, e := range j.Entries {
		if e.Path == "haproxy.cfg" {
			if b, _ := os.ReadFile(e.Backup); string(b) != "v1\n" {
				t.Errorf("backup holds %q", b)
			}
		}
	}
	// More than MaxFiles changes is refused before anything is linked.
	many := make([]string, MaxFiles+1)
	for i := range many {
		many[i] = fmt.Sprintf("d%d", i)
	}
	var j2 backupJournal
	if err := ts.begin(nil, many).backup(&j2); err == nil || err.Error() != "4097 changes exceed the 4096-file limit" || len(j2.Entries) != 0 {
		t.Errorf("4097 changes: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestWriteRenamesTheConfigLast(t *testing.T) {
	var order []string
	var ts *testStore
	ts = newTestStore(t, nil, func(c *fileStoreConfig) {
		c.Rename = func(oldpath, newpath string) error {
			rel, _ := filepath.Rel(ts.dir, newpath)
			order = append(order, rel)
			// Unlinks come after every rename.
			if _, ok := ts.read(t, "doomed.map"); !ok {
				t.Errorf("doomed.map was unlinked before %s was renamed", rel)
			}
			return os.Rename(oldpath, newpath)
		}
	})
	ts.write(t, "doomed.map", "x\n")
	staged := []*stagedFile{
		ts.stageContent(t, "zz.map", "z\n"),
		ts.stageContent(t, "haproxy.cfg", "global\n"),
		ts.stageContent(t, "certs/a.pem", "a\n"),
		ts.stageContent(t, "maps/b.map", "b\n"),
	}
	txn := ts.begin(staged, []string{"doomed.map", "absent.map"})
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	want := []string{"certs/a.pem", "maps/b.map", "zz.map", "haproxy.cfg"}
	if !slices.Equal(order, want) {
		t.Errorf("rename order = %q, want %q", order, want)
	}
	if _, ok := ts.read(t, "doomed.map"); ok {
		t.Error("deletion not applied")
	}
	// A directory where a file should go refuses the install.
	os.MkdirAll(filepath.Join(ts.dir, "dir.map"), 0o755)
	txn = ts.begin([]*stagedFile{ts.stageContent(t, "dir.map", "d\n")}, nil)
	if err := txn.write(); err == nil || err.Error() != `invalid manifest path: "dir.map" is not a regular file` {
		t.Errorf("install over a directory: %v", err)
	}
	txn.discardStaged()
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}

func TestRestoreRestoresTheConfigLastAndRemovesCreatedFiles(t *testing.T) {
	var order []string
	var ts *testStore
	ts = newTestStore(t, nil, func(c *fileStoreConfig) {
		c.Rename = func(oldpath, newpath string) error {
			if strings.HasPrefix(filepath.Base(oldpath), storeRestorePrefx) {
				rel, _ := filepath.Rel(ts.dir, newpath)
				order = append(order, rel)
			}
			return os.Rename(oldpath, newpath)
		}
	})
	lkg := map[string]string{"haproxy.cfg": "lkg config\n", "maps/a.map": "a 1\n", "maps/b.map": "b 1\n"}
	for p, c := range lkg {
		ts.write(t, p, c)
	}
	var j backupJournal
	txn := ts.begin([]*stagedFile{
		ts.stageContent(t, "haproxy.cfg", "new config\n"),
		ts.stageContent(t, "maps/a.map", "a 2\n"),
		ts.stageContent(t, "maps/c.map", "c 1\n"),
	}, []string{"maps/b.map"})
	if err := txn.backup(&j); err != nil {
		t.Fatal(err)
	}
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	// A second file_only apply before any reload.
	txn = ts.begin([]*stagedFile{ts.stageContent(t, "maps/a.map", "a 3\n"), ts.stageContent(t, "maps/d.map", "d\n")}, []string{"maps/c.map"})
	if err := txn.backup(&j); err != nil {
		t.Fatal(err)
	}
	if err := txn.write(); err != nil {
		t.Fatal(err)
	}
	if j.Entries[0].Path != "haproxy.cfg" {
		t.Fatalf("the config is not journalled first: %+v", j.Entries)
	}
	if err := ts.restore(j); err != nil {
		t.Fatal(err)
	}
	// Journalled first, restored last; created files are removed, not renamed.
	if want := []string{"maps/a.map", "maps/b.map", "haproxy.cfg"}; !slices.Equal(order, want) {
		t.Errorf("restore order = %q, want %q", order, want)
	}
	got, err := ts.hashTree([]string{"haproxy.cfg", "maps/a.map", "maps/b.map", "maps/c.map", "maps/d.map"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(lkg) {
		t.Errorf("restored tree %v", got)
	}
	for p, c := range lkg {
		if got[p].Digest != DigestString(c) {
			t.Errorf("%s not restored", p)
		}
	}
	ts.dropBackups(j)
	entries, _ := os.ReadDir(filepath.Join(ts.dir, storeBackupDir))
	if len(entries) != 0 {
		t.Errorf("backups left: %v", entries)
	}
	entries, _ = os.ReadDir(filepath.Join(ts.dir, "maps"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("restore staging left: %s", e.Name())
		}
	}
}

func TestSweepTempEmptiesEveryMountsTempDir(t *testing.T) {
	ts := newTestStore(t, []string{"certs"}, nil)
	for _, m := range ts.mounts {
		for i := range 3 {
			os.WriteFile(filepath.Join(m, storeTempDir, fmt.Sprintf("part-%d", i)), []byte("x"), 0o644)
			os.WriteFile(filepath.Join(m, storeBackupDir, fmt.Sprintf("%d-stale.bak", i)), []byte("x"), 0o644)
		}
	}
	ts.write(t, "certs/a.pem", "a\n")
	var j backupJournal
	txn := ts.begin([]*stagedFile{ts.stageContent(t, "certs/a.pem", "b\n")}, nil)
	if err := txn.backup(&j); err != nil {
		t.Fatal(err)
	}
	txn.discardStaged()
	if err := ts.sweepTemp(j); err != nil {
		t.Fatal(err)
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp entries left: %q", left)
	}
	var kept []string
	for _, m := range ts.mounts {
		entries, _ := os.ReadDir(filepath.Join(m, storeBackupDir))
		for _, e := range entries {
			kept = append(kept, filepath.Join(m, storeBackupDir, e.Name()))
		}
	}
	if len(kept) != 1 || kept[0] != j.Entries[0].Backup {
		t.Errorf("backups kept %q, want only %q", kept, j.Entries[0].Backup)
	}
}
