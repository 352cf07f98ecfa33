// Tests of the patches Deploy sends: patchFor, the pure function that
// finds the one byte range to replace; deployPatches, which decides which
// files may travel as a patch; the resend that sends a patched file whole
// when the agent lost its base; and the bytes a one-entry change in a
// 10 MB map puts on the wire, against the real agent on the fake HAProxy.

package haptic

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// splice applies a patch the way the agent does.
func splice(base string, p FilePatch, replacement string) string {
	return base[:p.Offset] + replacement + base[p.Offset+p.Length:]
}

// patchBody is n bytes of map lines, so that the patch tests work on text
// shaped like the files they are for.
func patchBody(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "host%d.example.com web-%d\n", i, i%7)
	}
	return b.String()[:n]
}

func TestPatchFor(t *testing.T) {
	base := patchBody(64 << 10)
	mid := len(base) / 2
	for _, tt := range []struct {
		name       string
		base, next string
		wantNil    bool
		offset     int64 // where the replaced range starts
		length     int64 // how many base bytes it replaces
		repl       int   // replacement bytes
	}{
		{"one byte changed mid-file", base, base[:mid] + "X" + base[mid+1:], false, int64(mid), 1, 1},
		{"a line inserted", base, base[:mid] + "new.example.com web-9\n" + base[mid:], false, int64(mid), 0, 22},
		{"a range deleted", base, base[:mid] + base[mid+100:], false, int64(mid), 100, 0},
		{"first byte changed", base, "X" + base[1:], false, 0, 1, 1},
		{"last byte changed", base, base[:len(base)-1] + "X", false, int64(len(base) - 1), 1, 1},
		{"appended", base, base + "tail.example.com web-1\n", false, int64(len(base)), 0, 23},
		{"truncated", base, base[:len(base)-1000], false, int64(len(base) - 1000), 1000, 0},
		{"identical", base, base, false, int64(len(base)), 0, 0},
		// A run of equal bytes makes the range ambiguous; the prefix is
		// taken first and the suffix may not overlap it.
		{"grown run", strings.Repeat("a", 10000), strings.Repeat("a", 10001), false, 10000, 0, 1},
		{"shrunk run", strings.Repeat("a", 10001), strings.Repeat("a", 10000), false, 10000, 1, 0},
		// The block scan must find differences on either side of a block edge.
		{"change before a block edge", base, base[:patchCompareBlock-1] + "X" + base[patchCompareBlock:], false, patchCompareBlock - 1, 1, 1},
		{"change at a block edge", base, base[:patchCompareBlock] + "X" + base[patchCompareBlock+1:], false, patchCompareBlock, 1, 1},
		{"change after a block edge", base, base[:patchCompareBlock+1] + "X" + base[patchCompareBlock+2:], false, patchCompareBlock + 1, 1, 1},
		{"change a block from the end", base, base[:len(base)-patchCompareBlock] + "X" + base[len(base)-patchCompareBlock+1:],
			false, int64(len(base) - patchCompareBlock), 1, 1},
		{"from an empty base", "", base, true, 0, 0, 0},
		{"to a small file", base, base[:minPatchFileBytes-1], true, 0, 0, 0},
		{"smallest file patched", base[:minPatchFileBytes], base[:minPatchFileBytes-1] + "X", false, minPatchFileBytes - 1, 1, 1},
		{"replacement exactly half", base, base[:len(base)/2] + strings.Repeat("X", len(base)/2), false, int64(len(base) / 2), int64(len(base) / 2), len(base) / 2},
		{"replacement one byte over half", base, base[:len(base)/2-1] + strings.Repeat("X", len(base)/2+1), true, 0, 0, 0},
		{"unrelated content", base, strings.Repeat("Z", len(base)), true, 0, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := patchFor(tt.base, tt.next)
			if tt.wantNil {
				if p != nil {
					t.Fatalf("patchFor = %+v (replacement %d bytes), want nil", p.patch, len(p.replacement))
				}
				return
			}
			if p == nil {
				t.Fatal("patchFor = nil, want a patch")
			}
			want := FilePatch{BaseDigest: DigestString(tt.base), BaseSize: int64(len(tt.base)), Offset: tt.offset, Length: tt.length}
			if p.patch != want || len(p.replacement) != tt.repl {
				t.Fatalf("patchFor = %+v with %d replacement bytes, want %+v with %d", p.patch, len(p.replacement), want, tt.repl)
			}
			if got := splice(tt.base, p.patch, p.replacement); got != tt.next {
				t.Fatal("splicing the patch into the base does not give the new content")
			}
		})
	}
}

// TestPatchForIsTheSmallestRange checks patchFor against a byte-by-byte
// reference on random edits: the spliced result is the new content, and no
// single replaced range is shorter.
func TestPatchForIsTheSmallestRange(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 4))
	base := patchBody(3 * patchCompareBlock)
	patched := 0
	for i := range 2000 {
		next := base
		for range 1 + r.IntN(3) {
			at := r.IntN(len(next) + 1)
			cut := min(r.IntN(64), len(next)-at)
			next = next[:at] + strings.Repeat(string(rune('A'+r.IntN(3))), r.IntN(64)) + next[at+cut:]
		}
		prefix := 0
		for prefix < min(len(base), len(next)) && base[prefix] == next[prefix] {
			prefix++
		}
		suffix := 0
		for prefix+suffix < min(len(base), len(next)) && base[len(base)-1-suffix] == next[len(next)-1-suffix] {
			suffix++
		}
		want := len(next) - prefix - suffix
		p := patchFor(base, next)
		if want > len(next)/2 {
			// Edits far apart: the one range spans most of the file.
			if p != nil {
				t.Fatalf("edit %d: a patch replacing %d of %d bytes", i, len(p.replacement), len(next))
			}
			continue
		}
		if p == nil {
			t.Fatalf("edit %d: no patch, though %d of %d bytes change", i, want, len(next))
		}
		if splice(base, p.patch, p.replacement) != next {
			t.Fatalf("edit %d: the splice does not give the new content", i)
		}
		if len(p.replacement) != want {
			t.Fatalf("edit %d: replacement of %d bytes, the smallest is %d", i, len(p.replacement), want)
		}
		patched++
	}
	// Most edits are close enough together to patch; the check above must
	// not pass by skipping them all.
	if patched < 500 {
		t.Fatalf("only %d of 2000 random edits were patched", patched)
	}
}

// patchPlans are two renders of one large file, general so that Diff has
// nothing to compose: v1 and v2 differ in one byte mid-file.
func patchPlans(size int) (v1, v2 *Plan) {
	a := patchBody(size)
	b := a[:size/2] + "X" + a[size/2+1:]
	mk := func(content string) *Plan {
		p := &Plan{SchemaVersion: PlanSchemaVersion, Files: []PlanFile{
			{Path: "big.lst", Kind: FileKindGeneral, Digest: DigestString(content), Size: int64(len(content)), Content: content, ContentKnown: true},
		}}
		p.ComputeID()
		return p
	}
	return mk(a), mk(b)
}

func TestDeployPatchesOnlyWhatTheAgentCanSplice(t *testing.T) {
	v1, v2 := patchPlans(64 << 10)
	f1, f2 := v1.Files[0], v2.Files[0]
	holding := func() *State {
		return &State{
			Features: []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches},
			Files:    map[string]FileAt{f1.Path: {Digest: f1.Digest, Proof: f1.Digest, Size: f1.Size}},
		}
	}
	withContent := func(p *Plan, content string, known bool) *Plan {
		c := p.Clone()
		c.Files[0].Content, c.Files[0].ContentKnown = content, known
		return c
	}
	// near writes s over cut bytes a few bytes after the change from v1 to
	// v2, so that the result is one small patch away from either.
	near := func(content, s string, cut int) string {
		at := len(content)/2 + 10
		return content[:at] + s + content[at+cut:]
	}
	small1, small2 := patchPlans(minPatchFileBytes - 1)
	for _, tt := range []struct {
		name       string
		state      func(s *State)
		next, prev *Plan
		want       bool
	}{
		{"the agent holds the base", nil, v2, v1, true},
		{"an agent without file_patch", func(s *State) { s.Features = []string{FeatureWorkerFence, FeatureRuntimeBatches} }, v2, v1, false},
		{"a held file without a proof", func(s *State) { s.Files[f1.Path] = FileAt{Digest: f1.Digest, Size: f1.Size} }, v2, v1, false},
		{"the path is not held", func(s *State) { s.Files = nil }, v2, v1, false},
		{"the agent holds other bytes", func(s *State) { s.Files[f1.Path] = FileAt{Digest: DigestString("other"), Proof: "p", Size: f1.Size} }, v2, v1, false},
		{"the agent holds another size", func(s *State) { s.Files[f1.Path] = FileAt{Digest: f1.Digest, Proof: "p", Size: f1.Size + 1} }, v2, v1, false},
		{"the agent already holds the new file", func(s *State) { s.Files[f1.Path] = FileAt{Digest: f2.Digest, Proof: f2.Digest, Size: f2.Size} }, v2, v1, false},
		// The file did not change, and the agent holds it under the
		// manifest's proof: it needs no part at all.
		{"an unchanged file the agent holds", func(s *State) { s.Files[f1.Path] = FileAt{Digest: f2.Digest, Proof: f2.Digest, Size: f2.Size} }, v2, v2, false},
		// Under another proof the agent asks for the bytes it has: an empty
		// patch is the cheapest way to give them.
		{"an unchanged file held under another proof", func(s *State) { s.Files[f1.Path] = FileAt{Digest: f2.Digest, Proof: "other", Size: f2.Size} }, v2, v2, true},
		{"no earlier plan", nil, v2, nil, false},
		{"the earlier plan has no content", nil, v2, withContent(v1, "", false), false},
		// The plan says it holds the base's digest, but its bytes are
		// others: a patch computed from them would splice into the wrong
		// file and fail the agent's digest check.
		{"the earlier plan's content is not its digest", nil, v2, withContent(v1, near(f1.Content, "Q", 1), true), false},
		{"the new content is unknown", nil, withContent(v2, "", false), v1, false},
		{"the new content is not the manifest's size", nil, withContent(v2, near(f2.Content, "x", 0), true), v1, false},
		{"a small file", func(s *State) {
			f := small1.Files[0]
			s.Files = map[string]FileAt{f.Path: {Digest: f.Digest, Proof: f.Digest, Size: f.Size}}
		}, small2, small1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			state := holding()
			if tt.state != nil {
				tt.state(state)
			}
			patches := deployPatches(state, ManifestFiles(tt.next), PrepareDeploy(tt.prev, tt.next))
			p, ok := patches[f1.Path]
			if ok != tt.want || len(patches) > 1 {
				t.Fatalf("patches %v, want a patch: %v", patches, tt.want)
			}
			if ok && (p.patch.BaseDigest != state.Files[f1.Path].Digest || splice(tt.prev.Files[0].Content, p.patch, p.replacement) != tt.next.Files[0].Content) {
				t.Fatalf("patch %+v does not turn the held file into the new one", p.patch)
			}
		})
	}
}

// multiPatchPlans are two renders of three 64 KiB general files, a.lst,
// b.lst and c.lst, each one byte apart from v1 to v2.
func multiPatchPlans() (v1, v2 *Plan) {
	mk := func(edit bool) *Plan {
		p := &Plan{SchemaVersion: PlanSchemaVersion}
		for _, name := range []string{"a.lst", "b.lst", "c.lst"} {
			content := patchBody(64 << 10)
			if edit {
				content = content[:100] + name[:1] + content[101:]
			}
			p.Files = append(p.Files, PlanFile{Path: name, Kind: FileKindGeneral, Digest: DigestString(content),
				Size: int64(len(content)), Content: content, ContentKnown: true})
		}
		p.ComputeID()
		return p
	}
	return mk(false), mk(true)
}

// TestDeployResendsListedPatchedFilesWholeAndKeepsTheOthers: the first
// apply patches the two files the agent holds; the agent lists one of them
// (its base is gone) and the file it does not hold; the resend sends those
// two whole, without a patch, and keeps the other file's patch.
func TestDeployResendsListedPatchedFilesWholeAndKeepsTheOthers(t *testing.T) {
	v1, v2 := multiPatchPlans()
	agent := &scriptedAgent{
		state: func(int) State {
			s := podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1})
			s.Files = map[string]FileAt{}
			for _, f := range v1.Files[:2] { // c.lst is not held: it travels whole
				s.Files[f.Path] = FileAt{Digest: f.Digest, Proof: f.Digest, Size: f.Size}
			}
			return s
		},
		apply: func(n int, _ recordedRequest) (int, any) {
			if n == 1 {
				return 409, Missing{Missing: []string{"a.lst", "c.lst"}}
			}
			return 200, ackFor(v2, ResultFileOnly)
		},
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1}); err != nil {
		t.Fatal(err)
	}
	applies := agent.requests("POST /v1/apply")
	if len(applies) != 2 {
		t.Fatalf("%d applies, want 2", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	patchOf := func(s sentApply, p string) *FilePatch {
		for _, f := range s.manifest.Files {
			if f.Path == p {
				return f.Patch
			}
		}
		t.Fatalf("%s is not in the manifest", p)
		return nil
	}
	for _, p := range []string{"a.lst", "b.lst"} {
		if patchOf(first, p) == nil || len(first.parts[p]) != 1 {
			t.Fatalf("first apply: %s patch %+v, part of %d bytes; want a one-byte patch", p, patchOf(first, p), len(first.parts[p]))
		}
	}
	if patchOf(first, "c.lst") != nil || slices.Contains(first.names, "c.lst") {
		t.Fatal("first apply: c.lst, which the agent does not hold, was patched or sent")
	}
	if patchOf(resend, "a.lst") != nil || resend.parts["a.lst"] != v2.Files[0].Content {
		t.Fatalf("resend: a.lst patch %+v, part of %d bytes; want the whole file", patchOf(resend, "a.lst"), len(resend.parts["a.lst"]))
	}
	if patchOf(resend, "b.lst") == nil || len(resend.parts["b.lst"]) != 1 {
		t.Fatalf("resend: b.lst patch %+v, part of %d bytes; want its patch still", patchOf(resend, "b.lst"), len(resend.parts["b.lst"]))
	}
	if patchOf(resend, "c.lst") != nil || resend.parts["c.lst"] != v2.Files[2].Content {
		t.Fatal("resend: c.lst is not sent whole")
	}
	if len(resend.names) != 3 {
		t.Fatalf("resend parts %v, want a.lst, b.lst and c.lst", resend.names)
	}
}

// ---------------------------------------------------------------------------
// Against the real agent on the fake HAProxy, counting bytes on the wire.

// wireTally counts the bytes a client writes to its connections, by
// route. Deploy sends one request at a time, and Apply returns only once
// its body writer stopped, so the bytes written from the start of one
// request to the start of the next are that request's.
type wireTally struct {
	sent  atomic.Int64
	mu    sync.Mutex
	marks []wireMark
}

type wireMark struct {
	route string
	at    int64
}

type countedConn struct {
	net.Conn
	sent *atomic.Int64
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.sent.Add(int64(n))
	return n, err
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countWire makes c count every byte it writes, headers and chunk framing
// included.
func countWire(c *Client) *wireTally {
	tally := &wireTally{}
	dial := c.transport.DialContext
	c.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countedConn{Conn: conn, sent: &tally.sent}, nil
	}
	c.http.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		tally.mu.Lock()
		tally.marks = append(tally.marks, wireMark{route: r.Method + " " + r.URL.Path, at: tally.sent.Load()})
		tally.mu.Unlock()
		return c.transport.RoundTrip(r)
	})
	return tally
}

// take returns the bytes sent since the last take, by route, and in all.
func (w *wireTally) take() (byRoute map[string]int64, total int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	end := w.sent.Load()
	byRoute = map[string]int64{}
	for i, m := range w.marks {
		next := end
		if i+1 < len(w.marks) {
			next = w.marks[i+1].at
		}
		byRoute[m.route] += next - m.at
		total += next - m.at
	}
	w.marks = nil
	return byRoute, total
}

// bigHostMap is a host map of about size bytes, with an entry
// shop.example.com (the example's) in the middle whose value is value.
// Every other value is a backend name followed by pad bytes of path, like
// a redirect map's URLs: a longer line means fewer entries for the same
// bytes, which keeps a test of the file's size from paying for parsing,
// diffing and reading back a larger map.
func bigHostMap(size int, value string, pad int) string {
	var b strings.Builder
	half := size / 2
	path := strings.Repeat("p", pad)
	for i := 0; b.Len() < size; i++ {
		if b.Len() >= half && half > 0 {
			fmt.Fprintf(&b, "shop.example.com %s\n", value)
			half = 0
		}
		fmt.Fprintf(&b, "%08x.tenant%d.example.com be_pool_%d%s\n", i*2654435761%(1<<32), i, i%97, path)
	}
	return b.String()
}

// patchEnv is an agent on the fake HAProxy that applied a large host map
// (plans[0]), and the counting client that deployed it.
type patchEnv struct {
	fake   *FakeHAProxy
	agent  *Agent
	client *Client
	wire   *wireTally
	plans  [2]*Plan // one entry apart: shop.example.com → web-a, web-b
	blobs  [2][]byte
}

func newPatchEnv(tb testing.TB, size, pad int) *patchEnv {
	tb.Helper()
	e := &patchEnv{fake: startTestFake(tb, "")}
	for i, value := range []string{"web-a", "web-b"} {
		e.plans[i] = examplePlan(bigHostMap(size, value, pad))
		blob, err := EncodePlanBlob(e.plans[i])
		if err != nil {
			tb.Fatal(err)
		}
		e.blobs[i] = blob
	}
	seedHostMap(e.fake, e.plans[0].Files[1].Content)
	e.agent = startTestAgent(tb, e.fake, nil)
	e.client = deployClient(tb, agentBaseURL(e.agent))
	e.wire = countWire(e.client)
	if res, err := Deploy(context.Background(), e.client, e.plans[0], DeployOptions{LeaderEpoch: 1, PlanBlob: e.blobs[0]}); err != nil || !res.OK {
		tb.Fatalf("first deploy = %+v, %v", res, err)
	}
	e.wire.take()
	return e
}

// TestDeployPatchesAOneEntryChangeInA10MBMap deploys one changed map entry
// in a 10 MB map to the real agent and counts what the client writes: the
// apply carries a patch of a few bytes, not the map, and the plan upload a
// patch of the plan, not its blob. (BenchmarkDeployPatch10MB
// compares with the same deploy sending the map whole.)
func TestDeployPatchesAOneEntryChangeInA10MBMap(t *testing.T) {
	e := newPatchEnv(t, 10<<20, 200)
	ctx := context.Background()
	v1, v2 := e.plans[0], e.plans[1]

	res, err := Deploy(ctx, e.client, v2, DeployOptions{LeaderEpoch: 1, Applied: v1, PlanBlob: e.blobs[1]})
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("patched deploy = %+v, %v", res, err)
	}
	byRoute, total := e.wire.take()
	t.Logf("patched deploy sent %d bytes: %v", total, byRoute)
	// The plan travels as the splices of the plan the pod holds, and the
	// whole deploy (state read, apply, plan) costs kilobytes.
	if n := byRoute["PUT "+PathPlan]; n == 0 || n >= 4<<10 {
		t.Fatalf("the plan upload sent %d bytes, want a patch under 4 KiB", n)
	}
	if total >= 8<<10 {
		t.Fatalf("a one-entry change sent %d bytes, want under 8 KiB", total)
	}
	if st, err := e.client.State(ctx, StateRead{Plan: true}); err != nil || !bytes.Equal(st.AppliedPlan, e.blobs[1]) {
		t.Fatalf("the stored plan is not v2's blob byte for byte (%v)", err)
	}
	got, err := os.ReadFile(filepath.Join(e.agent.cfg.BaseDir, exampleHostMap))
	if err != nil || string(got) != v2.Files[1].Content {
		t.Fatalf("the map on disk is not v2's (%d bytes, %v)", len(got), err)
	}
	if entries := e.fake.MapEntries(exampleHostMap); !slices.Contains(entries, MapEntry{Key: "shop.example.com", Value: "web-b"}) {
		t.Fatal("the worker's map lacks shop.example.com web-b")
	}
}

// TestDeployPatchWhoseBaseIsGoneLandsWhole: the map on disk changes behind
// the agent's back, so the agent's record no longer describes it. The
// patch is refused as Missing, and the resend lands the whole file.
func TestDeployPatchWhoseBaseIsGoneLandsWhole(t *testing.T) {
	e := newPatchEnv(t, 256<<10, 0)
	v1, v2 := e.plans[0], e.plans[1]
	mapPath := filepath.Join(e.agent.cfg.BaseDir, exampleHostMap)
	if err := os.WriteFile(mapPath, []byte(strings.Replace(v1.Files[1].Content, "be_pool_1\n", "be_pool_2\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	proxyURL, log := startRecordingProxy(t, e.agent.Addr(), nil)
	res, err := Deploy(context.Background(), deployClient(t, proxyURL), v2, DeployOptions{LeaderEpoch: 1, Applied: v1, PlanBlob: e.blobs[1]})
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	applies := routeRequests(log, "POST /v1/apply")
	if len(applies) != 2 {
		t.Fatalf("%d applies, want 2", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if p := first.manifest.Files[1].Patch; p == nil || len(first.parts[exampleHostMap]) > 64 {
		t.Fatalf("first apply: patch %+v, part of %d bytes; want a small patch", p, len(first.parts[exampleHostMap]))
	}
	if p := resend.manifest.Files[1].Patch; p != nil || resend.parts[exampleHostMap] != v2.Files[1].Content {
		t.Fatalf("resend: patch %+v, part of %d bytes; want the whole map", p, len(resend.parts[exampleHostMap]))
	}
	if got, err := os.ReadFile(mapPath); err != nil || string(got) != v2.Files[1].Content {
		t.Fatalf("the map on disk is not v2's (%d bytes, %v)", len(got), err)
	}
}

// BenchmarkDeployPatch10MB deploys one changed entry of a 10 MB map to the
// real agent, back and forth, and reports the bytes the client writes per
// deploy: "patch" with the caller's earlier plan (the map travels as a
// patch), "whole" with that plan's contents withheld (the map travels
// whole). Both include the plan's upload after each runtime apply (a
// patch of the plan before, which both hold), also reported alone.
func BenchmarkDeployPatch10MB(b *testing.B) {
	for _, mode := range []string{"patch", "whole"} {
		b.Run(mode, func(b *testing.B) {
			e := newPatchEnv(b, 10<<20, 0)
			applied := e.plans
			if mode == "whole" {
				for i, p := range applied {
					applied[i] = p.Clone()
					applied[i].Files[1].Content, applied[i].Files[1].ContentKnown = "", false
				}
			}
			ctx := context.Background()
			var sent, plan int64
			b.ResetTimer()
			for i := range b.N {
				next, prev := (i+1)%2, i%2
				res, err := Deploy(ctx, e.client, e.plans[next], DeployOptions{LeaderEpoch: 1, Applied: applied[prev], PlanBlob: e.blobs[next]})
				if err != nil || res.Mode != ResultRuntime {
					b.Fatalf("Deploy = %+v, %v", res, err)
				}
				byRoute, total := e.wire.take()
				sent += total
				plan += byRoute["PUT "+PathPlan]
			}
			b.ReportMetric(float64(sent)/float64(b.N), "sent-B/op")
			b.ReportMetric(float64(sent-plan)/float64(b.N), "sent-but-plan-B/op")
			b.ReportMetric(float64(plan)/float64(b.N), "plan-B/op")
		})
	}
}
