// Table tests for Diff and its wire helpers (CapsFor, ManifestFiles,
// InventoryOf) on the fixtures below; basePlan derives every digest from
// content, so equality stays decidable after a plan-blob round trip. Beside
// it: deployplan_manifest_test.go, deployplan_properties_test.go.

package haptic

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ---------------------------------------------------------------------------
// Fixtures: basePlan and its options, backend and server records, the
// capabilities of two HAProxy versions, and the paths the tests share.

const (
	routeMap = "maps/route-backend.map"
	certPath = "certs/tls.pem"
	caPath   = "ca/bundle.pem"
	listPath = "certs/default.crt-list"
)

var (
	on34 = CapsFor("3.4.3", ComposedOps())
	on33 = CapsFor("3.3.13", ComposedOps())
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
		p.Sections = append(p.Sections, sectionOf(SectionKindCore, c.Name, c.Text))
	}
	for _, name := range sortedNames(b.profiles) {
		body := b.profiles[name]
		p.Sections = append(p.Sections, sectionOf(SectionKindProfile, name, "defaults "+name+"\n  "+body+"\n"))
		p.Profiles[name] = Profile{Name: name, BodyDigest: DigestString(body)}
	}
	for _, name := range sortedNames(b.backends) {
		be, text := derivedBackend(b.backends[name])
		p.Sections = append(p.Sections, sectionOf(SectionKindBackend, name, text))
		p.Backends[name] = be
	}
	p.Sections = append(p.Sections, b.raw...)
	for _, name := range sortedNames(b.maps) {
		m := b.maps[name]
		var content strings.Builder
		for _, e := range m.Entries {
			content.WriteString(e.Key + " " + e.Value + "\n")
		}
		p.Maps[name] = m
		p.Files = append(p.Files, planFileOf(name, FileKindMap, content.String()))
	}
	if len(b.crtLists) > 0 {
		p.CRTLists = map[string]CRTList{}
	}
	for _, name := range sortedNames(b.crtLists) {
		l := b.crtLists[name]
		js, _ := json.Marshal(l)
		p.CRTLists[name] = l
		p.Files = append(p.Files, planFileOf(name, FileKindCRTList, string(js)))
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
	config := planFileOf(ConfigFilePath, FileKindConfig, cfg.String())
	config.ReloadOnChange = true
	if i := slices.IndexFunc(p.Files, func(f PlanFile) bool { return f.Kind == FileKindConfig }); i >= 0 {
		p.Files[i] = config
	} else {
		p.Files = append([]PlanFile{config}, p.Files...)
	}
	p.ComputeID()
	return p
}

func sortedNames[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sectionOf(kind, name, text string) Section {
	return Section{Kind: kind, Name: name, TextDigest: DigestString(text), Length: len(text), Text: text, TextKnown: true}
}

func planFileOf(path, kind, content string) PlanFile {
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
			p.Sections[i] = sectionOf(kind, name, text)
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
	return func(b *planBuilder) { b.raw = append(b.raw, sectionOf(kind, name, text)) }
}

func withMap(name string, ordered bool, entries ...MapEntry) planOpt {
	return func(b *planBuilder) { b.maps[name] = Map{Path: name, Ordered: ordered, Entries: entries} }
}

func withCRTList(path string, entries ...CRTListEntry) planOpt {
	return func(b *planBuilder) { b.crtLists[path] = CRTList{Path: path, Entries: entries} }
}

func withFile(path, kind, content string) planOpt {
	return func(b *planBuilder) { b.files = append(b.files, planFileOf(path, kind, content)) }
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

func weightPtr(v int) *int { return &v }

func weighted(s Server, w int) Server { s.Weight = weightPtr(w); return s }

func asDisabled(s Server) Server { s.Disabled = true; return s }

func withExtra(s Server, kws ...KeywordArg) Server { s.Extra = kws; return s }

func keyword(name string, args ...string) KeywordArg { return KeywordArg{Name: name, Args: args} }

// entries builds map entries from key, value pairs.
func mapEntries(kv ...string) []MapEntry {
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

func wantOpKinds(t *testing.T, ops []Op, want ...string) {
	t.Helper()
	if got := opKindsOf(ops); !slices.Equal(got, want) {
		t.Fatalf("op kinds = %v, want %v", got, want)
	}
}

func wantExactOps(t *testing.T, got []Op, want ...Op) {
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
			want := Caps{DynamicServers: tc.servers, ServerInitState: tc.initState, DynamicBackends: tc.backends,
				AgentOps: map[string]bool{OpMapSet: true}}
			if got := CapsFor(tc.version, []string{OpMapSet}); !reflect.DeepEqual(got, want) {
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
}

// An agent that advertises no op kind (agent_ops null, [] or absent) gets
// none composed for it: Diff reloads, and CheckSkew lists every kind as
// missing. The two read the same state the same way.
func TestAgentAdvertisingNoOpsGetsNoneComposed(t *testing.T) {
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a")...))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-b")...))
	for _, tc := range []struct {
		name string
		json string
	}{
		{"null", `{"api_version":1,"haproxy":{"version":"3.4.3"},"agent_ops":null}`},
		{"empty", `{"api_version":1,"haproxy":{"version":"3.4.3"},"agent_ops":[]}`},
		{"absent", `{"api_version":1,"haproxy":{"version":"3.4.3"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			if err := json.Unmarshal([]byte(tc.json), &st); err != nil {
				t.Fatal(err)
			}
			read, err := BaselineFromState(&st)
			if err != nil {
				t.Fatal(err)
			}
			base := withMapsLoaded(baseOf(prev), routeMap)
			base.Caps = read.Caps
			d := Diff(next, base)
			if d.Verdict != VerdictReload || len(d.Ops) != 0 || len(d.InPlace) != 0 {
				t.Fatalf("Diff = %s with ops %v, in place %v; want a reload composing nothing", d.Verdict, d.Ops, d.InPlace)
			}
			if _, missing := CheckSkew(&st); !slices.Equal(missing, ComposableOps()) {
				t.Fatalf("CheckSkew missing = %v, want every kind %v", missing, ComposableOps())
			}
			// The same change on an agent that lists map_add composes it.
			base.Caps = CapsFor(st.HAProxy.Version, []string{OpMapAdd})
			if d := Diff(next, base); d.Verdict != VerdictRuntime {
				t.Fatalf("with map_add advertised: %s %v", d.Verdict, d.Reasons)
			}
		})
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
			withMap(routeMap, false, mapEntries("a", "1", "b", "2")...),
			withFile(certPath, FileKindCert, "cert-before"), withFile(caPath, FileKindCA, "ca-before"),
			withCRTList(listPath, CRTListEntry{Cert: certPath}))
		next := basePlan(
			withBackends(dynBackend("be-new", srv("SRV_1", "10.0.0.2", 80)),
				dynBackend("be-keep", weighted(asDisabled(srv("SRV_1", "10.0.0.3", 80)), 5))),
			withMap(routeMap, false, mapEntries("a", "9", "c", "3")...),
			withFile(certPath, FileKindCert, "cert-after"), withFile(caPath, FileKindCA, "ca-after"),
			withCRTList(listPath, CRTListEntry{Cert: certPath}, CRTListEntry{Cert: "certs/other.pem"}))
		base := withMapsLoaded(baseOf(prev), routeMap)
		base.Inventory.CRTLists = []string{listPath}
		d := Diff(next, base)
		wantVerdict(t, d, VerdictRuntime)
		check(t, d)
	})
	t.Run("ordered map reordered", func(t *testing.T) {
		prev := basePlan(withMap(routeMap, true, mapEntries("a", "1", "b", "2")...))
		next := basePlan(withMap(routeMap, true, mapEntries("b", "2", "a", "1")...))
		d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
		wantOpKinds(t, d.Ops, OpMapReplace)
		check(t, d)
	})
	t.Run("in place", func(t *testing.T) {
		prev := basePlan(withBackends(dynBackend("be-keep", weighted(srv("SRV_1", "10.0.0.3", 80), 10))))
		next := basePlan(withBackends(dynBackend("be-keep", weighted(srv("SRV_1", "10.0.0.3", 80), 20))))
		base := baseOf(prev)
		base.WorkerOps, base.ReloadPending = prev, true
		d := Diff(next, base)
		wantOpKinds(t, d.InPlace, OpServerSetWeight)
		check(t, d)
	})
}

// ---------------------------------------------------------------------------
// Decision, control flow, batching.

func TestDiffOpOrder(t *testing.T) {
	prev := basePlan(
		withBackends(dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-keep", srv("SRV_1", "10.0.0.3", 80))),
		withMap(routeMap, false, mapEntries("keep", "be-keep", "old", "be-old")...),
		withFile(certPath, FileKindCert, "before"))
	next := basePlan(
		withBackends(dynBackend("be-new", srv("SRV_1", "10.0.0.2", 80)), dynBackend("be-keep", srv("SRV_1", "10.0.0.4", 80))),
		withMap(routeMap, false, mapEntries("keep", "be-keep", "new", "be-new")...),
		withFile(certPath, FileKindCert, "after"))
	base := withMapsLoaded(baseOf(prev), routeMap)
	base.Inventory.Certs = []string{certPath}
	d := Diff(next, base)
	wantVerdict(t, d, VerdictRuntime)
	wantOpKinds(t, d.Ops,
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
				if cap(c) != len(c) {
					t.Fatalf("a chunk of %d ops has capacity %d: an append would write into the next", len(c), cap(c))
				}
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
		withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-b", "c", "be-c")...),
		withMap("maps/other.map", false, mapEntries("x", "1", "y", "2")...))
	next := basePlan(
		withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80), srv("SRV_2", "10.0.0.3", 80)),
			dynBackend("be-b", weighted(srv("SRV_1", "10.0.0.5", 80), 3)), dynBackend("be-d", srv("SRV_1", "10.0.0.9", 80))),
		withMap(routeMap, false, mapEntries("a", "be-d", "c", "be-c", "d", "be-a")...),
		withMap("maps/other.map", false, mapEntries("x", "3", "z", "4")...))
	base := withMapsLoaded(baseOf(prev), routeMap, "maps/other.map")
	// Concurrently, on the same inputs: Diff is safe for concurrent use on
	// shared read-only plans, which -race checks here.
	decisions := make([]Decision, 4)
	var wg sync.WaitGroup
	for i := range decisions {
		wg.Go(func() { decisions[i] = Diff(next, base) })
	}
	wg.Wait()
	wantVerdict(t, decisions[0], VerdictRuntime)
	for _, d := range decisions[1:] {
		if !reflect.DeepEqual(decisions[0], d) {
			t.Fatalf("two diffs differ:\n%s\n%s", opsJSON(decisions[0].Ops), opsJSON(d.Ops))
		}
	}
}

func TestDiffOpsDoNotAliasThePlan(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 10))))
	next := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 20))))
	d := Diff(next, baseOf(prev))
	wantOpKinds(t, d.Ops, OpServerSetWeight)
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
		return sortedNames(m)
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
	next.Files[0] = planFileOf(ConfigFilePath, FileKindConfig, "global\n  # edited by hand\n")
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

// ---------------------------------------------------------------------------
// Backends.

func TestDiffBackendAdded(t *testing.T) {
	server := srv("SRV_1", "10.0.0.1", 80)
	for _, tc := range []struct {
		name   string
		be     Backend
		caps   Caps
		inv    Inventory
		reason string // "" = runtime
	}{
		{name: "dynamic backend on 3.4", be: dynBackend("be-new", server), caps: on34},
		{name: "no add backend below 3.4", be: dynBackend("be-new", server), caps: on33,
			reason: "be-new added: this HAProxy has no add backend"},
		{name: "structural shape", be: structuralBackend("be-new", server), caps: on34,
			reason: "be-new added: structural shape, stick-table in the body"},
		{name: "profile is not in the running config", caps: on34,
			be:     func() Backend { b := dynBackend("be-new", server); b.Profile = "not-rendered-yet"; return b }(),
			reason: `be-new added: profile "not-rendered-yet" is not in the running config`},
		{name: "server keyword outside the add server set", caps: on34,
			be:     dynBackend("be-new", withExtra(server, keyword("resolvers", "dns"))),
			reason: "keyword resolvers cannot be set on a dynamic server"},
		{name: "ca-file the running worker has not loaded", caps: on34,
			be:     dynBackend("be-new", withExtra(server, keyword("ssl"), keyword("ca-file", caPath))),
			reason: "keyword ca-file cannot be set on a dynamic server"},
		{name: "ca-file in the runtime inventory", caps: on34, inv: Inventory{CAFiles: []string{caPath}},
			be: dynBackend("be-new", withExtra(server, keyword("ssl"), keyword("ca-file", caPath)))},
		{name: "balance that refuses dynamic servers", caps: on34,
			be:     func() Backend { b := dynBackend("be-new", server); b.Balance = "static-rr"; return b }(),
			reason: `balance "static-rr" takes no dynamic server`},
		{name: "unsafe guid", caps: on34,
			be:     func() Backend { b := dynBackend("be-new", server); b.GUID = "a b"; return b }(),
			reason: "the name, profile or guid is not a safe runtime token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := baseOf(basePlan())
			base.Caps, base.Inventory = tc.caps, tc.inv
			d := Diff(basePlan(withBackends(tc.be)), base)
			if tc.reason == "" {
				wantVerdict(t, d, VerdictRuntime)
				wantOpKinds(t, d.Ops, OpBackendAdd, OpServerAdd, OpServerEnable, OpBackendPublish)
				return
			}
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason)
		})
	}
}

func TestDiffBackendAddedOpSequence(t *testing.T) {
	be := dynBackend("be-new", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80))
	be.GUID = "be-new-guid"
	d := Diff(basePlan(withBackends(be)), baseOf(basePlan()))
	wantVerdict(t, d, VerdictRuntime)
	wantOpKinds(t, d.Ops, OpBackendAdd, OpServerAdd, OpServerEnable, OpServerAdd, OpServerEnable, OpBackendPublish)
	if want := (Op{Kind: OpBackendAdd, Backend: "be-new", Profile: "haptic-be", Mode: "http", GUID: "be-new-guid"}); !reflect.DeepEqual(d.Ops[0], want) {
		t.Fatalf("Ops[0] = %+v, want %+v", d.Ops[0], want)
	}
	if add := d.Ops[1]; add.Backend != "be-new" || add.Server != "SRV_1" || add.Address != "10.0.0.1" || add.Port != 80 || len(add.Keywords) != 0 {
		t.Fatalf("Ops[1] = %+v", add)
	}
	if d.Chunks != 1 || d.Mode != ModeAuto {
		t.Fatalf("Chunks %d, Mode %s", d.Chunks, d.Mode)
	}
}

func TestDiffBackendRemoved(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80))))
	d := Diff(basePlan(), baseOf(prev))
	wantVerdict(t, d, VerdictRuntime)
	wantExactOps(t, d.Ops,
		Op{Kind: OpBackendUnpublish, Backend: "be-old"},
		Op{Kind: OpServerDisable, Backend: "be-old", Server: "SRV_1"},
		Op{Kind: OpServerWaitRemovable, Backend: "be-old", Server: "SRV_1", TimeoutMs: 2000},
		Op{Kind: OpServerDel, Backend: "be-old", Server: "SRV_1"},
		Op{Kind: OpBackendWaitRemovable, Backend: "be-old", TimeoutMs: 2000},
		Op{Kind: OpBackendDel, Backend: "be-old"})
}

func TestDiffBackendRemovedRefusals(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		be                      Backend
		caps                    Caps
		pendingSrv, pendingBack int
		reason                  string
	}{
		{"no del backend on 3.3", dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), on33, 0, 0,
			"be-old removed: this HAProxy has no del backend"},
		{"structural", structuralBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), on34, 0, 0,
			"be-old removed: structural shape, stick-table in the body"},
		{"backend deletes at the cap", dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), on34, 0, 100,
			"be-old removed: 100 backend deletes already pending"},
		{"server deletes at the cap", dynBackend("be-old", srv("SRV_1", "10.0.0.1", 80)), on34, 1000, 0,
			"1000 server deletes already pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := baseOf(basePlan(withBackends(tc.be)))
			base.Caps, base.PendingServerDeletes, base.PendingBackendDeletes = tc.caps, tc.pendingSrv, tc.pendingBack
			d := Diff(basePlan(), base)
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason)
		})
	}
}

// A refused backend removal gives back the server deletes it counted, so
// that the next removal is judged against the pod's real queue.
func TestDiffBackendRemovalRefusedCountsNoServerDelete(t *testing.T) {
	base := baseOf(basePlan(withBackends(
		dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80)),
		dynBackend("be-b", srv("SRV_1", "10.0.0.3", 80)))))
	base.Caps, base.PendingServerDeletes = on34, MaxPendingServerDeletes-1
	d := Diff(basePlan(), base)
	wantVerdict(t, d, VerdictReload)
	wantReasonsExactly(t, d, fmt.Sprintf("backend be-a removed: %d server deletes already pending", MaxPendingServerDeletes))
}

func TestDiffBackendAttributeChanges(t *testing.T) {
	beA := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	prev := basePlan(withProfile("haptic-be-2", "body-2"), withBackends(beA))
	for _, tc := range []struct {
		name   string
		change func(*Backend)
		reason string
	}{
		{"profile", func(b *Backend) { b.Profile = "haptic-be-2" }, "be-a: profile changed"},
		{"mode", func(b *Backend) { b.Mode = "tcp" }, "be-a: mode changed"},
		{"guid", func(b *Backend) { b.GUID = "be-a-guid" }, "be-a: guid changed"},
		{"balance", func(b *Backend) { b.Balance = "leastconn" }, "be-a: balance changed"},
		{"hash-type", func(b *Backend) { b.HashType = "consistent" }, "be-a: hash-type changed"},
		{"shape", func(b *Backend) { b.Shape = ShapeStructural }, "be-a: shape changed"},
		{"default-server", func(b *Backend) { b.DefaultServer = []KeywordArg{keyword("maxconn", "100")} }, "be-a: default-server changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
			tc.change(&be)
			d := Diff(basePlan(withProfile("haptic-be-2", "body-2"), withBackends(be)), baseOf(prev))
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason+", which HAProxy cannot alter at runtime")
		})
	}
}

// ---------------------------------------------------------------------------
// Servers.

// serverDiff diffs be-a holding prev against be-a holding next.
func serverDiff(prev, next Backend, base func(*Baseline)) Decision {
	b := baseOf(basePlan(withBackends(prev)))
	if base != nil {
		base(b)
	}
	return Diff(basePlan(withBackends(next)), b)
}

func TestDiffServerValueChanges(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev, next Server
		kinds      []string
		reason     string
	}{
		{"weight 10 to 20", weighted(srv("SRV_1", "10.0.0.1", 80), 10), weighted(srv("SRV_1", "10.0.0.1", 80), 20),
			[]string{OpServerSetWeight}, ""},
		{"address and port", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "10.0.0.2", 8080), []string{OpServerSetAddr}, ""},
		{"disabled", srv("SRV_1", "10.0.0.1", 80), asDisabled(srv("SRV_1", "10.0.0.1", 80)), []string{OpServerSetState}, ""},
		{"enabled again", asDisabled(srv("SRV_1", "10.0.0.1", 80)), srv("SRV_1", "10.0.0.1", 80), []string{OpServerEnable}, ""},
		{"nothing changed", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "10.0.0.1", 80), nil, ""},
		{"maxconn added", srv("SRV_1", "10.0.0.1", 80), withExtra(srv("SRV_1", "10.0.0.1", 80), keyword("maxconn", "10")), nil,
			"keywords changed"},
		{"weight dropped", weighted(srv("SRV_1", "10.0.0.1", 80), 10), srv("SRV_1", "10.0.0.1", 80), nil,
			"weight keyword was dropped"},
		{"hostname address", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "web.internal", 80), nil, "is not an IP"},
		{"the highest port", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "10.0.0.1", 65535), []string{OpServerSetAddr}, ""},
		{"port 65536", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "10.0.0.1", 65536), nil, "the port is outside 1-65535"},
		{"port 0", srv("SRV_1", "10.0.0.1", 80), srv("SRV_1", "10.0.0.1", 0), nil, "the port is outside 1-65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := serverDiff(dynBackend("be-a", tc.prev), dynBackend("be-a", tc.next), nil)
			switch {
			case tc.reason != "":
				wantVerdict(t, d, VerdictReload)
				wantReason(t, d, tc.reason)
			case tc.kinds == nil:
				wantVerdict(t, d, VerdictFileOnly)
			default:
				wantVerdict(t, d, VerdictRuntime)
				wantOpKinds(t, d.Ops, tc.kinds...)
			}
		})
	}
}

func TestDiffServerWeightZeroIsSent(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 0)), nil)
	wantVerdict(t, d, VerdictRuntime)
	wantOpKinds(t, d.Ops, OpServerSetWeight)
	if d.Ops[0].Weight == nil || *d.Ops[0].Weight != 0 {
		t.Fatalf("Weight = %v, want a pointer to 0", d.Ops[0].Weight)
	}
	if js := opsJSON(d.Ops); !strings.Contains(js, `"weight":0`) {
		t.Fatalf("the op marshals as %s, without \"weight\":0", js)
	}
}

func TestDiffServerDisabledGoesToMaint(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-a", asDisabled(srv("SRV_1", "10.0.0.1", 80))), nil)
	wantExactOps(t, d.Ops, Op{Kind: OpServerSetState, Backend: "be-a", Server: "SRV_1", State: "maint"})
}

func TestDiffServerLeavingMaintEnablesItsHealthCheck(t *testing.T) {
	plain := srv("SRV_1", "10.0.0.1", 80)
	checked := withExtra(plain, keyword("check"))
	withDefaultCheck := func(s Server) Backend {
		b := dynBackend("be-a", s)
		b.DefaultServer = []KeywordArg{keyword("check")}
		return b
	}
	for _, tc := range []struct {
		name       string
		prev, next Backend
		health     bool
	}{
		{"without check", dynBackend("be-a", asDisabled(plain)), dynBackend("be-a", plain), false},
		{"with the server's own check", dynBackend("be-a", asDisabled(checked)), dynBackend("be-a", checked), true},
		{"with check only in default-server", withDefaultCheck(asDisabled(plain)), withDefaultCheck(plain), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := serverDiff(tc.prev, tc.next, nil)
			wantVerdict(t, d, VerdictRuntime)
			wantExactOps(t, d.Ops, Op{Kind: OpServerEnable, Backend: "be-a", Server: "SRV_1", Health: tc.health})
		})
	}
}

func TestDiffServerAdded(t *testing.T) {
	srv1 := srv("SRV_1", "10.0.0.1", 80)
	plain := srv("SRV_2", "10.0.0.2", 80)
	checked := withExtra(plain, keyword("check"), keyword("inter", "2s"))
	checked.GUID = "srv-2-guid"
	balanced := func(balance, hashType string, servers ...Server) Backend {
		b := dynBackend("be-a", servers...)
		b.Balance, b.HashType = balance, hashType
		return b
	}
	for _, tc := range []struct {
		name       string
		prev, next Backend
		version    string
		kinds      []string
		keywords   []KeywordArg
		reason     string
	}{
		{name: "plain on 3.4.3", version: "3.4.3", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, plain),
			kinds: []string{OpServerAdd, OpServerEnable}},
		{name: "checked on 3.4.3", version: "3.4.3", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, checked),
			kinds:    []string{OpServerAdd, OpServerEnable},
			keywords: []KeywordArg{keyword("check"), keyword("inter", "2s"), keyword("guid", "srv-2-guid"), keyword("init-state", "up")}},
		{name: "checked on 3.0.26", version: "3.0.26", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, checked),
			kinds:    []string{OpServerAdd, OpServerEnable},
			keywords: []KeywordArg{keyword("check"), keyword("inter", "2s"), keyword("guid", "srv-2-guid")}},
		{name: "disabled", version: "3.4.3", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, asDisabled(plain)),
			kinds: []string{OpServerAdd}},
		{name: "static-rr", version: "3.4.3", prev: balanced("static-rr", "", srv1), next: balanced("static-rr", "", srv1, plain),
			reason: `balance "static-rr" takes no dynamic server`},
		{name: "hdr(Host)", version: "3.4.3", prev: balanced("hdr(Host)", "", srv1), next: balanced("hdr(Host)", "", srv1, plain),
			reason: `balance "hdr(Host)" takes no dynamic server`},
		{name: "hdr(Host) with consistent hashing", version: "3.4.3",
			prev: balanced("hdr(Host)", "consistent", srv1), next: balanced("hdr(Host)", "consistent", srv1, plain),
			kinds: []string{OpServerAdd, OpServerEnable}},
		{name: "2.9.0", version: "2.9.0", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, plain),
			reason: "this HAProxy has no add server"},
		{name: "port 0", version: "3.4.3", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, srv("SRV_2", "10.0.0.2", 0)),
			reason: "the port is outside 1-65535"},
		{name: "port 65536", version: "3.4.3", prev: dynBackend("be-a", srv1), next: dynBackend("be-a", srv1, srv("SRV_2", "10.0.0.2", 65536)),
			reason: "the port is outside 1-65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := serverDiff(tc.prev, tc.next, func(b *Baseline) { b.Caps = CapsFor(tc.version, ComposedOps()) })
			if tc.reason != "" {
				wantVerdict(t, d, VerdictReload)
				wantReason(t, d, tc.reason)
				return
			}
			wantVerdict(t, d, VerdictRuntime)
			wantOpKinds(t, d.Ops, tc.kinds...)
			add := d.Ops[0]
			if add.Backend != "be-a" || add.Server != "SRV_2" || add.Address != "10.0.0.2" || add.Port != 80 {
				t.Fatalf("server_add = %+v", add)
			}
			if tc.keywords != nil {
				if !reflect.DeepEqual(add.Keywords, tc.keywords) {
					t.Fatalf("keywords = %v, want %v", add.Keywords, tc.keywords)
				}
				if !d.Ops[1].Health {
					t.Fatal("server_enable of a checked server has Health false")
				}
			}
		})
	}
}

func TestDiffServerAddedMergesDefaultServer(t *testing.T) {
	prev := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	prev.DefaultServer = []KeywordArg{keyword("check"), keyword("maxconn", "10")}
	next := prev
	next.Servers = []Server{srv("SRV_1", "10.0.0.1", 80), withExtra(srv("SRV_2", "10.0.0.2", 80), keyword("maxconn", "50"))}
	d := serverDiff(prev, next, nil)
	wantOpKinds(t, d.Ops, OpServerAdd, OpServerEnable)
	if want := []KeywordArg{keyword("check"), keyword("maxconn", "50"), keyword("init-state", "up")}; !reflect.DeepEqual(d.Ops[0].Keywords, want) {
		t.Fatalf("keywords = %v, want %v", d.Ops[0].Keywords, want)
	}
}

func TestDiffServerCrtResolvesUnderTheCertDirectory(t *testing.T) {
	srv1 := srv("SRV_1", "10.0.0.1", 80)
	for _, tc := range []struct {
		name, crt string
		reason    string
	}{
		{"a loaded certificate by its bare name", "tls.pem", ""},
		{"a certificate that is not loaded", "other.pem", "keyword crt cannot be set on a dynamic server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prev := basePlan(withFile(certPath, FileKindCert, "pem"), withBackends(dynBackend("be-a", srv1)))
			next := basePlan(withFile(certPath, FileKindCert, "pem"),
				withBackends(dynBackend("be-a", srv1, withExtra(srv("SRV_2", "10.0.0.2", 443), keyword("ssl"), keyword("crt", tc.crt)))))
			base := baseOf(prev)
			base.Inventory.Certs = []string{certPath}
			d := Diff(next, base)
			if tc.reason != "" {
				wantVerdict(t, d, VerdictReload)
				wantReason(t, d, tc.reason)
				return
			}
			wantVerdict(t, d, VerdictRuntime)
			wantOpKinds(t, d.Ops, OpServerAdd, OpServerEnable)
			if want := []KeywordArg{keyword("ssl"), keyword("crt", "tls.pem")}; !reflect.DeepEqual(d.Ops[0].Keywords, want) {
				t.Fatalf("keywords = %v, want %v (sent as written)", d.Ops[0].Keywords, want)
			}
		})
	}
}

func TestDiffServerRemoved(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80)),
		dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), nil)
	wantVerdict(t, d, VerdictRuntime)
	wantOpKinds(t, d.Ops, OpServerDisable, OpServerWaitRemovable, OpServerDel)
	if d.Ops[0].Server != "SRV_2" {
		t.Fatalf("Ops[0].Server = %s, want SRV_2", d.Ops[0].Server)
	}
}

func TestDiffServerRemovedAtPendingCap(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80)),
		dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), func(b *Baseline) { b.PendingServerDeletes = 1000 })
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "1000 server deletes already pending")
}

func TestDiffServerDeletesCrossTheCapMidDiff(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80), srv("SRV_3", "10.0.0.3", 80)),
		dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), func(b *Baseline) { b.PendingServerDeletes = 999 })
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "1000 server deletes already pending")
}

func TestDiffBackendDeletesCrossTheCapMidDiff(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-old-1", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-old-2", srv("SRV_1", "10.0.0.2", 80))))
	base := baseOf(prev)
	base.PendingBackendDeletes = 99
	d := Diff(basePlan(), base)
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "100 backend deletes already pending")
}

func TestDiffServerNameMustBeASafeToken(t *testing.T) {
	d := serverDiff(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)),
		dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV;2", "10.0.0.2", 80)), nil)
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "not a safe runtime token")
}

// ---------------------------------------------------------------------------
// Maps.

func mapAddOp(path, key, value string) Op {
	return Op{Kind: OpMapAdd, Path: path, Key: key, Value: value}
}
func mapSetOp(path, key, value string) Op {
	return Op{Kind: OpMapSet, Path: path, Key: key, Value: value}
}
func mapDelOp(path, key string) Op { return Op{Kind: OpMapDel, Path: path, Key: key} }
func mapReplaceOp(path string) Op  { return Op{Kind: OpMapReplace, Path: path} }

// mapCase is one row of the map tables: the route map's entries before and
// after, and the exact ops (none = file_only).
type mapCase struct {
	name       string
	prev, next []MapEntry
	ops        []Op
}

func runMapCases(t *testing.T, ordered bool, cases []mapCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prev := basePlan(withMap(routeMap, ordered, tc.prev...))
			next := basePlan(withMap(routeMap, ordered, tc.next...))
			d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
			if len(tc.ops) == 0 {
				wantVerdict(t, d, VerdictFileOnly)
				return
			}
			wantVerdict(t, d, VerdictRuntime)
			wantExactOps(t, d.Ops, tc.ops...)
		})
	}
}

func TestDiffUnorderedMap(t *testing.T) {
	ab := mapEntries("a.example.com", "be-a", "b.example.com", "be-b")
	a := mapEntries("a.example.com", "be-a")
	runMapCases(t, false, []mapCase{
		{"new key", a, ab, []Op{mapAddOp(routeMap, "b.example.com", "be-b")}},
		{"single value change is set in place", a, mapEntries("a.example.com", "be-z"), []Op{mapSetOp(routeMap, "a.example.com", "be-z")}},
		{"removed key", ab, a, []Op{mapDelOp(routeMap, "b.example.com")}},
		{"a value the line form would mangle", a, mapEntries("a.example.com", "301|https|example.com; x"), []Op{mapReplaceOp(routeMap)}},
		{"a multiset change", a, mapEntries("a.example.com", "be-a", "a.example.com", "be-b"), []Op{mapReplaceOp(routeMap)}},
		{"a same-count change of a multi-valued key", mapEntries("a.example.com", "be-a", "a.example.com", "be-b"),
			mapEntries("a.example.com", "be-a", "a.example.com", "be-c"), []Op{mapReplaceOp(routeMap)}},
		{"reordered values of one key", mapEntries("a.example.com", "be-a", "a.example.com", "be-b"),
			mapEntries("a.example.com", "be-b", "a.example.com", "be-a"), []Op{mapReplaceOp(routeMap)}},
		{"reordering alone is not a change", ab, mapEntries("b.example.com", "be-b", "a.example.com", "be-a"), nil},
		{"a key no line-form command can name replaces the map", a, mapEntries("a.example.com", "be-a", "/api;v1", "be-b"), []Op{mapReplaceOp(routeMap)}},
		{"an angle bracket in a key replaces the map", a, mapEntries("a.example.com", "be-a", "/a>b", "be-b"), []Op{mapReplaceOp(routeMap)}},
		{"a new key the agent would refuse replaces the map", a, mapEntries("a.example.com", "be-a", "z;v1", "be-b"), []Op{mapReplaceOp(routeMap)}},
		{"an emptied value", a, mapEntries("a.example.com", ""), []Op{mapReplaceOp(routeMap)}},
		{"an angle bracket in a value", a, mapEntries("a.example.com", "x>y"), []Op{mapReplaceOp(routeMap)}},
		{"a value that spans lines replaces the map", a, mapEntries("a.example.com", "be-a\nbe-b"), []Op{mapReplaceOp(routeMap)}},
		{"a new key with a spaced value takes the payload form", a, mapEntries("a.example.com", "be-a", "c", "301 https://x"),
			[]Op{mapAddOp(routeMap, "c", "301 https://x")}},
		{"a replacement swallows the map's other ops", ab, mapEntries("a.example.com", "x y"), []Op{mapReplaceOp(routeMap)}},
	})
}

func TestDiffOrderedMap(t *testing.T) {
	runMapCases(t, true, []mapCase{
		{"append sorts after every existing key", mapEntries("a", "1", "b", "2"), mapEntries("a", "1", "b", "2", "c", "3"),
			[]Op{mapAddOp(routeMap, "c", "3")}},
		{"an insertion in the middle replaces the map", mapEntries("a", "1", "b", "2"), mapEntries("a", "1", "ab", "9", "b", "2"),
			[]Op{mapReplaceOp(routeMap)}},
		{"a new first entry replaces the map, however it sorts", mapEntries("a", "1", "b", "2"), mapEntries("z", "0", "a", "1", "b", "2"),
			[]Op{mapReplaceOp(routeMap)}},
		{"appended keys are judged by file position, not by sort order", mapEntries("m", "1"), mapEntries("m", "1", "z", "2", "b", "3"),
			[]Op{mapAddOp(routeMap, "z", "2"), mapAddOp(routeMap, "b", "3")}},
		{"an append after a middle insertion replaces the map", mapEntries("m", "1"), mapEntries("z", "0", "m", "1", "n", "2"),
			[]Op{mapReplaceOp(routeMap)}},
		{"an in-place value change keeps its position", mapEntries("a", "1", "b", "2", "c", "3"), mapEntries("a", "1", "b", "9", "c", "3"),
			[]Op{mapSetOp(routeMap, "b", "9")}},
		{"a delete keeps the order of the rest", mapEntries("a", "1", "b", "2", "c", "3"), mapEntries("a", "1", "c", "3"),
			[]Op{mapDelOp(routeMap, "b")}},
		{"reordering replaces the map", mapEntries("a", "1", "b", "2"), mapEntries("b", "2", "a", "1"), []Op{mapReplaceOp(routeMap)}},
		{"a value the line form would mangle replaces the map", mapEntries("a", "1"), mapEntries("a", "1 2"), []Op{mapReplaceOp(routeMap)}},
		{"an appended key the agent would refuse replaces the map", mapEntries("a", "1"), mapEntries("a", "1", "b;c", "2"),
			[]Op{mapReplaceOp(routeMap)}},
	})
}

func TestDiffMapNotLoadedIsWrittenOnly(t *testing.T) {
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a")...))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-b")...))
	d := Diff(next, baseOf(prev))
	wantVerdict(t, d, VerdictFileOnly)
	wantReason(t, d, "is not loaded at runtime, its file is written only")
}

func TestDiffMapPathMustBeASafeToken(t *testing.T) {
	const unsafePath = "maps/route backend.map"
	prev := basePlan(withMap(unsafePath, false, mapEntries("a", "be-a")...))
	next := basePlan(withMap(unsafePath, false, mapEntries("a", "be-b")...))
	d := Diff(next, withMapsLoaded(baseOf(prev), unsafePath))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "the path is not a safe runtime token")
}

func TestDiffMapShortCircuitsOnExactFileContent(t *testing.T) {
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a")...))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-b")...))
	i := slices.IndexFunc(next.Files, func(f PlanFile) bool { return f.Path == routeMap })
	next.Files[i] = prev.Files[i]
	next = finishPlan(next)
	d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
	wantVerdict(t, d, VerdictFileOnly)
	wantOpKinds(t, d.Ops)
}

func TestDiffMapDeclaredReloadOnChangeReloads(t *testing.T) {
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a")...), withReloadOnChange(routeMap))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-b")...), withReloadOnChange(routeMap))
	d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "is declared reload-on-change")
}

func TestDiffNewLoadedMapIsAddedEntryByEntry(t *testing.T) {
	next := basePlan(withMap(routeMap, false, mapEntries("c", "be-c", "a", "be-a", "b", "be-b")...))
	d := Diff(next, withMapsLoaded(baseOf(basePlan()), routeMap))
	wantVerdict(t, d, VerdictRuntime)
	wantExactOps(t, d.Ops, mapAddOp(routeMap, "c", "be-c"), mapAddOp(routeMap, "a", "be-a"), mapAddOp(routeMap, "b", "be-b"))
}

func TestMapValueReplacementNeverRemovesAuthenticationBetweenCommands(t *testing.T) {
	const authMap = "maps/authentication.map"
	prev := basePlan(withMap(authMap, false, mapEntries("protected", "require old-key")...))
	next := basePlan(withMap(authMap, false, mapEntries("protected", "require new-key")...))
	d := Diff(next, withMapsLoaded(baseOf(prev), authMap))
	wantVerdict(t, d, VerdictRuntime)
	wantExactOps(t, d.Ops, mapReplaceOp(authMap))
}

// TestMapOpsWindowMatchesTheFullCompare: for both kinds of map, the delta
// of the windows between the common prefix and suffix is the delta of the
// whole lists; for an ordered map also when a key is appended (allowed only
// when no key of the suffix is kept after the window).
func TestMapOpsWindowMatchesTheFullCompare(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	values := []string{"v0", "v1", "v2", "v 3", ""}
	randomEntry := func() MapEntry {
		return MapEntry{Key: keys[rng.IntN(len(keys))], Value: values[rng.IntN(len(values))]}
	}
	full := func(ordered bool, prev, next []MapEntry) ([]Op, []Op) {
		if ordered {
			return orderedMapDelta(routeMap, prev, next, func() bool { return false })
		}
		return keyedMapDelta(routeMap, groupEntries(prev), groupEntries(next), 0)
	}
	trimmed, appended, appendRefused := 0, 0, 0
	for i := range 6000 {
		prev := make([]MapEntry, rng.IntN(10))
		for j := range prev {
			prev[j] = randomEntry()
		}
		next := slices.Clone(prev)
		for range 1 + rng.IntN(3) {
			switch op := rng.IntN(3); {
			case op == 0 && len(next) > 0:
				j := rng.IntN(len(next))
				next = slices.Delete(next, j, j+1)
			case op == 1 && len(next) > 0:
				next[rng.IntN(len(next))].Value = values[rng.IntN(len(values))]
			case len(next) < 10:
				j := rng.IntN(len(next) + 1)
				next = slices.Insert(next, j, randomEntry())
			}
		}
		ordered := i%2 == 1
		fullUp, fullDel := full(ordered, prev, next)
		gotUp, gotDel := mapDelta(routeMap, ordered, prev, next)
		if !reflect.DeepEqual(fullUp, gotUp) || !reflect.DeepEqual(fullDel, gotDel) {
			t.Fatalf("case %d (ordered %v): %v -> %v\nwindowed %s %s\nfull     %s %s", i, ordered, prev, next,
				opsJSON(gotUp), opsJSON(gotDel), opsJSON(fullUp), opsJSON(fullDel))
		}
		prefix, suffix, ok := trimCommonEntries(prev, next)
		switch {
		case !ok || prefix+suffix == 0:
		case !ordered:
			trimmed++
		case suffix > 0 && slices.ContainsFunc(fullUp, func(op Op) bool { return op.Kind == OpMapAdd }):
			appended++ // before a suffix of keys the prefix already has
		case suffix > 0 && len(fullUp) == 1 && fullUp[0].Kind == OpMapReplace:
			appendRefused++
		}
	}
	if trimmed == 0 || appended == 0 || appendRefused == 0 {
		t.Fatalf("%d unordered cases trimmed, %d ordered appends and %d replaces with a trimmed suffix: the test does not exercise the window",
			trimmed, appended, appendRefused)
	}
}

func TestTrimCommonEntriesRefusesAKeySharedWithTheTrimmedPart(t *testing.T) {
	if _, _, ok := trimCommonEntries(mapEntries("k", "1", "k", "2", "z", "1"), mapEntries("k", "1", "z", "1")); ok {
		t.Fatal("[k1,k2,z1] vs [k1,z1] was trimmed although k occurs in the trimmed prefix")
	}
	prefix, suffix, ok := trimCommonEntries(mapEntries("a", "1", "b", "1", "z", "1"), mapEntries("a", "1", "b", "2", "z", "1"))
	if !ok || prefix != 1 || suffix != 1 {
		t.Fatalf("[a1,b1,z1] vs [a1,b2,z1] gives prefix %d, suffix %d, %v; want 1, 1", prefix, suffix, ok)
	}
}

// ---------------------------------------------------------------------------
// Certificates and crt-lists.

func TestDiffCertificates(t *testing.T) {
	for _, tc := range []struct {
		name       string
		path, kind string
		inPrev     bool
		inv        Inventory
		op         Op
	}{
		{"known cert", certPath, FileKindCert, true, Inventory{Certs: []string{certPath}}, Op{Kind: OpCertSet, Path: certPath}},
		{"new cert", certPath, FileKindCert, false, Inventory{}, Op{Kind: OpCertNew, Path: certPath}},
		{"known CA", caPath, FileKindCA, true, Inventory{CAFiles: []string{caPath}}, Op{Kind: OpCASet, Path: caPath}},
		{"new CA", caPath, FileKindCA, false, Inventory{}, Op{Kind: OpCANew, Path: caPath}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prev := basePlan()
			if tc.inPrev {
				prev = basePlan(withFile(tc.path, tc.kind, "before"))
			}
			base := baseOf(prev)
			base.Inventory = tc.inv
			d := Diff(basePlan(withFile(tc.path, tc.kind, "after")), base)
			wantVerdict(t, d, VerdictRuntime)
			wantExactOps(t, d.Ops, tc.op)
		})
	}
}

func TestDiffUnchangedCertificateIsNotTouched(t *testing.T) {
	p := basePlan(withFile(certPath, FileKindCert, "pem"), withFile(caPath, FileKindCA, "ca"))
	base := baseOf(p)
	base.Inventory = Inventory{Certs: []string{certPath}, CAFiles: []string{caPath}}
	d := Diff(basePlan(withFile(certPath, FileKindCert, "pem"), withFile(caPath, FileKindCA, "ca")), base)
	wantVerdict(t, d, VerdictFileOnly)
	wantOpKinds(t, d.Ops)
}

func TestDiffCertPathMustBeASafeToken(t *testing.T) {
	const unsafeCert = "certs/a b.pem"
	prev := basePlan(withFile(unsafeCert, FileKindCert, "before"))
	d := Diff(basePlan(withFile(unsafeCert, FileKindCert, "after")), baseOf(prev))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "file certs/a b.pem is not a safe runtime token")
}

// crtListDiff diffs the loaded crt-list listPath from prev to next entries.
func crtListDiff(prev, next []CRTListEntry) Decision {
	base := baseOf(basePlan(withCRTList(listPath, prev...)))
	base.Inventory.CRTLists = []string{listPath}
	return Diff(basePlan(withCRTList(listPath, next...)), base)
}

func TestDiffCRTListEntries(t *testing.T) {
	tls := CRTListEntry{Cert: certPath, SNIFilters: []string{"a.example.com"}}
	other := CRTListEntry{Cert: "certs/other.pem", SNIFilters: []string{"b.example.com"}}
	alpn := tls
	alpn.Options = []KeywordArg{keyword("alpn", "h2,http/1.1")}
	for _, tc := range []struct {
		name       string
		prev, next []CRTListEntry
		ops        []Op
	}{
		{"entry added", []CRTListEntry{tls}, []CRTListEntry{tls, other},
			[]Op{{Kind: OpCRTListAdd, Path: listPath, Cert: "certs/other.pem", SNIFilters: []string{"b.example.com"}}}},
		{"entry removed", []CRTListEntry{tls, other}, []CRTListEntry{tls},
			[]Op{{Kind: OpCRTListDel, Path: listPath, Cert: "certs/other.pem"}}},
		{"options of the last entry changed", []CRTListEntry{tls}, []CRTListEntry{alpn},
			[]Op{{Kind: OpCRTListDel, Path: listPath, Cert: certPath},
				{Kind: OpCRTListAdd, Path: listPath, Cert: certPath, Options: []KeywordArg{keyword("alpn", "h2,http/1.1")}, SNIFilters: []string{"a.example.com"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := crtListDiff(tc.prev, tc.next)
			wantVerdict(t, d, VerdictRuntime)
			wantExactOps(t, d.Ops, tc.ops...)
		})
	}
}

func TestDiffCRTListOrderIsNotReachablePerEntry(t *testing.T) {
	tls := CRTListEntry{Cert: certPath, SNIFilters: []string{"a.example.com"}}
	other := CRTListEntry{Cert: "certs/other.pem", SNIFilters: []string{"b.example.com"}}
	alpn := tls
	alpn.Options = []KeywordArg{keyword("alpn", "h2")}
	prev := []CRTListEntry{tls, other}
	for _, tc := range []struct {
		name   string
		next   []CRTListEntry
		reason string
	}{
		{"a new default entry first", []CRTListEntry{{Cert: "certs/default.pem"}, tls, other}, "the entry order changed"},
		{"two entries swapped", []CRTListEntry{other, tls}, "the entry order changed"},
		{"options change on a non-last entry", []CRTListEntry{alpn, other}, "the entry order changed"},
		{"an unsafe certificate", []CRTListEntry{tls, other, {Cert: "certs/a;b.pem"}}, "is not a safe runtime token"},
		{"an unsafe SNI filter", []CRTListEntry{tls, other, {Cert: "certs/third.pem", SNIFilters: []string{"a b.example.com"}}},
			"is not a safe runtime token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := crtListDiff(prev, tc.next)
			wantVerdict(t, d, VerdictReload)
			wantReason(t, d, tc.reason)
		})
	}
	t.Run("a certificate on two lines of the running list", func(t *testing.T) {
		// Per-entry ops would leave the repeated line in place.
		d := crtListDiff([]CRTListEntry{tls, other, tls}, prev)
		wantVerdict(t, d, VerdictReload)
		wantReason(t, d, "the entry order changed")
	})
	t.Run("an append past every retained entry stays runtime", func(t *testing.T) {
		d := crtListDiff(prev, []CRTListEntry{tls, other, {Cert: "certs/third.pem"}})
		wantVerdict(t, d, VerdictRuntime)
		wantExactOps(t, d.Ops, Op{Kind: OpCRTListAdd, Path: listPath, Cert: "certs/third.pem"})
	})
}

func TestDiffCRTListFileAppearingOrDisappearingReloads(t *testing.T) {
	list := withCRTList(listPath, CRTListEntry{Cert: certPath})
	added := Diff(basePlan(list), baseOf(basePlan()))
	wantVerdict(t, added, VerdictReload)
	wantReason(t, added, "added, which only a reload puts into the config")
	removed := Diff(basePlan(), baseOf(basePlan(list)))
	wantVerdict(t, removed, VerdictReload)
	wantReason(t, removed, "removed, which only a reload takes out of the config")
}

func TestDiffCRTListWithoutEntriesReloads(t *testing.T) {
	prev := basePlan(withFile(listPath, FileKindCRTList, "certs/tls.pem\n"))
	next := basePlan(withFile(listPath, FileKindCRTList, "certs/tls.pem\ncerts/other.pem\n"))
	base := baseOf(prev)
	base.Inventory.CRTLists = []string{listPath}
	d := Diff(next, base)
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "crt-list entries are not declared by the render yet")
}

func TestDiffCertificateCreatedInThisDiffCountsAsLoaded(t *testing.T) {
	srv1 := srv("SRV_1", "10.0.0.1", 80)
	prev := basePlan(withFile(certPath, FileKindCert, "before"), withBackends(dynBackend("be-a", srv1)))
	next := basePlan(withFile(certPath, FileKindCert, "after"),
		withBackends(dynBackend("be-a", srv1, withExtra(srv("SRV_2", "10.0.0.2", 443), keyword("ssl"), keyword("crt", certPath)))))
	d := Diff(next, baseOf(prev))
	wantVerdict(t, d, VerdictRuntime)
	wantOpKinds(t, d.Ops, OpCertNew, OpServerAdd, OpServerEnable)
}

func TestDiffCRTListNotLoadedIsWrittenOnly(t *testing.T) {
	prev := basePlan(withCRTList(listPath, CRTListEntry{Cert: certPath}))
	next := basePlan(withCRTList(listPath, CRTListEntry{Cert: certPath}, CRTListEntry{Cert: "certs/other.pem"}))
	d := Diff(next, baseOf(prev))
	wantVerdict(t, d, VerdictFileOnly)
	wantReason(t, d, "is not loaded at runtime, its file is written only")
}

// ---------------------------------------------------------------------------
// Files, ManifestFiles, InventoryOf.

func TestDiffGeneralFiles(t *testing.T) {
	const page = "general/errors/503.http"
	for _, tc := range []struct {
		name    string
		reload  bool
		verdict string
	}{
		{"changed", false, VerdictFileOnly},
		{"changed and declared reload-on-change", true, VerdictReload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := func(content string) []planOpt {
				o := []planOpt{withFile(page, FileKindGeneral, content)}
				if tc.reload {
					o = append(o, withReloadOnChange(page))
				}
				return o
			}
			d := Diff(basePlan(opts("down for maintenance, v2")...), baseOf(basePlan(opts("down for maintenance")...)))
			wantVerdict(t, d, tc.verdict)
			wantOpKinds(t, d.Ops)
			if tc.reload {
				wantReason(t, d, "file general/errors/503.http changed and is declared reload-on-change")
			}
		})
	}
}

func TestDiffRemovedFiles(t *testing.T) {
	const extra = "general/rules/extra.conf"
	removed := Diff(basePlan(), baseOf(basePlan(withFile(extra, FileKindGeneral, "rules"))))
	wantVerdict(t, removed, VerdictFileOnly)
	wantReason(t, removed, "was removed, which no runtime op undoes")
	declared := Diff(basePlan(), baseOf(basePlan(withFile(extra, FileKindGeneral, "rules"), withReloadOnChange(extra))))
	wantVerdict(t, declared, VerdictReload)
	wantReason(t, declared, "was removed and is declared reload-on-change")
}

func TestManifestFilesProjectsTheWholeSet(t *testing.T) {
	p := &Plan{Files: []PlanFile{
		{Path: "general/errors/503.http", Kind: FileKindGeneral, Digest: "d1", Size: 42, ReloadOnChange: true, Content: "x", ContentKnown: true},
		{Path: ConfigFilePath, Kind: FileKindConfig, Digest: "d2", Size: 7, ReloadOnChange: true},
		{Path: routeMap, Kind: FileKindMap, Digest: "d3", Size: 9},
	}}
	files := ManifestFiles(p)
	if len(files) != len(p.Files) {
		t.Fatalf("%d files, want %d", len(files), len(p.Files))
	}
	for i := range files {
		if files[i].Path != p.Files[i].Path {
			t.Fatalf("file %d is %s, want %s (plan order)", i, files[i].Path, p.Files[i].Path)
		}
	}
	want := ManifestFile{Path: "general/errors/503.http", Kind: FileKindGeneral, Digest: "d1", Proof: "d1", Size: 42, ReloadOnChange: true}
	if !reflect.DeepEqual(files[0], want) {
		t.Fatalf("first file = %+v, want %+v", files[0], want)
	}
	if ManifestFiles(nil) != nil {
		t.Fatal("ManifestFiles(nil) is not nil")
	}
	if got := ManifestFiles(&Plan{}); got == nil {
		t.Fatal("ManifestFiles of a plan without files is nil, want an empty slice")
	}
}

func TestManifestFilesCarryAProof(t *testing.T) {
	p := basePlan(withMap(routeMap, false, mapEntries("a", "b")...), withFile(certPath, FileKindCert, "pem"),
		withCRTList(listPath, CRTListEntry{Cert: certPath}))
	for _, f := range ManifestFiles(p) {
		if f.Proof == "" || f.Proof != f.Digest {
			t.Fatalf("%s: proof %q, digest %q", f.Path, f.Proof, f.Digest)
		}
	}
}

func TestInventoryOf(t *testing.T) {
	p := &Plan{Files: []PlanFile{
		{Path: ConfigFilePath, Kind: FileKindConfig},
		{Path: "maps/path.map", Kind: FileKindMap},
		{Path: "maps/host.map", Kind: FileKindMap},
		{Path: "ssl/tls.pem", Kind: FileKindCert},
		{Path: "ssl/ca.pem", Kind: FileKindCA},
		{Path: "ssl/list.txt", Kind: FileKindCRTList},
		{Path: "general/errors/503.http", Kind: FileKindGeneral},
	}}
	want := Inventory{
		Maps:     []string{"maps/host.map", "maps/path.map"},
		Certs:    []string{"ssl/tls.pem"},
		CAFiles:  []string{"ssl/ca.pem"},
		CRTLists: []string{"ssl/list.txt"},
	}
	if got := InventoryOf(p); !reflect.DeepEqual(got, want) {
		t.Fatalf("InventoryOf = %+v, want %+v", got, want)
	}
}

func TestInventoryOfNoPlan(t *testing.T) {
	if got := InventoryOf(nil); !reflect.DeepEqual(got, Inventory{}) {
		t.Fatalf("InventoryOf(nil) = %+v, want the zero Inventory", got)
	}
}

// ---------------------------------------------------------------------------
// Baselines that went through a plan blob.

// throughPlanBlob sends a plan through a plan blob: text, content, body and
// comments are lost, digests are kept.
func throughPlanBlob(t testing.TB, p *Plan) *Plan {
	t.Helper()
	blob, err := EncodePlanBlob(p)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := DecodePlanBlob(blob)
	if err != nil {
		t.Fatal(err)
	}
	return decoded
}

func serializablePlan(opts ...planOpt) *Plan {
	commented := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	commented.Comments = []string{"owned by team a"}
	commented.Body = []string{"http-request set-header X-A 1"}
	return basePlan(append([]planOpt{
		withBackends(commented, structuralBackend("be-b", srv("SRV_1", "10.0.0.2", 80))),
		withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-b")...),
		withFile(certPath, FileKindCert, "pem"),
		withCRTList(listPath, CRTListEntry{Cert: certPath}),
	}, opts...)...)
}

func TestDiffAgainstSerializedBaselineDoesNotReload(t *testing.T) {
	prev := throughPlanBlob(t, serializablePlan())
	base := withMapsLoaded(baseOf(prev), routeMap)
	base.Inventory.Certs, base.Inventory.CRTLists = []string{certPath}, []string{listPath}
	d := Diff(serializablePlan(), base)
	if d.Verdict == VerdictReload || len(d.Ops) != 0 {
		t.Fatalf("verdict %s, ops %v, reasons %q", d.Verdict, opKindsOf(d.Ops), d.Reasons)
	}
}

func TestDiffAgainstSerializedBaselineStillDetectsChange(t *testing.T) {
	prev := throughPlanBlob(t, serializablePlan())
	d := Diff(serializablePlan(withCore("global", "global\n  maxconn 100\n")), withMapsLoaded(baseOf(prev), routeMap))
	wantVerdict(t, d, VerdictReload)
	wantReason(t, d, "core section global changed")
}

// ---------------------------------------------------------------------------
// In-place ops.

// pendingOn is the usual in-place baseline: applied = running = worker =
// prev, a reload pending.
func pendingOn(prev *Plan) *Baseline {
	base := baseOf(prev)
	base.WorkerOps, base.ReloadPending = prev, true
	return base
}

func TestInPlaceOnlyWhileAReloadIsPending(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))))
	base := baseOf(prev)
	base.WorkerOps = prev
	d := Diff(next, base)
	wantVerdict(t, d, VerdictRuntime)
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace %v, WorkerPlan %v with nothing pending", d.InPlace, d.WorkerPlan)
	}
}

func TestInPlaceRidesAReloadThePodMayPace(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))), withCore("frontend#1", "frontend http-in\n"))
	base := baseOf(prev)
	base.WorkerOps = prev
	d := Diff(next, base)
	wantVerdict(t, d, VerdictReload)
	wantExactOps(t, d.InPlace, Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "SRV_1", Address: "10.0.0.2", Port: 80})
	if d.WorkerPlan == nil {
		t.Fatal("WorkerPlan is nil with in-place ops")
	}
}

func TestInPlaceIsComputedAgainstTheWorkerPlan(t *testing.T) {
	applied := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	worker := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 10))))
	next := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 30))))
	base := baseOf(applied)
	base.WorkerOps, base.ReloadPending = worker, true
	d := Diff(next, base)
	wantExactOps(t, d.InPlace, Op{Kind: OpServerSetWeight, Backend: "be-a", Server: "SRV_1", Weight: weightPtr(30)})
}

func TestInPlaceExcludesDeletesAndBackendOps(t *testing.T) {
	worker := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80)),
		dynBackend("be-old", srv("SRV_1", "10.0.0.3", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80)), dynBackend("be-new", srv("SRV_1", "10.0.0.4", 80))))
	d := Diff(next, pendingOn(worker))
	wantExactOps(t, d.InPlace, Op{Kind: OpServerDisable, Backend: "be-a", Server: "SRV_2"})
}

func TestInPlaceMapAndCertOps(t *testing.T) {
	prev := basePlan(
		withMap(routeMap, false, mapEntries("a.example.com", "be-a", "gone.example.com", "be-gone", "multi", "be-a")...),
		withFile(certPath, FileKindCert, "before"))
	base := func() *Baseline {
		b := withMapsLoaded(pendingOn(prev), routeMap)
		b.Inventory.Certs = []string{certPath}
		return b
	}
	for _, tc := range []struct {
		name    string
		next    []MapEntry
		inPlace []Op
	}{
		{"a multiset change holds back every map op",
			mapEntries("a.example.com", "be-z", "multi", "be-a", "multi", "be-b"),
			[]Op{{Kind: OpCertSet, Path: certPath}}},
		{"line-form changes go in place together",
			mapEntries("a.example.com", "be-z", "multi", "be-a"),
			[]Op{{Kind: OpCertSet, Path: certPath}, mapSetOp(routeMap, "a.example.com", "be-z"), mapDelOp(routeMap, "gone.example.com")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := basePlan(withMap(routeMap, false, tc.next...), withFile(certPath, FileKindCert, "after"))
			d := Diff(next, base())
			wantExactOps(t, d.InPlace, tc.inPlace...)
			if d.WorkerPlan == nil {
				t.Fatal("WorkerPlan is nil")
			}
			if len(tc.inPlace) == 1 && !reflect.DeepEqual(d.WorkerPlan.Maps, prev.Maps) {
				t.Fatalf("WorkerPlan maps = %v, want the worker's %v", d.WorkerPlan.Maps, prev.Maps)
			}
			again := base()
			again.WorkerOps = d.WorkerPlan
			if d2 := Diff(next, again); d2.InPlace != nil {
				t.Fatalf("re-diff against the WorkerPlan composes %s", opsJSON(d2.InPlace))
			}
		})
	}
}

func TestInPlaceWorkerPlanIsStableAndCarriesTheServerChanges(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 10))))
	next := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 30), srv("SRV_2", "10.0.0.2", 80))))
	prevBefore, nextBefore := prev.Clone(), next.Clone()
	d := Diff(next, pendingOn(prev))
	wantOpKinds(t, d.InPlace, OpServerSetWeight, OpServerAdd, OpServerEnable)
	if want := []Server{weighted(srv("SRV_1", "10.0.0.1", 80), 30), srv("SRV_2", "10.0.0.2", 80)}; !reflect.DeepEqual(d.WorkerPlan.Backends["be-a"].Servers, want) {
		t.Fatalf("WorkerPlan be-a servers = %+v, want %+v", d.WorkerPlan.Backends["be-a"].Servers, want)
	}
	if !reflect.DeepEqual(prev, prevBefore) || !reflect.DeepEqual(next, nextBefore) {
		t.Fatal("Diff changed an input plan")
	}
	if again := Diff(next, pendingOn(prev)); again.WorkerPlan.ID != d.WorkerPlan.ID {
		t.Fatalf("WorkerPlan.ID %s on a second diff, %s on the first", again.WorkerPlan.ID, d.WorkerPlan.ID)
	}
	if id := d.WorkerPlan.ID; id == prev.ID || id == next.ID || len(id) != 16 {
		t.Fatalf("WorkerPlan.ID %q is not a distinct derived id (prev %s, next %s)", id, prev.ID, next.ID)
	}
	b, _ := json.Marshal(d.InPlace)
	if want := DigestString(prev.ID + "\x00" + next.ID + "\x00" + string(b)); d.WorkerPlan.ID != want {
		t.Fatalf("WorkerPlan.ID = %s, want %s", d.WorkerPlan.ID, want)
	}
	base := pendingOn(prev)
	base.WorkerOps = d.WorkerPlan
	if d2 := Diff(next, base); d2.InPlace != nil {
		t.Fatalf("re-diff against the WorkerPlan composes %s", opsJSON(d2.InPlace))
	}
}

func TestInPlaceHonoursTheAgentOpSet(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 10))))
	next := basePlan(withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.1", 80), 20))))
	base := pendingOn(prev)
	base.Caps = CapsFor("3.4.3", []string{OpServerSetAddr})
	d := Diff(next, base)
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace %s, WorkerPlan %v", opsJSON(d.InPlace), d.WorkerPlan)
	}
}

func TestInPlaceMapOpsFollowTheAgentOpSetAsAWhole(t *testing.T) {
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-b")...))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-z")...))
	base := withMapsLoaded(pendingOn(prev), routeMap)
	base.Caps = CapsFor("3.4.3", []string{OpMapSet})
	d := Diff(next, base)
	for _, op := range d.InPlace {
		if strings.HasPrefix(op.Kind, "map_") {
			t.Fatalf("InPlace holds %s", op.Kind)
		}
	}
	base.Caps = CapsFor("3.4.3", []string{OpMapSet, OpMapDel})
	if d := Diff(next, base); len(d.InPlace) != 2 {
		t.Fatalf("with both kinds executed InPlace = %s, want the map_set and the map_del", opsJSON(d.InPlace))
	}
}

func TestInPlaceDropsAnEnableWhoseAddWasDropped(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80), srv("SRV_2", "10.0.0.2", 80))))
	base := pendingOn(prev)
	base.Caps = CapsFor("3.4.3", []string{OpServerEnable})
	d := Diff(next, base)
	for _, op := range d.InPlace {
		if op.Kind == OpServerEnable && op.Server == "SRV_2" {
			t.Fatalf("InPlace enables SRV_2, whose server_add was dropped: %s", opsJSON(d.InPlace))
		}
	}
}

func TestInPlaceNeedsTheWorkerOpsBaseline(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))))
	base := baseOf(prev)
	base.ReloadPending = true
	d := Diff(next, base)
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace %s without a worker-ops baseline", opsJSON(d.InPlace))
	}
}

func TestInPlaceNeedsAUsableBaseline(t *testing.T) {
	prev := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))))
	next := basePlan(withBackends(dynBackend("be-a", srv("SRV_1", "10.0.0.2", 80))))
	d := Diff(next, &Baseline{WorkerOps: prev, ReloadPending: true, Caps: on34})
	wantReasonsExactly(t, d, "no baseline")
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace %s without an applied baseline", opsJSON(d.InPlace))
	}
}

func TestInPlaceMapSetWaitsForABackendTheReloadAdds(t *testing.T) {
	const pathMap = "maps/path.map"
	maps := func(pathTarget string, route ...string) []planOpt {
		return []planOpt{withMap(pathMap, false, mapEntries("/api", pathTarget)...), withMap(routeMap, false, mapEntries(route...)...)}
	}
	srv1 := dynBackend("be-a", srv("SRV_1", "10.0.0.1", 80))
	beNew := structuralBackend("be-new", srv("SRV_1", "10.0.0.9", 80))
	t.Run("backend still missing", func(t *testing.T) {
		prev := basePlan(append(maps("be-a", "a.example.com", "be-a", "gone.example.com", "be-a"), withBackends(srv1))...)
		next := basePlan(append(maps("be-new", "a.example.com", "be-a"), withBackends(srv1, beNew))...)
		base := withMapsLoaded(baseOf(prev), pathMap, routeMap)
		base.WorkerOps = prev
		d := Diff(next, base)
		wantVerdict(t, d, VerdictReload)
		if d.InPlace != nil || d.WorkerPlan != nil {
			t.Fatalf("InPlace %s before the reload adds be-new", opsJSON(d.InPlace))
		}
	})
	t.Run("backend present on the worker", func(t *testing.T) {
		prev := basePlan(append(maps("be-a", "a.example.com", "be-a", "gone.example.com", "be-a"), withBackends(srv1, beNew))...)
		next := basePlan(append(maps("be-new", "a.example.com", "be-a"), withBackends(srv1, beNew))...)
		d := Diff(next, withMapsLoaded(pendingOn(prev), pathMap, routeMap))
		wantExactOps(t, d.InPlace, mapSetOp(pathMap, "/api", "be-new"), mapDelOp(routeMap, "gone.example.com"))
	})
}

// A map the worker has not loaded cannot move in place, and then no map
// does: the worker takes every map change of the render or none.
func TestInPlaceMapsWaitForEveryMapToBeLoaded(t *testing.T) {
	const other = "maps/other.map"
	prev := basePlan(withMap(routeMap, false, mapEntries("a", "be-a")...), withMap(other, false, mapEntries("b", "be-a")...))
	next := basePlan(withMap(routeMap, false, mapEntries("a", "be-z")...), withMap(other, false, mapEntries("b", "be-z")...))
	d := Diff(next, withMapsLoaded(pendingOn(prev), routeMap))
	wantVerdict(t, d, VerdictRuntime)
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace %s while %s is not loaded", opsJSON(d.InPlace), other)
	}
}

func TestInPlaceMapBatchIsNotTruncated(t *testing.T) {
	var before, after []string
	for i := range 1001 {
		before = append(before, fmt.Sprint("k", i), "old")
		after = append(after, fmt.Sprint("k", i), "new")
	}
	prev := basePlan(withMap(routeMap, false, mapEntries(before...)...))
	next := basePlan(withMap(routeMap, false, mapEntries(after...)...))
	d := Diff(next, withMapsLoaded(pendingOn(prev), routeMap))
	if d.InPlace != nil || d.WorkerPlan != nil {
		t.Fatalf("InPlace holds %d ops, want none", len(d.InPlace))
	}
	wantVerdict(t, d, VerdictRuntime)
	if len(d.Ops) != 1001 || d.Chunks != 2 || opKindsOf(d.Ops)[1000] != OpMapSet {
		t.Fatalf("Ops %d in %d chunks", len(d.Ops), d.Chunks)
	}
}

func TestInPlaceMapsKeepDenialUntilAllEnforcementCanApply(t *testing.T) {
	const denied, authentication = "maps/denied.map", "maps/authentication.map"
	prev := basePlan(withMap(denied, false, mapEntries("protected", "1", "other", "1")...),
		withMap(authentication, false, mapEntries("public", "allow")...))
	for _, tc := range []struct {
		name string
		more []planOpt
	}{
		{"the maps alone", nil},
		{"with the core section that enforces them", []planOpt{withCore("authentication", "frontend auth\n")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := basePlan(append([]planOpt{withMap(denied, false, mapEntries("other", "1")...),
				withMap(authentication, false, mapEntries("public", "allow", "protected", "require credentials")...)}, tc.more...)...)
			d := Diff(next, withMapsLoaded(pendingOn(prev), denied, authentication))
			if d.InPlace != nil || d.WorkerPlan != nil {
				t.Fatalf("InPlace %s lifts the denial before the enforcement applies", opsJSON(d.InPlace))
			}
		})
	}
}

// TestDiffOpCapAtExactlyEightApplies pins the op-batch cap at its edge: a
// change that fits in exactly MaxOpBatches applies goes through the runtime
// API, and one op more reloads with the "op cap" reason.
func TestDiffOpCapAtExactlyEightApplies(t *testing.T) {
	changed := func(n int) (prev, next *Plan) {
		before := make([]string, 0, 2*n)
		after := make([]string, 0, 2*n)
		for i := range n {
			before = append(before, fmt.Sprint("k", i), "old")
			after = append(after, fmt.Sprint("k", i), "new")
		}
		return basePlan(withMap(routeMap, false, mapEntries(before...)...)),
			basePlan(withMap(routeMap, false, mapEntries(after...)...))
	}
	limit := MaxOpBatches * MaxOpsPerApply
	for _, tc := range []struct {
		n, chunks int
	}{{limit - MaxOpsPerApply + 1, MaxOpBatches}, {limit, MaxOpBatches}} {
		t.Run(fmt.Sprint("N=", tc.n), func(t *testing.T) {
			prev, next := changed(tc.n)
			d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
			wantVerdict(t, d, VerdictRuntime)
			if len(d.Ops) != tc.n || d.Chunks != tc.chunks || len(d.Chunk()) != tc.chunks {
				t.Fatalf("%d ops in %d chunks (Chunk() has %d), want %d in %d", len(d.Ops), d.Chunks, len(d.Chunk()), tc.n, tc.chunks)
			}
		})
	}
	t.Run(fmt.Sprint("N=", limit+1), func(t *testing.T) {
		prev, next := changed(limit + 1)
		d := Diff(next, withMapsLoaded(baseOf(prev), routeMap))
		wantVerdict(t, d, VerdictReload)
		wantReason(t, d, fmt.Sprintf("op cap: %d ops need more than %d applies", limit+1, MaxOpBatches))
	})
}
