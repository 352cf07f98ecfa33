// Tests of Diff (deployplan.go) as a whole rather than case by case: Diff
// never writes to the plan or the baseline it was given, and on 1,500 random
// pairs of plans it is deterministic, each verdict is well formed (a reload
// carries no ops, a runtime change fits the op batches, file_only has no
// ops), every op has valid words and a kind listed in ComposedOps, and the
// manifest NewManifest builds from it passes its own batch validation.
// BenchmarkDiff times Diff on a fleet-sized plan. The fixtures (basePlan and
// its options) are in deployplan_test.go.

package haptic

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// ---------------------------------------------------------------------------
// Purity: Diff never writes to what it was given.

// cloneBaseline deep-copies a baseline, so that a test can compare it after
// a diff.
func cloneBaseline(b *Baseline) *Baseline {
	c := *b
	c.Applied, c.Running, c.WorkerOps = b.Applied.Clone(), b.Running.Clone(), b.WorkerOps.Clone()
	c.Inventory.Maps, c.Inventory.Certs = cloneSlice(b.Inventory.Maps), cloneSlice(b.Inventory.Certs)
	c.Inventory.CAFiles, c.Inventory.CRLFiles = cloneSlice(b.Inventory.CAFiles), cloneSlice(b.Inventory.CRLFiles)
	c.Inventory.CRTLists = cloneSlice(b.Inventory.CRTLists)
	if b.Caps.AgentOps != nil {
		c.Caps.AgentOps = maps.Clone(b.Caps.AgentOps)
	}
	return &c
}

func TestDiffDoesNotMutateItsInputs(t *testing.T) {
	srv1 := weighted(srv("SRV_1", "10.0.0.1", 80), 10)
	prev := basePlan(
		withBackends(dynBackend("be-a", srv1, srv("SRV_2", "10.0.0.2", 80)), dynBackend("be-old", srv("SRV_1", "10.0.0.3", 80))),
		withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-b", "gone", "be-a")...),
		withMap("maps/ordered.map", true, mapEntries("x", "1", "y", "2")...),
		withFile(certPath, FileKindCert, "before"), withFile(caPath, FileKindCA, "ca-before"),
		withCRTList(listPath, CRTListEntry{Cert: certPath, Options: []KeywordArg{keyword("alpn", "h2")}, SNIFilters: []string{"a.example.com"}}))
	nextRuntime := basePlan(
		withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.9", 80), 30), withExtra(srv("SRV_3", "10.0.0.4", 80), keyword("check"))),
			dynBackend("be-new", srv("SRV_1", "10.0.0.5", 80))),
		withMap(routeMap, false, mapEntries("a", "be-new", "b", "be-b", "c", "be-c")...),
		withMap("maps/ordered.map", true, mapEntries("x", "1", "y", "3", "z", "4")...),
		withFile(certPath, FileKindCert, "after"), withFile(caPath, FileKindCA, "ca-after"),
		withCRTList(listPath, CRTListEntry{Cert: certPath, Options: []KeywordArg{keyword("alpn", "h2,http/1.1")}, SNIFilters: []string{"a.example.com"}},
			CRTListEntry{Cert: "certs/other.pem", SNIFilters: []string{"b.example.com"}}))
	nextReload := basePlan(
		withBackends(dynBackend("be-a", weighted(srv("SRV_1", "10.0.0.9", 80), 30)), structuralBackend("be-new")),
		withMap(routeMap, false, mapEntries("a", "be-a", "b", "be-z")...),
		withFile(certPath, FileKindCert, "after"), withCore("frontend#1", "frontend f\n"))
	loaded := func(b *Baseline) *Baseline {
		b = withMapsLoaded(b, routeMap, "maps/ordered.map")
		b.Inventory.Certs, b.Inventory.CRTLists = []string{certPath}, []string{listPath}
		return b
	}
	inPlace := loaded(pendingOn(prev))
	for _, tc := range []struct {
		name    string
		next    *Plan
		base    *Baseline
		verdict string
		inPlace bool
	}{
		{"reload", nextReload, loaded(baseOf(prev)), VerdictReload, false},
		{"runtime", nextRuntime, loaded(baseOf(prev)), VerdictRuntime, false},
		{"in place", nextRuntime, inPlace, VerdictRuntime, true},
		{"reload with in-place ops", nextReload, inPlace, VerdictReload, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nextBefore, baseBefore := tc.next.Clone(), cloneBaseline(tc.base)
			d := Diff(tc.next, tc.base)
			wantVerdict(t, d, tc.verdict)
			if tc.inPlace != (len(d.InPlace) > 0) {
				t.Fatalf("in-place ops %s", opsJSON(d.InPlace))
			}
			if !reflect.DeepEqual(tc.next, nextBefore) {
				t.Fatal("Diff changed next")
			}
			if !reflect.DeepEqual(tc.base, baseBefore) {
				t.Fatal("Diff changed the baseline or a plan it holds")
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Properties over random pairs of plans.

// planShape is what a random plan states; build turns it into a plan.
type planShape struct {
	cores    map[string]string
	profiles map[string]string
	backends []Backend
	maps     []Map
	lists    []CRTList
	files    []PlanFile
	reload   []string
}

func (s planShape) build() *Plan {
	opts := []planOpt{func(b *planBuilder) { b.profiles = maps.Clone(s.profiles) }}
	for _, name := range sortedNames(s.cores) {
		opts = append(opts, withCore(name, s.cores[name]))
	}
	opts = append(opts, withBackends(s.backends...))
	for _, m := range s.maps {
		opts = append(opts, withMap(m.Path, m.Ordered, m.Entries...))
	}
	for _, l := range s.lists {
		opts = append(opts, withCRTList(l.Path, l.Entries...))
	}
	for _, f := range s.files {
		opts = append(opts, withFile(f.Path, f.Kind, f.Content))
	}
	for _, p := range s.reload {
		opts = append(opts, withReloadOnChange(p))
	}
	return basePlan(opts...)
}

// clone deep-copies the shape through a built plan's records.
func (s planShape) clone() planShape {
	c := planShape{cores: maps.Clone(s.cores), profiles: maps.Clone(s.profiles), reload: slices.Clone(s.reload), files: slices.Clone(s.files)}
	p := &Plan{Backends: map[string]Backend{}, Maps: map[string]Map{}, CRTLists: map[string]CRTList{}}
	for _, b := range s.backends {
		p.Backends[b.Name] = b
	}
	for _, m := range s.maps {
		p.Maps[m.Path] = m
	}
	for _, l := range s.lists {
		p.CRTLists[l.Path] = l
	}
	p = p.Clone()
	for _, name := range sortedNames(p.Backends) {
		c.backends = append(c.backends, p.Backends[name])
	}
	for _, name := range sortedNames(p.Maps) {
		c.maps = append(c.maps, p.Maps[name])
	}
	for _, name := range sortedNames(p.CRTLists) {
		c.lists = append(c.lists, p.CRTLists[name])
	}
	return c
}

// shapeRand draws the parts of random plans: mostly sendable words, now and
// then one the runtime API cannot carry.
type shapeRand struct{ *rand.Rand }

func (r shapeRand) pick(words ...string) string { return words[r.IntN(len(words))] }

func (r shapeRand) server() Server {
	s := Server{
		Name:     r.pick("SRV_1", "SRV_2", "SRV_3", "SRV_4", "SRV 5", "SRV_1"),
		Address:  r.pick("10.0.0.1", "10.0.0.2", "::1", "10.0.0.3", "web.internal", "fe80::1%eth 0"),
		Port:     []int{80, 443, 8080, 0}[r.IntN(4)],
		Disabled: r.IntN(4) == 0,
		GUID:     r.pick("", "", "", "g-1", "g 2"),
	}
	if r.IntN(2) == 0 {
		s.Weight = weightPtr(r.IntN(3))
	}
	for range r.IntN(3) {
		s.Extra = append(s.Extra, []KeywordArg{
			keyword("check"), keyword("inter", "2s"), keyword("maxconn", "10"), keyword("resolvers", "dns"), keyword("crt", "tls.pem"),
			keyword("ca-file", caPath), keyword("init-state", "up"), keyword("maxconn", "a;b"), keyword("ssl"),
		}[r.IntN(9)])
	}
	return s
}

func (r shapeRand) backend(name string) Backend {
	b := dynBackend(name)
	if r.IntN(5) == 0 {
		b = structuralBackend(name)
	}
	b.Balance = r.pick("roundrobin", "roundrobin", "static-rr", "hdr(Host)", "")
	b.HashType = r.pick("", "", "consistent")
	b.Profile = r.pick("haptic-be", "haptic-be", "haptic-be", "other", "")
	b.Mode = r.pick("http", "http", "tcp", "h t")
	if r.IntN(4) == 0 {
		b.DefaultServer = []KeywordArg{keyword("check")}
	}
	for range r.IntN(4) {
		b.Servers = append(b.Servers, r.server())
	}
	return b
}

func (r shapeRand) mapEntries() []MapEntry {
	var es []MapEntry
	for range r.IntN(6) {
		es = append(es, MapEntry{
			Key:   r.pick("a", "b", "c", "d", "/api;v1", "x y"),
			Value: r.pick("be-a", "be-b", "be-c", "", "301 https://x", "a>b", "two\nlines"),
		})
	}
	return es
}

func (r shapeRand) crtEntries() []CRTListEntry {
	var es []CRTListEntry
	for _, cert := range []string{certPath, "certs/b.pem", "certs/c.pem", "certs/a;b.pem"} {
		if r.IntN(2) == 0 {
			continue
		}
		e := CRTListEntry{Cert: cert}
		if r.IntN(3) == 0 {
			e.Options = []KeywordArg{keyword("alpn", r.pick("h2", "h2,http/1.1", "h 2"))}
		}
		if r.IntN(2) == 0 {
			e.SNIFilters = []string{r.pick("a.example.com", "b.example.com", "a b")}
		}
		es = append(es, e)
	}
	if r.IntN(3) == 0 {
		slices.Reverse(es)
	}
	return es
}

func (r shapeRand) shape() planShape {
	s := planShape{cores: map[string]string{}, profiles: map[string]string{"haptic-be": "body-1"}}
	if r.IntN(2) == 0 {
		s.profiles["other"] = "body-other"
	}
	for _, name := range []string{"be-a", "be-b", "be-c", "be d"} {
		if r.IntN(3) != 0 {
			s.backends = append(s.backends, r.backend(name))
		}
	}
	for _, m := range []Map{{Path: routeMap}, {Path: "maps/ordered.map", Ordered: true}, {Path: "maps/un safe.map"}} {
		if r.IntN(3) != 0 {
			m.Entries = r.mapEntries()
			s.maps = append(s.maps, m)
		}
	}
	if r.IntN(2) == 0 {
		s.lists = append(s.lists, CRTList{Path: listPath, Entries: r.crtEntries()})
	}
	for _, f := range []PlanFile{{Path: certPath, Kind: FileKindCert}, {Path: caPath, Kind: FileKindCA},
		{Path: "certs/x y.pem", Kind: FileKindCert}, {Path: "general/503.http", Kind: FileKindGeneral}} {
		if r.IntN(2) == 0 {
			f.Content = r.pick("one", "two")
			s.files = append(s.files, f)
		}
	}
	if r.IntN(4) == 0 {
		s.reload = append(s.reload, r.pick(routeMap, "general/503.http", certPath))
	}
	return s
}

// mutate changes a few things of a shape, the way one render differs from
// the last.
func (r shapeRand) mutate(s planShape) planShape {
	s = s.clone()
	for range 1 + r.IntN(4) {
		switch r.IntN(9) {
		case 0:
			if len(s.backends) > 0 {
				b := &s.backends[r.IntN(len(s.backends))]
				if len(b.Servers) > 0 {
					sv := &b.Servers[r.IntN(len(b.Servers))]
					switch r.IntN(4) {
					case 0:
						sv.Address = r.pick("10.0.0.7", "10.0.0.8", "web.internal")
					case 1:
						sv.Weight = weightPtr(r.IntN(5))
					case 2:
						sv.Disabled = !sv.Disabled
					default:
						sv.Port = []int{81, 443, 70000}[r.IntN(3)]
					}
				}
			}
		case 1:
			if len(s.backends) > 0 {
				b := &s.backends[r.IntN(len(s.backends))]
				b.Servers = append(b.Servers, r.server())
			}
		case 2:
			if len(s.backends) > 0 {
				b := &s.backends[r.IntN(len(s.backends))]
				if len(b.Servers) > 0 {
					i := r.IntN(len(b.Servers))
					b.Servers = slices.Delete(b.Servers, i, i+1)
				}
			}
		case 3:
			if r.IntN(2) == 0 && len(s.backends) > 0 {
				i := r.IntN(len(s.backends))
				s.backends = slices.Delete(s.backends, i, i+1)
			} else {
				name := r.pick("be-e", "be-f", "be g")
				if !slices.ContainsFunc(s.backends, func(b Backend) bool { return b.Name == name }) {
					s.backends = append(s.backends, r.backend(name))
				}
			}
		case 4:
			if len(s.maps) > 0 {
				m := &s.maps[r.IntN(len(s.maps))]
				if r.IntN(2) == 0 || len(m.Entries) == 0 {
					m.Entries = r.mapEntries()
				} else {
					m.Entries[r.IntN(len(m.Entries))].Value = r.pick("be-z", "be-y", "x y")
				}
			}
		case 5:
			if len(s.files) > 0 {
				f := &s.files[r.IntN(len(s.files))]
				f.Content += "!"
			}
		case 6:
			if len(s.lists) > 0 {
				s.lists[0].Entries = r.crtEntries()
			}
		case 7:
			switch r.IntN(3) {
			case 0:
				s.cores["frontend#1"] = r.pick("frontend a\n", "frontend b\n")
			case 1:
				s.profiles["haptic-be"] = r.pick("body-1", "body-2")
			default:
				delete(s.profiles, "other")
			}
		default:
			if len(s.backends) > 0 {
				b := &s.backends[r.IntN(len(s.backends))]
				b.Comments = append(b.Comments, "note")
			}
		}
	}
	return s
}

func (r shapeRand) baseline(prev, worker *Plan) *Baseline {
	version := r.pick("3.4.3", "3.4.3", "3.0.26", "3.1.17", "2.9.0", "unknown")
	agentOps := ComposedOps()
	if r.IntN(4) == 0 {
		agentOps = nil
		for _, k := range ComposedOps() {
			if r.IntN(5) != 0 {
				agentOps = append(agentOps, k)
			}
		}
	}
	b := &Baseline{Applied: prev, Running: prev, Caps: CapsFor(version, agentOps)}
	for _, p := range []string{routeMap, "maps/ordered.map", "maps/un safe.map"} {
		if r.IntN(4) != 0 {
			b.Inventory.Maps = append(b.Inventory.Maps, p)
		}
	}
	if r.IntN(2) == 0 {
		b.Inventory.Certs = []string{certPath}
	}
	if r.IntN(2) == 0 {
		b.Inventory.CAFiles = []string{caPath}
	}
	if r.IntN(2) == 0 {
		b.Inventory.CRTLists = []string{listPath}
	}
	b.PendingServerDeletes = []int{0, 0, 998, 1000}[r.IntN(4)]
	b.PendingBackendDeletes = []int{0, 0, 99, 100}[r.IntN(4)]
	b.ReloadPending = r.IntN(2) == 0
	switch r.IntN(3) {
	case 0:
		b.WorkerOps = prev
	case 1:
		b.WorkerOps = worker
	}
	if r.IntN(20) == 0 {
		b.Applied = nil
	}
	return b
}

// opWordsError names the first word of op that the token grammar refuses.
func opWordsError(op Op) error {
	bad := func(field, word string) error {
		return fmt.Errorf("%s %s %q is not a safe runtime token", op.Kind, field, word)
	}
	keywordsOK := func(kws []KeywordArg) bool {
		for _, k := range kws {
			if !SafeToken(k.Name) || !allSafeTokens(k.Args) {
				return false
			}
		}
		return true
	}
	switch op.Kind {
	case OpBackendAdd:
		switch {
		case !SafeToken(op.Backend):
			return bad("backend", op.Backend)
		case !SafeToken(op.Profile):
			return bad("profile", op.Profile)
		case op.Mode != "" && !SafeToken(op.Mode):
			return bad("mode", op.Mode)
		case op.GUID != "" && !SafeToken(op.GUID):
			return bad("guid", op.GUID)
		}
	case OpBackendPublish, OpBackendUnpublish, OpBackendDel, OpBackendWaitRemovable:
		if !SafeToken(op.Backend) {
			return bad("backend", op.Backend)
		}
	case OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight, OpServerSetState,
		OpServerWaitRemovable, OpServerDel:
		switch {
		case !SafeToken(op.Backend):
			return bad("backend", op.Backend)
		case !SafeToken(op.Server):
			return bad("server", op.Server)
		case (op.Kind == OpServerAdd || op.Kind == OpServerSetAddr) && !SafeToken(op.Address):
			return bad("address", op.Address)
		case !keywordsOK(op.Keywords):
			return fmt.Errorf("%s keywords %v are not safe runtime tokens", op.Kind, op.Keywords)
		case op.Kind == OpServerSetWeight && op.Weight == nil:
			return fmt.Errorf("server_set_weight without a weight")
		}
	case OpMapAdd, OpMapSet, OpMapDel, OpMapReplace:
		switch {
		case !SafeToken(op.Path):
			return bad("path", op.Path)
		case op.Kind != OpMapReplace && !SafeToken(op.Key):
			return bad("key", op.Key)
		case op.Kind == OpMapSet && !SafeToken(op.Value):
			return bad("value", op.Value)
		case op.Kind == OpMapAdd && !SafePayloadValue(op.Value):
			return fmt.Errorf("map_add value %q is not a safe payload value", op.Value)
		}
	case OpCertSet, OpCertNew, OpCASet, OpCANew:
		if !SafeToken(op.Path) {
			return bad("path", op.Path)
		}
	case OpCRTListAdd, OpCRTListDel:
		switch {
		case !SafeToken(op.Path):
			return bad("path", op.Path)
		case !SafeToken(op.Cert):
			return bad("cert", op.Cert)
		case !keywordsOK(op.Options) || !allSafeTokens(op.SNIFilters):
			return fmt.Errorf("%s options %v or SNI filters %v are not safe runtime tokens", op.Kind, op.Options, op.SNIFilters)
		}
	default:
		return fmt.Errorf("unknown op kind %s", op.Kind)
	}
	return nil
}

func TestDiffProperties(t *testing.T) {
	r := shapeRand{rand.New(rand.NewPCG(2024, 11))}
	composed := ComposedOps()
	verdicts := map[string]int{}
	inPlace := 0
	for i := range 1500 {
		prevShape := r.shape()
		nextShape := r.mutate(prevShape)
		prev, next, worker := prevShape.build(), nextShape.build(), r.mutate(prevShape).build()
		base := r.baseline(prev, worker)
		nextBefore, baseBefore := next.Clone(), cloneBaseline(base)

		d := Diff(next, base)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("case %d (verdict %s, reasons %q): %s", i, d.Verdict, d.Reasons, fmt.Sprintf(format, args...))
		}
		if again := Diff(next, base); !reflect.DeepEqual(d, again) {
			fail("two diffs of the same inputs differ")
		}
		if !reflect.DeepEqual(next, nextBefore) || !reflect.DeepEqual(base, baseBefore) {
			fail("Diff changed its inputs")
		}
		verdicts[d.Verdict]++
		switch d.Verdict {
		case VerdictReload:
			if len(d.Ops) != 0 || d.Chunks != 0 || d.Mode != ModeReload || len(d.Reasons) == 0 {
				fail("a reload carries %d ops, %d chunks, mode %s", len(d.Ops), d.Chunks, d.Mode)
			}
		case VerdictRuntime:
			if len(d.Ops) == 0 || d.Chunks < 1 || d.Chunks > MaxOpBatches || d.Mode != ModeAuto {
				fail("runtime with %d ops, %d chunks, mode %s", len(d.Ops), d.Chunks, d.Mode)
			}
		case VerdictFileOnly:
			if len(d.Ops) != 0 || d.Mode != ModeAuto {
				fail("file_only with %d ops, mode %s", len(d.Ops), d.Mode)
			}
		default:
			fail("unknown verdict")
		}
		if len(d.Reasons) > maxReasons {
			fail("%d reasons", len(d.Reasons))
		}
		if (len(d.InPlace) > 0) != (d.WorkerPlan != nil) {
			fail("InPlace %d ops, WorkerPlan %v", len(d.InPlace), d.WorkerPlan != nil)
		}
		if len(d.InPlace) > 0 {
			inPlace++
		}
		for _, op := range slices.Concat(d.Ops, d.InPlace) {
			if err := opWordsError(op); err != nil {
				fail("%v", err)
			}
			if !slices.Contains(composed, op.Kind) {
				fail("%s is not in ComposedOps", op.Kind)
			}
		}
		if base.Applied != nil && len(d.InPlace) > 0 {
			again := cloneBaseline(base)
			again.WorkerOps = d.WorkerPlan
			if d2 := Diff(next, again); len(d.InPlace) < MaxOpsPerApply && d2.InPlace != nil {
				fail("re-diff against the WorkerPlan composes %s after %s", opsJSON(d2.InPlace), opsJSON(d.InPlace))
			}
		}
		state := &State{AppliedPlanID: prev.ID, AppliedPlanProof: "p", WorkerOpsPlanID: prev.ID, WorkerOpsPlanProof: "w"}
		if err := NewManifest(next, d, state, Token{LeaderEpoch: 1}).ValidateOpBatches(); err != nil {
			fail("NewManifest builds a manifest that fails ValidateOpBatches: %v", err)
		}
	}
	for _, v := range []string{VerdictRuntime, VerdictFileOnly, VerdictReload} {
		if verdicts[v] == 0 {
			t.Errorf("no random case gave %s (%v): the generator does not cover it", v, verdicts)
		}
	}
	if inPlace == 0 {
		t.Error("no random case composed in-place ops")
	}
	t.Logf("verdicts %v, %d with in-place ops", verdicts, inPlace)
}

// ---------------------------------------------------------------------------
// Benchmark: Diff on 3,000 dynamic backends of two servers each and 25
// loaded maps, where next differs from prev by one server address, should
// stay under 5 ms per call on one core.

func BenchmarkDiff(b *testing.B) {
	build := func(changed string) *Plan {
		backends := make([]Backend, 3000)
		for i := range backends {
			address := fmt.Sprintf("10.%d.%d.1", i/250, i%250)
			if i == 1500 {
				address = changed
			}
			backends[i] = dynBackend(fmt.Sprintf("be-%04d", i),
				srv("SRV_1", address, 80), srv("SRV_2", fmt.Sprintf("10.%d.%d.2", i/250, i%250), 80))
		}
		opts := []planOpt{withBackends(backends...)}
		for m := range 25 {
			var kv []string
			for e := range 100 {
				kv = append(kv, fmt.Sprintf("host-%03d.example.com", e), fmt.Sprintf("be-%04d", (m*100+e)%3000))
			}
			opts = append(opts, withMap(fmt.Sprintf("maps/m%02d.map", m), false, mapEntries(kv...)...))
		}
		return basePlan(opts...)
	}
	prev, next := build("10.6.0.1"), build("10.99.0.1")
	base := baseOf(prev)
	base.Inventory = InventoryOf(prev)
	check := func(d Decision) {
		if d.Verdict != VerdictRuntime || len(d.Ops) != 1 || d.Ops[0].Kind != OpServerSetAddr {
			b.Fatalf("decision %s with ops %v, reasons %q; want runtime with exactly one server_set_addr", d.Verdict, opKindsOf(d.Ops), d.Reasons)
		}
	}
	check(Diff(next, base))
	b.ReportAllocs()
	b.ResetTimer()
	var d Decision
	for b.Loop() {
		d = Diff(next, base)
	}
	b.StopTimer()
	check(d)
}
