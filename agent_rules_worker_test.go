// This file owns the tests that pin how the agent judges the worker after a
// reload (agent_worker.go): an answer without a worker identity is never
// the new worker, and a reload whose new worker never answers is no
// verdict, which a recovery reload follows. Each drives the agent through
// its API, on a fake whose reloads are scripted by number.

package haptic

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// silenceNewWorkers makes the fake's reloads whose number, counted from 1
// at this call, is in silent start a worker that never answers: HAProxy
// says Success=1 and the new worker loads the tree, but show info keeps
// naming the worker from before the reload. The others behave as before.
func silenceNewWorkers(fake *FakeHAProxy, silent ...int) {
	n := 0 // guarded by the fake's lock, under which OnReload runs
	fake.With(func(m *FakeModel) {
		load := m.OnReload
		m.OnReload = func(m *FakeModel) {
			pid, start := m.Pid-1, m.StartTimeUnixMicros-1_000_000 // applyReload moved them on by one
			if load != nil {
				load(m)
			}
			if n++; slices.Contains(silent, n) {
				m.Pid, m.StartTimeUnixMicros = pid, start
			}
		}
	})
}

// TestAnAnswerWithoutAWorkerIdentityIsNotTheNewWorker: right after a
// reload the worker socket answers, but the identity cannot be read (the
// replies to show info are cut off). A worker with no identity is no
// worker: the agent waits for the next poll, which names the new worker,
// and adopts that one.
func TestAnAnswerWithoutAWorkerIdentityIsNotTheNewWorker(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	// From the reload on, every read of the identity is cut off, until the
	// second poll for the new worker (its line lists the maps too).
	var cutting atomic.Bool
	var polls, cut atomic.Int32
	e.fake.With(func(m *FakeModel) {
		load := m.OnReload
		m.OnReload = func(m *FakeModel) {
			load(m)
			cutting.Store(true)
		}
		m.CutReply = func(line string) (int, bool) {
			switch {
			case !cutting.Load() || !strings.Contains(line, identityCommand):
				return 0, false
			case strings.Contains(line, "show map") && polls.Add(1) > 1:
				cutting.Store(false)
				return 0, false
			}
			cut.Add(1)
			return 0, true
		}
	})
	next := fs.clone()
	next[ConfigFilePath] += "# 2\n"
	res := e.c.apply(reloadManifest(e, "plan-2", next), next)
	if cut.Load() == 0 {
		t.Fatal("no read of the identity was cut off after the reload: the test does not reach the rule")
	}
	worker := e.fake.Worker()
	if !res.OK || res.Mode != ResultReload || res.Reload == nil || res.Reload.WorkerPID != worker.WorkerPID {
		t.Fatalf("the reload adopted another worker than the new one, pid %d: %s", worker.WorkerPID, jsonOf(res))
	}
	if st := e.c.state("?plan=0"); !st.HAProxy.SameWorker(worker) || st.RunningPlanID != "plan-2" {
		t.Errorf("the state names worker %+v running %q, want the new worker %+v running plan-2", st.HAProxy, st.RunningPlanID, worker)
	}
}

// TestAReloadWhoseNewWorkerNeverAnswersIsFollowedByARecoveryReload:
// HAProxy says the reload succeeded, but no new worker answers within the
// reload timeout. That is no verdict: the new worker may be serving the
// refused set, so the agent puts the tree back and reloads it. When the
// recovery reload's worker does not answer either, the pacer tries it
// again, and the worker then runs the restored tree.
func TestAReloadWhoseNewWorkerNeverAnswersIsFollowedByARecoveryReload(t *testing.T) {
	e, fs := landedEnv(t, func(c *AgentConfig) { c.ReloadTimeout = 500 * time.Millisecond }, nil)
	before := e.c.state("?plan=0")
	reloads := fakeReloads(e.fake)
	silenceNewWorkers(e.fake, 1, 2) // the apply's reload and the recovery's
	next := fs.clone()
	next[ConfigFilePath] += "# 2\n"
	res := e.c.apply(reloadManifest(e, "plan-2", next), next)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Error.Message != errNoNewWorker.Error() {
		t.Fatalf("the reload without a new worker: %s", jsonOf(res))
	}
	if n := fakeReloads(e.fake) - reloads; n < 2 {
		t.Fatalf("%d reloads, want the apply's own and the recovery reload of the tree it found", n)
	}
	if res.Rollback == nil || !res.Rollback.Performed || res.Rollback.Reloaded {
		t.Errorf("rollback %+v, want performed and not reloaded (the recovery's worker did not answer)", res.Rollback)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("the tree was not put back:\n%s", describeSetDiff(e.disk(t), fs))
	}
	waitFor(t, "the pacer's second recovery reload", func() bool {
		st := e.c.state("?plan=0")
		return st.RunningPlanID == before.AppliedPlanID && st.RunningPlanProof == before.AppliedPlanProof
	})
	if n := fakeReloads(e.fake) - reloads; n != 3 {
		t.Errorf("%d reloads, want 3: the apply's, the recovery's, the pacer's", n)
	}
	if st := e.c.state("?plan=0"); !st.HAProxy.SameWorker(e.fake.Worker()) || st.ReloadPendingAt != "" {
		t.Errorf("after the pacer's reload: worker %+v (fake %+v), pending %q", st.HAProxy, e.fake.Worker(), st.ReloadPendingAt)
	}
}
