// Systems without Unix owners and locks (Windows): no file is refused for
// its owner, and the tree is not locked, so that a controller built there
// still compiles the package it vendors; the agent runs beside HAProxy, on
// Unix.

//go:build !unix

package haptic

import (
	"io/fs"
	"os"
)

func fileOwner(fs.FileInfo) (uid int, links uint64, ok bool) { return 0, 0, false }

func lockTree(string) (*os.File, error) { return nil, nil }
