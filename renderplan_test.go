// This file tests renderplan.go: digests, the canonical encoding (held byte
// for byte to encoding/json), plan ids, Clone and the comparators, map-file
// parsing and plan blobs. The fixtures here (the all-fields and weight-zero
// example plans with their pinned encodings, the 3,000-backend plan, the
// random plan generator) are shared with the fuzz targets and benchmarks
// below. PlanFromDir is tested in renderplan_dir_test.go.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// ---------------------------------------------------------------------------
// Fixtures.

// weightOf returns a pointer to a fresh int, for Server.Weight and Op.Weight.
func weightOf(v int) *int { return &v }

// allFieldsExamplePlan is the all-fields example: every field of every type
// set at least once, local-only fields included, so that its pinned
// encoding shows every member and proves the local-only ones left out.
func allFieldsExamplePlan() *Plan {
	zero := 0
	return &Plan{SchemaVersion: 1, ID: "ignored",
		Sections: []Section{
			{Kind: "core", Name: "global", TextDigest: DigestString("global\n"), Length: 7, Text: "global\n", TextKnown: true},
			{Kind: "profile", Name: "web", TextDigest: "2222222222222222", Length: 20},
			{Kind: "backend", Name: "be", TextDigest: "3333333333333333", Length: 40},
		},
		Backends: map[string]Backend{"be": {
			Name: "be", Profile: "web", Mode: "http", GUID: "g-be", Balance: "roundrobin", HashType: "consistent",
			Shape: "structural", ShapeReason: "stick-table in the body",
			Servers: []Server{{Name: "s1", Address: "10.0.0.1", Port: 80, Weight: &zero, Disabled: true, GUID: "g-s1",
				Comment: "a<b", Extra: []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"2s"}}}}},
			DefaultServer: []KeywordArg{{Name: "ssl"}, {Name: "verify", Args: []string{"none"}}},
			BodyDigest:    "4444444444444444", CommentsDigest: "5555555555555555",
			RecordDigest: "6666666666666666", TextDigest: "3333333333333333",
			Body: []string{"balance roundrobin"}, Comments: []string{"# web tier"}, ContentKnown: true,
		}},
		Profiles: map[string]Profile{"web": {Name: "web", BodyDigest: "7777777777777777", HasRules: true}},
		Maps: map[string]Map{"maps/host.map": {Path: "maps/host.map", Ordered: true,
			Entries: []MapEntry{{"a.example.com", "be"}, {"a.example.com", "be2"}}}},
		CRTLists: map[string]CRTList{"ssl/list.txt": {Path: "ssl/list.txt", Entries: []CRTListEntry{{Cert: "site.pem",
			Options:    []KeywordArg{{Name: "alpn", Args: []string{"h2,http/1.1"}}},
			SNIFilters: []string{"*.example.com", "!old.example.com"}}}}},
		Files: []PlanFile{
			{Path: "haproxy.cfg", Kind: "config", ReloadOnChange: true, Digest: "8888888888888888", Size: 67,
				Content: "global\n", ContentKnown: true},
			{Path: "maps/host.map", Kind: "map", Digest: "9999999999999999", Size: 48},
			{Path: "ssl/list.txt", Kind: "crtlist", Digest: "aaaaaaaaaaaaaaaa", Size: 60},
		},
	}
}

// allFieldsExampleCanonical is the 1,557-byte canonical encoding of
// allFieldsExamplePlan, pinned byte for byte, and allFieldsExampleID its id.
const (
	allFieldsExampleCanonical = `{"schemaVersion":1,"id":"","sections":[{"kind":"core","name":"global","textDigest":"f72338a7e0367f8f","length":7},{"kind":"profile","name":"web","textDigest":"2222222222222222","length":20},{"kind":"backend","name":"be","textDigest":"3333333333333333","length":40}],"backends":{"be":{"name":"be","profile":"web","mode":"http","guid":"g-be","balance":"roundrobin","hashType":"consistent","shape":"structural","shapeReason":"stick-table in the body","servers":[{"name":"s1","address":"10.0.0.1","port":80,"weight":0,"disabled":true,"guid":"g-s1","comment":"a\u003cb","extra":[{"name":"check"},{"name":"inter","args":["2s"]}]}],"defaultServer":[{"name":"ssl"},{"name":"verify","args":["none"]}],"bodyDigest":"4444444444444444","commentsDigest":"5555555555555555","recordDigest":"6666666666666666","textDigest":"3333333333333333"}},"profiles":{"web":{"name":"web","bodyDigest":"7777777777777777","hasRules":true}},"maps":{"maps/host.map":{"path":"maps/host.map","ordered":true,"entries":[{"key":"a.example.com","value":"be"},{"key":"a.example.com","value":"be2"}]}},"crtLists":{"ssl/list.txt":{"path":"ssl/list.txt","entries":[{"cert":"site.pem","options":[{"name":"alpn","args":["h2,http/1.1"]}],"sniFilters":["*.example.com","!old.example.com"]}]}},"files":[{"path":"haproxy.cfg","kind":"config","reloadOnChange":true,"digest":"8888888888888888","size":67},{"path":"maps/host.map","kind":"map","reloadOnChange":false,"digest":"9999999999999999","size":48},{"path":"ssl/list.txt","kind":"crtlist","reloadOnChange":false,"digest":"aaaaaaaaaaaaaaaa","size":60}]}`
	allFieldsExampleID        = "223e2766c8b05444"
)

// weightZeroExamplePlan is the weight-zero example: a server whose weight
// points to 0, which must be encoded as "weight":0 where an unset weight is
// left out, and a crt-list with no entries.
func weightZeroExamplePlan() *Plan {
	zero := 0
	return &Plan{SchemaVersion: 1,
		Backends: map[string]Backend{"x": {Name: "x", Shape: "dynamic",
			Servers: []Server{{Name: "s", Address: "1.2.3.4", Port: 80, Weight: &zero}}}},
		CRTLists: map[string]CRTList{"l": {Path: "l"}}}
}

const (
	weightZeroExampleCanonical = `{"schemaVersion":1,"id":"","sections":null,"backends":{"x":{"name":"x","shape":"dynamic","servers":[{"name":"s","address":"1.2.3.4","port":80,"weight":0}],"bodyDigest":"","commentsDigest":"","recordDigest":"","textDigest":""}},"profiles":null,"maps":null,"crtLists":{"l":{"path":"l"}},"files":null}`
	weightZeroExampleID        = "c5ef15ce376460db"
	nilCollectionsCanonical    = `{"schemaVersion":1,"id":"","sections":null,"backends":null,"profiles":null,"maps":null,"files":null}`
	emptyCollectionsCanonical  = `{"schemaVersion":1,"id":"","sections":[],"backends":{},"profiles":{},"maps":{},"files":[]}`
)

func emptyCollectionsPlan() *Plan {
	return &Plan{SchemaVersion: 1, Sections: []Section{}, Backends: map[string]Backend{},
		Profiles: map[string]Profile{}, Maps: map[string]Map{}, CRTLists: map[string]CRTList{}, Files: []PlanFile{}}
}

// exactSamplePlan is the all-fields example with every section text,
// backend body and file content known, so that ExactlyEqual can hold.
func exactSamplePlan() *Plan {
	p := allFieldsExamplePlan()
	for i := range p.Sections {
		p.Sections[i].Text = strings.Repeat("x", p.Sections[i].Length)
		p.Sections[i].TextKnown = true
	}
	for i := range p.Files {
		p.Files[i].Content = fmt.Sprintf("content of %s\n", p.Files[i].Path)
		p.Files[i].ContentKnown = true
	}
	return p
}

// computeIDSamplePlan has two sections, two backends, a profile, an ordered
// map and a file: the plan TestPlanComputeID computes ids of.
func computeIDSamplePlan() *Plan {
	cfg := "global\nbackend be1\n"
	return &Plan{SchemaVersion: PlanSchemaVersion,
		Sections: []Section{
			{Kind: SectionKindCore, Name: "global", TextDigest: DigestString("global\n"), Length: 7},
			{Kind: SectionKindBackend, Name: "be1", TextDigest: DigestString("backend be1\n"), Length: 12},
		},
		Backends: map[string]Backend{
			"be1": {Name: "be1", Shape: ShapeDynamic, Servers: []Server{{Name: "s1", Address: "10.0.0.1", Port: 80, Weight: weightOf(10)}}},
			"be2": {Name: "be2", Shape: ShapeStructural, ShapeReason: "stick-table in the body"},
		},
		Profiles: map[string]Profile{"web": {Name: "web", BodyDigest: DigestString("mode http\n")}},
		Maps: map[string]Map{"maps/host.map": {Path: "maps/host.map", Ordered: true,
			Entries: []MapEntry{{Key: "a.example.com", Value: "be1"}}}},
		Files: []PlanFile{{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true,
			Digest: DigestString(cfg), Size: int64(len(cfg))}},
	}
}

// computeID3000Plan is the plan the speed of ComputeID is measured on:
// 3,000 backends, 100 maps of 30 entries each, and their sections and files.
func computeID3000Plan() *Plan {
	const backends, maps, entriesPerMap = 3000, 100, 30
	p := &Plan{SchemaVersion: PlanSchemaVersion,
		Backends: make(map[string]Backend, backends),
		Profiles: map[string]Profile{"web": {Name: "web", BodyDigest: DigestString("mode http\n")}},
		Maps:     make(map[string]Map, maps),
	}
	p.Sections = append(p.Sections, Section{Kind: SectionKindCore, Name: "global",
		TextDigest: DigestString("global\n"), Length: 7})
	for i := range backends {
		name := fmt.Sprintf("backend-%06d", i)
		text := fmt.Sprintf("backend %s\n    mode http\n    balance roundrobin\n", name)
		p.Sections = append(p.Sections, Section{Kind: SectionKindBackend, Name: name,
			TextDigest: DigestString(text), Length: len(text)})
		p.Backends[name] = Backend{Name: name, Mode: "http", Balance: "roundrobin", Shape: ShapeDynamic,
			Servers: []Server{{Name: "srv1", Address: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&0xff, i&0xff),
				Port: 8080, Weight: weightOf(100),
				Extra: []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"2s"}}}}},
			BodyDigest: DigestString("body " + name), CommentsDigest: DigestString("comments " + name),
			RecordDigest: DigestString("record " + name), TextDigest: DigestString(text)}
	}
	cfg := "global\n"
	p.Files = append(p.Files, PlanFile{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true,
		Digest: DigestString(cfg), Size: int64(len(cfg))})
	for m := range maps {
		path := fmt.Sprintf("maps/map-%03d.map", m)
		var content strings.Builder
		for e := range entriesPerMap {
			fmt.Fprintf(&content, "host-%03d-%02d.example.com backend-%06d\n", m, e, (m*entriesPerMap+e)%backends)
		}
		p.Maps[path] = Map{Path: path, Entries: ParseMapEntries(content.String())}
		p.Files = append(p.Files, PlanFile{Path: path, Kind: FileKindMap,
			Digest: DigestString(content.String()), Size: int64(content.Len())})
	}
	return p
}

// marshalBlankedID is the definition of the canonical encoding:
// json.Marshal of a copy of the plan whose ID is "".
func marshalBlankedID(t testing.TB, p *Plan) []byte {
	t.Helper()
	c := *p
	c.ID = ""
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	return b
}

// zstdSizedFrame compresses b as one frame with its content size in the header.
func zstdSizedFrame(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// zstdStreamedFrame compresses what write produces as a streamed frame, which
// carries no content size in its header.
func zstdStreamedFrame(t testing.TB, write func(w *zstd.Encoder)) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	write(enc)
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	var h zstd.Header
	if err := h.Decode(out.Bytes()); err != nil || h.HasFCS {
		t.Fatalf("streamed frame header: HasFCS=%v err=%v; the test needs a frame without content size", h.HasFCS, err)
	}
	return out.Bytes()
}

// ---------------------------------------------------------------------------
// The plan generator behind TestCanonicalMatchesEncodingJSON and
// FuzzCanonical. A planChooser makes every choice, so the same generator
// runs on a seeded PRNG and on fuzz input.

type planChooser interface {
	intn(n int) int // in [0, n)
	bytes() string  // arbitrary bytes, possibly invalid UTF-8
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int { return c.r.IntN(n) }
func (c randChooser) bytes() string {
	b := make([]byte, c.r.IntN(12))
	for i := range b {
		b[i] = byte(c.r.UintN(256))
	}
	return string(b)
}

// fuzzChooser consumes fuzz input; once it is exhausted every choice is 0
// and every byte string empty, so generation always ends.
type fuzzChooser struct{ data []byte }

func (c *fuzzChooser) next() byte {
	if len(c.data) == 0 {
		return 0
	}
	b := c.data[0]
	c.data = c.data[1:]
	return b
}
func (c *fuzzChooser) intn(n int) int { return int(c.next()) % n }
func (c *fuzzChooser) bytes() string {
	n := min(int(c.next())%16, len(c.data))
	s := string(c.data[:n])
	c.data = c.data[n:]
	return s
}

// canonicalEscapingExamples are strings the canonical encoding must escape
// exactly as encoding/json does (HTML escaping on), with the JSON they
// become (quotes included).
var canonicalEscapingExamples = []struct{ in, want string }{
	{`"`, `"\""`},
	{`\`, `"\\"`},
	{"\b", `"\b"`},
	{"\t", `"\t"`},
	{"\n", `"\n"`},
	{"\f", `"\f"`},
	{"\r", `"\r"`},
	{"\x00", `"\u0000"`},
	{"\x0b", `"\u000b"`},
	{"\x1f", `"\u001f"`},
	{"<", `"\u003c"`},
	{">", `"\u003e"`},
	{"&", `"\u0026"`},
	{"\u2028", `"\u2028"`},
	{"\u2029", `"\u2029"`},
	{"\xff", `"\ufffd"`},
	{"\xe2\x82", `"\ufffd\ufffd"`},
	{"\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`},
	{"\x7f", "\"\x7f\""},
	{"/", `"/"`},
	{"'", `"'"`},
	{"\u00a0", "\"\u00a0\""},
	{"\u0085", "\"\u0085\""},
	{"é", `"é"`},
	{"😀", `"😀"`},
	{"\ufffd", "\"\xef\xbf\xbd\""},
	{"a<b&c>d", `"a\u003cb\u0026c\u003ed"`},
	{"plain ascii", `"plain ascii"`},
}

func encodingTestString(c planChooser) string {
	switch c.intn(6) {
	case 0:
		return ""
	case 1, 2:
		return canonicalEscapingExamples[c.intn(len(canonicalEscapingExamples))].in
	case 3:
		return []string{"a\xfe", "a\xff", "\xc3", "x\xe2\x82y", "backend-1", "10.0.0.1", "é😀<&>"}[c.intn(7)]
	default:
		return c.bytes()
	}
}

func encodingTestOptional(c planChooser) string {
	if c.intn(2) == 0 {
		return ""
	}
	return encodingTestString(c)
}

func encodingTestInt(c planChooser) int {
	return []int{0, 1, -1, 80, 65535, math.MaxInt, math.MinInt, 1 << 40}[c.intn(8)]
}

// encodingTestSlice returns nil, an empty slice, or 1 to 7 generated elements.
func encodingTestSlice[T any](c planChooser, gen func() T) []T {
	switch n := c.intn(9); n {
	case 0:
		return nil
	case 1:
		return []T{}
	default:
		s := make([]T, n-1)
		for i := range s {
			s[i] = gen()
		}
		return s
	}
}

// encodingTestMap returns nil, an empty map, or up to 7 generated members.
func encodingTestMap[V any](c planChooser, gen func(key string) V) map[string]V {
	switch n := c.intn(9); n {
	case 0:
		return nil
	case 1:
		return map[string]V{}
	default:
		m := make(map[string]V, n-1)
		for range n - 1 {
			k := encodingTestString(c)
			m[k] = gen(k)
		}
		return m
	}
}

func encodingTestKeywordArgs(c planChooser) []KeywordArg {
	return encodingTestSlice(c, func() KeywordArg {
		return KeywordArg{Name: encodingTestString(c), Args: encodingTestSlice(c, func() string { return encodingTestString(c) })}
	})
}

func encodingTestPlan(c planChooser) *Plan {
	p := &Plan{SchemaVersion: encodingTestInt(c), ID: encodingTestOptional(c)}
	p.Sections = encodingTestSlice(c, func() Section {
		return Section{Kind: encodingTestString(c), Name: encodingTestString(c), TextDigest: encodingTestString(c), Length: encodingTestInt(c),
			Text: encodingTestOptional(c), TextKnown: c.intn(2) == 1}
	})
	p.Backends = encodingTestMap(c, func(key string) Backend {
		b := Backend{Name: key, Profile: encodingTestOptional(c), Mode: encodingTestOptional(c), GUID: encodingTestOptional(c),
			Balance: encodingTestOptional(c), HashType: encodingTestOptional(c), Shape: encodingTestOptional(c), ShapeReason: encodingTestOptional(c),
			BodyDigest: encodingTestOptional(c), CommentsDigest: encodingTestOptional(c), RecordDigest: encodingTestOptional(c),
			TextDigest: encodingTestOptional(c), ContentKnown: c.intn(2) == 1}
		b.Servers = encodingTestSlice(c, func() Server {
			s := Server{Name: encodingTestString(c), Address: encodingTestString(c), Port: encodingTestInt(c), Disabled: c.intn(2) == 1,
				GUID: encodingTestOptional(c), Comment: encodingTestOptional(c), Extra: encodingTestKeywordArgs(c)}
			switch c.intn(3) {
			case 1:
				s.Weight = weightOf(0)
			case 2:
				s.Weight = weightOf(encodingTestInt(c))
			}
			return s
		})
		b.DefaultServer = encodingTestKeywordArgs(c)
		b.Body = encodingTestSlice(c, func() string { return encodingTestString(c) })
		b.Comments = encodingTestSlice(c, func() string { return encodingTestString(c) })
		return b
	})
	p.Profiles = encodingTestMap(c, func(key string) Profile {
		return Profile{Name: key, BodyDigest: encodingTestOptional(c), HasRules: c.intn(2) == 1}
	})
	p.Maps = encodingTestMap(c, func(key string) Map {
		return Map{Path: key, Ordered: c.intn(2) == 1, Entries: encodingTestSlice(c, func() MapEntry {
			return MapEntry{Key: encodingTestString(c), Value: encodingTestOptional(c)}
		})}
	})
	p.CRTLists = encodingTestMap(c, func(key string) CRTList {
		return CRTList{Path: key, Entries: encodingTestSlice(c, func() CRTListEntry {
			return CRTListEntry{Cert: encodingTestString(c), Options: encodingTestKeywordArgs(c),
				SNIFilters: encodingTestSlice(c, func() string { return encodingTestString(c) })}
		})}
	})
	p.Files = encodingTestSlice(c, func() PlanFile {
		return PlanFile{Path: encodingTestString(c), Kind: encodingTestString(c), ReloadOnChange: c.intn(2) == 1,
			Digest: encodingTestOptional(c), Size: int64(encodingTestInt(c)), Content: encodingTestOptional(c), ContentKnown: c.intn(2) == 1}
	})
	return p
}

// checkMatchesEncodingJSON holds the encodings to their definition:
// Canonical against json.Marshal of the id-blanked copy, and the blob form
// (real id) against json.Marshal of the plan itself.
func checkMatchesEncodingJSON(t testing.TB, p *Plan) {
	t.Helper()
	if got, want := p.Canonical(), marshalBlankedID(t, p); !bytes.Equal(got, want) {
		t.Fatalf("Canonical differs from json.Marshal\n got: %q\nwant: %q", got, want)
	}
	want, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.marshal(p.ID); !bytes.Equal(got, want) {
		t.Fatalf("blob JSON differs from json.Marshal\n got: %q\nwant: %q", got, want)
	}
}

// ---------------------------------------------------------------------------
// Digests.

func TestDigestVectors(t *testing.T) {
	rows := []struct{ in, want string }{
		{"", "ef46db3751d8e999"},
		{"abc", "44bc2cf5ad770999"},
		{"k20", "004541b87408e056"},
		{"global\n", "f72338a7e0367f8f"},
		{strings.Repeat("a", 1), "d24ec4f1a98c6e5b"},
		{strings.Repeat("a", 3), "ae01f066e602375b"},
		{strings.Repeat("a", 4), "42a70d1abf84bf32"},
		{strings.Repeat("a", 7), "d6e4ab2829bc82e5"},
		{strings.Repeat("a", 8), "d5462e501de970f3"},
		{strings.Repeat("a", 31), "fe47067cda802916"},
		{strings.Repeat("a", 32), "856e843298f99ad7"},
		{strings.Repeat("a", 33), "18f3ff0c21e3b24b"},
		{strings.Repeat("a", 64), "ecdb66a0aa9322e2"},
		{strings.Repeat("a", 65), "6276d6b44cd41e49"},
		{strings.Repeat("0123456789", 10), "f80e7b96315afffa"},
	}
	for _, r := range rows {
		got := DigestString(r.in)
		if got != r.want {
			t.Errorf("DigestString(%q) = %s, want %s", r.in, got, r.want)
		}
		if b := Digest([]byte(r.in)); b != got {
			t.Errorf("Digest([]byte(%q)) = %s, DigestString gives %s", r.in, b, got)
		}
		if len(got) != 16 || strings.Trim(got, "0123456789abcdef") != "" {
			t.Errorf("DigestString(%q) = %q: not 16 lowercase hex characters", r.in, got)
		}
	}
	if Digest(nil) != DigestString("") {
		t.Errorf("Digest(nil) = %s, DigestString(\"\") = %s", Digest(nil), DigestString(""))
	}
	if DigestString("abc") == DigestString("abd") {
		t.Error(`"abc" and "abd" have the same digest`)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = DigestString("global\n") }); allocs > 1 {
		t.Errorf("DigestString allocates %.0f times, want at most its 16-byte result", allocs)
	}
}

func TestFormatDigest(t *testing.T) {
	rows := []struct {
		sum  uint64
		want string
	}{
		{0, "0000000000000000"},
		{1, "0000000000000001"},
		{0x0123456789abcdef, "0123456789abcdef"},
		{math.MaxUint64, "ffffffffffffffff"},
	}
	for _, r := range rows {
		if got := FormatDigest(r.sum); got != r.want {
			t.Errorf("FormatDigest(%#x) = %s, want %s", r.sum, got, r.want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		v := rng.Uint64() >> rng.UintN(64) // short values too, so leading zeros are exercised
		if got, want := FormatDigest(v), fmt.Sprintf("%016x", v); got != want {
			t.Fatalf("FormatDigest(%#x) = %s, want %s", v, got, want)
		}
	}
}

func TestDigestStreamingMatchesOneShot(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		in := make([]byte, rng.IntN(301))
		for i := range in {
			in[i] = byte(rng.UintN(256))
		}
		h := newDigestHasher()
		for rest := in; len(rest) > 0; {
			n := rng.IntN(len(rest) + 1)
			if k, err := h.Write(rest[:n]); k != n || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", k, err, n)
			}
			rest = rest[n:]
		}
		if got, want := FormatDigest(h.Sum64()), Digest(in); got != want {
			t.Fatalf("streamed %d bytes: %s, Digest gives %s", len(in), got, want)
		}
	}
}

func BenchmarkDigest(b *testing.B) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		_ = Digest(data)
	}
}

// ---------------------------------------------------------------------------
// Types and canonical encoding.

// declaredField is one struct field as the plan types declare it: name,
// Go type and tag.
type declaredField struct{ name, goType, tag string }

// declaredFields lists t's fields by reflection, in declaration order.
func declaredFields(t reflect.Type) []declaredField {
	fields := make([]declaredField, t.NumField())
	for i := range fields {
		f := t.Field(i)
		fields[i] = declaredField{f.Name, f.Type.String(), string(f.Tag)}
	}
	return fields
}

func TestPlanFieldInventory(t *testing.T) {
	rows := []struct {
		typ  reflect.Type
		want []declaredField
	}{
		{reflect.TypeFor[Plan](), []declaredField{
			{"SchemaVersion", "int", `json:"schemaVersion"`},
			{"ID", "string", `json:"id"`},
			{"Sections", "[]haptic.Section", `json:"sections"`},
			{"Backends", "map[string]haptic.Backend", `json:"backends"`},
			{"Profiles", "map[string]haptic.Profile", `json:"profiles"`},
			{"Maps", "map[string]haptic.Map", `json:"maps"`},
			{"CRTLists", "map[string]haptic.CRTList", `json:"crtLists,omitempty"`},
			{"Files", "[]haptic.PlanFile", `json:"files"`},
		}},
		{reflect.TypeFor[Section](), []declaredField{
			{"Kind", "string", `json:"kind"`},
			{"Name", "string", `json:"name"`},
			{"TextDigest", "string", `json:"textDigest"`},
			{"Length", "int", `json:"length"`},
			{"Text", "string", `json:"-"`},
			{"TextKnown", "bool", `json:"-"`},
		}},
		{reflect.TypeFor[Backend](), []declaredField{
			{"Name", "string", `json:"name"`},
			{"Profile", "string", `json:"profile,omitempty"`},
			{"Mode", "string", `json:"mode,omitempty"`},
			{"GUID", "string", `json:"guid,omitempty"`},
			{"Balance", "string", `json:"balance,omitempty"`},
			{"HashType", "string", `json:"hashType,omitempty"`},
			{"Shape", "string", `json:"shape"`},
			{"ShapeReason", "string", `json:"shapeReason,omitempty"`},
			{"Servers", "[]haptic.Server", `json:"servers,omitempty"`},
			{"DefaultServer", "[]haptic.KeywordArg", `json:"defaultServer,omitempty"`},
			{"BodyDigest", "string", `json:"bodyDigest"`},
			{"CommentsDigest", "string", `json:"commentsDigest"`},
			{"RecordDigest", "string", `json:"recordDigest"`},
			{"TextDigest", "string", `json:"textDigest"`},
			{"Body", "[]string", `json:"-"`},
			{"Comments", "[]string", `json:"-"`},
			{"ContentKnown", "bool", `json:"-"`},
		}},
		{reflect.TypeFor[Server](), []declaredField{
			{"Name", "string", `json:"name"`},
			{"Address", "string", `json:"address"`},
			{"Port", "int", `json:"port"`},
			{"Weight", "*int", `json:"weight,omitempty"`},
			{"Disabled", "bool", `json:"disabled,omitempty"`},
			{"GUID", "string", `json:"guid,omitempty"`},
			{"Comment", "string", `json:"comment,omitempty"`},
			{"Extra", "[]haptic.KeywordArg", `json:"extra,omitempty"`},
		}},
		{reflect.TypeFor[KeywordArg](), []declaredField{
			{"Name", "string", `json:"name"`},
			{"Args", "[]string", `json:"args,omitempty"`},
		}},
		{reflect.TypeFor[Profile](), []declaredField{
			{"Name", "string", `json:"name"`},
			{"BodyDigest", "string", `json:"bodyDigest"`},
			{"HasRules", "bool", `json:"hasRules,omitempty"`},
		}},
		{reflect.TypeFor[Map](), []declaredField{
			{"Path", "string", `json:"path"`},
			{"Ordered", "bool", `json:"ordered"`},
			{"Entries", "[]haptic.MapEntry", `json:"entries,omitempty"`},
		}},
		{reflect.TypeFor[MapEntry](), []declaredField{
			{"Key", "string", `json:"key"`},
			{"Value", "string", `json:"value"`},
		}},
		{reflect.TypeFor[CRTList](), []declaredField{
			{"Path", "string", `json:"path"`},
			{"Entries", "[]haptic.CRTListEntry", `json:"entries,omitempty"`},
		}},
		{reflect.TypeFor[CRTListEntry](), []declaredField{
			{"Cert", "string", `json:"cert"`},
			{"Options", "[]haptic.KeywordArg", `json:"options,omitempty"`},
			{"SNIFilters", "[]string", `json:"sniFilters,omitempty"`},
		}},
		{reflect.TypeFor[PlanFile](), []declaredField{
			{"Path", "string", `json:"path"`},
			{"Kind", "string", `json:"kind"`},
			{"ReloadOnChange", "bool", `json:"reloadOnChange"`},
			{"Digest", "string", `json:"digest"`},
			{"Size", "int64", `json:"size"`},
			{"Content", "string", `json:"-"`},
			{"ContentKnown", "bool", `json:"-"`},
		}},
	}
	for _, r := range rows {
		if got := declaredFields(r.typ); !slices.Equal(got, r.want) {
			t.Errorf("%s fields:\n got %v\nwant %v", r.typ, got, r.want)
		}
	}
	if PlanSchemaVersion != 1 || SectionKindCore != "core" || SectionKindProfile != "profile" ||
		SectionKindBackend != "backend" || ShapeDynamic != "dynamic" || ShapeStructural != "structural" ||
		ConfigFilePath != "haproxy.cfg" {
		t.Error("a plan constant has the wrong value")
	}
}

func TestCanonicalEmptyPlans(t *testing.T) {
	nilPlan := &Plan{SchemaVersion: 1}
	emptyPlan := emptyCollectionsPlan()
	nilWithEmptyCRT := &Plan{SchemaVersion: 1, CRTLists: map[string]CRTList{}}
	rows := []struct {
		name string
		p    *Plan
		want string
	}{
		{"nil collections", nilPlan, nilCollectionsCanonical},
		{"empty collections", emptyPlan, emptyCollectionsCanonical},
		{"nil collections, empty crtLists", nilWithEmptyCRT, nilCollectionsCanonical},
	}
	for _, r := range rows {
		if got := string(r.p.Canonical()); got != r.want {
			t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
		}
	}
	nilPlan.ComputeID()
	emptyPlan.ComputeID()
	if nilPlan.ID == emptyPlan.ID {
		t.Errorf("nil and empty collections share the id %s", nilPlan.ID)
	}
}

func TestCanonicalExamples(t *testing.T) {
	rows := []struct {
		name          string
		p             *Plan
		want, wantID  string
		wantByteCount int
	}{
		{"weight zero", weightZeroExamplePlan(), weightZeroExampleCanonical, weightZeroExampleID, len(weightZeroExampleCanonical)},
		{"all fields", allFieldsExamplePlan(), allFieldsExampleCanonical, allFieldsExampleID, 1557},
	}
	for _, r := range rows {
		got := r.p.Canonical()
		if string(got) != r.want {
			t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
		}
		if len(got) != r.wantByteCount {
			t.Errorf("%s: %d bytes, want %d", r.name, len(got), r.wantByteCount)
		}
		r.p.ComputeID()
		if r.p.ID != r.wantID {
			t.Errorf("%s: id %s, want %s", r.name, r.p.ID, r.wantID)
		}
	}
	// The local-only values of the all-fields example never reach the bytes.
	got := string(allFieldsExamplePlan().Canonical())
	for _, local := range []string{"global\\n", "# web tier", "balance roundrobin", "ignored", "Text", "Content", "Known", "Body", "Comments"} {
		if strings.Contains(got, local) {
			t.Errorf("canonical encoding contains the local-only value %q", local)
		}
	}
}

func TestCanonicalIsDeterministic(t *testing.T) {
	build := func(rng *rand.Rand) *Plan {
		p := &Plan{SchemaVersion: 1, Backends: map[string]Backend{}, Profiles: map[string]Profile{},
			Maps: map[string]Map{}, CRTLists: map[string]CRTList{}}
		names := make([]string, 40)
		for i := range names {
			names[i] = fmt.Sprintf("k%02d", i)
		}
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, n := range names {
			p.Backends[n] = Backend{Name: n, Shape: ShapeDynamic}
			p.Profiles[n] = Profile{Name: n}
			p.Maps[n] = Map{Path: n, Entries: []MapEntry{{Key: n, Value: "v"}}}
			p.CRTLists[n] = CRTList{Path: n}
		}
		return p
	}
	rng := rand.New(rand.NewPCG(5, 6))
	first := build(rng).Canonical()
	for i := range 50 {
		if got := build(rng).Canonical(); !bytes.Equal(got, first) {
			t.Fatalf("rebuild %d encodes differently", i)
		}
	}
	// The result is the caller's: changing it does not reach the next call.
	p := build(rng)
	b := p.Canonical()
	b[0] = 'X'
	if again := p.Canonical(); again[0] != '{' {
		t.Error("Canonical returned a slice that a later call shares")
	}
}

func TestCanonicalExcludesID(t *testing.T) {
	p := allFieldsExamplePlan()
	p.ID = ""
	blank := p.Canonical()
	for _, id := range []string{"x", "223e2766c8b05444", "<&>\"", strings.Repeat("z", 1000)} {
		p.ID = id
		if got := p.Canonical(); !bytes.Equal(got, blank) {
			t.Errorf("ID %q changes the encoding", id)
		}
		if p.ID != id {
			t.Errorf("Canonical changed p.ID to %q", p.ID)
		}
	}
	if !bytes.Contains(blank, []byte(`"id":""`)) {
		t.Errorf("encoding lacks \"id\":\"\": %s", blank)
	}
}

// TestCanonicalConcurrentReaders runs Canonical, ComputeID's encoding and
// the blob writer on one shared plan from several goroutines: under -race it
// proves that encoding never writes to the plan, so a plan may be shared
// by readers without a lock.
func TestCanonicalConcurrentReaders(t *testing.T) {
	p := allFieldsExamplePlan()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if got := p.Canonical(); string(got) != allFieldsExampleCanonical {
					t.Error("concurrent Canonical differs")
					return
				}
				if _, err := EncodePlanBlob(p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestCanonicalNilPlanPanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "haptic: encoding the plan failed: nil plan" {
			t.Errorf("recovered %v, want the encoding-failed panic", r)
		}
	}()
	var p *Plan
	p.Canonical()
}

func TestCanonicalIgnoresLocalOnlyFields(t *testing.T) {
	rows := []struct {
		name   string
		mutate func(p *Plan)
	}{
		{"Section.Text", func(p *Plan) { p.Sections[0].Text = "changed\n" }},
		{"Section.TextKnown", func(p *Plan) { p.Sections[0].TextKnown = !p.Sections[0].TextKnown }},
		{"Backend.Body", func(p *Plan) { p.Backends["be"].Body[0] = "balance leastconn" }},
		{"Backend.Comments", func(p *Plan) {
			b := p.Backends["be"]
			b.Comments = append(b.Comments, "# more")
			p.Backends["be"] = b
		}},
		{"Backend.ContentKnown", func(p *Plan) {
			b := p.Backends["be"]
			b.ContentKnown = !b.ContentKnown
			p.Backends["be"] = b
		}},
		{"PlanFile.Content", func(p *Plan) { p.Files[0].Content = "defaults\n" }},
		{"PlanFile.ContentKnown", func(p *Plan) { p.Files[1].ContentKnown = !p.Files[1].ContentKnown }},
	}
	for _, r := range rows {
		p := allFieldsExamplePlan()
		before := p.Canonical()
		p.ComputeID()
		id := p.ID
		r.mutate(p)
		if got := p.Canonical(); !bytes.Equal(got, before) {
			t.Errorf("%s changes the encoding", r.name)
		}
		p.ComputeID()
		if p.ID != id {
			t.Errorf("%s changes the id", r.name)
		}
	}
}

func TestCanonicalOmitEmpty(t *testing.T) {
	withBackend := func(b Backend) *Plan { return &Plan{SchemaVersion: 1, Backends: map[string]Backend{"b": b}} }
	withServer := func(s Server) *Plan { return withBackend(Backend{Name: "b", Servers: []Server{s}}) }
	withCRT := func(e CRTListEntry) *Plan {
		return &Plan{SchemaVersion: 1, CRTLists: map[string]CRTList{"l": {Path: "l", Entries: []CRTListEntry{e}}}}
	}
	rows := []struct {
		field       string
		zero, set   *Plan
		member, val string // the member name as written, and what it is written as when set
	}{
		{"Backend.Profile", withBackend(Backend{}), withBackend(Backend{Profile: "p"}), `"profile":`, `"profile":"p"`},
		{"Backend.Mode", withBackend(Backend{}), withBackend(Backend{Mode: "http"}), `"mode":`, `"mode":"http"`},
		{"Backend.GUID", withBackend(Backend{}), withBackend(Backend{GUID: "g"}), `"guid":`, `"guid":"g"`},
		{"Backend.Balance", withBackend(Backend{}), withBackend(Backend{Balance: "rr"}), `"balance":`, `"balance":"rr"`},
		{"Backend.HashType", withBackend(Backend{}), withBackend(Backend{HashType: "consistent"}), `"hashType":`, `"hashType":"consistent"`},
		{"Backend.ShapeReason", withBackend(Backend{}), withBackend(Backend{ShapeReason: "r"}), `"shapeReason":`, `"shapeReason":"r"`},
		{"Backend.Servers", withBackend(Backend{Servers: []Server{}}), withBackend(Backend{Servers: []Server{{}}}), `"servers":`, `"servers":[{"name":"","address":"","port":0}]`},
		{"Backend.DefaultServer", withBackend(Backend{DefaultServer: []KeywordArg{}}), withBackend(Backend{DefaultServer: []KeywordArg{{Name: "ssl"}}}), `"defaultServer":`, `"defaultServer":[{"name":"ssl"}]`},
		{"Server.Weight", withServer(Server{}), withServer(Server{Weight: weightOf(0)}), `"weight":`, `"weight":0`},
		{"Server.Disabled", withServer(Server{}), withServer(Server{Disabled: true}), `"disabled":`, `"disabled":true`},
		{"Server.GUID", withServer(Server{}), withServer(Server{GUID: "g"}), `"guid":`, `"guid":"g"`},
		{"Server.Comment", withServer(Server{}), withServer(Server{Comment: "c"}), `"comment":`, `"comment":"c"`},
		{"Server.Extra", withServer(Server{Extra: []KeywordArg{}}), withServer(Server{Extra: []KeywordArg{{Name: "check"}}}), `"extra":`, `"extra":[{"name":"check"}]`},
		{"KeywordArg.Args", withServer(Server{Extra: []KeywordArg{{Name: "inter", Args: []string{}}}}), withServer(Server{Extra: []KeywordArg{{Name: "inter", Args: []string{"2s"}}}}), `"args":`, `"args":["2s"]`},
		{"Profile.HasRules", &Plan{Profiles: map[string]Profile{"p": {}}}, &Plan{Profiles: map[string]Profile{"p": {HasRules: true}}}, `"hasRules":`, `"hasRules":true`},
		{"Map.Entries", &Plan{Maps: map[string]Map{"m": {Entries: []MapEntry{}}}}, &Plan{Maps: map[string]Map{"m": {Entries: []MapEntry{{}}}}}, `"entries":`, `"entries":[{"key":"","value":""}]`},
		{"CRTList.Entries", &Plan{CRTLists: map[string]CRTList{"l": {Entries: []CRTListEntry{}}}}, withCRT(CRTListEntry{}), `"entries":`, `"entries":[{"cert":""}]`},
		{"CRTListEntry.Options", withCRT(CRTListEntry{Options: []KeywordArg{}}), withCRT(CRTListEntry{Options: []KeywordArg{{Name: "alpn"}}}), `"options":`, `"options":[{"name":"alpn"}]`},
		{"CRTListEntry.SNIFilters", withCRT(CRTListEntry{SNIFilters: []string{}}), withCRT(CRTListEntry{SNIFilters: []string{"*.x"}}), `"sniFilters":`, `"sniFilters":["*.x"]`},
		{"Plan.CRTLists nil", &Plan{}, &Plan{CRTLists: map[string]CRTList{"l": {}}}, `"crtLists":`, `"maps":null,"crtLists":{"l":{"path":""}},"files":null`},
		{"Plan.CRTLists empty", &Plan{CRTLists: map[string]CRTList{}}, &Plan{CRTLists: map[string]CRTList{"l": {}}}, `"crtLists":`, `"maps":null,"crtLists":{"l":{"path":""}},"files":null`},
	}
	for _, r := range rows {
		zero, set := string(r.zero.Canonical()), string(r.set.Canonical())
		if strings.Contains(zero, r.member) {
			t.Errorf("%s at zero: %s is present in %s", r.field, r.member, zero)
		}
		if !strings.Contains(set, r.val) {
			t.Errorf("%s set: %s is missing from %s", r.field, r.val, set)
		}
		checkMatchesEncodingJSON(t, r.zero)
		checkMatchesEncodingJSON(t, r.set)
	}
	// Non-omitempty fields are written at their zero values.
	zeros := &Plan{
		Sections: []Section{{}},
		Backends: map[string]Backend{"b": {Servers: []Server{{}}}},
		Maps:     map[string]Map{"m": {}},
		Files:    []PlanFile{{}},
	}
	got := string(zeros.Canonical())
	for _, member := range []string{`"schemaVersion":0`, `"length":0`, `"shape":""`, `"port":0`, `"bodyDigest":""`,
		`"ordered":false`, `"reloadOnChange":false`, `"digest":""`, `"size":0`} {
		if !strings.Contains(got, member) {
			t.Errorf("zero value %s missing from %s", member, got)
		}
	}
}

func TestCanonicalStringEscaping(t *testing.T) {
	for _, r := range canonicalEscapingExamples {
		inName := &Plan{SchemaVersion: 1, Sections: []Section{{Kind: "core", Name: r.in}}}
		wantName := `"name":` + r.want + `,"textDigest"`
		if got := string(inName.Canonical()); !strings.Contains(got, wantName) {
			t.Errorf("section name %q: want %s in %s", r.in, wantName, got)
		}
		inKey := &Plan{SchemaVersion: 1, Maps: map[string]Map{r.in: {Path: "p"}}}
		wantKey := `"maps":{` + r.want + `:{"path":"p"`
		if got := string(inKey.Canonical()); !strings.Contains(got, wantKey) {
			t.Errorf("map key %q: want %s in %s", r.in, wantKey, got)
		}
		checkMatchesEncodingJSON(t, inName)
		checkMatchesEncodingJSON(t, inKey)
	}
}

func TestCanonicalKeyOrder(t *testing.T) {
	ordered := []string{"", "Z", "a", "a\x00", "ab", "a\xfe", "a\xff", "é", "😀"}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		shuffled := slices.Clone(ordered)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		p := &Plan{SchemaVersion: 1, Backends: map[string]Backend{}}
		for _, k := range shuffled {
			// The balance marks each member: "a\xfe" and "a\xff" are both
			// written as "a\ufffd", and only the marker tells them apart.
			p.Backends[k] = Backend{Balance: fmt.Sprintf("marker-%x", k)}
		}
		got := string(p.Canonical())
		last := -1
		for _, k := range ordered {
			i := strings.Index(got, fmt.Sprintf(`"balance":"marker-%x"`, k))
			if i < 0 || i < last {
				t.Fatalf("key %q out of order in %s", k, got)
			}
			last = i
		}
		if n := strings.Count(got, `"a\ufffd":{`); n != 2 {
			t.Errorf(`"a\ufffd" written %d times, want 2 (for "a\xfe" and "a\xff")`, n)
		}
		checkMatchesEncodingJSON(t, p)
	}
}

func TestCanonicalMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 2000 {
		checkMatchesEncodingJSON(t, encodingTestPlan(randChooser{rng}))
	}
	// The fixtures.
	checkMatchesEncodingJSON(t, computeID3000Plan())
	checkMatchesEncodingJSON(t, allFieldsExamplePlan())
}

func FuzzCanonical(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\x08"))
	f.Add([]byte("a\xff\x05<b>\x02\x07\x03\u2028\x08\x01\x04\x06"))
	seed := rand.New(rand.NewPCG(11, 12))
	for range 8 {
		b := make([]byte, 200)
		for i := range b {
			b[i] = byte(seed.UintN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkMatchesEncodingJSON(t, encodingTestPlan(&fuzzChooser{data: data}))
	})
}

// ---------------------------------------------------------------------------
// Ids.

func TestPlanComputeID(t *testing.T) {
	base := computeIDSamplePlan()
	base.ComputeID()
	if len(base.ID) != 16 || strings.Trim(base.ID, "0123456789abcdef") != "" {
		t.Fatalf("id %q is not 16 lowercase hex characters", base.ID)
	}
	rows := []struct {
		name   string
		mutate func(p *Plan)
		same   bool
	}{
		{"unchanged plan keeps its id", func(p *Plan) {}, true},
		{"recompute is stable", func(p *Plan) { p.ComputeID(); p.ID = "whatever" }, true},
		{"section digest change", func(p *Plan) { p.Sections[0].TextDigest = DigestString("global2\n") }, false},
		{"section order change", func(p *Plan) { p.Sections[0], p.Sections[1] = p.Sections[1], p.Sections[0] }, false},
		{"new backend", func(p *Plan) { p.Backends["be3"] = Backend{Name: "be3", Shape: ShapeDynamic} }, false},
		{"map entry value change", func(p *Plan) { p.Maps["maps/host.map"].Entries[0].Value = "be2" }, false},
	}
	for _, r := range rows {
		p := computeIDSamplePlan()
		r.mutate(p)
		p.ComputeID()
		if (p.ID == base.ID) != r.same {
			t.Errorf("%s: id %s, base %s, want same=%v", r.name, p.ID, base.ID, r.same)
		}
	}
}

// goldenPlan is the plan of TestPlanGoldenID, whose id is pinned.
func goldenPlan() *Plan {
	global := "global\n    log stdout format raw local0\n"
	backend := "backend web\n    mode http\n    server web1 10.0.0.1:8080 weight 5 check\n"
	cfg := global + backend
	return &Plan{SchemaVersion: PlanSchemaVersion,
		Sections: []Section{
			{Kind: SectionKindCore, Name: "global", TextDigest: DigestString(global), Length: len(global)},
			{Kind: SectionKindBackend, Name: "web", TextDigest: DigestString(backend), Length: len(backend)},
		},
		Backends: map[string]Backend{"web": {Name: "web", Profile: "defaults-http", Mode: "http", Shape: ShapeDynamic,
			Servers:    []Server{{Name: "web1", Address: "10.0.0.1", Port: 8080, Weight: weightOf(5), Extra: []KeywordArg{{Name: "check"}}}},
			BodyDigest: DigestString("mode http\n"), CommentsDigest: DigestString(""),
			RecordDigest: DigestString("web"), TextDigest: DigestString(backend)}},
		Profiles: map[string]Profile{"defaults-http": {Name: "defaults-http", BodyDigest: DigestString("mode http\n")}},
		Maps: map[string]Map{"maps/host.map": {Path: "maps/host.map",
			Entries: []MapEntry{{Key: "shop.example.com", Value: "web"}}}},
		Files: []PlanFile{{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true,
			Digest: DigestString(cfg), Size: int64(len(cfg))}},
	}
}

// The golden plan's canonical bytes and id were computed once by this
// implementation and pinned. A change to either is a contract break (every
// controller's ids would change), never a reason to re-pin.
const (
	goldenPlanCanonical = `{"schemaVersion":1,"id":"","sections":[{"kind":"core","name":"global","textDigest":"693293f27dc84825","length":40},{"kind":"backend","name":"web","textDigest":"a5c67f7e7a76fda4","length":71}],"backends":{"web":{"name":"web","profile":"defaults-http","mode":"http","shape":"dynamic","servers":[{"name":"web1","address":"10.0.0.1","port":8080,"weight":5,"extra":[{"name":"check"}]}],"bodyDigest":"f68df059dafbfb3a","commentsDigest":"ef46db3751d8e999","recordDigest":"f3ae1ec77c51590c","textDigest":"a5c67f7e7a76fda4"}},"profiles":{"defaults-http":{"name":"defaults-http","bodyDigest":"f68df059dafbfb3a"}},"maps":{"maps/host.map":{"path":"maps/host.map","ordered":false,"entries":[{"key":"shop.example.com","value":"web"}]}},"files":[{"path":"haproxy.cfg","kind":"config","reloadOnChange":true,"digest":"124acedfe61476aa","size":111}]}`
	goldenPlanID        = "40f7739a778e0742"
)

func TestPlanGoldenID(t *testing.T) {
	p := goldenPlan()
	checkMatchesEncodingJSON(t, p)
	if got := string(p.Canonical()); got != goldenPlanCanonical {
		t.Errorf("golden canonical encoding changed (contract break):\n got %s\nwant %s", got, goldenPlanCanonical)
	}
	p.ComputeID()
	if p.ID != goldenPlanID {
		t.Errorf("golden id = %s, want %s (contract break)", p.ID, goldenPlanID)
	}
}

func TestComputeIDSeesInPlaceMutations(t *testing.T) {
	p := allFieldsExamplePlan()
	p.ComputeID()
	original := p.ID
	weight := p.Backends["be"].Servers[0].Weight
	rows := []struct {
		name            string
		change, restore func()
	}{
		{"server weight pointee", func() { *weight = 7 }, func() { *weight = 0 }},
		{"map entry value", func() { p.Maps["maps/host.map"].Entries[0].Value = "other" }, func() { p.Maps["maps/host.map"].Entries[0].Value = "be" }},
		{"file digest", func() { p.Files[0].Digest = "0000000000000000" }, func() { p.Files[0].Digest = "8888888888888888" }},
	}
	for _, r := range rows {
		r.change()
		p.ComputeID()
		if p.ID == original {
			t.Errorf("%s: the id did not change", r.name)
		}
		r.restore()
		p.ComputeID()
		if p.ID != original {
			t.Errorf("%s: restoring gives %s, want %s", r.name, p.ID, original)
		}
	}
}

func BenchmarkComputeID3000(b *testing.B) {
	p := computeID3000Plan()
	b.ReportAllocs()
	for b.Loop() {
		p.ComputeID()
	}
	b.ReportMetric(float64(len(p.Canonical())), "canonical-bytes")
}

func TestComputeIDBudget(t *testing.T) {
	if os.Getenv("HAPTIC_PERF") != "1" {
		t.Skip("HAPTIC_PERF is not 1; the timing budget is checked only on request")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := computeID3000Plan()
	p.ComputeID() // warm up
	times := make([]time.Duration, 21)
	for i := range times {
		start := time.Now()
		p.ComputeID()
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	if median := times[len(times)/2]; median >= 10*time.Millisecond {
		t.Errorf("median ComputeID on the 3,000-backend plan is %v, budget 10ms", median)
	} else {
		t.Logf("median ComputeID on the 3,000-backend plan: %v", median)
	}
}

// ---------------------------------------------------------------------------
// Clone and equality.

func TestPlanCloneOwnsNestedState(t *testing.T) {
	rows := []struct {
		name   string
		mutate func(p *Plan)
	}{
		{"section", func(p *Plan) { p.Sections[0].Name = "changed" }},
		{"server name", func(p *Plan) { p.Backends["be"].Servers[0].Name = "changed" }},
		{"weight", func(p *Plan) { *p.Backends["be"].Servers[0].Weight = 42 }},
		{"extra args", func(p *Plan) { p.Backends["be"].Servers[0].Extra[1].Args[0] = "9s" }},
		{"default-server args", func(p *Plan) { p.Backends["be"].DefaultServer[1].Args[0] = "required" }},
		{"body line", func(p *Plan) { p.Backends["be"].Body[0] = "balance leastconn" }},
		{"comment line", func(p *Plan) { p.Backends["be"].Comments[0] = "# changed" }},
		{"backend", func(p *Plan) { p.Backends["new"] = Backend{Name: "new"} }},
		{"profile", func(p *Plan) { p.Profiles["web"] = Profile{Name: "web", BodyDigest: "changed"} }},
		{"map entry", func(p *Plan) { p.Maps["maps/host.map"].Entries[0].Value = "changed" }},
		{"crt-list options", func(p *Plan) { p.CRTLists["ssl/list.txt"].Entries[0].Options[0].Args[0] = "h2" }},
		{"crt-list SNI filters", func(p *Plan) { p.CRTLists["ssl/list.txt"].Entries[0].SNIFilters[0] = "*.changed" }},
		{"file", func(p *Plan) { p.Files[0].Digest = "changed" }},
	}
	for _, r := range rows {
		for _, direction := range []string{"original", "clone"} {
			orig := exactSamplePlan()
			clone := orig.Clone()
			mutated, untouched := orig, clone
			if direction == "clone" {
				mutated, untouched = clone, orig
			}
			r.mutate(mutated)
			if !reflect.DeepEqual(untouched, exactSamplePlan()) {
				t.Errorf("%s: mutating the %s reached the other copy", r.name, direction)
			}
			if reflect.DeepEqual(mutated, exactSamplePlan()) {
				t.Errorf("%s: the mutation of the %s changed nothing; the row tests nothing", r.name, direction)
			}
		}
	}
}

func TestPlanCloneNilAndEmpty(t *testing.T) {
	if (*Plan)(nil).Clone() != nil {
		t.Error("Clone(nil) is not nil")
	}
	nilEverywhere := &Plan{SchemaVersion: 1, ID: "id",
		Sections: []Section{{}},
		Backends: map[string]Backend{"b": {Servers: []Server{{}}}},
		Profiles: map[string]Profile{"p": {}},
		Maps:     map[string]Map{"m": {}},
		CRTLists: map[string]CRTList{"l": {Entries: []CRTListEntry{{}}}},
		Files:    []PlanFile{{}},
	}
	emptyEverywhere := &Plan{SchemaVersion: 1, ID: "id",
		Sections: []Section{},
		Backends: map[string]Backend{"b": {
			Servers:       []Server{{Extra: []KeywordArg{{Args: []string{}}}}, {Extra: []KeywordArg{}}},
			DefaultServer: []KeywordArg{{Args: []string{}}},
			Body:          []string{}, Comments: []string{}}, "c": {Servers: []Server{}, DefaultServer: []KeywordArg{}}},
		Profiles: map[string]Profile{},
		Maps:     map[string]Map{"m": {Entries: []MapEntry{}}},
		CRTLists: map[string]CRTList{"l": {Entries: []CRTListEntry{{Options: []KeywordArg{{Args: []string{}}}, SNIFilters: []string{}}}},
			"k": {Entries: []CRTListEntry{{Options: []KeywordArg{}}}}, "j": {Entries: []CRTListEntry{}}},
		Files: []PlanFile{},
	}
	for _, p := range []*Plan{{}, {SchemaVersion: 1}, emptyCollectionsPlan(), nilEverywhere, emptyEverywhere, allFieldsExamplePlan()} {
		c := p.Clone()
		// reflect.DeepEqual tells nil from empty at every level.
		if !reflect.DeepEqual(c, p) {
			t.Errorf("clone differs (nil versus empty?):\n got %#v\nwant %#v", c, p)
		}
		if !bytes.Equal(c.Canonical(), p.Canonical()) {
			t.Errorf("clone encodes differently: %s", c.Canonical())
		}
	}
	exact := exactSamplePlan()
	if !ExactlyEqual(exact, exact.Clone()) {
		t.Error("ExactlyEqual(p, p.Clone()) is false for an exact plan")
	}
}

func TestExactlyEqual(t *testing.T) {
	blob, err := EncodePlanBlob(exactSamplePlan())
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := DecodePlanBlob(blob)
	if err != nil {
		t.Fatal(err)
	}
	rows := []struct {
		name        string
		left, right func() *Plan
		want        bool
	}{
		{"nil/nil", func() *Plan { return nil }, func() *Plan { return nil }, false},
		{"nil/plan", func() *Plan { return nil }, exactSamplePlan, false},
		{"section text unknown", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.Sections[1].TextKnown = false
			return p
		}, false},
		{"backend content unknown", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			b := p.Backends["be"]
			b.ContentKnown = false
			p.Backends["be"] = b
			return p
		}, false},
		{"file content unknown", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.Files[2].ContentKnown = false
			return p
		}, false},
		{"same content, different ids", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.ID = "another-id"
			return p
		}, true},
		{"different schema version", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.SchemaVersion = 2
			return p
		}, false},
		{"nil versus empty sections", func() *Plan { return &Plan{SchemaVersion: 1} }, func() *Plan {
			return &Plan{SchemaVersion: 1, Sections: []Section{}}
		}, false},
		{"text changed, same digest", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.Sections[0].Text = "GLOBAL\n"
			return p
		}, false},
		{"body line changed", exactSamplePlan, func() *Plan {
			p := exactSamplePlan()
			p.Backends["be"].Body[0] = "balance leastconn"
			return p
		}, false},
		{"decoded blob versus original", func() *Plan { return decoded }, exactSamplePlan, false},
		{"empty plans", func() *Plan { return &Plan{SchemaVersion: 1} }, func() *Plan { return &Plan{SchemaVersion: 1} }, true},
	}
	for _, r := range rows {
		l, rr := r.left(), r.right()
		if got := ExactlyEqual(l, rr); got != r.want {
			t.Errorf("%s: ExactlyEqual = %v, want %v", r.name, got, r.want)
		}
		if got := ExactlyEqual(rr, l); got != r.want {
			t.Errorf("%s (swapped): ExactlyEqual = %v, want %v", r.name, got, r.want)
		}
	}
	// The text change above keeps the id: only ExactlyEqual sees it.
	a, b := exactSamplePlan(), exactSamplePlan()
	b.Sections[0].Text = "GLOBAL\n"
	a.ComputeID()
	b.ComputeID()
	if a.ID != b.ID {
		t.Error("a text change with the same digest changed the id")
	}
}

// backendFieldClasses classifies every Backend field by the comparator that
// must notice a change to it: EqualRecord ("record"), EqualContent
// ("content"), or neither (only TextDigest, which changes whenever the
// section is re-emitted and which the caller handles).
var backendFieldClasses = map[string]string{
	"Name": "record", "Profile": "record", "Mode": "record", "GUID": "record", "Balance": "record",
	"HashType": "record", "Shape": "record", "ShapeReason": "record", "Servers": "record", "DefaultServer": "record",
	"BodyDigest": "content", "CommentsDigest": "content", "RecordDigest": "content", "ContentKnown": "content",
	"Body": "content", "Comments": "content",
	"TextDigest": "neither",
}

// setToDifferentValue changes v (settable) to a value different from its current
// one, for every kind the plan types use.
func setToDifferentValue(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "-changed")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		} else {
			n := reflect.New(v.Type().Elem())
			n.Elem().Set(v.Elem())
			setToDifferentValue(t, n.Elem())
			v.Set(n)
		}
	default:
		t.Fatalf("no way to change a %s", v.Type())
	}
}

func TestBackendComparatorsCoverEveryField(t *testing.T) {
	base := allFieldsExamplePlan().Backends["be"]
	typ := reflect.TypeFor[Backend]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		class, ok := backendFieldClasses[name]
		if !ok {
			t.Errorf("Backend.%s is not classified: add it to EqualRecord or EqualContent and to this table", name)
			continue
		}
		changed := base.clone()
		setToDifferentValue(t, reflect.ValueOf(&changed).Elem().Field(i))
		record, content := !base.EqualRecord(&changed), !base.EqualContent(&changed)
		if record != (class == "record") || content != (class == "content") {
			t.Errorf("Backend.%s (%s): noticed by EqualRecord=%v, EqualContent=%v", name, class, record, content)
		}
	}
	sTyp := reflect.TypeFor[Server]()
	for i := range sTyp.NumField() {
		changed := base.clone()
		setToDifferentValue(t, reflect.ValueOf(&changed.Servers[0]).Elem().Field(i))
		if base.EqualRecord(&changed) || base.Servers[0].Equal(&changed.Servers[0]) || !base.EqualContent(&changed) {
			t.Errorf("Server.%s: not noticed by EqualRecord and Server.Equal only", sTyp.Field(i).Name)
		}
	}
	serverRows := []struct {
		name   string
		mutate func(s *Server)
	}{
		{"weight nil to &1", func(s *Server) { s.Weight = nil }},
		{"weight &1 to &2", func(s *Server) { s.Weight = weightOf(1) }},
		{"extra args", func(s *Server) { s.Extra = []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"3s"}}} }},
	}
	for _, r := range serverRows {
		left := base.clone()
		r.mutate(&left.Servers[0])
		right := left.clone()
		switch r.name {
		case "weight nil to &1":
			right.Servers[0].Weight = weightOf(1)
		case "weight &1 to &2":
			right.Servers[0].Weight = weightOf(2)
		default:
			right.Servers[0].Extra[1].Args[0] = "4s"
		}
		if left.EqualRecord(&right) || left.Servers[0].Equal(&right.Servers[0]) {
			t.Errorf("%s: not noticed", r.name)
		}
	}
}

func TestBackendComparatorsTreatEmptyAndNilAlike(t *testing.T) {
	a := Backend{Name: "b", Servers: nil, DefaultServer: nil, Body: nil, Comments: nil}
	b := Backend{Name: "b", Servers: []Server{}, DefaultServer: []KeywordArg{}, Body: []string{}, Comments: []string{}}
	if !a.EqualRecord(&b) || !a.EqualContent(&b) || !b.EqualRecord(&a) || !b.EqualContent(&a) {
		t.Error("nil and empty Servers, DefaultServer, Body, Comments differ")
	}
	s1 := Server{Name: "s", Extra: nil}
	s2 := Server{Name: "s", Extra: []KeywordArg{}}
	s3 := Server{Name: "s", Extra: []KeywordArg{{Name: "inter", Args: nil}}}
	s4 := Server{Name: "s", Extra: []KeywordArg{{Name: "inter", Args: []string{}}}}
	if !s1.Equal(&s2) || !s3.Equal(&s4) || !s4.Equal(&s3) {
		t.Error("nil and empty Extra or Args differ")
	}
	var nb *Backend
	var ns *Server
	if !nb.EqualRecord(nil) || !nb.EqualContent(nil) || !ns.Equal(nil) {
		t.Error("nil receiver and nil argument are not equal")
	}
	if nb.EqualRecord(&a) || a.EqualRecord(nil) || nb.EqualContent(&a) || a.EqualContent(nil) ||
		ns.Equal(&s1) || s1.Equal(nil) {
		t.Error("nil equals non-nil")
	}
}

func TestServerEqualWeight(t *testing.T) {
	rows := []struct {
		name string
		l, r *int
		want bool
	}{
		{"nil/nil", nil, nil, true},
		{"nil/&0", nil, weightOf(0), false},
		{"&0/&0 distinct pointers", weightOf(0), weightOf(0), true},
		{"&1/&2", weightOf(1), weightOf(2), false},
	}
	for _, r := range rows {
		l, rr := Server{Name: "s", Weight: r.l}, Server{Name: "s", Weight: r.r}
		if got := l.Equal(&rr); got != r.want {
			t.Errorf("%s: Equal = %v, want %v", r.name, got, r.want)
		}
		if got := rr.Equal(&l); got != r.want {
			t.Errorf("%s (swapped): Equal = %v, want %v", r.name, got, r.want)
		}
	}
}

func TestEqualKeywordArgs(t *testing.T) {
	check, inter := KeywordArg{Name: "check"}, KeywordArg{Name: "inter", Args: []string{"2s"}}
	rows := []struct {
		name string
		l, r []KeywordArg
		want bool
	}{
		{"nil/empty", nil, []KeywordArg{}, true},
		{"same", []KeywordArg{check, inter}, []KeywordArg{check, inter}, true},
		{"order swapped", []KeywordArg{check, inter}, []KeywordArg{inter, check}, false},
		{"args nil/empty", []KeywordArg{{Name: "x"}}, []KeywordArg{{Name: "x", Args: []string{}}}, true},
		{"args differ", []KeywordArg{inter}, []KeywordArg{{Name: "inter", Args: []string{"3s"}}}, false},
		{"lengths differ", []KeywordArg{check}, []KeywordArg{check, inter}, false},
	}
	for _, r := range rows {
		if got := EqualKeywordArgs(r.l, r.r); got != r.want {
			t.Errorf("%s: EqualKeywordArgs = %v, want %v", r.name, got, r.want)
		}
		if got := EqualKeywordArgs(r.r, r.l); got != r.want {
			t.Errorf("%s (swapped): EqualKeywordArgs = %v, want %v", r.name, got, r.want)
		}
	}
}

// ---------------------------------------------------------------------------
// Map files.

// parseMapEntriesRows is ParseMapEntries' table of inputs and entries; it
// also seeds FuzzParseMapEntries.
var parseMapEntriesRows = []struct {
	content string
	want    []MapEntry
}{
	{"", nil},
	{"# c\n\n   \n\t\n", nil},
	{"example.com be_app\n", []MapEntry{{"example.com", "be_app"}}},
	{"/api  be_api  extra\n", []MapEntry{{"/api", "be_api  extra"}}},
	{"  key\tvalue  \n", []MapEntry{{"key", "value"}}},
	{"lonely\n", []MapEntry{{"lonely", ""}}},
	{"# header\na 1\n   # indented comment\nb 2\n", []MapEntry{{"a", "1"}, {"b", "2"}}},
	{"a 1\nb 2\na 3\na 1\n", []MapEntry{{"a", "1"}, {"b", "2"}, {"a", "3"}, {"a", "1"}}},
	{"a 1\nb 2", []MapEntry{{"a", "1"}, {"b", "2"}}},
	{"a\r\nb 2\r\n", []MapEntry{{"a", ""}, {"b", "2"}}},
	{"a #c\n", []MapEntry{{"a", "#c"}}},
	{"k\vv\n", []MapEntry{{"k\vv", ""}}},
	{"k \v v\n", []MapEntry{{"k", "v"}}},
	{"\u00a0a b\n", []MapEntry{{"a", "b"}}},
}

func TestParseMapEntries(t *testing.T) {
	for _, r := range parseMapEntriesRows {
		if got := ParseMapEntries(r.content); !reflect.DeepEqual(got, r.want) {
			t.Errorf("ParseMapEntries(%q) = %#v, want %#v", r.content, got, r.want)
		}
	}
}

func TestMapEntriesMatch(t *testing.T) {
	rows := []struct {
		name    string
		content string
		entries []MapEntry
		want    bool
	}{
		{`""/nil`, "", nil, true},
		{`""/empty`, "", []MapEntry{}, false},
		{"comment-only/nil", "# c\n\n", nil, true},
		{"comment-only/empty", "# c\n\n", []MapEntry{}, false},
		{"one entry", "a 1\n", []MapEntry{{"a", "1"}}, true},
		{"changed value", "a 1\n", []MapEntry{{"a", "2"}}, false},
		{"dropped entry", "a 1\nb 2\n", []MapEntry{{"a", "1"}}, false},
		{"extra entry", "a 1\n", []MapEntry{{"a", "1"}, {"b", "2"}}, false},
		{"reordered duplicates", "a 1\na 2\n", []MapEntry{{"a", "2"}, {"a", "1"}}, false},
	}
	for _, r := range rows {
		if got := MapEntriesMatch(r.content, r.entries); got != r.want {
			t.Errorf("%s: MapEntriesMatch = %v, want %v", r.name, got, r.want)
		}
	}
}

// mapMatchCandidates derives entry lists that differ from parsed in every
// way MapEntriesMatch must notice, plus parsed itself.
func mapMatchCandidates(parsed []MapEntry) [][]MapEntry {
	candidates := [][]MapEntry{parsed, nil, {}, append(slices.Clone(parsed), MapEntry{Key: "added", Value: "x"})}
	if len(parsed) > 0 {
		changed := slices.Clone(parsed)
		changed[len(changed)/2].Value += "-changed"
		candidates = append(candidates, changed, slices.Clone(parsed[1:]))
	}
	return candidates
}

func TestMapEntriesMatchAgreesWithParse(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	lineKinds := []func() string{
		func() string { return fmt.Sprintf("host%d.example.com be_%d\n", rng.IntN(5), rng.IntN(3)) },
		func() string { return fmt.Sprintf("key%d\tvalue %d\n", rng.IntN(5), rng.IntN(3)) },
		func() string { return fmt.Sprintf("   indented%d   v  w  \n", rng.IntN(5)) },
		func() string { return "# a comment\n" },
		func() string { return "  # indented comment\n" },
		func() string { return "\n" },
		func() string { return " \t \n" },
		func() string { return fmt.Sprintf("bare%d\n", rng.IntN(5)) },
		func() string { return fmt.Sprintf("crlf%d v\r\n", rng.IntN(5)) },
	}
	for range 400 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(lineKinds[rng.IntN(len(lineKinds))]())
		}
		content := b.String()
		if rng.IntN(4) == 0 {
			content = strings.TrimSuffix(content, "\n")
		}
		parsed := ParseMapEntries(content)
		for _, c := range mapMatchCandidates(parsed) {
			if got, want := MapEntriesMatch(content, c), reflect.DeepEqual(parsed, c); got != want {
				t.Fatalf("MapEntriesMatch(%q, %#v) = %v, DeepEqual gives %v", content, c, got, want)
			}
		}
	}
}

func TestMapEntriesMatchDoesNotAllocate(t *testing.T) {
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "host-%04d.example.com backend-%d\n", i, i%7)
	}
	content := b.String()
	entries := ParseMapEntries(content)
	if len(entries) != 1000 {
		t.Fatalf("parsed %d entries, want 1000", len(entries))
	}
	var ok bool
	if allocs := testing.AllocsPerRun(20, func() { ok = MapEntriesMatch(content, entries) }); allocs != 0 {
		t.Errorf("MapEntriesMatch allocates %.1f times per call, want 0", allocs)
	}
	if !ok {
		t.Error("MapEntriesMatch is false for the content's own entries")
	}
}

func FuzzParseMapEntries(f *testing.F) {
	for _, r := range parseMapEntriesRows {
		f.Add(r.content)
	}
	f.Fuzz(func(t *testing.T, content string) {
		parsed := ParseMapEntries(content)
		if parsed != nil && len(parsed) == 0 {
			t.Fatalf("ParseMapEntries(%q) is empty and non-nil", content)
		}
		for _, e := range parsed {
			if e.Key == "" || e.Key[0] == '#' || strings.ContainsAny(e.Key, " \t\n") ||
				e.Value != strings.TrimSpace(e.Value) || strings.Contains(e.Value, "\n") {
				t.Fatalf("ParseMapEntries(%q) gives the malformed entry %#v", content, e)
			}
		}
		for _, c := range mapMatchCandidates(parsed) {
			if got, want := MapEntriesMatch(content, c), reflect.DeepEqual(parsed, c); got != want {
				t.Fatalf("MapEntriesMatch(%q, %#v) = %v, DeepEqual gives %v", content, c, got, want)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Plan blobs.

func TestPlanBlobFormat(t *testing.T) {
	p := allFieldsExamplePlan()
	p.ComputeID()
	blob, err := EncodePlanBlob(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(blob, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Fatalf("blob starts % x, want the zstd magic 28 b5 2f fd", blob[:4])
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	js, err := dec.DecodeAll(blob, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(p)
	if !bytes.Equal(js, want) {
		t.Errorf("blob JSON:\n got %s\nwant %s", js, want)
	}
	if !bytes.Contains(js, []byte(`"id":"`+allFieldsExampleID+`"`)) {
		t.Errorf("blob JSON lacks the real id: %s", js)
	}
}

func TestPlanBlobRoundTrip(t *testing.T) {
	plans := map[string]*Plan{
		"nil collections":   {SchemaVersion: 1},
		"empty collections": emptyCollectionsPlan(),
		"weight zero":       weightZeroExamplePlan(),
		"all fields":        allFieldsExamplePlan(),
		"sample":            computeIDSamplePlan(),
		"exact":             exactSamplePlan(),
	}
	for name, p := range plans {
		p.ComputeID()
		blob, err := EncodePlanBlob(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := DecodePlanBlob(blob)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.ID != p.ID {
			t.Errorf("%s: decoded id %s, want %s", name, got.ID, p.ID)
		}
		if !bytes.Equal(got.Canonical(), p.Canonical()) {
			t.Errorf("%s: canonical encoding changed:\n got %s\nwant %s", name, got.Canonical(), p.Canonical())
		}
		recomputed := got.Clone()
		recomputed.ComputeID()
		if recomputed.ID != p.ID {
			t.Errorf("%s: Clone().ComputeID() = %s, want %s", name, recomputed.ID, p.ID)
		}
		if (got.Sections == nil) != (p.Sections == nil) || (got.Backends == nil) != (p.Backends == nil) ||
			(got.Profiles == nil) != (p.Profiles == nil) || (got.Maps == nil) != (p.Maps == nil) ||
			(got.Files == nil) != (p.Files == nil) {
			t.Errorf("%s: nil versus empty not kept", name)
		}
		for _, s := range got.Sections {
			if s.TextKnown || s.Text != "" {
				t.Errorf("%s: decoded section %q carries local text", name, s.Name)
			}
		}
		for _, b := range got.Backends {
			if b.ContentKnown || b.Body != nil || b.Comments != nil {
				t.Errorf("%s: decoded backend %q carries local content", name, b.Name)
			}
		}
		for _, f := range got.Files {
			if f.ContentKnown || f.Content != "" {
				t.Errorf("%s: decoded file %q carries local content", name, f.Path)
			}
		}
	}
}

func TestDecodePlanBlobRefuses(t *testing.T) {
	valid, err := json.Marshal(computeIDSamplePlan())
	if err != nil {
		t.Fatal(err)
	}
	withUnknown := append([]byte(`{"unknownField":1,`), valid[1:]...)
	rows := []struct {
		name   string
		blob   []byte
		prefix string
	}{
		{"empty blob", nil, "empty"},
		{"not zstd", []byte("this is not a zstd frame at all"), "decompress:"},
		{"null", zstdSizedFrame(t, []byte("null")), "decode:"},
		{"array", zstdSizedFrame(t, []byte("[]")), "decode:"},
		{"string schema version", zstdSizedFrame(t, []byte(`{"schemaVersion":"1"}`)), "decode:"},
		{"empty object", zstdSizedFrame(t, []byte(`{}`)), "schema version 0"},
		{"newer schema with unknown field", zstdSizedFrame(t, []byte(`{"schemaVersion":2,"extra":1}`)), "schema version 2"},
		{"unknown field", zstdSizedFrame(t, withUnknown), "decode:"},
		{"trailing data", zstdSizedFrame(t, append(slices.Clone(valid), 'x')), "decode:"},
		{"truncated JSON", zstdSizedFrame(t, valid[:len(valid)/2]), "decode:"},
	}
	for _, r := range rows {
		p, err := DecodePlanBlob(r.blob)
		if p != nil {
			t.Errorf("%s: got a plan", r.name)
		}
		if want := "haptic: plan blob: " + r.prefix; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: error %v, want prefix %q", r.name, err, want)
		}
	}
	const newer = "haptic: plan blob: schema version 2 is not supported (want 1)"
	if _, err := DecodePlanBlob(zstdSizedFrame(t, []byte(`{"schemaVersion":2}`))); err == nil || err.Error() != newer {
		t.Errorf("newer schema: %v, want %q", err, newer)
	}
	// Trailing white space after the object is accepted.
	if _, err := DecodePlanBlob(zstdSizedFrame(t, append(slices.Clone(valid), " \n\t"...))); err != nil {
		t.Errorf("trailing white space: %v", err)
	}
}

func TestDecodePlanBlobLimits(t *testing.T) {
	const sizeErr = "haptic: plan blob: decompressed plan exceeds the 67108864-byte limit"
	garbage := bytes.Repeat([]byte("garbage!"), MaxPlanBlobBytes/8+1)
	if _, err := DecodePlanBlob(garbage[:MaxPlanBlobBytes+1]); err == nil ||
		err.Error() != "haptic: plan blob: 8388609 compressed bytes exceed the 8388608-byte limit" {
		t.Errorf("MaxPlanBlobBytes+1 bytes: %v", err)
	}
	if _, err := DecodePlanBlob(garbage[:MaxPlanBlobBytes]); err == nil ||
		!strings.HasPrefix(err.Error(), "haptic: plan blob: decompress:") {
		t.Errorf("MaxPlanBlobBytes bytes of garbage: %v, want a decompress error", err)
	}

	valid, err := json.Marshal(computeIDSamplePlan())
	if err != nil {
		t.Fatal(err)
	}
	padded := make([]byte, MaxPlanJSONBytes+1)
	copy(padded, valid)
	for i := len(valid); i < len(padded); i++ {
		padded[i] = ' '
	}
	framings := map[string]func(js []byte) []byte{
		"sized frame": func(js []byte) []byte { return zstdSizedFrame(t, js) },
		"streamed frame": func(js []byte) []byte {
			return zstdStreamedFrame(t, func(w *zstd.Encoder) { w.Write(js) })
		},
	}
	for name, frame := range framings {
		if p, err := DecodePlanBlob(frame(padded[:MaxPlanJSONBytes])); err != nil || p == nil {
			t.Errorf("%s of exactly MaxPlanJSONBytes: %v", name, err)
		}
		if _, err := DecodePlanBlob(frame(padded)); err == nil || err.Error() != sizeErr {
			t.Errorf("%s of MaxPlanJSONBytes+1: %v, want %q", name, err, sizeErr)
		}
	}
	padded = nil

	zeros := make([]byte, 1<<20)
	bomb := zstdStreamedFrame(t, func(w *zstd.Encoder) {
		for range 256 {
			w.Write(zeros)
		}
	})
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = DecodePlanBlob(bomb)
	runtime.ReadMemStats(&after)
	if err == nil || err.Error() != sizeErr {
		t.Errorf("256 MiB streamed zero frame: %v, want %q", err, sizeErr)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew >= 3*MaxPlanJSONBytes {
		t.Errorf("decoding the 256 MiB frame allocated %d bytes, want under %d", grew, 3*MaxPlanJSONBytes)
	} else {
		t.Logf("decoding the 256 MiB frame (%d-byte blob) allocated %d bytes", len(bomb), grew)
	}
}

func TestEncodePlanBlobRefuses(t *testing.T) {
	if blob, err := EncodePlanBlob(nil); blob != nil || err == nil || err.Error() != "haptic: plan blob: nil plan" {
		t.Errorf("nil plan: %v, %v", blob, err)
	}
	value := strings.Repeat("v", 1<<20)
	entries := make([]MapEntry, 65)
	for i := range entries {
		entries[i] = MapEntry{Key: fmt.Sprintf("k%d", i), Value: value}
	}
	p := &Plan{SchemaVersion: 1, Maps: map[string]Map{"big.map": {Path: "big.map", Entries: entries}}}
	blob, err := EncodePlanBlob(p)
	if blob != nil || err == nil || !strings.HasPrefix(err.Error(), "haptic: plan blob: plan JSON of ") ||
		!strings.HasSuffix(err.Error(), " bytes exceeds the 67108864-byte limit") {
		t.Errorf("oversized plan: blob of %d bytes, %v", len(blob), err)
	}
}
