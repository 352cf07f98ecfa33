// This file owns the proof that dynamic backends work end to end on a real
// HAProxy 3.4 (HAPTIC_HAPROXY), through Deploy and the agent, judged by
// real HTTP traffic to Go backends: a backend added with its servers and
// published serves; a rename keeps every request answered; a removal
// unpublishes at once and deletes once the connections drained; a name
// still held by a pending delete falls back to a reload, which retires
// the delete; 65 backends go in one apply. It skips on versions without
// dynamic backends.
//
// It must never talk to an HAProxy HAPTIC_HAPROXY did not name, never send
// traffic outside 127.0.0.1, and never write the agent's files itself: the
// renders go through Deploy, as a controller's do.

package haptic

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// backendNames lists the backends `show backend` reports.
func (e *e2eEnv) backendNames(t testing.TB) []string {
	t.Helper()
	reply, _ := socketExchange(t, e.h.WorkerSocket(), "show backend\n", 5*time.Second)
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(reply), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	return names
}

// holdSlow sends /slow requests for host until each of targets holds one,
// and returns the channels every request's answer arrives on, once their
// backends release them. The balancing decides where each request lands,
// so targets must be every server of the host's backend, and a request
// may land on a target that already holds one.
func (e *e2eEnv) holdSlow(t testing.TB, host string, targets ...*e2eBackend) []<-chan e2eAnswer {
	t.Helper()
	var answers []<-chan e2eAnswer
	held := make([]bool, len(targets))
	for sent := 0; slices.Contains(held, false); sent++ {
		if sent == 8*len(targets) {
			t.Fatalf("%d /slow requests for %s, and not every backend holds one: %v", sent, host, held)
		}
		answer := make(chan e2eAnswer, 1)
		go func() { answer <- e.get(host, "/slow") }()
		answers = append(answers, answer)
	landed:
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			for i, b := range targets {
				select {
				case <-b.slowIn:
					held[i] = true
					break landed
				default:
				}
			}
		}
	}
	return answers
}

// awaitDeletes waits until the agent has counted n more deferred deletes
// of kind with outcome than it had at from.
func awaitDeletes(t testing.TB, a *Agent, kind, outcome string, from, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s deletes %s", n, kind, outcome), func() bool {
		return metricValue(a, "deferred_deletes_total", kind, outcome) >= from+n
	})
}

func TestRealHAProxyDynamicBackends(t *testing.T) {
	e := startE2E(t, nil)
	if !e.caps.DynamicBackends {
		t.Skipf("HAProxy %s has no dynamic backends", e.h.Version())
	}
	var gammas []*e2eBackend
	for i := range 5 {
		gammas = append(gammas, startE2EBackend(t, fmt.Sprintf("gamma%d", i+1)))
	}
	current := e.firstRender(t)
	expectMode(t, e.deploy(t, e.plan(current)), ResultReload)
	pid := e.workerPID(t)
	deploy := func(t *testing.T, next e2eRender, mode string) *ApplyResult {
		t.Helper()
		res := e.deploy(t, e.plan(next))
		expectMode(t, res, mode)
		if got := e.workerPID(t); mode == ResultRuntime && got != pid {
			t.Fatalf("worker pid changed from %d to %d", pid, got)
		}
		current, pid = next, e.workerPID(t)
		return res
	}
	withGammas := func(gs ...*e2eBackend) func(*e2eRender) {
		return func(r *e2eRender) {
			r.servers["be-c"] = nil
			for _, g := range gs {
				r.servers["be-c"] = append(r.servers["be-c"], e2eServer{name: g.name, port: g.port})
			}
			r.hostMap += "c.test be-c\n"
		}
	}
	gammaOnly := func(c map[string]int) bool {
		for k := range c {
			if !strings.HasPrefix(k, "gamma") {
				return false
			}
		}
		return len(c) > 0
	}

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"a backend added with its servers is published and serves", func(t *testing.T) {
			res := deploy(t, current.with(withGammas(gammas[:2]...)), ResultRuntime)
			want := []string{OpBackendAdd, OpServerAdd, OpServerEnable, OpServerAdd, OpServerEnable, OpBackendPublish, OpMapAdd}
			if got := resultOpKinds(res); !slices.Equal(got, want) {
				t.Fatalf("ops %v, want %v", got, want)
			}
			e.expectTraffic(t, "c.test", "gamma1 and gamma2", func(c map[string]int) bool {
				return len(c) == 2 && c["gamma1"] > 0 && c["gamma2"] > 0
			})
		}},
		{"a rename keeps every request answered", func(t *testing.T) {
			before := metricValue(e.a, "deferred_deletes_total", "backend", "done")
			var mu sync.Mutex
			probe := map[string]int{}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					a := e.get("b.test", "/")
					key := a.backend
					if a.err != nil || a.status != http.StatusOK {
						key = fmt.Sprintf("failed: %v status %d", a.err, a.status)
					}
					mu.Lock()
					probe[key]++
					mu.Unlock()
				}
			}()
			time.Sleep(100 * time.Millisecond)
			next := current.with(func(r *e2eRender) {
				r.servers["be-b2"] = r.servers["be-b"]
				delete(r.servers, "be-b")
				r.hostMap = strings.Replace(r.hostMap, "b.test be-b\n", "b.test be-b2\n", 1)
			})
			deploy(t, next, ResultRuntime)
			awaitDeletes(t, e.a, "backend", "done", before, 1)
			time.Sleep(100 * time.Millisecond)
			close(stop)
			wg.Wait()
			if len(probe) != 1 || probe["beta"] == 0 {
				t.Fatalf("the probe saw %v, want beta only", probe)
			}
			if names := e.backendNames(t); slices.Contains(names, "be-b") || !slices.Contains(names, "be-b2") {
				t.Fatalf("backends %v after the rename", names)
			}
		}},
		{"a removal unpublishes at once and deletes once the connections drained", func(t *testing.T) {
			before := metricValue(e.a, "deferred_deletes_total", "backend", "done")
			held := e.holdSlow(t, "c.test", gammas[:2]...)
			next := current.with(func(r *e2eRender) {
				delete(r.servers, "be-c")
				r.hostMap = strings.Replace(r.hostMap, "c.test be-c\n", "", 1)
			})
			res := deploy(t, next, ResultRuntime)
			want := []string{OpMapDel, OpBackendUnpublish, OpServerDisable, OpServerDisable}
			if got := resultOpKinds(res); !slices.Equal(got, want) {
				t.Fatalf("inline ops %v, want %v", got, want)
			}
			e.expectTraffic(t, "c.test", "alpha only (the map's default)", onlyBackend("alpha"))
			if names := e.backendNames(t); !slices.Contains(names, "be-c") {
				t.Fatalf("be-c deleted while a request was still in flight: %v", names)
			}
			if p := e.state(t).PendingDeletes; !slices.Contains(p.Backends, "be-c") {
				t.Fatalf("pending deletes %+v, want be-c", p)
			}
			time.Sleep(300 * time.Millisecond)
			gammas[0].releaseSlow()
			gammas[1].releaseSlow()
			for _, h := range held {
				if a := <-h; a.err != nil || a.status != http.StatusOK || !strings.HasPrefix(a.backend, "gamma") {
					t.Fatalf("a held request did not drain: %+v (%v)", a, a.err)
				}
			}
			awaitDeletes(t, e.a, "backend", "done", before, 1)
			if names := e.backendNames(t); slices.Contains(names, "be-c") {
				t.Fatalf("be-c still present: %v", names)
			}
		}},
		{"a name a pending delete still holds falls back to a reload, which retires the delete", func(t *testing.T) {
			deploy(t, current.with(withGammas(gammas[2:]...)), ResultRuntime)
			superseded := metricValue(e.a, "deferred_deletes_total", "backend", "superseded")
			// One request held on each server keeps each server delete
			// waiting its full 2 s, so be-c stays pending for seconds.
			held := e.holdSlow(t, "c.test", gammas[2:]...)
			removed := current.with(func(r *e2eRender) {
				delete(r.servers, "be-c")
				r.hostMap = strings.Replace(r.hostMap, "c.test be-c\n", "", 1)
			})
			readded := current
			deploy(t, removed, ResultRuntime)
			res := e.deploy(t, e.plan(readded))
			expectMode(t, res, ResultReload)
			if len(res.OpResults) == 0 || res.OpResults[0].Kind != OpBackendAdd || res.OpResults[0].OK ||
				!strings.Contains(res.OpResults[0].Output, "already used by other proxy") {
				t.Fatalf("op results %+v, want a refused backend_add", res.OpResults)
			}
			if got := e.workerPID(t); got == pid {
				t.Fatalf("worker pid %d unchanged: no reload", got)
			}
			current, pid = readded, e.workerPID(t)
			awaitDeletes(t, e.a, "backend", "superseded", superseded, 1)
			if p := e.state(t).PendingDeletes; len(p.Backends) != 0 {
				t.Fatalf("pending deletes %+v after the reload", p)
			}
			for _, g := range gammas {
				g.releaseSlow()
			}
			for _, h := range held {
				<-h // served or cut by the old worker: either way it ends
			}
			e.awaitTraffic(t, "c.test", "gamma servers", gammaOnly)
		}},
		{"65 backends are deleted in one apply", func(t *testing.T) {
			const n = 65
			many := current.with(func(r *e2eRender) {
				for i := range n {
					r.servers[fmt.Sprintf("be-n%02d", i)] = []e2eServer{{name: "s", port: gammas[0].port}}
				}
			})
			deploy(t, many, ResultRuntime)
			if names := e.backendNames(t); !slices.Contains(names, "be-n00") || !slices.Contains(names, fmt.Sprintf("be-n%02d", n-1)) {
				t.Fatalf("backends after the adds: %v", names)
			}
			before := metricValue(e.a, "deferred_deletes_total", "backend", "done")
			res := deploy(t, current.with(func(r *e2eRender) {
				for i := range n {
					delete(r.servers, fmt.Sprintf("be-n%02d", i))
				}
			}), ResultRuntime)
			if got := len(resultOpKinds(res)); got != 2*n {
				t.Fatalf("%d inline ops, want %d (unpublish and disable per backend)", got, 2*n)
			}
			awaitDeletes(t, e.a, "backend", "done", before, n)
			if names := e.backendNames(t); slices.ContainsFunc(names, func(s string) bool { return strings.HasPrefix(s, "be-n") }) {
				t.Fatalf("backends left: %v", names)
			}
			if p := e.state(t).PendingDeletes; len(p.Backends)+len(p.Servers) != 0 {
				t.Fatalf("pending deletes %+v", p)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
	if v := e.state(t).InvariantViolation; v != "" {
		t.Fatalf("invariant violation %q", v)
	}
}
