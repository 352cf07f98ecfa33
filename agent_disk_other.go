// Systems without fdatasync sync files whole.

//go:build !linux

package haptic

import "os"

func datasync(f *os.File) error { return f.Sync() }
