// Table tests for Diff and its wire helpers (deployplan.md §12), on the
// fixtures of deployplan.md §11. Every plan here is built by basePlan, which
// derives every digest from content, so equality stays decidable after a
// plan-blob round trip.
package haptic

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// Fixtures (deployplan.md §11).

const (
	routeMap = "maps/route-backend.map"
	certPath = "certs/tls.pem"
	caPath   = "ca/bundle.pem"
	listPath = "certs/default.crt-list"
)

var (
	on34 = CapsFor("3.4.3", nil)
	on33 = CapsFor("3.3.13", nil)
)

// planBuilder holds what a fixture plan states before basePlan derives its
// sections, files and digests.
type planBuilder struct {
	schema   int
	cores    []Section // kind core, name and text
	profiles map[string]string
	backends map[string]Backend
	raw      []Section
	maps     map[string]Map
	crtLists map[string]CRTList
	files    []PlanFile
	reload   map[string]bool
}

type planOpt func(*planBuilder)

// basePlan builds a plan: core section global, profile haptic-be (body
// body-1), and whatever the options add. Sections are global (and further
// core sections in option order), profiles by name, backends by name, then
// raw sections; files are haproxy.cfg, one per map, one per crt-list, then
// the extra files. Every digest is set from content and the id is computed
// last.
func basePlan(opts ...planOpt) *Plan {
	b := &planBuilder{
		schema:   PlanSchemaVersion,
		cores:    []Section{{Kind: SectionKindCore, Name: "global", Text: "global\n"}},
		profiles: map[string]string{"haptic-be": "body-1"},
		backends: map[string]Backend{},
		maps:     map[string]Map{},
		crtLists: map[string]CRTList{},
		reload:   map[string]bool{},
	}
	for _, o := range opts {
		o(b)
	}
	p := &Plan{
		SchemaVersion: b.schema,
		Backends:      map[string]Backend{},
		Profiles:      map[string]Profile{},
		Maps:          map[string]Map{},
	}
	for _, c := range b.cores {
		p.Sections = append(p.Sections, textSection(SectionKindCore, c.Name, c.Text))
	}
	for _, name := range sortedKeys(b.profiles) {
		body := b.profiles[name]
		p.Sections = append(p.Sections, textSection(SectionKindProfile, name, "defaults "+name+"\n  "+body+"\n"))
		p.Profiles[name] = Profile{Name: name, BodyDigest: DigestString(body)}
	}
	for _, name := range sortedKeys(b.backends) {
		be, text := derivedBackend(b.backends[name])
		p.Sections = append(p.Sections, textSection(SectionKindBackend, name, text))
		p.Backends[name] = be
	}
	p.Sections = append(p.Sections, b.raw...)
	for _, name := range sortedKeys(b.maps) {
		m := b.maps[name]
		var content strings.Builder
		for _, e := range m.Entries {
			content.WriteString(e.Key + " " + e.Value + "\n")
		}
		p.Maps[name] = m
		p.Files = append(p.Files, fileOf(name, FileKindMap, content.String()))
	}
	if len(b.crtLists) > 0 {
		p.CRTLists = map[string]CRTList{}
	}
	for _, name := range sortedKeys(b.crtLists) {
		l := b.crtLists[name]
		js, _ := json.Marshal(l)
		p.CRTLists[name] = l
		p.Files = append(p.Files, fileOf(name, FileKindCRTList, string(js)))
	}
	p.Files = append(p.Files, b.files...)
	for i := range p.Files {
		if b.reload[p.Files[i].Path] {
			p.Files[i].ReloadOnChange = true
		}
	}
	return finishPlan(p)
}

// finishPlan (re)derives haproxy.cfg from the sections — one
// kind:name:textDigest line each — and computes the id.
func finishPlan(p *Plan) *Plan {
	var cfg strings.Builder
	for _, s := range p.Sections {
		cfg.WriteString(s.Kind + ":" + s.Name + ":" + s.TextDigest + "\n")
	}
	config := fileOf(ConfigFilePath, FileKindConfig, cfg.String())
	config.ReloadOnChange = true
	if i := slices.IndexFunc(p.Files, func(f PlanFile) bool { return f.Kind == FileKindConfig }); i >= 0 {
		p.Files[i] = config
	} else {
		p.Files = append([]PlanFile{config}, p.Files...)
	}
	p.ComputeID()
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func textSection(kind, name, text string) Section {
	return Section{Kind: kind, Name: name, TextDigest: DigestString(text), Length: len(text), Text: text, TextKnown: true}
}

func fileOf(path, kind, content string) PlanFile {
	return PlanFile{Path: path, Kind: kind, Digest: DigestString(content), Size: int64(len(content)), Content: content, ContentKnown: true}
}

// derivedBackend sets every digest of a backend record from its content and
// returns the section text, which carries the record so that a record
// change changes the text.
func derivedBackend(b Backend) (Backend, string) {
	rec := b
	rec.Body, rec.Comments = nil, nil
	rec.BodyDigest, rec.CommentsDigest, rec.RecordDigest, rec.TextDigest = "", "", "", ""
	js, _ := json.Marshal(rec)
	b.RecordDigest = DigestString(string(js))
	b.BodyDigest = DigestString(strings.Join(b.Body, "\n"))
	b.CommentsDigest = DigestString(strings.Join(b.Comments, "\n"))
	b.ContentKnown = true
	var text strings.Builder
	text.WriteString("backend " + b.Name + "\n")
	for _, c := range b.Comments {
		text.WriteString("  # " + c + "\n")
	}
	for _, l := range b.Body {
		text.WriteString("  " + l + "\n")
	}
	text.WriteString("  # record " + string(js) + "\n")
	b.TextDigest = DigestString(text.String())
	return b, text.String()
}

// setSectionText replaces one section's text (and its backend's
// TextDigest) without touching any record, then re-derives the plan.
func setSectionText(p *Plan, kind, name, text string) *Plan {
	for i := range p.Sections {
		if p.Sections[i].Kind == kind && p.Sections[i].Name == name {
			p.Sections[i] = textSection(kind, name, text)
		}
	}
	if b, ok := p.Backends[name]; ok && kind == SectionKindBackend {
		b.TextDigest = DigestString(text)
		p.Backends[name] = b
	}
	return finishPlan(p)
}

func withBackends(bs ...Backend) planOpt {
	return func(b *planBuilder) {
		for _, be := range bs {
			b.backends[be.Name] = be
		}
	}
}

func withoutBackend(name string) planOpt {
	return func(b *planBuilder) { delete(b.backends, name) }
}

// withCore adds a core section, or replaces the text of an existing one.
func withCore(name, text string) planOpt {
	return func(b *planBuilder) {
		for i := range b.cores {
			if b.cores[i].Name == name {
				b.cores[i].Text = text
				return
			}
		}
		b.cores = append(b.cores, Section{Kind: SectionKindCore, Name: name, Text: text})
	}
}

func withoutCore(name string) planOpt {
	return func(b *planBuilder) {
		b.cores = slices.DeleteFunc(b.cores, func(s Section) bool { return s.Name == name })
	}
}

func withProfile(name, body string) planOpt {
	return func(b *planBuilder) { b.profiles[name] = body }
}

func withoutProfile(name string) planOpt {
	return func(b *planBuilder) { delete(b.profiles, name) }
}

func withRawSection(kind, name, text string) planOpt {
	return func(b *planBuilder) { b.raw = append(b.raw, textSection(kind, name, text)) }
}

func withMap(name string, ordered bool, entries ...MapEntry) planOpt {
	return func(b *planBuilder) { b.maps[name] = Map{Path: name, Ordered: ordered, Entries: entries} }
}

func withCRTList(path string, entries ...CRTListEntry) planOpt {
	return func(b *planBuilder) { b.crtLists[path] = CRTList{Path: path, Entries: entries} }
}

func withFile(path, kind, content string) planOpt {
	return func(b *planBuilder) { b.files = append(b.files, fileOf(path, kind, content)) }
}

func withReloadOnChange(path string) planOpt {
	return func(b *planBuilder) { b.reload[path] = true }
}

func withSchema(v int) planOpt {
	return func(b *planBuilder) { b.schema = v }
}

func dynBackend(name string, servers ...Server) Backend {
	return Backend{Name: name, Profile: "haptic-be", Mode: "http", Balance: "roundrobin", Shape: ShapeDynamic, Servers: servers}
}

func structuralBackend(name string, servers ...Server) Backend {
	b := dynBackend(name, servers...)
	b.Shape = ShapeStructural
	b.ShapeReason = "stick-table in the body"
	b.Body = []string{"stick-table"}
	return b
}

func srv(name, ip string, port int) Server {
	return Server{Name: name, Address: ip, Port: port}
}

func intp(v int) *int { return &v }

func weighted(s Server, w int) Server { s.Weight = intp(w); return s }

func disabled(s Server) Server { s.Disabled = true; return s }

func withExtra(s Server, kws ...KeywordArg) Server { s.Extra = kws; return s }

func kw(name string, args ...string) KeywordArg { return KeywordArg{Name: name, Args: args} }

// entries builds map entries from key, value pairs.
func entries(kv ...string) []MapEntry {
	var es []MapEntry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, MapEntry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func baseOf(prev *Plan) *Baseline {
	return &Baseline{Applied: prev, Running: prev, Caps: on34}
}

func withMapsLoaded(base *Baseline, paths ...string) *Baseline {
	base.Inventory.Maps = append(base.Inventory.Maps, paths...)
	return base
}

// ---------------------------------------------------------------------------
// Assertions.

func opKindsOf(ops []Op) []string {
	kinds := make([]string, len(ops))
	for i, op := range ops {
		kinds[i] = op.Kind
	}
	return kinds
}

func wantKinds(t *testing.T, ops []Op, want ...string) {
	t.Helper()
	if got := opKindsOf(ops); !slices.Equal(got, want) {
		t.Fatalf("op kinds = %v, want %v", got, want)
	}
}

func wantOps(t *testing.T, got []Op, want ...Op) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ops =\n  %s\nwant\n  %s", opsJSON(got), opsJSON(want))
	}
}

func opsJSON(ops []Op) string {
	b, _ := json.Marshal(ops)
	return string(b)
}

func wantVerdict(t *testing.T, d Decision, verdict string) {
	t.Helper()
	if d.Verdict != verdict {
		t.Fatalf("verdict = %s, want %s (reasons %q, ops %v)", d.Verdict, verdict, d.Reasons, opKindsOf(d.Ops))
	}
	wantMode := ModeAuto
	if verdict == VerdictReload {
		wantMode = ModeReload
		if len(d.Ops) != 0 || d.Chunks != 0 {
			t.Fatalf("a reload carries %d ops and %d chunks", len(d.Ops), d.Chunks)
		}
	}
	if d.Mode != wantMode {
		t.Fatalf("mode = %s, want %s", d.Mode, wantMode)
	}
}

func wantReason(t *testing.T, d Decision, substr string) {
	t.Helper()
	for _, r := range d.Reasons {
		if strings.Contains(r, substr) {
			return
		}
	}
	t.Fatalf("no reason contains %q; reasons = %q", substr, d.Reasons)
}

func wantReasonsExactly(t *testing.T, d Decision, want ...string) {
	t.Helper()
	if !slices.Equal(d.Reasons, want) {
		t.Fatalf("reasons = %q, want exactly %q", d.Reasons, want)
	}
}

// ---------------------------------------------------------------------------
// CapsFor and ComposedOps.

func TestCapsFor(t *testing.T) {
	for _, tc := range []struct {
		name, version                string
		servers, initState, backends bool
	}{
		{"3.0 has dynamic servers only", "3.0.26", true, false, false},
		{"3.1 adds init-state", "3.1.17", true, true, false},
		{"3.3 still has no dynamic backends", "3.3.13", true, true, false},
		{"3.4 has everything", "3.4.3", true, true, true},
		{"a v prefix and a suffix are read", "v3.4.3-1ppa", true, true, true},
		{"a major only is read", "4", true, true, true},
		{"an older release has none", "2.9.0", false, false, false},
		{"an unreadable version has none", "unknown", false, false, false},
		{"an empty version has none", "", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := Caps{DynamicServers: tc.servers, ServerInitState: tc.initState, DynamicBackends: tc.backends}
			if got := CapsFor(tc.version, nil); !reflect.DeepEqual(got, want) {
				t.Fatalf("CapsFor(%q) = %+v, want %+v", tc.version, got, want)
			}
		})
	}
}

func TestCapsForAgentOps(t *testing.T) {
	c := CapsFor("3.4.3", []string{OpMapSet, OpMapAdd})
	if want := map[string]bool{OpMapSet: true, OpMapAdd: true}; !reflect.DeepEqual(c.AgentOps, want) {
		t.Fatalf("AgentOps = %v, want %v", c.AgentOps, want)
	}
	if c := CapsFor("3.4.3", []string{}); c.AgentOps != nil {
		t.Fatalf("an empty list gives AgentOps %v, want nil", c.AgentOps)
	}
}

func TestComposedOpsIsTheFixedList(t *testing.T) {
	want := []string{
		"backend_add", "backend_publish", "backend_unpublish", "backend_del", "wait_be_removable",
		"server_add", "server_enable", "server_disable", "server_set_addr", "server_set_weight", "server_set_state",
		"wait_srv_removable", "server_del",
		"map_add", "map_set", "map_del", "map_replace",
		"cert_set", "cert_new", "ca_set", "ca_new", "crtlist_add", "crtlist_del",
	}
	got := ComposedOps()
	if !slices.Equal(got, want) {
		t.Fatalf("ComposedOps() = %v, want %v", got, want)
	}
	if len(got) != 23 || len(slices.Compact(slices.Sorted(slices.Values(got)))) != 23 {
		t.Fatalf("ComposedOps() has duplicates: %v", got)
	}
	if slices.Contains(got, OpShutdownSessions) {
		t.Fatal("ComposedOps() lists shutdown_sessions")
	}
	got[0] = "changed"
	if again := ComposedOps(); !slices.Equal(again, want) {
		t.Fatalf("modifying the result changed the next call: %v", again)
	}
}

func TestComposedOpsCoversEveryKindTheRulesEmit(t *testing.T) {
	composed := ComposedOps()
	check := func(t *testing.T, d Decision) {
		t.Helper()
		for _, op := range slices.Concat(d.Ops, d.InPlace) {
			if !slices.Contains(composed, op.Kind) {
				t.Errorf("Diff emitted %s, which ComposedOps does not list", op.Kind)
			}
		}
	}
	t.Run("lifecycle", func(t *testing.T) {
		prev := basePlan(
			withBackends(dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-keep", srv("SRV_1", "10.0.0.3", 80))),
			withMap(routeMap, false, entries("a", "1", "b", "2")...),
			withFile(certPath, FileKindCert, "cert-before"), withFile(caPath, FileKindCA, "ca-before"),
			withCRTList(listPath, CRTListEntry{Cert: certPath}))
		next := basePlan(
			withBackends(dynBackend("be-new", srv("SRV_1", "10.0.0.2", 80)),
				dynBackend("be-keep", weighted(disabled(srv("SRV_1", "10.0.0.3", 80)), 5))),
			withMap(routeMap, false, entries("a", "9", "c", "3")...),
			withFile(certPath, FileKindCert, "cert-after"), withFile(caPath, FileKindCA, "ca-after"),
			withCRTList(listPath, CRTListEntry{Cert: certPath}, CRTListEntry{Cert: "certs/other.pem"}))
		base := withMapsLoaded(baseOf(prev), routeMap)
		base.Inventory.CRTLists = []string{listPath}
		d := Diff(next, base)
		wantVerdict(t, d, VerdictRuntime)
		check(t, d)
	})
	t.Run("ordered map reordered", func(t *testing.T) {
		prev := basePlan(withMap(routeMap, true, entries("a", "1", "b", "2")...))
		next := basePlan(withMap(routeMap, true, entries("b", "2", "a", "1")...))
		d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
		wantKinds(t, d.Ops, OpMapReplace)
		check(t, d)
	})
	t.Run("in place", func(t *testing.T) {
		prev := basePlan(withBackends(dynBackend("be-keep", weighted(srv("SRV_1", "10.0.0.3", 80), 10))))
		next := basePlan(withBackends(dynBackend("be-keep", weighted(srv("SRV_1", "10.0.0.3", 80), 20))))
		base := baseOf(prev)
		base.WorkerOps, base.ReloadPending = prev, true
		d := Diff(next, base)
		wantKinds(t, d.InPlace, OpServerSetWeight)
		check(t, d)
	})
}

// ---------------------------------------------------------------------------
// Decision, control flow, batching.

func TestDiffOpOrder(t *testing.T) {
	prev := basePlan(
		withBackends(dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-keep", srv("SRV_1", "10.0.0.3", 80))),
		withMap(routeMap, false, entries("keep", "be-keep", "old", "be-old")...),
		withFile(certPath, FileKindCert, "before"))
	next := basePlan(
		withBackends(dynBackend("be-new", srv("SRV_1", "10.0.0.2", 80)), dynBackend("be-keep", srv("SRV_1", "10.0.0.4", 80))),
		withMap(routeMap, false, entries("keep", "be-keep", "new", "be-new")...),
		withFile(certPath, FileKindCert, "after"))
	base := withMapsLoaded(baseOf(prev), routeMap)
	base.Inventory.Certs = []string{certPath}
	d := Diff(next, base)
	wantVerdict(t, d, VerdictRuntime)
	wantKinds(t, d.Ops,
		OpCertSet, OpBackendAdd, OpServerAdd, OpServerEnable, OpServerSetAddr, OpBackendPublish,
		OpMapAdd, OpMapDel, OpBackendUnpublish, OpServerDisable, OpServerWaitRemovable, OpServerDel,
		OpBackendWaitRemovable, OpBackendDel)
}

func TestDiffIsAllOrNothing(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), structuralBackend("be-b")))
	changed := structuralBackend("be-b")
	changed.Body = []string{"stick-table", "stick on src"}
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80)), changed))
	d := Diff(next, baseOf(prev))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "be-b: body changed")
	if len(d.Ops) != 0 || d.Chunks != 0 || len(d.Files) != len(next.Files) {
		t.Fatalf("ops %d, chunks %d, files %d of %d", len(d.Ops), d.Chunks, len(d.Files), len(next.Files))
	}
}

func TestDiffNoopRenderIsFileOnly(t *testing.T) {
	p := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	d := Diff(p, baseOf(p))
	wantVerdict(t, d, VerdictFileOnly)
	if len(d.Ops) != 0 || len(d.Reasons) != 0 {
		t.Fatalf("ops %v, reasons %q", d.Ops, d.Reasons)
	}
}

func TestDiffWithoutARenderReloads(t *testing.T) {
	d := Diff(nil, baseOf(basePlan()))
	wantVerdict(t, d, VerdictReload)
	wantReasonsExactly(t, d, "no render")
	if d.Files != nil {
		t.Fatalf("Files = %v, want nil", d.Files)
	}
}

func TestDiffChunking(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_0", "10.0.0.1", 80))))
	nextWith := func(n int) *Plan {
		servers := make([]Server, n)
		for i := range servers {
			servers[i] = srv(fmt.Sprintf("SRV_%d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), 80)
		}
		return basePlan(withBackends(dynBackend("be-a", servers...)))
	}
	for _, tc := range []struct {
		n, chunks int
	}{{400, 1}, {600, 2}} {
		t.Run(fmt.Sprint("N=", tc.n), func(t *testing.T) {
			d := Diff(nextWith(tc.n), baseOf(prev))
			wantVerdict(t, d, VerdictRuntime)
			chunks := d.Chunk()
			if d.Chunks != tc.chunks || len(chunks) != tc.chunks {
				t.Fatalf("Chunks = %d, Chunk() has %d, want %d", d.Chunks, len(chunks), tc.chunks)
			}
			sum := 0
			for _, c := range chunks {
				if len(c) > MaxOpsPerApply {
					t.Fatalf("a chunk holds %d ops", len(c))
				}
				sum += len(c)
			}
			if sum != len(d.Ops) {
				t.Fatalf("chunks hold %d ops, Ops %d", sum, len(d.Ops))
			}
		})
	}
	t.Run("N=4500", func(t *testing.T) {
		d := Diff(nextWith(4500), baseOf(prev))
		wantVerdict(t, d, VerdictReload)
		wantReason(t, d, "op cap")
	})
}

func TestDecisionChunkBudgetsTheInPlaceBatch(t *testing.T) {
	ops := func(n int) []Op {
		o := make([]Op, n)
		for i := range o {
			o[i] = Op{Kind: OpMapSet, Path: routeMap, Key: fmt.Sprint("k", i), Value: "v"}
		}
		return o
	}
	for _, tc := range []struct {
		name         string
		ops, inPlace int
		sizes        []int
	}{
		{"1500 ops, none in place", 1500, 0, []int{1000, 500}},
		{"1500 ops, 400 in place", 1500, 400, []int{600, 900}},
		{"5 ops, 1000 in place", 5, 1000, []int{0, 5}},
		{"no ops", 0, 10, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Decision{Ops: ops(tc.ops), InPlace: ops(tc.inPlace)}
			chunks := d.Chunk()
			if tc.sizes == nil {
				if chunks != nil {
					t.Fatalf("Chunk() = %d chunks, want nil", len(chunks))
				}
				return
			}
			var sizes []int
			var all []Op
			for _, c := range chunks {
				sizes = append(sizes, len(c))
				all = append(all, c...)
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Fatalf("sizes = %v, want %v", sizes, tc.sizes)
			}
			if len(chunks[0])+len(d.InPlace) > MaxOpsPerApply {
				t.Fatalf("first chunk %d + in place %d exceed the cap", len(chunks[0]), len(d.InPlace))
			}
			if !reflect.DeepEqual(all, d.Ops) {
				t.Fatal("the chunks concatenated are not Ops")
			}
			if chunkCount(tc.ops, tc.inPlace) != len(chunks) {
				t.Fatalf("chunkCount = %d, Chunk() gives %d", chunkCount(tc.ops, tc.inPlace), len(chunks))
			}
		})
	}
}

func TestDiffRefusesOpsTheAgentDoesNotExecute(t *testing.T) {
	prev := basePlan()
	next := basePlan(withBackends(dynBackend("be-new", srv("SRV_1", "10.0.0.1", 80))))
	base := baseOf(prev)
	base.Caps = CapsFor("3.4.3", []string{OpBackendAdd, OpServerAdd, OpServerEnable})
	d := Diff(next, base)
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "the agent does not execute backend_publish")
}

func TestDiffCapsTheReasonList(t *testing.T) {
	prev := basePlan()
	var opts []planOpt
	for i := range 37 {
		opts = append(opts, withCore(fmt.Sprintf("frontend#%d", i), fmt.Sprintf("frontend f%d\n", i)))
	}
	d := Diff(basePlan(opts...), baseOf(prev))
	wantVerdict(t, d, VerdictReload)
	if len(d.Reasons) != maxReasons {
		t.Fatalf("%d reasons, want exactly %d", len(d.Reasons), maxReasons)
	}
}

func TestDiffIsDeterministic(t *testing.T) {
	prev := basePlan(
		withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-b", srv("SRV_1", "10.0.0.5", 80)),
			dynBackend("be-c", srv("SRV_1", "10.0.0.6", 80))),
		withMap(routeMap, false, entries("a", "be-a", "b", "be-b", "c", "be-c")...),
		withMap("maps/other.map", false, entries("x", "1", "y", "2")...))
	next := basePlan(
		withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80), srv("SRV_2", "10.0.0.3", 80)),
			dynBackend("be-b", weighted(srv("SRV_1", "10.0.0.5", 80), 3)), dynBackend("be-d", srv("SRV_1", "10.0.0.9", 80))),
		withMap(routeMap, false, entries("a", "be-d", "c", "be-c", "d", "be-a")...),
		withMap("maps/other.map", false, entries("x", "3", "z", "4")...))
	base := withMapsLoaded(baseOf(prev), routeMap, "maps/other.map")
	first, second := Diff(next, base), Diff(next, base)
	wantVerdict(t, first, VerdictRuntime)
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("two diffs differ:\n%s\n%s", opsJSON(first.Ops), opsJSON(second.Ops))
	}
}

func TestDiffOpsDoNotAliasThePlan(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 10))))
	next := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 20))))
	d := Diff(next, baseOf(prev))
	wantKinds(t, d.Ops, OpServerSetWeight)
	*next.Backends["be-a"].Servers[0].Weight = 99
	if *d.Ops[0].Weight != 20 {
		t.Fatalf("Ops[0].Weight = %d after changing the plan, want 20", *d.Ops[0].Weight)
	}
}

func TestDecisionJSON(t *testing.T) {
	keysOf := func(t *testing.T, d Decision) []string {
		t.Helper()
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return sortedKeys(m)
	}
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))))
	runtime := Diff(next, baseOf(prev))
	wantVerdict(t, runtime, VerdictRuntime)
	if got, want := keysOf(t, runtime), []string{"chunks", "files", "mode", "ops", "verdict"}; !slices.Equal(got, want) {
		t.Fatalf("runtime decision keys = %v, want %v", got, want)
	}
	fileOnly := Diff(prev, baseOf(prev))
	wantVerdict(t, fileOnly, VerdictFileOnly)
	if got, want := keysOf(t, fileOnly), []string{"files", "mode", "verdict"}; !slices.Equal(got, want) {
		t.Fatalf("file_only decision keys = %v, want %v", got, want)
	}
}

// ---------------------------------------------------------------------------
// Sections.

func TestDiffSectionGuard(t *testing.T) {
	beA := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	prev := basePlan(withBackends(beA))
	commented, bodied := beA, beA
	commented.Comments = []string{"owned by team a"}
	bodied.Body = []string{"http-request deny"}
	for _, tc := range []struct {
		name   string
		next   *Plan
		reason string // "" = file_only
	}{
		{"comment change is written without ops", basePlan(withBackends(commented)), ""},
		{"body change reloads", basePlan(withBackends(bodied)), "be-a: body changed"},
		{"text the record does not explain reloads",
			setSectionText(basePlan(withBackends(beA)), SectionKindBackend, "be-a", "backend be-a\n  # reordered\n"),
			"be-a: unexplained text change"},
		{"core section change reloads", basePlan(withBackends(beA), withCore("global", "global\n  maxconn 10\n")), "core section global changed"},
		{"core section added reloads", basePlan(withBackends(beA), withCore("frontend#1", "frontend http-in\n")), "core section frontend#1 added"},
		{"core section removed reloads", basePlan(withBackends(beA), withoutCore("global")), "core section global removed"},
		{"profile added reloads", basePlan(withBackends(beA), withProfile("haptic-be-2", "body-2")), "profile haptic-be-2 added"},
		{"profile body change reloads", basePlan(withBackends(beA), withProfile("haptic-be", "body-2")), "profile haptic-be changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Diff(tc.next, baseOf(prev))
			if len(d.Ops) != 0 {
				t.Fatalf("ops %v", opKindsOf(d.Ops))
			}
			if tc.reason == "" {
				wantVerdict(t, d, VerdictFileOnly)
				return
			}
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason)
		})
	}
}

func TestDiffWithoutBaselineReloads(t *testing.T) {
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	for _, base := range []*Baseline{nil, {Caps: on34}} {
		d := Diff(next, base)
		wantVerdict(t, d, VerdictReload)
		wantReasonsExactly(t, d, "no baseline")
		if !reflect.DeepEqual(d.Files, ManifestFiles(next)) {
			t.Fatalf("Files = %v, want every next file", d.Files)
		}
	}
}

func TestDiffForeignSchemaVersionReloads(t *testing.T) {
	prev := basePlan(withSchema(PlanSchemaVersion + 1))
	d := Diff(basePlan(), baseOf(prev))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "baseline plan schema")
}

func TestDiffBackendSectionWithoutRecordReloads(t *testing.T) {
	d := Diff(basePlan(withRawSection(SectionKindBackend, "ghost", "backend ghost\n")), baseOf(basePlan()))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "ghost: section without a record")
}

func TestDiffConfigChangeWithoutSectionChangeReloads(t *testing.T) {
	prev := basePlan()
	next := basePlan()
	next.Files[0] = fileOf(ConfigFilePath, FileKindConfig, "global\n  # edited by hand\n")
	next.Files[0].ReloadOnChange = true
	next.ComputeID()
	d := Diff(next, baseOf(prev))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "haproxy.cfg changed with no section explaining it")
}

func TestDiffProfileGarbageCollection(t *testing.T) {
	user := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	user.Profile = "gone"
	structural := structuralBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	structural.Profile = "gone"
	for _, tc := range []struct {
		name       string
		prev, next *Plan
		caps       Caps
		reason     string // "" = runtime with a backend_del
	}{
		{"its last dynamic backend is deleted at runtime",
			basePlan(withProfile("gone", "g"), withBackends(user)), basePlan(), on34, ""},
		{"a backend still uses it",
			basePlan(withProfile("gone", "g"), withBackends(user)), basePlan(withBackends(user)), on34,
			"profile gone removed but backend be-a still uses it"},
		{"its structural backend is removed",
			basePlan(withProfile("gone", "g"), withBackends(structural)), basePlan(), on34,
			"profile gone removed but backend be-a is not deleted at runtime"},
		{"on 3.3 its backend cannot be deleted",
			basePlan(withProfile("gone", "g"), withBackends(user)), basePlan(), on33,
			"profile gone removed but backend be-a is not deleted at runtime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := baseOf(tc.prev)
			base.Caps = tc.caps
			d := Diff(tc.next, base)
			if tc.reason == "" {
				wantVerdict(t, d, VerdictRuntime)
				if !slices.Contains(opKindsOf(d.Ops), OpBackendDel) {
					t.Fatalf("ops %v lack backend_del", opKindsOf(d.Ops))
				}
				return
			}
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason)
		})
	}
}
