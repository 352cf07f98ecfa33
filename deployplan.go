// This file owns Diff: the controller's decision for one pod — runtime,
// file_only or reload — with the typed ops in their safe order, the in-place
// ops for a worker that keeps serving while a reload waits, the split of ops
// into applies, and the two functions that connect a decision to the wire
// (BaselineFromState and NewManifest).
//
// Everything here is a pure function of its arguments. It must never do I/O,
// read a clock, draw randomness, keep package-level mutable state, or write
// to a plan or baseline it was given: the same inputs give deeply equal
// Decisions, concurrent calls on shared inputs are safe, and a Decision owns
// its memory. When Diff cannot show that a runtime change reproduces what a
// reload of the new files would give, it reloads.

package haptic

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Verdict is what Diff predicts a change needs (Decision.Verdict); `haptic
// diff` prints it, or noop for an identical render.
type Verdict = string

// Verdicts.
const (
	VerdictRuntime  Verdict = "runtime"   // no reload cause and at least one op
	VerdictFileOnly Verdict = "file_only" // no reload cause and no op: the files are written
	VerdictReload   Verdict = "reload"    // at least one reload cause; every op is discarded
)

const (
	// maxReasons caps Decision.Reasons. A later fail still sets the reload
	// flag; only its text is dropped.
	maxReasons = 32
	// removableTimeoutMs is the wait of wait_srv_removable and
	// wait_be_removable: long enough for a disabled server's last requests
	// to finish, short enough that the agent's deferred-delete queue moves.
	removableTimeoutMs = 2000
)

// Baseline is everything the controller knows about one pod, from its ACK
// or from GET /v1/state. A nil *Baseline is the zero Baseline: reload, "no
// baseline".
type Baseline struct {
	Applied               *Plan     // plan whose files the pod holds; nil = unknown -> reload
	Running               *Plan     // plan the running worker loaded; not read by Diff
	WorkerOps             *Plan     // what the worker holds after in-place ops; base for in-place composition
	Inventory             Inventory // what the running worker has loaded (maps, certs, ca_files, crl_files, crt_lists)
	Caps                  Caps      // what the pod's HAProxy and agent can do at runtime (CapsFor)
	PendingServerDeletes  int       // deferred server deletes already queued on the pod
	PendingBackendDeletes int       // deferred backend deletes already queued on the pod
	ReloadPending         bool      // the pod has a reload scheduled but not done
}

// Caps says what the pod's HAProxy and agent can do at runtime.
type Caps struct {
	DynamicServers  bool            // add server / del server          (HAProxy >= 3.0)
	DynamicBackends bool            // add/del backend, publish/unpublish (HAProxy >= 3.4)
	ServerInitState bool            // add server ... init-state up      (HAProxy >= 3.1)
	AgentOps        map[string]bool // op kinds the agent executes; nil = every kind, empty = none (CapsFor)
}

// CapsFor reads the capabilities from an HAProxy version string and the op
// kinds an agent advertises. Only major.minor is read ("v3.4.3-1ppa" is
// 3.4); a version with no leading number has no capability at all, so
// every dynamic add or delete reloads.
//
// agentOps is read as the agent's own list, and a nil or empty list (JSON
// null, [] or a missing agent_ops) as an agent that executes no op: Diff
// then composes none for it and reloads, the same reading CheckSkew makes
// when it lists every kind as missing. Reading it as "every kind" would
// send runtime ops to an agent that never said it runs them. A caller with
// no agent to ask (an offline diff) passes ComposedOps(), or leaves
// AgentOps nil in a Caps it builds itself.
func CapsFor(haproxyVersion string, agentOps []string) Caps {
	c := Caps{AgentOps: make(map[string]bool, len(agentOps))}
	for _, kind := range agentOps {
		c.AgentOps[kind] = true
	}
	fields := strings.SplitN(strings.TrimPrefix(strings.TrimSpace(haproxyVersion), "v"), ".", 3)
	major, ok := leadingNumber(fields[0])
	if !ok {
		return c
	}
	minor := 0
	if len(fields) > 1 {
		minor, _ = leadingNumber(fields[1])
	}
	atLeast := func(wantMajor, wantMinor int) bool {
		return major > wantMajor || major == wantMajor && minor >= wantMinor
	}
	c.DynamicServers = atLeast(3, 0)
	c.ServerInitState = atLeast(3, 1)
	c.DynamicBackends = atLeast(3, 4)
	return c
}

// leadingNumber reads the decimal digits at the start of s. It saturates
// instead of overflowing, so an absurdly long number still compares as
// large.
func leadingNumber(s string) (int, bool) {
	n, digits := 0, 0
	for ; digits < len(s) && s[digits] >= '0' && s[digits] <= '9'; digits++ {
		if n < 1<<30 {
			n = n*10 + int(s[digits]-'0')
		}
	}
	return n, digits > 0
}

// executes reports whether the agent runs ops of this kind.
func (c Caps) executes(kind string) bool {
	return c.AgentOps == nil || c.AgentOps[kind]
}

// refuses reports whether the agent does not run op.
func (c Caps) refuses(op Op) bool { return !c.executes(op.Kind) }

// Decision is Diff's answer for one pod: its Verdict says what the change
// needs, its Mode what the manifest asks of the agent (the package doc
// tells these words from ApplyResult.Mode, what happened).
type Decision struct {
	Verdict    string         `json:"verdict"`                // a Verdict* value
	Ops        []Op           `json:"ops,omitempty"`          // the runtime ops in their safe order; runtime only
	InPlace    []Op           `json:"in_place_ops,omitempty"` // ops for the serving worker while a reload waits; any verdict
	WorkerPlan *Plan          `json:"-"`                      // the worker's plan once InPlace ran; set exactly with InPlace
	Chunks     int            `json:"chunks,omitempty"`       // the applies Ops needs (Chunk); runtime only
	Reasons    []string       `json:"reasons,omitempty"`      // reload causes and file-only notes, at most 32
	Files      []ManifestFile `json:"files"`                  // ManifestFiles(next), the complete desired set
	Mode       string         `json:"mode"`                   // ModeReload for a reload verdict, else ModeAuto
}

// ComposedOps returns every op kind Diff can emit, in Ops or InPlace, as a
// new slice. shutdown_sessions is absent on purpose: the agent issues it
// itself from its deferred-delete queue.
func ComposedOps() []string {
	return slices.DeleteFunc(slices.Clone(opKinds[:]), func(kind string) bool { return kind == OpShutdownSessions })
}

// ManifestFiles projects a plan onto the manifest's file list: one entry per
// plan file, in plan order, with the content digest as the proof. It
// returns nil only for a nil plan.
func ManifestFiles(p *Plan) []ManifestFile {
	if p == nil {
		return nil
	}
	files := make([]ManifestFile, len(p.Files))
	for i, f := range p.Files {
		files[i] = ManifestFile{Path: f.Path, Digest: f.Digest, Proof: f.Digest, Size: f.Size,
			Kind: f.Kind, ReloadOnChange: f.ReloadOnChange}
	}
	return files
}

// InventoryOf returns what a worker that reloaded p would report as loaded,
// for offline comparisons. A live diff uses the inventory the pod reports.
func InventoryOf(p *Plan) Inventory {
	var inv Inventory
	if p == nil {
		return inv
	}
	lists := map[string]*[]string{FileKindMap: &inv.Maps, FileKindCert: &inv.Certs, FileKindCA: &inv.CAFiles, FileKindCRTList: &inv.CRTLists}
	for _, f := range p.Files {
		if list := lists[f.Kind]; list != nil {
			*list = append(*list, f.Path)
		}
	}
	for _, list := range lists {
		slices.Sort(*list)
		*list = slices.Compact(*list)
	}
	return inv
}

// Chunk splits Ops into the applies actually sent. The first apply also
// carries InPlace and the 1000-op cap holds for their sum, so the first
// slice may be empty; it is still element 0. The slices share Ops' memory
// (with their capacity cut, so an append never writes into the next one).
func (d *Decision) Chunk() [][]Op {
	if d == nil || len(d.Ops) == 0 {
		return nil
	}
	first := min(max(MaxOpsPerApply-len(d.InPlace), 0), len(d.Ops))
	return slices.AppendSeq([][]Op{d.Ops[:first:first]}, slices.Chunk(d.Ops[first:], MaxOpsPerApply))
}

// chunkCount is the number of applies n ops need when the first apply also
// carries k in-place ops.
func chunkCount(n, k int) int {
	if n == 0 {
		return 0
	}
	first := min(max(MaxOpsPerApply-k, 0), n)
	return 1 + (n-first+MaxOpsPerApply-1)/MaxOpsPerApply
}

// ---------------------------------------------------------------------------
// Diff.

// Diff decides how the pod described by base reaches next: over the runtime
// API (runtime), by writing files only (file_only), or by a reload. The
// rules run in a fixed order — certificates, backends and servers,
// sections, maps, files — and every change not applied at runtime leaves a
// reason. One reload cause discards every op: the file set always carries
// the whole desired state, so a reload applies everything.
//
// Where a case is not one a runtime command can express with certainty,
// Diff fails closed (a reload), reusing the nearest reason of the contract:
//   - a word a rule would send without checking it (a kept backend's or an
//     updated server's name, a backend's mode, a server's guid, an address
//     with an unsafe IPv6 zone) is checked with SafeToken too, so no op
//     carries a word the agent would refuse;
//   - a repeated (kind, name) section — which the producer rules forbid
//     and HAProxy refuses — fails as "added" (core or profile) or as an
//     unexplained text change (backend);
//   - a server name repeated within a backend is refused as "the name is not
//     a safe runtime token": a runtime command could not name one of them;
//   - a crt-list naming one certificate on two lines cannot be edited per
//     entry (del ssl crt-list would pick one of them), so any change to it
//     fails as an entry-order change;
//   - "loaded" for crt and ca-file counts only files this diff creates of
//     the same kind (a certificate for crt, a CA file for ca-file), and no
//     created file counts for crl-file: HAProxy looks each up in its own
//     store.
func Diff(next *Plan, base *Baseline) Decision {
	if next == nil {
		return Decision{Verdict: VerdictReload, Mode: ModeReload, Reasons: []string{"no render"}}
	}
	if base == nil {
		base = &Baseline{}
	}
	d := Decision{Files: ManifestFiles(next), Verdict: VerdictReload, Mode: ModeReload}
	switch {
	case base.Applied == nil:
		d.Reasons = []string{"no baseline"}
		return d
	case base.Applied.SchemaVersion != next.SchemaVersion:
		d.Reasons = []string{fmt.Sprintf("baseline plan schema %d, render schema %d", base.Applied.SchemaVersion, next.SchemaVersion)}
		return d
	}

	nx := indexPlan(next)
	r, ops := decide(next, nx, base, indexPlan(base.Applied))

	worker := base.WorkerOps
	if worker != nil && worker.SchemaVersion == next.SchemaVersion && (base.ReloadPending || r.failed) {
		d.InPlace, d.WorkerPlan = composeInPlace(r, base)
	}
	if chunkCount(len(ops), len(d.InPlace)) > MaxOpBatches {
		r.fail("op cap: %d ops need more than %d applies", len(ops), MaxOpBatches)
	}

	d.Reasons = r.reasons
	switch {
	case r.failed:
	case len(ops) > 0:
		d.Verdict, d.Mode = VerdictRuntime, ModeAuto
		d.Ops, d.Chunks = ops, chunkCount(len(ops), len(d.InPlace))
	default:
		d.Verdict, d.Mode = VerdictFileOnly, ModeAuto
	}
	return d
}

// decide runs every rule of a usable baseline, then checks that the agent
// advertises every op kind the rules chose. The nested diff of in-place
// composition calls it again with the worker as the applied plan, reusing the
// render's index.
func decide(next *Plan, nx *planIndex, base *Baseline, px *planIndex) (*diffRun, []Op) {
	r := &diffRun{next: next, prev: base.Applied, nx: nx, px: px, caps: base.Caps,
		inv: inventorySetsOf(base.Inventory), certDir: certDirOf(next),
		createdCerts: map[string]bool{}, createdCAs: map[string]bool{}, deleted: map[string]bool{},
		pendingServers: base.PendingServerDeletes, pendingBackends: base.PendingBackendDeletes}
	r.certificates()
	r.backends()
	r.sections()
	r.maps()
	r.files()

	ops := r.ops()
	if i := slices.IndexFunc(ops, r.caps.refuses); i >= 0 {
		r.fail("the agent does not execute %s", ops[i].Kind)
	}
	return r, ops
}

// Op groups, in emission order: everything the new state needs exists and
// is published before anything old goes away, and certificates come first
// because add server ... crt and add ssl crt-list need them loaded.
const (
	groupCertificates = iota
	groupBackendAdd
	groupServerUpdate
	groupBackendPublish
	groupMapUpsert
	groupCRTLists
	groupMapDelete
	groupBackendUnpublish
	groupServerDelete
	groupBackendDelete
	opGroups
)

// diffRun is the state of one Diff call. It lives for that call only.
type diffRun struct {
	next, prev *Plan
	nx, px     *planIndex
	caps       Caps
	inv        inventorySets

	createdCerts    map[string]bool // certificates this diff creates (cert_new)
	createdCAs      map[string]bool // CA files this diff creates (ca_new)
	certDir         string          // where a relative crt argument is also looked for
	pendingServers  int             // deferred server deletes: the pod's plus this diff's
	pendingBackends int             // deferred backend deletes: the pod's plus this diff's
	deleted         map[string]bool // backends this diff deletes
	sectionChange   bool            // a section rule saw a change; it explains a new haproxy.cfg

	failed  bool
	reasons []string
	groups  [opGroups][]Op
}

// fail records a reload cause.
func (r *diffRun) fail(format string, args ...any) {
	r.failed = true
	r.note(format, args...)
}

// note records a change that is written to disk but not applied at runtime.
func (r *diffRun) note(format string, args ...any) {
	if len(r.reasons) < maxReasons {
		r.reasons = append(r.reasons, fmt.Sprintf(format, args...))
	}
}

func (r *diffRun) emit(group int, ops ...Op) {
	r.groups[group] = append(r.groups[group], ops...)
}

// ops concatenates the groups in order into one new slice, nil when empty.
func (r *diffRun) ops() []Op { return slices.Concat(r.groups[:]...) }

// planIndex is one call's lookup tables over a plan, so that no rule scans
// a list inside a loop. It is never kept across calls: a plan changed and
// re-identified would meet a stale index.
type planIndex struct {
	files           map[string]int     // path -> index in Files (first)
	sections        map[sectionKey]int // non-backend sections, kind normalised -> index (first)
	backendSections map[string]int     // backend name -> index of its first backend section
}

type sectionKey struct{ kind, name string }

func indexPlan(p *Plan) *planIndex {
	x := &planIndex{
		files:           firstIndex(p.Files, func(f *PlanFile) string { return f.Path }),
		sections:        map[sectionKey]int{},
		backendSections: make(map[string]int, len(p.Backends)),
	}
	for i := range p.Sections {
		s := &p.Sections[i]
		if kind := sectionKindOf(s.Kind); kind == SectionKindBackend {
			if _, dup := x.backendSections[s.Name]; !dup {
				x.backendSections[s.Name] = i
			}
		} else if _, dup := x.sections[sectionKey{kind, s.Name}]; !dup {
			x.sections[sectionKey{kind, s.Name}] = i
		}
	}
	return x
}

// firstIndex maps each key of items to the index of its first item.
func firstIndex[T any](items []T, key func(*T) string) map[string]int {
	index := make(map[string]int, len(items))
	for i := range items {
		k := key(&items[i])
		if _, dup := index[k]; !dup {
			index[k] = i
		}
	}
	return index
}

// serverIndex maps each server name to its first server line.
func serverIndex(servers []Server) map[string]int {
	return firstIndex(servers, func(s *Server) string { return s.Name })
}

// file returns the plan's file at path, or nil.
func (x *planIndex) file(p *Plan, filePath string) *PlanFile {
	if i, ok := x.files[filePath]; ok {
		return &p.Files[i]
	}
	return nil
}

// sectionKindOf maps any kind other than profile and backend to core.
func sectionKindOf(kind string) string {
	if kind == SectionKindProfile || kind == SectionKindBackend {
		return kind
	}
	return SectionKindCore
}

// inventorySets is the pod's inventory as sets. Generation is not read.
type inventorySets struct {
	maps, certs, caFiles, crlFiles, crtLists map[string]bool
}

func inventorySetsOf(inv Inventory) inventorySets {
	set := func(list []string) map[string]bool {
		s := make(map[string]bool, len(list))
		for _, v := range list {
			s[v] = true
		}
		return s
	}
	return inventorySets{maps: set(inv.Maps), certs: set(inv.Certs), caFiles: set(inv.CAFiles),
		crlFiles: set(inv.CRLFiles), crtLists: set(inv.CRTLists)}
}

// certDirOf is the directory of the render's first certificate not at the
// top level: HAProxy resolves a relative crt argument under crt-base, and
// the render keeps its certificates there.
func certDirOf(p *Plan) string {
	for i := range p.Files {
		if dir := path.Dir(p.Files[i].Path); p.Files[i].Kind == FileKindCert && dir != "." {
			return dir
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// Comparing content: exact bytes when both sides have them, digests
// otherwise, so that a baseline rebuilt from a plan blob (digests only)
// still recognises an identical render.

func sameFileContent(a, b *PlanFile) bool {
	return a != nil && b != nil && proven(a.ContentKnown && b.ContentKnown, a.Content == b.Content, a.Digest, b.Digest)
}

func sameSectionText(a, b *Section) bool {
	return a != nil && b != nil && proven(a.TextKnown && b.TextKnown, a.Text == b.Text, a.TextDigest, b.TextDigest)
}

// sameBackendBody counts two empty digests as changed: an unknown body is
// never proven equal.
func sameBackendBody(a, b *Backend) bool {
	return proven(a.ContentKnown && b.ContentKnown, slices.Equal(a.Body, b.Body), a.BodyDigest, b.BodyDigest)
}

// sameBackendComments counts two empty digests as equal: comments change
// no behaviour, so a backend without any is not a change.
func sameBackendComments(a, b *Backend) bool {
	if a.ContentKnown && b.ContentKnown {
		return slices.Equal(a.Comments, b.Comments)
	}
	return a.CommentsDigest == b.CommentsDigest
}

func sameBackendRecord(a, b *Backend) bool {
	return proven(a.ContentKnown && b.ContentKnown, a.EqualRecord(b), a.RecordDigest, b.RecordDigest)
}

// proven is the exact comparison when both sides hold the content, and
// otherwise equal digests, where an empty digest proves nothing.
func proven(bothKnown, exactlyEqual bool, digestA, digestB string) bool {
	if bothKnown {
		return exactlyEqual
	}
	return digestA != "" && digestA == digestB
}

// ---------------------------------------------------------------------------
// Certificates, CA files and crt-lists (first, so that a server keyword
// can name a certificate this diff creates).

func (r *diffRun) certificates() {
	for i := range r.next.Files {
		f := &r.next.Files[i]
		old := r.px.file(r.prev, f.Path)
		if old != nil && sameFileContent(old, f) {
			continue
		}
		switch f.Kind {
		case FileKindCert:
			r.certificateFile(f.Path, OpCertSet, OpCertNew, r.inv.certs, r.createdCerts)
		case FileKindCA:
			r.certificateFile(f.Path, OpCASet, OpCANew, r.inv.caFiles, r.createdCAs)
		case FileKindCRTList:
			if old == nil {
				r.fail("crt-list %s added, which only a reload puts into the config", f.Path)
				continue
			}
			r.crtList(f.Path)
		}
	}
	for i := range r.prev.Files {
		f := &r.prev.Files[i]
		if f.Kind == FileKindCRTList && r.nx.file(r.next, f.Path) == nil {
			r.fail("crt-list %s removed, which only a reload takes out of the config", f.Path)
		}
	}
}

// certificateFile updates a loaded certificate (or CA file) in place, or
// creates it; a created path counts as loaded for the rest of this diff.
func (r *diffRun) certificateFile(filePath, setKind, newKind string, loaded, created map[string]bool) {
	switch {
	case !SafeToken(filePath):
		r.fail("file %s is not a safe runtime token", filePath)
	case loaded[filePath] || created[filePath]:
		r.emit(groupCertificates, Op{Kind: setKind, Path: filePath})
	default:
		r.emit(groupCertificates, Op{Kind: newKind, Path: filePath})
		created[filePath] = true
	}
}

func (r *diffRun) crtList(listPath string) {
	prev, okPrev := r.prev.CRTLists[listPath]
	next, okNext := r.next.CRTLists[listPath]
	switch ops, refusal := crtListOps(listPath, prev.Entries, next.Entries); {
	case !okPrev || !okNext:
		r.fail("crt-list %s changed, but crt-list entries are not declared by the render yet", listPath)
	case !r.inv.crtLists[listPath]:
		r.note("crt-list %s is not loaded at runtime, its file is written only", listPath)
	case !SafeToken(listPath):
		r.fail("file %s is not a safe runtime token", listPath)
	case refusal != "":
		r.fail("crt-list %s: %s", listPath, refusal)
	default:
		r.emit(groupCRTLists, ops...)
	}
}

// crtListOps edits a loaded crt-list entry by entry. add ssl crt-list only
// appends and the first entry is the default certificate when no SNI
// matches, so only appends, removals and changes to the last entry stay at
// runtime; anything else is refused with the reason.
func crtListOps(listPath string, prev, next []CRTListEntry) ([]Op, string) {
	for _, e := range next {
		if !SafeToken(e.Cert) {
			return nil, fmt.Sprintf("certificate %s is not a safe runtime token", e.Cert)
		}
		if i := slices.IndexFunc(e.Options, func(o KeywordArg) bool { return !SafeToken(o.Name) || !allSafeTokens(o.Args) }); i >= 0 {
			return nil, fmt.Sprintf("option %s is not a safe runtime token", e.Options[i].Name)
		}
		if i := slices.IndexFunc(e.SNIFilters, func(sni string) bool { return !SafeToken(sni) }); i >= 0 {
			return nil, fmt.Sprintf("SNI filter %s is not a safe runtime token", e.SNIFilters[i])
		}
	}
	const orderChanged = "the entry order changed, which only a reload applies"
	certOf := func(e *CRTListEntry) string { return e.Cert }
	prevByCert, nextByCert := firstIndex(prev, certOf), firstIndex(next, certOf)
	if len(prevByCert) < len(prev) || len(nextByCert) < len(next) {
		return nil, orderChanged // a certificate named on two lines
	}

	var ops []Op
	// The running order after the ops: the certificates kept unchanged, in
	// prev order, then every changed or new one in next order (each
	// crtlist_add appends).
	running := make([]string, 0, len(prev)+len(next))
	for _, e := range prev {
		ni, kept := nextByCert[e.Cert]
		if !kept {
			if !SafeToken(e.Cert) {
				return nil, fmt.Sprintf("certificate %s is not a safe runtime token", e.Cert)
			}
			ops = append(ops, Op{Kind: OpCRTListDel, Path: listPath, Cert: e.Cert})
			continue
		}
		if sameCRTListEntry(&e, &next[ni]) {
			running = append(running, e.Cert)
		}
	}
	for i := range next {
		e := &next[i]
		pi, had := prevByCert[e.Cert]
		if had && sameCRTListEntry(&prev[pi], e) {
			continue
		}
		if had {
			ops = append(ops, Op{Kind: OpCRTListDel, Path: listPath, Cert: e.Cert})
		}
		ops = append(ops, Op{Kind: OpCRTListAdd, Path: listPath, Cert: e.Cert,
			Options: freshKeywords(e.Options), SNIFilters: freshStrings(e.SNIFilters)})
		running = append(running, e.Cert)
	}
	if !slices.EqualFunc(running, next, func(cert string, e CRTListEntry) bool { return cert == e.Cert }) {
		return nil, orderChanged
	}
	return ops, ""
}

func sameCRTListEntry(a, b *CRTListEntry) bool {
	return EqualKeywordArgs(a.Options, b.Options) && slices.Equal(a.SNIFilters, b.SNIFilters)
}

// ---------------------------------------------------------------------------
// Backends (before sections, so that a profile removal sees which
// backends this diff deletes).

func (r *diffRun) backends() {
	for i := range r.next.Sections {
		s := &r.next.Sections[i]
		if sectionKindOf(s.Kind) != SectionKindBackend {
			continue
		}
		next, described := r.next.Backends[s.Name]
		pi, inPrev := r.px.backendSections[s.Name]
		prev, prevDescribed := r.prev.Backends[s.Name]
		switch {
		case r.nx.backendSections[s.Name] != i:
			r.fail("backend %s: unexplained text change", s.Name)
		case !described:
			r.fail("backend %s: section without a record", s.Name)
		case !inPrev || !prevDescribed:
			r.addBackend(s.Name, &next)
		default:
			r.keptBackend(s.Name, &r.prev.Sections[pi], s, &prev, &next)
			continue // keptBackend knows whether the text changed
		}
		r.sectionChange = true
	}
	for i := range r.prev.Sections {
		s := &r.prev.Sections[i]
		_, inNext := r.nx.backendSections[s.Name]
		prev, described := r.prev.Backends[s.Name]
		if sectionKindOf(s.Kind) == SectionKindBackend && r.px.backendSections[s.Name] == i && !inNext && described {
			r.sectionChange = true
			r.removeBackend(s.Name, &prev)
		}
	}
}

// addBackend creates a dynamic backend from its profile, adds its servers
// and publishes it; structural backends and unsafe words reload.
func (r *diffRun) addBackend(name string, b *Backend) {
	_, hasProfile := r.prev.Profiles[b.Profile]
	var refusal string
	switch {
	case b.Shape != ShapeDynamic:
		refusal = structuralShape(b)
	case !r.caps.DynamicBackends:
		refusal = "this HAProxy has no add backend"
	case !SafeToken(name) || !SafeToken(b.Profile) ||
		b.GUID != "" && !SafeToken(b.GUID) || b.Mode != "" && !SafeToken(b.Mode):
		refusal = "the name, profile or guid is not a safe runtime token"
	case !hasProfile:
		refusal = fmt.Sprintf("profile %q is not in the running config", b.Profile)
	}
	ops := []Op{{Kind: OpBackendAdd, Backend: name, Profile: b.Profile, Mode: b.Mode, GUID: b.GUID}}
	names := make(map[string]bool, len(b.Servers))
	for i := 0; i < len(b.Servers) && refusal == ""; i++ {
		var serverOps []Op
		if refusal = refuseRepeatedName(names, b.Servers[i].Name); refusal == "" {
			serverOps, refusal = r.addServer(name, b, &b.Servers[i])
		}
		ops = append(ops, serverOps...)
	}
	if refusal != "" {
		r.fail("backend %s added: %s", name, refusal)
		return
	}
	r.emit(groupBackendAdd, ops...)
	r.emit(groupBackendPublish, Op{Kind: OpBackendPublish, Backend: name})
}

// removeBackend unpublishes a dynamic backend, removes its servers and
// deletes it once it is removable: all deferred, all counted against the
// pod's delete queue. A refusal composes none of it.
func (r *diffRun) removeBackend(name string, b *Backend) {
	var refusal string
	switch {
	case b.Shape != ShapeDynamic:
		refusal = structuralShape(b)
	case !r.caps.DynamicBackends:
		refusal = "this HAProxy has no del backend"
	case r.pendingBackends >= MaxPendingBackendDeletes:
		refusal = fmt.Sprintf("%d backend deletes already pending", r.pendingBackends)
	case !SafeToken(name):
		refusal = "the name is not a safe runtime token"
	}
	pendingBefore := r.pendingServers
	var serverOps []Op
	for i := 0; i < len(b.Servers) && refusal == ""; i++ {
		var ops []Op
		ops, refusal = r.removeServer(name, &b.Servers[i])
		serverOps = append(serverOps, ops...)
	}
	if refusal != "" {
		r.pendingServers = pendingBefore
		r.fail("backend %s removed: %s", name, refusal)
		return
	}
	r.emit(groupBackendUnpublish, Op{Kind: OpBackendUnpublish, Backend: name})
	r.emit(groupServerDelete, serverOps...)
	r.emit(groupBackendDelete,
		Op{Kind: OpBackendWaitRemovable, Backend: name, TimeoutMs: removableTimeoutMs},
		Op{Kind: OpBackendDel, Backend: name})
	r.deleted[name] = true
	r.pendingBackends++
}

// structuralShape is the refusal of a backend that is not dynamic, with
// the producer's reason when it gave one.
func structuralShape(b *Backend) string {
	if b.ShapeReason != "" {
		return "structural shape, " + b.ShapeReason
	}
	return "structural shape"
}

// keptBackend decides a backend present in both plans: a text change must be
// explained by the record or the comments, the body and the backend's own
// attributes cannot change at runtime, and the servers are diffed one by
// one.
func (r *diffRun) keptBackend(name string, prevSection, nextSection *Section, prev, next *Backend) {
	textChanged := !sameSectionText(prevSection, nextSection)
	r.sectionChange = r.sectionChange || textChanged
	sameRecord := sameBackendRecord(prev, next)
	switch attribute := changedBackendAttribute(prev, next); {
	case !sameBackendBody(prev, next):
		r.fail("backend %s: body changed", name)
	case textChanged && sameRecord && sameBackendComments(prev, next):
		r.fail("backend %s: unexplained text change", name)
	case sameRecord:
	case attribute != "":
		r.fail("backend %s: %s changed, which HAProxy cannot alter at runtime", name, attribute)
	default:
		r.servers(name, prev, next)
	}
}

// changedBackendAttribute names the first backend attribute that differs,
// in the contract's order, or returns "".
func changedBackendAttribute(prev, next *Backend) string {
	switch {
	case prev.Profile != next.Profile:
		return "profile"
	case prev.Mode != next.Mode:
		return "mode"
	case prev.GUID != next.GUID:
		return "guid"
	case prev.Balance != next.Balance:
		return "balance"
	case prev.HashType != next.HashType:
		return "hash-type"
	case prev.Shape != next.Shape:
		return "shape"
	case !EqualKeywordArgs(prev.DefaultServer, next.DefaultServer):
		return "default-server"
	}
	return ""
}

// ---------------------------------------------------------------------------
// Servers.

// servers diffs the servers of a kept backend by name: updates and adds in
// next's order, then removals in prev's order. Each refusal records its own
// reason; the other servers are still diffed.
func (r *diffRun) servers(name string, prev, next *Backend) {
	prevByName := serverIndex(prev.Servers)
	nextNames := make(map[string]bool, len(next.Servers))
	for i := range next.Servers {
		s := &next.Servers[i]
		var ops []Op
		refusal := refuseRepeatedName(nextNames, s.Name)
		if refusal == "" {
			if pi, ok := prevByName[s.Name]; ok {
				ops, refusal = r.updateServer(name, next, &prev.Servers[pi], s)
			} else {
				ops, refusal = r.addServer(name, next, s)
			}
		}
		if refusal != "" {
			r.fail("backend %s/server %s: %s", name, s.Name, refusal)
			continue
		}
		r.emit(groupServerUpdate, ops...)
	}
	for i := range prev.Servers {
		s := &prev.Servers[i]
		if nextNames[s.Name] || prevByName[s.Name] != i {
			continue
		}
		ops, refusal := r.removeServer(name, s)
		if refusal != "" {
			r.fail("backend %s/server %s: %s", name, s.Name, refusal)
			continue
		}
		r.emit(groupServerDelete, ops...)
	}
}

// refuseRepeatedName records name in seen and refuses it when it is
// already there: a runtime command could not tell the two servers apart.
func refuseRepeatedName(seen map[string]bool, name string) string {
	if seen[name] {
		return "the name is not a safe runtime token"
	}
	seen[name] = true
	return ""
}

// addServer composes add server for s in backend be (whose balance,
// hash-type and default-server apply), or returns the refusal. A server
// that is not disabled is then enabled, with its health check when it has
// one; a disabled server stays in MAINT.
func (r *diffRun) addServer(backend string, be *Backend, s *Server) ([]Op, string) {
	switch refusal := endpointRefusal(s.Address, s.Port); {
	case !r.caps.DynamicServers:
		return nil, "this HAProxy has no add server"
	case !balanceTakesDynamicServers(be.Balance, be.HashType):
		return nil, fmt.Sprintf("balance %q takes no dynamic server", be.Balance)
	case !SafeToken(s.Name) || !SafeToken(backend):
		return nil, "the name is not a safe runtime token"
	case refusal != "":
		return nil, refusal
	}
	keywords := mergeKeywords(be.DefaultServer, s.Extra)
	if i := slices.IndexFunc(keywords, func(kw KeywordArg) bool { return !r.dynamicServerKeyword(kw) }); i >= 0 {
		return nil, fmt.Sprintf("keyword %s cannot be set on a dynamic server", keywords[i].Name)
	}
	if s.Weight != nil && !hasKeyword(keywords, "weight") {
		keywords = append(keywords, KeywordArg{Name: "weight", Args: []string{strconv.Itoa(*s.Weight)}})
	}
	if s.GUID != "" && !hasKeyword(keywords, "guid") {
		if !SafeToken(s.GUID) {
			return nil, "keyword guid cannot be set on a dynamic server"
		}
		keywords = append(keywords, KeywordArg{Name: "guid", Args: []string{s.GUID}})
	}
	check := hasKeyword(keywords, "check")
	if r.caps.ServerInitState && check && !hasKeyword(keywords, "init-state") {
		keywords = append(keywords, KeywordArg{Name: "init-state", Args: []string{"up"}})
	}
	ops := []Op{{Kind: OpServerAdd, Backend: backend, Server: s.Name, Address: s.Address, Port: s.Port, Keywords: keywords}}
	if !s.Disabled {
		ops = append(ops, Op{Kind: OpServerEnable, Backend: backend, Server: s.Name, Health: check})
	}
	return ops, ""
}

// updateServer composes the set server commands that turn prev into next,
// in the order address, weight, state, or returns the refusal. be is the
// backend record whose default-server merges into the server's keywords.
func (r *diffRun) updateServer(backend string, be *Backend, prev, next *Server) ([]Op, string) {
	if prev.GUID != next.GUID || !EqualKeywordArgs(prev.Extra, next.Extra) {
		return nil, "keywords changed, which set server cannot express"
	}
	var ops []Op
	if prev.Address != next.Address || prev.Port != next.Port {
		if refusal := endpointRefusal(next.Address, next.Port); refusal != "" {
			return nil, refusal
		}
		ops = append(ops, Op{Kind: OpServerSetAddr, Backend: backend, Server: next.Name, Address: next.Address, Port: next.Port})
	}
	if !sameWeight(prev.Weight, next.Weight) {
		if next.Weight == nil {
			return nil, "the weight keyword was dropped, which set server cannot express"
		}
		weight := *next.Weight
		ops = append(ops, Op{Kind: OpServerSetWeight, Backend: backend, Server: next.Name, Weight: &weight})
	}
	switch {
	case !prev.Disabled && next.Disabled:
		ops = append(ops, Op{Kind: OpServerSetState, Backend: backend, Server: next.Name, State: ServerStateMaint})
	case prev.Disabled && !next.Disabled:
		// Leaving MAINT is server_enable: "set server ... state ready"
		// would leave the health check off.
		check := hasKeyword(be.DefaultServer, "check") || hasKeyword(next.Extra, "check")
		ops = append(ops, Op{Kind: OpServerEnable, Backend: backend, Server: next.Name, Health: check})
	}
	if len(ops) > 0 && (!SafeToken(backend) || !SafeToken(next.Name)) {
		return nil, "the name is not a safe runtime token"
	}
	return ops, ""
}

// removeServer composes a deferred delete: disable now, delete once
// removable. It counts against the pod's server delete queue.
func (r *diffRun) removeServer(backend string, s *Server) ([]Op, string) {
	switch {
	case !r.caps.DynamicServers:
		return nil, "this HAProxy has no del server"
	case r.pendingServers >= MaxPendingServerDeletes:
		return nil, fmt.Sprintf("%d server deletes already pending", r.pendingServers)
	case !SafeToken(s.Name) || !SafeToken(backend):
		return nil, "the name is not a safe runtime token"
	}
	r.pendingServers++
	return []Op{
		{Kind: OpServerDisable, Backend: backend, Server: s.Name},
		{Kind: OpServerWaitRemovable, Backend: backend, Server: s.Name, TimeoutMs: removableTimeoutMs},
		{Kind: OpServerDel, Backend: backend, Server: s.Name},
	}, ""
}

// balanceTakesDynamicServers reports whether HAProxy lets add server into a
// backend with this algorithm: the map-based algorithms always do, except
// static-rr; a hashing algorithm only with consistent hashing.
func balanceTakesDynamicServers(balance, hashType string) bool {
	algorithm := firstWord(balance)
	if i := strings.IndexByte(algorithm, '('); i >= 0 {
		algorithm = algorithm[:i]
	}
	switch algorithm {
	case "", "roundrobin", "leastconn", "random", "first":
		return true
	case "static-rr":
		return false
	}
	return firstWord(hashType) == "consistent"
}

func firstWord(s string) string {
	s = strings.TrimLeft(s, " \t")
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

// endpointRefusal checks what set server addr and add server accept: a
// literal IP (the runtime API resolves no names) and a port in 1-65535.
func endpointRefusal(address string, port int) string {
	if _, err := netip.ParseAddr(address); err != nil || !SafeToken(address) {
		return fmt.Sprintf("address %s is not an IP, which the runtime API requires", address)
	}
	if port < 1 || port > 65535 {
		return "the port is outside 1-65535"
	}
	return ""
}

// mergeKeywords is what the server line means: the default-server keywords
// first, a server keyword replacing the default of the same name in place,
// every other server keyword appended in order. The result owns its memory.
func mergeKeywords(defaults, extra []KeywordArg) []KeywordArg {
	merged := make([]KeywordArg, 0, len(defaults)+len(extra))
	for _, kw := range defaults {
		merged = append(merged, KeywordArg{Name: kw.Name, Args: freshStrings(kw.Args)})
	}
	replaced := make([]bool, len(defaults))
	for _, kw := range extra {
		kw = KeywordArg{Name: kw.Name, Args: freshStrings(kw.Args)}
		i := slices.IndexFunc(defaults, func(d KeywordArg) bool { return d.Name == kw.Name })
		if i >= 0 && !replaced[i] {
			merged[i], replaced[i] = kw, true
			continue
		}
		merged = append(merged, kw)
	}
	return merged
}

func hasKeyword(keywords []KeywordArg, name string) bool {
	return slices.ContainsFunc(keywords, func(kw KeywordArg) bool { return kw.Name == name })
}

// dynamicServerKeyword reports whether add server accepts kw on this pod:
// a keyword of the add-server set, init-state only from 3.1, every word
// safe, and file keywords naming one file HAProxy has loaded (or this diff
// creates).
func (r *diffRun) dynamicServerKeyword(kw KeywordArg) bool {
	if !addServerKeyword(kw.Name) || !SafeToken(kw.Name) || !allSafeTokens(kw.Args) {
		return false
	}
	switch kw.Name {
	case "init-state":
		return r.caps.ServerInitState
	case "crt":
		if len(kw.Args) != 1 {
			return false
		}
		file := kw.Args[0]
		if r.inv.certs[file] || r.createdCerts[file] {
			return true
		}
		// A relative crt is resolved under crt-base: try the render's
		// certificate directory. The keyword is still sent as written.
		if r.certDir == "" || strings.HasPrefix(file, "/") {
			return false
		}
		under := r.certDir + "/" + file
		return r.inv.certs[under] || r.createdCerts[under]
	case "ca-file":
		return len(kw.Args) == 1 && (r.inv.caFiles[kw.Args[0]] || r.createdCAs[kw.Args[0]])
	case "crl-file":
		return len(kw.Args) == 1 && r.inv.crlFiles[kw.Args[0]]
	}
	return true
}

// addServerKeyword is the set of keywords HAProxy's add server accepts
// on HAProxy 2.6 and later, with the same meaning as in a server line of
// the configuration. Anything else makes the server, and a backend that
// holds it, a reload: HAProxy would refuse the command or give the server a
// different default than the configuration does.
func addServerKeyword(name string) bool {
	switch name {
	case "check", "inter", "fastinter", "downinter", "rise", "fall", "port", "addr", "weight",
		"maxconn", "maxqueue", "minconn", "backup", "cookie", "guid", "ssl", "sni", "verify",
		"verifyhost", "ca-file", "crt", "crl-file", "alpn", "ciphers", "ciphersuites",
		"ssl-min-ver", "ssl-max-ver", "proto", "send-proxy", "send-proxy-v2", "slowstart",
		"agent-check", "agent-port", "agent-inter", "agent-send", "on-marked-down", "observe",
		"disabled", "init-state":
		return true
	}
	return false
}

func allSafeTokens(words []string) bool {
	return !slices.ContainsFunc(words, func(w string) bool { return !SafeToken(w) })
}

// freshStrings copies a list for an op; an empty list becomes nil.
func freshStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

// freshKeywords deep-copies keywords for an op; an empty list becomes nil.
func freshKeywords(kws []KeywordArg) []KeywordArg {
	if len(kws) == 0 {
		return nil
	}
	return cloneKeywordArgs(kws)
}

// ---------------------------------------------------------------------------
// Sections and profiles: the section guard.

func (r *diffRun) sections() {
	for i := range r.next.Sections {
		s := &r.next.Sections[i]
		key := sectionKey{sectionKindOf(s.Kind), s.Name}
		if key.kind == SectionKindBackend {
			continue
		}
		var old *Section
		if pi, ok := r.px.sections[key]; ok && r.nx.sections[key] == i {
			old = &r.prev.Sections[pi]
		}
		switch kind := key.kind; {
		case old == nil && kind == SectionKindProfile:
			r.fail("profile %s added", s.Name)
		case old == nil:
			r.fail("core section %s added", s.Name)
		case sameSectionText(old, s):
			continue
		case kind == SectionKindProfile:
			r.fail("profile %s changed", s.Name)
		default:
			r.fail("core section %s changed", s.Name)
		}
		r.sectionChange = true
	}
	for i := range r.prev.Sections {
		s := &r.prev.Sections[i]
		key := sectionKey{sectionKindOf(s.Kind), s.Name}
		_, kept := r.nx.sections[key]
		switch {
		case key.kind == SectionKindBackend || r.px.sections[key] != i || kept:
			continue
		case key.kind == SectionKindCore:
			r.fail("core section %s removed", s.Name)
		default:
			r.profileRemoved(s.Name)
		}
		r.sectionChange = true
	}
}

// profileRemoved allows a profile to go only when no backend of the render
// uses it and every backend that used it is deleted by this diff: HAProxy
// cannot drop a defaults section a live backend inherits from.
func (r *diffRun) profileRemoved(profile string) {
	if user := firstProfileUser(r.next, r.nx, profile, nil); user != "" {
		r.fail("profile %s removed but backend %s still uses it", profile, user)
		return
	}
	if user := firstProfileUser(r.prev, r.px, profile, r.deleted); user != "" {
		r.fail("profile %s removed but backend %s is not deleted at runtime", profile, user)
	}
}

// firstProfileUser returns the first backend described in p (document
// order) that inherits profile and is not in skip.
func firstProfileUser(p *Plan, x *planIndex, profile string, skip map[string]bool) string {
	for i := range p.Sections {
		s := &p.Sections[i]
		if b, ok := p.Backends[s.Name]; ok && b.Profile == profile && !skip[s.Name] &&
			sectionKindOf(s.Kind) == SectionKindBackend && x.backendSections[s.Name] == i {
			return s.Name
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// Maps.

func (r *diffRun) maps() {
	for _, name := range slices.Sorted(maps.Keys(r.next.Maps)) {
		m := r.next.Maps[name]
		old, had := r.prev.Maps[name]
		if had && sameFileContent(r.px.file(r.prev, name), r.nx.file(r.next, name)) {
			continue
		}
		switch mapPath := runtimeMapPath(name, &m); {
		case !r.inv.maps[mapPath]:
			r.note("map %s is not loaded at runtime, its file is written only", name)
		case !SafeToken(mapPath):
			r.fail("map %s: the path is not a safe runtime token", name)
		default:
			upserts, deletes := mapDelta(mapPath, m.Ordered, old.Entries, m.Entries)
			r.emit(groupMapUpsert, upserts...)
			r.emit(groupMapDelete, deletes...)
		}
	}
}

// runtimeMapPath is the name HAProxy knows the map by.
func runtimeMapPath(name string, m *Map) string {
	if m.Path != "" {
		return m.Path
	}
	return name
}

// mapDelta returns the ops that turn a loaded map's prev entries into next:
// upserts (map_add, map_set) and deletes (map_del), or a single map_replace
// in upserts when the change is not expressible entry by entry. A value
// set map cannot carry is never a map_del then map_add, which would leave
// the key absent between the two commands, so that traffic matching it
// would briefly fall through to the default. Where order between keys does
// not matter, a new key may be added anywhere.
func mapDelta(mapPath string, ordered bool, prev, next []MapEntry) (upserts, deletes []Op) {
	prefix, suffix, ok := trimCommonEntries(prev, next)
	if !ok {
		prefix, suffix = 0, 0
	}
	prevWindow, nextWindow := prev[prefix:len(prev)-suffix], next[prefix:len(next)-suffix]
	if !ordered {
		return keyedMapDelta(mapPath, groupEntries(prevWindow), groupEntries(nextWindow), 0)
	}
	// A key that first occurs in the trimmed suffix is kept after the
	// window, so nothing may be appended from the window.
	keptAfter := func() bool {
		if suffix == 0 {
			return false
		}
		before := make(map[string]bool, prefix)
		for _, e := range prev[:prefix] {
			before[e.Key] = true
		}
		return slices.ContainsFunc(prev[len(prev)-suffix:], func(e MapEntry) bool { return !before[e.Key] })
	}
	return orderedMapDelta(mapPath, prevWindow, nextWindow, keptAfter)
}

// wholeMap is the one op of a map replaced atomically from its file.
func wholeMap(mapPath string) ([]Op, []Op) {
	return []Op{{Kind: OpMapReplace, Path: mapPath}}, nil
}

// keyedEntries groups a map's entries by key: keys in order of first
// appearance, each with its values in file order (duplicates kept, since
// HAProxy answers the first matching entry).
type keyedEntries struct {
	keys   []string
	values map[string][]string
}

func groupEntries(entries []MapEntry) keyedEntries {
	g := keyedEntries{values: make(map[string][]string, len(entries))}
	for _, e := range entries {
		values, seen := g.values[e.Key]
		if !seen {
			g.keys = append(g.keys, e.Key)
		}
		g.values[e.Key] = append(values, e.Value)
	}
	return g
}

// sendableMapKey reports whether a key and its values can travel in map
// ops at all: the key as one word, the values in a payload.
func sendableMapKey(key string, values []string) bool {
	return SafeToken(key) && !slices.ContainsFunc(values, func(v string) bool { return !SafePayloadValue(v) })
}

// keyedMapDelta applies the per-key rules shared by both kinds of map. A
// new key is added (one map_add per value, the payload form) when its
// position among next's keys is at least appendFrom, and replaces the map
// otherwise; a changed single value that set map can carry is a map_set;
// anything else — a value set map would mangle, a change in a key's
// number of values, a multi-valued key, a word no command can carry — is
// one map_replace.
func keyedMapDelta(mapPath string, p, n keyedEntries, appendFrom int) (upserts, deletes []Op) {
	for i, key := range n.keys {
		values := n.values[key]
		old, had := p.values[key]
		switch {
		case had && slices.Equal(old, values):
		case !sendableMapKey(key, values):
			return wholeMap(mapPath)
		case !had && i >= appendFrom:
			for _, v := range values {
				upserts = append(upserts, Op{Kind: OpMapAdd, Path: mapPath, Key: key, Value: v})
			}
		case !had:
			return wholeMap(mapPath)
		case len(old) == 1 && len(values) == 1 && SafeToken(values[0]):
			upserts = append(upserts, Op{Kind: OpMapSet, Path: mapPath, Key: key, Value: values[0]})
		default:
			return wholeMap(mapPath)
		}
	}
	for _, key := range p.keys {
		if _, kept := n.values[key]; kept {
			continue
		}
		if !SafeToken(key) {
			return wholeMap(mapPath)
		}
		deletes = append(deletes, Op{Kind: OpMapDel, Path: mapPath, Key: key})
	}
	return upserts, deletes
}

// trimCommonEntries measures the common prefix and suffix of two entry
// lists, so that a one-line change to a large map costs one scan instead of
// two groupings of the windows between them. It refuses (ok false) when a
// key of either window also occurs in the trimmed part: that key's value
// list spans both, and only the full compare sees it. When it succeeds, the
// unordered delta of the windows equals the delta of the whole lists, and
// so does the ordered delta once it knows whether a key of the suffix is
// kept after the window.
func trimCommonEntries(prev, next []MapEntry) (prefix, suffix int, ok bool) {
	for prefix < len(prev) && prefix < len(next) && prev[prefix] == next[prefix] {
		prefix++
	}
	for suffix < len(prev)-prefix && suffix < len(next)-prefix &&
		prev[len(prev)-1-suffix] == next[len(next)-1-suffix] {
		suffix++
	}
	prevWindow, nextWindow := prev[prefix:len(prev)-suffix], next[prefix:len(next)-suffix]
	if prefix == 0 && suffix == 0 {
		return 0, 0, true
	}
	windowKeys := make(map[string]bool, len(prevWindow)+len(nextWindow))
	for _, window := range [][]MapEntry{prevWindow, nextWindow} {
		for _, e := range window {
			windowKeys[e.Key] = true
		}
	}
	// The trimmed part is the same in both lists, so prev's is enough.
	for _, trimmed := range [][]MapEntry{prev[:prefix], prev[len(prev)-suffix:]} {
		if slices.ContainsFunc(trimmed, func(e MapEntry) bool { return windowKeys[e.Key] }) {
			return 0, 0, false
		}
	}
	return prefix, suffix, true
}

// orderedMapDelta compares two entry lists of a first-match-wins map. add
// map appends, so a new key is added only after every key next keeps from
// prev; a reordering, a middle insertion or a new first entry replaces the
// map. keptAfter reports whether the lists are windows of longer ones that
// keep a key after them; it is asked only when a key would be appended.
func orderedMapDelta(mapPath string, prev, next []MapEntry, keptAfter func() bool) (upserts, deletes []Op) {
	p, n := groupEntries(prev), groupEntries(next)
	lastKept := -1
	shared := 0 // position in p.keys of the next shared key expected
	for i, key := range n.keys {
		if _, had := p.values[key]; !had {
			continue
		}
		for shared < len(p.keys) {
			if _, kept := n.values[p.keys[shared]]; kept {
				break
			}
			shared++
		}
		if shared >= len(p.keys) || p.keys[shared] != key {
			return wholeMap(mapPath)
		}
		shared++
		lastKept = i
	}
	appendFrom := lastKept + 1
	if appendFrom < len(n.keys) && keptAfter() {
		appendFrom = len(n.keys)
	}
	return keyedMapDelta(mapPath, p, n, appendFrom)
}

// ---------------------------------------------------------------------------
// Files and the config guard (last, so that the guard knows whether any
// section changed).

func (r *diffRun) files() {
	for i := range r.next.Files {
		f := &r.next.Files[i]
		if sameFileContent(r.px.file(r.prev, f.Path), f) {
			continue
		}
		switch {
		case f.Kind == FileKindConfig:
			// A new haproxy.cfg is explained by the section rules, which
			// decided already; the config's own ReloadOnChange is ignored.
			if !r.sectionChange {
				r.fail("config %s changed with no section explaining it", f.Path)
			}
		case f.ReloadOnChange:
			r.fail("file %s changed and is declared reload-on-change", f.Path)
		}
	}
	for i := range r.prev.Files {
		f := &r.prev.Files[i]
		if f.Kind == FileKindCRTList || r.nx.file(r.next, f.Path) != nil {
			continue
		}
		if f.ReloadOnChange {
			r.fail("file %s was removed and is declared reload-on-change", f.Path)
		} else {
			r.note("file %s was removed, which no runtime op undoes", f.Path)
		}
	}
}

// ---------------------------------------------------------------------------
// In-place ops: what the worker that keeps serving while a reload waits
// can already take, composed against base.WorkerOps.

// composeInPlace returns the in-place ops and the worker's plan once they
// ran, or nil, nil when there are none.
func composeInPlace(r *diffRun, base *Baseline) ([]Op, *Plan) {
	worker := base.WorkerOps
	wx := indexPlan(worker)
	// Creating ops never run in place, so nothing counts as created.
	w := &diffRun{next: r.next, prev: worker, nx: r.nx, px: wx, caps: r.caps, inv: r.inv, certDir: r.certDir}

	var serverOps []Op
	for i := range r.next.Sections {
		s := &r.next.Sections[i]
		next, described := r.next.Backends[s.Name]
		wb, onWorker := worker.Backends[s.Name]
		_, hasSection := wx.backendSections[s.Name]
		if sectionKindOf(s.Kind) == SectionKindBackend && r.nx.backendSections[s.Name] == i &&
			described && onWorker && hasSection && !serversEqual(wb.Servers, next.Servers) {
			serverOps = append(serverOps, w.inPlaceServerOps(s.Name, &wb, &next)...)
		}
	}

	var certOps []Op
	for i := range r.next.Files {
		f := &r.next.Files[i]
		if old := wx.file(worker, f.Path); f.Kind == FileKindCert && old != nil && !sameFileContent(old, f) &&
			SafeToken(f.Path) && r.inv.certs[f.Path] {
			certOps = append(certOps, Op{Kind: OpCertSet, Path: f.Path})
		}
	}

	mapOps := w.inPlaceMapOps(base)
	if len(serverOps)+len(certOps)+len(mapOps) > MaxOpsPerApply || slices.ContainsFunc(mapOps, r.caps.refuses) {
		mapOps = nil // all or nothing: never cut short, never in part
	}

	ops := make([]Op, 0, len(certOps)+len(serverOps)+len(mapOps))
	type serverKey struct{ backend, server string }
	droppedAdds := map[serverKey]bool{}
	for _, op := range slices.Concat(certOps, serverOps) {
		key := serverKey{op.Backend, op.Server}
		switch {
		case !inPlaceKind(op.Kind) || !r.caps.executes(op.Kind):
			if op.Kind == OpServerAdd {
				droppedAdds[key] = true
			}
		case op.Kind == OpServerEnable && droppedAdds[key]:
		default:
			ops = append(ops, op)
		}
	}
	ops = append(ops, mapOps...)
	if len(ops) > MaxOpsPerApply {
		ops = ops[:MaxOpsPerApply:MaxOpsPerApply]
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return ops, workerPlanAfter(worker, r.next, r.nx, ops)
}

// inPlaceKind is the set of server and certificate kinds that may run on
// the current worker: nothing that creates or deletes an object.
func inPlaceKind(kind string) bool {
	return slices.Contains([]string{OpServerSetAddr, OpServerSetWeight, OpServerSetState, OpServerAdd,
		OpServerEnable, OpServerDisable, OpCertSet}, kind)
}

// inPlaceServerOps diffs one backend's servers against the worker's record
// (r.prev is the worker). A removed server is only disabled: deletes wait
// for the reload. Refused servers contribute nothing.
func (r *diffRun) inPlaceServerOps(name string, worker, next *Backend) []Op {
	workerByName := serverIndex(worker.Servers)
	var ops []Op
	nextNames := make(map[string]bool, len(next.Servers))
	for i := range next.Servers {
		s := &next.Servers[i]
		if refuseRepeatedName(nextNames, s.Name) != "" {
			continue
		}
		var serverOps []Op
		var refusal string
		if wi, ok := workerByName[s.Name]; ok {
			serverOps, refusal = r.updateServer(name, worker, &worker.Servers[wi], s)
		} else {
			serverOps, refusal = r.addServer(name, worker, s)
		}
		if refusal == "" {
			ops = append(ops, serverOps...)
		}
	}
	for i := range worker.Servers {
		s := &worker.Servers[i]
		if nextNames[s.Name] || s.Disabled || workerByName[s.Name] != i || !SafeToken(name) || !SafeToken(s.Name) {
			continue
		}
		ops = append(ops, Op{Kind: OpServerDisable, Backend: name, Server: s.Name})
	}
	return ops
}

// inPlaceMapOps returns every map's map_set ops then every map's map_del
// ops against the worker's entries (r.prev is the worker), composed by the
// rule of maps, or nil when any map cannot move in place: map values route
// traffic and enforce access across maps, so the worker takes either every
// map change of the render or none.
func (r *diffRun) inPlaceMapOps(base *Baseline) []Op {
	r.maps() // a reason (a map not loaded, an unsafe path) refuses
	sets, deletes := r.groups[groupMapUpsert], r.groups[groupMapDelete]
	if len(r.reasons) > 0 || len(sets)+len(deletes) == 0 ||
		slices.ContainsFunc(sets, func(op Op) bool { return op.Kind != OpMapSet }) { // a map_add or a whole replacement
		return nil
	}
	// A map value may route to a backend the worker lacks, directly or
	// through another map.
	for i := range r.next.Sections {
		s := &r.next.Sections[i]
		_, described := r.next.Backends[s.Name]
		_, hasSection := r.px.backendSections[s.Name]
		_, hasRecord := r.prev.Backends[s.Name]
		if sectionKindOf(s.Kind) == SectionKindBackend && described && (!hasSection || !hasRecord) {
			return nil
		}
	}
	// The new values may only be enforced by config the reload brings (a
	// new frontend, a changed rule): the render must be reachable from the
	// worker at runtime.
	asIfApplied := *base
	asIfApplied.Applied, asIfApplied.Running = r.prev, r.prev
	asIfApplied.WorkerOps, asIfApplied.ReloadPending = nil, false
	nested, nestedOps := decide(r.next, r.nx, &asIfApplied, r.px)
	if nested.failed || chunkCount(len(nestedOps), 0) > MaxOpBatches {
		return nil
	}
	return append(sets, deletes...)
}

// workerPlanAfter is a deep copy of the worker's plan with the in-place ops
// applied, and its derived id: a digest of the worker's id, the render's id
// and the ops, deterministic and distinct from both.
func workerPlanAfter(worker, next *Plan, nx *planIndex, ops []Op) *Plan {
	wp := worker.Clone()
	servers := map[string]map[string]int{} // backend -> server name -> index, built on first use
	serverOf := func(backend, server string) (*Backend, int) {
		b, ok := wp.Backends[backend]
		if !ok {
			return nil, -1
		}
		if servers[backend] == nil {
			servers[backend] = serverIndex(b.Servers)
		}
		if i, ok := servers[backend][server]; ok {
			return &b, i
		}
		return &b, -1
	}
	mapNames := make(map[string]string, len(next.Maps)) // runtime path -> map name, first by name
	for _, name := range slices.Sorted(maps.Keys(next.Maps)) {
		m := next.Maps[name]
		if p := runtimeMapPath(name, &m); mapNames[p] == "" {
			mapNames[p] = name
		}
	}

	for _, op := range ops {
		switch op.Kind {
		case OpServerAdd:
			b, i := serverOf(op.Backend, op.Server)
			nb := next.Backends[op.Backend]
			j := slices.IndexFunc(nb.Servers, func(s Server) bool { return s.Name == op.Server })
			if b == nil || i >= 0 || j < 0 {
				continue
			}
			added := nb.Servers[j].clone()
			added.Disabled = true // an added server starts in MAINT
			b.Servers = append(b.Servers, added)
			wp.Backends[op.Backend] = *b
			servers[op.Backend][op.Server] = len(b.Servers) - 1
		case OpServerEnable, OpServerDisable, OpServerSetState, OpServerSetAddr, OpServerSetWeight:
			b, i := serverOf(op.Backend, op.Server)
			if i < 0 {
				continue
			}
			s := &b.Servers[i]
			switch op.Kind {
			case OpServerEnable:
				s.Disabled = false
			case OpServerDisable:
				s.Disabled = true
			case OpServerSetState:
				s.Disabled = op.State == ServerStateMaint
			case OpServerSetAddr:
				s.Address, s.Port = op.Address, op.Port
			case OpServerSetWeight:
				weight := *op.Weight
				s.Weight = &weight
			}
		case OpMapSet, OpMapDel:
			name, ok := mapNames[op.Path]
			m, onWorker := wp.Maps[name]
			if !ok || !onWorker {
				continue
			}
			if op.Kind == OpMapSet {
				for i := range m.Entries {
					if m.Entries[i].Key == op.Key {
						m.Entries[i].Value = op.Value
					}
				}
			} else {
				m.Entries = slices.DeleteFunc(m.Entries, func(e MapEntry) bool { return e.Key == op.Key })
				if len(m.Entries) == 0 {
					m.Entries = nil
				}
			}
			wp.Maps[name] = m
		case OpCertSet:
			f := nx.file(next, op.Path)
			i := slices.IndexFunc(wp.Files, func(wf PlanFile) bool { return wf.Path == op.Path })
			if f == nil || i < 0 {
				continue
			}
			wf := &wp.Files[i]
			wf.Digest, wf.Size, wf.Content, wf.ContentKnown = f.Digest, f.Size, f.Content, f.ContentKnown
		}
	}
	// Marshalling a []Op cannot fail: every field is a string, a number, a
	// bool or a slice of them.
	b, _ := json.Marshal(ops)
	wp.ID = DigestString(worker.ID + "\x00" + next.ID + "\x00" + string(b))
	return wp
}

// ---------------------------------------------------------------------------
// The wire: from a state answer to a baseline, from a decision to a
// manifest.

// BaselineFromState builds a Baseline from a GET /v1/state answer read with
// the plan blob. A blob that does not describe the files on disk (its id is
// not applied_plan_id, or it has no id) leaves every plan nil, so Diff
// reloads rather than compose ops against something the pod does not hold.
// The inventory's lists are copied, so the baseline does not alias state.
func BaselineFromState(state *State) (*Baseline, error) {
	if state == nil {
		return nil, errors.New("haptic: no state to build a baseline from")
	}
	b := &Baseline{
		Inventory:             state.Inventory,
		Caps:                  CapsFor(state.HAProxy.Version, state.AgentOps),
		PendingServerDeletes:  len(state.PendingDeletes.Servers),
		PendingBackendDeletes: len(state.PendingDeletes.Backends),
		ReloadPending:         state.ReloadPendingAt != "",
	}
	for _, list := range []*[]string{&b.Inventory.Maps, &b.Inventory.Certs, &b.Inventory.CAFiles, &b.Inventory.CRLFiles, &b.Inventory.CRTLists} {
		*list = cloneSlice(*list)
	}
	if len(state.AppliedPlan) == 0 {
		return b, nil
	}
	p, err := DecodePlanBlob(state.AppliedPlan)
	if err != nil {
		return nil, fmt.Errorf("haptic: decoding the applied plan: %w", err)
	}
	if p.ID == "" || p.ID != state.AppliedPlanID {
		return b, nil
	}
	b.Applied = p
	if state.RunningPlanID == p.ID {
		b.Running = p
	}
	if state.WorkerOpsPlanID == p.ID {
		b.WorkerOps = p
	}
	return b, nil
}

// NewManifest turns a decision into the apply's manifest. d must come from
// Diff(next, base) where base describes this same state; the agent's fence
// compares the ids copied from state. Ops travel only in auto mode, and
// only when the pod proved both its applied and its worker baseline;
// in-place ops only with an exact worker baseline. A nil state is the zero
// State.
func NewManifest(next *Plan, d Decision, state *State, token Token) *Manifest {
	if next == nil {
		return nil
	}
	if state == nil {
		state = &State{}
	}
	m := &Manifest{
		IdentityVersion:            ExactIdentityVersion,
		PlanID:                     next.ID,
		PlanSchemaVersion:          next.SchemaVersion,
		Token:                      token,
		ExpectedPrevPlanID:         state.AppliedPlanID,
		ExpectedPrevPlanProof:      state.AppliedPlanProof,
		ExpectedPrevToken:          state.AppliedToken,
		ExpectedWorkerOpsPlanID:    state.WorkerOpsPlanID,
		ExpectedWorkerOpsPlanProof: state.WorkerOpsPlanProof,
		Files:                      d.Files,
		Mode:                       ModeReload,
	}
	if d.Mode == ModeAuto && state.AppliedPlanProof != "" && state.WorkerOpsPlanProof != "" {
		m.Mode = ModeAuto
		if chunks := d.Chunk(); chunks != nil {
			m.Ops = chunks[0]
			if len(chunks) > 1 {
				m.OpBatches = chunks[1:]
			}
		}
	}
	if len(d.InPlace) > 0 && d.WorkerPlan != nil && state.WorkerOpsPlanID != "" && state.WorkerOpsPlanProof != "" {
		m.InPlaceOps = d.InPlace
		m.WorkerOpsPlanID = d.WorkerPlan.ID
	}
	return m
}
