// Tests of the agent's file store (agent_files.go): path rules, staging
// with size and digest checks, patches, the undo links, the install order,
// putting bytes back from their sources, and the sweep. The mounts are
// agent_mounts_test.go's.

package haptic

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// testStore is a file store over a fresh temp directory, on a disk whose
// renames the test can watch.
type testStore struct {
	*fileStore
	dir  string
	hook *hookDisk
}

func newTestStore(t *testing.T, mutate func(*fileStoreConfig)) *testStore {
	t.Helper()
	dir := t.TempDir()
	d := &hookDisk{}
	cfg := fileStoreConfig{
		Base:     dir,
		Config:   "haproxy.cfg",
		Reserved: []string{filepath.Join(dir, ".haptic-agent.json"), filepath.Join(dir, "run/master.sock")},
		Logger:   testLogger(),
		Disk:     d,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := newFileStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testStore{fileStore: s, dir: s.base, hook: d}
}

// heldOf is the agent's record of a file holding content.
func heldOf(content string) FileAt {
	return FileAt{Digest: DigestString(content), Size: int64(len(content))}
}

// budget is a fresh inline budget for one staged part.
func budget() *int {
	b := maxInlinePerApply
	return &b
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
	f, err := ts.stage(rel, strings.NewReader(content), nil, DigestString(content), int64(len(content)), FileAt{}, budget())
	if err != nil {
		t.Fatalf("stage %s: %v", rel, err)
	}
	return f
}

// tempEntries lists what is left in .haptic-tmp.
func (ts *testStore) tempEntries(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(ts.dir, storeTempDir))
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
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
	ts := newTestStore(t, func(c *fileStoreConfig) {
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
		if _, err := ts.stage(rel, strings.NewReader("x"), nil, DigestString("x"), 1, FileAt{}, budget()); err == nil || !strings.Contains(err.Error(), "is a reserved path") {
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
	ts := newTestStore(t, nil)
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
		if _, err := ts.stage(rel, strings.NewReader("x"), nil, DigestString("x"), 1, FileAt{}, budget()); !errors.Is(err, errInvalidPath) {
			t.Errorf("stage(%q) = %v, want an invalid-path error", rel, err)
		}
		if tree, err := ts.hashTree([]string{rel}); err != nil || len(tree) != 0 {
			t.Errorf("hashTree(%q) = %v, %v, want nothing", rel, tree, err)
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

func TestHashTreeSkipsAbsentAndNonRegular(t *testing.T) {
	ts := newTestStore(t, nil)
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
}

func TestStageVerifiesSizeAndDigest(t *testing.T) {
	ts := newTestStore(t, nil)
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
		_, err := ts.stage("maps/host.map", strings.NewReader(tc.part), nil, digest, size, FileAt{}, budget())
		if err == nil || err.Error() != tc.want || !errors.Is(err, errDigestMismatch) || !strings.Contains(err.Error(), "manifest digest") {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
	f := ts.stageContent(t, "maps/host.map", content)
	if b := ts.stagedBytes(t, f); b != content {
		t.Errorf("staged %q", b)
	}
	f.discard(ts.disk)
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("discard left %q", left)
	}
}

func TestStagePatchSplicesTheHeldFile(t *testing.T) {
	ts := newTestStore(t, nil)
	base := "global\n  maxconn 100\ndefaults\n"
	ts.write(t, "haproxy.cfg", base)
	want := "global\n  maxconn 2000\ndefaults\n"
	p := &FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)), Offset: 17, Length: 3}
	repl := "2000"
	f, err := ts.stage("haproxy.cfg", strings.NewReader(repl), p, DigestString(want), int64(len(want)), heldOf(base), budget())
	if err != nil {
		t.Fatal(err)
	}
	if b := ts.stagedBytes(t, f); b != want {
		t.Errorf("spliced %q", b)
	}
	f.discard(ts.disk)

	wrongBase := *p
	wrongBase.BaseDigest = DigestString("other")
	if _, err := ts.stage("haproxy.cfg", strings.NewReader(repl), &wrongBase, DigestString(want), int64(len(want)), heldOf(base), budget()); !errors.Is(err, errPatchBaseMissing) {
		t.Errorf("wrong base digest: %v", err)
	}
	if _, err := ts.stage("absent.cfg", strings.NewReader(repl), p, DigestString(want), int64(len(want)), heldOf(base), budget()); !errors.Is(err, errPatchBaseMissing) {
		t.Errorf("absent base: %v", err)
	}
	misfit := *p
	misfit.Offset = int64(len(base))
	_, err = ts.stage("haproxy.cfg", strings.NewReader(repl), &misfit, DigestString(want), int64(len(want)), heldOf(base), budget())
	if wantErr := fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length 3, base %d bytes`, len(base), len(base)); err == nil || err.Error() != wantErr {
		t.Errorf("misfit: %v", err)
	}
	if _, err := ts.stage("haproxy.cfg", strings.NewReader("2001"), p, DigestString(want), int64(len(want)), heldOf(base), budget()); err == nil || !strings.Contains(err.Error(), "manifest digest") {
		t.Errorf("wrong bytes: %v", err)
	}
	if _, err := ts.stage("haproxy.cfg", strings.NewReader("20000"), p, DigestString(want), int64(len(want)), heldOf(base), budget()); err == nil || !strings.Contains(err.Error(), "manifest digest") {
		t.Errorf("long replacement: %v", err)
	}
	// The file changed behind the agent's back, to bytes of the same size:
	// the result cannot match, and the patch asks for the whole file.
	ts.write(t, "haproxy.cfg", strings.ToUpper(base))
	if _, err := ts.stage("haproxy.cfg", strings.NewReader(repl), p, DigestString(want), int64(len(want)), heldOf(base), budget()); !errors.Is(err, errPatchBaseMissing) {
		t.Errorf("a base changed behind the agent's back: %v", err)
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
	ts := newTestStore(t, nil)
	base := "global\n  maxconn 100\ndefaults\n"
	ts.write(t, "haproxy.cfg", base)
	want := "global\n  maxconn 2000\ndefaults\n"
	size := int64(len(want))
	msg := fmt.Sprintf(`part does not match its manifest digest: "haproxy.cfg" is %d bytes, manifest says %d`, size+1, size)
	const extra = 1 << 16
	p := &FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)), Offset: 17, Length: 3}

	whole := strings.NewReader(want + strings.Repeat("x", extra))
	_, err := ts.stage("haproxy.cfg", whole, nil, DigestString(want), size, FileAt{}, budget())
	if err == nil || err.Error() != msg || !errors.Is(err, errDigestMismatch) {
		t.Errorf("Stage: %v, want %q", err, msg)
	}
	if left := whole.Len(); left != len(want)+extra-int(size+1) {
		t.Errorf("Stage read %d bytes of the part, want %d", len(want)+extra-left, size+1)
	}

	repl := strings.NewReader("2000" + strings.Repeat("x", extra))
	_, err = ts.stage("haproxy.cfg", repl, p, DigestString(want), size, heldOf(base), budget())
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
	ts := newTestStore(t, nil)
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
		_, err := ts.stage("haproxy.cfg", strings.NewReader("x"), p, DigestString(base), tc.size, heldOf(base), budget())
		want := fmt.Sprintf(`patch for "haproxy.cfg" does not fit its base: offset %d, length %d, base %d bytes`, tc.offset, tc.length, b)
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", tc.name, err, want)
		}
	}
	// The edges that fit: the whole base replaced, and an insertion at its end.
	for _, p := range []*FilePatch{{Offset: 0, Length: b}, {Offset: b, Length: 0}} {
		p.BaseDigest, p.BaseSize = DigestString(base), b
		want := base[:p.Offset] + "x" + base[p.Offset+p.Length:]
		f, err := ts.stage("haproxy.cfg", strings.NewReader("x"), p, DigestString(want), int64(len(want)), heldOf(base), budget())
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

// TestLinkUndoKeepsHowEveryPathLooked: each existing path an apply changes
// is linked aside with the bytes it held; a created path has no undo; the
// digest of a path the agent does not own is read from the disk.
func TestLinkUndoKeepsHowEveryPathLooked(t *testing.T) {
	ts := newTestStore(t, nil)
	ts.write(t, "haproxy.cfg", "v1\n")
	ts.write(t, "old.map", "old\n")
	ts.write(t, "foreign.txt", "not ours\n")
	changes := []fileChange{{Path: "haproxy.cfg"}, {Path: "new.map"}, {Path: "old.map"}, {Path: "foreign.txt"}}
	before := map[string]FileAt{"haproxy.cfg": {Digest: DigestString("v1\n"), Size: 3, Proof: "c:1"}, "old.map": {Digest: DigestString("old\n"), Size: 4}}
	if err := ts.linkUndo(changes, before, linkAll); err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		if c.Path == "new.map" {
			if c.Old != nil || c.Undo != "" {
				t.Errorf("a created path has an undo: %+v", c)
			}
			continue
		}
		b, err := os.ReadFile(c.Undo)
		if err != nil || c.Old == nil || DigestString(string(b)) != c.Old.Digest || int64(len(b)) != c.Old.Size || c.Old.Proof != "" {
			t.Errorf("%s: undo %q holds %q, old %+v (%v)", c.Path, c.Undo, b, c.Old, err)
		}
	}
	// Something in the way of a file (a directory, a file where a
	// directory must be) is refused before anything is written.
	os.MkdirAll(filepath.Join(ts.dir, "adir"), 0o755)
	for _, p := range []string{"adir", "haproxy.cfg/below"} {
		c := []fileChange{{Path: p}}
		if err := ts.linkUndo(c, nil, linkAll); !errors.Is(err, errInvalidPath) || c[0].Old != nil || c[0].Undo != "" {
			t.Errorf("%s: %+v %v", p, c[0], err)
		}
	}
}

// TestTheJournalKeepsTheFirstVersionOfAPath: the journal gains an entry
// only for a path it lacks, so it keeps the last-known-good version across
// the applies until the next reload; a pending reload's undo likewise keeps
// what its first apply found.
func TestTheJournalKeepsTheFirstVersionOfAPath(t *testing.T) {
	journal := []journalEntry{{Path: "a", Backup: "/l/1"}}
	undo := []journalEntry{{Path: "a", Backup: "/l/5"}, {Path: "b", Backup: "/l/6"}}
	if got := journalAdditions(journal, undo); len(got) != 1 || got[0].Path != "b" {
		t.Errorf("journalAdditions = %+v", got)
	}
	if got := append(journal, journalAdditions(journal, undo)...); len(got) != 2 || got[0].Backup != "/l/1" || got[1].Backup != "/l/6" {
		t.Errorf("journal + journalAdditions = %+v", got)
	}
}

func TestInstallRenamesTheConfigLast(t *testing.T) {
	ts := newTestStore(t, nil)
	var mu sync.Mutex
	var order []string
	ts.hook.setHook(func(op diskOp) error {
		mu.Lock()
		defer mu.Unlock()
		if op.Op == "rename" || op.Op == "exchange" {
			rel, _ := filepath.Rel(ts.dir, op.Path)
			order = append(order, rel)
			// Unlinks come after every rename.
			if _, err := os.Lstat(filepath.Join(ts.dir, "doomed.map")); err != nil {
				t.Errorf("doomed.map was unlinked before %s was renamed", rel)
			}
		}
		return nil
	})
	ts.write(t, "doomed.map", "x\n")
	staged := []*stagedFile{
		ts.stageContent(t, "zz.map", "z\n"),
		ts.stageContent(t, "haproxy.cfg", "global\n"),
		ts.stageContent(t, "certs/a.pem", "a\n"),
		ts.stageContent(t, "maps/b.map", "b\n"),
	}
	if err := ts.install(synced{}, staged, []string{"doomed.map", "absent.map"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"zz.map", "certs/a.pem", "maps/b.map", "haproxy.cfg"}; !slices.Equal(order, want) {
		t.Errorf("rename order = %q, want %q", order, want)
	}
	if _, ok := ts.read(t, "doomed.map"); ok {
		t.Error("deletion not applied")
	}
	if fi, err := os.Stat(filepath.Join(ts.dir, "certs/a.pem")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("an installed file's mode: %v %v", fi.Mode().Perm(), err)
	}
	if fi, err := os.Stat(filepath.Join(ts.dir, "certs")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("a created directory's mode: %v %v", fi.Mode().Perm(), err)
	}
	// A directory where a file should go refuses the install.
	os.MkdirAll(filepath.Join(ts.dir, "dir.map"), 0o755)
	f := ts.stageContent(t, "dir.map", "d\n")
	if err := ts.install(synced{}, []*stagedFile{f}, nil); err == nil || err.Error() != `invalid manifest path: "dir.map" is not a regular file` {
		t.Errorf("install over a directory: %v", err)
	}
	f.discard(ts.disk)
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}

// TestAnInstallFallsBackToARenameWhereTheExchangeIsRefused: a filesystem
// or kernel without RENAME_EXCHANGE refuses it with ENOSYS (no renameat2)
// or EINVAL (a filesystem that lacks the flag, as some network and FUSE
// filesystems do). Either way the file goes into place by a plain rename,
// which is as atomic, only slower on ext4.
func TestAnInstallFallsBackToARenameWhereTheExchangeIsRefused(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSYS, syscall.EINVAL} {
		t.Run(errno.Error(), func(t *testing.T) {
			ts := newTestStore(t, nil)
			ts.write(t, "maps/a.map", "old\n")
			var mu sync.Mutex
			var ops []string
			ts.hook.setHook(func(op diskOp) error {
				mu.Lock()
				defer mu.Unlock()
				if strings.HasSuffix(op.Path, "/maps/a.map") {
					ops = append(ops, op.Op)
					if op.Op == "exchange" {
						return &os.LinkError{Op: "renameat2", Old: "tmp", New: op.Path, Err: errno}
					}
				}
				return nil
			})
			if err := ts.install(synced{}, []*stagedFile{ts.stageContent(t, "maps/a.map", "new\n")}, nil); err != nil {
				t.Fatalf("install: %v", err)
			}
			if got, _ := ts.read(t, "maps/a.map"); got != "new\n" || !slices.Equal(ops, []string{"exchange", "rename"}) {
				t.Errorf("maps/a.map holds %q after %q, want the new bytes by a rename after the refused exchange", got, ops)
			}
		})
	}
}

// TestRestorePutsBytesBackFromTheirSourcesConfigLast: every path ends up
// holding what its want says, the config last; a path that already holds
// it is left alone, a source whose bytes do not match is passed over, and
// a path none of the sources can fill keeps its content and is an error.
func TestRestorePutsBytesBackFromTheirSourcesConfigLast(t *testing.T) {
	ts := newTestStore(t, nil)
	ts.write(t, "haproxy.cfg", "new config\n")
	ts.write(t, "maps/a.map", "a 2\n")
	ts.write(t, "maps/same.map", "same\n")
	ts.write(t, "maps/created.map", "c\n")
	ts.write(t, "aside/a", "a 1\n")
	ts.write(t, "aside/torn", "a 1 but torn\n")
	at := func(c string) *FileAt { return &FileAt{Digest: DigestString(c), Size: int64(len(c))} }
	key := func(c string) FileAt { return *at(c) }
	sources := map[FileAt][]source{
		key("a 1\n"):           {{path: filepath.Join(ts.dir, "aside/torn")}, {path: filepath.Join(ts.dir, "aside/a")}},
		key("lkg config\n"):    {{data: []byte("lkg config\n")}},
		key("gone from all\n"): nil,
	}
	var mu sync.Mutex
	var order []string
	ts.hook.setHook(func(op diskOp) error {
		mu.Lock()
		defer mu.Unlock()
		if op.Op == "rename" || op.Op == "exchange" || op.Op == "remove" && !strings.Contains(op.Path, storeTempDir) {
			rel, _ := filepath.Rel(ts.dir, op.Path)
			order = append(order, rel)
		}
		return nil
	})
	wants := []want{{"haproxy.cfg", at("lkg config\n")}, {"maps/a.map", at("a 1\n")}, {"maps/same.map", at("same\n")},
		{"maps/created.map", nil}, {"maps/b.map", at("gone from all\n")}}
	changed, err := ts.putBack(restoreSet{wants, sources})
	if !changed || err == nil || !strings.Contains(err.Error(), `restore "maps/b.map": no copy of its bytes`) {
		t.Errorf("restore = %v, %v", changed, err)
	}
	if want := []string{"maps/a.map", "maps/created.map", "haproxy.cfg"}; !slices.Equal(order, want) {
		t.Errorf("order = %q, want %q", order, want)
	}
	for p, c := range map[string]string{"haproxy.cfg": "lkg config\n", "maps/a.map": "a 1\n", "maps/same.map": "same\n"} {
		if got, _ := ts.read(t, p); got != c {
			t.Errorf("%s = %q, want %q", p, got, c)
		}
	}
	if _, ok := ts.read(t, "maps/created.map"); ok {
		t.Error("a path that did not exist before is still there")
	}
	if changed, err := ts.putBack(restoreSet{wants[:4], sources}); changed || err != nil {
		t.Errorf("a second restore changed %v: %v", changed, err)
	}
}

func TestSweepEmptiesTheTempDirAndKeepsOnlyTheNamedLinks(t *testing.T) {
	ts := newTestStore(t, nil)
	for i := range 3 {
		os.WriteFile(filepath.Join(ts.dir, storeTempDir, fmt.Sprintf("part-%d", i)), []byte("x"), 0o644)
		os.WriteFile(filepath.Join(ts.dir, storeLinkDir, fmt.Sprintf("%d-stale", i)), []byte("x"), 0o644)
	}
	keep := filepath.Join(ts.dir, storeLinkDir, "1-stale")
	if err := ts.sweep(map[string]bool{keep: true}); err != nil {
		t.Fatal(err)
	}
	if left := ts.tempEntries(t); len(left) != 0 {
		t.Errorf("temp entries left: %q", left)
	}
	entries, _ := os.ReadDir(filepath.Join(ts.dir, storeLinkDir))
	if len(entries) != 1 || entries[0].Name() != "1-stale" {
		t.Errorf("links kept %v, want only %s", entries, keep)
	}
}

// linkAll links every change aside.
func linkAll(*fileChange) bool { return true }

// stagedBytes is what a staged part puts at its path.
func (ts *testStore) stagedBytes(t *testing.T, f *stagedFile) string {
	t.Helper()
	if f.tmp != "" {
		b, err := os.ReadFile(f.tmp)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var b strings.Builder
	if err := ts.writeStaged(f, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A restarted store never reuses a link name. A link kept from the last
// run (the journal's backup of a last-known-good file) must survive the
// next run's first link of the same path: before, both were named
// "1-<digest of the path>", and the new link replaced the backup, so a
// later fall back to the last-known-good set found its bytes gone.
func TestARestartedStoreNeverReusesALinkName(t *testing.T) {
	ts := newTestStore(t, nil)
	ts.write(t, "maps/a.map", "last-known-good\n")
	abs := filepath.Join(ts.dir, "maps/a.map")
	kept, err := ts.linkAside(abs)
	if err != nil {
		t.Fatal(err)
	}
	restarted, err := newFileStore(fileStoreConfig{Base: ts.dir, Config: "haproxy.cfg", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(abs)
	ts.write(t, "maps/a.map", "next\n")
	fresh, err := restarted.linkAside(abs)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == kept {
		t.Errorf("the restarted store linked the path again as %s, the name of the link it kept", kept)
	}
	if b, _ := os.ReadFile(kept); string(b) != "last-known-good\n" {
		t.Errorf("the kept link now holds %q", b)
	}
}
