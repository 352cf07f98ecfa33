// This file owns what Unix says about the agent's own files: who owns one
// (the agent refuses to keep its state in files another user owns, since
// that user could change what the agent trusts), and the lock that keeps a
// second agent off its tree.

//go:build unix

package haptic

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// lockTree takes an exclusive lock on the tree for the agent's life (it
// ends when the file is closed, or the process), and writes the agent's
// pid into the lock file. Two agents on one tree would interleave their
// records in one log, hand out the same generation for different plans,
// and the next start would set the whole history aside: the second is
// refused at once, with the holder's pid. The lock is held on a read-only
// descriptor: one open for writing would keep the volume from being
// remounted read-only, and the pid is written through another.
func lockTree(base string) (*os.File, error) {
	path := filepath.Join(base, treeLockFile)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, privateFileMode)
	if err != nil {
		return nil, fmt.Errorf("--base-dir: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		holder := "an agent whose pid it does not say"
		if n, perr := strconv.Atoi(strings.TrimSpace(string(pid))); perr == nil {
			holder = "the agent with pid " + strconv.Itoa(n)
		}
		return nil, fmt.Errorf("--base-dir %s: the tree is held by %s (lock %s: %w); one tree takes one agent", base, holder, path, err)
	}
	os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), privateFileMode) // only a hint for the next agent's error
	return f, nil
}
