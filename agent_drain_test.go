// Tests of the drain a preStop hook waits on (agent_drain.go), on a
// scripted connection counter: it ends after a quiet period in which the
// count did not change (up or down), stops at its bound under constant
// traffic or a hanging read, answers quiet where the bound holds too,
// returns at once when the worker is gone or the agent stops, shares one
// run between concurrent callers (one that leaves cancels nothing), and
// ignores the frontends it is told to.

package haptic

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"
)

// Small windows keep every drain test well under a second. The poll is
// shrunk with them, in the same 1:20 ratio as the defaults (100 ms : 2 s).
const (
	testDrainPoll    = 5 * time.Millisecond
	testDrainQuiet   = 50 * time.Millisecond
	testDrainMaxWait = 300 * time.Millisecond
	// testDrainSlack is how late past its target a drain may answer on a
	// loaded 2-core machine under the race detector and still count as on
	// time; it only guards against a drain that ignores its bound.
	testDrainSlack = 400 * time.Millisecond
)

// scriptedCounter is the connection counter a drain reads, scripted by a
// function of the call number (from 1) and the time since the first call.
type scriptedCounter struct {
	script func(call int, elapsed time.Duration) (uint64, error)

	mu    sync.Mutex
	start time.Time
	calls int
	last  uint64 // the last value returned without error
}

func (c *scriptedCounter) count(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	if c.calls == 0 {
		c.start = time.Now()
	}
	c.calls++
	call, elapsed := c.calls, time.Since(c.start)
	c.mu.Unlock()

	n, err := c.script(call, elapsed)
	if err == nil {
		c.mu.Lock()
		c.last = n
		c.mu.Unlock()
	}
	return n, err
}

func (c *scriptedCounter) snapshot() (calls int, last uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.last
}

func newTestDrainer(count func(context.Context) (uint64, error), stop <-chan struct{}) *drainer {
	d := newDrainer(count, testDrainQuiet, testDrainMaxWait, stop)
	d.pollInterval = testDrainPoll
	return d
}

// timedDrain runs one drain and returns its result, the wall time it took
// and the parsed Waited field, checking that Waited is a millisecond-rounded
// Go duration.
func timedDrain(t *testing.T, d *drainer) (DrainResult, time.Duration, time.Duration) {
	t.Helper()
	begin := time.Now()
	res := d.drain(context.Background())
	elapsed := time.Since(begin)
	waited, err := time.ParseDuration(res.Waited)
	if err != nil {
		t.Fatalf("waited %q is not a Go duration: %v", res.Waited, err)
	}
	if waited != waited.Round(time.Millisecond) || waited.String() != res.Waited {
		t.Errorf("waited %q is not rounded to the millisecond in Duration.String form", res.Waited)
	}
	return res, elapsed, waited
}

func drainRuns(d *drainer) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.runs
}

func TestDrainEndsAfterTheQuietPeriod(t *testing.T) {
	c := &scriptedCounter{script: func(int, time.Duration) (uint64, error) { return 42, nil }}
	res, elapsed, waited := timedDrain(t, newTestDrainer(c.count, nil))

	if res.Reason != DrainReasonQuiet || res.Connections != 42 {
		t.Fatalf("result %+v, want quiet with 42 connections", res)
	}
	if elapsed < testDrainQuiet || waited < testDrainQuiet {
		t.Errorf("ended after %v (waited %v), before the %v quiet period", elapsed, waited, testDrainQuiet)
	}
	if elapsed >= testDrainMaxWait {
		t.Errorf("ended after %v, not before the %v bound", elapsed, testDrainMaxWait)
	}
}

// The quiet period restarts on every change of the count: a new connection,
// and a count that falls, which is a change too: after a reload the counter
// is the new worker's, which starts again from zero while connections keep
// coming, so a drop says nothing about quiet. The answer carries the last
// count read.
func TestDrainRestartsTheQuietPeriodOnEveryChange(t *testing.T) {
	const traffic, from = 120 * time.Millisecond, 1000
	for _, tc := range []struct {
		name string
		step int
	}{{"a new connection", 1}, {"a count that falls", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			// The count moves on every read until traffic has passed, the
			// last time on the first read at or after it; then it stands still.
			n := uint64(from)
			frozen := false
			c := &scriptedCounter{script: func(_ int, elapsed time.Duration) (uint64, error) {
				if !frozen {
					n += uint64(tc.step)
					frozen = elapsed >= traffic
				}
				return n, nil
			}}
			res, elapsed, waited := timedDrain(t, newTestDrainer(c.count, nil))

			_, last := c.snapshot()
			if res.Reason != DrainReasonQuiet || res.Connections != last {
				t.Fatalf("result %+v, want quiet with the final count %d", res, last)
			}
			if moves := max(last, from) - min(last, from); moves < 3 {
				t.Fatalf("the count moved only %d times; the traffic did not overlap several polls", moves)
			}
			if elapsed < traffic+testDrainQuiet || waited < traffic+testDrainQuiet {
				t.Errorf("ended after %v (waited %v), want at least traffic %v + quiet %v",
					elapsed, waited, traffic, testDrainQuiet)
			}
		})
	}
}

func TestDrainStopsAtTheBoundUnderConstantTraffic(t *testing.T) {
	c := &scriptedCounter{script: func(call int, _ time.Duration) (uint64, error) { return uint64(call) * 10, nil }}
	res, elapsed, waited := timedDrain(t, newTestDrainer(c.count, nil))

	_, last := c.snapshot()
	if res.Reason != DrainReasonBound || res.Connections != last {
		t.Fatalf("result %+v, want bound with the last count %d", res, last)
	}
	if elapsed < testDrainMaxWait || waited < testDrainMaxWait || elapsed > testDrainMaxWait+testDrainSlack {
		t.Errorf("ended after %v (waited %v), want about the %v bound", elapsed, waited, testDrainMaxWait)
	}
}

// A read that hangs (a wedged worker socket) must not hold the preStop hook
// past the bound: the read is cut off there and the answer is bound.
func TestDrainCutsAHangingReadAtTheBound(t *testing.T) {
	calls := 0 // read by the run's goroutine only
	hanging := func(ctx context.Context) (uint64, error) {
		if calls++; calls == 1 {
			return 0, nil
		}
		<-ctx.Done()
		return 0, errors.New("show stat: read unix: i/o timeout")
	}
	res, elapsed, _ := timedDrain(t, newTestDrainer(hanging, nil))

	if res.Reason != DrainReasonBound {
		t.Fatalf("result %+v, want bound", res)
	}
	if elapsed < testDrainMaxWait || elapsed > testDrainMaxWait+testDrainSlack {
		t.Errorf("ended after %v, want about the %v bound", elapsed, testDrainMaxWait)
	}
}

// A read that HAProxy answers only at the bound, with the count unchanged
// since long before, makes the quiet period and the bound hold at once. The
// answer is quiet: the traffic did stop, and bound would tell the hook it
// was cut off with connections still coming.
func TestDrainAnswersQuietWhenTheBoundHoldsToo(t *testing.T) {
	calls := 0 // read by the run's goroutine only
	late := func(ctx context.Context) (uint64, error) {
		if calls++; calls > 1 {
			<-ctx.Done()
		}
		return 7, nil
	}
	res, elapsed, _ := timedDrain(t, newTestDrainer(late, nil))

	if elapsed < testDrainMaxWait {
		t.Fatalf("ended after %v, before the %v bound: the test does not reach the rule", elapsed, testDrainMaxWait)
	}
	if res.Reason != DrainReasonQuiet || res.Connections != 7 {
		t.Errorf("result %+v, want quiet with 7 connections", res)
	}
}

func TestDrainReturnsAtOnceWhenTheWorkerIsGone(t *testing.T) {
	errGone := errors.New("dial unix haproxy-worker.sock: connect: no such file or directory")
	tests := []struct {
		name      string
		script    func(call int, elapsed time.Duration) (uint64, error)
		wantCalls int
		wantConns uint64
	}{
		{
			name:      "first read fails",
			script:    func(int, time.Duration) (uint64, error) { return 0, errGone },
			wantCalls: 1,
			wantConns: 0,
		},
		{
			name: "read fails mid-drain",
			script: func(call int, _ time.Duration) (uint64, error) {
				if call < 4 {
					return 100 + uint64(call), nil
				}
				return 0, errGone
			},
			wantCalls: 4,
			wantConns: 103,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &scriptedCounter{script: tt.script}
			res, elapsed, _ := timedDrain(t, newTestDrainer(c.count, nil))

			calls, _ := c.snapshot()
			if res.Reason != DrainReasonUnavailable || res.Connections != tt.wantConns || calls != tt.wantCalls {
				t.Fatalf("result %+v after %d reads, want unavailable with %d connections after %d reads",
					res, calls, tt.wantConns, tt.wantCalls)
			}
			// The count changes on every good read, so the quiet period never
			// elapsed: answering before it proves the error ended the drain.
			if elapsed >= testDrainQuiet {
				t.Errorf("ended after %v, not at once (before the %v quiet period)", elapsed, testDrainQuiet)
			}
		})
	}
}

// TestDrainEndsWhenTheAgentStops closes the drainer's stop channel, which is
// what the agent does once its drain server has shut down at stop: a drain
// still running then answers cancelled instead of holding the stop up.
func TestDrainEndsWhenTheAgentStops(t *testing.T) {
	traffic := func(call int, _ time.Duration) (uint64, error) { return uint64(call), nil }
	tests := []struct {
		name       string
		stopBefore bool // stop is closed before the drain starts
		count      func(*scriptedCounter) func(context.Context) (uint64, error)
		wantReads  bool // some read succeeded before the stop
	}{
		{
			name:      "while polling",
			count:     func(c *scriptedCounter) func(context.Context) (uint64, error) { return c.count },
			wantReads: true,
		},
		{
			name: "while a read hangs",
			count: func(c *scriptedCounter) func(context.Context) (uint64, error) {
				return func(ctx context.Context) (uint64, error) {
					if calls, _ := c.snapshot(); calls >= 2 {
						<-ctx.Done()
						return 0, ctx.Err()
					}
					return c.count(ctx)
				}
			},
			wantReads: true,
		},
		{
			name:       "already stopped",
			stopBefore: true,
			count:      func(c *scriptedCounter) func(context.Context) (uint64, error) { return c.count },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &scriptedCounter{script: traffic}
			stop := make(chan struct{})
			d := newTestDrainer(tt.count(c), stop)
			if tt.stopBefore {
				close(stop)
			} else {
				time.AfterFunc(3*testDrainPoll, func() { close(stop) })
			}
			res, elapsed, _ := timedDrain(t, d)

			calls, last := c.snapshot()
			if res.Reason != DrainReasonCancelled || res.Connections != last {
				t.Fatalf("result %+v, want cancelled with the last count %d", res, last)
			}
			if tt.wantReads != (calls > 0) {
				t.Errorf("%d reads, want reads: %v", calls, tt.wantReads)
			}
			if elapsed >= testDrainMaxWait {
				t.Errorf("ended after %v, not when the agent stopped", elapsed)
			}
		})
	}
}

func TestDrainCallersShareOneRun(t *testing.T) {
	// The first read waits for the gate, so the run is surely in flight
	// when the second caller arrives.
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	c := &scriptedCounter{script: func(call int, _ time.Duration) (uint64, error) {
		if call == 1 {
			entered <- struct{}{}
			<-gate
		}
		return 7, nil
	}}
	d := newTestDrainer(c.count, nil)

	results := make([]DrainResult, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); results[0] = d.drain(context.Background()) }()
	<-entered
	joined := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); close(joined); results[1] = d.drain(context.Background()) }()
	<-joined
	close(gate)
	wg.Wait()

	if results[0] != results[1] {
		t.Errorf("callers got different results: %+v and %+v", results[0], results[1])
	}
	if results[0].Reason != DrainReasonQuiet || results[0].Connections != 7 {
		t.Errorf("result %+v, want quiet with 7 connections", results[0])
	}
	d.mu.Lock()
	runs, inFlight := d.runs, d.run
	d.mu.Unlock()
	if runs != 1 || inFlight != nil {
		t.Errorf("%d runs, in flight %v; want exactly one finished run", runs, inFlight)
	}
}

func TestDrainCallerThatLeavesDoesNotCancelTheRun(t *testing.T) {
	c := &scriptedCounter{script: func(int, time.Duration) (uint64, error) { return 9, nil }}
	d := newTestDrainer(c.count, nil)

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan DrainResult)
	go func() { left <- d.drain(ctx) }()
	stayed := make(chan DrainResult)
	go func() { stayed <- d.drain(context.Background()) }()

	time.Sleep(testDrainPoll)
	cancel()
	if res := <-left; res.Reason != DrainReasonCancelled {
		t.Errorf("the caller that left got %+v, want cancelled", res)
	}
	if res := <-stayed; res.Reason != DrainReasonQuiet || res.Connections != 9 {
		t.Errorf("the caller that stayed got %+v, want quiet with 9 connections", res)
	}
	if runs := drainRuns(d); runs != 1 {
		t.Errorf("%d runs, want the two callers to share one", runs)
	}
}

func TestDrainStartsAFreshRunAfterOneEnded(t *testing.T) {
	c := &scriptedCounter{script: func(call int, _ time.Duration) (uint64, error) { return uint64(call), nil }}
	d := newTestDrainer(c.count, nil)
	d.maxWait = 2 * testDrainPoll // a short bound under traffic

	first := d.drain(context.Background())
	second := d.drain(context.Background())
	if first.Reason != DrainReasonBound || second.Reason != DrainReasonBound {
		t.Fatalf("results %+v and %+v, want bound twice", first, second)
	}
	if second.Connections <= first.Connections {
		t.Errorf("second run reported %d connections after the first's %d; it reused the old run",
			second.Connections, first.Connections)
	}
	if runs := drainRuns(d); runs != 2 {
		t.Errorf("%d runs, want 2", runs)
	}
}

// TestDrainIgnoresListedFrontends drives the drainer with a counter that
// sums conn_tot the way the runtime layer does (over the show stat rows
// whose svname is FRONTEND and whose pxname is outside the ignore set, an
// empty cell counting 0), over an ignore set built from flag values
// the way the agent builds it. Traffic only on the ignored probe frontends
// must still end quiet.
//
// The runtime layer and the fake HAProxy's frontend counters are not on main
// yet; once they are, this test should read through
// haproxyRuntime.frontendConnections against FakeHAProxy.Frontends.
func TestDrainIgnoresListedFrontends(t *testing.T) {
	tests := []struct {
		name       string
		ignore     []string
		wantReason string
		wantConns  uint64
	}{
		{"probe frontends ignored", []string{"status", " healthz,"}, DrainReasonQuiet, 10},
		{"nothing ignored", nil, DrainReasonBound, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ignore := drainIgnoreSet(tt.ignore)
			var mu sync.Mutex
			connTot := map[string]uint64{"status": 0, "healthz": 0, "http-tcp": 10}
			count := func(context.Context) (uint64, error) {
				mu.Lock()
				defer mu.Unlock()
				// Every read sees new probe connections, never new traffic.
				connTot["status"]++
				connTot["healthz"] += 2
				var sum uint64
				for fe, n := range connTot {
					if !ignore[fe] {
						sum += n
					}
				}
				return sum, nil
			}
			res, _, _ := timedDrain(t, newTestDrainer(count, nil))

			if res.Reason != tt.wantReason {
				t.Fatalf("result %+v, want %s", res, tt.wantReason)
			}
			if tt.wantConns != 0 && res.Connections != tt.wantConns {
				t.Errorf("connections %d, want %d", res.Connections, tt.wantConns)
			}
		})
	}
}

func TestDrainIgnoreSetSplitsCommaLists(t *testing.T) {
	tests := []struct {
		values []string
		want   map[string]bool
	}{
		{nil, nil},
		{[]string{""}, nil},
		{[]string{" , ,"}, nil},
		{[]string{"status"}, map[string]bool{"status": true}},
		{[]string{"status,healthz"}, map[string]bool{"status": true, "healthz": true}},
		{[]string{"status", " healthz , stats,", "status"},
			map[string]bool{"status": true, "healthz": true, "stats": true}},
	}
	for _, tt := range tests {
		if got := drainIgnoreSet(tt.values); !maps.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("drainIgnoreSet(%q) = %v, want %v", tt.values, got, tt.want)
		}
	}
}
