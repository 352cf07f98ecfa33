//go:build linux && amd64

package haptic

const sysRenameat2 = 316
