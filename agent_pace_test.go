// This file owns what clients that send or read slowly may cost the current
// leader: connections that send most of a body at full speed and then a
// byte now and then (a valid controller's plan upload, a deposed leader's
// manifest) keep no leader push waiting, and readers of a big state answer
// that never read keep the agent within its memory bound.

package haptic

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
)

// slowSender sends requests, each on a connection of its own from the
// address from: the head (request line, headers and the body's start) at
// full speed, then one byte every trickle. As soon as the agent answers or
// cuts a connection, it opens the next, until stop closes.
type slowSender struct {
	addr    string
	from    net.IP
	head    []byte
	trickle time.Duration
	ended   atomic.Int64 // connections the agent answered or cut
}

func (s *slowSender) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: s.from}}).Dial("tcp", s.addr)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		answered := make(chan struct{})
		go func() {
			c.Read(make([]byte, 1)) // the answer's first byte, or the close
			close(answered)
		}()
		c.Write(s.head)
		tick := time.NewTicker(s.trickle)
	trickling:
		for {
			select {
			case <-stop:
				tick.Stop()
				c.Close()
				return
			case <-answered:
				break trickling
			case <-tick.C:
				if _, err := c.Write([]byte{'x'}); err != nil {
					break trickling
				}
			}
		}
		tick.Stop()
		c.Close()
		s.ended.Add(1)
	}
}

// startSlowSenders starts n slow senders of heads, each from its own
// loopback address, until the test ends.
func startSlowSenders(t *testing.T, addr string, n int, trickle time.Duration, head func(i int) []byte) []*slowSender {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	var out []*slowSender
	for i := range n {
		s := &slowSender{addr: addr, from: net.IPv4(127, 0, 2, byte(1+i)), head: head(i), trickle: trickle}
		out = append(out, s)
		wg.Go(func() { s.run(stop) })
	}
	return out
}

// basicAuthHeader is the harness credentials' Authorization header line.
func basicAuthHeader() string {
	return "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("haptic:s3cret")) + "\r\n"
}

// slowPlanUpload is the start of a PUT /v1/plan of the pair the agent
// holds: MaxPlanBlobBytes announced, all but 100 bytes sent at once.
func slowPlanUpload(st State) []byte {
	head := fmt.Sprintf("PUT %s?plan_id=%s&proof=%s HTTP/1.1\r\nHost: agent\r\n%sContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		PathPlan, st.AppliedPlanID, st.AppliedPlanProof, basicAuthHeader(), MaxPlanBlobBytes)
	return append([]byte(head), strings.Repeat("x", MaxPlanBlobBytes-100)...)
}

// slowDeposedApply is the start of a POST /v1/apply from a deposed leader
// (leader_epoch 0): its manifest part, all but 100 bytes of
// MaxPlanBlobBytes sent at once, a long string it never ends.
func slowDeposedApply() []byte {
	const boundary = "slowslowslow"
	manifest := `{"identity_version":2,"plan_id":"deposed","token":{"leader_epoch":0,"render_seq":1},"pad":"`
	body := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"manifest\"\r\n\r\n" + manifest +
		strings.Repeat("x", MaxPlanBlobBytes-100-len(manifest))
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: agent\r\n%sContent-Type: multipart/form-data; boundary=%s\r\nContent-Length: %d\r\n\r\n",
		PathApply, basicAuthHeader(), boundary, 2*MaxPlanBlobBytes)
	return append([]byte(head), body...)
}

// leaderPush is one push of the current leader as `haptic push` makes it:
// a state read, then a runtime apply of one more map entry. It reports
// whether the apply was ACKed, how long the push took, and the answer of a
// push that was not.
func leaderPush(e *testEnv, fs fileSet, key string) (fileSet, bool, time.Duration, string) {
	start := time.Now()
	code, _, b := e.c.do("GET", PathState+"?plan=0", nil, "")
	var st State
	if code != http.StatusOK || json.Unmarshal(b, &st) != nil {
		return fs, false, time.Since(start), fmt.Sprintf("state %d %s", code, b)
	}
	next, op := mapEntryChange(fs, key, "be-a")
	code, b = e.c.post(applyRequest{manifest: e.c.manifestFrom(st, "plan-"+key, next, op), files: next})
	took := time.Since(start)
	var res ApplyResult
	if code != http.StatusOK || json.Unmarshal(b, &res) != nil || !res.OK {
		return fs, false, took, fmt.Sprintf("apply %d %.200s", code, b)
	}
	return next, true, took, ""
}

// TestSlowSendersHoldNoLeaderOut: eight connections with valid credentials
// each send all but 100 bytes of an 8 MiB body at full speed, then one byte
// every 10 s, and reconnect as soon as they are cut; together they hold
// the whole request-memory budget. The current leader pushes a one-entry
// change every second: at least 12 of 14 pushes are ACKed, none takes more
// than 2 s. Both as plan uploads of the pair the agent holds and as a
// deposed leader's manifests. Before, 13 of 14 pushes were refused at once
// (the budget is full) for as long as the senders trickled: they never
// stalled, and the request limit is 2 minutes.
func TestSlowSendersHoldNoLeaderOut(t *testing.T) {
	if raceDetectorOn() {
		t.Skip("a timing recipe the race detector distorts; .ci/run runs it without it")
	}
	const pushEvery = 500 * time.Millisecond // the recipe's push every 10 s, scaled so that 14 take 7 s
	for _, tc := range []struct {
		name string
		head func(st State) []byte
	}{
		{"plan uploads", slowPlanUpload},
		{"a deposed leader's manifests", func(State) []byte { return slowDeposedApply() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, nil, nil)
			fs := seedFiles()
			e.land(t, "plan-1", fs)
			head := tc.head(e.c.state("?plan=0"))
			senders := startSlowSenders(t, e.a.Addr(), 8, 10*time.Second, func(int) []byte { return head })
			time.Sleep(time.Second) // every sender has sent its burst
			acked, slowest, refusals := 0, time.Duration(0), map[string]int{}
			for i := range 14 {
				next := time.Now().Add(pushEvery)
				var ok bool
				var took time.Duration
				var answer string
				fs, ok, took, answer = leaderPush(e, fs, fmt.Sprintf("leader-%d.example", i))
				if ok {
					acked++
				} else {
					refusals[answer]++
				}
				slowest = max(slowest, took)
				time.Sleep(time.Until(next))
			}
			ended := int64(0)
			for _, s := range senders {
				ended += s.ended.Load()
			}
			t.Logf("pushes ACKed %d of 14, the slowest took %s; sender connections ended: %d", acked, slowest.Round(time.Millisecond), ended)
			if acked < 12 {
				t.Errorf("only %d of 14 leader pushes were ACKed; refusals: %v", acked, refusals)
			}
			if slowest > 2*time.Second {
				t.Errorf("a leader push took %s, want at most 2s", slowest)
			}
		})
	}
}

// hostMapOf is a host map of n entries, the same for the same n, whose
// hosts and backends compress as little as real tenants' do: with n
// 150,000 its plan blob is 3.6 MB, and a state answer that carries it 4.85
// MB.
func hostMapOf(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for range n {
		fmt.Fprintf(&b, "t%016x%08x.example.com be_%016x\n", r.Uint64(), r.Uint32(), r.Uint64())
	}
	return b.String()
}

// TestABigPushGoesThroughBesideSlowSenders: a legitimate push of a
// 150,000-entry map, with its plan, is ACKed while four slow senders hold
// half the request-memory budget, about as fast as without them.
func TestABigPushGoesThroughBesideSlowSenders(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	push := func(hostMap string) time.Duration {
		t.Helper()
		set := fileSet{ConfigFilePath: fs[ConfigFilePath], "maps/host.map": hostMap}
		plan := planOfSet(set)
		blob, err := EncodePlanBlob(plan)
		if err != nil {
			t.Fatal(err)
		}
		m := e.c.manifest(plan.ID, set)
		start := time.Now()
		code, b := e.c.post(applyRequest{manifest: m, files: set, plan: blob})
		took := time.Since(start)
		var res ApplyResult
		if code != http.StatusOK || json.Unmarshal(b, &res) != nil || !res.OK {
			t.Fatalf("the big push: %d %.300s", code, b)
		}
		return took
	}
	big := hostMapOf(150_000)
	alone := push(big)
	startSlowSenders(t, e.a.Addr(), 4, 10*time.Second, func(int) []byte { return slowPlanUpload(e.c.state("?plan=0")) })
	time.Sleep(time.Second) // the senders hold 32 MiB
	beside := push(big + "one-more.example be-a\n")
	t.Logf("the big push took %s alone, %s beside four slow senders", alone.Round(time.Millisecond), beside.Round(time.Millisecond))
	if beside > 2*alone+5*time.Second {
		t.Errorf("beside four slow senders the big push took %s, alone %s", beside, alone)
	}
}

// TestSlowStateReadersHoldNoMemory: with a 150,000-entry map applied and
// its plan stored (a state answer of about 4.85 MB), 200 authenticated
// connections ask for the state and never read. The agent (its own
// process) stays within hostileUploadsPeakMiB, a leader push beside them
// is answered, and 15 s after the readers left the agent is back near its
// idle memory. Before, the agent peaked at 1.7-2.1 GB and still held 993
// MB 15 s after: each answer was marshalled whole into its own buffer and
// held for up to the 3-minute write timeout.
func TestSlowStateReadersHoldNoMemory(t *testing.T) {
	if raceDetectorOn() {
		t.Skip("the race detector multiplies every allocation; .ci/run runs this test without it")
	}
	fake := startTestFake(t, "")
	base := t.TempDir()
	loadOnReload(fake, base)
	child := startAgentChild(t, agentChildConfig{BaseDir: base, MasterSocket: fake.MasterSocket(),
		WorkerSocket: fake.WorkerSocket(), AddrFile: filepath.Join(t.TempDir(), "addr")})
	set := fileSet{ConfigFilePath: "global\n  maxconn 100\n", "maps/host.map": hostMapOf(150_000)}
	plan := planOfSet(set)
	child.land(t, plan.ID, set)
	st := child.state(t)
	blob, _ := EncodePlanBlob(plan)
	if err := child.client(t).PutPlan(t.Context(), st.AppliedPlanID, st.AppliedPlanProof, blob); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the agent hands back what the big plan's decode left
	idle := procStatusKiB(t, child.pid(), "VmRSS") >> 10
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", child.pid()), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the child's peak RSS: %v", err)
	}

	// Each reader from an address of its own (the agent checks at most a
	// few credentials of one address at once), with a receive buffer of 4
	// KiB: the kernel holds little of the answer for it.
	request := "GET " + PathState + " HTTP/1.1\r\nHost: agent\r\n" + basicAuthHeader() + "\r\n"
	var readers []net.Conn
	for i := range 200 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3+byte(i/250), byte(1+i%250))},
			Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
			}}
		c, err := d.Dial("tcp", child.addr)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		defer c.Close()
		io.WriteString(c, request)
		readers = append(readers, c)
	}
	time.Sleep(2 * time.Second) // every reader's answer is under way
	cl := child.client(t)
	start := time.Now()
	now, err := cl.State(t.Context(), StateRead{})
	if err == nil {
		next, op := mapEntryChange(set, "leader.example", "be-a")
		var code int
		var b []byte
		code, b, err = child.postApply(now, "plan-leader", next, ModeAuto, op)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%d %.300s", code, b)
		}
	}
	push := time.Since(start)
	time.Sleep(6 * time.Second) // longer than a pace window: what a reader that reads nothing may hold
	peak := procStatusKiB(t, child.pid(), "VmHWM") >> 10
	for _, c := range readers {
		c.Close()
	}
	time.Sleep(15 * time.Second)
	after := procStatusKiB(t, child.pid(), "VmRSS") >> 10
	t.Logf("idle %d MiB; 200 readers that never read: peak %d MiB, a leader push took %s (%v); 15 s after they left: %d MiB",
		idle, peak, push.Round(time.Millisecond), err, after)
	if err != nil {
		t.Errorf("the leader push beside the readers: %v", err)
	}
	if peak > hostileUploadsPeakMiB {
		t.Errorf("the agent's peak RSS under 200 readers that never read is %d MiB, over the %d MiB bound", peak, hostileUploadsPeakMiB)
	}
	if after > idle+idle/2+16 {
		t.Errorf("15 s after the readers left the agent holds %d MiB, idle it held %d MiB", after, idle)
	}
}

// rawRequest sends head on a new connection to addr and returns the
// connection and a channel that receives the answer's status line, or the
// error, once it comes.
func rawRequest(t *testing.T, addr string, head []byte) (net.Conn, <-chan string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	answer := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		n, err := io.ReadAtLeast(c, b, 12)
		if err != nil {
			answer <- err.Error()
			return
		}
		answer <- string(b[:n])
	}()
	if _, err := c.Write(head); err != nil {
		t.Fatal(err)
	}
	return c, answer
}

// TestAnUploadBelowTheMinimumRateIsCutAWindowAfterItsBurst: a plan upload
// whose first megabyte comes at once and then a byte every 100 ms is cut
// one pace window after the burst, and told why. Before, a plan upload had
// no pace at all: it was cut at the 2-minute request limit.
func TestAnUploadBelowTheMinimumRateIsCutAWindowAfterItsBurst(t *testing.T) {
	const window = 500 * time.Millisecond
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.paceWindow = window })
	e.land(t, "plan-1", seedFiles())
	st := e.c.state("?plan=0")
	head := fmt.Sprintf("PUT %s?plan_id=%s&proof=%s HTTP/1.1\r\nHost: agent\r\n%sContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		PathPlan, st.AppliedPlanID, st.AppliedPlanProof, basicAuthHeader(), MaxPlanBlobBytes)
	c, answer := rawRequest(t, e.a.Addr(), append([]byte(head), strings.Repeat("x", 1<<20)...))
	burst := time.Now()
	go func() {
		for range 100 {
			time.Sleep(100 * time.Millisecond)
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
		}
	}()
	select {
	case got := <-answer:
		took := time.Since(burst)
		if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, "the upload fell below 64 KiB/s: fewer than 32768 bytes in 500ms") {
			t.Errorf("the slow upload was told %q", got)
		}
		if took < window-100*time.Millisecond || took > window+2*time.Second {
			t.Errorf("the slow upload was cut %s after its burst, want one window (%s)", took, window)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow upload was never cut")
	}
}

// TestAPlanUploadOfAnotherPairIsAnsweredBeforeItsBody: a PUT /v1/plan that
// names a pair the agent does not hold is answered 409 PlanMoved at once,
// though not one byte of its 8 MiB body was sent. Before, the agent waited
// for the body, holding its bytes, and refused it only then.
func TestAPlanUploadOfAnotherPairIsAnsweredBeforeItsBody(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	e.land(t, "plan-1", seedFiles())
	st := e.c.state("?plan=0")
	head := fmt.Sprintf("PUT %s?plan_id=other&proof=a:99 HTTP/1.1\r\nHost: agent\r\n%sContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		PathPlan, basicAuthHeader(), MaxPlanBlobBytes)
	_, answer := rawRequest(t, e.a.Addr(), []byte(head))
	select {
	case got := <-answer:
		_, body, _ := strings.Cut(got, "\r\n\r\n")
		var moved PlanMoved
		if !strings.HasPrefix(got, "HTTP/1.1 409 ") || json.Unmarshal([]byte(body), &moved) != nil ||
			moved != (PlanMoved{AppliedPlanID: st.AppliedPlanID, AppliedPlanProof: st.AppliedPlanProof}) {
			t.Errorf("the upload of another pair was told %q", got)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the upload of another pair was not answered before its body")
	}
}

// TestTheAgentsOwnTimeDoesNotCountAgainstAnUpload: an apply whose client
// sends its whole body at once, 4 MiB of parts after the manifest, waits
// for the decode slot for three pace windows between its manifest and its
// parts, and still lands: only the time the agent waits on the client
// counts.
func TestTheAgentsOwnTimeDoesNotCountAgainstAnUpload(t *testing.T) {
	const window = 300 * time.Millisecond
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.paceWindow = window })
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	next := fs.clone()
	next["notes/big.txt"] = strings.Repeat("b", 4<<20)
	m := e.c.manifest("plan-2", next)
	e.a.memory.decodes <- struct{}{} // the decode slot is taken
	time.AfterFunc(3*window, func() { <-e.a.memory.decodes })
	if code, b := e.c.post(applyRequest{manifest: m, files: next}); code != http.StatusOK {
		t.Fatalf("the apply that waited for the decode slot: %d %s", code, b)
	}
}

// fakeHolder is a request of b whose client is waited on since waiting
// ago (zero: it is not), and which records when memory pressure cut it.
func fakeHolder(t *testing.T, b *memoryBudget, waiting time.Duration, cut chan<- time.Time) *heldBytes {
	h := &heldBytes{budget: b, ctx: t.Context()}
	h.deadline = func(at time.Time) error { cut <- at; return nil }
	if waiting > 0 {
		h.waiting.Store(time.Now().Add(-waiting).UnixNano())
	}
	return h
}

// TestUnderMemoryPressureOnlyClientsThatSendNothingAreCut: a request that
// needs more bytes than are free waits for them, cutting every holder whose
// client it has waited on for pressureStall, at once or once it has; a
// holder the agent is busy with (decoding, staging, waiting for the apply
// lock) is never cut, and then the wait ends in errMemoryBusy after
// budgetWait. Before, the request was refused at once.
func TestUnderMemoryPressureOnlyClientsThatSendNothingAreCut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting time.Duration // the holder's client has been waited on this long; 0: the agent is busy with it
		cut     bool
	}{
		{"a client waited on for a second", time.Second, true},
		{"a client waited on for a moment, until pressureStall", 100 * time.Millisecond, true},
		{"a holder the agent is busy with", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newMemoryBudget()
			cut := make(chan time.Time, 1)
			holder := fakeHolder(t, b, tc.waiting, cut)
			if err := holder.take(maxHeldBodyBytes - 1000); err != nil {
				t.Fatal(err)
			}
			go func() { // a cut client's request ends, and gives its bytes back
				if _, ok := <-cut; ok {
					holder.release()
				}
			}()
			defer close(cut)
			start := time.Now()
			err := (&heldBytes{budget: b, ctx: t.Context()}).take(10_000)
			took := time.Since(start)
			if tc.cut {
				if err != nil || !holder.cut.Load() {
					t.Errorf("take: %v; the holder was cut: %v", err, holder.cut.Load())
				}
				if want := max(0, pressureStall-tc.waiting); took < want-50*time.Millisecond || took > want+500*time.Millisecond {
					t.Errorf("the bytes came after %s, want %s", took, want)
				}
				return
			}
			if !errors.Is(err, errMemoryBusy) || holder.cut.Load() {
				t.Errorf("take: %v, want errMemoryBusy; the holder was cut: %v", err, holder.cut.Load())
			}
			if took < budgetWait || took > budgetWait+time.Second {
				t.Errorf("refused after %s, want budgetWait (%s)", took, budgetWait)
			}
		})
	}
}

// TestTwoRequestsWaitingForEachOthersBytesAreRefused: two requests that
// hold most of the budget and each need more than is left wait for each
// other only budgetWait, and are both refused: no deadlock. A request
// larger than the whole budget still runs alone.
func TestTwoRequestsWaitingForEachOthersBytesAreRefused(t *testing.T) {
	b := newMemoryBudget()
	one, two := &heldBytes{budget: b, ctx: t.Context()}, &heldBytes{budget: b, ctx: t.Context()}
	one.take(40 << 20)
	two.take(20 << 20)
	errs := make(chan error, 2)
	start := time.Now()
	go func() { errs <- one.take(10 << 20) }()
	go func() { errs <- two.take(10 << 20) }()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, errMemoryBusy) {
				t.Errorf("take: %v, want errMemoryBusy", err)
			}
		case <-time.After(budgetWait + 5*time.Second):
			t.Fatal("two requests waiting for each other's bytes never ended")
		}
	}
	t.Logf("both refused after %s", time.Since(start))
	two.release()
	if err := one.take(maxHeldBodyBytes); err != nil {
		t.Errorf("the one holder could not take more than the whole budget: %v", err)
	}
}

// stateServer serves st as a's state answer, with the limits of the API's
// server, until the test ends, and returns its URL.
func stateServer(t *testing.T, a *Agent, st State) string {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.writeState(w, r, st) }))
	l := defaultListenerLimits(0)[listenerAPI]
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = l.read, l.write
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestTheStreamedStateIsTheMarshalledState: a state answer, whose stored
// plan is base64-encoded as it goes out, is byte for byte json.Marshal of
// the State and a newline, its length announced.
func TestTheStreamedStateIsTheMarshalledState(t *testing.T) {
	full := State{APIVersion: APIVersion, AgentVersion: `dev <&> "applied_plan_stored":`, AgentOps: []string{OpMapAdd},
		AppliedPlanID: "p", AppliedPlanProof: "a:1", AppliedPlanStored: true, LKGPlanID: "p",
		Files: map[string]FileAt{"haproxy.cfg": {Digest: "d", Size: 1}}, ReloadPendingAt: "soon"}
	withBlob := func(n int) State {
		st := full
		st.AppliedPlan = []byte(strings.Repeat("\x00\xffblob", n))[:n]
		return st
	}
	notStored := full
	notStored.AppliedPlanStored = false
	manyFiles := withBlob(5)
	manyFiles.Files = map[string]FileAt{}
	for i := range 2000 {
		manyFiles.Files[fmt.Sprintf("maps/%04d.map", i)] = FileAt{Digest: DigestString(fmt.Sprint(i)), Proof: "a:1", Size: int64(i)}
	}
	for _, tc := range []struct {
		name string
		st   State
	}{
		{"empty fields", State{}},
		{"no plan stored", notStored},
		{"plan=0", full},
		{"a blob of one byte", withBlob(1)},
		{"a blob of two bytes", withBlob(2)},
		{"a blob of three chunks and a bit", withBlob(3*chunkBytes + 7)},
		{"files of more than a chunk after the blob", manyFiles},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Get(stateServer(t, &Agent{memory: newMemoryBudget(), paceWindow: paceWindow}, tc.st))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			want, _ := json.Marshal(tc.st)
			want = append(want, '\n')
			if err != nil || string(got) != string(want) || resp.ContentLength != int64(len(want)) ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%v, %d bytes announced:\n got %.300q\nwant %.300q", err, resp.ContentLength, got, want)
			}
		})
	}
}

// TestASlowStateReaderIsCut: a reader of a state answer of several
// megabytes that reads nothing is cut a pace window after the kernel's
// buffers are full: it never gets the whole answer, and its request gives
// its bytes back.
func TestASlowStateReaderIsCut(t *testing.T) {
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.paceWindow = 300 * time.Millisecond })
	set := fileSet{ConfigFilePath: seedFiles()[ConfigFilePath], "maps/host.map": hostMapOf(150_000)}
	plan := planOfSet(set)
	blob, _ := EncodePlanBlob(plan)
	if code, b := e.c.post(applyRequest{manifest: e.c.manifest(plan.ID, set), files: set, plan: blob}); code != http.StatusOK {
		t.Fatalf("the big plan: %d %.300s", code, b)
	}
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", e.a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET "+PathState+" HTTP/1.1\r\nHost: agent\r\n"+basicAuthHeader()+"\r\n")
	time.Sleep(3 * time.Second) // the reader reads nothing
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err == nil || int64(len(got)) >= resp.ContentLength {
		t.Errorf("the reader that read nothing got %d of %d bytes (%v)", len(got), resp.ContentLength, err)
	}
	waitFor(t, "the cut answer to give its bytes back", func() bool {
		e.a.memory.mu.Lock()
		defer e.a.memory.mu.Unlock()
		return e.a.memory.free == maxHeldBodyBytes
	})
}

// openHookDisk is the operating system's disk with a hook before every
// Open.
type openHookDisk struct {
	osDisk
	hook func(name string)
}

func (d *openHookDisk) Open(name string) (diskFile, error) {
	d.hook(name)
	return d.osDisk.Open(name)
}

// TestVerifiedReadsShareOneRehash: twenty verified reads that arrive while
// a re-hash waits for the apply lock share it; and a read that arrives
// while a re-hash runs is served by a later one, so it sees a file changed
// behind the agent's back just before it arrived.
func TestVerifiedReadsShareOneRehash(t *testing.T) {
	var blockOnce sync.Once
	hashing, resume := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	var rehashes atomic.Int64 // every re-hash opens the map
	d := &openHookDisk{hook: func(name string) {
		if !strings.HasSuffix(name, "host.map") {
			return
		}
		rehashes.Add(1)
		if armed.Load() {
			blockOnce.Do(func() { close(hashing); <-resume })
		}
	}}
	e := newTestEnvWithDisk(t, d, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	verified := func() (State, error) {
		req, _ := http.NewRequest("GET", "http://"+e.a.Addr()+PathState+"?verify=1&plan=0", nil)
		req.SetBasicAuth("haptic", "s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return State{}, err
		}
		defer resp.Body.Close()
		var st State
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
			return st, fmt.Errorf("%d %v", resp.StatusCode, err)
		}
		return st, nil
	}
	before := rehashes.Load()
	e.a.deps.applyMu.Lock()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := verified(); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // every read waits for the re-hash
	e.a.deps.applyMu.Unlock()
	wg.Wait()
	if n := rehashes.Load() - before; n > 2 {
		t.Errorf("20 concurrent verified reads made %d re-hashes", n)
	}

	armed.Store(true)
	first := make(chan error, 1)
	go func() { _, err := verified(); first <- err }()
	<-hashing // the first read's re-hash has hashed haproxy.cfg, and opens maps/host.map
	changed := fs[ConfigFilePath] + "# behind the agent's back\n"
	if err := os.WriteFile(filepath.Join(e.cfg.BaseDir, ConfigFilePath), []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	second := make(chan State, 1)
	go func() {
		st, err := verified()
		if err != nil {
			t.Error(err)
		}
		second <- st
	}()
	time.Sleep(300 * time.Millisecond) // the second read has arrived
	close(resume)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := (<-second).Files[ConfigFilePath]; got.Digest != DigestString(changed) {
		t.Errorf("the read that arrived after the change sees %s, not the changed file's %s", got.Digest, DigestString(changed))
	}
}

// TestMemoryIsHandedBackAfterBigWork: once a request that held
// bigWorkBytes or more has ended, or an answer of that size has gone out,
// the agent hands its memory back to the operating system within
// idleFreeAfter; after a small request it does not.
func TestMemoryIsHandedBackAfterBigWork(t *testing.T) {
	handedBack := func(t *testing.T, a *Agent, work func()) time.Duration {
		calls := make(chan time.Time, 10)
		a.memory.handBack = func() { calls <- time.Now() }
		done := time.Now()
		work()
		select {
		case at := <-calls:
			return at.Sub(done)
		case <-time.After(idleFreeAfter + 2*time.Second):
			return -1
		}
	}
	t.Run("a request", func(t *testing.T) {
		for _, n := range []int{bigWorkBytes, bigWorkBytes - 1} {
			a := &Agent{memory: newMemoryBudget()}
			took := handedBack(t, a, func() {
				h := &heldBytes{budget: a.memory, ctx: t.Context()}
				h.take(n)
				h.release()
			})
			switch {
			case n >= bigWorkBytes && took < 0:
				t.Errorf("after a request that held %d bytes, memory was not handed back", n)
			case n >= bigWorkBytes && took > idleFreeAfter+500*time.Millisecond:
				t.Errorf("after a request that held %d bytes, memory was handed back after %s, want within %s", n, took, idleFreeAfter)
			case n < bigWorkBytes && took >= 0:
				t.Errorf("after a request that held %d bytes, memory was handed back", n)
			}
		}
	})
	t.Run("an answer", func(t *testing.T) {
		a := &Agent{memory: newMemoryBudget(), paceWindow: paceWindow}
		url := stateServer(t, a, State{AppliedPlanStored: true, AppliedPlan: make([]byte, bigWorkBytes)})
		took := handedBack(t, a, func() {
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
		if took < 0 || took > idleFreeAfter+time.Second {
			t.Errorf("after an answer of %d bytes, memory was handed back after %s (-1: never), want within %s", bigWorkBytes, took, idleFreeAfter)
		}
	})
}

// TestAHeldReaderRefusesLastBytesThatComeWithEOF: a body whose last bytes
// and end come in one Read is refused when the budget cannot hold them,
// like any other bytes.
func TestAHeldReaderRefusesLastBytesThatComeWithEOF(t *testing.T) {
	b := newMemoryBudget()
	(&heldBytes{budget: b, ctx: t.Context()}).take(maxHeldBodyBytes - 10)
	h := &heldBytes{budget: b, ctx: t.Context()}
	_, err := io.ReadAll(h.reader(iotest.DataErrReader(strings.NewReader(strings.Repeat("x", 100)))))
	if !errors.Is(err, errMemoryBusy) {
		t.Errorf("reading 100 bytes with their EOF while 10 are free: %v, want errMemoryBusy", err)
	}
}
