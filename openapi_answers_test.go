// The test that holds the agent's answers to api/openapi.yaml: it serves
// every route on every listener of an agent beside the fake HAProxy, before
// and after initialisation, provokes every answer the document names, and
// validates each one (status, content type, required headers, body schema)
// against the document's answer for that status; a listener must answer
// 404 on a path the document does not give it. The golden files of
// testdata/wire are held to the same schemas.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// answerCheck validates answers against the document and remembers which
// documented answers it saw.
type answerCheck struct {
	t      *testing.T
	doc    map[string]any
	schema *schemaCheck
	seen   map[string]bool // "GET /v1/state 200"
}

func newAnswerCheck(t *testing.T) *answerCheck {
	doc := openAPIDoc(t)
	return &answerCheck{t: t, doc: doc, schema: &schemaCheck{doc: doc, strict: true}, seen: map[string]bool{}}
}

// listenersOf are the listeners that serve op.
func listenersOf(op any) []any { return anyList(node(op, "x-haptic-listeners")) }

// check validates one answer of listener to method path. The document's
// operation for it must list the listener; for another method on a path
// the listener serves, the answer must be that path's 405; for a path it
// does not serve, a 404.
func (c *answerCheck) check(listener, method, path string, status int, header http.Header, body []byte) {
	t := c.t
	t.Helper()
	label := fmt.Sprintf("%s %s on the %s listener, %d %.80q", method, path, listener, status, body)
	item := mapNode(c.doc, "paths", path)
	ops := operations(item)
	served := slices.DeleteFunc(slices.Sorted(maps.Keys(ops)), func(m string) bool {
		return !slices.Contains(listenersOf(ops[m]), any(listener))
	})
	op := strings.ToLower(method)
	switch {
	case slices.Contains(served, op):
	case len(served) > 0:
		if status != http.StatusMethodNotAllowed {
			t.Errorf("%s: want 405, the path takes %v on this listener", label, served)
			return
		}
		op = served[0]
		for _, m := range served {
			c.seen[strings.ToUpper(m)+" "+path+" 405"] = true
		}
	default:
		if status != http.StatusNotFound || string(body) != "404 page not found\n" {
			t.Errorf("%s: the document gives this listener no such route, want 404", label)
		}
		return
	}
	resp := node(ops, op, "responses", strconv.Itoa(status))
	if ref, ok := node(resp, "$ref").(string); ok {
		var err error
		if resp, err = pointer(c.doc, ref); err != nil {
			t.Fatal(err)
		}
	}
	if resp == nil {
		t.Errorf("%s: the document names no such answer", label)
		return
	}
	c.seen[strings.ToUpper(op)+" "+path+" "+strconv.Itoa(status)] = true
	for name, h := range mapNode(resp, "headers") {
		if node(h, "required") == "true" && header.Get(name) == "" {
			t.Errorf("%s: no %s header", label, name)
		}
	}
	mediaType, schema := c.contentFor(mapNode(resp, "content"), header.Get("Content-Type"))
	if schema == nil {
		t.Errorf("%s: Content-Type %q is none of the document's %v", label, header.Get("Content-Type"), slices.Collect(maps.Keys(mapNode(resp, "content"))))
		return
	}
	if !bytes.HasSuffix(body, []byte("\n")) {
		t.Errorf("%s: the body does not end with a newline", label)
	}
	var errs []string
	if mediaType == "application/json" {
		errs = c.schema.validateJSON(schema, body)
	} else {
		errs = c.schema.validate(schema, string(body), "", true)
	}
	for _, e := range errs {
		t.Errorf("%s: %s", label, e)
	}
}

// contentFor finds the documented content whose media type the answer's
// Content-Type has, with every parameter the document names.
func (c *answerCheck) contentFor(content map[string]any, contentType string) (string, any) {
	got, gotParams, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", nil
	}
	for key, media := range content {
		want, params, err := mime.ParseMediaType(key)
		if err != nil || want != got {
			continue
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(params)), func(p string) bool { return gotParams[p] != params[p] }) {
			return got, node(media, "schema")
		}
	}
	return "", nil
}

// requireEveryAnswer fails for each answer the document names that the
// test did not see, but those it cannot provoke, which it names.
func (c *answerCheck) requireEveryAnswer(unprovoked map[string]string) {
	for path, item := range mapNode(c.doc, "paths") {
		for method, op := range operations(item) {
			for status := range mapNode(op, "responses") {
				key := strings.ToUpper(method) + " " + path + " " + status
				_, excused := unprovoked[key]
				switch {
				case !c.seen[key] && !excused:
					c.t.Errorf("the document names %s, which the test never saw", key)
				case c.seen[key] && excused:
					c.t.Errorf("%s is said to be unprovoked, but the test saw it", key)
				}
			}
		}
	}
}

// agentEnd is one listener of an agent, with its client.
type agentEnd struct {
	name   string
	base   string
	client *http.Client
}

// call sends one request through end and checks the answer; user "" sends
// no credentials. It returns the status and body.
func (c *answerCheck) call(end agentEnd, user, pass, method, target string, body []byte, contentType string) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, end.base+target, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := end.client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s on %s: %v", method, target, end.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	path, _, _ := strings.Cut(target, "?")
	c.check(end.name, method, path, resp.StatusCode, resp.Header, b)
	return resp.StatusCode, b
}

// endsOf are every listener of a, the admin and drain sockets at the
// configured paths.
func endsOf(a *Agent, cfg AgentConfig) map[string]agentEnd {
	tcp := &http.Client{Timeout: 30 * time.Second}
	return map[string]agentEnd{
		listenerAPI:     {listenerAPI, "http://" + a.Addr(), tcp},
		listenerMetrics: {listenerMetrics, "http://" + a.metricsLn.Addr().String(), tcp},
		listenerAdmin:   {listenerAdmin, "http://admin", unixClient(cfg.AdminSocket)},
		listenerDrain:   {listenerDrain, "http://drain", unixClient(cfg.DrainSocket)},
	}
}

// withEveryListener turns on the metrics listener and both local sockets,
// with a drain short enough for a test.
func withEveryListener(t *testing.T) func(*AgentConfig) {
	dir := shortTempDir(t)
	return func(c *AgentConfig) {
		c.MetricsListen = "127.0.0.1:0"
		c.AdminSocket, c.DrainSocket = filepath.Join(dir, "admin.sock"), filepath.Join(dir, "drain.sock")
		c.DrainQuietPeriod, c.DrainMaxWait = 50*time.Millisecond, time.Second
	}
}

// planOf is the real plan of a file set (PlanFromDir's), with its blob.
func planOf(t *testing.T, set fileSet) (*Plan, []byte) {
	t.Helper()
	dir := t.TempDir()
	for path, content := range set {
		p := filepath.Join(dir, filepath.FromSlash(path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, content)
	}
	p, err := PlanFromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := EncodePlanBlob(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, blob
}

func TestEveryAnswerMatchesTheOpenAPIDocument(t *testing.T) {
	c := newAnswerCheck(t)
	const user, pass = "haptic", "s3cret"
	paths := slices.Sorted(maps.Keys(mapNode(c.doc, "paths")))

	// A starting agent: HAProxy does not answer yet.
	{
		cfg := testAgentConfig(t, nil)
		dir := shortTempDir(t)
		cfg.MasterSocket, cfg.WorkerSocket = filepath.Join(dir, "no-master.sock"), filepath.Join(dir, "no-worker.sock")
		withEveryListener(t)(&cfg)
		a, stop := launchTestAgent(t, cfg, false)
		ends := endsOf(a, cfg)
		for _, end := range ends {
			for _, path := range paths {
				for method := range operations(node(c.doc, "paths", path)) {
					target := path
					if path == PathPlan {
						target += "?plan_id=p&proof=a:1"
					}
					c.call(end, user, pass, strings.ToUpper(method), target, nil, "")
				}
			}
		}
		stop()
	}

	// A running agent beside the fake, on a disk that can fail on demand.
	d := &hookDisk{}
	e := newTestEnvWithDisk(t, d, withEveryListener(t))
	ends := endsOf(e.a, e.cfg)
	api := ends[listenerAPI]
	// step sends one request of the scenario and fails unless it got the
	// answer the step is built to provoke: the test proves only what it
	// really provokes.
	step := func(what string, wantCode int, fragment string, code int, body []byte) {
		t.Helper()
		if code != wantCode || !bytes.Contains(body, []byte(fragment)) {
			t.Errorf("%s: %d %s, want %d with %s", what, code, body, wantCode, fragment)
		}
	}
	post := func(r applyRequest) (int, []byte) {
		body, ct := r.body(t)
		return c.call(api, user, pass, "POST", PathApply, body.Bytes(), ct)
	}
	putPlan := func(planID, proof string, blob []byte) (int, []byte) {
		return c.call(api, user, pass, "PUT", PathPlan+"?plan_id="+planID+"&proof="+proof, blob, blobContentType)
	}
	// patchJSON encodes a plan patch, which must be what the document
	// says a PUT /v1/plan body of type application/json is.
	patchJSON := func(p *PlanPatch) []byte {
		t.Helper()
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range c.schema.validateJSON(node(c.doc, "paths", PathPlan, "put", "requestBody", "content", patchContentType, "schema"), b) {
			t.Errorf("the plan patch sent: %s", e)
		}
		return b
	}
	putPatch := func(planID, proof string, p *PlanPatch) (int, []byte) {
		return c.call(api, user, pass, "PUT", PathPlan+"?plan_id="+planID+"&proof="+proof, patchJSON(p), patchContentType)
	}

	// Every documented method of every path on every listener, and one no
	// path takes, bare: probes, state reads, the metrics, the drain, and
	// what a bare apply or plan upload is answered.
	for _, end := range ends {
		for _, path := range paths {
			methods := slices.Sorted(maps.Keys(operations(node(c.doc, "paths", path))))
			for _, method := range append(methods, "delete") {
				c.call(end, user, pass, strings.ToUpper(method), path, nil, "")
			}
		}
	}
	for _, q := range []string{"?plan=0", "?verify=1", "?verify=1&plan=0"} {
		c.call(api, user, pass, "GET", PathState+q, nil, "")
		c.call(ends[listenerAdmin], "", "", "GET", PathState+q, nil, "")
	}

	// Applies: a reload with the plan blob, a runtime change, a file-only
	// one, the two conflicts, refused parts and manifests, and a NACK.
	set := seedFiles()
	plan1, blob1 := planOf(t, set)
	code, body := post(applyRequest{manifest: reloadManifest(e, plan1.ID, set), files: set, plan: blob1})
	step("a reload with its plan blob", 200, `"mode":"reload"`, code, body)
	set2, op := mapEntryChange(set, "blog.example.com", "be-b")
	plan2, blob2 := planOf(t, set2)
	code, body = post(applyRequest{manifest: e.c.manifest(plan2.ID, set2, op), files: set2, omit: map[string]bool{"haproxy.cfg": true}})
	step("a map entry at runtime", 200, `"mode":"runtime"`, code, body)
	code, body = post(applyRequest{manifest: e.c.manifest(plan2.ID, set2), files: set2})
	step("the same files again", 200, `"mode":"file_only"`, code, body)
	stale := e.c.manifest(plan2.ID, set2)
	stale.Token.LeaderEpoch = 0
	code, body = post(applyRequest{manifest: stale, files: set2})
	step("a deposed leader", 409, `"reason":"stale_epoch"`, code, body)
	set3, op3 := mapEntryChange(set2, "shop.example.com", "be-c")
	code, body = post(applyRequest{manifest: e.c.manifest("plan-3", set3, op3), files: set3, omit: map[string]bool{"maps/host.map": true}})
	step("a part left out", 409, `{"missing":["maps/host.map"]}`, code, body)
	code, body = post(applyRequest{manifest: e.c.manifest("plan-3", set3, op3), files: set3, override: map[string]string{"maps/host.map": "other\n"}})
	step("a part that is not its file", 400, `"stage":"parts"`, code, body)
	code, body = post(applyRequest{rawManifest: []byte("{not json"), files: set3})
	step("a manifest that is not JSON", 400, `"stage":"manifest"`, code, body)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = true })
	broken := set2.clone()
	broken["haproxy.cfg"] += "# refused\n"
	code, body = post(applyRequest{manifest: reloadManifest(e, "plan-refused", broken), files: broken})
	step("a reload HAProxy refuses", 200, `"mode":"rejected"`, code, body)
	e.fake.With(func(m *FakeModel) { m.ReloadFails = false })

	// The agent's own disk fails while staging a part too large to ride in
	// the record: 507 when it is full, 500 otherwise.
	large := set3.clone()
	large["notes/large.txt"] = strings.Repeat("x", maxInlineBytes+1)
	for errno, wantCode := range map[syscall.Errno]int{syscall.ENOSPC: 507, syscall.EIO: 500} {
		d.setHook(func(o diskOp) error {
			if strings.Contains(o.Path, storeTempDir) && o.Op == "create" {
				return &fs.PathError{Op: "create", Path: o.Path, Err: errno}
			}
			return nil
		})
		code, body = post(applyRequest{manifest: e.c.manifest("plan-3", large, op3), files: large})
		step("staging on a failing disk: "+errno.Error(), wantCode, `"stage":"parts"`, code, body)
		d.setHook(nil)
	}
	logPath := filepath.Join(e.cfg.BaseDir, logFileName)
	failLog := func(o diskOp) error {
		if o.Op == "write" && o.Path == logPath {
			return &fs.PathError{Op: "write", Path: logPath, Err: syscall.EIO}
		}
		return nil
	}

	// Plan blobs: stored, refused, moved on, and not written.
	st := e.c.state("?plan=0")
	code, body = putPlan(st.AppliedPlanID, st.AppliedPlanProof, blob2)
	step("the applied plan's blob", 200, `"plan_id":"`+plan2.ID, code, body)
	d.setHook(failLog)
	code, body = putPlan(st.AppliedPlanID, st.AppliedPlanProof, blob2)
	step("the plan the agent holds, again, on a disk that refuses writes: nothing to write", 200, `"plan_id":"`+plan2.ID, code, body)
	d.setHook(nil)
	code, body = putPlan(st.AppliedPlanID, st.AppliedPlanProof, []byte("not zstd"))
	step("a blob that does not decode", 400, `"stage":"plan"`, code, body)
	code, body = putPlan(plan1.ID, "a:1", blob1)
	step("the blob of a plan the pod left", 409, `"applied_plan_id":"`+plan2.ID, code, body)

	// Plan patches: plan 3 lands at runtime without its plan, which then
	// travels as splices of plan 2's canonical JSON, the plan the agent
	// stored; a patch of a plan it does not hold is answered with a
	// Missing, on an apply as on an upload, and one that makes another
	// plan is refused.
	plan3, blob3 := planOf(t, set3)
	code, body = post(applyRequest{manifest: e.c.manifest(plan3.ID, set3, op3), files: set3, omit: map[string]bool{"haproxy.cfg": true}})
	step("another map entry at runtime", 200, `"mode":"runtime"`, code, body)
	st = e.c.state("?plan=0")
	d.setHook(failLog)
	code, body = putPlan(st.AppliedPlanID, st.AppliedPlanProof, blob3)
	step("a blob the disk refuses", 500, `"stage":"plan"`, code, body)
	d.setHook(nil)
	good := cutPlanPatch(string(plan2.Canonical()), string(plan3.Canonical()), plan2.ID)
	if good == nil || len(good.Splices) == 0 {
		t.Fatalf("plans 2 and 3 make the patch %+v", good)
	}
	gone := *good
	gone.BaseDigest = plan1.ID
	code, body = putPatch(st.AppliedPlanID, st.AppliedPlanProof, &gone)
	step("a plan patch of a plan the agent does not hold", 409, `{"missing":["plan"]}`, code, body)
	patchPart := fileHeader(PartPlan, PartPlan)
	patchPart.Set("Content-Type", patchContentType)
	code, body = post(applyRequest{manifest: e.c.manifest(plan3.ID, set3), files: set3, extra: []extraPart{{patchPart, string(patchJSON(&gone))}}})
	step("an apply whose plan part is a patch of a plan the agent does not hold", 409, `{"missing":["plan"]}`, code, body)
	code, body = putPatch(st.AppliedPlanID, st.AppliedPlanProof, good)
	step("the applied plan as a patch of the stored one", 200, `"plan_id":"`+plan3.ID, code, body)
	code, body = putPatch(st.AppliedPlanID, st.AppliedPlanProof, cutPlanPatch(string(plan3.Canonical()), string(plan2.Canonical()), plan3.ID))
	step("a plan patch that makes another plan", 400, `hashes to \"`+plan2.ID, code, body)
	if got := e.c.state(""); !bytes.Equal(got.AppliedPlan, blob3) {
		t.Errorf("the state after a plan patch carries %d bytes of plan, not the blob of plan 3", len(got.AppliedPlan))
	}
	// A log due for compaction on a disk with no room for the snapshot:
	// uploads are refused until a compaction can run.
	awaitReadBacks(e.a)
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogRecords
	e.a.deps.led.mu.Unlock()
	d.setHook(func(o diskOp) error {
		if strings.Contains(o.Path, stateTempPattern[:len(stateTempPattern)-1]) {
			return &fs.PathError{Op: o.Op, Path: o.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	e.a.deps.applyMu.Lock()
	e.a.deps.compactIfDue() // the compaction the log is due for fails
	e.a.deps.applyMu.Unlock()
	code, body = putPlan(st.AppliedPlanID, st.AppliedPlanProof, blob3)
	step("an upload while the log cannot be compacted for want of room", 507, `"stage":"plan"`, code, body)
	d.setHook(nil)
	awaitReadyz(t, e.a, func(code int, _ string) bool { return code == http.StatusOK })

	// Mutual TLS refuses a certificate without the client name.
	{
		fx := newTLSFixture(t)
		a := startTLSAgent(t, fx, "controller.haptic")
		cert, key := fx.client.issue(t, testCertOptions{CommonName: "c", DNSNames: []string{"intruder"}, Client: true})
		code, header, body, err := tlsGet(t, a, PathState, fx.serverCA, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		c.check(listenerAPI, "GET", PathState, code, header, []byte(body))
	}

	// HAProxy goes away: a verified read cannot vouch for it, and the pod
	// is not ready.
	e.fake.Close()
	c.call(api, user, pass, "GET", PathState+"?verify=1", nil, "")
	waitFor(t, "/readyz to notice HAProxy is gone", func() bool {
		code, _ := c.call(api, "", "", "GET", PathReadyz, nil, "")
		return code == http.StatusServiceUnavailable
	})

	// Failed authentication, until the address's budget is spent.
	routes := [][2]string{{"GET", PathState}, {"POST", PathApply}, {"PUT", PathPlan}}
	for range authFailBurst {
		for _, r := range routes {
			c.call(api, user, "wrong", r[0], r[1], nil, "")
		}
	}
	for _, r := range routes {
		if code, _ := c.call(api, user, "wrong", r[0], r[1], nil, ""); code != http.StatusTooManyRequests {
			t.Errorf("%s %s once the budget is spent: %d", r[0], r[1], code)
		}
	}

	c.requireEveryAnswer(map[string]string{
		"GET /v1/state 500": "re-hashing the files fails only on a file the agent cannot read, and the tests run as root",
	})
}

// TestTheGoldenFilesMatchTheOpenAPIDocument: the wire fixtures, which pin
// the encoding byte for byte, are instances of the document's schemas.
func TestTheGoldenFilesMatchTheOpenAPIDocument(t *testing.T) {
	doc := openAPIDoc(t)
	check := &schemaCheck{doc: doc, strict: true}
	for file, schema := range map[string]string{
		"manifest.json": "Manifest", "state.json": "State", "apply_ack.json": "ApplyResult",
		"apply_nack.json": "ApplyResult", "conflict.json": "Conflict", "missing.json": "Missing",
	} {
		b, err := os.ReadFile(filepath.Join("testdata", "wire", file))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range check.validateJSON(map[string]any{"$ref": "#/components/schemas/" + schema}, b) {
			t.Errorf("%s: %s", file, e)
		}
	}
	entries, err := os.ReadDir(filepath.Join("testdata", "wire"))
	if err != nil || len(entries) != 6 {
		t.Errorf("testdata/wire holds %d files, the test checks 6: %v", len(entries), err)
	}
}
