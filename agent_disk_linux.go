// This file holds the two system calls the disk needs on Linux beyond the
// syscall package's wrappers: fdatasync, which makes a file's bytes and size
// durable without also writing the times the agent never reads, and
// renameat2 with RENAME_EXCHANGE, which replaces a file atomically without
// the data flush ext4 starts when a rename lands on an existing file (its
// auto_da_alloc heuristic): measured here, a rename over a map costs 0.56 ms
// and an exchange 11 µs, more than the whole rest of a runtime apply.

//go:build linux && (amd64 || arm64)

package haptic

import (
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// maxEINTRRetries bounds the retries of a sync a signal interrupted.
const maxEINTRRetries = 16

func datasync(f *os.File) error {
	for range maxEINTRRetries {
		if err := syscall.Fdatasync(int(f.Fd())); err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
	return f.Sync()
}

func exchange(oldpath, newpath string) error {
	oldp, err := syscall.BytePtrFromString(oldpath)
	if err != nil {
		return err
	}
	newp, err := syscall.BytePtrFromString(newpath)
	if err != nil {
		return err
	}
	nr := uintptr(316) // renameat2 on amd64
	if runtime.GOARCH == "arm64" {
		nr = 276
	}
	const atFDCWD, renameExchange = ^uintptr(99), 2 // AT_FDCWD is -100
	_, _, errno := syscall.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(oldp)), atFDCWD, uintptr(unsafe.Pointer(newp)), renameExchange, 0)
	if errno != 0 {
		return &os.LinkError{Op: "renameat2", Old: oldpath, New: newpath, Err: errno}
	}
	return nil
}
