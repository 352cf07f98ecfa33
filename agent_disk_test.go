// Test doubles of the agent's disk: hookDisk runs a hook before every file
// operation the agent performs (to count syncs, inject a failure, or stop
// the process between two operations).

package haptic

import (
	"io/fs"
	"os"
	"sync"
	"testing"
)

// diskOp names one file operation: the method and its path.
type diskOp struct {
	Op   string // create, rename, exchange, link, remove, mkdir, write, sync, syncdir, truncate
	Path string
}

// hookDisk is the operating system's disk with a hook before each
// operation that changes something or syncs. A hook error fails the
// operation, which then does nothing.
type hookDisk struct {
	osDisk
	mu   sync.Mutex
	hook func(diskOp) error
}

func (d *hookDisk) before(op, path string) error {
	d.mu.Lock()
	h := d.hook
	d.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(diskOp{Op: op, Path: path})
}

func (d *hookDisk) setHook(h func(diskOp) error) {
	d.mu.Lock()
	d.hook = h
	d.mu.Unlock()
}

func (d *hookDisk) OpenFile(name string, flag int, perm fs.FileMode) (diskFile, error) {
	if flag&os.O_CREATE != 0 {
		if err := d.before("create", name); err != nil {
			return nil, err
		}
	}
	f, err := d.osDisk.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &hookFile{diskFile: f, d: d}, nil
}

func (d *hookDisk) CreateTemp(dir, pattern string) (diskFile, error) {
	if err := d.before("create", dir); err != nil {
		return nil, err
	}
	f, err := d.osDisk.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &hookFile{diskFile: f, d: d}, nil
}

func (d *hookDisk) Rename(oldpath, newpath string) error {
	if err := d.before("rename", newpath); err != nil {
		return err
	}
	return d.osDisk.Rename(oldpath, newpath)
}

func (d *hookDisk) Exchange(oldpath, newpath string) error {
	if err := d.before("exchange", newpath); err != nil {
		return err
	}
	return d.osDisk.Exchange(oldpath, newpath)
}

func (d *hookDisk) Link(oldname, newname string) error {
	if err := d.before("link", newname); err != nil {
		return err
	}
	return d.osDisk.Link(oldname, newname)
}

func (d *hookDisk) Remove(name string) error {
	if err := d.before("remove", name); err != nil {
		return err
	}
	return d.osDisk.Remove(name)
}

func (d *hookDisk) Mkdir(name string, perm fs.FileMode) error {
	if err := d.before("mkdir", name); err != nil {
		return err
	}
	return d.osDisk.Mkdir(name, perm)
}

func (d *hookDisk) SyncDir(name string) error {
	if err := d.before("syncdir", name); err != nil {
		return err
	}
	return d.osDisk.SyncDir(name)
}

type hookFile struct {
	diskFile
	d *hookDisk
}

func (f *hookFile) Write(p []byte) (int, error) {
	if err := f.d.before("write", f.Name()); err != nil {
		return 0, err
	}
	return f.diskFile.Write(p)
}

func (f *hookFile) Sync() error {
	if err := f.d.before("sync", f.Name()); err != nil {
		return err
	}
	return f.diskFile.Sync()
}

func (f *hookFile) Truncate(size int64) error {
	if err := f.d.before("truncate", f.Name()); err != nil {
		return err
	}
	return f.diskFile.Truncate(size)
}

// newTestEnvWithDisk is newTestEnv on an agent built over d.
func newTestEnvWithDisk(t testing.TB, d disk, mutate func(*AgentConfig)) *testEnv {
	t.Helper()
	return newTestEnvWith(t, agentOptions{disk: d}, mutate)
}

// newTestEnvWith is newTestEnv on an agent built with opts.
func newTestEnvWith(t testing.TB, opts agentOptions, mutate func(*AgentConfig)) *testEnv {
	t.Helper()
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	if mutate != nil {
		mutate(&cfg)
	}
	loadOnReload(fake, cfg.BaseDir)
	a, stop := launchAgentWith(t, cfg, opts, nil, true)
	return &testEnv{fake: fake, a: a, c: newAgentClient(t, a), cfg: cfg, stop: stop}
}
