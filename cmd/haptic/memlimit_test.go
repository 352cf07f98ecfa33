// Tests of the Go memory limit `haptic agent` takes from its cgroup, on fake
// cgroup trees built in a temporary directory.

package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cgroupTree writes files (relative path → content) under a fresh root; a
// content of "<dir>" makes a directory, which no read can use as a file.
func cgroupTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if content == "<dir>" {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCgroupMemoryLimit(t *testing.T) {
	const v1Unlimited = "9223372036854771712\n"
	for _, c := range []struct {
		name     string
		files    map[string]string
		self     string
		want     int64
		wantFile string // relative to the root
	}{
		{"v2 container", map[string]string{"memory.max": "536870912\n"}, "0::/\n", 536870912, "memory.max"},
		{"v2 max is no limit", map[string]string{"memory.max": "max\n"}, "0::/\n", 0, ""},
		{"v2 systemd unit, the unit's limit", map[string]string{
			"system.slice/haptic-agent.service/memory.max": "268435456\n",
			"system.slice/memory.max":                      "max\n",
		}, "0::/system.slice/haptic-agent.service\n", 268435456, "system.slice/haptic-agent.service/memory.max"},
		{"v2 a smaller parent limit wins", map[string]string{
			"kubepods/pod1/memory.max": "1073741824\n",
			"kubepods/memory.max":      "805306368\n",
		}, "0::/kubepods/pod1\n", 805306368, "kubepods/memory.max"},
		{"v1 container", map[string]string{"memory/memory.limit_in_bytes": "402653184\n"},
			"4:memory:/docker/abc\n0::/\n", 402653184, "memory/memory.limit_in_bytes"},
		{"v1 unlimited", map[string]string{"memory/memory.limit_in_bytes": v1Unlimited}, "4:memory:/\n", 0, ""},
		{"v1 nested, controllers listed together", map[string]string{
			"memory/lb/memory.limit_in_bytes": "134217728\n",
			"memory/memory.limit_in_bytes":    v1Unlimited,
		}, "5:cpuacct,memory:/lb\n", 134217728, "memory/lb/memory.limit_in_bytes"},
		{"no cgroup files at all", nil, "", 0, ""},
		{"an unreadable file", map[string]string{"memory.max": "<dir>"}, "0::/\n", 0, ""},
		{"garbage", map[string]string{"memory.max": "lots\n"}, "0::/\n", 0, ""},
		{"zero", map[string]string{"memory.max": "0\n"}, "0::/\n", 0, ""},
		{"a path leaving the root reads the root", map[string]string{"memory.max": "1048576\n"}, "0::/../../etc\n", 1048576, "memory.max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := cgroupTree(t, c.files)
			got, file := cgroupMemoryLimit(root, c.self)
			wantFile := ""
			if c.wantFile != "" {
				wantFile = filepath.Join(root, c.wantFile)
			}
			if got != c.want || file != wantFile {
				t.Errorf("cgroupMemoryLimit = %d from %q, want %d from %q", got, file, c.want, wantFile)
			}
		})
	}
}

func TestSetMemoryLimitFromCgroup(t *testing.T) {
	root := cgroupTree(t, map[string]string{"memory.max": "1000000000\n", "self": "0::/\n"})
	run := func(env map[string]string) (set []int64, logs string) {
		var buf bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, nil))
		setMemoryLimitFromCgroup(logger, func(k string) string { return env[k] }, root, filepath.Join(root, "self"),
			func(n int64) int64 { set = append(set, n); return 0 })
		return set, buf.String()
	}

	set, logs := run(nil)
	if len(set) != 1 || set[0] != 900000000 {
		t.Errorf("without GOMEMLIMIT: set %v, want [900000000] (90%% of the cgroup's)", set)
	}
	if !strings.Contains(logs, `"go_memory_limit_bytes":900000000`) || !strings.Contains(logs, `"cgroup_limit_bytes":1000000000`) {
		t.Errorf("the limit is not logged: %s", logs)
	}

	set, logs = run(map[string]string{"GOMEMLIMIT": "300MiB"})
	if len(set) != 0 || !strings.Contains(logs, `"gomemlimit":"300MiB"`) {
		t.Errorf("with GOMEMLIMIT: set %v, logs %s; want nothing set and the variable logged", set, logs)
	}

	os.WriteFile(filepath.Join(root, "memory.max"), []byte("max\n"), 0o644)
	if set, logs = run(nil); len(set) != 0 || !strings.Contains(logs, "no cgroup memory limit") {
		t.Errorf("with no limit: set %v, logs %s", set, logs)
	}
}
