// The fleet benchmark: N agents on fake HAProxies in this process, and
// `haptic push` (the command's own run, --quiet) to all of them. It
// reports the wall time of one push and logs the push's summary line; the
// numbers are in BENCHMARKS.md. Run it with
//
//	go test -run '^$' -bench BenchmarkFleetPush -benchtime 1x -timeout 30m ./cmd/haptic/
//
// HAPTIC_FLEET_N=300 runs one fleet size instead of 100 and 1,000, and
// HAPTIC_FLEET_ARGS="--parallel 8" adds flags to every push.
//
// Each case pushes at least fleetPushes times (b.N when larger), so that
// one run gives a median without starting the fleet again.

package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fleetPushes is how many pushes of each case one run times.
const fleetPushes = 3

func BenchmarkFleetPush(b *testing.B) {
	ns := []int{100, 1000}
	if v := os.Getenv("HAPTIC_FLEET_N"); v != "" {
		n, _ := strconv.Atoi(v)
		ns = []int{n}
	}
	for _, n := range ns {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			args := append([]string{"push", "--quiet"}, strings.Fields(os.Getenv("HAPTIC_FLEET_ARGS"))...)
			for range n {
				args = append(args, "--agent", startCLIAgent(b, nil).URL())
			}
			push := func(dir string) (time.Duration, string) {
				start := time.Now()
				r := runCLIContext(b, context.Background(), pushEnv, append(slices.Clone(args), testDir(dir))...)
				took := time.Since(start)
				// A push some agents failed is a result to report (the
				// summary says how many), not a broken benchmark.
				if r.code != exitOK && r.code != exitFailure || !strings.HasPrefix(r.out, "summary: ") {
					b.Fatalf("push %s: code %d stderr %q stdout\n%s", dir, r.code, r.err, r.out)
				}
				summary, _, _ := strings.Cut(r.out, "\n")
				return took, summary
			}
			push("shop-v1") // every pod reloads once: the baseline
			for _, c := range []struct {
				name      string
				dirs      [2]string // pushed in turn, each a change from the other
				wantShape string
			}{
				{"one map entry", [2]string{"shop-v2", "shop-v1"}, "runtime"},
				{"reload", [2]string{"shop-v3", "shop-v2"}, "reload"},
			} {
				var took []time.Duration
				var summary string
				for i := range max(b.N, fleetPushes) {
					d, s := push(c.dirs[i%2])
					took = append(took, d)
					summary = s
				}
				slices.Sort(took)
				median := took[len(took)/2]
				b.Logf("%s, %d agents: median %s over %d pushes; last %s", c.name, n, median.Round(time.Millisecond), len(took), summary)
				b.ReportMetric(median.Seconds(), strings.ReplaceAll(c.name, " ", "_")+"_s/push")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
