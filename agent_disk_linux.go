// This file holds what the disk needs on Linux beyond the syscall
// package's wrappers: the process's umask, read without changing it, and
// three system calls: statx for a path's mount id (agent_mounts.go says
// why), fdatasync (osFile), and renameat2 with RENAME_EXCHANGE, which
// spares the data flush ext4's auto_da_alloc starts when a rename lands on
// an existing file: measured here, a rename over a map costs 0.56 ms and an
// exchange 11 µs, more than the whole rest of a runtime apply.

//go:build linux && (amd64 || arm64)

package haptic

import (
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// processUmask is the umask /proc/self/status reports, read instead of set
// (setting it to read it would race every file another goroutine
// creates); where it cannot be read, every permission bit counts as masked.
func processUmask() fs.FileMode {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o777
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return fs.FileMode(m)
			}
		}
	}
	return 0o777
}

// maxEINTRRetries bounds the retries of a sync a signal interrupted.
const maxEINTRRetries = 16

func datasync(f *os.File) error {
	for range maxEINTRRetries {
		if err := syscall.Fdatasync(int(f.Fd())); err == nil {
			return nil
		} else if err != syscall.EINTR {
			return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
		}
	}
	return f.Sync()
}

// mountID asks statx for the mount id of name. A kernel older than 5.8
// knows no mount id: its answer lacks STATX_MNT_ID, and it is ENOSYS here.
func mountID(name string) (uint64, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	nr := map[string]uintptr{"amd64": 332, "arm64": 291}[runtime.GOARCH] // statx
	const atFDCWD, atSymlinkNoFollow, statxMntID = ^uintptr(99), 0x100, 0x1000
	var buf [256]byte // struct statx: stx_mask at 0, stx_mnt_id at 144
	_, _, errno := syscall.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(p)), atSymlinkNoFollow, statxMntID, uintptr(unsafe.Pointer(&buf[0])), 0)
	switch {
	case errno != 0:
		return 0, &os.PathError{Op: "statx", Path: name, Err: errno}
	case *(*uint32)(unsafe.Pointer(&buf[0]))&statxMntID == 0:
		return 0, &os.PathError{Op: "statx", Path: name, Err: syscall.ENOSYS}
	}
	return *(*uint64)(unsafe.Pointer(&buf[144])), nil
}

func exchange(oldpath, newpath string) error {
	const atFDCWD, renameExchange = ^uintptr(99), 2 // AT_FDCWD is -100
	oldp, err := syscall.BytePtrFromString(oldpath)
	if err != nil {
		return err
	}
	newp, err := syscall.BytePtrFromString(newpath)
	if err != nil {
		return err
	}
	nr := map[string]uintptr{"amd64": 316, "arm64": 276}[runtime.GOARCH] // renameat2
	_, _, errno := syscall.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(oldp)), atFDCWD, uintptr(unsafe.Pointer(newp)), renameExchange, 0)
	if errno != 0 {
		return &os.LinkError{Op: "renameat2", Old: oldpath, New: newpath, Err: errno}
	}
	return nil
}
