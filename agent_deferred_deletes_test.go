// Tests of the deferred-delete queue: splitting an apply's deletes off,
// the caps and the token checks on admission, worker adoption, and, on the
// fake HAProxy or a scripted worker socket, the order of the commands, the
// in-flight item, cancellation, and the confirmed absence of a backend.
//
// It must never sleep to let the queue run: a test blocks the fake on a
// command (blockOn), drains the queue itself, or waits for an outcome it
// can observe (waitFor).

package haptic

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ---------------------------------------------------------------------------
// Deferred deletes (unit).

func TestSplitSeparatesTheDeleteTail(t *testing.T) {
	ops := []Op{
		{Kind: OpBackendUnpublish, Backend: "be-b"},
		{Kind: OpServerDisable, Backend: "be-b", Server: "s1"},
		{Kind: OpServerWaitRemovable, Backend: "be-b", Server: "s1", TimeoutMs: 2000},
		{Kind: OpShutdownSessions, Backend: "be-b", Server: "s1"},
		{Kind: OpServerDel, Backend: "be-b", Server: "s1"},
		{Kind: OpBackendWaitRemovable, Backend: "be-b", TimeoutMs: 2000},
		{Kind: OpBackendDel, Backend: "be-b"},
		{Kind: OpMapSet, Path: "m", Key: "k", Value: "v"},
	}
	inline, servers, backends := splitDeletes(ops)
	if !reflect.DeepEqual(inline, []Op{ops[0], ops[1], ops[7]}) {
		t.Errorf("inline = %+v", inline)
	}
	if !reflect.DeepEqual(servers, []serverRef{{Backend: "be-b", Server: "s1"}}) {
		t.Errorf("servers = %+v", servers)
	}
	if !slices.Equal(backends, []string{"be-b"}) {
		t.Errorf("backends = %v", backends)
	}
	inline, servers, backends = splitDeletes(nil)
	if inline != nil || servers != nil || backends != nil {
		t.Errorf("empty split: %v %v %v", inline, servers, backends)
	}
}

func TestDeferralsRefuseMoreThanTheCap(t *testing.T) {
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), func(string, string) {})
	worker := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1}
	q.setWorker(worker)
	servers := make([]serverRef, MaxPendingServerDeletes+1)
	for i := range servers {
		servers[i] = serverRef{Backend: "be", Server: fmt.Sprintf("s%d", i)}
	}
	backends := make([]string, MaxPendingBackendDeletes+1)
	for i := range backends {
		backends[i] = fmt.Sprintf("be%d", i)
	}
	if err := q.check(servers, nil); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("1001 servers: %v", err)
	}
	if err := q.check(nil, backends); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("101 backends: %v", err)
	}
	if err := q.check(servers[:MaxPendingServerDeletes], backends[:MaxPendingBackendDeletes]); err != nil {
		t.Errorf("at the caps: %v", err)
	}
	// Queued items count: 1000 queued, then one more is refused.
	if err := q.enqueue(worker, servers[:MaxPendingServerDeletes], nil); err != nil {
		t.Fatal(err)
	}
	if err := q.check(servers[MaxPendingServerDeletes:], nil); !errors.Is(err, errDeferralOverflow) || err.Error() == "" {
		t.Errorf("1000 queued + 1: %v", err)
	}
	if err := q.enqueue(worker, servers[MaxPendingServerDeletes:], nil); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("enqueue 1000 queued + 1: %v", err)
	}
	// An item already pending is not added twice, and does not count twice.
	if err := q.enqueue(worker, servers[:10], nil); err != nil {
		t.Errorf("re-enqueue of pending items: %v", err)
	}
	if got := len(q.pending().Servers); got != MaxPendingServerDeletes {
		t.Errorf("%d pending", got)
	}
}

func TestDeferralsRefuseAnUnsafeName(t *testing.T) {
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), func(string, string) {})
	worker := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1}
	q.setWorker(worker)
	for _, tt := range []struct {
		servers  []serverRef
		backends []string
	}{
		{[]serverRef{{Backend: "be-a", Server: "s1;del server be-a/s2"}}, nil},
		{[]serverRef{{Backend: "be a", Server: "s1"}}, nil},
		{[]serverRef{{Backend: "be-a"}}, nil},
		{nil, []string{"be;x"}},
		{nil, []string{""}},
	} {
		if err := q.check(tt.servers, tt.backends); !errors.Is(err, errUnsafeToken) {
			t.Errorf("check(%v, %v) = %v", tt.servers, tt.backends, err)
		}
		if err := q.enqueue(worker, tt.servers, tt.backends); !errors.Is(err, errUnsafeToken) {
			t.Errorf("enqueue(%v, %v) = %v", tt.servers, tt.backends, err)
		}
	}
	p := q.pending()
	if p.Servers == nil || p.Backends == nil || len(p.Servers)+len(p.Backends) != 0 {
		t.Errorf("pending = %#v", p)
	}
}

func TestWorkerAdoptionDetectsTheSamePIDWithANewStartTime(t *testing.T) {
	var counted []string
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), func(kind, outcome string) { counted = append(counted, kind+":"+outcome) })
	old := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_000_000_000}
	q.setWorker(old)
	if err := q.enqueue(old, []serverRef{{Backend: "be-a", Server: "s1"}}, []string{"be-b"}); err != nil {
		t.Fatal(err)
	}
	q.setWorker(old) // the same worker: nothing changes
	if p := q.pending(); len(p.Servers) != 1 || len(p.Backends) != 1 {
		t.Fatalf("same worker dropped work: %+v", p)
	}
	reused := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_001_000_000}
	q.setWorker(reused)
	if p := q.pending(); len(p.Servers)+len(p.Backends) != 0 {
		t.Errorf("a reused pid kept the old worker's work: %+v", p)
	}
	if !slices.Equal(counted, []string{"server:superseded", "backend:superseded"}) {
		t.Errorf("counted %v", counted)
	}
	if err := q.enqueue(old, []serverRef{{Backend: "be-a", Server: "s2"}}, nil); !errors.Is(err, errWorkerGone) {
		t.Errorf("enqueue for the old start time: %v", err)
	}
	if err := q.enqueue(reused, []serverRef{{Backend: "be-a", Server: "s2"}}, nil); err != nil {
		t.Errorf("enqueue for the new worker: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Deferred deletes on the fake.

// queueOn builds a queue bound to the fake's worker, counting outcomes.
func queueOn(t *testing.T, tg *target) (*deleteQueue, *outcomeCounter) {
	r := tg.newRuntime(t, nil)
	counts := &outcomeCounter{}
	q := newDeleteQueue(r, counts.add)
	q.setWorker(tg.fake.Worker())
	return q, counts
}

type outcomeCounter struct {
	mu  sync.Mutex
	got []string
}

func (c *outcomeCounter) add(kind, outcome string) {
	c.mu.Lock()
	c.got = append(c.got, kind+":"+outcome)
	c.mu.Unlock()
}

func (c *outcomeCounter) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// startQueue runs the queue's loop until the test ends and returns a stop
// function that waits for it.
func startQueue(t *testing.T, q *deleteQueue) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		q.start(ctx)
		close(done)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// blockOn makes the fake hold every command with the prefix until the
// returned release is called (also at cleanup); entered receives once per
// held command.
func blockOn(t *testing.T, f *FakeHAProxy, prefix string) (entered <-chan string, release func()) {
	in := make(chan string, 16)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	f.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if strings.HasPrefix(cmd, prefix) {
				in <- cmd
				<-gate
			}
			return "", false
		}
	})
	return in, release
}

func sentIndex(sent []string, cmd string) int { return slices.Index(sent, cmd) }

func TestADeferredDeleteWaitsForTheInlineHalf(t *testing.T) {
	tg := fakeTarget(t, "")
	q, counts := queueOn(t, tg)
	startQueue(t, q)
	ops := []Op{
		{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
		{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: 2000},
		{Kind: OpServerDel, Backend: "be-a", Server: "srv1"},
	}
	inline, servers, backends := splitDeletes(ops)
	if err := q.check(servers, backends); err != nil {
		t.Fatal(err)
	}
	mustExecute(t, q.rt, inline, nil)
	if err := q.enqueue(tg.fake.Worker(), servers, backends); err != nil {
		t.Fatal(err)
	}
	q.wake()
	waitFor(t, "the deletion", func() bool { _, ok := tg.fake.Server("be-a", "srv1"); return !ok })
	sent := tg.fake.Sent()
	disable, wait := sentIndex(sent, "disable server be-a/srv1"), sentIndex(sent, "wait 2000 srv-removable be-a/srv1")
	if disable < 0 || wait < disable || sentIndex(sent, "del server be-a/srv1") < wait {
		t.Errorf("order: %q", sent)
	}
	waitFor(t, "the count", func() bool { return slices.Equal(counts.list(), []string{"server:done"}) })
}

func TestDeferralsShutDownSessionsWhenTheWaitExpires(t *testing.T) {
	tg := fakeTarget(t, "")
	q, counts := queueOn(t, tg)
	tg.fake.With(func(m *FakeModel) { m.BlockedServers = map[string]bool{"be-a/srv1": true} })
	mustExecute(t, q.rt, []Op{{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"}}, nil)
	if err := q.enqueue(tg.fake.Worker(), []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
		t.Fatal(err)
	}
	q.drain(t.Context())
	sent := tg.fake.Sent()
	want := []string{"wait 2000 srv-removable be-a/srv1", "shutdown sessions server be-a/srv1", "wait 2000 srv-removable be-a/srv1", "del server be-a/srv1"}
	if got := sent[len(sent)-4:]; !slices.Equal(got, want) {
		t.Errorf("sent %q", sent)
	}
	if _, ok := tg.fake.Server("be-a", "srv1"); ok {
		t.Error("srv1 still exists")
	}
	if !slices.Equal(counts.list(), []string{"server:done"}) {
		t.Errorf("counted %v", counts.list())
	}
}

func TestADeleteInFlightStaysOutstanding(t *testing.T) {
	tg := fakeTarget(t, "")
	q, _ := queueOn(t, tg)
	entered, release := blockOn(t, tg.fake, "wait 2000 srv-removable be-a/srv1")
	mustExecute(t, q.rt, []Op{{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"}}, nil)
	if err := q.enqueue(tg.fake.Worker(), []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
		t.Fatal(err)
	}
	startQueue(t, q)
	q.wake()
	<-entered
	if p := q.pending(); !slices.Equal(p.Servers, []string{"be-a/srv1"}) {
		t.Errorf("pending %+v", p)
	}
	more := make([]serverRef, MaxPendingServerDeletes)
	for i := range more {
		more[i] = serverRef{Backend: "be-b", Server: fmt.Sprintf("s%d", i)}
	}
	if err := q.check(more, nil); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("in flight + 1000: %v", err)
	}
	if err := q.check(more[1:], nil); err != nil {
		t.Errorf("in flight + 999: %v", err)
	}
	release()
	waitFor(t, "the deletion", func() bool { return len(q.pending().Servers) == 0 })
}

func TestWorkerAdoptionRetiresOnlyOutgoingDeletes(t *testing.T) {
	tg := fakeTarget(t, "")
	q, counts := queueOn(t, tg)
	old := tg.fake.Worker()
	entered, release := blockOn(t, tg.fake, "wait 2000 srv-removable be-a/srv1")
	mustExecute(t, q.rt, []Op{{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"}, {Kind: OpServerDisable, Backend: "be-a", Server: "srv-check"}}, nil)
	refs := []serverRef{{Backend: "be-a", Server: "srv1"}, {Backend: "be-a", Server: "srv-check"}}
	if err := q.enqueue(old, refs, nil); err != nil {
		t.Fatal(err)
	}
	startQueue(t, q)
	q.wake()
	<-entered // srv1 in flight, srv-check queued

	q.setWorker(old)
	if p := q.pending(); len(p.Servers) != 2 {
		t.Fatalf("same-worker adoption changed the queue: %+v", p)
	}
	next := old
	next.WorkerStartTimeUnixMicros += 1_000_000
	q.setWorker(next)
	if p := q.pending(); len(p.Servers) != 0 {
		t.Errorf("pending after a new worker: %+v", p)
	}
	if err := q.enqueue(old, refs, nil); !errors.Is(err, errWorkerGone) {
		t.Errorf("enqueue for the old worker: %v", err)
	}
	release()
	waitFor(t, "the in-flight item", func() bool { return len(counts.list()) == 2 })
	if got := counts.list(); !slices.Equal(got, []string{"server:superseded", "server:superseded"}) {
		t.Errorf("counted %v", got)
	}
	q.wake()
	if p := q.pending(); len(p.Servers) != 0 {
		t.Errorf("the old in-flight item was requeued: %+v", p)
	}
	if slices.Contains(tg.fake.Sent(), "del server be-a/srv1") {
		t.Error("del server was sent for the outgoing worker")
	}
}

func TestDeferredWorkerSessionRejectsIdentityMismatchAndCancels(t *testing.T) {
	t.Run("identity mismatch", func(t *testing.T) {
		tg := fakeTarget(t, "")
		q, counts := queueOn(t, tg)
		if err := q.enqueue(tg.fake.Worker(), []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
			t.Fatal(err)
		}
		tg.fake.With(func(m *FakeModel) { m.StartTimeUnixMicros += 5 }) // HAProxy restarted; the agent has not noticed yet
		q.drain(t.Context())
		if got := counts.list(); !slices.Equal(got, []string{"server:superseded"}) {
			t.Errorf("counted %v", got)
		}
		if len(q.pending().Servers) != 0 || slices.Contains(tg.fake.Sent(), "wait 2000 srv-removable be-a/srv1") {
			t.Errorf("the item ran on another worker: %q", tg.fake.Sent())
		}
	})
	t.Run("cancel", func(t *testing.T) {
		tg := fakeTarget(t, "")
		q, counts := queueOn(t, tg)
		entered, _ := blockOn(t, tg.fake, "wait 2000 srv-removable be-a/srv1")
		if err := q.enqueue(tg.fake.Worker(), []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
			t.Fatal(err)
		}
		stop := startQueue(t, q)
		q.wake()
		<-entered
		stop()
		if got := counts.list(); slices.Contains(got, "server:done") {
			t.Errorf("counted %v", got)
		}
		if slices.Contains(tg.fake.Sent(), "del server be-a/srv1") {
			t.Error("del server sent after cancel")
		}
	})
}

func TestWorkerCancellationInterruptsAnIncompleteReply(t *testing.T) {
	info := HAProxyInfo{WorkerPID: 42, WorkerStartTimeUnixMicros: 1_700_000_000_000_001}
	answered := make(chan struct{}, 1)
	path := scriptedWorker(t, info, func(string) (string, bool) {
		answered <- struct{}{}
		return "[6]: Do", false // a reply that never completes
	})
	r := newHAProxyRuntime(runtimeConfig{WorkerSocket: path})
	counts := &outcomeCounter{}
	q := newDeleteQueue(r, counts.add)
	q.setWorker(info)
	if err := q.enqueue(info, []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
		t.Fatal(err)
	}
	stop := startQueue(t, q)
	q.wake()
	<-answered
	stop() // returns only once the blocked read was interrupted (the session timeout is 30 s)
	if got := counts.list(); slices.Contains(got, "server:done") {
		t.Errorf("counted %v", got)
	}
	if p := q.pending(); !slices.Equal(p.Servers, []string{"be-a/srv1"}) {
		t.Errorf("pending %+v", p)
	}
}

func TestDeferredBackendDeleteDoesNotCrossReload(t *testing.T) {
	tg := fakeTarget(t, "")
	q, counts := queueOn(t, tg)
	tg.fake.With(func(m *FakeModel) { m.Backends["be-b"] = &FakeBackend{Profile: "web", Mode: "http"} })
	entered, release := blockOn(t, tg.fake, "wait 2000 be-removable be-b")
	if err := q.enqueue(tg.fake.Worker(), nil, []string{"be-b"}); err != nil {
		t.Fatal(err)
	}
	startQueue(t, q)
	q.wake()
	<-entered
	if _, err := q.rt.reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	q.setWorker(awaitWorkerAnswer(t, q.rt))
	release()
	waitFor(t, "the in-flight item", func() bool { return len(counts.list()) == 1 })
	if got := counts.list(); !slices.Equal(got, []string{"backend:superseded"}) {
		t.Errorf("counted %v", got)
	}
	if slices.Contains(tg.fake.Sent(), "del backend be-b") || !tg.fake.HasBackend("be-b") {
		t.Errorf("del backend reached a worker: %q", tg.fake.Sent())
	}
}

func TestBackendDeletionRequiresConfirmedAbsence(t *testing.T) {
	const gone = "[3]: Failed. No such backend.\n\n> "
	tests := []struct {
		name              string
		wait, del, verify string
		ok                bool
		sentDel           bool
	}{
		{"deleted and confirmed", "[6]: Done.\n\n> ", "[6]: Backend deleted.\n\n> ", gone, true, true},
		{"already gone", gone, "", "", true, false},
		{"refused", "[6]: Done.\n\n> ", "[3]: This backend cannot be removed at runtime.\n\n> ", "", false, true},
		{"empty delete reply, then absent", "[6]: Done.\n\n> ", "\n> ", gone, true, true},
		{"deleted but still present", "[6]: Done.\n\n> ", "[6]: Backend deleted.\n\n> ", "[6]: Done.\n\n> ", false, true},
		{"empty read-back", "[6]: Done.\n\n> ", "[6]: Backend deleted.\n\n> ", "\n> ", false, true},
		{"another refusal on read-back", "[6]: Done.\n\n> ", "[6]: Backend deleted.\n\n> ", "[3]: Wait delay expired.\n\n> ", false, true},
		{"extra text on read-back", "[6]: Done.\n\n> ", "[6]: Backend deleted.\n\n> ", "[3]: Failed. No such backend.\nmore\n\n> ", false, true},
		{"wait expired", "[3]: Wait delay expired.\n\n> ", "", "", false, false},
		{"wait refused otherwise", "[3]: Usage: wait {-h|<duration>} [condition [args...]]\n\n> ", "", "", false, false},
	}
	info := HAProxyInfo{WorkerPID: 42, WorkerStartTimeUnixMicros: 1_700_000_000_000_002}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var sent []string
			path := scriptedWorker(t, info, func(cmd string) (string, bool) {
				mu.Lock()
				sent = append(sent, cmd)
				mu.Unlock()
				switch cmd {
				case "wait 2000 be-removable be-b":
					return tt.wait, false
				case "del backend be-b":
					return tt.del, false
				case "wait 1 be-removable be-b":
					return tt.verify, false
				}
				return "[3]: unexpected\n\n> ", false
			})
			r := newHAProxyRuntime(runtimeConfig{WorkerSocket: path})
			counts := &outcomeCounter{}
			q := newDeleteQueue(r, counts.add)
			q.setWorker(info)
			if err := q.enqueue(info, nil, []string{"be-b"}); err != nil {
				t.Fatal(err)
			}
			q.drain(t.Context())
			want := "backend:deferred"
			if tt.ok {
				want = "backend:done"
			}
			if got := counts.list(); !slices.Equal(got, []string{want}) {
				t.Errorf("counted %v, want %s", got, want)
			}
			mu.Lock()
			defer mu.Unlock()
			if slices.Contains(sent, "del backend be-b") != tt.sentDel {
				t.Errorf("sent %q", sent)
			}
			if tt.name == "refused" && slices.Contains(sent, "wait 1 be-removable be-b") {
				t.Errorf("an explicit refusal was read back: %q", sent)
			}
		})
	}
}

func TestARequeuePastTheAttemptCapIsAbandoned(t *testing.T) {
	tg := fakeTarget(t, "")
	q, counts := queueOn(t, tg)
	tg.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			return "Only servers in maintenance mode can be deleted.", cmd == "del server be-a/srv1"
		}
	})
	if err := q.enqueue(tg.fake.Worker(), []serverRef{{Backend: "be-a", Server: "srv1"}}, nil); err != nil {
		t.Fatal(err)
	}
	for range MaxDeferredAttempts + 2 {
		q.drain(t.Context())
	}
	want := []string{"server:deferred", "server:deferred", "server:deferred", "server:deferred", "server:abandoned"}
	if got := counts.list(); !slices.Equal(got, want) {
		t.Errorf("counted %v", got)
	}
	if p := q.pending(); len(p.Servers) != 0 {
		t.Errorf("pending %+v", p)
	}
}
