// Systems without renameat2 replace files with a plain rename, and sync
// files whole; their umask is not read, so every file the store creates is
// given its mode again.

//go:build !linux || !(amd64 || arm64)

package haptic

import (
	"io/fs"
	"os"
	"syscall"
)

func processUmask() fs.FileMode { return 0o777 }

func exchange(oldpath, newpath string) error { return syscall.ENOSYS }

func mountID(name string) (uint64, error) { return 0, syscall.ENOSYS }

func datasync(f *os.File) error { return f.Sync() }
