// This file holds the one system call the disk needs beyond the syscall
// package's wrappers: renameat2 with RENAME_EXCHANGE, which replaces a file
// atomically without the data flush ext4 starts when a rename lands on an
// existing file (its "auto_da_alloc" heuristic, which made each install of
// a map file cost more than the sync that makes it durable).

//go:build linux && (amd64 || arm64)

package haptic

import (
	"os"
	"syscall"
	"unsafe"
)

const renameExchange = 0x2 // RENAME_EXCHANGE

func datasync(f *os.File) error {
	for range maxEINTRRetries {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
	return f.Sync()
}

// maxEINTRRetries bounds the retries of a sync a signal interrupted.
const maxEINTRRetries = 16

func exchange(oldpath, newpath string) error {
	oldp, err := syscall.BytePtrFromString(oldpath)
	if err != nil {
		return err
	}
	newp, err := syscall.BytePtrFromString(newpath)
	if err != nil {
		return err
	}
	atFDCWD := -0x64 // AT_FDCWD, as the uintptr the kernel reads
	_, _, errno := syscall.Syscall6(sysRenameat2, uintptr(atFDCWD), uintptr(unsafe.Pointer(oldp)),
		uintptr(atFDCWD), uintptr(unsafe.Pointer(newp)), renameExchange, 0)
	if errno != 0 {
		return &os.LinkError{Op: "renameat2", Old: oldpath, New: newpath, Err: errno}
	}
	return nil
}
