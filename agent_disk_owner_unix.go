// This file owns reading who owns a file on systems that say: the agent
// refuses to keep its state in files another user owns, since that user
// could change what the agent trusts.

//go:build unix

package haptic

import (
	"io/fs"
	"syscall"
)

// fileOwner is the uid that owns fi; ok is false where the system does not
// say.
func fileOwner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
