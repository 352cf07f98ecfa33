// A recording in-memory filesystem for power-loss tests: memDisk implements
// the agent's disk interface, behaves like Linux for every call the agent
// makes, and remembers what has been synced, so that a test can ask, at any
// instant, which disk images a power loss could leave, and then run the
// agent's recovery on each of them.
//
// The model of a crash, which every method below follows:
//
//   - Inodes. A regular file has data and a mode; a directory has entries
//     (name to inode) and a mode. Several entries may name one inode (hard
//     links). There are no symlinks, no owners, no umask and no permission
//     checks: the agent runs as one user and sets the modes it cares about
//     with Chmod.
//
//   - Data. Each file inode keeps its current bytes and its durable bytes:
//     what the last Sync saw. Writes, truncations and O_TRUNC change only the
//     current bytes. Sync copies current to durable; it does NOT make the
//     file's own directory entry durable. ext4 would commit a new file's
//     entry with its first fsync, but POSIX promises nothing of the kind, so
//     the stricter model makes the agent sync its directories itself.
//
//   - Metadata. Every operation that changes a directory entry or a mode
//     (create, mkdir, link, rename, remove, chmod) is appended to one global
//     ordered log and names the directories it touches: a create, link,
//     mkdir or remove touches the parent, a rename both parents (and the
//     moved directory, whose ".." changes), a chmod its inode. SyncDir on a
//     directory makes the last operation touching it durable and, as a
//     journalling filesystem such as ext4 commits its journal in order,
//     every earlier operation with it, whatever directories those touched.
//     The durable operations are therefore always a prefix of the log. A
//     chmod is in the log too and touches the inode it changes: SyncDir on
//     a directory keeps the directory's new mode, but a file's new mode
//     becomes durable only with a SyncDir that commits a later operation.
//     A file's Sync does not commit it: in journal order that would commit
//     everything before it, the file's own creation included, which is
//     exactly what the stricter model refuses to promise.
//
//   - A power loss keeps every durable operation, plus a prefix of the
//     non-durable ones (any length from none to all: the journal is
//     replayed in order or not at all past a point, never with holes). For
//     each file whose current bytes differ from its durable bytes, it keeps
//     the durable bytes, the current bytes, or a torn mix: the current bytes
//     for the first k whole blocks of memBlockSize bytes and the durable
//     bytes after them, with the file's size either the durable or the
//     current size (a region neither version covers reads as zeros). A
//     block is written whole or not at all. Hard links share one inode, so
//     every name of a file shows the same surviving bytes.
//
//   - Mounts. A directory listed in mounts is the root of a mount of its
//     own: a link, rename or exchange from one mount to another fails with
//     EXDEV, as between two bind mounts of one filesystem. They share the
//     one metadata log, as such bind mounts share their filesystem's
//     journal.
//
// crashImages enumerates those outcomes, as fresh independent disks on
// which everything is durable. The helpers writeFile, mkdirAll and
// checkpoint set up durable state for a test at once; dump, readFile and
// pendingOps read a disk for comparisons and failure messages.

package haptic

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits of the model.
const (
	// memBlockSize is the unit a write survives in: a power loss keeps a
	// block of a file whole, old or new, never half of it.
	memBlockSize = 4096
	// maxCrashImages is the number of images crashImages returns when its
	// caller does not say.
	maxCrashImages = 256
	// crashRandomTries bounds the combinations tried per image asked for:
	// when there are no more than that many, all are tried; otherwise that
	// many random draws, since most repeat an image already found once the
	// systematic ones are in, and the fill gives up rather than spin.
	crashRandomTries = 4
	// maxMemFileBytes bounds a file: a Seek far past the end followed by a
	// Write must fail like a full disk, not allocate gigabytes.
	maxMemFileBytes = 1 << 30
	// memGCMinInodes is the inode count below which unreferenced inodes
	// are not worth collecting.
	memGCMinInodes = 64
	// memRootIno is the root directory's inode number.
	memRootIno = 1
)

// memInode is a file or a directory. Its entries (for a directory) and its
// mode live in the namespaces, which the metadata log changes; its bytes
// live here, since data is synced per file.
type memInode struct {
	ino     uint64
	dir     bool
	data    []byte // current bytes; owned by this inode alone, written in place
	durable []byte // bytes as of the last Sync; never written in place
	open    int    // open handles, which keep an unlinked inode alive
}

// memNS is one state of the namespace: every directory's entries and every
// inode's mode. The disk keeps two, the current one and the durable one;
// a crash image is the durable one with a prefix of the log replayed.
type memNS struct {
	dirs  map[uint64]map[string]uint64
	modes map[uint64]fs.FileMode
}

func newMemNS() *memNS {
	return &memNS{dirs: map[uint64]map[string]uint64{}, modes: map[uint64]fs.FileMode{}}
}

func (ns *memNS) clone() *memNS {
	out := &memNS{dirs: make(map[uint64]map[string]uint64, len(ns.dirs)), modes: make(map[uint64]fs.FileMode, len(ns.modes))}
	for ino, entries := range ns.dirs {
		out.dirs[ino] = cloneEntries(entries)
	}
	for ino, m := range ns.modes {
		out.modes[ino] = m
	}
	return out
}

func cloneEntries(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// memEntryChange sets one directory entry; ino 0 removes it.
type memEntryChange struct {
	dir  uint64
	name string
	ino  uint64
}

// memOp is one metadata operation of the log, recorded as its effect on
// the namespace it ran on. Replaying a prefix of the log in order on the
// durable namespace rebuilds exactly the namespace each operation saw, so
// recording effects (not requests) is enough.
type memOp struct {
	desc    string // for failure messages: "rename /a /b"
	touches []uint64
	newDir  uint64 // mkdir: the directory created, with no entries
	goneDir uint64 // rmdir, or a rename over an empty directory
	entries []memEntryChange
	modeIno uint64 // create, mkdir, chmod: the inode whose mode is set
	mode    fs.FileMode
}

func (ns *memNS) apply(op *memOp) {
	if op.newDir != 0 {
		ns.dirs[op.newDir] = map[string]uint64{}
	}
	for _, c := range op.entries {
		if c.ino == 0 {
			delete(ns.dirs[c.dir], c.name)
		} else {
			ns.dirs[c.dir][c.name] = c.ino
		}
	}
	if op.goneDir != 0 {
		delete(ns.dirs, op.goneDir)
	}
	if op.modeIno != 0 {
		ns.modes[op.modeIno] = op.mode
	}
}

// memDisk is the recording filesystem. One mutex guards everything,
// including the state of its open files.
type memDisk struct {
	mu      sync.Mutex
	inodes  map[uint64]*memInode
	cur     *memNS
	dur     *memNS
	pending []memOp // the log's operations not durable yet, oldest first
	nextIno uint64
	tempSeq uint64
	gcAt    int
	mounts  []string // mount points below the root, set before use
}

var _ disk = (*memDisk)(nil)

// mountOf is the mount point of the mount that holds p: "/" or one of
// mounts.
func (d *memDisk) mountOf(p string) string {
	best := "/"
	for _, m := range d.mounts {
		if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	return best
}

// crossesMount reports whether a and b lie on different mounts.
func (d *memDisk) crossesMount(a, b string) bool { return d.mountOf(a) != d.mountOf(b) }

// MountID names the mount an existing name is on: 1 for the root's, and
// one more than its index in mounts for any other.
func (d *memDisk) MountID(name string) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, _, _, err := d.existing(name); err != nil {
		return 0, &fs.PathError{Op: "statx", Path: name, Err: err}
	}
	return uint64(slices.Index(d.mounts, d.mountOf(name)) + 2), nil
}

// newMemDisk returns an empty disk: a durable root directory, mode 0755.
func newMemDisk() *memDisk {
	d := &memDisk{inodes: map[uint64]*memInode{}, cur: newMemNS(), nextIno: memRootIno + 1, gcAt: memGCMinInodes}
	d.inodes[memRootIno] = &memInode{ino: memRootIno, dir: true}
	d.cur.dirs[memRootIno] = map[string]uint64{}
	d.cur.modes[memRootIno] = 0o755
	d.dur = d.cur.clone()
	return d
}

// ---------------------------------------------------------------------------
// Paths. The disk contract's paths are absolute and clean; anything else is
// a caller's bug, refused with EINVAL rather than guessed at.

// lookup resolves name in the current namespace: its parent directory, its
// last component and its inode (0 when the parent exists but the entry does
// not). The root is its own parent, with an empty last component.
func (d *memDisk) lookup(name string) (parent uint64, base string, ino uint64, err error) {
	if name == "" || name[0] != '/' || path.Clean(name) != name {
		return 0, "", 0, syscall.EINVAL
	}
	if name == "/" {
		return memRootIno, "", memRootIno, nil
	}
	comps := strings.Split(name[1:], "/")
	dir := uint64(memRootIno)
	for _, c := range comps[:len(comps)-1] {
		child, ok := d.cur.dirs[dir][c]
		if !ok {
			return 0, "", 0, syscall.ENOENT
		}
		if !d.inodes[child].dir {
			return 0, "", 0, syscall.ENOTDIR
		}
		dir = child
	}
	base = comps[len(comps)-1]
	return dir, base, d.cur.dirs[dir][base], nil
}

// existing resolves a name that must exist.
func (d *memDisk) existing(name string) (parent uint64, base string, ino uint64, err error) {
	parent, base, ino, err = d.lookup(name)
	if err == nil && ino == 0 {
		err = syscall.ENOENT
	}
	return parent, base, ino, err
}

// log runs a metadata operation on the current namespace and appends it to
// the log, where it waits for a SyncDir.
func (d *memDisk) log(op memOp) {
	d.cur.apply(&op)
	d.pending = append(d.pending, op)
}

func (d *memDisk) newInode(dir bool) *memInode {
	in := &memInode{ino: d.nextIno, dir: dir}
	d.nextIno++
	d.inodes[in.ino] = in
	return in
}

// ---------------------------------------------------------------------------
// The disk interface.

func (d *memDisk) Open(name string) (diskFile, error) { return d.OpenFile(name, os.O_RDONLY, 0) }

// OpenFile supports O_RDONLY, O_WRONLY, O_RDWR, O_CREATE, O_EXCL, O_TRUNC
// and O_APPEND; other flags are ignored. O_TRUNC truncates only a file
// opened for writing.
func (d *memDisk) OpenFile(name string, flag int, perm fs.FileMode) (diskFile, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := d.openLocked(name, flag, perm)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return f, nil
}

func (d *memDisk) openLocked(name string, flag int, perm fs.FileMode) (*memFile, error) {
	acc := flag & syscall.O_ACCMODE
	if acc != os.O_RDONLY && acc != os.O_WRONLY && acc != os.O_RDWR {
		return nil, syscall.EINVAL
	}
	parent, base, ino, err := d.lookup(name)
	if err != nil {
		return nil, err
	}
	var in *memInode
	switch {
	case ino == 0 && flag&os.O_CREATE == 0:
		return nil, syscall.ENOENT
	case ino == 0:
		in = d.newInode(false)
		d.log(memOp{desc: "create " + name, touches: []uint64{parent},
			entries: []memEntryChange{{dir: parent, name: base, ino: in.ino}},
			modeIno: in.ino, mode: perm & fs.ModePerm})
	case flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, syscall.EEXIST
	default:
		in = d.inodes[ino]
		if in.dir && (acc != os.O_RDONLY || flag&(os.O_CREATE|os.O_TRUNC) != 0) {
			return nil, syscall.EISDIR
		}
		if flag&os.O_TRUNC != 0 && acc != os.O_RDONLY {
			in.data = in.data[:0]
		}
	}
	in.open++
	return &memFile{d: d, in: in, name: name,
		rd: acc != os.O_WRONLY, wr: acc != os.O_RDONLY, app: flag&os.O_APPEND != 0}, nil
}

// errPatternHasSeparator is os.CreateTemp's refusal of a pattern with a
// slash.
var errPatternHasSeparator = errors.New("pattern contains path separator")

// CreateTemp creates a new file in dir, named by replacing the last "*" of
// pattern (or appending, when there is none) with a number, opened
// read-write with mode 0600. The numbers come from a counter, so a run is
// reproducible.
func (d *memDisk) CreateTemp(dir, pattern string) (diskFile, error) {
	if strings.Contains(pattern, "/") {
		return nil, &fs.PathError{Op: "createtemp", Path: pattern, Err: errPatternHasSeparator}
	}
	prefix, suffix := pattern, ""
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		prefix, suffix = pattern[:i], pattern[i+1:]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for range maxTempNameTries {
		d.tempSeq++
		name := path.Join(dir, prefix+strconv.FormatUint(d.tempSeq, 10)+suffix)
		f, err := d.openLocked(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, syscall.EEXIST) {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return f, nil
	}
	return nil, &fs.PathError{Op: "createtemp", Path: path.Join(dir, prefix+"*"+suffix), Err: fs.ErrExist}
}

// Rename replaces newpath's entry with oldpath's in one operation. When
// both name one inode (the same path, or two hard links), it does nothing
// and keeps both names, as rename(2) does.
func (d *memDisk) Rename(oldpath, newpath string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.renameLocked(oldpath, newpath); err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	d.maybeGC()
	return nil
}

func (d *memDisk) renameLocked(oldpath, newpath string) error {
	op, ob, ino, err := d.existing(oldpath)
	if err != nil {
		return err
	}
	if d.crossesMount(oldpath, newpath) {
		return syscall.EXDEV
	}
	np, nb, nino, err := d.lookup(newpath)
	if err != nil {
		return err
	}
	if ino == memRootIno || nino == memRootIno {
		return syscall.EBUSY
	}
	if ino == nino {
		return nil
	}
	src := d.inodes[ino]
	var gone uint64
	if nino != 0 {
		dst := d.inodes[nino]
		switch {
		case src.dir && !dst.dir:
			return syscall.ENOTDIR
		case !src.dir && dst.dir:
			return syscall.EISDIR
		case dst.dir && len(d.cur.dirs[nino]) > 0:
			return syscall.ENOTEMPTY
		case dst.dir:
			gone = nino
		}
	}
	touches := []uint64{op}
	if np != op {
		touches = append(touches, np)
	}
	if src.dir {
		// No symlinks and no directory hard links: a path prefix is
		// exactly "inside".
		if strings.HasPrefix(newpath, oldpath+"/") {
			return syscall.EINVAL
		}
		if np != op {
			touches = append(touches, ino)
		}
	}
	d.log(memOp{desc: "rename " + oldpath + " " + newpath, touches: touches, goneDir: gone,
		entries: []memEntryChange{{dir: op, name: ob}, {dir: np, name: nb, ino: ino}}})
	return nil
}

// Exchange swaps two existing names atomically, as renameat2 with
// RENAME_EXCHANGE does: one metadata operation touching both directories.
func (d *memDisk) Exchange(oldpath, newpath string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	op, ob, ino, err := d.existing(oldpath)
	if err == nil {
		var np uint64
		var nb string
		var nino uint64
		np, nb, nino, err = d.existing(newpath)
		switch {
		case err != nil:
		case d.crossesMount(oldpath, newpath):
			err = syscall.EXDEV
		case ino == memRootIno || nino == memRootIno:
			err = syscall.EBUSY
		case d.inodes[ino].dir || d.inodes[nino].dir:
			err = syscall.EINVAL // directories are never exchanged by the agent
		case ino == nino:
		default:
			touches := []uint64{op}
			if np != op {
				touches = append(touches, np)
			}
			d.log(memOp{desc: "exchange " + oldpath + " " + newpath, touches: touches,
				entries: []memEntryChange{{dir: op, name: ob, ino: nino}, {dir: np, name: nb, ino: ino}}})
		}
	}
	if err != nil {
		return &os.LinkError{Op: "renameat2", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

// Link adds newname as another name of oldname's file.
func (d *memDisk) Link(oldname, newname string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.linkLocked(oldname, newname); err != nil {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: err}
	}
	return nil
}

func (d *memDisk) linkLocked(oldname, newname string) error {
	_, _, ino, err := d.existing(oldname)
	if err != nil {
		return err
	}
	if d.inodes[ino].dir {
		return syscall.EPERM
	}
	if d.crossesMount(oldname, newname) {
		return syscall.EXDEV
	}
	np, nb, nino, err := d.lookup(newname)
	if err != nil {
		return err
	}
	if nino != 0 {
		return syscall.EEXIST
	}
	d.log(memOp{desc: "link " + oldname + " " + newname, touches: []uint64{np},
		entries: []memEntryChange{{dir: np, name: nb, ino: ino}}})
	return nil
}

// Remove unlinks a file, or removes an empty directory, as os.Remove does.
func (d *memDisk) Remove(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	parent, base, ino, err := d.existing(name)
	if err == nil && ino == memRootIno {
		err = syscall.EBUSY
	}
	if err == nil && d.inodes[ino].dir && len(d.cur.dirs[ino]) > 0 {
		err = syscall.ENOTEMPTY
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	op := memOp{desc: "remove " + name, touches: []uint64{parent},
		entries: []memEntryChange{{dir: parent, name: base}}}
	if d.inodes[ino].dir {
		op.goneDir = ino
	}
	d.log(op)
	d.maybeGC()
	return nil
}

// Mkdir creates a directory; the mode is perm's permission bits (no umask).
func (d *memDisk) Mkdir(name string, perm fs.FileMode) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	parent, base, ino, err := d.lookup(name)
	if err == nil && ino != 0 {
		err = syscall.EEXIST
	}
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	in := d.newInode(true)
	d.log(memOp{desc: "mkdir " + name, touches: []uint64{parent}, newDir: in.ino,
		entries: []memEntryChange{{dir: parent, name: base, ino: in.ino}},
		modeIno: in.ino, mode: perm & fs.ModePerm})
	return nil
}

// Chmod sets the permission bits of a file or directory.
func (d *memDisk) Chmod(name string, mode fs.FileMode) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _, ino, err := d.existing(name)
	if err != nil {
		return &fs.PathError{Op: "chmod", Path: name, Err: err}
	}
	d.chmodLocked(ino, name, mode)
	return nil
}

// chmodLocked logs a mode change. It touches the inode itself, so that
// SyncDir on a directory makes the directory's own mode durable, as fsync
// on it would; a file's Sync does not consult the log (see the header), so
// a file's mode becomes durable only with a later SyncDir.
func (d *memDisk) chmodLocked(ino uint64, name string, mode fs.FileMode) {
	d.log(memOp{desc: "chmod " + name, touches: []uint64{ino}, modeIno: ino, mode: mode & fs.ModePerm})
}

func (d *memDisk) Lstat(name string) (fs.FileInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _, ino, err := d.existing(name)
	if err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: name, Err: err}
	}
	return d.info(path.Base(name), ino), nil
}

// ReadDir returns at most n entries of a directory (all of them when
// n <= 0), sorted by name.
func (d *memDisk) ReadDir(name string, n int) ([]fs.DirEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _, ino, err := d.existing(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if !d.inodes[ino].dir {
		return nil, &fs.PathError{Op: "readdirent", Path: name, Err: syscall.ENOTDIR}
	}
	names := make([]string, 0, len(d.cur.dirs[ino]))
	for e := range d.cur.dirs[ino] {
		names = append(names, e)
	}
	slices.Sort(names)
	if n > 0 && len(names) > n {
		names = names[:n]
	}
	out := make([]fs.DirEntry, len(names))
	for i, e := range names {
		out[i] = fs.FileInfoToDirEntry(d.info(e, d.cur.dirs[ino][e]))
	}
	return out, nil
}

// SyncDir makes the directory's entries durable: the last logged operation
// that touched it, and every operation before that one. On a file it is a
// file sync, as fsync on a file descriptor is.
func (d *memDisk) SyncDir(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _, ino, err := d.existing(name)
	if err != nil {
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	d.syncLocked(d.inodes[ino])
	return nil
}

// syncLocked is fsync: a file's bytes, or a directory's entries.
func (d *memDisk) syncLocked(in *memInode) {
	if !in.dir {
		if !bytes.Equal(in.durable, in.data) {
			in.durable = bytes.Clone(in.data)
		}
		return
	}
	last := -1
	for i := range d.pending {
		if slices.Contains(d.pending[i].touches, in.ino) {
			last = i
		}
	}
	if last < 0 {
		return
	}
	for i := range d.pending[:last+1] {
		d.dur.apply(&d.pending[i])
	}
	d.pending = slices.Clone(d.pending[last+1:])
	d.maybeGC()
}

// info describes an inode under a name, from the current namespace.
func (d *memDisk) info(name string, ino uint64) fs.FileInfo {
	in := d.inodes[ino]
	fi := memFileInfo{name: name, mode: d.cur.modes[ino], size: int64(len(in.data))}
	if in.dir {
		fi.mode |= fs.ModeDir
		fi.size = memBlockSize // what ext4 reports for a small directory
	}
	return fi
}

// maybeGC drops the inodes nothing can reach any more once there are many:
// not named in either namespace or the log, and not open. Without it, a long
// simulation would keep every temp file and every old snapshot's bytes.
func (d *memDisk) maybeGC() {
	if len(d.inodes) < d.gcAt {
		return
	}
	live := map[uint64]bool{memRootIno: true}
	for _, ns := range []*memNS{d.cur, d.dur} {
		for dir, entries := range ns.dirs {
			live[dir] = true
			for _, ino := range entries {
				live[ino] = true
			}
		}
	}
	for i := range d.pending {
		op := &d.pending[i]
		live[op.newDir], live[op.modeIno] = true, true
		for _, c := range op.entries {
			live[c.ino] = true
		}
	}
	for ino, in := range d.inodes {
		if !live[ino] && in.open == 0 {
			delete(d.inodes, ino)
			delete(d.cur.modes, ino)
			delete(d.dur.modes, ino)
		}
	}
	d.gcAt = max(2*len(d.inodes), memGCMinInodes)
}

// ---------------------------------------------------------------------------
// Open files.

// memFile is an open file of a memDisk. Its offset is guarded by the disk's
// mutex, like everything else.
type memFile struct {
	d      *memDisk
	in     *memInode
	name   string
	off    int64
	rd, wr bool
	app    bool
	closed bool
}

var _ diskFile = (*memFile)(nil)

func (f *memFile) Name() string { return f.name }

// check returns the error of an operation on a closed file.
func (f *memFile) check(op string) error {
	if f.closed {
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	}
	return nil
}

func (f *memFile) Read(p []byte) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	switch {
	case f.in.dir:
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: syscall.EISDIR}
	case !f.rd:
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: syscall.EBADF}
	case len(p) == 0:
		return 0, nil
	case f.off >= int64(len(f.in.data)):
		return 0, io.EOF
	}
	n := copy(p, f.in.data[f.off:])
	f.off += int64(n)
	return n, nil
}

// Write writes at the offset, or at the end with O_APPEND; a write past the
// end fills the gap with zeros.
func (f *memFile) Write(p []byte) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	if !f.wr {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: syscall.EBADF}
	}
	if len(p) == 0 {
		return 0, nil // a write of nothing does not extend the file, even past its end
	}
	if f.app {
		f.off = int64(len(f.in.data))
	}
	if f.off > maxMemFileBytes || int64(len(p)) > maxMemFileBytes-f.off {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: syscall.EFBIG}
	}
	end := f.off + int64(len(p))
	f.in.resize(end, false)
	copy(f.in.data[f.off:], p)
	f.off = end
	return len(p), nil
}

// resize sets the length of the current bytes, zero-filling any growth;
// with shrink false it only grows.
func (in *memInode) resize(size int64, shrink bool) {
	n := int(size)
	switch {
	case n < len(in.data):
		if shrink {
			in.data = in.data[:n]
		}
	case n <= cap(in.data):
		old := len(in.data)
		in.data = in.data[:n]
		clear(in.data[old:]) // a shrink left old bytes behind the length
	default:
		grown := make([]byte, n, max(n, 2*cap(in.data)))
		copy(grown, in.data)
		in.data = grown
	}
}

func (f *memFile) Seek(offset int64, whence int) (int64, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("seek"); err != nil {
		return 0, err
	}
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = f.off
	case io.SeekEnd:
		base = int64(len(f.in.data))
	default:
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	next := base + offset
	if next < 0 || (offset > 0 && next < base) {
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	f.off = next
	return next, nil
}

func (f *memFile) Truncate(size int64) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("truncate"); err != nil {
		return err
	}
	switch {
	case !f.wr || f.in.dir || size < 0:
		return &fs.PathError{Op: "truncate", Path: f.name, Err: syscall.EINVAL}
	case size > maxMemFileBytes:
		return &fs.PathError{Op: "truncate", Path: f.name, Err: syscall.EFBIG}
	}
	f.in.resize(size, true)
	return nil
}

func (f *memFile) Stat() (fs.FileInfo, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("stat"); err != nil {
		return nil, err
	}
	return f.d.info(path.Base(f.name), f.in.ino), nil
}

func (f *memFile) Chmod(mode fs.FileMode) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("chmod"); err != nil {
		return err
	}
	f.d.chmodLocked(f.in.ino, f.name, mode)
	return nil
}

// Sync makes the file's bytes durable, and nothing else: not its directory
// entry, not a pending chmod. On a directory it is SyncDir.
func (f *memFile) Sync() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("sync"); err != nil {
		return err
	}
	f.d.syncLocked(f.in)
	return nil
}

func (f *memFile) Close() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if err := f.check("close"); err != nil {
		return err
	}
	f.closed = true
	f.in.open--
	f.d.maybeGC()
	return nil
}

// memFileInfo is Lstat's and Stat's answer. There are no times: the agent
// never reads them from its disk.
type memFileInfo struct {
	name string
	size int64
	mode fs.FileMode
}

func (fi memFileInfo) Name() string       { return fi.name }
func (fi memFileInfo) Size() int64        { return fi.size }
func (fi memFileInfo) Mode() fs.FileMode  { return fi.mode }
func (fi memFileInfo) ModTime() time.Time { return time.Time{} }
func (fi memFileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi memFileInfo) Sys() any           { return nil }

// ---------------------------------------------------------------------------
// Test setup and inspection. These bypass the model: what they make is
// durable at once.

// checkpoint makes everything durable, as sync(2) would: every logged
// operation and every file's bytes.
func (d *memDisk) checkpoint() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checkpointLocked()
}

func (d *memDisk) checkpointLocked() {
	for i := range d.pending {
		d.dur.apply(&d.pending[i])
	}
	d.pending = nil
	for _, in := range d.inodes {
		d.syncLocked(in)
	}
}

// mkdirAll creates a directory and its missing parents, mode 0755, and
// makes the whole disk durable.
func (d *memDisk) mkdirAll(name string) error {
	if _, err := mkdirAll(d, name, 0o755); err != nil {
		return err
	}
	d.checkpoint()
	return nil
}

// writeFile creates or replaces the bytes of a file (a new one gets mode
// 0644), creating its missing parents, and makes the whole disk durable.
func (d *memDisk) writeFile(name string, data []byte) error {
	if _, err := mkdirAll(d, path.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := d.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	d.checkpoint()
	return nil
}

// readFile returns a file's current bytes.
func (d *memDisk) readFile(name string) ([]byte, error) {
	return readAllLimited(d, name, maxMemFileBytes)
}

// pendingOps describes the logged operations a power loss could still
// undo, oldest first.
func (d *memDisk) pendingOps() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, len(d.pending))
	for i := range d.pending {
		out[i] = d.pending[i].desc
	}
	return out
}

// memEntry is one name of a walk of a namespace.
type memEntry struct {
	path string
	ino  uint64
}

// walk lists every name reachable from the root in ns, sorted by path,
// the root excluded. Directories cannot form cycles (rename refuses to move
// one into itself), and seen makes sure of it.
func walkNS(ns *memNS) []memEntry {
	var out []memEntry
	seen := map[uint64]bool{memRootIno: true}
	var visit func(dir uint64, prefix string)
	visit = func(dir uint64, prefix string) {
		names := make([]string, 0, len(ns.dirs[dir]))
		for name := range ns.dirs[dir] {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			ino := ns.dirs[dir][name]
			p := prefix + "/" + name
			out = append(out, memEntry{path: p, ino: ino})
			if _, isDir := ns.dirs[ino]; isDir && !seen[ino] {
				seen[ino] = true
				visit(ino, p)
			}
		}
	}
	visit(memRootIno, "")
	return out
}

// dump maps every path to its current content: a file's bytes, or "" for a
// directory, whose path is written with a trailing slash.
func (d *memDisk) dump() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]string{}
	for _, e := range walkNS(d.cur) {
		if in := d.inodes[e.ino]; in.dir {
			out[e.path+"/"] = ""
		} else {
			out[e.path] = string(in.data)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Crash images.

// memChoice picks the bytes an inode keeps in an image.
type memChoice func(in *memInode) []byte

func keepDurable(in *memInode) []byte { return in.durable }
func keepCurrent(in *memInode) []byte { return in.data }

// tornCount is the number of torn variants of a dirty file: for each
// surviving size (durable or current), each count k of leading current
// blocks that gives neither the durable nor the current bytes. Past the
// size's last block more current blocks change nothing, so k stops there.
func tornCount(in *memInode) int {
	n := 0
	for _, size := range tornSizes(in) {
		n += tornBlocks(size) + 1
	}
	return n - 2 // k=0 at the durable size is the durable bytes; k=last at the current size, the current bytes
}

func tornSizes(in *memInode) []int {
	if len(in.durable) == len(in.data) {
		return []int{len(in.data)}
	}
	return []int{len(in.durable), len(in.data)}
}

func tornBlocks(size int) int { return (size + memBlockSize - 1) / memBlockSize }

// tornVariant returns torn variant v (0 <= v < tornCount) of a dirty file.
func tornVariant(in *memInode, v int) []byte {
	v++ // skip k=0 at the first size; it is the durable bytes only when that size is the durable one
	sizes := tornSizes(in)
	if len(sizes) == 1 {
		// One size: k=0 is the durable bytes and k=last the current ones.
		return tornData(in.data, in.durable, v, sizes[0])
	}
	for _, size := range sizes {
		if v <= tornBlocks(size) {
			return tornData(in.data, in.durable, v, size)
		}
		v -= tornBlocks(size) + 1
	}
	panic("torn variant out of range")
}

// tornData is the current bytes for the first k blocks and the durable
// bytes after, cut or zero-extended to size.
func tornData(cur, dur []byte, k, size int) []byte {
	out := make([]byte, size)
	cut := min(k*memBlockSize, size)
	copy(out[:cut], cur)
	if cut < len(dur) {
		copy(out[cut:], dur[cut:])
	}
	return out
}

// crashSet collects distinct images up to a limit.
type crashSet struct {
	d      *memDisk
	limit  int
	seen   map[string]bool
	images []*memDisk
}

func (c *crashSet) full() bool { return len(c.images) >= c.limit }

// add builds the image of ns with the chosen bytes and keeps it unless an
// identical one is already in.
func (c *crashSet) add(ns *memNS, choose memChoice) {
	if c.full() {
		return
	}
	img := c.d.image(ns, choose)
	key := img.canonical()
	if c.seen[key] {
		return
	}
	c.seen[key] = true
	c.images = append(c.images, img)
}

// crashImages returns the disks a power loss at this instant could leave,
// at most limit of them (maxCrashImages when limit <= 0), each a fresh disk
// on which everything is durable. They come in this order, each stage as
// far as the limit allows:
//
//  1. the two extremes: nothing unsynced survives; everything survives;
//  2. for each prefix length of the non-durable log, shortest first: every
//     file's durable bytes, then every file's current bytes;
//  3. for each prefix length, each torn variant of each dirty file (in path
//     order), the other files durable;
//  4. the combinations of the above: per prefix length, per dirty file its
//     durable bytes, its current bytes or a torn variant. All of them when
//     there are at most crashRandomTries*limit; otherwise that many random
//     draws from rng, or none when rng is nil.
//
// Identical images (same paths, contents, modes and hard links) are kept
// once. A limit of 1 keeps only the first extreme.
func (d *memDisk) crashImages(limit int, rng *rand.Rand) []*memDisk {
	if limit <= 0 {
		limit = maxCrashImages
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := &crashSet{d: d, limit: limit, seen: map[string]bool{}}
	all := len(d.pending)
	c.add(d.nsAt(0), keepDurable)
	c.add(d.nsAt(all), keepCurrent)

	ns := d.dur.clone()
	for p := 0; p <= all && !c.full(); p++ {
		if p > 0 {
			ns.apply(&d.pending[p-1])
		}
		c.add(ns, keepDurable)
		c.add(ns, keepCurrent)
	}

	ns = d.dur.clone()
	for p := 0; p <= all && !c.full(); p++ {
		if p > 0 {
			ns.apply(&d.pending[p-1])
		}
		for _, in := range d.dirtyFiles(ns) {
			for v := range tornCount(in) {
				if c.full() {
					break
				}
				c.add(ns, func(x *memInode) []byte {
					if x == in {
						return tornVariant(in, v)
					}
					return x.durable
				})
			}
		}
	}

	// What is left: every combination when there are few, random ones
	// otherwise.
	budget := crashRandomTries * limit
	if d.combinationCount(budget) <= budget {
		ns = d.dur.clone()
		for p := 0; p <= all && !c.full(); p++ {
			if p > 0 {
				ns.apply(&d.pending[p-1])
			}
			d.addEvery(c, ns, budget)
		}
		return c.images
	}
	if rng == nil {
		return c.images
	}
	for range budget {
		if c.full() {
			break
		}
		ns := d.nsAt(rng.IntN(all + 1))
		picks := map[*memInode][]byte{}
		for _, in := range d.dirtyFiles(ns) {
			picks[in] = survivor(in, rng.IntN(2+tornCount(in)))
		}
		c.add(ns, picked(picks))
	}
	return c.images
}

// survivor is choice r of a dirty file's surviving bytes: 0 the durable
// ones, 1 the current ones, then each torn variant.
func survivor(in *memInode, r int) []byte {
	switch r {
	case 0:
		return in.durable
	case 1:
		return in.data
	}
	return tornVariant(in, r-2)
}

// picked chooses the given bytes for the given files, the durable ones for
// any other.
func picked(picks map[*memInode][]byte) memChoice {
	return func(x *memInode) []byte {
		if b, ok := picks[x]; ok {
			return b
		}
		return x.durable
	}
}

// combinationCount counts the images crashImages could build (before
// de-duplication): per prefix length, the product over its dirty files of
// their choices. It stops counting past bound.
func (d *memDisk) combinationCount(bound int) int {
	total := 0
	ns := d.dur.clone()
	for p := 0; p <= len(d.pending) && total <= bound; p++ {
		if p > 0 {
			ns.apply(&d.pending[p-1])
		}
		prod := 1
		for _, in := range d.dirtyFiles(ns) {
			n := 2 + tornCount(in)
			if prod > bound/n {
				prod = bound + 1
				break
			}
			prod *= n
		}
		total += prod
	}
	return total
}

// addEvery adds every combination of the dirty files' choices on ns, at
// most bound of them, counting through the choices like an odometer.
func (d *memDisk) addEvery(c *crashSet, ns *memNS, bound int) {
	dirty := d.dirtyFiles(ns)
	digits := make([]int, len(dirty))
	for range bound {
		if c.full() {
			return
		}
		picks := make(map[*memInode][]byte, len(dirty))
		for i, in := range dirty {
			picks[in] = survivor(in, digits[i])
		}
		c.add(ns, picked(picks))
		i := 0
		for ; i < len(dirty); i++ {
			if digits[i]++; digits[i] < 2+tornCount(dirty[i]) {
				break
			}
			digits[i] = 0
		}
		if i == len(dirty) {
			return
		}
	}
}

// nsAt is the durable namespace with the first p logged operations replayed.
func (d *memDisk) nsAt(p int) *memNS {
	ns := d.dur.clone()
	for i := range d.pending[:p] {
		ns.apply(&d.pending[i])
	}
	return ns
}

// dirtyFiles lists the files reachable in ns whose current bytes are not
// durable, in the order of their first path.
func (d *memDisk) dirtyFiles(ns *memNS) []*memInode {
	var out []*memInode
	seen := map[uint64]bool{}
	for _, e := range walkNS(ns) {
		in := d.inodes[e.ino]
		if seen[e.ino] || in.dir {
			continue
		}
		seen[e.ino] = true
		if !bytes.Equal(in.data, in.durable) {
			out = append(out, in)
		}
	}
	return out
}

// image builds a fresh disk from a namespace: every reachable inode, a
// file with the bytes choose picks for it, current and durable alike.
func (d *memDisk) image(ns *memNS, choose memChoice) *memDisk {
	img := &memDisk{inodes: map[uint64]*memInode{}, cur: newMemNS(),
		nextIno: d.nextIno, tempSeq: d.tempSeq, gcAt: memGCMinInodes, mounts: d.mounts}
	img.inodes[memRootIno] = &memInode{ino: memRootIno, dir: true}
	img.cur.dirs[memRootIno] = cloneEntries(ns.dirs[memRootIno])
	img.cur.modes[memRootIno] = ns.modes[memRootIno]
	for _, e := range walkNS(ns) {
		if _, done := img.inodes[e.ino]; done {
			continue
		}
		src := d.inodes[e.ino]
		in := &memInode{ino: e.ino, dir: src.dir}
		if src.dir {
			img.cur.dirs[e.ino] = cloneEntries(ns.dirs[e.ino])
		} else {
			b := choose(src)
			in.data, in.durable = bytes.Clone(b), bytes.Clone(b)
			if in.data == nil {
				in.data, in.durable = []byte{}, []byte{}
			}
		}
		img.inodes[e.ino] = in
		img.cur.modes[e.ino] = ns.modes[e.ino]
	}
	img.dur = img.cur.clone()
	return img
}

// canonical identifies a disk's current state: every path with its kind,
// mode, hard-link group and content digest. Inode numbers are left out, so
// two disks that differ only in them are the same image.
func (d *memDisk) canonical() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "/ d %o\n", d.cur.modes[memRootIno])
	group := map[uint64]int{}
	for i, e := range walkNS(d.cur) {
		g, ok := group[e.ino]
		if !ok {
			g = i
			group[e.ino] = g
		}
		in := d.inodes[e.ino]
		if in.dir {
			fmt.Fprintf(&b, "%s d %o %d\n", e.path, d.cur.modes[e.ino], g)
			continue
		}
		fmt.Fprintf(&b, "%s f %o %d %x\n", e.path, d.cur.modes[e.ino], g, sha256.Sum256(in.data))
	}
	return b.String()
}
