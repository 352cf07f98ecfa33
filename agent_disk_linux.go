// This file holds the sync the disk uses on Linux: fdatasync, which makes a
// file's bytes and size durable without also writing the times the agent
// never reads.

//go:build linux

package haptic

import (
	"os"
	"syscall"
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
