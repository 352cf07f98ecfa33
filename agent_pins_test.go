// This file owns the tests that pin agent rules a hand-made mutant set
// could break with every other test still green: the base check of a plan
// patch, a plan upload waiting for an apply held inside HAProxy, an owed
// install that keeps its large parts' staged bytes and its answered files
// against a verified read, and files put back at start that stay
// unvouched for until their reload. Each drives the agent through its API.

package haptic

import (
	"bytes"
	"context"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestAPatchCutFromAnotherPlanIsAskedForWhole: a plan patch cut from a plan
// the agent does not hold is answered 409 Missing "plan", through PUT
// /v1/plan and as an apply's plan part. Spliced into the held plan, it
// would be refused by its size or hash (400), and a controller sends the
// whole blob only when asked for it by a Missing.
func TestAPatchCutFromAnotherPlanIsAskedForWhole(t *testing.T) {
	plans := planPatchPlans(3)
	e, c, _ := landWithoutItsPlan(t, plans) // the agent holds plans[0]'s plan
	foreign := planPatchJSON(plans[2], plans[1])
	st, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	query := "?plan_id=" + st.AppliedPlanID + "&proof=" + url.QueryEscape(st.AppliedPlanProof)
	const askedForWhole = `{"missing":["plan"]}` + "\n"
	if code, _, body := e.c.do("PUT", PathPlan+query, bytes.NewReader(foreign), "application/json"); code != http.StatusConflict || string(body) != askedForWhole {
		t.Errorf("PUT of a patch cut from another plan: %d %s", code, body)
	}
	m := reloadDecision(t, c, plans[1], plans[1])
	if code, body := e.c.post(applyRequest{manifest: m, plan: foreign, planPatch: true}); code != http.StatusConflict || string(body) != askedForWhole {
		t.Errorf("an apply whose plan part is a patch cut from another plan: %d %s", code, body)
	}
}

// TestAPlanUploadWaitsForAnApplyHeldInHAProxy: while an apply's op is held
// inside HAProxy, a PUT /v1/plan of the applied plan is not answered; once
// the apply ends it finds the plan moved (409). Stored meanwhile, its
// record of the state from before the apply would follow the apply's own.
func TestAPlanUploadWaitsForAnApplyHeldInHAProxy(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	set := seedFiles()
	p1 := planOfFiles(t, set)
	e.land(t, p1.ID, set)
	st := e.c.state("?plan=0")
	query := "?plan_id=" + st.AppliedPlanID + "&proof=" + url.QueryEscape(st.AppliedPlanProof)
	blob := blobOf(t, p1.Clone())
	next, op := mapEntryChange(set, "held.example", "be-a")
	uploaded := make(chan int, 1)
	holdOn(e.fake, "add map", func() {
		go func() {
			code, _, _ := e.c.do("PUT", PathPlan+query, bytes.NewReader(blob), "")
			uploaded <- code
		}()
		select {
		case code := <-uploaded:
			t.Errorf("the upload was answered %d while an apply's op was held in HAProxy", code)
			uploaded <- code
		case <-time.After(time.Second):
		}
	})
	if res := e.c.apply(e.c.manifest("plan-2", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the held apply: %s", jsonOf(res))
	}
	if code := <-uploaded; code != http.StatusConflict {
		t.Errorf("the upload after the apply: %d, want 409: the plan moved", code)
	}
}

// ackWithAFailedInstall lands set, then ACKs a runtime apply of one more
// map entry whose install the disk refuses (EIO at the rename into place),
// as it does every retry until heal is called. It returns the agent and
// the ACKed set.
func ackWithAFailedInstall(t *testing.T, set fileSet) (e *testEnv, next fileSet, heal func()) {
	t.Helper()
	d := &hookDisk{}
	e = newTestEnvWithDisk(t, d, nil)
	e.land(t, "plan-1", set)
	heal = refuseRenamesOnto(d, filepath.Join(e.a.files.base, "maps/host.map"))
	next, op := mapEntryChange(set, "owed.example", "be-a")
	if res := e.c.apply(e.c.manifest("plan-2", next, op), next); !res.OK || res.AppliedPlanID != "plan-2" {
		t.Fatalf("the apply whose install fails: %s", jsonOf(res))
	}
	return e, next, heal
}

// refuseRenamesOnto makes d refuse every rename onto path (EIO) until heal
// is called.
func refuseRenamesOnto(d *hookDisk, path string) (heal func()) {
	var healed atomic.Bool
	d.setHook(func(op diskOp) error {
		if !healed.Load() && (op.Op == "exchange" || op.Op == "rename") && op.Path == path {
			return &fs.PathError{Op: "renameat2", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	return func() { healed.Store(true) }
}

// TestAnOwedInstallLandsTheStagedBytesOfALargePart: a map over the inline
// limit travels as a staged temp file, which the record names instead of
// carrying its bytes. When its install fails, that temp file is the only
// copy of the ACKed bytes: the retry lands them from it once the disk lets
// it, and the agent is ready again.
func TestAnOwedInstallLandsTheStagedBytesOfALargePart(t *testing.T) {
	set := seedFiles()
	set["maps/host.map"] = bigHostMap(2*maxInlineBytes, "be-a", 0)
	e, next, heal := ackWithAFailedInstall(t, set)
	if code, body := getText(t, e.a, PathReadyz); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz while the install is owed: %d %q", code, body)
	}
	heal()
	if code, body := awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK }); code != http.StatusOK {
		t.Errorf("readyz once the disk takes the install: %d %q", code, body)
	}
	if got := e.disk(t); !sameSet(got, next) {
		t.Errorf("the ACKed large map once the disk lets it in:\n%s", describeSetDiff(got, next))
	}
}

// TestAVerifiedReadKeepsTheAnsweredFilesWhileTheyAreOwed: while the
// install of an ACKed apply is owed, the disk holds the bytes from before
// it; a verified state read re-hashes the tree but adopts none of it: the
// agent keeps reporting the files it answered for, which the retry lands.
func TestAVerifiedReadKeepsTheAnsweredFilesWhileTheyAreOwed(t *testing.T) {
	e, next, heal := ackWithAFailedInstall(t, seedFiles())
	want := DigestString(next["maps/host.map"])
	if e.disk(t)["maps/host.map"] == next["maps/host.map"] {
		t.Fatal("the refused install landed the map")
	}
	if got := e.c.state("?verify=1&plan=0").Files["maps/host.map"].Digest; got != want {
		t.Errorf("a verified read while the install is owed reports the map as %s, the ACKed one is %s", got, want)
	}
	heal()
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if got := e.c.state("?verify=1&plan=0").Files["maps/host.map"].Digest; got != want || !sameSet(e.disk(t), next) {
		t.Errorf("once the install is paid the map is reported as %s (ACKed %s), and on disk:\n%s", got, want, describeSetDiff(e.disk(t), next))
	}
}

// TestFilesPutBackAtStartAreNotRunningUntilTheirReload: the agent is killed
// after a runtime ACK but before its install, and HAProxy restarts
// meanwhile, loading the stale map. The start must put the ACKed map back
// and reload; while the disk refuses that, the state vouches for no
// running plan (the new worker runs the stale map), and once the disk
// takes it the reload runs and the running plan is the applied one again.
func TestFilesPutBackAtStartAreNotRunningUntilTheirReload(t *testing.T) {
	e, set := landedEnv(t, nil, nil)
	next, op := mapEntryChange(set, "back.example", "be-a")
	e.land(t, "plan-2", next, op)
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	mapPath := filepath.Join(e.cfg.BaseDir, "maps/host.map")
	if err := os.WriteFile(mapPath, []byte(set["maps/host.map"]), 0o644); err != nil {
		t.Fatal(err)
	}
	e.fake.With(func(m *FakeModel) { // a new worker, started after plan-2 changed the tree
		m.Pid, m.StartTimeUnixMicros = m.Pid+100, time.Now().UnixMicro()
		m.OnReload(m)
	})
	reloads := fakeReloads(e.fake)
	d := &hookDisk{}
	heal := refuseRenamesOnto(d, mapPath)
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	e.c = newAgentClient(t, e.a)
	if st := e.c.state("?plan=0"); st.AppliedPlanID != "plan-2" || st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("while the start cannot put the map back: applied %q, running %q, worker ops %q; want plan-2 and none running",
			st.AppliedPlanID, st.RunningPlanID, st.WorkerOpsPlanID)
	}
	heal()
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })
	if st := e.c.state("?plan=0"); st.RunningPlanID != "plan-2" || fakeReloads(e.fake) != reloads+1 {
		t.Errorf("once the map is back: running %q after %d reloads, want plan-2 after one", st.RunningPlanID, fakeReloads(e.fake)-reloads)
	}
	workerHoldsMapOf(t, e.fake, next)
}
