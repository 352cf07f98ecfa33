// Tests of what bounds one apply request's cost (agent_apply_bounds.go):
// a manifest's lists are counted before it is decoded, so one whose lists
// exceed what validation accepts is refused cheaply and with the refusal
// validation itself would give first, concurrent applies waiting for the
// apply lock hold a bounded amount of memory, and an apply exactly at the
// limits lands.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCountListElements(t *testing.T) {
	tests := []struct {
		data       string
		top, all   int
		inner0, i1 int
	}{
		{`[]`, 0, 0, 0, 0},
		{` [ ] `, 0, 0, 0, 0},
		{`[1,2,3]`, 3, 3, 0, 0},
		{`[[1,2],[],[3]]`, 3, 6, 2, 0},
		{`[[],[1,[2,3]]]`, 2, 6, 0, 2},
		{`["a,b]","c\"],[", "\\"]`, 3, 3, 0, 0},
		{`[{"k":[1,2],"l":{"m":[3]}}, 4]`, 2, 5, 0, 0},
		{`{"a":[1,2]}`, 0, 0, 0, 0},
		{`null`, 0, 0, 0, 0},
		{`"[1,2]"`, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		if !json.Valid([]byte(tc.data)) {
			t.Fatalf("%s is not valid JSON", tc.data)
		}
		top, all, inner := countListElements([]byte(tc.data))
		if top != tc.top || all != tc.all || inner[0] != tc.inner0 || inner[1] != tc.i1 {
			t.Errorf("%s: top %d all %d inner %v; want %d %d [%d %d …]", tc.data, top, all, inner, tc.top, tc.all, tc.inner0, tc.i1)
		}
	}
}

// repeatedList is a JSON list of n copies of elem.
func repeatedList(elem string, n int) string {
	return "[" + strings.Repeat(elem+",", n-1) + elem + "]"
}

// allocatedBytes reports the bytes f allocates.
func allocatedBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestAnOversizedManifestIsRefusedBeforeItIsDecoded: a manifest within its
// byte limit whose lists exceed what validation accepts is refused, with
// validation's own text, having allocated a small fraction of its size
// rather than the gigabyte its elements would decode to.
func TestAnOversizedManifestIsRefusedBeforeItIsDecoded(t *testing.T) {
	file := `{"path":"f","digest":"x"}`
	tests := []struct {
		name, manifest, want string
	}{
		// The manifest: 8 MiB, 265,613 entries.
		{"files", `{"plan_id":"p","files":` + repeatedList(`{"path":"f/1","size":1}`, 265613) + `}`,
			"265613 files exceed the 4096-file limit"},
		{"files under another spelling", `{"plan_id":"p","FILES":` + repeatedList(file, 200000) + `}`,
			"200000 files exceed the 4096-file limit"},
		{"files under an escaped key", `{"plan_id":"p","fil\u0065s":` + repeatedList(file, 200000) + `}`,
			"200000 files exceed the 4096-file limit"},
		{"ops", `{"plan_id":"p","identity_version":1,"ops":` + repeatedList(`{}`, 2000000) + `}`,
			"2000000 ops exceed the 1000-op limit"},
		{"in-place ops", `{"plan_id":"p","in_place_ops":` + repeatedList(`{}`, 2000000) + `}`,
			"2000000 ops exceed the 1000-op limit"},
		{"legacy ops", `{"plan_id":"p","identity_version":0,"ops":` + repeatedList(`{}`, 2000000) + `}`,
			"2000000 ops exceed the 1000-op limit"},
		{"a huge batch", `{"plan_id":"p","op_batches":[[{}],` + repeatedList(`{}`, 2000000) + `]}`,
			"operation batch 3 must contain 1 to 1000 ops; got 2000000"},
		{"many batches", `{"plan_id":"p","op_batches":` + repeatedList(`[{}]`, 1000000) + `}`,
			"1000001 operation batches exceed the 8-batch limit"},
		{"nested keywords", `{"plan_id":"p","ops":[{"kind":"server_add","keywords":` + repeatedList(`{}`, 2000000) + `}]}`,
			"the manifest's lists hold more than 262144 elements"},
		{"nested arguments", `{"plan_id":"p","ops":[{"kind":"server_add","keywords":[{"name":"x","args":` + repeatedList(`""`, 2000000) + `}]}]}`,
			"the manifest's lists hold more than 262144 elements"},
		// In-place ops count like any other: one op within the op limit
		// carries the elements.
		{"nested in an in-place op", `{"plan_id":"p","in_place_ops":[{"kind":"map_set","keywords":` + repeatedList(`{}`, 2000000) + `}]}`,
			"the manifest's lists hold more than 262144 elements"},
		{"spread over ops and in-place ops", `{"plan_id":"p","ops":[{"kind":"server_add","keywords":` + repeatedList(`{}`, maxManifestListElements/2) +
			`}],"in_place_ops":[{"kind":"map_set","keywords":` + repeatedList(`{}`, maxManifestListElements/2) + `}]}`,
			"the manifest's lists hold more than 262144 elements"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.manifest) > MaxPlanBlobBytes {
				t.Fatalf("the manifest is %d bytes, over the part limit", len(tc.manifest))
			}
			var err error
			raw := []byte(tc.manifest)
			alloc := allocatedBytes(func() { _, err = decodeManifest(raw) })
			if err == nil || err.Error() != tc.want {
				t.Errorf("decodeManifest = %v, want %q", err, tc.want)
			}
			// Decoding would take 30 to 500 bytes per element; measuring
			// takes a few hundred bytes in all.
			if alloc > 64<<10 {
				t.Errorf("refusing a %d-byte manifest allocated %d bytes", len(tc.manifest), alloc)
			}
		})
	}
}

// TestAManifestOverItsBoundsIsRefusedInValidationOrder: when a list is
// over its bound, the refusal is the first one validation would give.
func TestAManifestOverItsBoundsIsRefusedInValidationOrder(t *testing.T) {
	files := `"files":` + repeatedList(`{"path":"f","digest":"x"}`, 5000)
	tests := []struct {
		name, manifest, want string
	}{
		{"empty plan id", `{"plan_id":"",` + files + `}`, "plan_id is empty"},
		{"no plan id", `{` + files + `}`, "plan_id is empty"},
		{"null plan id", `{"plan_id":null,` + files + `}`, "plan_id is empty"},
		{"ops first", `{"plan_id":"p","ops":` + repeatedList(`{}`, 1001) + `,` + files + `}`, "1001 ops exceed the 1000-op limit"},
		{"ops plus in-place", `{"plan_id":"p","ops":` + repeatedList(`{}`, 600) + `,"in_place_ops":` + repeatedList(`{}`, 401) + `,` + files + `}`,
			"1001 ops exceed the 1000-op limit"},
		{"an empty batch first", `{"plan_id":"p","op_batches":[[]],` + files + `}`, "operation batch 2 must contain 1 to 1000 ops; got 0"},
		{"an empty batch before a huge one", `{"plan_id":"p","op_batches":[[],` + repeatedList(`{}`, 1001) + `]}`,
			"operation batch 2 must contain 1 to 1000 ops; got 0"},
		{"files", `{"plan_id":"p",` + files + `}`, "5000 files exceed the 4096-file limit"},
		{"files twice, the larger counts", `{"plan_id":"p",` + files + `,"files":[]}`, "5000 files exceed the 4096-file limit"},
	}
	for _, tc := range tests {
		// A small manifest is decoded and then refused by validation, with
		// the same words.
		m, err := decodeManifest([]byte(tc.manifest))
		if err == nil {
			err = validateManifest(m, ConfigFilePath, func(rel string) (string, error) { return rel, nil })
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// Within the bounds, decoding and its errors are json.Unmarshal's.
	for raw, want := range map[string]string{
		`{"plan_id":7}`: "invalid manifest: json: cannot unmarshal number into Go struct field Manifest.plan_id of type string",
		`{"plan_id":`:   "invalid manifest: unexpected end of JSON input",
		`[1,2]`:         "invalid manifest: json: cannot unmarshal array into Go value of type haptic.Manifest",
		`{"plan_id":"p","files":` + repeatedList(`{"path":"f","digest":"x"}`, MaxFiles) + `}`: "",
	} {
		m, err := decodeManifest([]byte(raw))
		switch {
		case want == "" && (err != nil || len(m.Files) != MaxFiles):
			t.Errorf("%.40s…: %v", raw, err)
		case want != "" && (err == nil || err.Error() != want):
			t.Errorf("%.40s…: %v, want %q", raw, err, want)
		}
	}
}

// TestConcurrentAppliesHoldABoundedAmountOfMemory sends 8 authenticated
// applies, each with a valid manifest of 4 MiB, while the apply lock is
// held: a decoded manifest is held at decodedManifestFactor times its bytes
// within maxHeldBodyBytes, so one waits for the lock and the others are
// refused with a 503 at once; the live heap grows by a manifest or two,
// not by eight.
func TestConcurrentAppliesHoldABoundedAmountOfMemory(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)

	m := e.c.manifest("plan-2", fs)
	proof := strings.Repeat("p", 900)
	for i := len(m.Files); i < MaxFiles; i++ {
		m.Files = append(m.Files, ManifestFile{Path: fmt.Sprintf("big/%d.txt", i), Digest: DigestString(""), Proof: proof})
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > MaxPlanBlobBytes || len(raw) < 3<<20 {
		t.Fatalf("the manifest is %d bytes", len(raw))
	}
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	part, _ := w.CreateFormField(PartManifest)
	part.Write(raw)
	w.Close()

	const requests = 8
	e.a.deps.applyMu.Lock()
	locked := true
	defer func() {
		if locked {
			e.a.deps.applyMu.Unlock()
		}
	}()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	client := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{MaxConnsPerHost: requests, MaxIdleConnsPerHost: requests}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	codes := make(chan int, requests)
	for range requests {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://"+e.a.Addr()+PathApply, bytes.NewReader(body.Bytes()))
			req.Header.Set("Content-Type", w.FormDataContentType())
			req.SetBasicAuth("haptic", "s3cret")
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// Decoding eight manifests takes well under a second without the race
	// detector; what counts is what the agent holds once they all wait.
	var grown, peak int64
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		var now runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&now)
		grown = int64(now.HeapAlloc) - int64(before.HeapAlloc)
		peak = max(peak, grown)
	}
	t.Logf("live heap grew by %d MiB (peak %d MiB) while %d applies of %d bytes waited", grown>>20, peak>>20, requests, len(raw))
	if limit := int64(5 * len(raw)); grown > limit { // eight would be twice that
		t.Errorf("the live heap grew by %d bytes, over %d: more manifests than the budget admits were held", grown, limit)
	}
	e.a.deps.applyMu.Unlock()
	locked = false
	wg.Wait()
	close(codes)
	busy := 0
	for code := range codes {
		switch code {
		case http.StatusServiceUnavailable:
			busy++
		case http.StatusOK, http.StatusConflict:
		default:
			t.Errorf("an apply was answered %d", code)
		}
	}
	if busy == 0 || busy == requests {
		t.Errorf("%d of %d applies were refused for memory; want all but what the budget holds", busy, requests)
	}
}

// TestAnApplyOfExactlyMaxFilesPartsAndItsPlanIsAccepted: the limits are
// inclusive. An apply whose manifest lists MaxFiles files, every one sent
// as a part, with the plan part besides, lands: the tree holds the whole
// set and the plan is stored. The agent runs on the recording disk, where
// creating four thousand files costs nothing.
func TestAnApplyOfExactlyMaxFilesPartsAndItsPlanIsAccepted(t *testing.T) {
	md := newMemDisk()
	e := newTestEnvWithDisk(t, md, func(c *AgentConfig) {
		if err := md.mkdirAll(c.BaseDir); err != nil {
			t.Fatal(err)
		}
	})
	fs := seedFiles()
	p := planOfFiles(t, fs)
	for i := len(fs); i < MaxFiles; i++ {
		path, content := fmt.Sprintf("notes/%04d.txt", i), fmt.Sprintf("note %d\n", i)
		fs[path] = content
		p.addDirFile(path, content) // in path order: every note sorts after the seed's files
	}
	p.ComputeID()
	m := e.c.manifest(p.ID, fs)
	if len(m.Files) != MaxFiles {
		t.Fatalf("the manifest lists %d files", len(m.Files))
	}
	code, body := e.c.post(applyRequest{manifest: m, files: fs, plan: blobOf(t, p)})
	var res ApplyResult
	if code != http.StatusOK || json.Unmarshal(body, &res) != nil || !res.OK {
		t.Fatalf("the apply of %d parts and the plan: %d %.300s", MaxFiles, code, body)
	}
	if got := treeOf(md, e.cfg.BaseDir); !sameSet(got, fs) {
		t.Errorf("the tree holds %d files, want the %d sent", len(got), len(fs))
	}
	if st := e.c.state("?plan=0"); st.AppliedPlanID != p.ID || !st.AppliedPlanStored {
		t.Errorf("applied %q, plan stored %v", st.AppliedPlanID, st.AppliedPlanStored)
	}
}
