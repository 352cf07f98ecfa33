// Tests of the apply pipeline (agent_apply.go): the manifest and part
// checks with their exact messages, fencing, missing parts, runtime ops and
// the fallback reload, rollback to the last known good set, the known-bad
// cache, role proofs, LKG promotion, reverts, plan blobs, the inventory and
// a worker that changed under an apply; and a table of malformed requests,
// each of which gets its exact status and stage and changes nothing. All
// run against the fake HAProxy.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// snapshot is what a refused request must leave untouched.
type snapshot struct {
	disk      fileSet
	stateFile []byte
	st        State
}

func (e *testEnv) snapshot(t testing.TB) snapshot {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(e.cfg.BaseDir, ".haptic-agent.json"))
	return snapshot{disk: e.disk(t), stateFile: b, st: e.c.state("?plan=0")}
}

// unchanged fails the test if the tree, the state file or the baseline moved.
func (e *testEnv) unchanged(t testing.TB, before snapshot) {
	t.Helper()
	after := e.snapshot(t)
	if !sameSet(after.disk, before.disk) {
		t.Errorf("the tree changed: %v → %v", before.disk, after.disk)
	}
	if !bytes.Equal(after.stateFile, before.stateFile) {
		t.Errorf("the state file changed:\n%s\n%s", before.stateFile, after.stateFile)
	}
	b, a := before.st, after.st
	if a.Generation != b.Generation || a.AppliedPlanID != b.AppliedPlanID || a.AppliedPlanProof != b.AppliedPlanProof ||
		a.LKGPlanID != b.LKGPlanID || a.AppliedToken != b.AppliedToken || a.WorkerOpsPlanProof != b.WorkerOpsPlanProof {
		t.Errorf("the baseline changed: %+v → %+v", b, a)
	}
	if left := tempLeftovers(t, e.a); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
}

// tempLeftovers lists what is left in the agent's .haptic-tmp directories.
func tempLeftovers(t testing.TB, a *Agent) []string {
	t.Helper()
	var left []string
	entries, _ := os.ReadDir(filepath.Join(a.files.base, storeTempDir))
	for _, e := range entries {
		left = append(left, e.Name())
	}
	return left
}

func fileHeader(name, filename string) textproto.MIMEHeader {
	h := textproto.MIMEHeader{}
	if filename == "" {
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, name))
	} else {
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, name, filename))
	}
	return h
}

// ---------------------------------------------------------------------------
// Manifest and parts.

func TestApplyManifestSizeBoundary(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	m := e.c.manifest("plan-2", fs)
	b, _ := json.Marshal(m)
	exact := append(b, bytes.Repeat([]byte(" "), MaxPlanBlobBytes-len(b))...)
	code, body := e.c.post(applyRequest{manifest: m, rawManifest: exact, files: fs})
	if code != http.StatusOK || !strings.Contains(string(body), `"ok":true`) {
		t.Fatalf("a manifest of exactly %d bytes: %d %s", len(exact), code, body)
	}
	before := e.snapshot(t)
	m = e.c.manifest("plan-3", fs)
	b, _ = json.Marshal(m)
	over := append(b, bytes.Repeat([]byte(" "), MaxPlanBlobBytes+1-len(b))...)
	code, body = e.c.post(applyRequest{manifest: m, rawManifest: over, files: fs})
	if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != "manifest exceeds the 8388608-byte limit" {
		t.Errorf("one byte over: %d %+v", code, ae)
	}
	e.unchanged(t, before)
}

func TestManifestValidationMessages(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	mapOp := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "v"}
	ops := func(n int) []Op { return slices.Repeat([]Op{mapOp}, n) }
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		raw    string // a raw manifest body instead
		want   string
	}{
		{"bad JSON", nil, `{"plan_id":`, "invalid manifest: unexpected end of JSON input"},
		{"wrong type", nil, `{"plan_id":7}`, "invalid manifest: json: cannot unmarshal number into Go struct field Manifest.plan_id of type string"},
		{"op limit", func(m *Manifest) { m.Ops = ops(1001) }, "", "1001 ops exceed the 1000-op limit"},
		{"op limit with in-place", func(m *Manifest) { m.Ops = ops(600); m.InPlaceOps = ops(401) }, "", "1001 ops exceed the 1000-op limit"},
		{"batch limit", func(m *Manifest) { m.OpBatches = slices.Repeat([][]Op{ops(1)}, 8) }, "", "9 operation batches exceed the 8-batch limit"},
		{"empty batch", func(m *Manifest) { m.OpBatches = [][]Op{{}} }, "", "operation batch 2 must contain 1 to 1000 ops; got 0"},
		{"oversized batch", func(m *Manifest) { m.OpBatches = [][]Op{ops(1), ops(1001)} }, "", "operation batch 3 must contain 1 to 1000 ops; got 1001"},
		{"empty plan id", func(m *Manifest) { m.PlanID = "" }, "", "plan_id is empty"},
		{"too many files", func(m *Manifest) {
			for i := range MaxFiles {
				m.Files = append(m.Files, ManifestFile{Path: fmt.Sprintf("f/%d", i), Digest: DigestString("")})
			}
		}, "", "4098 files exceed the 4096-file limit"},
		{"in-place without ids", func(m *Manifest) { m.InPlaceOps = ops(1); m.WorkerOpsPlanID = "" }, "",
			"in-place ops need expected_worker_ops_plan_id and worker_ops_plan_id"},
		{"in-place without proof", func(m *Manifest) {
			m.InPlaceOps = ops(1)
			m.WorkerOpsPlanID = "w"
			m.ExpectedWorkerOpsPlanProof = ""
		}, "", "in-place ops need an exact expected worker plan proof"},
		{"validated id alone", func(m *Manifest) { m.ValidatedPlanID = "plan-1" }, "", "validated plan id and proof must be set together"},
		{"validated proof alone", func(m *Manifest) { m.ValidatedPlanProof = "a:1" }, "", "validated plan id and proof must be set together"},
		{"revert without proof", func(m *Manifest) { m.Mode = ModeRevertLKG }, "", "a revert needs the refused plan proof"},
		{"revert without exact identity", func(m *Manifest) { m.Mode = ModeRevertLKG; m.PlanProof = "a:1"; m.IdentityVersion = 2 }, "",
			"a revert needs the refused plan proof"},
		{"unknown mode", func(m *Manifest) { m.Mode = "yolo" }, "", `unknown mode "yolo"`},
		{"path traversal", func(m *Manifest) { m.Files[0].Path = "../etc/passwd" }, "",
			`invalid manifest path: "../etc/passwd" has a component starting with a dot`},
		{"absolute path", func(m *Manifest) { m.Files[0].Path = "/etc/passwd" }, "", `invalid manifest path: "/etc/passwd" is absolute`},
		{"dot component", func(m *Manifest) { m.Files[0].Path = "maps/.hidden" }, "",
			`invalid manifest path: "maps/.hidden" has a component starting with a dot`},
		{"duplicate path", func(m *Manifest) { m.Files = append(m.Files, m.Files[0]) }, "",
			`path "haproxy.cfg" appears twice in the manifest`},
		{"no digest", func(m *Manifest) { m.Files[1].Digest = "" }, "", `file "maps/host.map" has no digest`},
		{"no config", func(m *Manifest) { m.Files = m.Files[1:] }, "", `the manifest does not list the config file "haproxy.cfg"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot(t)
			m := e.c.manifest("plan-2", fs)
			m.WorkerOpsPlanID = "w"
			if tc.mutate != nil {
				tc.mutate(m)
			}
			req := applyRequest{manifest: m, files: fs}
			if tc.raw != "" {
				req.rawManifest = []byte(tc.raw)
			}
			code, body := e.c.post(req)
			if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != tc.want {
				t.Errorf("got %d %+v\nwant 400 manifest %q", code, ae, tc.want)
			}
			e.unchanged(t, before)
		})
	}
	t.Run("no manifest part", func(t *testing.T) {
		code, body := e.c.post(applyRequest{noManifest: true})
		if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != "no manifest part: EOF" {
			t.Errorf("got %d %+v", code, ae)
		}
	})
	t.Run("manifest not first", func(t *testing.T) {
		code, body := e.c.post(applyRequest{noManifest: true, extra: []extraPart{{fileHeader("plan", "plan"), "x"}}})
		if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != `first part is "plan", expected "manifest"` {
			t.Errorf("got %d %+v", code, ae)
		}
	})
}

func TestAManifestOverTheOpLimitIsRefused(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	before := e.snapshot(t)
	m := e.c.manifest("plan-2", fs, slices.Repeat([]Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "v"}}, 1001)...)
	code, body := e.c.post(applyRequest{manifest: m, files: fs})
	if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || !strings.Contains(ae.Message, "op limit") {
		t.Errorf("got %d %+v", code, ae)
	}
	e.unchanged(t, before)
}

func TestLegacyManifestIsForcedToReload(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	pid := e.fake.Worker().WorkerPID
	fs2 := fs.clone()
	fs2["maps/host.map"] += "b.example be-b\n"
	m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "b.example", Value: "be-b"})
	m.IdentityVersion = 0
	res := e.c.apply(m, fs2)
	if !res.OK || res.Mode != ResultReload || len(res.OpResults) != 0 || e.fake.Worker().WorkerPID == pid {
		t.Errorf("legacy auto apply: %+v", res)
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "add map") {
			t.Errorf("a legacy manifest ran an op: %q", cmd)
		}
	}
	m = e.c.manifest("plan-2", fs2)
	m.IdentityVersion, m.Mode, m.PlanProof = 0, ModeRevertLKG, res.AppliedPlanProof
	code, body := e.c.post(applyRequest{manifest: m})
	if ae := applyErr(t, body); code != 400 || ae.Stage != StageManifest || ae.Message != "a revert needs the refused plan proof" {
		t.Errorf("legacy revert: %d %+v", code, ae)
	}
}

func TestPartErrors(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# changed\n"

	many := fileSet{"haproxy.cfg": fs2["haproxy.cfg"]}
	for i := range MaxFiles - 1 {
		many[fmt.Sprintf("many/%04d.txt", i)] = fmt.Sprint(i)
	}
	tests := []struct {
		name string
		fs   fileSet
		req  func(m *Manifest, fs fileSet) applyRequest
		want string
	}{
		{"unknown part", fs2, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, extra: []extraPart{{fileHeader("x", "maps/other.map"), "x"}}}
		}, `part "maps/other.map" is not in the manifest`},
		{"duplicate part", fs2, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, extra: []extraPart{{fileHeader("haproxy.cfg", "haproxy.cfg"), fs["haproxy.cfg"]}}}
		}, `part "haproxy.cfg" appears twice`},
		{"duplicate plan part", fs2, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, plan: []byte{}, extra: []extraPart{{fileHeader("plan", ""), "p2"}}}
		}, `part "plan" appears twice`},
		{"part without filename", fs2, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, extra: []extraPart{{fileHeader("maps/host.map", ""), "x"}}}
		}, "a file part carries no filename"},
		{"unusable Content-Disposition", fs2, func(m *Manifest, fs fileSet) applyRequest {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", `form-data; name="x"; filename="unterminated`)
			return applyRequest{manifest: m, files: fs, extra: []extraPart{{h, "x"}}}
		}, "part has no usable Content-Disposition: mime: invalid media parameter"},
		{"oversized plan part", fs2, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, plan: bytes.Repeat([]byte("p"), MaxPlanBlobBytes+1)}
		}, "plan blob exceeds the 8388608-byte limit"},
		{"more than 4096 parts", many, func(m *Manifest, fs fileSet) applyRequest {
			return applyRequest{manifest: m, files: fs, extra: []extraPart{{fileHeader("x", "many/0000.txt"), "0"}}}
		}, "more than 4096 parts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot(t)
			rejected := metricValue(e.a, "apply_rejected_total", StageParts)
			code, body := e.c.post(tc.req(e.c.manifest("plan-2", tc.fs), tc.fs))
			if ae := applyErr(t, body); code != 400 || ae.Stage != StageParts || ae.Message != tc.want {
				t.Errorf("got %d %+v\nwant 400 parts %q", code, ae, tc.want)
			}
			if got := metricValue(e.a, "apply_rejected_total", StageParts); got != rejected+1 {
				t.Errorf("rejected{parts} %d → %d", rejected, got)
			}
			e.unchanged(t, before)
		})
	}
}

// TestMalformedRequestsChangeNothing is the bad-input table: each
// malformed request gets its exact status and stage, and the tree, the
// state file and the generation stay as they were.
func TestMalformedRequestsChangeNothing(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	fs2["maps/host.map"] = "changed.example be-c\n"
	tests := []struct {
		name      string
		send      func() (int, []byte)
		wantCode  int
		wantStage string
		wantIn    string // a substring of the message
	}{
		{"not multipart", func() (int, []byte) {
			code, _, b := e.c.do("POST", PathApply, strings.NewReader(`{"plan_id":"x"}`), "application/json")
			return code, b
		}, 400, StageRequest, "multipart/form-data"},
		{"no manifest", func() (int, []byte) { return e.c.post(applyRequest{noManifest: true}) }, 400, StageManifest, "no manifest part"},
		{"manifest not first", func() (int, []byte) {
			return e.c.post(applyRequest{noManifest: true, extra: []extraPart{{fileHeader("haproxy.cfg", "haproxy.cfg"), "x"}}})
		}, 400, StageManifest, `first part is "haproxy.cfg"`},
		{"bad JSON", func() (int, []byte) {
			return e.c.post(applyRequest{rawManifest: []byte("{{"), manifest: e.c.manifest("plan-2", fs2), files: fs2})
		}, 400, StageManifest, "invalid manifest"},
		{"path traversal", func() (int, []byte) {
			m := e.c.manifest("plan-2", fs2)
			m.Files = append(m.Files, ManifestFile{Path: "maps/../../x", Digest: DigestString("")})
			return e.c.post(applyRequest{manifest: m, files: fs2})
		}, 400, StageManifest, "is not canonical"},
		{"absolute path", func() (int, []byte) {
			m := e.c.manifest("plan-2", fs2)
			m.Files = append(m.Files, ManifestFile{Path: "/tmp/x", Digest: DigestString("")})
			return e.c.post(applyRequest{manifest: m, files: fs2})
		}, 400, StageManifest, "is absolute"},
		{"dot component", func() (int, []byte) {
			m := e.c.manifest("plan-2", fs2)
			m.Files = append(m.Files, ManifestFile{Path: ".haptic-agent.json", Digest: DigestString("")})
			return e.c.post(applyRequest{manifest: m, files: fs2})
		}, 400, StageManifest, "starting with a dot"},
		{"duplicate paths", func() (int, []byte) {
			m := e.c.manifest("plan-2", fs2)
			m.Files = append(m.Files, m.Files[1])
			return e.c.post(applyRequest{manifest: m, files: fs2})
		}, 400, StageManifest, "appears twice in the manifest"},
		{"duplicate parts", func() (int, []byte) {
			return e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2,
				extra: []extraPart{{fileHeader("maps/host.map", "maps/host.map"), fs2["maps/host.map"]}}})
		}, 400, StageParts, "appears twice"},
		{"unknown part", func() (int, []byte) {
			return e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2,
				extra: []extraPart{{fileHeader("x", "x.txt"), "x"}}})
		}, 400, StageParts, "is not in the manifest"},
		{"oversized manifest", func() (int, []byte) {
			return e.c.post(applyRequest{rawManifest: bytes.Repeat([]byte(" "), MaxPlanBlobBytes+1)})
		}, 400, StageManifest, "manifest exceeds the 8388608-byte limit"},
		{"oversized body", func() (int, []byte) {
			big := fs2.clone()
			big["blob.bin"] = strings.Repeat("z", MaxApplyBodyBytes)
			return e.c.post(applyRequest{manifest: e.c.manifest("plan-2", big), files: big})
		}, 400, StageParts, "http: request body too large"},
		{"wrong digest", func() (int, []byte) {
			return e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2,
				override: map[string]string{"maps/host.map": "changed.example be-X\n"}})
		}, 400, StageParts, "manifest digest"},
		{"wrong size", func() (int, []byte) {
			return e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2,
				override: map[string]string{"maps/host.map": "short\n"}})
		}, 400, StageParts, "manifest digest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot(t)
			code, body := tc.send()
			ae := applyErr(t, body)
			if code != tc.wantCode || ae.Stage != tc.wantStage || !strings.Contains(ae.Message, tc.wantIn) {
				t.Errorf("got %d %+v\nwant %d %s containing %q", code, ae, tc.wantCode, tc.wantStage, tc.wantIn)
			}
			e.unchanged(t, before)
		})
	}
}

// ---------------------------------------------------------------------------
// The apply pipeline.

func TestFirstApplyWritesTheTreeAndReloads(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	pid := e.fake.Worker().WorkerPID
	res := e.c.apply(e.c.manifest("plan-1", fs), fs)
	if !res.OK || res.Mode != ResultReload || res.Reload == nil || !res.Reload.Performed || !res.Reload.OK ||
		res.Reload.WorkerPID != e.fake.Worker().WorkerPID || e.fake.Worker().WorkerPID == pid {
		t.Fatalf("first apply: %+v", res)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("disk: %v", e.disk(t))
	}
	st := e.c.state("")
	if st.AppliedPlanID != "plan-1" || st.RunningPlanID != "plan-1" || st.LKGPlanID != "plan-1" || st.Generation != 1 ||
		st.APIVersion != 1 || !slices.Contains(st.AgentOps, OpBackendAdd) || st.InvariantViolation != "" {
		t.Errorf("state: %+v", st)
	}
	if !slices.Equal(st.Features, []string{"file_patch", "worker_fence", "runtime_batches", "plan_patch"}) {
		t.Errorf("features %v", st.Features)
	}
	for _, f := range fs.manifestFiles() {
		if st.Files[f.Path] != (FileAt{Digest: f.Digest, Proof: f.Proof, Size: f.Size}) {
			t.Errorf("%s: %+v", f.Path, st.Files[f.Path])
		}
	}
	if fi, err := os.Stat(filepath.Join(e.cfg.BaseDir, ".haptic-agent.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode: %v %v", fi, err)
	}
	// Private keys and userlist passwords live in the tree: no access for
	// other users.
	if fi, _ := os.Stat(filepath.Join(e.cfg.BaseDir, "maps/host.map")); fi.Mode().Perm() != 0o640 {
		t.Errorf("file mode %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(e.cfg.BaseDir, "maps")); fi.Mode().Perm() != 0o750 {
		t.Errorf("directory mode %v", fi.Mode())
	}
}

// TestTheOperatorsFileModeGovernsTheTree: --file-mode replaces the private
// default for every file the agent writes into the tree, and directories
// follow it (x where r is); the agent's own files stay 0600 whatever it is.
func TestTheOperatorsFileModeGovernsTheTree(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.FileMode = 0o604 }, nil)
	e.land(t, "plan-1", seedFiles())
	for path, want := range map[string]os.FileMode{"maps/host.map": 0o604, "maps": 0o705, ".haptic-agent.json": 0o600} {
		if fi, err := os.Stat(filepath.Join(e.cfg.BaseDir, path)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, want)
		}
	}
}

func TestRuntimeApplyRunsOpsWithoutReloading(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	pid := e.fake.Worker().WorkerPID
	fs2 := fs.clone()
	fs2["maps/host.map"] += "new.example be-new\n"
	res := e.land(t, "plan-2", fs2,
		Op{Kind: OpBackendAdd, Backend: "be-new", Profile: "defaults-http", Mode: "http"},
		Op{Kind: OpServerAdd, Backend: "be-new", Server: "s1", Address: "10.0.0.1", Port: 8080},
		Op{Kind: OpServerEnable, Backend: "be-new", Server: "s1"},
		Op{Kind: OpBackendPublish, Backend: "be-new"},
		Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "new.example", Value: "be-new"},
	)
	if res.Mode != ResultRuntime || res.Reload != nil || len(res.OpResults) != 5 {
		t.Fatalf("runtime apply: %+v", res)
	}
	if e.fake.Worker().WorkerPID != pid || !e.fake.HasBackend("be-new") || !slices.Equal(e.fake.ServerNames("be-new"), []string{"s1"}) {
		t.Errorf("worker: pid %d backends %v", e.fake.Worker().WorkerPID, e.fake.Backends())
	}
	st := e.c.state("")
	if st.RunningPlanID != "plan-1" || st.AppliedPlanID != "plan-2" || st.Generation != 2 {
		t.Errorf("state: %+v", st)
	}
	// last_apply is the answer itself, with the inventory the apply left:
	// a controller that lost the answer takes its baseline from there.
	if la := st.LastApply; la == nil || la.Inventory == nil || !slices.Contains(la.Inventory.Maps, "maps/host.map") {
		t.Errorf("last_apply's inventory: %+v", la)
	} else if la.Inventory = nil; !reflect.DeepEqual(*la, res) {
		t.Errorf("last_apply %+v\nwant the answer %+v", la, res)
	}
	if metricValue(e.a, "apply_total", ResultRuntime) != 1 {
		t.Errorf("apply_total{runtime} = %d", metricValue(e.a, "apply_total", ResultRuntime))
	}
}

func TestFenceRules(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "x.example be-x\n"
	base := e.c.state("")
	tests := []struct {
		rule   string
		mutate func(m *Manifest)
		reason string
	}{
		{"1 stale epoch", func(m *Manifest) { m.Token.LeaderEpoch = 0 }, ReasonStaleEpoch},
		{"2 revert of the running plan", func(m *Manifest) {
			m.Mode, m.PlanID, m.PlanProof = ModeRevertLKG, base.RunningPlanID, base.RunningPlanProof
		}, ReasonRevertTargetMismatch},
		{"3 other previous plan", func(m *Manifest) { m.ExpectedPrevPlanID = "plan-0" }, ReasonPrevMismatch},
		{"4 other previous token", func(m *Manifest) { m.ExpectedPrevToken.RenderSeq++ }, ReasonPrevMismatch},
		{"5 auto without the previous proof", func(m *Manifest) { m.ExpectedPrevPlanProof = "" }, ReasonPrevMismatch},
		{"5 auto with another previous proof", func(m *Manifest) { m.ExpectedPrevPlanProof = "a:99" }, ReasonPrevMismatch},
		{"6 reload with another previous proof", func(m *Manifest) { m.Mode = ModeReload; m.ExpectedPrevPlanProof = "a:99" }, ReasonPrevMismatch},
		{"7 auto against another worker plan", func(m *Manifest) { m.ExpectedWorkerOpsPlanID = "plan-0" }, ReasonWorkerOpsMismatch},
		{"7 auto against another worker proof", func(m *Manifest) { m.ExpectedWorkerOpsPlanProof = "a:99" }, ReasonWorkerOpsMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.rule, func(t *testing.T) {
			before := e.snapshot(t)
			fenced := metricValue(e.a, "apply_rejected_total", "fencing")
			m := e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "x.example", Value: "be-x"})
			tc.mutate(m)
			code, body := e.c.post(applyRequest{manifest: m, files: fs2})
			var c Conflict
			json.Unmarshal(body, &c)
			want := Conflict{AppliedPlanID: base.AppliedPlanID, AppliedPlanProof: base.AppliedPlanProof, AppliedToken: base.AppliedToken,
				RunningPlanID: base.RunningPlanID, RunningPlanProof: base.RunningPlanProof,
				WorkerOpsPlanID: base.WorkerOpsPlanID, WorkerOpsPlanProof: base.WorkerOpsPlanProof,
				LKGPlanID: base.LKGPlanID, LKGPlanProof: base.LKGPlanProof, Reason: tc.reason}
			if code != http.StatusConflict || c != want || strings.Contains(string(body), `"missing"`) {
				t.Errorf("got %d %s\nwant %+v", code, body, want)
			}
			if got := metricValue(e.a, "apply_rejected_total", "fencing"); got != fenced+1 {
				t.Errorf("rejected{fencing} %d → %d", fenced, got)
			}
			e.unchanged(t, before)
		})
	}
	t.Run("passing", func(t *testing.T) {
		res := e.c.apply(e.c.manifest("plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "x.example", Value: "be-x"}), fs2)
		if !res.OK || res.Mode != ResultRuntime {
			t.Errorf("%+v", res)
		}
	})
}

func TestFencingRefusesAndNeverWrites(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# v2\n"
	for _, tc := range []struct {
		name   string
		mutate func(m *Manifest)
		reason string
	}{
		{"wrong previous plan", func(m *Manifest) { m.ExpectedPrevPlanID = "plan-7" }, ReasonPrevMismatch},
		{"wrong previous token", func(m *Manifest) { m.ExpectedPrevToken = Token{LeaderEpoch: 1, RenderSeq: 99} }, ReasonPrevMismatch},
		{"lower epoch", func(m *Manifest) { m.Token = Token{LeaderEpoch: 0, RenderSeq: 99} }, ReasonStaleEpoch},
	} {
		before := e.snapshot(t)
		m := e.c.manifest("plan-2", fs2)
		tc.mutate(m)
		code, body := e.c.post(applyRequest{manifest: m, files: fs2})
		var c Conflict
		json.Unmarshal(body, &c)
		if code != 409 || c.Reason != tc.reason {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		e.unchanged(t, before)
	}
}

func TestUnknownBaselineIsItsOwnConflictReason(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	m := e.c.manifest("plan-1", fs)
	m.ExpectedPrevPlanID = "plan-0"
	code, body := e.c.post(applyRequest{manifest: m, files: fs})
	var c Conflict
	json.Unmarshal(body, &c)
	if code != 409 || c.Reason != ReasonUnknownBaseline || c.AppliedPlanID != "" {
		t.Errorf("%d %s", code, body)
	}
}

func TestAFencedApplyDoesNotPromoteTheLKG(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/new.txt"] = "new\n"
	res := applyFileOnly(t, e.c, "plan-2", fs2)
	journal := readStateFile(t, e.cfg.BaseDir).Journal
	if len(journal) == 0 {
		t.Fatal("the file_only apply left no journal")
	}
	before := e.snapshot(t)
	m := e.c.manifest("plan-3", fs2)
	m.Token.LeaderEpoch = 0
	m.ValidatedPlanID, m.ValidatedPlanProof = "plan-2", res.AppliedPlanProof
	code, _ := e.c.post(applyRequest{manifest: m, files: fs2})
	if code != 409 {
		t.Fatalf("status %d", code)
	}
	e.unchanged(t, before)
	if st := e.c.state(""); st.LKGPlanID != "plan-1" {
		t.Errorf("LKG %q", st.LKGPlanID)
	}
	if got := readStateFile(t, e.cfg.BaseDir).Journal; !reflect.DeepEqual(got, journal) {
		t.Errorf("journal %v → %v", journal, got)
	}
}

func TestMissingPartsAreNamed(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	fs["notes/a.txt"] = "a\n"
	before := e.snapshot(t)
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-1", fs), files: fs,
		omit: map[string]bool{"notes/a.txt": true, "maps/host.map": true}})
	var miss Missing
	json.Unmarshal(body, &miss)
	if code != 409 || !slices.Equal(miss.Missing, []string{"maps/host.map", "notes/a.txt"}) {
		t.Errorf("%d %s", code, body)
	}
	e.unchanged(t, before)
	if len(e.disk(t)) != 0 {
		t.Errorf("files landed: %v", e.disk(t))
	}
}

func TestUnchangedFilesNeedNoParts(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	all := map[string]bool{}
	for p := range fs {
		all[p] = true
	}
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-1b", fs), files: fs, omit: all})
	var res ApplyResult
	json.Unmarshal(body, &res)
	if code != 200 || !res.OK || res.Mode != ResultNoop || res.AppliedPlanID != "plan-1b" || res.AppliedPlanProof != "a:2" {
		t.Errorf("%d %s", code, body)
	}
	if st := e.c.state(""); st.Generation != 2 || st.InvariantViolation != "" {
		t.Errorf("state %+v", st)
	}
}

func TestAPartThatDoesNotMatchItsDigestIsRefused(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "evil.example be-x\n"
	before := e.snapshot(t)
	code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2,
		override: map[string]string{"maps/host.map": strings.ToUpper(fs2["maps/host.map"])}})
	if ae := applyErr(t, body); code != 400 || ae.Stage != StageParts || !strings.Contains(ae.Message, "manifest digest") {
		t.Errorf("%d %+v", code, ae)
	}
	e.unchanged(t, before)
}

func TestAbsenceDeletesAnOwnedPath(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	fs["notes/owned.txt"] = "owned\n"
	e.land(t, "plan-1", fs)
	os.WriteFile(filepath.Join(e.cfg.BaseDir, "unowned.txt"), []byte("mine\n"), 0o644)
	fs2 := fs.clone()
	delete(fs2, "notes/owned.txt")
	res := e.land(t, "plan-2", fs2)
	if res.Mode != ResultFileOnly {
		t.Errorf("mode %s", res.Mode)
	}
	want := fs2.clone()
	want["unowned.txt"] = "mine\n"
	if !sameSet(e.disk(t), want) {
		t.Errorf("disk %v", e.disk(t))
	}
	if _, err := os.Stat(filepath.Join(e.cfg.BaseDir, "notes")); err != nil {
		t.Errorf("the directory was removed: %v", err)
	}
	if owned := readOwned(t, e.cfg.BaseDir); !slices.Equal(owned, fs2.paths()) {
		t.Errorf("ownership %v", owned)
	}
}

func TestUnknownOpFallsBackToAReload(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "u.example be-u\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "u.example", Value: "be-u"}, Op{Kind: "frobnicate"})
	if res.Mode != ResultReload || res.RunningPlanID != "plan-2" || len(res.OpResults) != 0 {
		t.Errorf("%+v", res)
	}
	if metricValue(e.a, "invariant_violations_total", invOpsExecutable) != 1 {
		t.Error("ops_executable not counted")
	}
	for _, cmd := range e.fake.Sent() {
		if strings.HasPrefix(cmd, "add map") {
			t.Errorf("an op ran before the batch compiled: %q", cmd)
		}
	}
}

func TestARejectedOpReloadsTheDesiredSet(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "Backend is not found.", strings.HasPrefix(cmd, "add server") }
	})
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "backend be-a\n  server s1 10.0.0.1:80\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpServerAdd, Backend: "be-a", Server: "s1", Address: "10.0.0.1", Port: 80})
	if res.Mode != ResultReload || res.RunningPlanID != "plan-2" || !res.Reload.Performed || len(res.OpResults) != 1 || res.OpResults[0].OK {
		t.Errorf("%+v", res)
	}
	if !sameSet(e.disk(t), fs2) {
		t.Error("the desired set is not on disk")
	}
	if metricValue(e.a, "op_errors_total", OpServerAdd) != 1 {
		t.Error("op_errors_total{server_add} not counted")
	}
	if st := e.c.state(""); st.WorkerOpsPlanID != "plan-2" || st.InvariantViolation != "" {
		t.Errorf("state %+v", st)
	}
}

const failedReloadLog = "[ALERT]    (999) : config : parsing [haproxy.cfg:3] : unknown keyword 'bogus'\n[WARNING]  (999) : Loading failure!"

func TestAFailedReloadRestoresTheLastKnownGoodSet(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, failedReloadLog })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	fs2["notes/new.txt"] = "new\n"
	res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	if res.OK || res.Mode != ResultRejected || res.Error == nil || res.Error.Stage != StageReload ||
		!strings.Contains(res.Error.Message, "unknown keyword 'bogus'") || res.Rollback == nil || !res.Rollback.Performed ||
		res.Rollback.Reloaded || res.Reload == nil || !res.Reload.Performed || res.Reload.OK || res.AppliedPlanID != "plan-1" {
		t.Fatalf("%+v %+v %+v", res, res.Error, res.Rollback)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("disk %v", e.disk(t))
	}
	// HAProxy refused the reload and the previous worker kept serving the
	// restored set: the baseline the apply started from holds again.
	st := e.c.state("")
	if st.AppliedPlanID != "plan-1" || st.LKGPlanID != "plan-1" || st.RunningPlanID != "plan-1" || st.Generation != 1 || st.InvariantViolation != "" {
		t.Errorf("state %+v", st)
	}
	if metricValue(e.a, "rollbacks_total") != 1 || metricValue(e.a, "apply_rejected_total", StageReload) != 1 ||
		metricValue(e.a, "reloads_total", "failed") != 1 {
		t.Error("metrics")
	}
	if owned := readOwned(t, e.cfg.BaseDir); !slices.Equal(owned, fs.paths()) {
		t.Errorf("ownership %v", owned)
	}
}

// A reload that never answers is judged by the runtime layer, which owns
// the reload timeout: it sends the reload with that timeout as its deadline
// and, on an HAProxy that gives no Success= line, polls for a new worker
// until the same timeout. The NACK carries the runtime layer's words and the
// error is errReloadTimeout on every dialect, never a transport error from an
// agent deadline that expired first.
func TestAHungReloadReportsTheRuntimeTimeoutVerdict(t *testing.T) {
	const timeout = 400 * time.Millisecond
	for _, tc := range []struct{ dialect, version, want string }{
		{"3.4", "", "reload: no reply within 400ms"},
		{"3.0", "3.0.11-1+deb13u4", "reload: no reply within 400ms"},
		{"2.6", "2.6.12", "reload: no new worker within 400ms"},
	} {
		t.Run(tc.dialect, func(t *testing.T) {
			e := newTestEnvOn(t, tc.version, func(c *AgentConfig) { c.ReloadTimeout = timeout }, nil)
			fs := seedFiles()
			e.land(t, "plan-1", fs)
			pid := e.fake.Worker().WorkerPID
			e.fake.With(func(m *FakeModel) { m.ReloadHangs = true })
			fs2 := fs.clone()
			fs2["haproxy.cfg"] += "# 2\n"
			res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
			if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Error.Message != tc.want {
				t.Fatalf("result %+v error %+v, want stage reload message %q", res, res.Error, tc.want)
			}
			if res.Reload == nil || res.Reload.Performed || res.Reload.OK {
				t.Errorf("reload %+v: a timeout is not a performed reload", res.Reload)
			}
			if !sameSet(e.disk(t), fs) || e.fake.Worker().WorkerPID != pid {
				t.Error("the hung reload did not leave the last-known-good set and worker")
			}
			for i := 0; i < 2; i++ {
				_, err := e.a.deps.reloadWorker(e.a.deps.ctx)
				if !errors.Is(err, errReloadTimeout) || errors.Is(err, errReloadRejected) || err.Error() != tc.want {
					t.Errorf("performReload: %v (errReloadTimeout %v), want %q", err, errors.Is(err, errReloadTimeout), tc.want)
				}
			}
		})
	}
}

// HAProxy reports success but no new worker answers show info: one reload
// timeout bounds the whole reload, from sending it to the new worker's
// answer, so what is left of it bounds the wait. The failure is the agent's
// own, not HAProxy's verdict: the reload was performed (HAProxy said so) but
// is not OK, and it is not deterministic, so it is never remembered as
// known-bad.
func TestANewWorkerThatNeverAnswersFailsTheReload(t *testing.T) {
	e, fs := landedEnv(t, func(c *AgentConfig) { c.ReloadTimeout = 400 * time.Millisecond }, nil)
	old := e.fake.Worker()
	e.fake.With(func(m *FakeModel) {
		// The reload "succeeds" but the old worker keeps answering.
		m.OnReload = func(m *FakeModel) { m.Pid, m.StartTimeUnixMicros = old.WorkerPID, old.WorkerStartTimeUnixMicros }
	})
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2)
	if res.OK || res.Error == nil || res.Error.Stage != StageReload || res.Error.Message != errNoNewWorker.Error() {
		t.Fatalf("result %+v error %+v", res, res.Error)
	}
	if res.Reload == nil || !res.Reload.Performed || res.Reload.OK || res.Reload.WorkerPID != 0 {
		t.Errorf("reload %+v", res.Reload)
	}
	if e.a.deps.nack.work != nil {
		t.Errorf("a missing new worker is not a deterministic failure: %+v", e.a.deps.nack)
	}
}

// failingReloads makes the fake refuse the reloads whose 1-based number
// (counted by the agent's reload hook) is in fail.
func failingReloads(fail ...int) func(*Agent, *FakeHAProxy) {
	var n atomic.Int32
	return func(a *Agent, fake *FakeHAProxy) {
		a.deps.beforeReload = func() {
			k := int(n.Add(1))
			fake.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = slices.Contains(fail, k), failedReloadLog })
		}
	}
}

func TestAFailedReloadAfterOpsReloadsTheRestoredSet(t *testing.T) {
	e, fs := landedEnv(t, nil, failingReloads(2))
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return "No such backend.", strings.HasPrefix(cmd, "add server") }
	})
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	res := e.c.apply(e.c.manifest("plan-2", fs2, Op{Kind: OpServerAdd, Backend: "be-a", Server: "s1", Address: "10.0.0.1", Port: 80}), fs2)
	if res.OK || res.Mode != ResultRejected || res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded {
		t.Fatalf("%+v %+v", res, res.Rollback)
	}
	if res.Reload == nil || res.Reload.OK || !strings.Contains(res.Reload.Output, "unknown keyword 'bogus'") {
		t.Errorf("reload %+v", res.Reload)
	}
	// The tree is back as the apply found it and the worker reloaded it:
	// the baseline the apply started from holds again.
	if res.RunningPlanID != "plan-1" || res.LKGPlanID != "plan-1" || res.AppliedPlanID != "plan-1" {
		t.Errorf("baseline %+v", res)
	}
	if !sameSet(e.disk(t), fs) {
		t.Error("the tree is not the one the apply found")
	}
	if st := e.c.state(""); st.InvariantViolation != "" {
		t.Errorf("invariant %q", st.InvariantViolation)
	}
}

// resend composes the same work with new fencing fields against the
// current state.
func resend(e *testEnv, m *Manifest, fs fileSet) *Manifest {
	n := e.c.manifest(m.PlanID, fs, m.Ops...)
	n.Mode = m.Mode
	return n
}

func TestTheSameRejectedManifestDoesNoWorkInsideTheCooldown(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	m := reloadManifest(e, "plan-2", fs2)
	first := e.c.apply(m, fs2)
	if first.OK {
		t.Fatalf("%+v", first)
	}
	reloads := e.fake.Worker()
	var attempts int
	e.fake.With(func(m *FakeModel) { attempts = m.Reloads })
	again := resend(e, m, fs2)
	if again.Token == m.Token {
		t.Fatal("the resend does not differ in its fencing fields")
	}
	second := e.c.apply(again, fs2)
	if second.OK || second.Error == nil || *second.Error != *first.Error || second.At != first.At {
		t.Errorf("not answered from the cache: %+v", second)
	}
	e.fake.With(func(m *FakeModel) {
		if m.Reloads != attempts {
			t.Errorf("a new reload attempt: %d → %d", attempts, m.Reloads)
		}
	})
	if metricValue(e.a, "reloads_total", "failed") != 1 || e.fake.Worker() != reloads {
		t.Error("HAProxy was asked again")
	}
	if st := e.c.state(""); st.Generation != 1 || st.AppliedPlanID != "plan-1" {
		t.Errorf("state %+v", st)
	}
}

func TestKnownBadExpiresAfterSixtySeconds(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "bogus\n"
	m := reloadManifest(e, "plan-2", fs2)
	e.c.apply(m, fs2)
	e.a.clockOffset.Add(int64(61 * time.Second))
	res := e.c.apply(resend(e, m, fs2), fs2)
	if res.OK || metricValue(e.a, "reloads_total", "failed") != 2 {
		t.Errorf("the expired NACK was answered from the cache: %+v", res)
	}
}

func TestCachedNACKRequiresExactWorkDespiteDigestCollision(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	now := e.a.now()
	k := knownBad{key: "k", work: []byte("work-A"), until: now.Add(time.Minute), result: ApplyResult{PlanID: "plan-x", Mode: ResultRejected}}
	if got, hit := k.lookup("k", []byte("work-A"), now); !hit || got.PlanID != "plan-x" {
		t.Error("the exact work missed")
	}
	if _, hit := k.lookup("k", []byte("work-B"), now); hit {
		t.Error("a colliding key with other work hit")
	}
	if _, hit := k.lookup("k", nil, now); hit {
		t.Error("nil work hit")
	}
	if _, hit := k.lookup("k", []byte("work-A"), now.Add(2*time.Minute)); hit {
		t.Error("an expired record hit")
	}
	k.work = nil
	if _, hit := k.lookup("k", nil, now); hit {
		t.Error("nil work hit a record without work")
	}
	if _, hit := k.lookup("k", []byte("work-A"), now); hit {
		t.Error("a record without work hit")
	}
}

func TestATransportFailureIsNotRememberedAsKnownBad(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.StopMaster()
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# v2\n"
	m := reloadManifest(e, "plan-2", fs2)
	first := e.c.apply(m, fs2)
	if first.OK || first.Error == nil || first.Error.Message == "" || first.Reload == nil || first.Reload.Performed {
		t.Fatalf("%+v %+v", first, first.Reload)
	}
	second := e.c.apply(resend(e, m, fs2), fs2)
	if metricValue(e.a, "reloads_total", "failed") != 2 {
		t.Error("the second attempt did not reach the master")
	}
	if second.OK || second.Error == nil || second.Error.Message != first.Error.Message || second.At == "" {
		t.Errorf("second %+v", second)
	}
	if e.a.deps.nack.work != nil {
		t.Errorf("a transport failure was remembered: %+v", e.a.deps.nack)
	}
}

func TestWorkIdentityIgnoresFencingFieldsAndPatches(t *testing.T) {
	base := func() *Manifest {
		return &Manifest{IdentityVersion: 1, PlanID: "p", PlanSchemaVersion: 1, Mode: ModeAuto,
			Files: seedFiles().manifestFiles(),
			Ops:   []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "v"}}}
	}
	key := func(m *Manifest) string {
		_, k, err := workIdentity(m)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	want := key(base())
	for name, mutate := range map[string]func(*Manifest){
		"token":         func(m *Manifest) { m.Token = Token{9, 9} },
		"prev plan":     func(m *Manifest) { m.ExpectedPrevPlanID = "x" },
		"prev token":    func(m *Manifest) { m.ExpectedPrevToken = Token{3, 4} },
		"prev proof":    func(m *Manifest) { m.ExpectedPrevPlanProof = "a:3" },
		"patch":         func(m *Manifest) { m.Files[0].Patch = &FilePatch{BaseDigest: "d", BaseSize: 3, Offset: 1, Length: 1} },
		"worker proof":  func(m *Manifest) { m.WorkerOpsPlanProof = "a:7" },
		"validated ref": func(m *Manifest) { m.ValidatedPlanID, m.ValidatedPlanProof = "v", "a:1" },
	} {
		if got := key(func() *Manifest { m := base(); mutate(m); return m }()); got != want {
			t.Errorf("%s changed the work identity", name)
		}
	}
	for name, mutate := range map[string]func(*Manifest){
		"identity version":      func(m *Manifest) { m.IdentityVersion = 2 },
		"plan id":               func(m *Manifest) { m.PlanID = "q" },
		"plan proof":            func(m *Manifest) { m.PlanProof = "a:1" },
		"schema":                func(m *Manifest) { m.PlanSchemaVersion = 2 },
		"file digest":           func(m *Manifest) { m.Files[0].Digest = "0000000000000000" },
		"file proof":            func(m *Manifest) { m.Files[0].Proof = "other" },
		"ops":                   func(m *Manifest) { m.Ops[0].Value = "w" },
		"op batches":            func(m *Manifest) { m.OpBatches = [][]Op{{{Kind: OpMapDel, Path: "m", Key: "k"}}} },
		"in-place ops":          func(m *Manifest) { m.InPlaceOps = []Op{{Kind: OpMapDel, Path: "m", Key: "k"}} },
		"expected worker id":    func(m *Manifest) { m.ExpectedWorkerOpsPlanID = "w" },
		"expected worker proof": func(m *Manifest) { m.ExpectedWorkerOpsPlanProof = "a:2" },
		"worker ops plan id":    func(m *Manifest) { m.WorkerOpsPlanID = "w" },
		"mode":                  func(m *Manifest) { m.Mode = ModeReload },
	} {
		if got := key(func() *Manifest { m := base(); mutate(m); return m }()); got == want {
			t.Errorf("%s did not change the work identity", name)
		}
	}
	b, _, _ := workIdentity(base())
	if !bytes.HasPrefix(b, []byte(`{"identity_version":1,"plan_id":"p","plan_proof":"","plan_schema_version":1,"files":[`)) ||
		!bytes.HasSuffix(b, []byte(`"in_place_ops":null,"expected_worker_ops_plan_id":"","expected_worker_ops_plan_proof":"","worker_ops_plan_id":"","mode":"auto"}`)) {
		t.Errorf("work encoding %s", b)
	}
}

func TestRoleProofsAreSequential(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	fs := seedFiles()
	if res := e.land(t, "plan-1", fs); res.AppliedPlanProof != "a:1" {
		t.Fatalf("first proof %q", res.AppliedPlanProof)
	}
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	m := reloadManifest(e, "plan-2", fs2)
	if res := e.c.apply(m, fs2); res.Mode != ResultScheduled || res.AppliedPlanProof != "a:2" {
		t.Fatalf("second: %+v", res)
	}
	fs3 := fs2.clone()
	fs3["maps/host.map"] += "ip.example be-ip\n"
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "ip.example", Value: "be-ip"}
	m = e.c.manifest("plan-3", fs3)
	m.InPlaceOps, m.WorkerOpsPlanID = []Op{op}, "plan-3w"
	res := e.c.apply(m, fs3)
	if res.AppliedPlanProof != "a:3" || res.WorkerOpsPlanProof != "a:4" || res.WorkerOpsPlanID != "plan-3w" || res.Error != nil {
		t.Fatalf("in-place apply: %+v %+v", res, res.Error)
	}
	// A start resumes past any proof a lost log record could have held.
	e.restart(t)
	fs4 := fs3.clone()
	fs4["haproxy.cfg"] += "# 4\n"
	if res := e.land(t, "plan-4", fs4); res.AppliedPlanProof != fmt.Sprintf("a:%d", 4+proofsALostTailMayHold+1) {
		t.Errorf("after restart: %q", res.AppliedPlanProof)
	}
}

func TestLKGPromotionClearsTheJournal(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/n.txt"] = "n\n"
	res2 := applyFileOnly(t, e.c, "plan-2", fs2)
	all := map[string]bool{}
	for p := range fs2 {
		all[p] = true
	}
	m := e.c.manifest("plan-3", fs2)
	m.ValidatedPlanID, m.ValidatedPlanProof = "plan-2", res2.AppliedPlanProof
	code, body := e.c.post(applyRequest{manifest: m, files: fs2, omit: all})
	var res ApplyResult
	json.Unmarshal(body, &res)
	if code != 200 || !res.OK || res.LKGPlanID != "plan-2" || res.LKGPlanProof != res2.AppliedPlanProof {
		t.Fatalf("%d %s", code, body)
	}
	if ps := readStateFile(t, e.cfg.BaseDir); len(ps.Journal) != 0 {
		t.Errorf("journal %v", ps.Journal)
	}
	// The old journal's backups go with the next snapshot, which no longer
	// names them.
	e.a.deps.applyMu.Lock()
	e.a.deps.compact()
	e.a.deps.applyMu.Unlock()
	entries, _ := os.ReadDir(filepath.Join(e.a.files.base, storeLinkDir))
	if len(entries) != 0 {
		t.Errorf("backups left: %v", entries)
	}
	if st := e.c.state(""); st.InvariantViolation != "" {
		t.Errorf("invariant %q", st.InvariantViolation)
	}
}

// revertManifest names the refused plan (id and proof) against the state.
func (e *testEnv) revertManifest(planID, proof string) *Manifest {
	m := e.c.manifest(planID, nil)
	m.Mode, m.PlanProof, m.Files = ModeRevertLKG, proof, nil
	return m
}

func TestRevertLKGRestoresAndReloads(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/created.txt"] = "created\n"
	fs2["maps/host.map"] = "changed.example be-c\n"
	res2 := applyFileOnly(t, e.c, "plan-2", fs2)
	pid := e.fake.Worker().WorkerPID
	m := e.revertManifest("plan-2", res2.AppliedPlanProof)
	res := e.c.apply(m, nil)
	if !res.OK || res.Mode != ResultReload || res.Rollback == nil || !res.Rollback.Performed || !res.Rollback.Reloaded ||
		e.fake.Worker().WorkerPID == pid {
		t.Fatalf("%+v %+v", res, res.Rollback)
	}
	if !sameSet(e.disk(t), fs) {
		t.Errorf("disk %v", e.disk(t))
	}
	st := e.c.state("")
	if st.AppliedPlanID != "plan-1" || st.RunningPlanID != "plan-1" || st.LKGPlanID != "plan-1" ||
		st.AppliedPlanProof != st.LKGPlanProof || st.AppliedToken != m.Token || st.ReloadPendingAt != "" ||
		st.InvariantViolation != "" || st.Generation != 3 {
		t.Errorf("state %+v", st)
	}
	if owned, ps := readOwned(t, e.cfg.BaseDir), readStateFile(t, e.cfg.BaseDir); !slices.Equal(owned, fs.paths()) || len(ps.Journal) != 0 {
		t.Errorf("ownership %v journal %v", owned, ps.Journal)
	}
	if metricValue(e.a, "rollbacks_total") != 1 {
		t.Error("rollbacks_total")
	}
}

func TestARevertMustNameTheRefusedPlan(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/x.txt"] = "x\n"
	applyFileOnly(t, e.c, "plan-2", fs2)
	st := e.c.state("")
	for name, ref := range map[string]planRef{
		"the running pair": {st.RunningPlanID, st.RunningPlanProof},
		"an unknown pair":  {"plan-2", "a:77"},
		"no pair at all":   {"plan-9", "a:9"},
	} {
		before := e.snapshot(t)
		code, body := e.c.post(applyRequest{manifest: e.revertManifest(ref.ID, ref.Proof)})
		var c Conflict
		json.Unmarshal(body, &c)
		if code != 409 || c.Reason != ReasonRevertTargetMismatch {
			t.Errorf("%s: %d %s", name, code, body)
		}
		e.unchanged(t, before)
	}
}

func TestARevertConsumesTheScheduledReload(t *testing.T) {
	e := newTestEnv(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }, nil)
	_, _, res2 := e.landThenSchedule(t)
	res := e.c.apply(e.revertManifest("plan-2", res2.AppliedPlanProof), nil)
	if !res.OK || res.Mode != ResultReload {
		t.Fatalf("%+v", res)
	}
	st := e.c.state("")
	if st.ReloadPendingAt != "" || st.RunningPlanID != "plan-1" || st.AppliedPlanID != "plan-1" {
		t.Errorf("state %+v", st)
	}
	if ps := readStateFile(t, e.cfg.BaseDir); ps.Pending.ID != "" || !ps.PendingAt.IsZero() {
		t.Errorf("pending survived: %+v", ps)
	}
}

func TestStateReturnsThePlanOfTheAppliedPlanID(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	p1 := planOfFiles(t, fs)
	code, _ := e.c.post(applyRequest{manifest: e.c.manifest(p1.ID, fs), files: fs, plan: blobOf(t, p1)})
	if code != 200 {
		t.Fatal(code)
	}
	if st := e.c.state(""); !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blobOf(t, p1)) || !st.HoldsAppliedPlan() {
		t.Errorf("with plan: %+v", st)
	}
	if st := e.c.state("?plan=0"); !st.AppliedPlanStored || st.AppliedPlan != nil {
		t.Errorf("plan=0: %+v", st)
	}

	fs2 := fs.clone()
	fs2["notes/x.txt"] = "x\n"
	e.land(t, "plan-2", fs2)
	if st := e.c.state(""); st.AppliedPlanStored || st.AppliedPlan != nil {
		t.Errorf("a new plan without a blob: %+v", st)
	}
	p3 := planOfFiles(t, fs2)
	code, _ = e.c.post(applyRequest{manifest: e.c.manifest(p3.ID, fs2), files: fs2, plan: blobOf(t, p3)})
	if code != 200 {
		t.Fatal(code)
	}
	e.restart(t)
	if st := e.c.state(""); !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blobOf(t, p3)) || st.AppliedPlanID != p3.ID {
		t.Errorf("after restart: %+v", st)
	}
	// A clean stop wrote the blob beside the snapshot, for the agent alone.
	if fi, err := os.Stat(filepath.Join(e.cfg.BaseDir, ".haptic-agent-plan.bin")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("blob file %v %v", fi, err)
	}
	m := reloadManifest(e, p3.ID, fs2)
	e.c.apply(m, fs2)
	if st := e.c.state(""); !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blobOf(t, p3)) {
		t.Errorf("after re-binding: %+v", st)
	}
}

func TestPlanBlobIsReboundToTheNewProof(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	p := planOfFiles(t, fs)
	e.c.post(applyRequest{manifest: e.c.manifest(p.ID, fs), files: fs, plan: blobOf(t, p)})
	res := e.land(t, p.ID, fs)
	if res.AppliedPlanProof != "a:2" {
		t.Fatalf("%+v", res)
	}
	if st := e.c.state(""); !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blobOf(t, p)) {
		t.Errorf("%+v", st)
	}
	if ps := readStateFile(t, e.cfg.BaseDir); ps.Blob.Proof != "a:2" {
		t.Errorf("blob proof %q", ps.Blob.Proof)
	}
}

func TestPutPlanAnswers(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	p := planOfFiles(t, fs)
	e.land(t, p.ID, fs)
	other := planOfFiles(t, map[string]string{"haproxy.cfg": "global\n"})
	st := e.c.state("")
	dir := shortTempDir(t)
	cfg := testAgentConfig(t, e.fake)
	cfg.WorkerSocket, cfg.MasterSocket = filepath.Join(dir, "w.sock"), filepath.Join(dir, "m.sock")
	starting, _ := launchTestAgent(t, cfg, false)
	applied := "?plan_id=" + st.AppliedPlanID + "&proof=" + st.AppliedPlanProof
	tests := []struct {
		name     string
		a        *Agent
		query    string
		body     []byte
		wantCode int
		wantBody string
	}{
		{"before ready", starting, applied, []byte("b"), 503, `{"stage":"startup","message":"agent is initialising"}`},
		{"missing proof", e.a, "?plan_id=plan-1", []byte("b"), 400, `{"stage":"request","message":"plan_id and proof are required"}`},
		{"empty plan id", e.a, "?plan_id=&proof=a:1", []byte("b"), 400, `{"stage":"request","message":"plan_id and proof are required"}`},
		{"oversize", e.a, applied, bytes.Repeat([]byte("b"), MaxPlanBlobBytes+1), 400, `{"stage":"plan","message":"plan blob exceeds the 8388608-byte limit"}`},
		{"empty", e.a, applied, nil, 400, `{"stage":"plan","message":"plan blob is empty"}`},
		{"another pair", e.a, "?plan_id=" + other.ID + "&proof=a:9", blobOf(t, other), 409,
			fmt.Sprintf(`{"applied_plan_id":%q,"applied_plan_proof":%q}`, st.AppliedPlanID, st.AppliedPlanProof)},
		{"not the plan of its id", e.a, applied, []byte("garbage"), 400,
			`{"stage":"plan","message":"plan blob does not decode: decompress: invalid input: magic number mismatch"}`},
		{"the applied pair", e.a, applied, blobOf(t, p), 200,
			fmt.Sprintf(`{"plan_id":%q,"proof":%q}`, st.AppliedPlanID, st.AppliedPlanProof)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newAgentClient(t, tc.a)
			code, h, b := c.do("PUT", PathPlan+tc.query, bytes.NewReader(tc.body), "application/octet-stream")
			if code != tc.wantCode || string(b) != tc.wantBody+"\n" || h.Get("Content-Type") != "application/json" {
				t.Errorf("got %d %s", code, b)
			}
		})
	}
	if st := e.c.state(""); !bytes.Equal(st.AppliedPlan, blobOf(t, p)) {
		t.Errorf("stored %q", st.AppliedPlan)
	}
}

// testCertPEM is a certificate and its key, as HAProxy loads them.
func testCertPEM(t testing.TB) string {
	ca := newTestCA(t, "ca")
	cert, key := ca.issue(t, testCertOptions{DNSNames: []string{"example.com"}})
	return string(cert) + string(key)
}

// TestAReloadWhoseInventoryLineFailsStillFindsItsWorker: when the line
// that reads the new worker with its listings comes back cut, the identity
// alone decides: the reload lands, without an inventory.
func TestAReloadWhoseInventoryLineFailsStillFindsItsWorker(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.fake.With(func(m *FakeModel) {
		m.CutReply = func(line string) (int, bool) { return 10, strings.Contains(line, "show ssl crt-list") }
	})
	next := fs.clone()
	next["haproxy.cfg"] += "# changed\n"
	res := e.c.apply(reloadManifest(e, "plan-2", next), next)
	if !res.OK || res.Mode != ResultReload || res.HAProxy.WorkerPID != e.fake.Worker().WorkerPID {
		t.Fatalf("%+v (fake worker %d)", res, e.fake.Worker().WorkerPID)
	}
	if res.Inventory != nil {
		t.Errorf("an inventory from a cut reply: %+v", res.Inventory)
	}
}

// TestAnOpOnAPathTheApplyDeletesIsNeverSent: ops are compiled before the
// renames, while a path the apply deletes is still on disk; its old bytes
// must not be sent. The op cannot be compiled, as it cannot once the file
// is gone, and the apply reloads instead.
func TestAnOpOnAPathTheApplyDeletesIsNeverSent(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs["maps/old.map"] = "a b\n"
	e.land(t, "plan-1b", fs)
	next := fs.clone()
	delete(next, "maps/old.map")
	sentBefore := len(e.fake.Sent())
	res := e.c.apply(e.c.manifest("plan-2", next, Op{Kind: OpMapReplace, Path: "maps/old.map"}), next)
	if !res.OK || res.Mode != ResultReload || len(res.OpResults) != 0 {
		t.Fatalf("%+v", res)
	}
	for _, cmd := range e.fake.Sent()[sentBefore:] {
		if strings.Contains(cmd, "maps/old.map") {
			t.Fatalf("sent %q for a path the apply deletes", cmd)
		}
	}
	if st := e.c.state(""); st.InvariantViolation != invOpsExecutable {
		t.Errorf("invariant %q, want %q", st.InvariantViolation, invOpsExecutable)
	}
}

// TestAnOpOnAHeldFileCompilesWithNoPartStaged: an apply whose files are
// all held sends no part, and its runtime op reads the held file. Looking
// the path up among no staged parts once indexed before the search's
// verdict, panicked, and left the apply lock held.
func TestAnOpOnAHeldFileCompilesWithNoPartStaged(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	code, b := e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs, Op{Kind: OpMapReplace, Path: "maps/host.map"})})
	var res ApplyResult
	if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Mode != ResultRuntime {
		t.Fatalf("%d %s", code, b)
	}
	e.land(t, "plan-3", fs) // the apply lock was released
}

// TestAReloadReadsTheNewWorkerAndItsInventoryInOneExchange pins the
// reload's tail: once the master answers, one worker connection reads the
// new worker's identity and its inventory together, and the answer carries
// that inventory.
func TestAReloadReadsTheNewWorkerAndItsInventoryInOneExchange(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	next := fs.clone()
	next["haproxy.cfg"] += "# changed\n"
	m := reloadManifest(e, "plan-2", next)
	var before int
	e.fake.With(func(m *FakeModel) { before = m.WorkerConnections })
	res := e.c.apply(m, next)
	var after int
	e.fake.With(func(m *FakeModel) { after = m.WorkerConnections })
	if !res.OK || res.Mode != ResultReload {
		t.Fatalf("%+v", res)
	}
	if after-before != 1 {
		t.Errorf("the reload opened %d worker connections, want 1", after-before)
	}
	if res.Inventory == nil || !slices.Contains(res.Inventory.Maps, "maps/host.map") || res.HAProxy.WorkerPID != e.fake.Worker().WorkerPID {
		t.Errorf("inventory %+v of worker %d, the fake's worker is %d", res.Inventory, res.HAProxy.WorkerPID, e.fake.Worker().WorkerPID)
	}
}

func TestACreatedCertificateEntersTheInventory(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["ssl/tls.pem"] = testCertPEM(t)
	res := e.land(t, "plan-2", fs2, Op{Kind: OpCertNew, Path: "ssl/tls.pem"})
	if res.Mode != ResultRuntime || res.Inventory == nil || !slices.Contains(res.Inventory.Certs, "ssl/tls.pem") {
		t.Fatalf("%+v %+v", res, res.Inventory)
	}
	if _, ok := e.fake.Cert("ssl/tls.pem"); !ok {
		t.Error("the worker has no certificate")
	}
	if st := e.c.state(""); !slices.Contains(st.Inventory.Certs, "ssl/tls.pem") || st.Inventory.Generation != res.Inventory.Generation {
		t.Errorf("state inventory %+v", st.Inventory)
	}
	fs3 := fs2.clone()
	fs3["notes/x.txt"] = "x\n"
	if res := e.land(t, "plan-3", fs3); res.Inventory != nil {
		t.Errorf("a second ACK carried the inventory: %+v", res.Inventory)
	}
}

// Each inventory generation names one listing and rides exactly one answer:
// adopting a new worker reads its listing under a new generation, and an
// answer carries the inventory only when its generation is newer than the
// last one reported. When an apply folds a created certificate in while a new
// worker's inventory is being read, and that generation is reported, the new
// worker's listing still gets a later generation and rides the next answer.
func TestAnAdoptedWorkersInventoryGetsItsOwnGeneration(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	e.a.led.mu.Lock()
	gen := e.a.led.inventory.Generation
	e.a.led.mu.Unlock()
	var folded ApplyResult
	holdOn(e.fake, "show ssl cert", func() {
		e.a.led.foldCreated([]string{"ssl/created.pem"}, nil)
		e.a.led.fillResult(&folded)
	})
	newWorker(e.fake, false)
	if _, err := e.a.deps.checkWorker(e.a.deps.ctx); err == nil || !strings.Contains(err.Error(), "worker changed") {
		t.Fatalf("checkWorker: %v", err)
	}
	if folded.Inventory == nil || folded.Inventory.Generation != gen+1 || !slices.Contains(folded.Inventory.Certs, "ssl/created.pem") {
		t.Fatalf("the folded inventory was not reported at generation %d: %+v", gen+1, folded.Inventory)
	}
	var next ApplyResult
	e.a.led.fillResult(&next)
	if next.Inventory == nil || next.Inventory.Generation != gen+2 || slices.Contains(next.Inventory.Certs, "ssl/created.pem") {
		t.Errorf("the adopted worker's inventory did not ride the next answer at generation %d: %+v", gen+2, next.Inventory)
	}
}

// holdOn makes the fake block the first command with the given prefix
// until during has run, then lets it through.
func holdOn(fake *FakeHAProxy, prefix string, during func()) {
	var once sync.Once
	fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if strings.HasPrefix(cmd, prefix) {
				once.Do(during)
			}
			return "", false
		}
	})
}

// newWorker makes the fake's worker a different process.
func newWorker(fake *FakeHAProxy, samePID bool) {
	fake.With(func(m *FakeModel) {
		if !samePID {
			m.Pid++
		}
		m.StartTimeUnixMicros += 5_000_000
	})
}

// TestAnApplyThatReloadsAfterAnInvalidationLandsItsPlan: a worker check
// (as a verified read makes once it has re-hashed the tree) adopts a new
// worker while the apply's ops run, which invalidates the baseline; the
// apply falls back to a reload, whose new worker loads the whole set, so
// the apply lands its plan.
func TestAnApplyThatReloadsAfterAnInvalidationLandsItsPlan(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	holdOn(e.fake, "add map", func() {
		newWorker(e.fake, false)
		if info, err := e.a.deps.checkWorker(context.Background()); err == nil || info.WorkerPID != e.fake.Worker().WorkerPID {
			t.Errorf("the worker check did not adopt the new worker: %+v %v", info, err)
		}
		if st := newAgentClient(t, e.a).state(""); st.AppliedPlanID != "" {
			t.Errorf("the adoption did not invalidate the baseline: %+v", st)
		}
	})
	fs2 := fs.clone()
	fs2["maps/host.map"] += "i.example be-i\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "i.example", Value: "be-i"})
	if res.Mode != ResultReload || res.RunningPlanID != "plan-2" || res.AppliedPlanID != "plan-2" || res.AppliedPlanProof == "" {
		t.Errorf("%+v", res)
	}
	if st := e.c.state(""); st.AppliedPlanID != "plan-2" || st.InvariantViolation != "" {
		t.Errorf("state %+v", st)
	}
}

func TestApplyCommitPreservesConcurrentWorkerInvalidation(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	prevToken := e.c.state("").AppliedToken
	holdOn(e.fake, "add map", func() { e.a.led.invalidate() })
	fs2 := fs.clone()
	fs2["maps/host.map"] += "i.example be-i\n"
	res := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "i.example", Value: "be-i"})
	if res.AppliedPlanID != "" || res.AppliedPlanProof != "" || res.WorkerOpsPlanID != "" || res.AppliedToken != prevToken {
		t.Errorf("%+v", res)
	}
	if st := e.c.state(""); st.Generation != 2 || st.AppliedToken != prevToken {
		t.Errorf("state %+v", st)
	}
}

func TestAForeignWorkerFallsBackToAReload(t *testing.T) {
	for _, samePID := range []bool{false, true} {
		e, fs := landedEnv(t, nil, nil)
		newWorker(e.fake, samePID)
		fs2 := fs.clone()
		fs2["maps/host.map"] += "f.example be-f\n"
		res := e.land(t, "plan-2", fs2, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "f.example", Value: "be-f"})
		if res.Mode != ResultReload || len(res.OpResults) != 0 || res.RunningPlanID != "plan-2" {
			t.Errorf("same pid %v: %+v", samePID, res)
		}
	}
}

func TestAForeignWorkerWithTheSamePIDIsDetected(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	before := e.c.state("")
	newWorker(e.fake, true)
	st := e.c.state("?verify=1")
	if st.HAProxy.WorkerPID != before.HAProxy.WorkerPID || st.HAProxy.WorkerStartTimeUnixMicros == before.HAProxy.WorkerStartTimeUnixMicros ||
		st.AppliedPlanID != "" || st.RunningPlanID != "" {
		t.Errorf("%+v", st)
	}
}

func TestStateVerifyObservesTheTree(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	os.WriteFile(filepath.Join(e.cfg.BaseDir, "maps/host.map"), []byte("edited be-e\n"), 0o644)
	plain := e.c.state("")
	if plain.Files["maps/host.map"].Digest != DigestString(fs["maps/host.map"]) {
		t.Errorf("a plain read observed the edit: %+v", plain.Files)
	}
	v := e.c.state("?verify=1")
	if got := v.Files["maps/host.map"]; got.Digest != DigestString("edited be-e\n") || got.Proof != "" || got.Size != 12 {
		t.Errorf("verified: %+v", got)
	}
	if got := v.Files["haproxy.cfg"]; got.Proof != testProof(fs["haproxy.cfg"]) {
		t.Errorf("an unchanged file lost its proof: %+v", got)
	}
	if got := readState(t, e.cfg.BaseDir).tree; !maps.Equal(got, v.Files) {
		t.Errorf("the persisted tree %v, want the observation %v", got, v.Files)
	}
}

func TestStateVerifyObservesAForeignWorker(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	old := e.fake.Worker()
	newWorker(e.fake, false)
	// A plain read asks the worker who it is: it reports the one answering
	// and vouches for no running plan on it, without adopting it.
	if st := e.c.state(""); st.HAProxy == old || !st.HAProxy.SameWorker(e.fake.Worker()) || st.AppliedPlanID != "plan-1" ||
		st.RunningPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("plain read: %+v", st)
	}
	st := e.c.state("?verify=1")
	if st.HAProxy.WorkerPID != e.fake.Worker().WorkerPID || st.AppliedPlanID != "" || st.WorkerOpsPlanID != "" {
		t.Errorf("verified read: %+v", st)
	}
}

func TestOneBaseRelativePathEverywhere(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["maps/host.map"] += "p.example be-p\n"
	fs2["ssl/tls.pem"] = testCertPEM(t)
	e.land(t, "plan-2", fs2,
		Op{Kind: OpCertNew, Path: "ssl/tls.pem"},
		Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "p.example", Value: "be-p"})
	var sawMap, sawCert bool
	for _, cmd := range e.fake.Sent() {
		if strings.Contains(cmd, e.cfg.BaseDir) || strings.Contains(cmd, e.a.files.base) {
			t.Errorf("a command carries the base directory: %q", cmd)
		}
		sawMap = sawMap || strings.HasPrefix(cmd, "add map maps/host.map")
		sawCert = sawCert || cmd == "new ssl cert ssl/tls.pem"
	}
	if !sawMap || !sawCert {
		t.Errorf("commands %q", e.fake.Sent())
	}
	fs3 := fs2.clone()
	fs3["haproxy.cfg"] += "# reload\n"
	m := reloadManifest(e, "plan-3", fs3)
	res := e.c.apply(m, fs3)
	if res.Inventory == nil || !slices.Contains(res.Inventory.Maps, "maps/host.map") || !slices.Contains(res.Inventory.Certs, "ssl/tls.pem") {
		t.Errorf("inventory %+v", res.Inventory)
	}
}

func TestStateAndApplyRunConcurrently(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newAgentClient(t, e.a)
			for {
				select {
				case <-stop:
					return
				default:
				}
				st := c.state("?verify=1")
				if st.APIVersion != 1 {
					t.Errorf("state %+v", st)
					return
				}
			}
		}()
	}
	cur := fs
	for i := range 12 {
		next := cur.clone()
		key := fmt.Sprintf("k%d.example", i)
		next["maps/host.map"] += key + " be-k\n"
		var ops []Op
		if i%3 != 0 {
			ops = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: key, Value: "be-k"}}
		} else {
			next["haproxy.cfg"] += fmt.Sprintf("# %d\n", i)
		}
		res := e.c.apply(e.c.manifest(fmt.Sprintf("plan-c%d", i), next, ops...), next)
		if !res.OK {
			t.Errorf("apply %d: %+v", i, res)
		}
		cur = next
	}
	close(stop)
	wg.Wait()
	st := e.c.state("?verify=1")
	if st.Generation != 13 || !sameSet(e.disk(t), cur) || st.InvariantViolation != "" {
		t.Errorf("after: %+v", st)
	}
	for _, f := range cur.manifestFiles() {
		if got := st.Files[f.Path]; got.Digest != f.Digest || got.Size != f.Size {
			t.Errorf("%s: %+v", f.Path, got)
		}
	}
}

func TestVerifiedStateSerializesWorkerObservation(t *testing.T) {
	e, _ := landedEnv(t, nil, nil)
	var checked, held atomic.Bool
	e.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if strings.HasPrefix(cmd, "show info") {
				checked.Store(true)
				if e.a.deps.workerMu.TryLock() {
					e.a.deps.workerMu.Unlock()
				} else {
					held.Store(true)
				}
			}
			return "", false
		}
	})
	st := e.c.state("?verify=1")
	if !checked.Load() || !held.Load() {
		t.Errorf("show info sent %v, under the worker-observation lock %v", checked.Load(), held.Load())
	}
	if st.AppliedPlanID != "plan-1" {
		t.Errorf("applied %q", st.AppliedPlanID)
	}
}

func TestReloadSerializesWorkerObservation(t *testing.T) {
	var reloads, held atomic.Int32
	var a *Agent
	e := newTestEnv(t, nil, func(ag *Agent, _ *FakeHAProxy) {
		a = ag
		ag.deps.beforeReload = func() {
			reloads.Add(1)
			if a.deps.workerMu.TryLock() {
				a.deps.workerMu.Unlock()
			} else {
				held.Add(1)
			}
		}
	})
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	if reloads.Load() != 1 || held.Load() != 1 {
		t.Errorf("reloads %d, under the lock %d", reloads.Load(), held.Load())
	}
	if st := e.c.state(""); st.RunningPlanID != "plan-1" {
		t.Errorf("running %q", st.RunningPlanID)
	}
}

func TestARollbackOwnsEveryFileItRestores(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	p1 := seedFiles()
	p1["notes/g1.txt"] = "v1\n"
	e.land(t, "plan-1", p1)
	// A reload that deletes a file fails: the undo brings the file back,
	// and it stays the agent's, so a later apply without it deletes it.
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	p2 := p1.clone()
	delete(p2, "notes/g1.txt")
	p2["haproxy.cfg"] += "bogus\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", p2), p2); res.OK {
		t.Fatalf("%+v", res)
	}
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })
	if !sameSet(e.disk(t), p1) {
		t.Fatalf("the undo left %v", e.disk(t).paths())
	}
	p3 := p1.clone()
	delete(p3, "notes/g1.txt")
	e.c.apply(reloadManifest(e, "plan-3", p3), p3)
	if got := e.disk(t); !sameSet(got, p3) {
		t.Errorf("the restored file was not deleted by a later apply: %v", got.paths())
	}
}

func TestRoleProofSequenceExhaustionIsAnIdentityError(t *testing.T) {
	fake := startTestFake(t, "")
	cfg := testAgentConfig(t, fake)
	writeSnapshot(t, cfg.BaseDir, agentState{ProofGeneration: 18446744073709551615}, nil, 0)
	a, _ := launchTestAgent(t, cfg, true)
	c := newAgentClient(t, a)
	fs := seedFiles()
	code, body := c.post(applyRequest{manifest: c.manifest("plan-1", fs), files: fs})
	if ae := applyErr(t, body); code != 500 || ae.Stage != StageIdentity || ae.Message != "agent role proof sequence exhausted" {
		t.Errorf("%d %+v", code, ae)
	}
	if len(diskSet(t, cfg.BaseDir)) != 0 {
		t.Error("files landed")
	}
}

// TestFenceReasonTable pins the fence rules as a pure function of the
// manifest, the agent's state and whether in-place ops will run. "held" is
// an agent whose last apply landed plan-1; "aborted" is the same agent after
// an aborted apply: the applied plan and its proof are forgotten while the
// worker reference is kept, because the worker still runs plan-1.
func TestFenceReasonTable(t *testing.T) {
	p1 := planRef{"plan-1", "a:1"}
	held := agentState{Applied: p1, Running: p1, WorkerOps: p1, LKG: p1, Token: Token{LeaderEpoch: 1, RenderSeq: 1}}
	aborted := held
	aborted.Applied = planRef{}
	inPlace := func(m *Manifest) {
		m.InPlaceOps = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "v"}}
		m.WorkerOpsPlanID = "plan-2w"
	}
	wrongWorker := func(m *Manifest) { m.ExpectedWorkerOpsPlanProof = "a:99" }
	for _, tc := range []struct {
		name        string
		state       agentState
		mode        string
		mutate      []func(*Manifest)
		inPlaceRuns bool
		want        string
	}{
		{"auto against the held plan passes", held, ModeAuto, nil, false, ""},
		{"reload against the held plan passes", held, ModeReload, nil, false, ""},
		{"1 an older epoch", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.Token.LeaderEpoch = 0 }}, false, ReasonStaleEpoch},
		{"2 a revert of the running plan", held, ModeRevertLKG, []func(*Manifest){func(m *Manifest) {
			m.PlanID, m.PlanProof = "plan-1", "a:1"
		}}, false, ReasonRevertTargetMismatch},
		{"3 another previous plan", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevPlanID = "plan-0" }}, false, ReasonPrevMismatch},
		{"3 a previous plan the agent does not hold", aborted, ModeAuto, []func(*Manifest){func(m *Manifest) {
			m.ExpectedPrevPlanID = "plan-1"
		}}, false, ReasonUnknownBaseline},
		{"4 another previous token", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevToken.RenderSeq++ }}, false, ReasonPrevMismatch},
		{"5 auto without the previous proof", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevPlanProof = "" }}, false, ReasonPrevMismatch},
		{"5 auto with another previous proof", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevPlanProof = "a:9" }}, false, ReasonPrevMismatch},
		// The agent holds no applied proof: the manifest quotes exactly
		// what it holds (no plan, no proof) and the right worker, and an
		// exact auto apply must still be refused.
		{"5 auto after an abort", aborted, ModeAuto, nil, false, ReasonPrevMismatch},
		{"5 auto after an abort with in-place ops", aborted, ModeAuto, []func(*Manifest){inPlace}, true, ReasonPrevMismatch},
		{"6 a reload needs no applied proof the agent does not hold", aborted, ModeReload, nil, false, ""},
		{"6 reload with another previous proof", held, ModeReload, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevPlanProof = "a:9" }}, false, ReasonPrevMismatch},
		{"6 reload without the previous proof the agent holds", held, ModeReload, []func(*Manifest){func(m *Manifest) { m.ExpectedPrevPlanProof = "" }}, false, ReasonPrevMismatch},
		{"7 auto against another worker proof", held, ModeAuto, []func(*Manifest){wrongWorker}, false, ReasonWorkerOpsMismatch},
		{"7 auto against another worker plan", held, ModeAuto, []func(*Manifest){func(m *Manifest) { m.ExpectedWorkerOpsPlanID = "plan-0" }}, false, ReasonWorkerOpsMismatch},
		// A reload's in-place ops run on the current worker when a reload
		// is pending or the pacing window is open: they need its exact
		// baseline like an auto apply's ops.
		{"7 reload whose in-place ops will run, another worker proof", held, ModeReload, []func(*Manifest){inPlace, wrongWorker}, true, ReasonWorkerOpsMismatch},
		{"7 reload whose in-place ops will run, another worker plan", held, ModeReload, []func(*Manifest){inPlace, func(m *Manifest) {
			m.ExpectedWorkerOpsPlanID = "plan-0"
		}}, true, ReasonWorkerOpsMismatch},
		{"7 reload whose in-place ops will run, the right worker", held, ModeReload, []func(*Manifest){inPlace}, true, ""},
		{"7 reload whose in-place ops will not run", held, ModeReload, []func(*Manifest){inPlace, wrongWorker}, false, ""},
		{"7 reload without in-place ops ignores the worker", held, ModeReload, []func(*Manifest){wrongWorker}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			m := &Manifest{
				IdentityVersion: ExactIdentityVersion, PlanID: "plan-2", Mode: tc.mode,
				Token:              Token{LeaderEpoch: 1, RenderSeq: 2},
				ExpectedPrevPlanID: s.Applied.ID, ExpectedPrevPlanProof: s.Applied.Proof, ExpectedPrevToken: s.Token,
				ExpectedWorkerOpsPlanID: s.WorkerOps.ID, ExpectedWorkerOpsPlanProof: s.WorkerOps.Proof,
			}
			for _, f := range tc.mutate {
				f(m)
			}
			if got := fenceReason(m, &s, tc.inPlaceRuns); got != tc.want {
				t.Errorf("fenceReason = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestInPlaceWillRun pins when a manifest's in-place ops run: only when it
// carries some, and a reload is pending or this reload lands inside the
// pacing window.
func TestInPlaceWillRun(t *testing.T) {
	with := &Manifest{Mode: ModeReload, InPlaceOps: []Op{{Kind: OpMapAdd, Path: "m", Key: "k", Value: "v"}}}
	withAuto := &Manifest{Mode: ModeAuto, InPlaceOps: with.InPlaceOps}
	without := &Manifest{Mode: ModeReload}
	for _, tc := range []struct {
		name            string
		m               *Manifest
		pending, window bool
		want            bool
	}{
		{"reload, pending", with, true, false, true},
		{"reload, window open", with, false, true, true},
		{"reload, neither", with, false, false, false},
		{"auto, pending", withAuto, true, false, true},
		{"auto, window open", withAuto, false, true, false},
		{"no in-place ops", without, true, true, false},
	} {
		if got := inPlaceWillRun(tc.m, tc.pending, tc.window); got != tc.want {
			t.Errorf("%s: inPlaceWillRun = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// wantFenced posts m and requires a 409 Conflict with reason, nothing
// written, the baseline unchanged and no map command sent to the worker.
func (e *testEnv) wantFenced(t *testing.T, m *Manifest, fs fileSet, reason string) {
	t.Helper()
	before := e.snapshot(t)
	sent := len(e.fake.Sent())
	code, body := e.c.post(applyRequest{manifest: m, files: fs})
	var c Conflict
	json.Unmarshal(body, &c)
	if code != http.StatusConflict || c.Reason != reason {
		t.Errorf("got %d %s, want 409 %s", code, body, reason)
	}
	e.unchanged(t, before)
	for _, cmd := range e.fake.Sent()[sent:] {
		if strings.Contains(cmd, " map ") {
			t.Errorf("a fenced apply sent %q", cmd)
		}
	}
}

// TestAnApplyThatFailedBeforeReloadingKeepsTheBaseline: an apply whose
// write fails puts back what it changed and never reached the worker, so
// the baseline it began with still holds: the next one-entry change is a
// runtime apply.
func TestAnApplyThatFailedBeforeReloadingKeepsTheBaseline(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	// A directory stands where the apply writes a file: the write fails,
	// the apply aborts, and the applied plan is unknown.
	os.MkdirAll(filepath.Join(e.cfg.BaseDir, "blocked.txt", "x"), 0o755)
	fs2 := fs.clone()
	fs2["haproxy.cfg"] += "# 2\n"
	fs2["blocked.txt"] = "never written\n"
	if res := e.c.apply(reloadManifest(e, "plan-2", fs2), fs2); res.OK || res.Mode != ResultRejected {
		t.Fatalf("the aborted apply: %+v", res)
	}
	st := e.c.state("")
	if st.AppliedPlanID != "plan-1" || st.AppliedPlanProof == "" || st.WorkerOpsPlanID != "plan-1" || st.WorkerOpsPlanProof == "" {
		t.Fatalf("after the abort: applied %q/%q, worker ops %q/%q", st.AppliedPlanID, st.AppliedPlanProof, st.WorkerOpsPlanID, st.WorkerOpsPlanProof)
	}
	fs3 := fs.clone()
	fs3["maps/host.map"] += "x.example be-x\n"
	if res := e.land(t, "plan-3", fs3, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "x.example", Value: "be-x"}); res.Mode != ResultRuntime {
		t.Errorf("the next change after the abort: %+v", res)
	}
}

// TestAReloadWhoseInPlaceOpsWillRunNeedsTheWorkerBaseline: a reload whose
// in-place ops will run on the current worker (a reload is pending, or the
// reload lands inside the pacing window) is refused with
// worker_ops_mismatch when it quotes another worker proof; quoting the right
// one, the same apply is taken and its in-place op runs.
func TestAReloadWhoseInPlaceOpsWillRunNeedsTheWorkerBaseline(t *testing.T) {
	paced := func(c *AgentConfig) { c.ReloadIntervalMin = time.Minute }
	withInPlace := func(e *testEnv, planID string, fs fileSet) *Manifest {
		m := reloadManifest(e, planID, fs)
		m.InPlaceOps, m.WorkerOpsPlanID = []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: "ip.example", Value: "be-ip"}}, planID+"w"
		return m
	}
	check := func(t *testing.T, e *testEnv, planID string, fs fileSet) {
		t.Helper()
		m := withInPlace(e, planID, fs)
		right := m.ExpectedWorkerOpsPlanProof
		m.ExpectedWorkerOpsPlanProof = "a:99"
		e.wantFenced(t, m, fs, ReasonWorkerOpsMismatch)
		m = withInPlace(e, planID, fs)
		if m.ExpectedWorkerOpsPlanProof != right {
			t.Fatalf("the fence moved the worker proof: %q → %q", right, m.ExpectedWorkerOpsPlanProof)
		}
		res := e.c.apply(m, fs)
		if !res.OK || res.Mode != ResultScheduled || res.Error != nil || len(res.OpResults) != 1 {
			t.Errorf("with the right worker proof: %+v %+v", res, res.Error)
		}
		if !slices.ContainsFunc(e.fake.MapEntries("maps/host.map"), func(me MapEntry) bool { return me.Key == "ip.example" }) {
			t.Errorf("the in-place op did not reach the worker: %v", e.fake.MapEntries("maps/host.map"))
		}
	}
	t.Run("a reload is pending", func(t *testing.T) {
		e := newTestEnv(t, paced, nil)
		_, fs2, _ := e.landThenSchedule(t)
		fs3 := fs2.clone()
		fs3["maps/host.map"] += "ip.example be-ip\n"
		fs3["haproxy.cfg"] += "# 3\n"
		check(t, e, "plan-3", fs3)
	})
	t.Run("inside the pacing window", func(t *testing.T) {
		e, fs := landedEnv(t, paced, nil)
		if st := e.c.state(""); st.ReloadPendingAt != "" {
			t.Fatalf("a reload is pending: %q", st.ReloadPendingAt)
		}
		fs2 := fs.clone()
		fs2["maps/host.map"] += "ip.example be-ip\n"
		fs2["haproxy.cfg"] += "# 2\n"
		check(t, e, "plan-2", fs2)
	})
}

// TestAFullLogIsCompactedAfterTheAnswer: once the log is full, the apply
// that finds it so is answered first and compacts after: the log is then
// only the numbers record a compaction starts it with.
func TestAFullLogIsCompactedAfterTheAnswer(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	e.a.deps.applyMu.Lock()
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogRecords
	e.a.deps.led.mu.Unlock()
	e.a.deps.applyMu.Unlock()
	fs2 := fs.clone()
	fs2["notes/n.txt"] = "n\n"
	applyFileOnly(t, e.c, "plan-2", fs2)
	e.a.deps.applyMu.Lock() // the compaction holds it, if it has begun
	e.a.deps.applyMu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.a.deps.led.mu.Lock()
		count := e.a.deps.led.log.count
		e.a.deps.led.mu.Unlock()
		if count == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log holds %d records after the apply that found it full", count)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A revert whose reload HAProxy refuses fails at its own stage,
// revert_reload, in the answer and in haptic_agent_apply_rejected_total:
// an operator tells a refused last-known-good set from a refused render.
func TestARefusedRevertReloadFailsAtRevertReload(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2["notes/created.txt"] = "created\n"
	res2 := applyFileOnly(t, e.c, "plan-2", fs2)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	res := e.c.apply(e.revertManifest("plan-2", res2.AppliedPlanProof), nil)
	if res.OK || res.Error == nil || res.Error.Stage != StageRevertReload {
		t.Fatalf("the refused revert: %s; want a failure at stage %s", jsonOf(res), StageRevertReload)
	}
	if n := metricValue(e.a, "apply_rejected_total", StageRevertReload); n != 1 {
		t.Errorf("apply_rejected_total{stage=revert_reload} = %d, want 1", n)
	}
}

// A revert after a restart finds the last-known-good bytes the journal
// linked aside in the agent's previous run. The restarted agent's first
// link of the same path (a patch's base, which the record needs beside the
// journal's backup) must never take that backup's name: before, both were
// "1-<digest of the path>", the new link replaced the backup, and the
// revert found no copy of the last-known-good bytes left.
func TestARevertAfterARestartFindsTheJournalsBackups(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	fs2 := fs.clone()
	fs2[ConfigFilePath] = strings.Replace(fs[ConfigFilePath], "maxconn 100", "maxconn 200", 1)
	applyFileOnly(t, e.c, "plan-2", fs2)
	e.restart(t)
	fs3 := fs2.clone()
	fs3[ConfigFilePath] = strings.Replace(fs2[ConfigFilePath], "maxconn 200", "maxconn 300", 1)
	m := e.c.manifest("plan-3", fs3)
	patch, repl := patchOf(fs2[ConfigFilePath], fs3[ConfigFilePath])
	m.Files[slices.IndexFunc(m.Files, func(f ManifestFile) bool { return f.Path == ConfigFilePath })].Patch = patch
	code, body := e.c.post(applyRequest{manifest: m, files: fs3, override: map[string]string{ConfigFilePath: repl},
		omit: map[string]bool{"maps/host.map": true}})
	var res3 ApplyResult
	if code != http.StatusOK || json.Unmarshal(body, &res3) != nil || !res3.OK || res3.Mode != ResultFileOnly {
		t.Fatalf("plan-3 as a patch: %d %s", code, body)
	}
	res := e.c.apply(e.revertManifest("plan-3", res3.AppliedPlanProof), nil)
	if !res.OK || res.Rollback == nil || !res.Rollback.Performed {
		t.Fatalf("the revert: %s", jsonOf(res))
	}
	if got := e.disk(t); !sameSet(got, fs) {
		t.Errorf("the revert did not bring back the last-known-good set:\n%s", describeSetDiff(got, fs))
	}
}
