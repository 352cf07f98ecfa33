// This file owns what Unix says about the agent's own files: who owns one
// (the agent refuses to keep its state in files another user owns, since
// that user could change what the agent trusts), and the lock that keeps a
// second agent off its tree.

//go:build unix

package haptic

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// fileOwner is the uid that owns fi and its link count; ok is false where
// the system does not say.
func fileOwner(fi fs.FileInfo) (uid int, links uint64, ok bool) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), uint64(st.Nlink), true
	}
	return 0, 0, false
}

// lockTree takes an exclusive lock on the tree's base directory for the
// agent's life: two agents on one tree would interleave their records in
// one log and hand out one generation twice. The directory itself, since a
// lock on a file in the tree ended when the file was removed or replaced.
func lockTree(base string) (*os.File, error) {
	f, err := os.Open(base)
	if err != nil {
		return nil, fmt.Errorf("--base-dir: lock %s: %w", base, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("--base-dir %s: the tree is held by another process (flock: %w); one tree takes one agent", base, err)
	}
	return f, nil
}
