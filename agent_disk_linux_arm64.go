//go:build linux && arm64

package haptic

const sysRenameat2 = 276
