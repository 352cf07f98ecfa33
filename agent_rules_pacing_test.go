// This file owns the tests that pin the rules of a scheduled reload
// (agent_pacing.go, and the join in agent_apply_run.go): the pacer never
// reloads while the files of an acknowledged apply are owed, a scheduled
// reload that gets no verdict while the agent runs is undone and reported,
// and then its restored tree is reloaded, and an apply that joins a pending
// reload answers that reload's time. Each drives the agent through its API,
// moving the agent's clock past the pacing window instead of waiting it out.

package haptic

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pastTheWindow moves the agent's clock past a pacing window of a minute,
// so that the pending reload is due.
func pastTheWindow(a *Agent) { a.clockOffset.Store(int64(2 * time.Minute)) }

// TestThePacerDoesNotReloadWhileAnACKedInstallIsOwed: a reload apply is
// answered as scheduled, and the agent is killed; its config's rename was
// lost with the page cache. The start must put the ACKed config back, and
// the disk refuses, so it is owed. The scheduled reload falls due: the
// pacer must not reload HAProxy onto the tree without the config it
// promised, and it is reloaded once the disk lets the config in.
func TestThePacerDoesNotReloadWhileAnACKedInstallIsOwed(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	fs, fs2, _ := e.landThenSchedule(t)
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	cfg := filepath.Join(e.cfg.BaseDir, ConfigFilePath)
	if err := os.WriteFile(cfg, []byte(fs[ConfigFilePath]), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &hookDisk{}
	heal := refuseRenamesOnto(d, cfg)
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	e.c = newAgentClient(t, e.a)
	if st := e.c.state("?plan=0"); st.AppliedPlanID != "plan-2" || st.ReloadPendingAt == "" {
		t.Fatalf("after the start: applied %q, pending %q; want plan-2 still pending", st.AppliedPlanID, st.ReloadPendingAt)
	}
	reloads := fakeReloads(e.fake)
	pastTheWindow(e.a)
	e.a.fireScheduled(context.Background())
	if n := fakeReloads(e.fake); n != reloads {
		t.Errorf("the pacer reloaded HAProxy %d times onto a tree that lacks the ACKed config", n-reloads)
	}
	if got := e.disk(t)[ConfigFilePath]; got != fs[ConfigFilePath] {
		t.Fatalf("the config is %q: the disk did not refuse it, and the test does not reach the rule", got)
	}
	heal()
	// Whichever pays the debt first, the retry or the pacer, HAProxy then
	// loads the tree with the ACKed config.
	waitFor(t, "a reload once the config is in place", func() bool {
		st := e.c.state("?plan=0")
		return st.RunningPlanID == "plan-2" && st.ReloadPendingAt == ""
	})
	if fakeReloads(e.fake) == reloads {
		t.Error("the worker runs plan-2 without a reload")
	}
	if got := e.disk(t); !sameSet(got, fs2) {
		t.Errorf("the tree after the scheduled reload:\n%s", describeSetDiff(got, fs2))
	}
}

// scheduledReloadWithoutAVerdict lands plan-1, schedules plan-2, and lets
// the pacer fire it on a fake whose first reload starts a worker that never
// answers within the reload timeout. It returns the env, plan-1's set, the
// fake's reload count before the pacer fired, and the pacer's result.
func scheduledReloadWithoutAVerdict(t *testing.T) (e *testEnv, fs fileSet, reloads int, la *ApplyResult) {
	t.Helper()
	e = newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin, c.ReloadTimeout = time.Minute, 500*time.Millisecond }, nil)
	fs, _, _ = e.landThenSchedule(t)
	reloads = fakeReloads(e.fake)
	silenceNewWorkers(e.fake, 1)
	pastTheWindow(e.a)
	waitFor(t, "the pacer's result", func() bool {
		la = e.c.state("").LastApply
		return la != nil && la.Mode != ResultScheduled
	})
	return e, fs, reloads, la
}

// TestAScheduledReloadWithoutAVerdictIsUndoneAndReported: the pacer's
// reload gets no verdict (no new worker answers) while the agent runs.
// That is not a shutdown cutting it short, after which the pending reload
// waits for the next start: the agent puts back the tree the pending
// reload's applies found and reports the failure in last_apply.
func TestAScheduledReloadWithoutAVerdictIsUndoneAndReported(t *testing.T) {
	e, fs, _, la := scheduledReloadWithoutAVerdict(t)
	if la.PlanID != "plan-2" || la.OK || la.Mode != ResultRejected || la.Error == nil || la.Error.Stage != StageScheduledReload ||
		la.Error.Message != errNoNewWorker.Error() || la.Rollback == nil || !la.Rollback.Performed {
		t.Fatalf("last_apply %s, want plan-2 rejected at the scheduled reload, rolled back", jsonOf(la))
	}
	if st := e.c.state("?plan=0"); st.AppliedPlanID != "plan-1" || st.ReloadPendingAt != "" {
		t.Errorf("state: applied %q, pending %q; want plan-1 and nothing pending", st.AppliedPlanID, st.ReloadPendingAt)
	}
	if got := e.disk(t); !sameSet(got, fs) {
		t.Errorf("the tree was not put back:\n%s", describeSetDiff(got, fs))
	}
}

// TestTheTreeAScheduledReloadWithoutAVerdictRestoredIsReloaded: the worker
// that never answered may still be serving the set the undo took off the
// disk, so the agent reloads the restored tree, and the worker then runs
// the plan the pending reload's applies found.
func TestTheTreeAScheduledReloadWithoutAVerdictRestoredIsReloaded(t *testing.T) {
	e, _, reloads, la := scheduledReloadWithoutAVerdict(t)
	if la.Rollback == nil || !la.Rollback.Reloaded {
		t.Errorf("rollback %s: the restored tree was not reloaded", jsonOf(la.Rollback))
	}
	if n := fakeReloads(e.fake); n != reloads+2 {
		t.Errorf("%d reloads, want 2: the scheduled one and the recovery reload of the restored tree", n-reloads)
	}
	if st := e.c.state("?plan=0"); st.RunningPlanID != "plan-1" || !st.HAProxy.SameWorker(e.fake.Worker()) {
		t.Errorf("state: running %q on worker %+v (fake %+v); want plan-1 on the recovery's worker", st.RunningPlanID, st.HAProxy, e.fake.Worker())
	}
}

// TestAnApplyJoiningAPendingReloadAnswersItsTime: a pending reload survives
// a restart, after which the agent's own pacing window says a reload could
// come at once. An apply that joins the pending reload answers that
// reload's time, never one of its own: a pending reload is never moved.
func TestAnApplyJoiningAPendingReloadAnswersItsTime(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	_, fs2, scheduled := e.landThenSchedule(t)
	e.restart(t)
	fs3 := fs2.clone()
	fs3["maps/host.map"] += "joined.example be-j\n"
	res := e.c.apply(e.c.manifest("plan-3", fs3), fs3)
	if !res.OK || res.Mode != ResultScheduled || res.Reload == nil || res.Reload.ScheduledAt != scheduled.Reload.ScheduledAt {
		t.Errorf("the joining apply: %s; want scheduled at %s", jsonOf(res), scheduled.Reload.ScheduledAt)
	}
	if st := e.c.state(""); st.ReloadPendingAt != scheduled.Reload.ScheduledAt {
		t.Errorf("the pending reload moved from %s to %s", scheduled.Reload.ScheduledAt, st.ReloadPendingAt)
	}
}

// TestAFailedRecoveryAfterAScheduledReloadIsCounted: when the reload of the
// tree put back after a scheduled reload without a verdict gets no verdict
// either, the worker may serve the set the undo took off the disk, a
// configuration nobody chose: the recovery_reload invariant counts it, as
// after an apply's own failed recovery, so that the alert that pages on it
// fires.
func TestAFailedRecoveryAfterAScheduledReloadIsCounted(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin, c.ReloadTimeout = time.Minute, 500*time.Millisecond }, nil)
	e.landThenSchedule(t)
	silenceNewWorkers(e.fake, 1, 2)
	pastTheWindow(e.a)
	var la *ApplyResult
	waitFor(t, "the pacer's result", func() bool {
		la = e.c.state("").LastApply
		return la != nil && la.Mode != ResultScheduled
	})
	if la.Rollback == nil || la.Rollback.Reloaded {
		t.Errorf("rollback %s: want the restored tree's reload to have failed", jsonOf(la.Rollback))
	}
	if n := metricValue(e.a, "invariant_violations_total", invRecoveryReload); n != 1 {
		t.Errorf("recovery_reload counted %d times, want 1", n)
	}
}
