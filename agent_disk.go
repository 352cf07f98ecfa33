// This file owns the agent's only way to its disk: the small set of file
// operations the file store and the ledger need, behind one interface, so
// that tests can run both over a filesystem that records what a power loss
// would keep, count the syncs of an apply, or stop the process between any
// two operations. Production uses the operating system's files.
//
// It must never add behaviour of its own: every method is the system call
// it is named after, nothing more.

package haptic

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// disk is the set of file operations the agent performs. Paths are
// absolute. Sync on a file makes its bytes durable; SyncDir makes the
// directory's entries (creations, renames, links and removals in it)
// durable. Nothing else is durable before a sync: a power loss may undo any
// unsynced change.
type disk interface {
	Open(name string) (diskFile, error)
	OpenFile(name string, flag int, perm fs.FileMode) (diskFile, error)
	CreateTemp(dir, pattern string) (diskFile, error)
	Rename(oldpath, newpath string) error
	// Exchange swaps two existing names atomically (renameat2 with
	// RENAME_EXCHANGE); a system without it answers ENOSYS or EINVAL.
	Exchange(oldpath, newpath string) error
	Link(oldname, newname string) error
	Remove(name string) error
	Mkdir(name string, perm fs.FileMode) error
	Chmod(name string, mode fs.FileMode) error
	Lstat(name string) (fs.FileInfo, error)
	ReadDir(name string, n int) ([]fs.DirEntry, error)
	SyncDir(name string) error
	// MountID is the id of the mount name is reached through (statx's
	// STATX_MNT_ID, not following a final symbolic link); a system
	// without it answers ENOSYS.
	MountID(name string) (uint64, error)
}

type diskFile interface {
	io.Reader
	io.Writer
	io.Seeker
	Name() string
	Stat() (fs.FileInfo, error)
	Chmod(mode fs.FileMode) error
	Truncate(size int64) error
	Sync() error
	Close() error
}

// osDisk is the operating system's filesystem.
type osDisk struct{}

func (osDisk) Open(name string) (diskFile, error) { return osFileOf(os.Open(name)) }

func (osDisk) OpenFile(name string, flag int, perm fs.FileMode) (diskFile, error) {
	return osFileOf(os.OpenFile(name, flag, perm))
}

func (osDisk) CreateTemp(dir, pattern string) (diskFile, error) {
	return osFileOf(os.CreateTemp(dir, pattern))
}

// osFile is an operating-system file whose Sync is fdatasync: it makes the
// bytes and the size durable, which is all a reader after a power loss
// needs, without also writing times the agent never reads.
type osFile struct{ *os.File }

func osFileOf(f *os.File, err error) (diskFile, error) {
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (f osFile) Sync() error                             { return datasync(f.File) }
func (osDisk) Rename(oldpath, newpath string) error      { return os.Rename(oldpath, newpath) }
func (osDisk) Exchange(oldpath, newpath string) error    { return exchange(oldpath, newpath) }
func (osDisk) Link(oldname, newname string) error        { return os.Link(oldname, newname) }
func (osDisk) MountID(name string) (uint64, error)       { return mountID(name) }
func (osDisk) Remove(name string) error                  { return os.Remove(name) }
func (osDisk) Mkdir(name string, perm fs.FileMode) error { return os.Mkdir(name, perm) }
func (osDisk) Chmod(name string, mode fs.FileMode) error { return os.Chmod(name, mode) }
func (osDisk) Lstat(name string) (fs.FileInfo, error)    { return os.Lstat(name) }

// ReadDir reads at most n entries (all of them when n <= 0), unsorted.
func (osDisk) ReadDir(name string, n int) ([]fs.DirEntry, error) {
	d, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	entries, err := d.ReadDir(n)
	if err == io.EOF {
		err = nil
	}
	return entries, err
}

// SyncDir fsyncs a directory. A filesystem that cannot sync directories
// (EINVAL) keeps its entries as durable as it can anyway; that is not an
// error the agent can act on.
func (osDisk) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// mkdirAll creates dir and its missing parents on d, like os.MkdirAll, and
// returns the directories it created, outermost first, so that a caller can
// make their entries durable.
func mkdirAll(d disk, dir string, perm fs.FileMode) (missing []string, err error) {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := d.Lstat(p)
		if err == nil {
			if !fi.IsDir() {
				return nil, &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !os.IsNotExist(err) {
			return nil, err
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p || len(missing) > maxPathDepth {
			break
		}
	}
	slices.Reverse(missing)
	for i, p := range missing {
		if err := d.Mkdir(p, perm); err != nil && !os.IsExist(err) {
			return missing[:i], err
		}
	}
	return missing, nil
}

// maxPathDepth bounds mkdirAll's walk: a manifest path of MaxPathBytes
// bytes has at most that many components.
const maxPathDepth = MaxPathBytes + 1

// readAllLimited reads a whole file of d, refusing one over limit bytes.
func readAllLimited(d disk, name string, limit int64) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, err
}

// replaceFile replaces dst with r's bytes through a synced temp file beside
// it (pattern names it), so that dst is either the old file or the whole new
// one. The rename is durable only once the caller syncs the directory.
func replaceFile(d disk, dst, pattern string, mode fs.FileMode, r io.Reader) (err error) {
	f, err := d.CreateTemp(filepath.Dir(dst), pattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			d.Remove(tmp)
		}
	}()
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if _, err = copyBytes(f, r); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return d.Rename(tmp, dst)
}
