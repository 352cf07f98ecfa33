// memlimit.go owns the Go memory limit of `haptic agent`. The kernel kills
// a process that outgrows its cgroup's memory limit, and the Go runtime does
// not know that limit: with GOMEMLIMIT unset, the command sets the runtime's
// soft limit to 90% of the cgroup's, so that the garbage collector works
// harder well before the OOM killer would strike, and the rest is headroom
// for the memory the runtime does not account for.

package main

import (
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	// memoryLimitPercent is the share of the cgroup limit the Go runtime
	// may use; the rest is headroom.
	memoryLimitPercent = 90
	// cgroupV1Unlimited: cgroup v1 reports "no limit" as the largest page
	// count times the page size (9223372036854771712 with 4 KiB pages), not
	// as a word. Anything from 2^62 on is read as unlimited.
	cgroupV1Unlimited = int64(1) << 62
	cgroupRoot        = "/sys/fs/cgroup"
	procSelfCgroup    = "/proc/self/cgroup"
)

// cgroupMemoryLimit returns the memory limit in bytes that the cgroup
// hierarchy mounted at root imposes on a process whose /proc/self/cgroup
// reads self, and the file that set it; 0 and "" when none does.
//
// Every level from the process's own cgroup up to root is read, and the
// smallest limit wins, as the kernel enforces each level: in a container
// (with its own cgroup namespace) that is root itself; under systemd it is
// the unit's cgroup (MemoryMax=). Both hierarchies are read: v2's
// memory.max ("max" is no limit) and v1's memory/memory.limit_in_bytes. A
// file that is absent, unreadable or does not hold a positive number sets
// no limit: the agent must start whatever the cgroup looks like.
func cgroupMemoryLimit(root, self string) (limit int64, file string) {
	consider := func(path string, unlimitedFrom int64) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= unlimitedFrom {
			return // "max", garbage, or v1's unlimited
		}
		if limit == 0 || n < limit {
			limit, file = n, path
		}
	}
	v2, v1 := selfCgroupPaths(self)
	for _, dir := range cgroupLevels(root, v2) {
		consider(filepath.Join(dir, "memory.max"), math.MaxInt64)
	}
	for _, dir := range cgroupLevels(filepath.Join(root, "memory"), v1) {
		consider(filepath.Join(dir, "memory.limit_in_bytes"), cgroupV1Unlimited)
	}
	return limit, file
}

// selfCgroupPaths reads the process's cgroup path in the v2 hierarchy
// ("0::/path") and in v1's memory hierarchy ("N:...memory...:/path").
func selfCgroupPaths(self string) (v2, v1 string) {
	for line := range strings.SplitSeq(self, "\n") {
		fields := strings.SplitN(line, ":", 3)
		if len(fields) != 3 {
			continue
		}
		switch {
		case fields[0] == "0" && fields[1] == "":
			v2 = fields[2]
		case slices.Contains(strings.Split(fields[1], ","), "memory"):
			v1 = fields[2]
		}
	}
	return v2, v1
}

// cgroupLevels lists base/rel and each of its parents up to base. A path
// that leaves base (a malformed rel) yields base alone.
func cgroupLevels(base, rel string) []string {
	rel = filepath.Clean("/" + rel)
	var out []string
	for ; rel != "/"; rel = filepath.Dir(rel) {
		out = append(out, filepath.Join(base, rel))
	}
	return append(out, base)
}

// setMemoryLimitFromCgroup sets the Go memory limit (through set, which is
// debug.SetMemoryLimit outside tests) to memoryLimitPercent of the cgroup
// limit, unless GOMEMLIMIT is set: the runtime already applied that one,
// and the operator's word wins. What it did is logged either way.
func setMemoryLimitFromCgroup(logger *slog.Logger, getenv func(string) string, root, selfFile string, set func(int64) int64) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		logger.Info("Go memory limit from GOMEMLIMIT", "gomemlimit", v)
		return
	}
	self, _ := os.ReadFile(selfFile)
	limit, file := cgroupMemoryLimit(root, string(self))
	if limit == 0 {
		logger.Info("no cgroup memory limit found; the Go memory limit stays unset")
		return
	}
	goLimit := limit / 100 * memoryLimitPercent
	set(goLimit)
	logger.Info("Go memory limit set from the cgroup", "cgroup_limit_bytes", limit, "file", file,
		"go_memory_limit_bytes", goLimit, "percent", memoryLimitPercent)
}
