// version.go owns which build this binary is, and `haptic version`. The
// agent reports the same version in its state (agent_version) and in its
// metrics (haptic_agent_build_info), so that an operator can tell which
// build each pod of a fleet runs; it never reads anything but the binary's
// own build information.

package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is the release's version, set when the binary is linked:
//
//	go build -ldflags "-X main.version=v1.2.0" ./cmd/haptic
//
// Empty otherwise; buildVersion then falls back to the build information.
var version string

// revisionLength is how much of a VCS revision names a development build:
// the length Go's pseudo-versions use.
const revisionLength = 12

// buildVersion is the version of a build, the first of:
//
//   - the link flag (linked), a release's own name for itself;
//   - the main module's version, which Go stamps from the module proxy
//     for `go install module@version`, and from the VCS for `go build` in
//     a clone (a pseudo-version such as v0.0.0-20261205020225-7510591d4e92,
//     "+dirty" with uncommitted changes);
//   - dev+<revision>, "-dirty" when modified, where Go recorded the VCS
//     revision but no module version;
//   - dev, when nothing is known (go run, a git worktree, a copy of the
//     tree without its .git, -buildvcs=false: Go 1.26 stamps no VCS
//     information for any of them).
//
// info is nil when the binary carries no build information.
func buildVersion(linked string, info *debug.BuildInfo) string {
	if linked != "" {
		return linked
	}
	if info == nil {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, modified := vcsRevision(info)
	if rev == "" {
		return "dev"
	}
	v := "dev+" + rev[:min(len(rev), revisionLength)]
	if modified {
		v += "-dirty"
	}
	return v
}

// vcsRevision is the VCS revision Go recorded in the build, and whether
// the tree had uncommitted changes; "" when none was recorded.
func vcsRevision(info *debug.BuildInfo) (revision string, modified bool) {
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return revision, modified
}

// agentVersion is this binary's version, as `haptic version` prints it and
// the agent reports it.
func agentVersion() string {
	info, _ := debug.ReadBuildInfo()
	return buildVersion(version, info)
}

// runVersion prints the version, the Go that built the binary and, when Go
// recorded it, the VCS revision, one "key: value" line each.
func runVersion(args []string, s stdio) int {
	fs := newFlagSet("version", "haptic version\nPrints the version (the release's link flag, else the module version, else the VCS revision, else dev), "+
		"the Go that built the binary, and the VCS revision when the build recorded one.", s)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) > 0 {
		return usageError(fs, "unexpected argument %q", positional[0])
	}
	info, _ := debug.ReadBuildInfo()
	printVersion(s.out, buildVersion(version, info), info)
	return exitOK
}

// printVersion writes the lines of `haptic version`.
func printVersion(w io.Writer, v string, info *debug.BuildInfo) {
	fmt.Fprintf(w, "version: %s\ngo: %s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if info == nil {
		return
	}
	if rev, modified := vcsRevision(info); rev != "" {
		note := ""
		if modified {
			note = " (modified)"
		}
		fmt.Fprintf(w, "revision: %s%s\n", rev, note)
	}
}
