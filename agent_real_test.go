// TestRealHAProxyEndToEnd runs the agent against the real HAProxy binary
// named by HAPTIC_HAPROXY, in master-worker mode with the fixture that
// startRealHAProxy writes (a map, a certificate, a CA and a crt-list), and
// is skipped without it.

package haptic

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRealHAProxyEndToEnd(t *testing.T) {
	h := startRealHAProxy(t)
	atLeast30 := CapsFor(h.Version(), nil).DynamicServers // HAProxy 3.0 and later
	a := startTestAgent(t, nil, func(c *AgentConfig) {
		c.BaseDir = h.Dir
		c.WorkerSocket, c.MasterSocket = h.WorkerSocket(), h.MasterSocket()
		c.ReloadTimeout = 20 * time.Second
	})
	c := newAgentClient(t, a)
	fs := fileSet{}
	for _, p := range []string{"haproxy.cfg", "maps/host.map", "certs/a.pem", "certs/ca.pem", "certs/list.txt"} {
		b, err := os.ReadFile(filepath.Join(h.Dir, p))
		if err != nil {
			t.Fatal(err)
		}
		fs[p] = string(b)
	}

	// The first apply reloads, and the new worker answers.
	before := c.state("").HAProxy
	res := c.apply(c.manifest("plan-1", fs), fs)
	if !res.OK || res.Mode != ResultReload || res.Reload.WorkerPID == 0 || res.HAProxy.SameWorker(before) {
		t.Fatalf("first apply: %+v\n%s", res, h.Output())
	}
	info, err := a.rt.info(t.Context())
	if err != nil || !info.SameWorker(res.HAProxy) {
		t.Fatalf("the new worker: %+v %v", info, err)
	}

	// A runtime map apply lands without a reload and passes the read-back.
	fs2 := fs.clone()
	fs2["maps/host.map"] += "c.example.com be-c\n"
	res = c.apply(c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "c.example.com", Value: "be-c"}), fs2)
	if !res.OK || res.Mode != ResultRuntime || !res.HAProxy.SameWorker(info) {
		t.Fatalf("runtime apply: %+v %+v", res, res.OpResults)
	}
	awaitReadBacks(a)
	if n := metricValue(a, "map_divergence_total"); n != 0 {
		t.Errorf("the read-back found %d divergences", n)
	}
	entries, err := a.rt.mapEntries(t.Context(), "maps/host.map")
	if err != nil || len(entries["c.example.com"]) != 1 {
		t.Errorf("worker map: %v %v", entries, err)
	}

	// A configuration HAProxy refuses is rolled back, in HAProxy's words
	// where the master gives them (Success=0 and its log, from 2.7).
	fs3 := fs2.clone()
	fs3["haproxy.cfg"] = strings.Replace(fs2["haproxy.cfg"], "frontend status\n", "frontend status\n    bogus_keyword\n", 1)
	m := c.manifest("plan-3", fs3)
	m.Mode = ModeReload
	res = c.apply(m, fs3)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("refused config: %+v %+v", res, res.Error)
	}
	if atLeast30 && !strings.Contains(res.Error.Message, "bogus_keyword") {
		t.Errorf("the message does not carry HAProxy's words: %q", res.Error.Message)
	}
	if got := diskSet(t, h.Dir); got["haproxy.cfg"] != fs2["haproxy.cfg"] {
		t.Error("the refused config was not rolled back")
	}

	// The deferred delete of a server completes (wait srv-removable needs 3.0).
	if !atLeast30 {
		t.Logf("HAProxy %s has no wait srv-removable; the deferred delete is not exercised", h.Version())
		return
	}
	m = c.manifest("plan-4", fs2,
		Op{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
		Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: 1000},
		Op{Kind: OpServerDel, Backend: "be-a", Server: "srv1"})
	m.Mode = ModeReload
	c.apply(m, fs2) // a reload: the applied baseline was cleared by the NACK
	m = c.manifest("plan-5", fs2,
		Op{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
		Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: 1000},
		Op{Kind: OpServerDel, Backend: "be-a", Server: "srv1"})
	res = c.apply(m, fs2)
	if !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("delete apply: %+v %+v", res, res.OpResults)
	}
	waitFor(t, "the deferred delete", func() bool {
		names, err := a.rt.serverNames(t.Context(), "be-a")
		_, present := names["srv1"]
		return err == nil && !present
	})
	// The queue counts the delete once it has confirmed it, a moment after
	// the server is gone from the worker.
	waitFor(t, "the deferred delete counted", func() bool {
		return metricValue(a, "deferred_deletes_total", "server", "done") >= 1
	})
	if v := metricValue(a, "deferred_deletes_total", "server", "done"); v != 1 {
		t.Errorf("deferred_deletes_total{server,done} = %v, want 1", v)
	}
}
