// This file owns the benchmarks of a one-entry change to a fleet-sized host
// map (236,000 entries): what one pod's Deploy costs on the wire and in
// time on the fake HAProxy, and what the agent's apply of that change costs
// against the raw `add map` on a real HAProxy. Nothing here asserts a time.

package haptic

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bigMapEntries is the entry count of the host map of a multi-tenant
// platform the benchmarks stand for.
const bigMapEntries = 236_000

// bigMapHost is the host of entry i.
func bigMapHost(i int) string { return fmt.Sprintf("tenant-%06d.example.com", i) }

// bigMap is the host map of bigMapEntries tenants, each on one of 32
// backends, with entry changed (when in range) pointing at backend instead.
// It is the same for the same arguments, so runs compare.
func bigMap(changed int, backend string) string {
	var b strings.Builder
	b.Grow(bigMapEntries * 37)
	for i := range bigMapEntries {
		value := fmt.Sprintf("backend_%d", i%32)
		if i == changed {
			value = backend
		}
		b.WriteString(bigMapHost(i))
		b.WriteByte(' ')
		b.WriteString(value)
		b.WriteByte('\n')
	}
	return b.String()
}

// BenchmarkDeployOneEntryBigMap deploys one changed entry of the big map
// to the real agent on the fake HAProxy, back and forth between two
// renders, with the caller's previous plan, its blob and the preparation
// of the pair done once outside the timer (they are per fleet, not per
// pod). It reports every byte the client writes per deploy (headers, the
// map's patch and the plan's upload included) and, apart, the plan
// upload's share: a plan patch, since the agent holds the previous plan.
func BenchmarkDeployOneEntryBigMap(b *testing.B) {
	fake := startTestFake(b, "")
	var plans [2]*Plan
	var blobs [2][]byte
	for i, backend := range []string{"backend_0", "backend_moved"} {
		plans[i] = examplePlan(bigMap(bigMapEntries/2, backend))
		blob, err := EncodePlanBlob(plans[i])
		if err != nil {
			b.Fatal(err)
		}
		blobs[i] = blob
	}
	seedHostMap(fake, plans[0].Files[1].Content)
	agent := startTestAgent(b, fake, nil)
	c := deployClient(b, agentBaseURL(agent))
	wire := countWire(c)
	ctx := context.Background()
	if res, err := Deploy(ctx, c, plans[0], DeployOptions{LeaderEpoch: 1, PlanBlob: blobs[0]}); err != nil || !res.OK {
		b.Fatalf("first deploy = %+v, %v", res, err)
	}
	wire.take()

	preps := [2]*PreparedDeploy{PrepareDeploy(plans[1], plans[0]), PrepareDeploy(plans[0], plans[1])}
	deploy := func(i int) (map[string]int64, int64) {
		next, prev := (i+1)%2, i%2
		res, err := Deploy(ctx, c, plans[next], DeployOptions{LeaderEpoch: 1, Applied: plans[prev], PlanBlob: blobs[next], Prepared: preps[next]})
		if err != nil || res.Mode != ResultRuntime {
			b.Fatalf("Deploy = %+v, %v", res, err)
		}
		return wire.take()
	}
	// One deploy each way makes the preparations' lazy work (the patches,
	// the decisions) before the timer starts.
	deploy(0)
	deploy(1)
	var sent, plan int64
	b.ResetTimer()
	for i := range b.N {
		byRoute, total := deploy(i)
		sent += total
		plan += byRoute["PUT "+PathPlan]
	}
	b.ReportMetric(float64(sent)/float64(b.N), "bytes-per-deploy")
	b.ReportMetric(float64(plan)/float64(b.N), "plan-bytes-per-deploy")
}

// BenchmarkRealBigMapEntryApply: the agent's apply adding one entry to the
// big map, the map travelling as the patch a Deploy with the caller's plan
// sends (POST /v1/apply alone: the state read before it and the read-back
// after it are not timed), against the raw round trip of the same `add
// map` line on the worker socket, interleaved in one run on one HAProxy.
// The plan follows as a PlanPatch (PUT /v1/plan, plan-ms), as Deploy sends
// it, and cpu-ms is the process's CPU time (user and system) over the
// apply, the install after its answer and the plan's upload: the agent's
// work, with the few microseconds of the in-process client that sends
// them. Each iteration also removes the entry again on both sides, untimed.
func BenchmarkRealBigMapEntryApply(b *testing.B) {
	e, r := benchEnv(b)
	big := r.with(func(r *e2eRender) { r.hostMap = bigMap(-1, "") })
	without := e.plan(big)
	if res := e.deploy(b, without); !res.OK {
		b.Fatalf("deploying the big map: %+v", res.Error)
	}
	with := e.plan(big.with(func(r *e2eRender) { r.hostMap += "bench.test be-b\n" }))
	addOp := Op{Kind: OpMapAdd, Path: e2eHostMap, Key: "bench.test", Value: "be-b"}
	delOp := Op{Kind: OpMapDel, Path: e2eHostMap, Key: "bench.test"}
	patches := [2][]byte{planPatchJSON(without, with), planPatchJSON(with, without)}
	log := openDatasyncProbe(b, e)
	var s benchSamples
	var plan, cpu []time.Duration
	for b.Loop() {
		start := processCPU()
		log.measure(e, func() { s.add(e.applyPatchTimed(b, without, with, addOp)) })
		applied := processCPU() - start
		took, cpuTook := e.putPlanPatch(b, patches[0])
		plan, cpu = append(plan, took), append(cpu, applied+cpuTook)
		e.applyPatchTimed(b, with, without, delOp)
		e.putPlanPatch(b, patches[1])
		s.addRawMapEntry(b, e, log)
	}
	s.report(b)
	b.ReportMetric(float64(median(plan).Microseconds())/1000, "plan-ms")
	b.ReportMetric(float64(median(cpu).Microseconds())/1000, "cpu-ms")
}

// putPlanPatch stores the applied plan as patch, and returns how long the
// upload took and the process CPU time it cost.
func (e *e2eEnv) putPlanPatch(b *testing.B, patch []byte) (time.Duration, time.Duration) {
	st := e.state(b)
	start, cpu := time.Now(), processCPU()
	if err := e.c.putPlan(context.Background(), st.AppliedPlanID, st.AppliedPlanProof, patch, patchContentType); err != nil {
		b.Fatalf("the plan patch: %v", err)
	}
	return time.Since(start), processCPU() - cpu
}

// processCPU is the CPU time, user and system, the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// applyPatchTimed sends the runtime apply of op that takes the agent from
// prev to next, every file it does not hold travelling as a patch cut from
// prev, and returns how long the answer took and the agent's timing of it.
func (e *e2eEnv) applyPatchTimed(b *testing.B, prev, next *Plan, op Op) (time.Duration, ApplyTiming) {
	st := e.state(b)
	m, whole := benchApply(st, next, []Op{op}, ModeAuto)
	prep, patches := PrepareDeploy(prev, next), map[string]*filePatch{}
	for path := range whole {
		pp, ok := prep.patches[path]
		if !ok || pp.cut() == nil {
			b.Fatalf("%s would travel whole", path)
		}
		patches[path] = pp.cut()
	}
	sent, parts := patchedManifest(m, patches, nil)
	start := time.Now()
	res, err := e.c.Apply(context.Background(), sent, parts, nil)
	took := time.Since(start)
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		b.Fatalf("apply %s: %+v %v", next.ID, res, err)
	}
	e.awaitReadBacks() // outside the timed part: the answer does not wait for it
	return took, res.Timing
}

// BenchmarkAgentIdleRSSBigMap runs the agent as a process of its own on the
// fake HAProxy, lands the big map with its plan, changes one entry of it
// ten times (the map as a patch, the plan as a PlanPatch, as Deploy sends
// them), lets it idle for two seconds and reports its resident memory
// (idle-MiB); then kills it, starts it again on the same tree and reports
// the same once it is ready and idle (restart-MiB). Run it without -race,
// which multiplies every allocation.
func BenchmarkAgentIdleRSSBigMap(b *testing.B) {
	fake := startTestFake(b, "")
	base := b.TempDir()
	loadOnReload(fake, base)
	cfg := agentChildConfig{BaseDir: base, MasterSocket: fake.MasterSocket(), WorkerSocket: fake.WorkerSocket(),
		AddrFile: filepath.Join(b.TempDir(), "addr")}
	config := "global\n  maxconn 100\n"
	sets := [2]fileSet{{ConfigFilePath: config, "maps/host.map": bigMap(-1, "")},
		{ConfigFilePath: config, "maps/host.map": bigMap(bigMapEntries/2, "backend_moved")}}
	plans := [2]*Plan{planOfSet(sets[0]), planOfSet(sets[1])}
	var idle, restarted []float64
	for b.Loop() {
		os.RemoveAll(base)
		os.MkdirAll(base, 0o755)
		child := startAgentChild(b, cfg)
		child.land(b, plans[0].ID, sets[0])
		st := child.state(b)
		blob, _ := EncodePlanBlob(plans[0])
		if err := child.client(b).PutPlan(context.Background(), st.AppliedPlanID, st.AppliedPlanProof, blob); err != nil {
			b.Fatal(err)
		}
		for i := range 10 {
			from, to := i%2, (i+1)%2
			value := "backend_moved"
			if to == 0 {
				value = fmt.Sprintf("backend_%d", (bigMapEntries/2)%32)
			}
			op := Op{Kind: OpMapSet, Path: "maps/host.map", Key: bigMapHost(bigMapEntries / 2), Value: value}
			code, body, err := child.postPatched(child.state(b), plans[to].ID, sets[from], sets[to], planPatchJSON(plans[from], plans[to]), ModeAuto, false, op)
			if err != nil || code != 200 || !strings.Contains(string(body), `"mode":"runtime"`) {
				b.Fatalf("change %d: %d %v %s", i, code, err, body)
			}
		}
		time.Sleep(2 * time.Second)
		idle = append(idle, float64(procStatusKiB(b, child.pid(), "VmRSS"))/1024)
		child.kill()
		child = startAgentChild(b, cfg)
		time.Sleep(2 * time.Second)
		restarted = append(restarted, float64(procStatusKiB(b, child.pid(), "VmRSS"))/1024)
		child.kill()
	}
	b.ReportMetric(median64(idle), "idle-MiB")
	b.ReportMetric(median64(restarted), "restart-MiB")
}

func median64(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
