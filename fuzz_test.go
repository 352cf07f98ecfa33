// This file owns the fuzz targets that cross several files: the manifest's
// decode and validation path, the multipart apply body through the agent's
// handler on a real file tree, the runtime layer's reply classification,
// and command compilation with its payload framing. Each target checks
// properties that must hold for every input (never a panic, never a write
// outside the base directory, no newline inside a command, no payload that
// ends itself) and is quick per input, so `go test -fuzz` explores many.
// FuzzParseMapEntries lives beside ParseMapEntries in renderplan_test.go.
//
// It must never fix what it finds: a failing input is a finding for the
// owner of the code under test.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// Manifest decoding and validation.

// fuzzManifestSeeds are manifests that reach every branch of validation:
// the wire fixture, a legacy manifest, a revert, in-place ops, batches.
func fuzzManifestSeeds(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "wire", "manifest.json")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{"plan_id":"p1","plan_schema_version":1,"files":[{"path":"haproxy.cfg","digest":"ef46db3751d8e999","size":0}],"mode":"auto"}`,
		`{"identity_version":1,"plan_id":"p2","files":[{"path":"haproxy.cfg","digest":"d"},{"path":"../x","digest":"d"}],"mode":"reload"}`,
		`{"identity_version":1,"plan_id":"p3","plan_proof":"a:1","files":[],"mode":"revert_lkg"}`,
		`{"identity_version":1,"plan_id":"p4","files":[{"path":"haproxy.cfg","digest":"d"}],"in_place_ops":[{"kind":"map_set","path":"m","key":"k","value":"v"}],"expected_worker_ops_plan_id":"w","worker_ops_plan_id":"w2","expected_worker_ops_plan_proof":"a:2","mode":"auto"}`,
		`{"identity_version":1,"plan_id":"p5","files":[{"path":"haproxy.cfg","digest":"d"}],"ops":[{"kind":"map_add","path":"m","key":"k"}],"op_batches":[[],[{"kind":"x"}]],"expected_worker_ops_plan_proof":"a:1","mode":"auto"}`,
		`{"identity_version":1,"plan_id":"p6","files":[{"path":"haproxy.cfg","digest":"d"},{"path":"haproxy.cfg","digest":"d"}],"mode":"teleport"}`,
		`{"identity_version":1,"plan_id":"p7","validated_plan_id":"v","files":[{"path":".haptic-agent.json","digest":"d"}],"mode":"auto"}`,
		`[]`, `{"files":null}`, `{"ops":[{"weight":-1}]}`,
	} {
		f.Add([]byte(s))
	}
}

// manifestBody wraps b as the manifest part of an apply body.
func manifestBody(b []byte) (*multipart.Reader, error) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	pw, err := w.CreateFormField(PartManifest)
	if err != nil {
		return nil, err
	}
	pw.Write(b)
	w.Close()
	return multipart.NewReader(&buf, w.Boundary()), nil
}

// FuzzManifestDecodeAndValidate runs the handler's manifest path — read the
// part, normalise a legacy manifest, validate, auto-downgrade, derive the
// work identity — on arbitrary JSON, against a real file store. Nothing may
// panic, and a manifest that passes must hold up on its own: a legacy one
// keeps none of the exact-identity fields, a valid one satisfies every
// validation rule (checkValidManifest), an automatic one without a worker
// proof is downgraded to a reload, and its work identity ignores the
// fencing fields and patches.
func FuzzManifestDecodeAndValidate(f *testing.F) {
	base := f.TempDir()
	store, err := newFileStore(fileStoreConfig{
		Base:     base,
		Reserved: []string{filepath.Join(base, ".haptic-agent.json"), filepath.Join(base, "haproxy-worker.sock"), filepath.Join(base, "run", "master.sock")},
		Config:   ConfigFilePath,
		Logger:   testLogger(),
	})
	if err != nil {
		f.Fatal(err)
	}
	fuzzManifestSeeds(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		mr, err := manifestBody(raw)
		if err != nil {
			t.Skip()
		}
		held := &heldBytes{budget: newMemoryBudget(), ctx: context.Background()}
		m, err := readManifest(mr, held)
		if err != nil {
			return
		}
		legacy := m.IdentityVersion != ExactIdentityVersion
		normaliseLegacy(m)
		if legacy && (len(m.Ops) > 0 || len(m.OpBatches) > 0 || len(m.InPlaceOps) > 0 || m.ValidatedPlanID != "") {
			t.Fatalf("a legacy manifest kept exact-identity fields: %+v", m)
		}
		err = validateManifest(m, ConfigFilePath, store.abs)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("a refusal without a message")
			}
			return
		}
		checkValidManifest(t, m, store)
		autoDowngrade(m)
		if m.Mode == ModeAuto && m.ExpectedWorkerOpsPlanProof == "" && len(m.InPlaceOps) == 0 {
			t.Fatal("an auto manifest without a worker proof was not downgraded")
		}
		if m.Mode == ModeReload && legacy && len(m.RuntimeOps()) > 0 {
			t.Fatal("a downgraded manifest still carries runtime ops")
		}
		work, key, err := workIdentity(m)
		if err != nil {
			t.Fatalf("work identity of a valid manifest: %v", err)
		}
		// The work identity ignores the fencing fields and patches.
		fenced := *m
		fenced.Token = Token{LeaderEpoch: m.Token.LeaderEpoch + 1, RenderSeq: 7}
		fenced.ExpectedPrevPlanID, fenced.ExpectedPrevPlanProof = "other", "other"
		fenced.ExpectedPrevToken = Token{LeaderEpoch: 9}
		fenced.Files = slices.Clone(m.Files)
		for i := range fenced.Files {
			fenced.Files[i].Patch = &FilePatch{BaseDigest: "x", BaseSize: 1}
		}
		work2, key2, err := workIdentity(&fenced)
		if err != nil || key2 != key || !bytes.Equal(work, work2) {
			t.Fatalf("the work identity moved with fencing fields: %s vs %s", key, key2)
		}
	})
}

// checkValidManifest restates the validation rules as properties of a
// manifest that validation passed: within the op, batch and file limits,
// every continuation batch of 1 to 1000 ops, a plan id, a known mode (a
// revert only with exact identity and the refused plan's proof), valid and
// distinct paths that stay inside the base, each with a digest, and the
// config file listed unless it is a revert.
func checkValidManifest(t *testing.T, m *Manifest, store *fileStore) {
	t.Helper()
	n := len(m.Ops) + len(m.InPlaceOps)
	if n > MaxOpsPerApply || 1+len(m.OpBatches) > MaxOpBatches || m.PlanID == "" || len(m.Files) > MaxFiles {
		t.Fatalf("a manifest over a limit passed: %d ops, %d batches, plan %q, %d files", n, len(m.OpBatches), m.PlanID, len(m.Files))
	}
	for i, batch := range m.OpBatches {
		if len(batch) == 0 || len(batch) > MaxOpsPerApply {
			t.Fatalf("batch %d of %d ops passed", i+2, len(batch))
		}
	}
	if len(m.RuntimeOps()) != len(m.Ops)+countOps(m.OpBatches) {
		t.Fatal("RuntimeOps lost or invented ops")
	}
	switch m.Mode {
	case ModeAuto, ModeReload:
	case ModeRevertLKG:
		if m.IdentityVersion != ExactIdentityVersion || m.PlanProof == "" {
			t.Fatal("a revert without exact identity and proof passed")
		}
	default:
		t.Fatalf("mode %q passed", m.Mode)
	}
	seen := map[string]bool{}
	for _, file := range m.Files {
		if err := validatePath(file.Path); err != nil {
			t.Fatalf("path %q passed validation but ValidatePath says %v", file.Path, err)
		}
		abs, err := store.abs(file.Path)
		if err != nil {
			t.Fatalf("path %q passed validation but Abs says %v", file.Path, err)
		}
		if rel, err := filepath.Rel(store.base, abs); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("path %q resolves outside the base: %s", file.Path, abs)
		}
		if seen[file.Path] || file.Digest == "" {
			t.Fatalf("duplicate or digestless file %q passed", file.Path)
		}
		seen[file.Path] = true
	}
	if m.Mode != ModeRevertLKG && !seen[ConfigFilePath] {
		t.Fatal("a manifest without the config file passed")
	}
}

func countOps(batches [][]Op) int {
	n := 0
	for _, b := range batches {
		n += len(b)
	}
	return n
}

// ---------------------------------------------------------------------------
// The multipart apply body through the handler.

// fuzzBoundary is the fixed boundary of raw fuzzed bodies.
const fuzzBoundary = "hapticfuzzboundary"

// fuzzSandbox is an agent whose base directory sits inside a sandbox that
// also holds files the agent must never touch.
type fuzzSandbox struct {
	root, base string
	a          *Agent
	mux        http.Handler
	outside    map[string]string // path under root (outside base) → a fingerprint
}

// startFuzzSandbox starts a fake HAProxy and an agent on sandbox/base,
// lands a first plan, and records everything around the base directory.
func startFuzzSandbox(f *testing.F) *fuzzSandbox {
	root, err := os.MkdirTemp("", "hpfuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(root) })
	sb := &fuzzSandbox{root: root, base: filepath.Join(root, "base")}
	for p, content := range map[string]string{
		"sentinel.txt":       "outside the base\n",
		"haproxy.cfg":        "a config the agent does not own\n",
		"outside/maps/x.map": "k v\n",
		"base-sibling/file":  "next to the base\n",
	} {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	os.MkdirAll(sb.base, 0o755)
	fake := startTestFake(f, "")
	loadOnReload(fake, sb.base)
	sb.a = startTestAgent(f, fake, func(c *AgentConfig) { c.BaseDir = sb.base })
	sb.mux = sb.a.apiMux()
	sb.outside = sb.fingerprintOutside(f)
	// A first plan, so that later manifests can fence and run at runtime.
	res := sb.applyStructured(f, "maps/host.map", []byte("example.com be-a\n"))
	if res.code != http.StatusOK {
		f.Fatalf("seed apply: %d %s", res.code, res.body)
	}
	return sb
}

// fingerprintOutside lists every entry under the sandbox root that is not
// inside the base directory, with its type, size and content.
func (sb *fuzzSandbox) fingerprintOutside(t testing.TB) map[string]string {
	out := map[string]string{}
	filepath.WalkDir(sb.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out[p] = "error " + err.Error()
			return nil
		}
		if p == sb.base {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			out[p] = "error " + err.Error()
			return nil
		}
		fp := info.Mode().String()
		if info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			fp += " " + DigestString(string(b))
		}
		out[p] = fp
		return nil
	})
	return out
}

// checkNothingEscaped fails when anything around the base directory changed
// or when the base holds a non-regular file other than the agent's own
// directories and sockets.
func (sb *fuzzSandbox) checkNothingEscaped(t *testing.T) {
	t.Helper()
	now := sb.fingerprintOutside(t)
	for p, fp := range now {
		if sb.outside[p] != fp {
			t.Fatalf("%s changed outside the base directory: %q, was %q", p, fp, sb.outside[p])
		}
	}
	for p := range sb.outside {
		if _, ok := now[p]; !ok {
			t.Fatalf("%s vanished outside the base directory", p)
		}
	}
	filepath.WalkDir(sb.base, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink != 0 {
			t.Fatalf("the agent left a symlink in its tree: %s", p)
		}
		return nil
	})
}

type fuzzAnswer struct {
	code int
	body []byte
}

// serve sends one apply body through the agent's API handler in-process.
func (sb *fuzzSandbox) serve(body []byte, contentType string) fuzzAnswer {
	req := httptest.NewRequest("POST", PathApply, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.SetBasicAuth("haptic", "s3cret")
	rec := httptest.NewRecorder()
	sb.mux.ServeHTTP(rec, req)
	return fuzzAnswer{code: rec.Code, body: rec.Body.Bytes()}
}

// currentState reads GET /v1/state through the handler.
func (sb *fuzzSandbox) currentState(t testing.TB) State {
	req := httptest.NewRequest("GET", PathState+"?plan=0", nil)
	req.SetBasicAuth("haptic", "s3cret")
	rec := httptest.NewRecorder()
	sb.mux.ServeHTTP(rec, req)
	var st State
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("state: %d %s", rec.Code, rec.Body.Bytes())
	}
	return st
}

const fuzzConfig = "global\n  maxconn 100\n"

// applyStructured sends an exact-identity auto manifest for the config
// plus one file at rel with content, composed against the current state,
// with both parts, the file part named by rel as given.
func (sb *fuzzSandbox) applyStructured(t testing.TB, rel string, content []byte) fuzzAnswer {
	st := sb.currentState(t)
	files := []ManifestFile{{Path: ConfigFilePath, Digest: DigestString(fuzzConfig), Proof: testProof(fuzzConfig),
		Size: int64(len(fuzzConfig)), Kind: FileKindConfig, ReloadOnChange: true}}
	if rel != ConfigFilePath {
		files = append(files, ManifestFile{Path: rel, Digest: Digest(content), Proof: "c:" + Digest(content),
			Size: int64(len(content)), Kind: fileKind(rel)})
	}
	m := &Manifest{IdentityVersion: ExactIdentityVersion, PlanID: "fuzz-" + Digest(append([]byte(rel), content...)),
		PlanSchemaVersion: PlanSchemaVersion, Token: Token{LeaderEpoch: 1, RenderSeq: st.AppliedToken.RenderSeq + 1},
		ExpectedPrevPlanID: st.AppliedPlanID, ExpectedPrevPlanProof: st.AppliedPlanProof, ExpectedPrevToken: st.AppliedToken,
		ExpectedWorkerOpsPlanID: st.WorkerOpsPlanID, ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files: files, Mode: ModeAuto}
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	w.SetBoundary(fuzzBoundary)
	pw, _ := w.CreateFormField(PartManifest)
	pw.Write(mb)
	pw, _ = w.CreateFormFile(ConfigFilePath, ConfigFilePath)
	io.WriteString(pw, fuzzConfig)
	if rel != ConfigFilePath {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+escapeQuotes(rel)+`"`)
		pw, _ = w.CreatePart(h)
		pw.Write(content)
	}
	w.Close()
	return sb.serve(buf.Bytes(), w.FormDataContentType())
}

// escapeQuotes escapes a filename for a Content-Disposition header the way
// mime/multipart does.
func escapeQuotes(s string) string {
	return strings.NewReplacer("\\", "\\\\", `"`, "\\\"").Replace(s)
}

// fuzzBodySeeds are raw bodies: a well-formed apply, a traversal attempt, a
// second plan part, a part without a filename, a truncated body.
func fuzzBodySeeds() [][]byte {
	part := func(disposition, content string) string {
		return "--" + fuzzBoundary + "\r\nContent-Disposition: " + disposition + "\r\n\r\n" + content + "\r\n"
	}
	manifest := `{"identity_version":1,"plan_id":"raw","files":[{"path":"haproxy.cfg","digest":"` + DigestString(fuzzConfig) + `","size":` + itoa(len(fuzzConfig)) + `},{"path":"a/b.txt","digest":"` + DigestString("x") + `","size":1}],"mode":"reload"}`
	end := "--" + fuzzBoundary + "--\r\n"
	return [][]byte{
		[]byte(part(`form-data; name="manifest"`, manifest) + part(`form-data; name="file"; filename="haproxy.cfg"`, fuzzConfig) + part(`form-data; name="file"; filename="a/b.txt"`, "x") + end),
		[]byte(part(`form-data; name="manifest"`, strings.ReplaceAll(manifest, "a/b.txt", "../escape-probe")) + part(`form-data; name="file"; filename="../escape-probe"`, "x") + end),
		[]byte(part(`form-data; name="manifest"`, manifest) + part(`form-data; name="plan"`, "blob") + part(`form-data; name="plan"; filename="plan"`, "blob") + end),
		[]byte(part(`form-data; name="manifest"`, manifest) + part(`form-data; name="file"`, "x") + end),
		[]byte(part(`form-data; name="manifest"`, manifest)[:40]),
		[]byte(part(`form-data; name="other"`, "{}") + end),
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// Running the fuzz targets: `go test -run '^$' -fuzz '^FuzzX$' -fuzztime 60s
// -fuzzminimizetime 100x .`. The iteration bound on minimisation matters
// for FuzzApplyBody and FuzzCompileOp: Go minimises every input that adds
// coverage, and FuzzApplyBody's coverage is not deterministic (the agent's
// pacer and deferred-delete queue run beside it), so an unbounded
// minimisation spends the whole budget on a handful of inputs.

// FuzzApplyBody sends two bodies per input through the agent's handler on
// a real tree and a fake HAProxy: a structured apply whose one extra file
// has a fuzzed path and content (with a correct digest, so valid paths are
// written for real), and the raw fuzzed bytes as a multipart body. Every
// answer must be 200, 400 or 409; nothing around the base directory may
// change; the agent must keep answering.
func FuzzApplyBody(f *testing.F) {
	sb := startFuzzSandbox(f)
	for i, raw := range fuzzBodySeeds() {
		paths := []string{"maps/host.map", "../escape-probe", "/etc/passwd", "a/../../sentinel.txt", ".haptic-agent.json", "haproxy-worker.sock", "sub/dir/file.txt"}
		f.Add(paths[i%len(paths)], []byte("content "+itoa(i)+"\n"), raw)
	}
	f.Fuzz(func(t *testing.T, rel string, content []byte, raw []byte) {
		// Every input costs an apply on a real tree; small inputs keep the
		// fuzzer's minimisation of each new input within seconds.
		if len(rel) > 2*MaxPathBytes || len(content) > 4<<10 || len(raw) > 16<<10 {
			t.Skip()
		}
		structured := sb.applyStructured(t, rel, content)
		checkFuzzAnswer(t, structured)
		var res ApplyResult
		if structured.code == http.StatusOK && json.Unmarshal(structured.body, &res) == nil && res.OK && rel != ConfigFilePath {
			// An OK apply holds exactly the bytes it was sent.
			if b, err := os.ReadFile(filepath.Join(sb.base, rel)); err != nil || !bytes.Equal(b, content) {
				t.Fatalf("after an OK apply %q holds other bytes (%v)", rel, err)
			}
		}
		checkFuzzAnswer(t, sb.serve(raw, "multipart/form-data; boundary="+fuzzBoundary))
		sb.checkNothingEscaped(t)
		rec := httptest.NewRecorder()
		sb.mux.ServeHTTP(rec, httptest.NewRequest("GET", PathHealthz, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("healthz %d after the input", rec.Code)
		}
	})
}

// checkFuzzAnswer allows the answers a malformed or fenced apply may get.
func checkFuzzAnswer(t *testing.T, ans fuzzAnswer) {
	t.Helper()
	switch ans.code {
	case http.StatusOK, http.StatusBadRequest, http.StatusConflict:
	default:
		t.Fatalf("answer %d: %s", ans.code, ans.body)
	}
}

// ---------------------------------------------------------------------------
// Reply classification.

// fuzzCommands turns shape bytes into a line's commands: each byte picks an
// anchor (quiet, Done, Success, New server registered, chang, Server
// deleted) and whether the command captures a map version.
func fuzzCommands(shape []byte) []command {
	anchors := []string{"", expectDone, "Success", "New server registered", "chang", "Server deleted"}
	var cmds []command
	for i, b := range shape {
		if i == 16 {
			break
		}
		c := command{Text: "cmd" + itoa(i), Expect: anchors[int(b)%len(anchors)]}
		if b&0x80 != 0 {
			c.Capture, c.Expect = true, ""
		}
		cmds = append(cmds, c)
	}
	return cmds
}

// FuzzClassify throws arbitrary replies at the judging functions:
// classify, splitSegments, matchBatch, countResponses and judgeLine never
// panic, and their verdicts agree with each other — above all, a reply
// that is not complete is never judged a success.
func FuzzClassify(f *testing.F) {
	for _, seed := range []struct{ raw, shape string }{
		{"\n\n[6]: New server registered.\n\n", "\x03"},
		{"\n\n\n", "\x00"},
		{"\n\n[3]: No such server.\n\n", "\x05"},
		{"\n\n[4]: IP changed from '1.2.3.4' to '5.6.7.8'\n\n", "\x04"},
		{"\n\n[6]: New version created: 3\n\n", "\x80"},
		{"\n\n[6]: Unknown command: 'add', but maybe one of the following ones is a better match:\n  add map\n\n", "\x00"},
		{"\n\nThe command is too big for the buffer size. Please use 'set ssl cert' with a payload.\n", "\x02"},
		{"\n\n\nNew empty certificate store 'x'!\n\nTransaction created\n\nCommitting x.\nSuccess!\n\n", "\x00\x00\x02"},
		{"\n\n[6]: Wait delay expired.\n\n", "\x01"},
		{"\n\n[4]: unable to find server\r\n\r\n", "\x00"},
		{"", "\x00\x01"},
	} {
		f.Add([]byte(seed.raw), []byte(seed.shape))
	}
	f.Fuzz(func(t *testing.T, raw, shape []byte) {
		text := string(raw)
		segments := splitSegments(trimReply(text))
		for _, s := range segments {
			if s == "" || strings.Contains(s, "\n\n") || strings.HasPrefix(s, "\n") || strings.HasSuffix(s, "\n") || strings.HasSuffix(s, " ") {
				t.Fatalf("malformed segment %q", s)
			}
			checkClassifyVerdict(t, s)
		}
		checkClassifyVerdict(t, text)

		n, partial := countResponses(raw)
		if n > len(raw) || (len(raw) > 0 && !partial && raw[len(raw)-1] != '\n') || (len(raw) == 0 && (n != 0 || partial)) {
			t.Fatalf("countResponses(%q) = %d, %v", raw, n, partial)
		}

		cmds := fuzzCommands(shape)
		line := slices.Concat([]command{prefixEntry}, cmds)
		checkSticky(t, "matchBatch", matchBatch(segments, line))

		v := judgeLine(raw, cmds)
		if len(v.Errs) != len(cmds) || len(v.Outputs) != len(cmds) {
			t.Fatalf("judgeLine returned %d verdicts for %d commands", len(v.Errs), len(cmds))
		}
		checkSticky(t, "judgeLine", v.Errs)
		allOK := !slices.ContainsFunc(v.Errs, func(err error) bool { return err != nil })
		// An incomplete reply marks the commands unknown from max(n-2, 0) on,
		// so a partial tail after all k responses leaves the verdicts
		// standing; fewer responses than commands never do.
		if allOK && len(cmds) > 0 && n != 2+len(cmds) {
			t.Fatalf("an incomplete reply (%d responses for %d commands, partial %v) was judged a success: %q", n, 2+len(cmds), partial, raw)
		}
		for i, c := range cmds {
			if v.Errs[i] == nil && c.Expect != "" && !containsFold(v.Outputs[i], c.Expect) {
				t.Fatalf("command %d succeeded without its anchor %q in %q", i, c.Expect, v.Outputs[i])
			}
		}
		if v.Version != "" {
			if _, ok := mapVersion("x: " + v.Version); !ok {
				t.Fatalf("captured version %q is not a number", v.Version)
			}
		}
		if again := judgeLine(raw, cmds); !reflect.DeepEqual(errTexts(again.Errs), errTexts(v.Errs)) || again.Version != v.Version {
			t.Fatal("judgeLine is not deterministic")
		}
	})
}

// checkClassifyVerdict checks classify against its own rules: tags 0–3 are
// refusals; an ASCII text is judged the same in any letter case.
func checkClassifyVerdict(t *testing.T, s string) {
	t.Helper()
	err := classify(s)
	if err != nil && !errors.Is(err, errRejected) && !errors.Is(err, errNameCollision) && !errors.Is(err, errWaitExpired) {
		t.Fatalf("classify(%q) = %v, not one of its sentinels", s, err)
	}
	if level, _ := severityTag(s); level >= 0 && level <= 3 && err == nil {
		t.Fatalf("classify(%q) accepted an error-level response", s)
	}
	if isASCII(s) {
		if up := classify(strings.ToUpper(s)); !sameError(up, err) {
			t.Fatalf("classify is case-sensitive on %q: %v vs %v", s, err, up)
		}
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func sameError(a, b error) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error())
}

// checkSticky requires that after the first failed command every later
// command has a verdict too: nothing after a failure counts as done.
func checkSticky(t *testing.T, what string, errs []error) {
	t.Helper()
	failed := false
	for i, err := range errs {
		if i == 0 && what == "matchBatch" {
			continue // the optional prefix entry never fails
		}
		if failed && err == nil {
			t.Fatalf("%s: command %d judged a success after a failure: %v", what, i, errs)
		}
		failed = failed || err != nil
	}
}

func errTexts(errs []error) []string {
	out := make([]string, len(errs))
	for i, err := range errs {
		if err != nil {
			out[i] = err.Error()
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Command compilation and payload framing.

// fuzzOpKinds is every compiled kind plus one the layer does not know.
var fuzzOpKinds = append(slices.Clone(opKinds[:]), "backend_teleport")

// FuzzCompileOp compiles an op built from fuzzed fields with either
// terminator. When compilation succeeds, no command text may contain a
// newline, a ';' or a '<<' (each would change what HAProxy runs), every
// plain command fits its line, and every payload is framed so that it ends
// exactly at its terminator line: it never holds that line itself.
func FuzzCompileOp(f *testing.F) {
	f.Add(uint8(5), "be-a", "srv1", "maps/host.map", "example.com", "be-a", "10.0.0.1", 8080, 2, "check,inter 2s", []byte("k v\n"), true)
	f.Add(uint8(14), "", "", "maps/host.map", "key", "a value; with <spaces>", "", 0, 0, "", []byte(""), false)
	f.Add(uint8(17), "", "", "maps/host.map", "", "", "", 0, 0, "", []byte("# comment\nk1 v1\n\nk2\tv 2\nHAPTIC x\n"), true)
	f.Add(uint8(18), "", "", "certs/a.pem", "", "", "", 0, 0, "", []byte("-----BEGIN CERTIFICATE-----\nMIIB\n\nHAPTIC\n-----END CERTIFICATE-----\n"), true)
	f.Add(uint8(20), "", "", "certs/ca.pem", "", "", "", 0, 0, "", []byte("-----BEGIN CERTIFICATE-----\r\nMIIB\r\n\r\n-----END CERTIFICATE-----\r\n"), false)
	f.Add(uint8(22), "", "", "certs/list.txt", "*.example.com", "", "", 0, 0, "alpn h2,ssl-min-ver TLSv1.2", []byte("certs/a.pem"), true)
	f.Add(uint8(4), "be-a", "", "", "", "", "", 30001, 0, "", []byte(nil), true)
	f.Add(uint8(8), "be-a", "srv1", "", "", "", "::1", 65535, 0, "", []byte(nil), true)
	f.Add(uint8(9), "be-a", "srv1", "", "", "", "", 0, 257, "", []byte(nil), true)
	f.Add(uint8(24), "be-a", "", "", "", "", "", 0, 0, "", []byte(nil), true)
	f.Fuzz(func(t *testing.T, kind uint8, backend, server, path, key, value, address string, port, weight int, keywords string, content []byte, custom bool) {
		// Long enough to cross the line and payload limits, short enough
		// that every input stays well under a millisecond.
		for _, s := range []string{backend, server, path, key, value, address, keywords} {
			if len(s) > 16<<10 {
				t.Skip()
			}
		}
		if len(content) > 64<<10 {
			t.Skip()
		}
		op := Op{Kind: fuzzOpKinds[int(kind)%len(fuzzOpKinds)], Backend: backend, Server: server, Profile: key, Mode: value,
			GUID: server, Address: address, Port: port, Weight: &weight, State: value, Health: weight%2 == 0,
			Keywords: fuzzKeywords(keywords), TimeoutMs: port, Path: path, Key: key, Value: value,
			Cert: string(content), Options: fuzzKeywords(keywords), SNIFilters: strings.Fields(key)}
		term := ""
		if custom {
			term = payloadTerminator
		}
		files := func(p string) ([]byte, error) {
			if p == "missing" {
				return nil, fs.ErrNotExist
			}
			return content, nil
		}
		p, err := compileOp(&op, files, term)
		if err != nil {
			if op.Kind == "backend_teleport" && !errors.Is(err, errUnknownOp) {
				t.Fatalf("unknown kind refused with %v", err)
			}
			return
		}
		if op.Kind == "backend_teleport" {
			t.Fatal("an unknown kind compiled")
		}
		if p.Terminator != term || p.Kind != op.Kind || len(p.Commands) == 0 {
			t.Fatalf("program %+v for %s with terminator %q", p, op.Kind, term)
		}
		for _, c := range slices.Concat(p.Commands, p.Abort) {
			checkCompiledCommand(t, c, term)
		}
		again, err := compileOp(&op, files, term)
		if err != nil || !reflect.DeepEqual(again, p) {
			t.Fatal("compileOp is not deterministic")
		}
	})
}

// fuzzKeywords reads "name arg arg,name arg" into keyword arguments.
func fuzzKeywords(s string) []KeywordArg {
	var out []KeywordArg
	for i, item := range strings.Split(s, ",") {
		if i == 8 {
			break
		}
		words := strings.Split(item, " ")
		if s == "" {
			break
		}
		out = append(out, KeywordArg{Name: words[0], Args: words[1:]})
	}
	return out
}

// checkCompiledCommand holds one compiled command to the framing rules.
func checkCompiledCommand(t *testing.T, c command, term string) {
	t.Helper()
	if strings.ContainsAny(c.Text, "\n\r;") || strings.Contains(c.Text, "<<") {
		t.Fatalf("command text %q would change what HAProxy runs", c.Text)
	}
	if len(linePrefix)+len(c.Text)+1 > MaxCommandLineBytes {
		t.Fatalf("command of %d bytes does not fit a line", len(c.Text))
	}
	if c.Payload == "" {
		return
	}
	if len(c.Payload) > MaxPayloadBytes || strings.IndexByte(c.Payload, 0) >= 0 {
		t.Fatalf("payload of %d bytes or with a NUL passed", len(c.Payload))
	}
	// Parse the framed command the way HAProxy does: the first line ends
	// with <<term, the payload runs to the first line equal to term (a CR
	// before the LF is HAProxy's too), and nothing may follow that line.
	framed := frameCommand(c.Text, c.Payload, term)
	head, rest, ok := strings.Cut(framed, "\n")
	if !ok || head != c.Text+" <<"+term {
		t.Fatalf("framed head %q", head)
	}
	var body strings.Builder
	for {
		line, tail, ok := strings.Cut(rest, "\n")
		if !ok {
			t.Fatalf("payload of %q never reaches its terminator %q", c.Text, term)
		}
		if strings.TrimSuffix(line, "\r") == term {
			if tail != "" {
				t.Fatalf("the payload of %q ends early at its terminator; %q would run as commands", c.Text, tail)
			}
			break
		}
		body.WriteString(line + "\n")
		rest = tail
	}
	if want := strings.TrimSuffix(c.Payload, "\n") + "\n"; body.String() != want {
		t.Fatalf("framed payload %q, want %q", body.String(), want)
	}
}
