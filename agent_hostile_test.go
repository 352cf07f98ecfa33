// Tests of hostile and unlucky conditions: a refusal that must not wedge
// the agent, a reload slower than its timeout, restore staging and state
// temp files left behind, a stalled upload, a baseline lost while an upload
// is held, a stopped master, an unreadable tree file, and a rollback over
// an intact tree where the directory refuses new entries. The disk-full
// sweep is in agent_diskfull_test.go.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestARefusalLeavesOwnershipAsItWas: a set that puts a file where a
// directory stands (or meets a planted directory or link) is refused at
// stage write, and the refusal leaves the ownership set exactly as before:
// the previous set and any set without the path land afterwards, also
// after a restart.
func TestARefusalLeavesOwnershipAsItWas(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(base string)
		bad   func(fs fileSet)
	}{
		{"a directory becomes a file", nil, func(fs fileSet) {
			delete(fs, "extra/x.txt")
			fs["extra"] = "now a file\n"
		}},
		{"a planted directory", func(base string) { os.MkdirAll(filepath.Join(base, "maps/new.map/inside"), 0o755) },
			func(fs fileSet) { fs["maps/new.map"] = "n.example be-n\n" }},
		{"a planted link", func(base string) { os.Symlink("/etc/hostname", filepath.Join(base, "maps/link.map")) },
			func(fs fileSet) { fs["maps/link.map"] = "l.example be-l\n" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, nil, nil)
			r1 := seedFiles()
			r1["extra/x.txt"] = "x\n"
			e.land(t, "r1", r1)
			if tc.plant != nil {
				tc.plant(e.cfg.BaseDir)
			}
			r2 := r1.clone()
			tc.bad(r2)
			res := e.c.apply(reloadManifest(e, "r2", r2), r2)
			if res.OK || res.Error == nil || res.Error.Stage != StageWrite {
				t.Fatalf("the bad set: %+v %+v", res, res.Error)
			}
			owned := slices.Sorted(maps.Keys(e.c.state("?plan=0").Files))
			if want := r1.paths(); strings.Join(owned, " ") != strings.Join(want, " ") {
				t.Errorf("ownership after the refusal %v, want %v", owned, want)
			}
			r0 := seedFiles()
			if res := e.c.apply(reloadManifest(e, "r0", r0), r0); !res.OK {
				t.Fatalf("a set without the path after the refusal: %+v %+v", res, res.Error)
			}
			e.restart(t)
			if res := e.c.apply(reloadManifest(e, "r1-again", r1), r1); !res.OK {
				t.Fatalf("the first set again after a restart: %+v %+v", res, res.Error)
			}
		})
	}
}

// TestAReloadSlowerThanItsTimeoutIsNeverVouchedFor: HAProxy answers a
// reload only after the reload timeout, and its new worker comes late. The
// apply is refused and rolled back, the restored set is reloaded once the
// master answers again, and at no point does the agent report a running
// plan on a worker other than the one answering.
func TestAReloadSlowerThanItsTimeoutIsNeverVouchedFor(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadTimeout = 300 * time.Millisecond }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	e.fake.With(func(m *FakeModel) { m.ReloadTakes = 700 * time.Millisecond })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# a config whose map takes long to load\n"
	res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || !strings.Contains(res.Error.Message, "within 300ms") {
		t.Fatalf("%+v %+v", res, res.Error)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("the tree is not the last-known-good set: %v", e.disk(t).paths())
	}
	vouched := func(st State) bool {
		return st.RunningPlanID == "" || st.HAProxy.SameWorker(e.fake.Worker())
	}
	if st := e.c.state("?plan=0"); !vouched(st) {
		t.Errorf("the answer vouches for %q on worker %d while %d runs", st.RunningPlanID, st.HAProxy.WorkerPID, e.fake.Worker().WorkerPID)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st := e.c.state("?plan=0&verify=1"); !vouched(st) {
			t.Fatalf("the agent vouches for %q on worker %d while %d runs", st.RunningPlanID, st.HAProxy.WorkerPID, e.fake.Worker().WorkerPID)
		}
	}
	e.fake.With(func(m *FakeModel) { m.ReloadTakes = 0 })
	if res := e.c.apply(reloadManifest(e, "plan-3", fs2), fs2); !res.OK {
		t.Errorf("the next reload: %+v %+v", res, res.Error)
	}
}

// TestStartupSweepsStateTempFiles: a crash in the middle of writing the
// snapshot or the plan blob leaves their temp files; the next start
// removes them.
func TestStartupSweepsStateTempFiles(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	for _, name := range []string{".haptic-agent-state-123", ".haptic-agent-state-456"} {
		os.WriteFile(filepath.Join(cfg.BaseDir, name), bytes.Repeat([]byte("x"), 1<<20), 0o600)
	}
	launchTestAgent(t, cfg, true)
	for _, name := range []string{".haptic-agent-state-123", ".haptic-agent-state-456"} {
		if _, err := os.Lstat(filepath.Join(cfg.BaseDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s survived the start: %v", name, err)
		}
	}
}

// heldUpload is an apply whose body the test writes as it goes: the
// manifest and the first n bytes of the part at path are sent, and the
// rest waits for finish (or never comes).
type heldUpload struct {
	mw     *multipart.Writer
	pw     *io.PipeWriter
	part   io.Writer
	rest   string
	answer chan string // the answer's body, or the client's error
}

func holdUpload(t *testing.T, e *testEnv, m *Manifest, path, content string, n int) *heldUpload {
	t.Helper()
	pr, pw := io.Pipe()
	u := &heldUpload{mw: multipart.NewWriter(pw), pw: pw, rest: content[n:], answer: make(chan string, 1)}
	t.Cleanup(func() { pw.Close() })
	req, _ := http.NewRequest("POST", "http://"+e.a.Addr()+PathApply, pr)
	req.Header.Set("Content-Type", u.mw.FormDataContentType())
	req.SetBasicAuth("haptic", "s3cret")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			u.answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		u.answer <- string(b)
	}()
	w, _ := u.mw.CreateFormField(PartManifest)
	json.NewEncoder(w).Encode(m)
	u.part, _ = u.mw.CreateFormFile(path, path)
	io.WriteString(u.part, content[:n])
	return u
}

// finish sends the rest of the part and ends the body.
func (u *heldUpload) finish() {
	io.WriteString(u.part, u.rest)
	u.mw.Close()
	u.pw.Close()
}

// TestAStalledUploadReleasesTheApplyLock: a client that stops sending in
// the middle of its parts holds the apply lock only for one pace window;
// it is told why, and an apply waiting behind it lands.
func TestAStalledUploadReleasesTheApplyLock(t *testing.T) {
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.paceWindow = 300 * time.Millisecond })
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "s.example be-s\n"

	// The stalled client: the manifest and half a part, then nothing.
	u := holdUpload(t, e, e.c.manifest("plan-2", fs2), "maps/host.map", fs2["maps/host.map"], 5)
	start := time.Now()
	select {
	case body := <-u.answer:
		if !strings.Contains(body, "the upload fell below 64 KiB/s: fewer than 19660 bytes in 300ms") {
			t.Errorf("the stalled client was told %s", body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled upload held on")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the stall cost %s", took)
	}
	if res := e.c.apply(e.c.manifest("plan-2", fs2), fs2); !res.OK {
		t.Errorf("the next apply: %+v", res)
	}
}

// TestNoOpReachesTheWorkerOfAnUnknownBaseline: an auto apply passes the
// fence and its upload waits; meanwhile a verified state read adopts a
// worker the agent did not start, which makes the baseline unknown. When
// the upload goes on, the fence, checked again under the apply lock,
// refuses the apply (unknown_baseline): no op reaches the adopted worker,
// and nothing reloads.
func TestNoOpReachesTheWorkerOfAnUnknownBaseline(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "u.example be-u\n"
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "u.example", Value: "be-u"})
	// The manifest lists the config first: the held part is the map's.
	u := holdUpload(t, e, m, "maps/host.map", fs2["maps/host.map"], 5)
	time.Sleep(300 * time.Millisecond) // the first fence has passed; the agent reads the parts

	restartFake(e.fake)
	if st := e.c.state("?verify=1"); st.AppliedPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Fatalf("the foreign worker left the baseline %q / %q", st.AppliedPlanID, st.WorkerOpsPlanID)
	}
	sent, reloads := len(e.fake.Sent()), fakeReloads(e.fake)
	u.finish()
	var c Conflict
	if body := <-u.answer; json.Unmarshal([]byte(body), &c) != nil || c.Reason != ReasonUnknownBaseline {
		t.Fatalf("the apply: %s", body)
	}
	for _, cmd := range e.fake.Sent()[sent:] {
		if strings.Contains(cmd, "u.example") {
			t.Errorf("an op reached the worker of an unknown baseline: %q", cmd)
		}
	}
	if n := fakeReloads(e.fake); n != reloads {
		t.Errorf("a reload: %d → %d", reloads, n)
	}
}

// TestAStoppedMasterCostsTheReloadTimeout: a master that does not answer
// bounds the reload by the configured reload timeout, its show proc
// baseline included, not by the socket's I/O timeout.
func TestAStoppedMasterCostsTheReloadTimeout(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadTimeout = 400 * time.Millisecond }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	// A stopped master: its socket takes connections into the kernel's
	// backlog and never reads them.
	os.Remove(e.fake.MasterSocket())
	stopped, err := net.Listen("unix", e.fake.MasterSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer stopped.Close()
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	start := time.Now()
	res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	took := time.Since(start)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload ||
		res.Error.Message != "reload: the master did not answer show proc within 400ms" {
		t.Errorf("%+v %+v", res, res.Error)
	}
	if took > 3*time.Second {
		t.Errorf("the apply took %s with a 400ms reload timeout", took)
	}
}

// openFailDisk is the operating system's disk, where opening one path for
// reading fails as a file the agent may not read does.
type openFailDisk struct {
	osDisk
	path string
}

func (d openFailDisk) Open(name string) (diskFile, error) {
	if name == d.path {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	return d.osDisk.Open(name)
}

// TestAnUnreadableTreeFileDoesNotStopTheAgent: one file of the tree the
// agent may not read does not keep it from starting; the tree is reported
// without it (so the baseline is unknown), and an apply that replaces it
// lands.
func TestAnUnreadableTreeFileDoesNotStopTheAgent(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.stop()
	d := openFailDisk{path: filepath.Join(e.cfg.BaseDir, "maps/host.map")}
	a, _ := launchAgentWith(t, e.cfg, agentOptions{disk: d}, nil, true)
	c := newAgentClient(t, a)
	st := c.state("")
	if _, ok := st.Files["maps/host.map"]; ok || st.AppliedPlanID != "" {
		t.Errorf("state over an unreadable file: applied %q files %v", st.AppliedPlanID, st.Files)
	}
	fs2 := fs.clone()
	fs2["maps/host.map"] = "replaced.example be-r\n"
	if res := c.apply(reloadManifest(&testEnv{c: c}, "plan-2", fs2), fs2); !res.OK {
		t.Errorf("replacing the unreadable file: %+v %+v", res, res.Error)
	}
}

// TestARefusalOverAnIntactTreeRollsBack: the directory of the changed map
// refuses new entries (immutable, or mounted read-only), so the write
// fails; nothing was replaced, and the rollback succeeds anyway, clearing
// the journal.
func TestARefusalOverAnIntactTreeRollsBack(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	maps := filepath.Join(e.cfg.BaseDir, "maps")
	d.setHook(func(op diskOp) error {
		if filepath.Dir(op.Path) == maps && op.Op != "syncdir" {
			return &fs.PathError{Op: op.Op, Path: op.Path, Err: syscall.EPERM}
		}
		return nil
	})
	set2 := set.clone()
	set2["maps/host.map"] += "i.example be-i\n"
	set2["maps/new.map"] = "n.example be-n\n"
	res := e.c.apply(reloadManifest(e, "plan-2", set2), set2)
	d.setHook(nil)
	if res.OK || res.Error == nil || res.Error.Stage != StageWrite || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("%+v %+v %+v", res, res.Error, res.Rollback)
	}
	if j := readStateFile(t, e.cfg.BaseDir).Journal; len(j) != 0 {
		t.Errorf("journal left behind: %+v", j)
	}
	if !sameSet(e.disk(t), set) {
		t.Errorf("tree %v", e.disk(t).paths())
	}
}

// holdAt makes d stop the agent at its first op on path until release is
// called; entered is closed when it stops there.
func holdAt(d *hookDisk, op, path string) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.setHook(func(o diskOp) error {
		if o.Op == op && o.Path == path {
			once.Do(func() {
				close(in)
				<-out
			})
		}
		return nil
	})
	return in, func() { close(out) }
}

// killImage is what kill -9 leaves of the agent's state at one instant:
// the page cache outlives the process, so it is the files as they are.
func killImage(t *testing.T, base string, names ...string) map[string][]byte {
	t.Helper()
	img := map[string][]byte{}
	for _, name := range append([]string{".haptic-agent.json", logFileName, planBlobFile}, names...) {
		b, err := os.ReadFile(filepath.Join(base, name))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		img[name] = b
	}
	return img
}

// restoreImage puts a killImage back on a stopped agent's directory.
func restoreImage(t *testing.T, base string, img map[string][]byte) {
	t.Helper()
	for name, b := range img {
		p := filepath.Join(base, name)
		os.Remove(p)
		if b != nil {
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestAPlanUploadDuringAnApplyNeverRewindsTheState: a PUT /v1/plan of the
// applied plan's blob while a runtime apply of the next plan is held at its
// install waits for that apply (and then finds the plan moved), so that no
// record of the state from before the apply follows the apply's record. A
// kill -9 at that instant and a start leave the pairs naming the plan
// whose files are on disk, and the next push diffs against it.
func TestAPlanUploadDuringAnApplyNeverRewindsTheState(t *testing.T) {
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, nil)
	set := seedFiles()
	next, p2, img := uploadWhileAnApplyIsHeld(t, e.a, e.c, d, func(id string, fs fileSet) { e.land(t, id, fs) }, set, e.cfg.BaseDir)
	e.stop()
	restoreImage(t, e.cfg.BaseDir, img)
	e.restartStopped(t)
	after := e.c.state("?plan=0")
	if after.AppliedPlanID != p2.ID || after.WorkerOpsPlanID != p2.ID {
		t.Errorf("after the kill and a start: applied %q, worker ops %q; the files on disk are plan 2's (%q)",
			after.AppliedPlanID, after.WorkerOpsPlanID, p2.ID)
	}
	if got := e.disk(t); !sameSet(got, next) {
		t.Errorf("the tree after the start:\n%s", describeSetDiff(got, next))
	}
	// The next push diffs against plan 2: one more entry is one map_add.
	third, op3 := mapEntryChange(next, "third.example", "be-a")
	if res := e.c.apply(e.c.manifestFrom(after, "plan-3", third, op3), third); !res.OK || res.Mode != ResultRuntime {
		t.Errorf("the next push: %s", jsonOf(res))
	}
	workerHoldsMapOf(t, e.fake, third)
}

// uploadWhileAnApplyIsHeld lands set as a plan with its blob stored, holds
// a runtime apply of one more map entry at its install, PUTs the first
// plan's blob meanwhile, and takes the kill image at that instant. It
// checks that the upload waited for the apply and then found the plan
// moved, and returns the apply's set, its plan and the image.
func uploadWhileAnApplyIsHeld(t *testing.T, a *Agent, c *agentClient, d *hookDisk, land func(string, fileSet), set fileSet, base string) (fileSet, *Plan, map[string][]byte) {
	t.Helper()
	p1 := planOfFiles(t, set)
	land(p1.ID, set)
	st := c.state("?plan=0")
	p1Query := "?plan_id=" + st.AppliedPlanID + "&proof=" + st.AppliedPlanProof
	p1Blob := blobOf(t, p1.Clone())
	if code, _, body := c.do("PUT", PathPlan+p1Query, bytes.NewReader(p1Blob), ""); code != http.StatusOK {
		t.Fatalf("storing plan 1's blob: %d %s", code, body)
	}
	next, op := mapEntryChange(set, "held.example", "be-a")
	p2 := planOfFiles(t, next)
	entered, release := holdAt(d, "exchange", filepath.Join(a.files.base, "maps/host.map"))
	answered := make(chan ApplyResult, 1)
	go func() { answered <- c.apply(c.manifest(p2.ID, next, op), next) }()
	<-entered
	uploaded := make(chan int, 1)
	go func() {
		code, _, _ := c.do("PUT", PathPlan+p1Query, bytes.NewReader(p1Blob), "")
		uploaded <- code
	}()
	early := 0
	select {
	case early = <-uploaded:
		t.Errorf("the upload was answered %d while the apply was held at its install", early)
	case <-time.After(200 * time.Millisecond):
	}
	img := killImage(t, base, "maps/host.map")
	release()
	if res := <-answered; !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the held apply: %s", jsonOf(res))
	}
	if early == 0 {
		if code := <-uploaded; code != http.StatusConflict {
			t.Errorf("the upload after the apply: %d, want 409: the plan moved", code)
		}
	}
	awaitReadBacks(a)
	return next, p2, img
}

// TestALostSyncedTailNeverHandsOutAProofAgain: a disk that loses the last
// record of the log (whole, as one that lies about a sync does, or torn, as
// a lost page leaves it) takes that apply back, which no agent can prevent;
// but the proof that apply was answered with is never handed out again for
// other content, and a torn end is logged.
func TestALostSyncedTailNeverHandsOutAProofAgain(t *testing.T) {
	for _, cut := range []struct {
		name   string
		keep   func(frame []byte) int // how much of the lost record stays
		logged bool
	}{
		{"the record lost whole", func([]byte) int { return 0 }, false},
		{"the record torn", func(frame []byte) int { return len(frame) / 2 }, true},
	} {
		t.Run(cut.name, func(t *testing.T) {
			logs := newLogCounter(testLogger().Handler())
			e := newTestEnv(t, func(c *AgentConfig) { c.Logger = slog.New(logs) }, nil)
			set := seedFiles()
			e.land(t, "plan-1", set)
			next, op := mapEntryChange(set, "lost.example", "be-a")
			lost := e.c.apply(e.c.manifest("plan-2", next, op), next)
			if !lost.OK {
				t.Fatalf("the apply whose record is lost: %s", jsonOf(lost))
			}
			awaitReadBacks(e.a)
			img := killImage(t, e.cfg.BaseDir)
			e.stop()
			// Cut the log at its last apply record.
			raw := img[logFileName]
			start, frame := -1, []byte(nil)
			for pos := 0; ; {
				r, end, ok := frameAt(raw, pos)
				if !ok {
					break
				}
				if r.Kind == recordApply {
					start, frame = pos, raw[pos:end]
				}
				pos = end
			}
			if start < 0 {
				t.Fatalf("no apply record in the log")
			}
			img[logFileName] = raw[:start+cut.keep(frame)]
			restoreImage(t, e.cfg.BaseDir, img)
			e.restartStopped(t)
			if n := logs.count(msgLogEndedTorn); (n > 0) != cut.logged {
				t.Errorf("the torn end was logged %d times", n)
			}
			st := e.c.state("?plan=0")
			res := e.c.apply(reloadManifest(e, "plan-3", next), next)
			if !res.OK {
				t.Fatalf("the next apply: %s", jsonOf(res))
			}
			for _, p := range []string{st.AppliedPlanProof, st.LKGPlanProof, res.AppliedPlanProof} {
				if p == lost.AppliedPlanProof {
					t.Errorf("proof %s, answered for the lost apply, is handed out again", p)
				}
			}
		})
	}
}

// TestATricklingUploadHoldsUpNoOtherApply: a client that sends its parts a
// byte at a time, within a pace window longer than the request may take,
// is cut at the whole-request limit with a clear error and nothing
// written; and since parts are read before the apply lock is taken, an
// apply sent meanwhile is answered at once.
func TestATricklingUploadHoldsUpNoOtherApply(t *testing.T) {
	const whole = 3 * time.Second
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) {
		l := a.limits[listenerAPI]
		l.read = whole
		a.limits[listenerAPI] = l
		a.paceWindow = time.Minute
	})
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	before := e.snapshot(t)
	slow := fs.clone()
	slow["notes/slow.txt"] = strings.Repeat("s", 64)

	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	req, _ := http.NewRequest("POST", "http://"+e.a.Addr()+PathApply, pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.SetBasicAuth("haptic", "s3cret")
	cut := make(chan string, 1)
	start := time.Now()
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cut <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cut <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	go func() {
		w, _ := mw.CreateFormField(PartManifest)
		json.NewEncoder(w).Encode(e.c.manifest("plan-slow", slow))
		part, _ := mw.CreateFormFile("notes/slow.txt", "notes/slow.txt")
		for i := 0; i < len(slow["notes/slow.txt"]); i++ {
			if _, err := part.Write([]byte{'s'}); err != nil {
				return // the agent cut the upload
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	defer pw.Close()

	time.Sleep(700 * time.Millisecond) // the slow upload is on its way
	next, op := mapEntryChange(fs, "quick.example", "be-a")
	sent := time.Now()
	if res := e.c.apply(e.c.manifest("plan-quick", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the apply sent meanwhile: %s", jsonOf(res))
	}
	if took := time.Since(sent); took > time.Second {
		t.Errorf("the apply sent meanwhile took %s: the slow upload held it up", took)
	}
	select {
	case got := <-cut:
		took := time.Since(start)
		if !strings.HasPrefix(got, "400 ") || !strings.Contains(got, `"stage":"parts"`) ||
			!strings.Contains(got, "the upload took longer than the 3s a request may") {
			t.Errorf("the trickling client was told %s", got)
		}
		if took < whole || took > whole+2*time.Second {
			t.Errorf("the trickling upload was cut after %s, want the %s a request may take", took, whole)
		}
	case <-time.After(whole + 10*time.Second):
		t.Fatal("the trickling upload was never cut")
	}
	// Only the quick apply landed.
	if got := e.disk(t); !sameSet(got, next) {
		t.Errorf("the tree:\n%s", describeSetDiff(got, next))
	}
	if st := e.c.state("?plan=0"); st.Generation != before.st.Generation+1 || st.AppliedPlanID != "plan-quick" {
		t.Errorf("after the cut upload: generation %d, applied %q", st.Generation, st.AppliedPlanID)
	}
}
