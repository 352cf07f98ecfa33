// This file owns what slow and hostile uploads may cost other requests:
// connections that trickle their manifest a byte at a time (a deposed
// leader's or a valid controller's) keep the leader's push waiting for
// nothing, and many concurrent hostile plan uploads (zstd bombs, patch
// bodies of megabytes) keep the agent within the memory bound the README
// states.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// trickleManifest starts an apply whose manifest travels one byte every
// 200 ms, and returns a channel that receives the answer (or the error)
// once the agent cuts or answers it.
func trickleManifest(t *testing.T, e *testEnv, m *Manifest) <-chan string {
	t.Helper()
	raw, _ := json.Marshal(m)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	mw := multipart.NewWriter(pw)
	req, _ := http.NewRequest("POST", "http://"+e.a.Addr()+PathApply, pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.SetBasicAuth("haptic", "s3cret")
	done := make(chan string, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	go func() {
		w, _ := mw.CreateFormField(PartManifest)
		for _, c := range raw {
			if _, err := w.Write([]byte{c}); err != nil {
				return // the agent cut the upload
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return done
}

// TestTricklingManifestsHoldUpNoLeader: two valid controllers and two
// deposed leaders (an epoch below the current one) trickle their manifests,
// within a pace window longer than the test; the current leader's push is answered within
// a second, while all four are still on the wire. Before, the first two
// held both places of the apply gate until the request limit cut them, and
// the leader waited behind them.
func TestTricklingManifestsHoldUpNoLeader(t *testing.T) {
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.paceWindow = time.Minute })
	fs := seedFiles()
	e.c.epoch = 2
	e.land(t, "plan-1", fs)
	var slow []<-chan string
	for i, epoch := range []uint64{2, 2, 1, 1} {
		m := e.c.manifest(fmt.Sprintf("plan-slow-%d", i), fs)
		m.Token.LeaderEpoch = epoch
		slow = append(slow, trickleManifest(t, e, m))
	}
	time.Sleep(time.Second) // every trickle is on its way
	next, op := mapEntryChange(fs, "leader.example", "be-a")
	sent := time.Now()
	if res := e.c.apply(e.c.manifest("plan-leader", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the leader's push: %s", jsonOf(res))
	}
	if took := time.Since(sent); took > time.Second {
		t.Errorf("the leader's push took %s behind the trickling manifests", took)
	}
	for i, done := range slow {
		select {
		case got := <-done:
			t.Errorf("trickle %d ended before the leader's push did: %s", i, got)
		default:
		}
	}
}

// raceDetectorOn reports whether the test binary runs with -race, which
// multiplies every allocation.
func raceDetectorOn() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// hostileUploadsPeakMiB is the peak resident memory the README promises
// under 48 concurrent hostile uploads of each kind: the held request bytes
// (maxHeldBodyBytes), one decode (a bomb inflates to MaxPlanJSONBytes
// before it is refused), and the garbage Go's collector lets grow to twice
// what is live.
const hostileUploadsPeakMiB = 384

// TestHostileUploadsStayWithinTheMemoryBound sends an agent (its own
// process) 48 concurrent zstd bombs and 48 concurrent 7 MB plan patches at
// once, and reads its peak resident memory: every upload is refused, and
// the peak stays within hostileUploadsPeakMiB. Unbounded, 24 bombs took
// the agent to 1.28 GB and 48 patches to 676 MB.
func TestHostileUploadsStayWithinTheMemoryBound(t *testing.T) {
	if raceDetectorOn() {
		t.Skip("the race detector multiplies every allocation; .ci/run runs this test without it")
	}
	fake := startTestFake(t, "")
	child := startAgentChild(t, agentChildConfig{BaseDir: t.TempDir(), MasterSocket: fake.MasterSocket(),
		WorkerSocket: fake.WorkerSocket(), AddrFile: filepath.Join(t.TempDir(), "addr")})
	child.land(t, "plan-1", seedFiles())
	held := child.state(t) // uploads of another pair are answered before their bodies
	bomb := zeroBomb(t, 1<<30)
	patch, _ := json.Marshal(&PlanPatch{BaseDigest: "0123456789abcdef", BaseSize: 1,
		Splices: []PlanSplice{{Data: bytes.Repeat([]byte("p"), 5<<20)}}})
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", child.pid()), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the child's peak RSS: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[string]int{}
	for i := range 96 {
		body, ct := bomb, blobContentType
		if i%2 == 1 {
			body, ct = patch, patchContentType
		}
		// Each from an address of its own: the agent checks at most a few
		// credentials of one address at once.
		from := &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i))}
		client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: from}).DialContext}}
		wg.Go(func() {
			req, _ := http.NewRequest("PUT", "http://"+child.addr+PathPlan+"?plan_id="+held.AppliedPlanID+"&proof="+held.AppliedPlanProof, bytes.NewReader(body))
			req.Header.Set("Content-Type", ct)
			req.SetBasicAuth("haptic", "s3cret")
			resp, err := client.Do(req)
			status := "error"
			if err == nil {
				status = resp.Status
				resp.Body.Close()
			}
			mu.Lock()
			answers[ct+" "+status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	peak := procStatusKiB(t, child.pid(), "VmHWM") >> 10
	t.Logf("answers %v; peak RSS %d MiB", answers, peak)
	for kind, n := range answers {
		if !strings.HasSuffix(kind, " 400 Bad Request") && !strings.HasSuffix(kind, " 409 Conflict") && !strings.HasSuffix(kind, " 503 Service Unavailable") {
			t.Errorf("%d answers %s, want every upload refused: a bomb 400, a patch of a plan not held 409, one the budget cannot hold now 503", n, kind)
		}
	}
	if peak > hostileUploadsPeakMiB {
		t.Errorf("the agent's peak RSS under 96 hostile uploads is %d MiB, over the %d MiB bound", peak, hostileUploadsPeakMiB)
	}
}
