// Systems without renameat2 replace files with a plain rename, and sync
// files whole.

//go:build !linux || !(amd64 || arm64)

package haptic

import (
	"os"
	"syscall"
)

func exchange(oldpath, newpath string) error { return syscall.ENOSYS }

func datasync(f *os.File) error { return f.Sync() }
