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
// the middle of its parts holds the apply lock only for the stall timeout;
// it is told why, and an apply waiting behind it lands.
func TestAStalledUploadReleasesTheApplyLock(t *testing.T) {
	e := newTestEnv(t, nil, func(a *Agent, _ *FakeHAProxy) { a.stallTimeout = 300 * time.Millisecond })
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "s.example be-s\n"

	// The stalled client: the manifest and half a part, then nothing.
	u := holdUpload(t, e, e.c.manifest("plan-2", fs2), "maps/host.map", fs2["maps/host.map"], 5)
	start := time.Now()
	select {
	case body := <-u.answer:
		if !strings.Contains(body, "the upload stalled") {
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

// TestNoOpReachesTheWorkerOfAnUnknownBaseline: an auto apply is admitted
// (fenced against plan-1 and its worker, the apply lock held) and its
// upload waits; meanwhile a verified state read adopts a worker the agent
// did not start, which makes the baseline unknown. When the upload goes on,
// the apply runs against the state as it is then: it sends no op to the
// adopted worker, and reloads it for the reason unknown_baseline.
func TestNoOpReachesTheWorkerOfAnUnknownBaseline(t *testing.T) {
	logs := &lockedBuffer{}
	e := newTestEnv(t, func(c *AgentConfig) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "u.example be-u\n"
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "u.example", Value: "be-u"})
	// The manifest lists the config first: the held part is the map's.
	u := holdUpload(t, e, m, "maps/host.map", fs2["maps/host.map"], 5)
	waitFor(t, "the apply to be admitted", func() bool {
		if e.a.deps.applyMu.TryLock() {
			e.a.deps.applyMu.Unlock()
			return false
		}
		return true
	})

	restartFake(e.fake)
	if st := e.c.state("?verify=1"); st.AppliedPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Fatalf("the foreign worker left the baseline %q / %q", st.AppliedPlanID, st.WorkerOpsPlanID)
	}
	sent := len(e.fake.Sent())
	u.finish()
	var res ApplyResult
	if body := <-u.answer; json.Unmarshal([]byte(body), &res) != nil || !res.OK || res.Mode != ResultReload {
		t.Fatalf("the apply: %s", body)
	}
	for _, cmd := range e.fake.Sent()[sent:] {
		if strings.Contains(cmd, "u.example") {
			t.Errorf("an op reached the worker of an unknown baseline: %q", cmd)
		}
	}
	if !strings.Contains(logs.String(), `"reload_reason":"unknown_baseline"`) {
		t.Errorf("the reload's reason is not unknown_baseline:\n%s", logs.String())
	}
	if !hasMapKey(e.fake, "maps/host.map", "u.example") {
		t.Error("the reload did not bring the new set")
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
