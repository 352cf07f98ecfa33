// Real-HAProxy tests of a render whose stats socket is not the agent's
// worker socket (a haproxy.cfg copied from another host): the push ends
// within seconds, naming the agent's socket and the render's, the old
// configuration keeps serving, and no socket of the render's worker is left
// behind. They run on the binary HAPTIC_HAPROXY names and skip without it.

package haptic

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mismatchBound is what a push of a render whose worker the agent cannot
// reach may take; before the fix it took the whole reload timeout.
const mismatchBound = 5 * time.Second

// elsewhereRender is set with its stats socket moved from the agent's
// worker socket to <dir>/other.sock, written as line writes it.
func elsewhereRender(t *testing.T, e *realLedgerEnv, set fileSet, line func(other string) string) (fileSet, string) {
	t.Helper()
	other := filepath.Join(e.h.Dir, "other.sock")
	was := "stats socket " + e.h.WorkerSocket() + " "
	if !strings.Contains(set[ConfigFilePath], was) {
		t.Fatalf("the fixture's config has no %q line", was)
	}
	next := set.clone()
	next[ConfigFilePath] = strings.Replace(set[ConfigFilePath], was, line(other)+" ", 1)
	return next, other
}

// pushWithin sends next as a reload and returns the answer, failing the
// test when it took longer than mismatchBound.
func pushWithin(t *testing.T, e *realLedgerEnv, next fileSet) (int, []byte) {
	t.Helper()
	m := e.c.manifest("plan-elsewhere", next)
	m.Mode = ModeReload
	start := time.Now()
	code, body := e.c.post(applyRequest{manifest: m, files: next})
	took := time.Since(start)
	t.Logf("%s: the push took %v: %d %s", e.h.Version(), took, code, body)
	if took > mismatchBound {
		t.Errorf("the push took %v, more than %v", took, mismatchBound)
	}
	return code, body
}

// oldSetServes checks that the worker answering the agent's socket serves
// set as it did before, and that the tree holds it.
func oldSetServes(t *testing.T, e *realLedgerEnv, set fileSet) {
	t.Helper()
	if got := diskSet(t, e.h.Dir); !sameSet(got, set) {
		t.Errorf("the tree is not the set before the push: %v", got.paths())
	}
	if realWorkerPID(e.h) == 0 {
		t.Fatalf("no worker answers the agent's socket %s", e.h.WorkerSocket())
	}
	workerServesMapOf(t, e.h, set)
}

// TestRealARenderWithAnotherStatsSocketIsRefusedBeforeTheReload: the
// render declares only an absolute stats socket other than the agent's,
// where the configuration it replaces declares the agent's. The push is
// refused at stage parts within seconds, naming both sockets, nothing is
// installed or reloaded, and no other.sock appears.
func TestRealARenderWithAnotherStatsSocketIsRefusedBeforeTheReload(t *testing.T) {
	e := startRealLedgerEnv(t, 60*time.Second)
	e.land(t, "plan-1", e.fs)
	pid := realWorkerPID(e.h)
	next, other := elsewhereRender(t, e, e.fs, func(other string) string { return "stats socket " + other })
	code, body := pushWithin(t, e, next)
	if code != http.StatusBadRequest {
		t.Fatalf("answer %d %s, want 400", code, body)
	}
	ae := applyErr(t, body)
	if ae.Stage != StageParts || !strings.Contains(ae.Message, e.h.WorkerSocket()) || !strings.Contains(ae.Message, other) {
		t.Errorf("error %+v does not name the agent's socket %s and the render's %s at stage parts", ae, e.h.WorkerSocket(), other)
	}
	if got := realWorkerPID(e.h); got != pid {
		t.Errorf("worker %d answers, want %d: nothing may be reloaded", got, pid)
	}
	oldSetServes(t, e, e.fs)
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Errorf("%s exists (%v): no worker may have bound it", other, err)
	}
}

// TestRealAReloadedWorkerOffTheAgentsSocketIsRolledBackFast: the render
// quotes its stats socket, which the agent does not judge (HAProxy expands
// environment variables inside quotes), so HAProxy reloads it and its new
// worker listens on other.sock only. The push ends within seconds, rolled
// back, its error naming the agent's socket and the socket the worker
// listens on; the restored configuration serves on the agent's socket and
// other.sock is gone.
func TestRealAReloadedWorkerOffTheAgentsSocketIsRolledBackFast(t *testing.T) {
	e := startRealLedgerEnv(t, 60*time.Second)
	e.land(t, "plan-1", e.fs)
	pid := realWorkerPID(e.h)
	next, other := elsewhereRender(t, e, e.fs, func(other string) string { return `stats socket "` + other + `"` })
	code, body := pushWithin(t, e, next)
	if code != http.StatusOK {
		t.Fatalf("answer %d %s, want 200", code, body)
	}
	var res ApplyResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if res.OK || res.Error == nil || res.Error.Stage != StageReload ||
		!strings.Contains(res.Error.Message, e.h.WorkerSocket()) || !strings.Contains(res.Error.Message, "unix@"+other) {
		t.Errorf("answer %s: want a NACK at stage reload naming %s and unix@%s", jsonOf(res), e.h.WorkerSocket(), other)
	}
	if res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
		t.Errorf("rollback %s: want the restored set reloaded", jsonOf(res.Rollback))
	}
	if got := realWorkerPID(e.h); got == pid || got != res.HAProxy.WorkerPID {
		t.Errorf("worker %d answers; before %d, the answer names %d", got, pid, res.HAProxy.WorkerPID)
	}
	oldSetServes(t, e, e.fs)
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Errorf("%s is left behind (%v)", other, err)
	}
}
