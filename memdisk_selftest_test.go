// Tests of memDisk (memdisk_test.go): the Linux behaviour of each disk
// method, and the crash model, pinned by the exact set of images each small
// scenario may leave. A wrong model (a sync that keeps too much or too
// little, a rename that is not atomic, images that share state) fails here
// before it can make a power-loss test of the agent pass or fail for the
// wrong reason.

package haptic

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func memOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// memRng is the fixed random source of these tests: a failure reproduces.
func memRng() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// describe writes a dump as one line per path, sorted, with long runs of
// one byte shortened to "<byte>*<count>", so that a block-sized file reads
// as its blocks.
func describe(m map[string]string) string {
	var lines []string
	for p, c := range m {
		lines = append(lines, p+"="+runs(c))
	}
	slices.Sort(lines)
	return strings.Join(lines, " ")
}

func runs(s string) string {
	if len(s) < 16 {
		return strconv.Quote(s)
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] == s[i] {
			j++
		}
		fmt.Fprintf(&b, "%q*%d", s[i], j-i)
		i = j
	}
	return b.String()
}

// imageSet describes every image, sorted.
func imageSet(imgs []*memDisk) []string {
	out := make([]string, len(imgs))
	for i, img := range imgs {
		out[i] = describe(img.dump())
	}
	slices.Sort(out)
	return out
}

func describeAll(ms []map[string]string) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = describe(m)
	}
	slices.Sort(out)
	return out
}

func openW(t *testing.T, md *memDisk, name string, flag int) diskFile {
	t.Helper()
	f, err := md.OpenFile(name, flag, 0o644)
	memOK(t, err)
	return f
}

func write(t *testing.T, f diskFile, s string) {
	t.Helper()
	if _, err := f.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// TestMemDiskCrashModel pins the crash model by the exact images of small
// scenarios. Every scenario starts from a durable /d (and /e).
func TestMemDiskCrashModel(t *testing.T) {
	const (
		d = "/d/"
		e = "/e/"
	)
	trunc := os.O_WRONLY | os.O_TRUNC
	tests := []struct {
		name string
		act  func(t *testing.T, md *memDisk)
		want []map[string]string
	}{
		{
			name: "unsynced overwrite can be lost",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("old")))
				f := openW(t, md, "/d/a", trunc)
				write(t, f, "new")
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "old"}, {d: "", e: "", "/d/a": "new"}},
		},
		{
			name: "synced overwrite survives",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("old")))
				f := openW(t, md, "/d/a", trunc)
				write(t, f, "new")
				memOK(t, f.Sync())
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "new"}},
		},
		{
			name: "an append may keep the new size without its bytes",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("old")))
				f := openW(t, md, "/d/a", os.O_WRONLY|os.O_APPEND)
				write(t, f, "+x")
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "old"}, {d: "", e: "", "/d/a": "old+x"}, {d: "", e: "", "/d/a": "old\x00\x00"}},
		},
		{
			name: "rename without a directory sync can be undone",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/d/b"))
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "A"}, {d: "", e: "", "/d/b": "A"}},
		},
		{
			name: "rename with a directory sync survives",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/d/b"))
				memOK(t, md.SyncDir("/d"))
			},
			want: []map[string]string{{d: "", e: "", "/d/b": "A"}},
		},
		{
			name: "rename across directories survives a sync of either",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/e/a"))
				memOK(t, md.SyncDir("/d"))
			},
			want: []map[string]string{{d: "", e: "", "/e/a": "A"}},
		},
		{
			name: "a later sync of another directory makes earlier operations durable",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/d/b"))
				memOK(t, md.Mkdir("/e/x", 0o755))
				memOK(t, md.SyncDir("/e"))
			},
			want: []map[string]string{{d: "", e: "", "/d/b": "A", "/e/x/": ""}},
		},
		{
			name: "a directory sync leaves later operations undoable",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/d/b"))
				memOK(t, md.SyncDir("/d"))
				memOK(t, md.Link("/d/b", "/d/c"))
			},
			want: []map[string]string{{d: "", e: "", "/d/b": "A"}, {d: "", e: "", "/d/b": "A", "/d/c": "A"}},
		},
		{
			name: "operations survive as a prefix, never with holes",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Rename("/d/a", "/d/b"))
				memOK(t, md.Mkdir("/e/x", 0o755))
			},
			want: []map[string]string{
				{d: "", e: "", "/d/a": "A"},
				{d: "", e: "", "/d/b": "A"},
				{d: "", e: "", "/d/b": "A", "/e/x/": ""},
			},
		},
		{
			name: "create, write and sync without a directory sync can lose the file",
			act: func(t *testing.T, md *memDisk) {
				f := openW(t, md, "/d/n", os.O_WRONLY|os.O_CREATE|os.O_EXCL)
				write(t, f, "N")
				memOK(t, f.Sync())
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: ""}, {d: "", e: "", "/d/n": "N"}},
		},
		{
			name: "a directory sync without a file sync can keep an empty file",
			act: func(t *testing.T, md *memDisk) {
				f := openW(t, md, "/d/n", os.O_WRONLY|os.O_CREATE)
				write(t, f, "N")
				memOK(t, md.SyncDir("/d"))
				memOK(t, f.Close())
			},
			// The third has the new size without the byte.
			want: []map[string]string{{d: "", e: "", "/d/n": ""}, {d: "", e: "", "/d/n": "N"}, {d: "", e: "", "/d/n": "\x00"}},
		},
		{
			name: "syncing a new directory does not make its own entry durable",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.Mkdir("/d/x", 0o755))
				memOK(t, md.SyncDir("/d/x"))
			},
			want: []map[string]string{{d: "", e: ""}, {d: "", e: "", "/d/x/": ""}},
		},
		{
			name: "link then remove",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Link("/d/a", "/d/b"))
				memOK(t, md.Remove("/d/a"))
			},
			want: []map[string]string{
				{d: "", e: "", "/d/a": "A"},
				{d: "", e: "", "/d/a": "A", "/d/b": "A"},
				{d: "", e: "", "/d/b": "A"},
			},
		},
		{
			name: "link then remove, synced",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Link("/d/a", "/d/b"))
				memOK(t, md.Remove("/d/a"))
				memOK(t, md.SyncDir("/d"))
			},
			want: []map[string]string{{d: "", e: "", "/d/b": "A"}},
		},
		{
			name: "rename over a hard link of the same inode keeps both names",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Link("/d/a", "/d/b"))
				memOK(t, md.SyncDir("/d"))
				memOK(t, md.Rename("/d/a", "/d/b"))
				if got := describe(md.dump()); got != describe(map[string]string{d: "", e: "", "/d/a": "A", "/d/b": "A"}) {
					t.Errorf("after the rename: %s", got)
				}
				if ops := md.pendingOps(); len(ops) != 0 {
					t.Errorf("a rename between links of one inode logged %q", ops)
				}
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "A", "/d/b": "A"}},
		},
		{
			name: "rename over another file replaces it atomically",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("new")))
				memOK(t, md.writeFile("/d/b", []byte("old")))
				memOK(t, md.Rename("/d/a", "/d/b"))
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "new", "/d/b": "old"}, {d: "", e: "", "/d/b": "new"}},
		},
		{
			name: "remove can be undone",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("A")))
				memOK(t, md.Remove("/d/a"))
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "A"}, {d: "", e: ""}},
		},
		{
			name: "truncate without a sync",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("0123456789")))
				f := openW(t, md, "/d/a", os.O_WRONLY)
				memOK(t, f.Truncate(4))
				memOK(t, f.Close())
			},
			// The third keeps the old size over the truncated block.
			want: []map[string]string{
				{d: "", e: "", "/d/a": "0123456789"},
				{d: "", e: "", "/d/a": "0123"},
				{d: "", e: "", "/d/a": "0123\x00\x00\x00\x00\x00\x00"},
			},
		},
		{
			name: "truncate then sync",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("0123456789")))
				f := openW(t, md, "/d/a", os.O_WRONLY)
				memOK(t, f.Truncate(4))
				memOK(t, f.Sync())
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "0123"}},
		},
		{
			name: "each file survives on its own",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("a0")))
				memOK(t, md.writeFile("/d/b", []byte("b0")))
				for _, p := range []string{"/d/a", "/d/b"} {
					f := openW(t, md, p, trunc)
					write(t, f, filepath.Base(p)+"1")
					memOK(t, f.Close())
				}
			},
			// The mixed two come from the random fill.
			want: []map[string]string{
				{d: "", e: "", "/d/a": "a0", "/d/b": "b0"},
				{d: "", e: "", "/d/a": "a1", "/d/b": "b0"},
				{d: "", e: "", "/d/a": "a0", "/d/b": "b1"},
				{d: "", e: "", "/d/a": "a1", "/d/b": "b1"},
			},
		},
		{
			name: "hard links show one inode's bytes",
			act: func(t *testing.T, md *memDisk) {
				memOK(t, md.writeFile("/d/a", []byte("old")))
				memOK(t, md.Link("/d/a", "/d/b"))
				memOK(t, md.SyncDir("/d"))
				f := openW(t, md, "/d/b", trunc)
				write(t, f, "new")
				memOK(t, f.Close())
			},
			want: []map[string]string{{d: "", e: "", "/d/a": "old", "/d/b": "old"}, {d: "", e: "", "/d/a": "new", "/d/b": "new"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			md := newMemDisk()
			memOK(t, md.mkdirAll("/d"))
			memOK(t, md.mkdirAll("/e"))
			tc.act(t, md)
			imgs := md.crashImages(0, memRng())
			got, want := imageSet(imgs), describeAll(tc.want)
			if !slices.Equal(got, want) {
				t.Fatalf("images:\n  %s\nwant:\n  %s\npending: %q", strings.Join(got, "\n  "), strings.Join(want, "\n  "), md.pendingOps())
			}
			// The second image is everything surviving: the disk as it is
			// (the first, when nothing is unsynced).
			last := imgs[min(1, len(imgs)-1)]
			if describe(last.dump()) != describe(md.dump()) {
				t.Errorf("the everything-survives image is %s, the disk %s", describe(last.dump()), describe(md.dump()))
			}
			for _, img := range imgs {
				if n := len(img.crashImages(0, memRng())); n != 1 || len(img.pendingOps()) != 0 {
					t.Errorf("an image is not clean: %d images of its own, pending %q", n, img.pendingOps())
				}
			}
		})
	}
}

// TestMemDiskTornWrite: an unsynced overwrite of a two-block file with three
// blocks leaves every block-aligned mix, at either size, and nothing torn
// inside a block.
func TestMemDiskTornWrite(t *testing.T) {
	md := newMemDisk()
	old := strings.Repeat("o", 2*memBlockSize)
	memOK(t, md.writeFile("/d/a", []byte(old)))
	f := openW(t, md, "/d/a", os.O_WRONLY)
	write(t, f, strings.Repeat("n", 3*memBlockSize))
	memOK(t, f.Close())

	blocks := func(s string) map[string]string {
		var b strings.Builder
		for _, c := range s {
			b.WriteString(strings.Repeat(map[rune]string{'o': "o", 'n': "n", '0': "\x00"}[c], memBlockSize))
		}
		return map[string]string{"/d/": "", "/d/a": b.String()}
	}
	want := describeAll([]map[string]string{
		blocks("oo"), blocks("nnn"), // durable, current
		blocks("no"), blocks("nn"), // the durable size, one or two new blocks
		blocks("oo0"), blocks("no0"), blocks("nn0"), // the current size, the last block never written
	})
	if got := imageSet(md.crashImages(0, memRng())); !slices.Equal(got, want) {
		t.Fatalf("images:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestMemDiskModes: a chmod is metadata of the log; a file's Sync does not
// make it durable, a later directory sync does, and a directory's own sync
// keeps its own mode.
func TestMemDiskModes(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.writeFile("/d/a", []byte("A")))
	memOK(t, md.Chmod("/d/a", 0o600))
	f, err := md.Open("/d/a")
	memOK(t, err)
	memOK(t, f.Sync())
	memOK(t, f.Close())
	modes := func() []fs.FileMode {
		var out []fs.FileMode
		for _, img := range md.crashImages(0, nil) {
			fi, err := img.Lstat("/d/a")
			memOK(t, err)
			out = append(out, fi.Mode())
		}
		slices.Sort(out)
		return out
	}
	if got := modes(); !slices.Equal(got, []fs.FileMode{0o600, 0o644}) {
		t.Errorf("after chmod and file sync: modes %v, want 0600 and 0644", got)
	}
	memOK(t, md.Link("/d/a", "/d/b"))
	memOK(t, md.SyncDir("/d"))
	if got := modes(); !slices.Equal(got, []fs.FileMode{0o600}) {
		t.Errorf("after a later directory sync: modes %v, want 0600", got)
	}

	memOK(t, md.Mkdir("/d/x", 0o700))
	memOK(t, md.SyncDir("/d"))
	memOK(t, md.Chmod("/d/x", 0o755))
	memOK(t, md.SyncDir("/d/x"))
	for _, img := range md.crashImages(0, nil) {
		fi, err := img.Lstat("/d/x")
		memOK(t, err)
		if fi.Mode() != fs.ModeDir|0o755 || !fi.IsDir() {
			t.Errorf("directory mode %v after its own sync, want drwxr-xr-x", fi.Mode())
		}
	}
}

// TestMemDiskErrors: every refusal is the errno Linux gives, wrapped as the
// os package wraps it, so that errors.Is and os.IsNotExist work.
func TestMemDiskErrors(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.writeFile("/d/a", []byte("A")))
	memOK(t, md.writeFile("/d/sub/f", []byte("F")))
	memOK(t, md.mkdirAll("/d/empty"))
	memOK(t, md.writeFile("/d/vol/v", []byte("V")))
	md.mounts = []string{"/d/vol"}
	ro, err := md.Open("/d/a")
	memOK(t, err)
	closed, err := md.Open("/d/a")
	memOK(t, err)
	memOK(t, closed.Close())

	tests := []struct {
		name string
		op   func() error
		want error  // errors.Is
		also error  // errors.Is, the fs sentinel, when there is one
		kind string // "path" or "link": the wrapper
	}{
		{"open missing", func() error { _, err := md.Open("/d/nope"); return err }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"open under a file", func() error { _, err := md.Open("/d/a/x"); return err }, syscall.ENOTDIR, nil, "path"},
		{"open in a missing directory", func() error { _, err := md.Open("/nope/x"); return err }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"create exclusive over a file", func() error {
			_, err := md.OpenFile("/d/a", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			return err
		}, syscall.EEXIST, fs.ErrExist, "path"},
		{"create in a missing directory", func() error {
			_, err := md.OpenFile("/d/nope/x", os.O_RDWR|os.O_CREATE, 0o644)
			return err
		}, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"open a directory for writing", func() error { _, err := md.OpenFile("/d/sub", os.O_WRONLY, 0); return err }, syscall.EISDIR, nil, "path"},
		{"relative path", func() error { _, err := md.Lstat("d/a"); return err }, syscall.EINVAL, nil, "path"},
		{"unclean path", func() error { _, err := md.Lstat("/d/../d/a"); return err }, syscall.EINVAL, nil, "path"},
		{"mkdir existing", func() error { return md.Mkdir("/d/sub", 0o755) }, syscall.EEXIST, fs.ErrExist, "path"},
		{"mkdir over a file", func() error { return md.Mkdir("/d/a", 0o755) }, syscall.EEXIST, fs.ErrExist, "path"},
		{"mkdir without a parent", func() error { return md.Mkdir("/d/nope/x", 0o755) }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"remove missing", func() error { return md.Remove("/d/nope") }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"remove a non-empty directory", func() error { return md.Remove("/d/sub") }, syscall.ENOTEMPTY, nil, "path"},
		{"remove the root", func() error { return md.Remove("/") }, syscall.EBUSY, nil, "path"},
		{"link to an existing name", func() error { return md.Link("/d/a", "/d/sub/f") }, syscall.EEXIST, fs.ErrExist, "link"},
		{"link a missing file", func() error { return md.Link("/d/nope", "/d/x") }, syscall.ENOENT, fs.ErrNotExist, "link"},
		{"link a directory", func() error { return md.Link("/d/sub", "/d/x") }, syscall.EPERM, fs.ErrPermission, "link"},
		{"rename missing", func() error { return md.Rename("/d/nope", "/d/x") }, syscall.ENOENT, fs.ErrNotExist, "link"},
		{"rename into a missing directory", func() error { return md.Rename("/d/a", "/d/nope/x") }, syscall.ENOENT, fs.ErrNotExist, "link"},
		{"rename a file over a directory", func() error { return md.Rename("/d/a", "/d/empty") }, syscall.EISDIR, nil, "link"},
		{"rename a directory over a file", func() error { return md.Rename("/d/empty", "/d/a") }, syscall.ENOTDIR, nil, "link"},
		{"rename a directory over a non-empty one", func() error { return md.Rename("/d/empty", "/d/sub") }, syscall.ENOTEMPTY, nil, "link"},
		{"rename a directory into itself", func() error { return md.Rename("/d/sub", "/d/sub/x") }, syscall.EINVAL, nil, "link"},
		{"link across a mount", func() error { return md.Link("/d/a", "/d/vol/a") }, syscall.EXDEV, nil, "link"},
		{"rename across a mount", func() error { return md.Rename("/d/vol/v", "/d/v") }, syscall.EXDEV, nil, "link"},
		{"exchange across a mount", func() error { return md.Exchange("/d/a", "/d/vol/v") }, syscall.EXDEV, nil, "link"},
		{"chmod missing", func() error { return md.Chmod("/d/nope", 0o644) }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"lstat missing", func() error { _, err := md.Lstat("/d/nope"); return err }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"readdir missing", func() error { _, err := md.ReadDir("/d/nope", 0); return err }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"readdir a file", func() error { _, err := md.ReadDir("/d/a", 0); return err }, syscall.ENOTDIR, nil, "path"},
		{"syncdir missing", func() error { return md.SyncDir("/d/nope") }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"createtemp in a missing directory", func() error { _, err := md.CreateTemp("/d/nope", "x-*"); return err }, syscall.ENOENT, fs.ErrNotExist, "path"},
		{"createtemp with a slash in the pattern", func() error { _, err := md.CreateTemp("/d", "x/*"); return err }, errPatternHasSeparator, nil, "path"},
		{"write a read-only file", func() error { _, err := ro.Write([]byte("x")); return err }, syscall.EBADF, nil, "path"},
		{"truncate a read-only file", func() error { return ro.Truncate(0) }, syscall.EINVAL, nil, "path"},
		{"seek before the start", func() error { _, err := ro.Seek(-1, io.SeekStart); return err }, syscall.EINVAL, nil, "path"},
		{"read a closed file", func() error { _, err := closed.Read(make([]byte, 1)); return err }, fs.ErrClosed, nil, "path"},
		{"close twice", func() error { return closed.Close() }, fs.ErrClosed, nil, "path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := describe(md.dump())
			err := tc.op()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if tc.also != nil && !errors.Is(err, tc.also) {
				t.Errorf("err %v is not %v", err, tc.also)
			}
			if tc.also == fs.ErrNotExist && !os.IsNotExist(err) {
				t.Errorf("os.IsNotExist(%v) is false", err)
			}
			var pe *fs.PathError
			var le *os.LinkError
			if (tc.kind == "path" && !errors.As(err, &pe)) || (tc.kind == "link" && !errors.As(err, &le)) {
				t.Errorf("err %T, want a %s error", err, tc.kind)
			}
			if after := describe(md.dump()); after != before {
				t.Errorf("a failed operation changed the disk: %s", after)
			}
		})
	}
	memOK(t, ro.Close())
}

// TestMemDiskReadDir: entries sorted by name, at most n of them, with their
// kinds.
func TestMemDiskReadDir(t *testing.T) {
	md := newMemDisk()
	for _, n := range []string{"c", "a", "b10", "b2"} {
		memOK(t, md.writeFile("/d/"+n, []byte(n)))
	}
	memOK(t, md.mkdirAll("/d/b1"))
	memOK(t, md.mkdirAll("/d/empty"))
	names := func(es []fs.DirEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	for _, tc := range []struct {
		n    int
		want []string
	}{
		{0, []string{"a", "b1", "b10", "b2", "c", "empty"}},
		{-1, []string{"a", "b1", "b10", "b2", "c", "empty"}},
		{2, []string{"a", "b1"}},
		{6, []string{"a", "b1", "b10", "b2", "c", "empty"}},
		{100, []string{"a", "b1", "b10", "b2", "c", "empty"}},
	} {
		es, err := md.ReadDir("/d", tc.n)
		memOK(t, err)
		if got := names(es); !slices.Equal(got, tc.want) {
			t.Errorf("ReadDir(n=%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	es, err := md.ReadDir("/d", 0)
	memOK(t, err)
	for _, e := range es {
		info, err := e.Info()
		memOK(t, err)
		wantDir := e.Name() == "b1" || e.Name() == "empty"
		if e.IsDir() != wantDir || info.IsDir() != wantDir || e.Type().IsDir() != wantDir {
			t.Errorf("%s: IsDir %v, want %v", e.Name(), e.IsDir(), wantDir)
		}
		if !wantDir && info.Size() != int64(len(e.Name())) {
			t.Errorf("%s: size %d", e.Name(), info.Size())
		}
	}
	if es, err := md.ReadDir("/d/empty", 5); err != nil || len(es) != 0 {
		t.Errorf("empty directory: %v, %v", es, err)
	}
}

// TestMemDiskCreateTemp: unique names from the pattern, in the directory,
// read-write, mode 0600.
func TestMemDiskCreateTemp(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/d"))
	// A name the counter will reach is taken already: it must be skipped.
	memOK(t, md.writeFile("/d/pre-3.tmp", []byte("taken")))
	const n = 50
	seen := map[string]bool{}
	for range n {
		f, err := md.CreateTemp("/d", "pre-*.tmp")
		memOK(t, err)
		name := f.Name()
		base := filepath.Base(name)
		if filepath.Dir(name) != "/d" || !strings.HasPrefix(base, "pre-") || !strings.HasSuffix(base, ".tmp") || seen[name] {
			t.Fatalf("temp name %q", name)
		}
		seen[name] = true
		write(t, f, "x"+name)
		_, err = f.Seek(0, io.SeekStart)
		memOK(t, err)
		got, err := io.ReadAll(f)
		memOK(t, err)
		if string(got) != "x"+name {
			t.Errorf("read back %q", got)
		}
		fi, err := f.Stat()
		memOK(t, err)
		if fi.Mode() != 0o600 || fi.Name() != base {
			t.Errorf("%s: mode %v, name %q", name, fi.Mode(), fi.Name())
		}
		memOK(t, f.Close())
	}
	if b, _ := md.readFile("/d/pre-3.tmp"); string(b) != "taken" {
		t.Errorf("CreateTemp overwrote an existing file: %q", b)
	}
	f, err := md.CreateTemp("/d", "nostar")
	memOK(t, err)
	if base := filepath.Base(f.Name()); !strings.HasPrefix(base, "nostar") || len(base) == len("nostar") {
		t.Errorf("a pattern without * gives %q", base)
	}
	memOK(t, f.Close())
}

// TestMemDiskFileIO: offsets, sparse extension, O_APPEND, O_TRUNC, Stat and
// Name.
func TestMemDiskFileIO(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/d"))
	f := openW(t, md, "/d/f", os.O_RDWR|os.O_CREATE)
	if f.Name() != "/d/f" {
		t.Errorf("Name %q", f.Name())
	}
	write(t, f, "hello")
	off, err := f.Seek(8, io.SeekStart)
	memOK(t, err)
	write(t, f, "!")
	if off != 8 {
		t.Errorf("seek to %d", off)
	}
	if b, _ := md.readFile("/d/f"); string(b) != "hello\x00\x00\x00!" {
		t.Errorf("sparse write: %q", b)
	}
	_, err = f.Seek(-3, io.SeekEnd)
	memOK(t, err)
	buf := make([]byte, 10)
	n, err := f.Read(buf)
	memOK(t, err)
	if string(buf[:n]) != "\x00\x00!" {
		t.Errorf("read from the end: %q", buf[:n])
	}
	if n, err := f.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("read at EOF: %d, %v", n, err)
	}
	if _, err := f.Seek(100, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 9 {
		t.Errorf("an empty write past the end extended the file to %d", fi.Size())
	}
	memOK(t, f.Truncate(2))
	memOK(t, f.Truncate(4))
	if b, _ := md.readFile("/d/f"); string(b) != "he\x00\x00" {
		t.Errorf("shrink then grow: %q, want the cut bytes zeroed", b)
	}
	memOK(t, f.Close())

	a := openW(t, md, "/d/f", os.O_WRONLY|os.O_APPEND)
	_, err = a.Seek(0, io.SeekStart)
	memOK(t, err)
	write(t, a, "AB")
	write(t, a, "C")
	memOK(t, a.Close())
	if b, _ := md.readFile("/d/f"); string(b) != "he\x00\x00ABC" {
		t.Errorf("O_APPEND: %q", b)
	}

	tr := openW(t, md, "/d/f", os.O_WRONLY|os.O_TRUNC)
	write(t, tr, "z")
	memOK(t, tr.Close())
	if b, _ := md.readFile("/d/f"); string(b) != "z" {
		t.Errorf("O_TRUNC: %q", b)
	}
	// Reading a file opened O_RDONLY|O_TRUNC does not truncate it.
	r, err := md.OpenFile("/d/f", os.O_RDONLY|os.O_TRUNC, 0)
	memOK(t, err)
	memOK(t, r.Close())
	if b, _ := md.readFile("/d/f"); string(b) != "z" {
		t.Errorf("O_RDONLY|O_TRUNC: %q", b)
	}

	fi, err := md.Lstat("/d")
	memOK(t, err)
	if !fi.IsDir() || fi.Mode() != fs.ModeDir|0o755 || fi.Name() != "d" {
		t.Errorf("Lstat of a directory: %v %v %q", fi.IsDir(), fi.Mode(), fi.Name())
	}
	fi, err = md.Lstat("/d/f")
	memOK(t, err)
	if fi.IsDir() || !fi.Mode().IsRegular() || fi.Size() != 1 || fi.Name() != "f" {
		t.Errorf("Lstat of a file: %v %v %d %q", fi.IsDir(), fi.Mode(), fi.Size(), fi.Name())
	}
	// An unlinked file stays readable and writable through its handle.
	h := openW(t, md, "/d/f", os.O_RDWR)
	memOK(t, md.Remove("/d/f"))
	write(t, h, "after")
	memOK(t, h.Sync())
	memOK(t, h.Close())
	if _, err := md.Lstat("/d/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("removed file: %v", err)
	}
}

// TestMemDiskImagesIndependent: an image is a disk of its own; changing it
// changes neither another image nor the disk it came from, and the disk's
// later changes do not reach its images.
func TestMemDiskImagesIndependent(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.writeFile("/d/a", []byte(strings.Repeat("o", 2*memBlockSize))))
	memOK(t, md.writeFile("/d/keep", []byte("K")))
	f := openW(t, md, "/d/a", os.O_WRONLY)
	write(t, f, "new")
	memOK(t, md.Link("/d/a", "/d/b"))
	imgs := md.crashImages(0, memRng())
	if len(imgs) < 3 {
		t.Fatalf("%d images", len(imgs))
	}
	orig := describe(md.dump())
	others := imageSet(imgs[1:])

	x := imgs[0]
	g := openW(t, x, "/d/a", os.O_WRONLY)
	write(t, g, "changed")
	memOK(t, g.Sync())
	memOK(t, g.Close())
	memOK(t, x.Remove("/d/keep"))
	memOK(t, x.Mkdir("/d/new", 0o755))
	memOK(t, x.SyncDir("/d"))

	if got := describe(md.dump()); got != orig {
		t.Errorf("changing an image changed the disk: %s", got)
	}
	if got := imageSet(imgs[1:]); !slices.Equal(got, others) {
		t.Errorf("changing an image changed the others")
	}
	write(t, f, "more")
	memOK(t, f.Sync())
	memOK(t, f.Close())
	memOK(t, md.Remove("/d/keep"))
	memOK(t, md.SyncDir("/d"))
	if got := imageSet(imgs[1:]); !slices.Equal(got, others) {
		t.Errorf("changing the disk changed its images")
	}
}

// TestMemDiskDedup: operations that cancel out and bytes that coincide give
// one image, not several.
func TestMemDiskDedup(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.writeFile("/d/a", []byte("A")))
	memOK(t, md.Link("/d/a", "/d/b"))
	memOK(t, md.Remove("/d/b")) // prefix 2 is prefix 0 again
	memOK(t, md.Rename("/d/a", "/d/c"))
	memOK(t, md.Rename("/d/c", "/d/a")) // prefix 4 is prefix 0 again
	imgs := md.crashImages(0, memRng())
	want := describeAll([]map[string]string{
		{"/d/": "", "/d/a": "A"},
		{"/d/": "", "/d/a": "A", "/d/b": "A"},
		{"/d/": "", "/d/c": "A"},
	})
	if got := imageSet(imgs); !slices.Equal(got, want) {
		t.Fatalf("images:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	keys := map[string]bool{}
	for _, img := range imgs {
		k := img.canonical()
		if keys[k] {
			t.Errorf("a duplicate image:\n%s", k)
		}
		keys[k] = true
	}
	// Hard links are part of an image: two names of one inode differ from
	// two files with equal bytes.
	linked, copied := newMemDisk(), newMemDisk()
	memOK(t, linked.writeFile("/d/a", []byte("A")))
	memOK(t, linked.Link("/d/a", "/d/b"))
	linked.checkpoint()
	memOK(t, copied.writeFile("/d/a", []byte("A")))
	memOK(t, copied.writeFile("/d/b", []byte("A")))
	if linked.canonical() == copied.canonical() {
		t.Error("the canonical form ignores hard links")
	}
}

// TestMemDiskLimit: the count never passes the limit, the two extremes come
// first, and the default is maxCrashImages.
func TestMemDiskLimit(t *testing.T) {
	md := newMemDisk()
	const files = 12
	for i := range files {
		memOK(t, md.writeFile(fmt.Sprintf("/d/f%02d", i), []byte(strings.Repeat("o", 2*memBlockSize))))
	}
	nothing := describe(md.dump())
	for i := range files {
		p := fmt.Sprintf("/d/f%02d", i)
		f := openW(t, md, p, os.O_WRONLY)
		write(t, f, strings.Repeat("n", 3*memBlockSize))
		memOK(t, f.Close())
		memOK(t, md.Rename(p, p+".moved"))
	}
	everything := describe(md.dump())
	for _, tc := range []struct{ limit, want int }{{1, 1}, {2, 2}, {10, 10}, {0, maxCrashImages}, {-5, maxCrashImages}, {300, 300}} {
		imgs := md.crashImages(tc.limit, memRng())
		if len(imgs) != tc.want {
			t.Errorf("limit %d: %d images, want %d", tc.limit, len(imgs), tc.want)
			continue
		}
		if describe(imgs[0].dump()) != nothing {
			t.Errorf("limit %d: the first image is not nothing-survives", tc.limit)
		}
		if tc.want > 1 && describe(imgs[1].dump()) != everything {
			t.Errorf("limit %d: the second image is not everything-survives", tc.limit)
		}
	}
	// Too many combinations and no random source: the systematic images
	// alone, every prefix twice over and the torn variants of each file.
	if n := len(md.crashImages(5000, nil)); n < 2*(files+1) || n >= 5000 {
		t.Errorf("%d systematic images", n)
	}
}

// checkReplaced says whether a crash image holds dst whole, old or new, and
// at most one leftover temp file of the pattern holding the whole new bytes
// (the rename lost, the temp file kept); anything else is a mix.
func checkReplaced(img *memDisk, dir, dst, pattern string, old, new []byte) error {
	got, err := img.readFile(dst)
	if err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if !bytes.Equal(got, old) && !bytes.Equal(got, new) {
		return fmt.Errorf("%s holds %d bytes, neither the old %d nor the new %d: %s", dst, len(got), len(old), len(new), runs(string(got)))
	}
	es, err := img.ReadDir(dir, 0)
	if err != nil {
		return err
	}
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		if p == dst {
			continue
		}
		if ok, _ := filepath.Match(pattern, e.Name()); !ok {
			return fmt.Errorf("unexpected %s", p)
		}
		if b, _ := img.readFile(p); !bytes.Equal(b, new) {
			return fmt.Errorf("leftover %s holds %d bytes, not the new ones", p, len(b))
		}
	}
	return nil
}

// TestMemDiskReplaceFile runs the agent's own replaceFile on a memDisk: any
// power loss leaves the old file or the new one, whole; once the directory
// is synced, only the new one. A writer that overwrites in place fails the
// same check, which shows the check can fail.
func TestMemDiskReplaceFile(t *testing.T) {
	const dir, dst, pattern = "/d", "/d/state", ".state-*"
	old := bytes.Repeat([]byte("o"), 3*memBlockSize)
	new := append(bytes.Repeat([]byte("n"), 5*memBlockSize), "tail"...)
	md := newMemDisk()
	memOK(t, md.writeFile(dst, old))

	memOK(t, replaceFile(md, dst, pattern, privateFileMode, bytes.NewReader(new)))
	imgs := md.crashImages(0, memRng())
	sawOld, sawNew := false, false
	for _, img := range imgs {
		if err := checkReplaced(img, dir, dst, pattern, old, new); err != nil {
			t.Errorf("before the directory sync: %v", err)
		}
		b, _ := img.readFile(dst)
		sawOld, sawNew = sawOld || bytes.Equal(b, old), sawNew || bytes.Equal(b, new)
	}
	if !sawOld || !sawNew {
		t.Errorf("before the directory sync: old seen %v, new seen %v; want both", sawOld, sawNew)
	}

	memOK(t, md.SyncDir(dir))
	imgs = md.crashImages(0, memRng())
	if len(imgs) != 1 {
		t.Fatalf("after the directory sync: %d images, want 1: %q", len(imgs), imageSet(imgs))
	}
	if got := describe(imgs[0].dump()); got != describe(map[string]string{"/d/": "", dst: string(new)}) {
		t.Errorf("after the directory sync: %s", got)
	}
	if fi, err := imgs[0].Lstat(dst); err != nil || fi.Mode() != privateFileMode {
		t.Errorf("after the directory sync: mode %v, %v", fi.Mode(), err)
	}

	naive := newMemDisk()
	memOK(t, naive.writeFile(dst, old))
	f := openW(t, naive, dst, os.O_WRONLY|os.O_TRUNC)
	_, err := f.Write(new)
	memOK(t, err)
	memOK(t, f.Close())
	memOK(t, naive.SyncDir(dir))
	mixed := 0
	for _, img := range naive.crashImages(0, memRng()) {
		if checkReplaced(img, dir, dst, pattern, old, new) != nil {
			mixed++
		}
	}
	if mixed == 0 {
		t.Error("an in-place overwrite never leaves a mix: the check has no teeth")
	}
}

// logFiller is a record of about 5 KB, so that three of them span four
// blocks and a torn append cuts one.
func logFiller(seq uint64) *logRecord {
	return &logRecord{Seq: seq, Kind: recordState, Files: []fileChange{{Path: "filler", Data: []byte(strings.Repeat("x", 3700))}}}
}

// TestMemDiskStateLog runs the agent's log on a memDisk: after a synced
// record and two unsynced ones, every image loads, with the synced record
// and any whole prefix of the others.
func TestMemDiskStateLog(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/s"))
	w, err := openStateLog(md, "/s/state", 0, 0, logZeroAhead, 0)
	memOK(t, err)
	memOK(t, md.SyncDir("/s"))
	memOK(t, w.append(logFiller(1), true))
	memOK(t, w.append(logFiller(2), false))
	memOK(t, w.append(logFiller(3), false))
	seqs := func() []uint64 {
		var out []uint64
		for _, img := range md.crashImages(0, memRng()) {
			l, err := loadLog(img, "/s/state")
			if err != nil {
				t.Fatalf("an image does not load: %v", err)
			}
			out = append(out, l.seq)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	if got := seqs(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("before the sync: last records %v, want 1, 2 and 3", got)
	}
	memOK(t, w.f.Sync())
	if got := seqs(); !slices.Equal(got, []uint64{3}) {
		t.Errorf("after the sync: last records %v, want 3", got)
	}
	memOK(t, w.f.Close())
}

// TestMemDiskStateLogSurvivesItsFirstSync: a file's sync does not make its
// entry durable, so openStateLog syncs the directory of a log it creates;
// otherwise the log could vanish with the records it synced.
func TestMemDiskStateLogSurvivesItsFirstSync(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/s"))
	w, err := openStateLog(md, "/s/state", 0, 0, logZeroAhead, 0)
	memOK(t, err)
	memOK(t, w.append(logFiller(1), true))
	for _, img := range md.crashImages(0, nil) {
		l, err := loadLog(img, "/s/state")
		memOK(t, err)
		if l.seq != 1 {
			t.Fatalf("a synced first record was lost: the new log's name was not made durable")
		}
	}
	memOK(t, w.f.Close())
}

// TestMemDiskConcurrent: many goroutines on one disk, for the race
// detector, and a consistent disk afterwards.
func TestMemDiskConcurrent(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/d"))
	const workers, rounds = 6, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := fmt.Sprintf("/d/w%d", w)
			for r := range rounds {
				if err := replaceFile(md, dst, ".tmp-*", 0o644, strings.NewReader(fmt.Sprint(w, r))); err != nil {
					errs <- err
					return
				}
				if err := md.SyncDir("/d"); err != nil {
					errs <- err
					return
				}
				if _, err := md.ReadDir("/d", 0); err != nil {
					errs <- err
					return
				}
				if r%10 == 0 {
					md.crashImages(8, nil)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := map[string]string{"/d/": ""}
	for w := range workers {
		want[fmt.Sprintf("/d/w%d", w)] = fmt.Sprint(w, rounds-1)
	}
	if got := describe(md.dump()); got != describe(want) {
		t.Errorf("after the run: %s", got)
	}
	if imgs := md.crashImages(0, nil); len(imgs) != 1 {
		t.Errorf("%d images after every write was synced", len(imgs))
	}
}

// TestMemDiskCollectsInodes: a long run of temp files replaced and synced
// does not keep every inode it ever made.
func TestMemDiskCollectsInodes(t *testing.T) {
	md := newMemDisk()
	memOK(t, md.mkdirAll("/d"))
	const rounds = 1000
	for r := range rounds {
		memOK(t, replaceFile(md, "/d/f", ".tmp-*", 0o644, strings.NewReader(strconv.Itoa(r))))
		memOK(t, md.SyncDir("/d"))
	}
	md.mu.Lock()
	n := len(md.inodes)
	md.mu.Unlock()
	if n > 2*memGCMinInodes {
		t.Errorf("%d inodes kept after %d replacements", n, rounds)
	}
	if b, _ := md.readFile("/d/f"); string(b) != strconv.Itoa(rounds-1) {
		t.Errorf("content %q", b)
	}
}
