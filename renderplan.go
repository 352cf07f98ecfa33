// This file owns the render plan: what one render states about its own
// output, its canonical encoding, plan ids, the one digest of the contract
// (XXH64), deep copy and equality, map-file parsing and plan blobs.
//
// A plan is pure data. Nothing here does I/O, reads a clock or parses
// HAProxy configuration; the generator that wrote the files produces the
// plan. The field order of every type below is part of the canonical
// encoding, so it is part of the contract: never add, remove, rename,
// reorder or retag a field without a new PlanSchemaVersion.
package haptic

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"reflect"
	"strings"
	"unicode"
	"unsafe"

	"github.com/klauspost/compress/zstd"
)

// PlanSchemaVersion is the plan format. A plan with any other value is
// unknown: consumers treat it as no plan at all and never decode it
// partially.
const PlanSchemaVersion = 1

// Section kinds.
const (
	SectionKindCore    = "core"    // global, frontends, and everything that is not a profile or backend
	SectionKindProfile = "profile" // a named defaults section that backends inherit
	SectionKindBackend = "backend" // one backend section
)

// Backend shapes.
const (
	ShapeDynamic    = "dynamic"    // can be created and filled over the runtime API
	ShapeStructural = "structural" // needs a reload to appear or disappear
)

// ConfigFilePath is the one main configuration path of every plan.
const ConfigFilePath = "haproxy.cfg"

// Plan is one render's description of its own output. Fields tagged
// json:"-" are local only: the exact bytes a controller still holds in
// memory. They never reach an id or a blob.
type Plan struct {
	SchemaVersion int                `json:"schemaVersion"`
	ID            string             `json:"id"`
	Sections      []Section          `json:"sections"`
	Backends      map[string]Backend `json:"backends"`
	Profiles      map[string]Profile `json:"profiles"`
	Maps          map[string]Map     `json:"maps"`
	CRTLists      map[string]CRTList `json:"crtLists,omitempty"`
	Files         []PlanFile         `json:"files"`
}

// Section is one run of haproxy.cfg. The sections of a plan, joined in
// order, are the config file byte for byte.
type Section struct {
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	TextDigest string `json:"textDigest"`
	Length     int    `json:"length"`

	Text      string `json:"-"`
	TextKnown bool   `json:"-"`
}

// Backend is the record a generator emitted one backend section from.
type Backend struct {
	Name          string       `json:"name"`
	Profile       string       `json:"profile,omitempty"`
	Mode          string       `json:"mode,omitempty"`
	GUID          string       `json:"guid,omitempty"`
	Balance       string       `json:"balance,omitempty"`
	HashType      string       `json:"hashType,omitempty"`
	Shape         string       `json:"shape"`
	ShapeReason   string       `json:"shapeReason,omitempty"`
	Servers       []Server     `json:"servers,omitempty"`
	DefaultServer []KeywordArg `json:"defaultServer,omitempty"`

	BodyDigest     string `json:"bodyDigest"`
	CommentsDigest string `json:"commentsDigest"`
	RecordDigest   string `json:"recordDigest"`
	TextDigest     string `json:"textDigest"`

	Body         []string `json:"-"`
	Comments     []string `json:"-"`
	ContentKnown bool     `json:"-"`
}

// Server is one server line of a backend. A nil Weight means the line has
// no weight keyword; a pointer to 0 is a real weight of 0.
type Server struct {
	Name     string       `json:"name"`
	Address  string       `json:"address"`
	Port     int          `json:"port"`
	Weight   *int         `json:"weight,omitempty"`
	Disabled bool         `json:"disabled,omitempty"`
	GUID     string       `json:"guid,omitempty"`
	Comment  string       `json:"comment,omitempty"`
	Extra    []KeywordArg `json:"extra,omitempty"`
}

// Profile is a named defaults section that backends inherit.
type Profile struct {
	Name       string `json:"name"`
	BodyDigest string `json:"bodyDigest"`
	HasRules   bool   `json:"hasRules,omitempty"`
}

// Map is the entry list of one map file, ParseMapEntries of its content.
type Map struct {
	Path    string     `json:"path"`
	Ordered bool       `json:"ordered"`
	Entries []MapEntry `json:"entries,omitempty"`
}

// MapEntry is one line of a map file: the key and the rest of the line.
type MapEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// CRTList is the entry list of one crt-list file, as the generator stated it.
type CRTList struct {
	Path    string         `json:"path"`
	Entries []CRTListEntry `json:"entries,omitempty"`
}

// CRTListEntry is one crt-list line: its certificate, ssl options and SNI
// filters.
type CRTListEntry struct {
	Cert       string       `json:"cert"`
	Options    []KeywordArg `json:"options,omitempty"`
	SNIFilters []string     `json:"sniFilters,omitempty"`
}

// PlanFile is one file the render produced.
type PlanFile struct {
	Path           string `json:"path"`
	Kind           string `json:"kind"`
	ReloadOnChange bool   `json:"reloadOnChange"`
	Digest         string `json:"digest"`
	Size           int64  `json:"size"`

	Content      string `json:"-"`
	ContentKnown bool   `json:"-"`
}

// ---------------------------------------------------------------------------
// Digests: XXH64, seed 0.

const (
	xxPrime1 uint64 = 0x9E3779B185EBCA87
	xxPrime2 uint64 = 0xC2B2AE3D27D4EB4F
	xxPrime3 uint64 = 0x165667B19E3779F9
	xxPrime4 uint64 = 0x85EBCA77C2B2AE63
	xxPrime5 uint64 = 0x27D4EB2F165667C5
)

func xxRound(acc, w uint64) uint64 {
	return bits.RotateLeft64(acc+w*xxPrime2, 31) * xxPrime1
}

func xxMerge(h, v uint64) uint64 {
	return (h^xxRound(0, v))*xxPrime1 + xxPrime4
}

// xxStripes folds every full 32-byte stripe of b into v and returns the
// number of bytes consumed.
func xxStripes(v *[4]uint64, b []byte) int {
	n := 0
	for ; len(b)-n >= 32; n += 32 {
		s := b[n : n+32 : n+32]
		v[0] = xxRound(v[0], binary.LittleEndian.Uint64(s[0:8]))
		v[1] = xxRound(v[1], binary.LittleEndian.Uint64(s[8:16]))
		v[2] = xxRound(v[2], binary.LittleEndian.Uint64(s[16:24]))
		v[3] = xxRound(v[3], binary.LittleEndian.Uint64(s[24:32]))
	}
	return n
}

// xxFinish mixes the tail (fewer than 32 bytes) into the accumulated state.
func xxFinish(v *[4]uint64, total uint64, tail []byte) uint64 {
	var h uint64
	if total >= 32 {
		h = bits.RotateLeft64(v[0], 1) + bits.RotateLeft64(v[1], 7) +
			bits.RotateLeft64(v[2], 12) + bits.RotateLeft64(v[3], 18)
		h = xxMerge(xxMerge(xxMerge(xxMerge(h, v[0]), v[1]), v[2]), v[3])
	} else {
		h = xxPrime5
	}
	h += total
	for ; len(tail) >= 8; tail = tail[8:] {
		h ^= xxRound(0, binary.LittleEndian.Uint64(tail))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if len(tail) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(tail)) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
		tail = tail[4:]
	}
	for _, c := range tail {
		h ^= uint64(c) * xxPrime5
		h = bits.RotateLeft64(h, 11) * xxPrime1
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

func xxInit() [4]uint64 {
	p1, p2 := xxPrime1, xxPrime2 // variables, so that the sums wrap modulo 2^64
	return [4]uint64{p1 + p2, p2, 0, -p1}
}

func xxh64(b []byte) uint64 {
	v := xxInit()
	n := xxStripes(&v, b)
	return xxFinish(&v, uint64(len(b)), b[n:])
}

// Digest returns the contract's digest of b: XXH64 with seed 0, as 16
// lowercase hex characters.
func Digest(b []byte) string { return FormatDigest(xxh64(b)) }

// DigestString returns Digest([]byte(s)) without copying s.
func DigestString(s string) string {
	return FormatDigest(xxh64(unsafe.Slice(unsafe.StringData(s), len(s))))
}

// FormatDigest writes sum as 8 big-endian bytes in lowercase hex: always
// exactly 16 characters, leading zeros kept.
func FormatDigest(sum uint64) string {
	const hexDigits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = hexDigits[sum&0xf]
		sum >>= 4
	}
	return string(b[:])
}

// digestHasher is the streaming form of Digest, so that the agent can hash
// files on disk without reading them whole. Sum gives the 8 big-endian
// bytes of the same value Digest formats.
type digestHasher struct {
	v     [4]uint64
	total uint64
	buf   [32]byte
	n     int // bytes buffered in buf
}

var _ hash.Hash64 = (*digestHasher)(nil)

func newDigestHasher() *digestHasher {
	h := &digestHasher{}
	h.Reset()
	return h
}

func (h *digestHasher) Reset() {
	h.v = xxInit()
	h.total = 0
	h.n = 0
}

func (h *digestHasher) Size() int      { return 8 }
func (h *digestHasher) BlockSize() int { return 32 }

func (h *digestHasher) Write(p []byte) (int, error) {
	written := len(p)
	h.total += uint64(len(p))
	if h.n > 0 {
		c := copy(h.buf[h.n:], p)
		h.n += c
		p = p[c:]
		if h.n < 32 {
			return written, nil
		}
		xxStripes(&h.v, h.buf[:])
		h.n = 0
	}
	k := xxStripes(&h.v, p)
	h.n = copy(h.buf[:], p[k:])
	return written, nil
}

func (h *digestHasher) Sum64() uint64 {
	v := h.v
	return xxFinish(&v, h.total, h.buf[:h.n])
}

func (h *digestHasher) Sum(b []byte) []byte {
	return binary.BigEndian.AppendUint64(b, h.Sum64())
}

// ---------------------------------------------------------------------------
// Canonical encoding and plan ids.

// Canonical returns the canonical encoding of the plan: exactly the bytes
// json.Marshal produces for a copy of the plan whose ID is "". It never
// writes to p, so concurrent calls on a shared plan are race-free, and it
// caches nothing: every call encodes what the plan holds at that moment.
func (p *Plan) Canonical() []byte {
	c := *p
	c.ID = ""
	b, err := json.Marshal(&c)
	if err != nil {
		panic("haptic: encoding the plan failed: " + err.Error())
	}
	return b
}

// ComputeID sets p.ID to the digest of the canonical encoding. It writes
// p.ID, so it needs exclusive access to the plan.
func (p *Plan) ComputeID() {
	p.ID = Digest(p.Canonical())
}

// ---------------------------------------------------------------------------
// Clone and equality.

// Clone returns a deep, independent copy of the plan, keeping ID, the
// local-only fields and nil versus empty at every level. Strings are shared
// because they are immutable.
func (p *Plan) Clone() *Plan {
	if p == nil {
		return nil
	}
	c := *p
	c.Sections = cloneSlice(p.Sections)
	c.Files = cloneSlice(p.Files)
	if p.Backends != nil {
		c.Backends = make(map[string]Backend, len(p.Backends))
		for k, b := range p.Backends {
			c.Backends[k] = b.clone()
		}
	}
	if p.Profiles != nil {
		c.Profiles = make(map[string]Profile, len(p.Profiles))
		for k, v := range p.Profiles {
			c.Profiles[k] = v
		}
	}
	if p.Maps != nil {
		c.Maps = make(map[string]Map, len(p.Maps))
		for k, m := range p.Maps {
			m.Entries = cloneSlice(m.Entries)
			c.Maps[k] = m
		}
	}
	if p.CRTLists != nil {
		c.CRTLists = make(map[string]CRTList, len(p.CRTLists))
		for k, l := range p.CRTLists {
			if l.Entries != nil {
				entries := make([]CRTListEntry, len(l.Entries))
				for i, e := range l.Entries {
					e.Options = cloneKeywordArgs(e.Options)
					e.SNIFilters = cloneSlice(e.SNIFilters)
					entries[i] = e
				}
				l.Entries = entries
			}
			c.CRTLists[k] = l
		}
	}
	return &c
}

func (b Backend) clone() Backend {
	if b.Servers != nil {
		servers := make([]Server, len(b.Servers))
		for i, s := range b.Servers {
			servers[i] = s.clone()
		}
		b.Servers = servers
	}
	b.DefaultServer = cloneKeywordArgs(b.DefaultServer)
	b.Body = cloneSlice(b.Body)
	b.Comments = cloneSlice(b.Comments)
	return b
}

func (s Server) clone() Server {
	if s.Weight != nil {
		w := *s.Weight
		s.Weight = &w
	}
	s.Extra = cloneKeywordArgs(s.Extra)
	return s
}

// cloneSlice copies a slice of values, keeping nil as nil and empty as
// empty.
func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

func cloneKeywordArgs(kws []KeywordArg) []KeywordArg {
	if kws == nil {
		return nil
	}
	c := make([]KeywordArg, len(kws))
	for i, kw := range kws {
		c[i] = KeywordArg{Name: kw.Name, Args: cloneSlice(kw.Args)}
	}
	return c
}

// ExactlyEqual reports full identity of two renders without trusting any
// digest: both plans must carry exact local content (every section text,
// backend body and file content known), and then every field except ID is
// compared, local-only fields included, nil and empty being different.
func ExactlyEqual(left, right *Plan) bool {
	if !left.exact() || !right.exact() {
		return false
	}
	l, r := *left, *right
	l.ID, r.ID = "", ""
	return reflect.DeepEqual(l, r)
}

// exact reports whether p carries the exact bytes of everything it
// describes.
func (p *Plan) exact() bool {
	if p == nil {
		return false
	}
	for i := range p.Sections {
		if !p.Sections[i].TextKnown {
			return false
		}
	}
	for _, b := range p.Backends {
		if !b.ContentKnown {
			return false
		}
	}
	for i := range p.Files {
		if !p.Files[i].ContentKnown {
			return false
		}
	}
	return true
}

// EqualRecord compares the fields that describe the backend itself: name,
// profile, mode, guid, balance, hash type, shape and its reason, the
// servers and the default-server keywords. TextDigest is in neither
// comparator: it changes whenever the section is re-emitted.
func (b *Backend) EqualRecord(other *Backend) bool {
	if b == nil || other == nil {
		return b == other
	}
	if b.Name != other.Name || b.Profile != other.Profile || b.Mode != other.Mode ||
		b.GUID != other.GUID || b.Balance != other.Balance || b.HashType != other.HashType ||
		b.Shape != other.Shape || b.ShapeReason != other.ShapeReason {
		return false
	}
	if len(b.Servers) != len(other.Servers) {
		return false
	}
	for i := range b.Servers {
		if !b.Servers[i].Equal(&other.Servers[i]) {
			return false
		}
	}
	return EqualKeywordArgs(b.DefaultServer, other.DefaultServer)
}

// EqualContent compares the description of the backend's text: the body,
// comments and record digests, ContentKnown, and the body and comment
// lines.
func (b *Backend) EqualContent(other *Backend) bool {
	if b == nil || other == nil {
		return b == other
	}
	return b.BodyDigest == other.BodyDigest &&
		b.CommentsDigest == other.CommentsDigest &&
		b.RecordDigest == other.RecordDigest &&
		b.ContentKnown == other.ContentKnown &&
		equalStrings(b.Body, other.Body) &&
		equalStrings(b.Comments, other.Comments)
}

// Equal compares every field of two server records, weights by value.
func (s *Server) Equal(other *Server) bool {
	if s == nil || other == nil {
		return s == other
	}
	if s.Name != other.Name || s.Address != other.Address || s.Port != other.Port ||
		s.Disabled != other.Disabled || s.GUID != other.GUID || s.Comment != other.Comment {
		return false
	}
	if (s.Weight == nil) != (other.Weight == nil) {
		return false
	}
	if s.Weight != nil && *s.Weight != *other.Weight {
		return false
	}
	return EqualKeywordArgs(s.Extra, other.Extra)
}

// EqualKeywordArgs reports whether both lists hold the same keywords with
// the same args in the same order. Nil and empty lists are equal, because
// JSON drops both.
func EqualKeywordArgs(left, right []KeywordArg) bool {
	if len(left) != len(right) {
		return false
	}
	for i := range left {
		if left[i].Name != right[i].Name || !equalStrings(left[i].Args, right[i].Args) {
			return false
		}
	}
	return true
}

// equalStrings compares two string lists element by element; nil equals
// empty.
func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------------
// Map files.

// ParseMapEntries reads a rendered map file (our own output format, not
// HAProxy configuration): one entry per line, the key up to the first space
// or tab, the value the rest of the line trimmed. Blank lines and lines
// starting with '#' are skipped; duplicates are kept in order because
// HAProxy map lookups work on a multiset. No entries gives nil, never an
// empty slice.
func ParseMapEntries(content string) []MapEntry {
	var entries []MapEntry
	for rest := content; rest != ""; {
		var line string
		line, rest = nextMapLine(rest)
		if key, value, ok := parseMapLine(line); ok {
			entries = append(entries, MapEntry{Key: key, Value: value})
		}
	}
	return entries
}

// MapEntriesMatch reports exactly reflect.DeepEqual(ParseMapEntries(content),
// entries), without building the entry list.
func MapEntriesMatch(content string, entries []MapEntry) bool {
	i := 0
	for rest := content; rest != ""; {
		var line string
		line, rest = nextMapLine(rest)
		key, value, ok := parseMapLine(line)
		if !ok {
			continue
		}
		if i >= len(entries) || entries[i].Key != key || entries[i].Value != value {
			return false
		}
		i++
	}
	if i == 0 {
		return entries == nil
	}
	return i == len(entries)
}

// nextMapLine cuts content at the first "\n".
func nextMapLine(content string) (line, rest string) {
	if i := strings.IndexByte(content, '\n'); i >= 0 {
		return content[:i], content[i+1:]
	}
	return content, ""
}

// parseMapLine applies the line rules of ParseMapEntries to one line.
func parseMapLine(line string) (key, value string, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", "", false
	}
	i := strings.IndexAny(line, " \t")
	if i < 0 {
		return line, "", true
	}
	return line[:i], strings.TrimFunc(line[i+1:], unicode.IsSpace), true
}

// ---------------------------------------------------------------------------
// Plan blobs.

// EncodePlanBlob returns the plan's JSON (with its id) compressed as one
// zstd frame. It neither computes nor changes the id: call ComputeID first.
func EncodePlanBlob(p *Plan) ([]byte, error) {
	if p == nil {
		return nil, errors.New("haptic: plan blob: nil plan")
	}
	js, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("haptic: plan blob: encode: %w", err)
	}
	if len(js) > MaxPlanJSONBytes {
		return nil, fmt.Errorf("haptic: plan blob: plan JSON of %d bytes exceeds the %d-byte limit", len(js), MaxPlanJSONBytes)
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, fmt.Errorf("haptic: plan blob: compress: %w", err)
	}
	blob := enc.EncodeAll(js, nil)
	enc.Close()
	if len(blob) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("haptic: plan blob: %d compressed bytes exceed the %d-byte limit", len(blob), MaxPlanBlobBytes)
	}
	return blob, nil
}

// DecodePlanBlob decompresses and decodes a plan blob, bounded at every
// step: the compressed size, the decompressed size while it streams, the
// schema version before anything else, then a strict decode. It never
// returns a partial plan. The decoded plan carries the blob's id as is and
// no local content.
func DecodePlanBlob(blob []byte) (*Plan, error) {
	if len(blob) == 0 {
		return nil, errors.New("haptic: plan blob: empty")
	}
	if len(blob) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("haptic: plan blob: %d compressed bytes exceed the %d-byte limit", len(blob), MaxPlanBlobBytes)
	}
	dec, err := zstd.NewReader(bytes.NewReader(blob),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(MaxPlanJSONBytes),
		zstd.WithDecoderMaxMemory(MaxPlanJSONBytes+1))
	if err != nil {
		return nil, fmt.Errorf("haptic: plan blob: decompress: %w", err)
	}
	defer dec.Close()
	var js bytes.Buffer
	n, err := io.Copy(&js, io.LimitReader(dec, MaxPlanJSONBytes+1))
	if n > MaxPlanJSONBytes {
		return nil, fmt.Errorf("haptic: plan blob: decompressed plan exceeds the %d-byte limit", MaxPlanJSONBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("haptic: plan blob: decompress: %w", err)
	}
	var head struct {
		SchemaVersion int `json:"schemaVersion"`
	}
	if err := json.Unmarshal(js.Bytes(), &head); err != nil {
		return nil, fmt.Errorf("haptic: plan blob: decode: %w", err)
	}
	if bytes.HasPrefix(bytes.TrimLeft(js.Bytes(), " \t\r\n"), []byte("null")) {
		return nil, errors.New("haptic: plan blob: decode: the plan is null")
	}
	if head.SchemaVersion != PlanSchemaVersion {
		return nil, fmt.Errorf("haptic: plan blob: schema version %d is not supported (want %d)", head.SchemaVersion, PlanSchemaVersion)
	}
	d := json.NewDecoder(bytes.NewReader(js.Bytes()))
	d.DisallowUnknownFields()
	var p Plan
	if err := d.Decode(&p); err != nil {
		return nil, fmt.Errorf("haptic: plan blob: decode: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("haptic: plan blob: decode: data after the plan object")
	}
	return &p, nil
}
