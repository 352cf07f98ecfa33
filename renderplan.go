// This file owns the render plan: what one render states about its own
// output, its canonical encoding, plan ids, the one digest of the contract
// (XXH64), deep copy and equality, map-file parsing and plan blobs.
//
// A plan is pure data. Nothing here reads a clock or parses HAProxy
// configuration; the generator that wrote the files produces the plan. The
// one piece of I/O is PlanFromDir, at the end, which describes a directory
// of already rendered files by a fixed convention.
//
// The field order of every type below is part of the canonical encoding, so
// it is part of the contract: never add, remove, rename, reorder or retag a
// field without a new PlanSchemaVersion.

package haptic

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/bits"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
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

// Plan is one render's description of its own output, made by the
// generator that wrote the files (or PlanFromDir). Fields tagged json:"-"
// are local only: the exact bytes a controller still holds in memory. They
// never reach an id or a blob. The JSON names are camelCase (schemaVersion,
// crtLists), unlike the wire's snake_case (crt_lists): both are the
// upstream contract, and neither may be tidied to match the other.
type Plan struct {
	SchemaVersion int                `json:"schemaVersion"`      // PlanSchemaVersion
	ID            string             `json:"id"`                 // the plan id, set by ComputeID
	Sections      []Section          `json:"sections"`           // haproxy.cfg's runs, in file order
	Backends      map[string]Backend `json:"backends"`           // the backend records, by name
	Profiles      map[string]Profile `json:"profiles"`           // the defaults sections backends inherit, by name
	Maps          map[string]Map     `json:"maps"`               // the map files' entries, by path
	CRTLists      map[string]CRTList `json:"crtLists,omitempty"` // the crt-lists' entries, by path; the only omitempty field
	Files         []PlanFile         `json:"files"`              // every file the render produced, in the producer's order
}

// Section is one run of haproxy.cfg. A generator's sections, joined in
// order, are the config file byte for byte; PlanFromDir's leave out the
// blank and comment lines between sections (configSections says why).
type Section struct {
	Kind       string `json:"kind"`       // a SectionKind* value
	Name       string `json:"name"`       // unique in its kind: the backend's or profile's name; PlanFromDir's header line
	TextDigest string `json:"textDigest"` // DigestString(Text)
	Length     int    `json:"length"`     // len(Text)

	Text      string `json:"-"` // the section's exact bytes
	TextKnown bool   `json:"-"` // Text holds them; false in a plan decoded from a blob
}

// Backend is the record a generator emitted one backend section from.
type Backend struct {
	Name          string       `json:"name"`                    // its key in Plan.Backends
	Profile       string       `json:"profile,omitempty"`       // the profile it inherits; "" for none
	Mode          string       `json:"mode,omitempty"`          // http or tcp; "" when not stated
	GUID          string       `json:"guid,omitempty"`          // its guid keyword
	Balance       string       `json:"balance,omitempty"`       // the balance algorithm
	HashType      string       `json:"hashType,omitempty"`      // the hash-type arguments
	Shape         string       `json:"shape"`                   // a Shape* value; anything but dynamic is structural
	ShapeReason   string       `json:"shapeReason,omitempty"`   // why it is structural, for a reason text
	Servers       []Server     `json:"servers,omitempty"`       // its server lines, in order
	DefaultServer []KeywordArg `json:"defaultServer,omitempty"` // its default-server keywords, in order

	BodyDigest     string `json:"bodyDigest"`     // the body lines' digest, opaque: compared for equality only
	CommentsDigest string `json:"commentsDigest"` // the comment lines' digest, opaque
	RecordDigest   string `json:"recordDigest"`   // the record fields' digest, opaque
	TextDigest     string `json:"textDigest"`     // its section's TextDigest

	Body         []string `json:"-"` // the body lines
	Comments     []string `json:"-"` // the comment lines
	ContentKnown bool     `json:"-"` // Body and Comments hold them; false in a plan decoded from a blob
}

// Server is one server line of a backend. A nil Weight means the line has
// no weight keyword; a pointer to 0 is a real weight of 0.
type Server struct {
	Name     string       `json:"name"`               // the server's name
	Address  string       `json:"address"`            // an IP address or a host name
	Port     int          `json:"port"`               // the port
	Weight   *int         `json:"weight,omitempty"`   // its weight keyword; nil for none
	Disabled bool         `json:"disabled,omitempty"` // the line carries disabled: the server starts in MAINT
	GUID     string       `json:"guid,omitempty"`     // its guid keyword
	Comment  string       `json:"comment,omitempty"`  // the line's comment
	Extra    []KeywordArg `json:"extra,omitempty"`    // every other keyword, in line order (check, inter 2s)
}

// Profile is a named defaults section that backends inherit.
type Profile struct {
	Name       string `json:"name"`               // its key in Plan.Profiles
	BodyDigest string `json:"bodyDigest"`         // the body's digest, opaque
	HasRules   bool   `json:"hasRules,omitempty"` // the section declares rules
}

// Map is the entry list of one map file, ParseMapEntries of its content.
type Map struct {
	Path    string     `json:"path"`              // the file's path, as HAProxy names it
	Ordered bool       `json:"ordered"`           // lookups depend on entry order (first match wins)
	Entries []MapEntry `json:"entries,omitempty"` // in file order, duplicates kept; nil when empty
}

// MapEntry is one line of a map file: the key and the rest of the line.
type MapEntry struct {
	Key   string `json:"key"`   // the line's first word
	Value string `json:"value"` // the rest of the line
}

// CRTList is the entry list of one crt-list file, as the generator stated it.
type CRTList struct {
	Path    string         `json:"path"`              // the file's path, as HAProxy names it
	Entries []CRTListEntry `json:"entries,omitempty"` // its lines, in order
}

// CRTListEntry is one crt-list line: its certificate, ssl options and SNI
// filters.
type CRTListEntry struct {
	Cert       string       `json:"cert"`                 // the certificate, as the line names it
	Options    []KeywordArg `json:"options,omitempty"`    // the [ssl options] between brackets
	SNIFilters []string     `json:"sniFilters,omitempty"` // the SNI filters that select the certificate
}

// PlanFile is one file the render produced.
type PlanFile struct {
	Path           string `json:"path"`           // base-relative, as HAProxy names it; unique in Files
	Kind           string `json:"kind"`           // a FileKind* value
	ReloadOnChange bool   `json:"reloadOnChange"` // a change to this file needs a reload
	Digest         string `json:"digest"`         // DigestString(Content)
	Size           int64  `json:"size"`           // len(Content)

	Content      string `json:"-"` // the file's exact bytes
	ContentKnown bool   `json:"-"` // Content holds them; false in a plan decoded from a blob
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
// files on disk without reading them whole.
type digestHasher struct {
	v     [4]uint64
	total uint64
	buf   [32]byte
	n     int // bytes buffered in buf
}

// copyBuffers are the buffers streaming copies share: io.Copy allocates 32
// KiB whenever neither side can copy on its own, once per part of every
// apply on both ends, and the garbage shows as latency.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBytes is io.Copy with a shared buffer.
func copyBytes(dst io.Writer, src io.Reader) (int64, error) {
	b := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(b)
	return io.CopyBuffer(dst, src, *b)
}

// copyAtMost is io.CopyN with a shared buffer.
func copyAtMost(dst io.Writer, src io.Reader, n int64) (int64, error) {
	written, err := copyBytes(dst, io.LimitReader(src, n))
	if written == n {
		return n, nil
	}
	if written < n && err == nil {
		err = io.EOF
	}
	return written, err
}

func newDigestHasher() *digestHasher { return &digestHasher{v: xxInit()} }

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

// ---------------------------------------------------------------------------
// Canonical encoding and plan ids.
//
// The canonical encoding is, by contract, exactly what encoding/json's
// json.Marshal writes for the types above (HTML escaping on, map keys
// sorted by their bytes) with the id blanked, so it is json.Marshal. A
// hand-written writer was measured against it on a 3,000-backend plan: a
// median ComputeID of 3.0 ms against 8.3 ms on a loaded 2-core machine.
// Both are within the 10 ms budget of a controller that identifies every
// render, so the 330 lines that every change to a type above had to follow
// were not worth the difference.

// Canonical returns the canonical encoding of the plan: exactly the bytes
// json.Marshal produces for a copy of the plan whose ID is "". It never
// writes to p, so concurrent calls on a shared plan are race-free, and it
// caches nothing: every call encodes what the plan holds at that moment.
// The result is a new slice the caller owns. A nil plan panics.
func (p *Plan) Canonical() []byte { return p.marshal("") }

// ComputeID sets p.ID to the digest of the canonical encoding. It writes
// p.ID, so it needs exclusive access to the plan.
func (p *Plan) ComputeID() { p.ID = Digest(p.marshal("")) }

// marshal is the JSON of p with id in place of p.ID: "" for the canonical
// encoding, p.ID for a blob. The copy is shallow, so p is only read.
func (p *Plan) marshal(id string) []byte {
	if p == nil {
		panic("haptic: encoding the plan failed: nil plan")
	}
	c := *p
	c.ID = id
	b, err := json.Marshal(&c)
	if err != nil { // no field of a plan holds a value json.Marshal refuses
		panic("haptic: encoding the plan failed: " + err.Error())
	}
	return b
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
	c.Backends = cloneValues(p.Backends, Backend.clone)
	c.Profiles = maps.Clone(p.Profiles)
	c.Maps = cloneValues(p.Maps, func(m Map) Map { m.Entries = cloneSlice(m.Entries); return m })
	c.CRTLists = cloneValues(p.CRTLists, func(l CRTList) CRTList {
		l.Entries = cloneEach(l.Entries, func(e CRTListEntry) CRTListEntry {
			e.Options, e.SNIFilters = cloneKeywordArgs(e.Options), cloneSlice(e.SNIFilters)
			return e
		})
		return l
	})
	return &c
}

func (b Backend) clone() Backend {
	b.Servers = cloneEach(b.Servers, Server.clone)
	b.DefaultServer = cloneKeywordArgs(b.DefaultServer)
	b.Body, b.Comments = cloneSlice(b.Body), cloneSlice(b.Comments)
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

func cloneKeywordArgs(kws []KeywordArg) []KeywordArg {
	return cloneEach(kws, func(kw KeywordArg) KeywordArg { kw.Args = cloneSlice(kw.Args); return kw })
}

// cloneSlice copies a slice of values, keeping nil as nil and empty as
// empty.
func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

// cloneEach is cloneSlice with every element deep-copied by clone.
func cloneEach[T any](s []T, clone func(T) T) []T {
	c := cloneSlice(s)
	for i := range c {
		c[i] = clone(c[i])
	}
	return c
}

// cloneValues copies a map with every value deep-copied by clone, keeping
// nil as nil.
func cloneValues[V any](m map[string]V, clone func(V) V) map[string]V {
	c := maps.Clone(m)
	for k, v := range c {
		c[k] = clone(v)
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
	if p == nil || slices.ContainsFunc(p.Sections, func(s Section) bool { return !s.TextKnown }) ||
		slices.ContainsFunc(p.Files, func(f PlanFile) bool { return !f.ContentKnown }) {
		return false
	}
	for _, b := range p.Backends {
		if !b.ContentKnown {
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
	return b.Name == other.Name && b.Profile == other.Profile && b.Mode == other.Mode &&
		b.GUID == other.GUID && b.Balance == other.Balance && b.HashType == other.HashType &&
		b.Shape == other.Shape && b.ShapeReason == other.ShapeReason &&
		serversEqual(b.Servers, other.Servers) && EqualKeywordArgs(b.DefaultServer, other.DefaultServer)
}

// EqualContent compares the description of the backend's text: the body,
// comments and record digests, ContentKnown, and the body and comment
// lines.
func (b *Backend) EqualContent(other *Backend) bool {
	if b == nil || other == nil {
		return b == other
	}
	return b.BodyDigest == other.BodyDigest && b.CommentsDigest == other.CommentsDigest &&
		b.RecordDigest == other.RecordDigest && b.ContentKnown == other.ContentKnown &&
		slices.Equal(b.Body, other.Body) && slices.Equal(b.Comments, other.Comments)
}

// Equal compares every field of two server records, weights by value.
func (s *Server) Equal(other *Server) bool {
	if s == nil || other == nil {
		return s == other
	}
	return s.Name == other.Name && s.Address == other.Address && s.Port == other.Port &&
		s.Disabled == other.Disabled && s.GUID == other.GUID && s.Comment == other.Comment &&
		sameWeight(s.Weight, other.Weight) && EqualKeywordArgs(s.Extra, other.Extra)
}

// sameWeight compares two weight keywords: both absent, or both present
// with the same value.
func sameWeight(a, b *int) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func serversEqual(a, b []Server) bool {
	return slices.EqualFunc(a, b, func(x, y Server) bool { return x.Equal(&y) })
}

// EqualKeywordArgs reports whether both lists hold the same keywords with
// the same args in the same order. Nil and empty lists are equal, because
// JSON drops both.
func EqualKeywordArgs(left, right []KeywordArg) bool {
	return slices.EqualFunc(left, right, func(a, b KeywordArg) bool {
		return a.Name == b.Name && slices.Equal(a.Args, b.Args)
	})
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
	for line := range strings.SplitSeq(content, "\n") {
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
	for line := range strings.SplitSeq(content, "\n") {
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
	return line[:i], strings.TrimSpace(line[i+1:]), true
}

// ---------------------------------------------------------------------------
// Plan blobs.

// EncodePlanBlob returns the plan's JSON (json.Marshal(p), id included)
// compressed as one zstd frame at the default level. It neither computes
// nor changes the id: call ComputeID first. A blob it returns is always one
// DecodePlanBlob accepts when p.SchemaVersion is PlanSchemaVersion.
func EncodePlanBlob(p *Plan) ([]byte, error) {
	if p == nil {
		return nil, errors.New("haptic: plan blob: nil plan")
	}
	return compressPlanJSON(p.marshal(p.ID))
}

// compressPlanJSON is the blob of a plan's JSON: one zstd frame at the
// default level, both sizes within their limits.
func compressPlanJSON(js []byte) ([]byte, error) {
	if len(js) > MaxPlanJSONBytes {
		return nil, fmt.Errorf("haptic: plan blob: plan JSON of %d bytes exceeds the %d-byte limit", len(js), MaxPlanJSONBytes)
	}
	// One encoder per call: EncodeAll needs no goroutines, and a shared
	// encoder would keep its window buffers alive in a process (the agent)
	// that may never encode again.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
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
// step: the compressed size before anything is decompressed, the
// decompressed size while it streams, the schema version before anything
// else is decoded, then a strict decode (unknown fields and trailing data
// refused). It never returns a partial plan. The decoded plan carries the
// blob's id as is, keeps nil versus empty, and has no local content.
func DecodePlanBlob(blob []byte) (*Plan, error) {
	if len(blob) == 0 {
		return nil, errors.New("haptic: plan blob: empty")
	}
	if len(blob) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("haptic: plan blob: %d compressed bytes exceed the %d-byte limit", len(blob), MaxPlanBlobBytes)
	}
	js, err := inflatePlanJSON(blob)
	if err != nil {
		return nil, err
	}
	// A plan of this schema decodes in one pass. Only one that does not is
	// read a second time, for its schema version alone: a newer schema must
	// be reported as such even when it carries fields this version does not
	// know. (One pass matters: a big map's plan is megabytes of JSON.)
	p, err := decodePlanJSON(js)
	if err == nil && p.SchemaVersion == PlanSchemaVersion {
		return p, nil
	}
	var head *struct {
		SchemaVersion int `json:"schemaVersion"`
	}
	switch herr := json.Unmarshal(js, &head); {
	case herr != nil:
		return nil, fmt.Errorf("haptic: plan blob: decode: %w", herr)
	case head == nil: // JSON null, which json.Unmarshal takes; a plan is an object
		return nil, errors.New("haptic: plan blob: decode: the plan JSON is not an object")
	case head.SchemaVersion != PlanSchemaVersion:
		return nil, fmt.Errorf("haptic: plan blob: schema version %d is not supported (want %d)", head.SchemaVersion, PlanSchemaVersion)
	}
	return nil, err
}

// decodePlanJSON decodes exactly one plan object, refusing unknown fields
// and anything after it.
func decodePlanJSON(js []byte) (*Plan, error) {
	d := json.NewDecoder(bytes.NewReader(js))
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

// errPlanJSONTooLarge is the decompressed-size refusal of DecodePlanBlob.
var errPlanJSONTooLarge = fmt.Errorf("haptic: plan blob: decompressed plan exceeds the %d-byte limit", MaxPlanJSONBytes)

const (
	// maxEmptyReads bounds consecutive reads that return no bytes and no
	// error, so a misbehaving reader cannot spin the decompression loop.
	maxEmptyReads = 100
	// maxInflateChunk is the largest single allocation while a blob of
	// unknown size inflates.
	maxInflateChunk = 4 << 20
)

// inflatePlanJSON decompresses a blob into at most MaxPlanJSONBytes. A
// hostile frame can inflate without end and need not declare its size, so
// the output is read into chunks that double from a small start up to
// maxInflateChunk and are joined at the end: a bomb costs about the limit
// in allocations, never its own size. An honest frame (EncodePlanBlob
// writes one) declares its size and is read into one buffer of that size
// plus the byte that shows the end.
func inflatePlanJSON(blob []byte) ([]byte, error) {
	size := min(max(4*len(blob), 64<<10), maxInflateChunk)
	var header zstd.Header
	if header.Decode(blob) == nil && header.HasFCS {
		if header.FrameContentSize > MaxPlanJSONBytes {
			return nil, errPlanJSONTooLarge
		}
		size = int(header.FrameContentSize) + 1
	}
	dec, err := zstd.NewReader(bytes.NewReader(blob),
		zstd.WithDecoderConcurrency(1), // synchronous: no goroutine outlives the call
		zstd.WithDecoderMaxWindow(MaxPlanJSONBytes),
		zstd.WithDecoderMaxMemory(MaxPlanJSONBytes))
	if err != nil {
		return nil, inflateError(err)
	}
	defer dec.Close()
	var full [][]byte // filled chunks, in order
	chunk, total := make([]byte, 0, size), 0
	// Every pass reads at least one byte or returns, and total is refused
	// once it passes MaxPlanJSONBytes: the loop is bounded by the limit.
	for {
		n, err := readSome(dec, chunk[len(chunk):cap(chunk)])
		chunk, total = chunk[:len(chunk)+n], total+n
		switch {
		case total > MaxPlanJSONBytes:
			return nil, errPlanJSONTooLarge
		case err == io.EOF && len(full) == 0:
			return chunk, nil
		case err == io.EOF:
			return bytes.Join(append(full, chunk), nil), nil
		case err != nil:
			return nil, inflateError(err)
		case len(chunk) == cap(chunk):
			full = append(full, chunk)
			chunk = make([]byte, 0, min(2*cap(chunk), maxInflateChunk))
		}
	}
}

// readSome reads into p, retrying reads that return nothing at most
// maxEmptyReads times.
func readSome(r io.Reader, p []byte) (int, error) {
	for range maxEmptyReads {
		if n, err := r.Read(p); n > 0 || err != nil {
			return n, err
		}
	}
	return 0, io.ErrNoProgress
}

// inflateError names a decompression failure. The library's own size
// refusal (a frame whose declared size or window exceeds the limit) is the
// same refusal as ours.
func inflateError(err error) error {
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return errPlanJSONTooLarge
	}
	return fmt.Errorf("haptic: plan blob: decompress: %w", err)
}

// ---------------------------------------------------------------------------
// Plans from a directory.

// PlanFromDir builds a plan from a directory of rendered files by
// convention, for pushes that have no template generator behind them:
//
//   - haproxy.cfg at the root is the config file (kind config), cut into
//     one core section per top-level section (configSections), each named by
//     its header line with runs of blanks folded ("global", "frontend
//     http-in"), a repeated header with "#2", "#3", ..., so a reason names
//     the section that changed. No section is a backend record: every change
//     to haproxy.cfg reloads.
//   - *.map files are maps (kind map), their entries parsed with
//     ParseMapEntries. They are declared Ordered, the fail-closed choice: a
//     directory does not say whether a map is matched by prefix or regex, so
//     per-entry ops are composed only when they reproduce the file's order,
//     and anything else swaps the whole map atomically (map_replace).
//   - *.crt-list files are crt-lists (kind crtlist) with their entries
//     parsed: the certificate, the options inside one bracket pair, then the
//     SNI filters. In the options, allow-0rtt, no-alpn and no-ca-names take
//     no argument and every other keyword takes exactly one.
//   - Any other file holding PEM blocks is a certificate (kind cert) when a
//     block is a private key, and a CA file (kind ca) when every block is a
//     certificate.
//   - Every other regular file is general (kind general) and declared
//     ReloadOnChange: HAProxy reads error pages, Lua scripts and ACL files
//     only when it starts, so a change to one must reload.
//
// Names with a component starting with a dot and anything that is not a
// regular file or a directory are skipped; directories are walked, and a
// symbolic link is followed when it resolves inside dir (walkDir says why).
// Files are sorted by path, contents are kept (ContentKnown, and
// TextKnown for the sections) so that Diff compares exact bytes, and the id
// is computed. Collections the directory does not use are nil.
func PlanFromDir(dir string) (*Plan, error) {
	p := &Plan{SchemaVersion: PlanSchemaVersion}
	if err := p.walkDir(dir); err != nil {
		return nil, fmt.Errorf("haptic: plan from %s: %w", dir, err)
	}
	config := slices.IndexFunc(p.Files, func(f PlanFile) bool { return f.Kind == FileKindConfig })
	if config < 0 {
		return nil, fmt.Errorf("haptic: plan from %s: no %s", dir, ConfigFilePath)
	}
	p.Sections = configSections(p.Files[config].Content)
	if len(p.Sections) > MaxSections {
		return nil, fmt.Errorf("haptic: plan from %s: %d sections exceed the %d-section limit", dir, len(p.Sections), MaxSections)
	}
	// The walk visits in lexical order of each directory's entries, which
	// is not the order of the joined paths ("a-b" sorts before "a/b" as a
	// path but after it as a walk).
	slices.SortFunc(p.Files, func(a, b PlanFile) int { return strings.Compare(a.Path, b.Path) })
	p.ComputeID()
	return p, nil
}

// walkDir adds every file under dir by the convention of PlanFromDir.
//
// A symbolic link is followed when it resolves inside dir, to a file or to
// a directory: that is how Kubernetes mounts a ConfigMap or a Secret (each
// name a link into "..data/", itself a link to a timestamped directory
// that the kubelet swaps atomically), and a controller's pod has nothing
// else to read. A link that resolves outside dir, or to nothing, is an
// error rather than a silent skip: pushing a file from elsewhere on the
// controller's disk, or silently leaving one out, is never what a
// rendered directory meant. Names starting with a dot are skipped, which
// skips the mount's own "..data" and "..<timestamp>" entries. A directory
// reached twice through links is walked once.
func (p *Plan) walkDir(dir string) error {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	visited := map[string]bool{root: true}
	var walk func(abs, rel string) error
	walk = func(abs, rel string) error {
		entries, err := os.ReadDir(abs)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			path, name := filepath.Join(abs, e.Name()), e.Name()
			if rel != "" {
				name = rel + "/" + e.Name()
			}
			mode := e.Type()
			if mode&fs.ModeSymlink != 0 {
				target, err := filepath.EvalSymlinks(path)
				if err != nil {
					return fmt.Errorf("%s is a symbolic link that does not resolve: %w", name, err)
				}
				if !insideDir(root, target) {
					return fmt.Errorf("%s is a symbolic link to %s, outside the directory", name, target)
				}
				fi, err := os.Stat(target)
				if err != nil {
					return err
				}
				path, mode = target, fi.Mode().Type()
			}
			switch {
			case mode.IsDir():
				resolved, err := filepath.EvalSymlinks(path)
				if err != nil || visited[resolved] {
					continue
				}
				visited[resolved] = true
				if err := walk(path, name); err != nil {
					return err
				}
			case mode.IsRegular():
				if len(p.Files) >= MaxFiles {
					return fmt.Errorf("more than %d files", MaxFiles)
				}
				content, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				p.addDirFile(name, string(content))
			}
		}
		return nil
	}
	return walk(root, "")
}

// insideDir reports whether path, already free of symbolic links, is dir
// or lies below it.
func insideDir(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// addDirFile records one file of PlanFromDir by the convention above.
func (p *Plan) addDirFile(rel, content string) {
	f := PlanFile{Path: rel, Kind: FileKindGeneral, ReloadOnChange: true,
		Digest: DigestString(content), Size: int64(len(content)), Content: content, ContentKnown: true}
	switch {
	case rel == ConfigFilePath:
		f.Kind = FileKindConfig
	case strings.HasSuffix(rel, ".map"):
		f.Kind, f.ReloadOnChange = FileKindMap, false
		if p.Maps == nil {
			p.Maps = map[string]Map{}
		}
		p.Maps[rel] = Map{Path: rel, Ordered: true, Entries: ParseMapEntries(content)}
	case strings.HasSuffix(rel, ".crt-list"):
		f.Kind, f.ReloadOnChange = FileKindCRTList, false
		if p.CRTLists == nil {
			p.CRTLists = map[string]CRTList{}
		}
		p.CRTLists[rel] = CRTList{Path: rel, Entries: parseCRTList(content)}
	default:
		if kind := pemKind(content); kind != "" {
			f.Kind, f.ReloadOnChange = kind, false
		}
	}
	p.Files = append(p.Files, f)
}

// configSections cuts haproxy.cfg into core sections at every line whose
// first word opens a top-level section (configSectionKeywords). A section
// runs from its header to its last line that is neither blank nor only a
// comment; the lines between sections (and before the first, after the
// last) belong to none, so that a reason names only the section whose own
// lines changed: a section appended after the usual blank line changes no
// other, and a blank or comment line between two sections changes neither.
// Diff still sees such an edit, as a config change no section explains, and
// reloads saying so. The sections therefore do not join back into the file;
// nothing compares the joined texts. Content lines before the first header
// open the first section.
func configSections(config string) []Section {
	var sections []Section
	seen := map[string]int{}
	add := func(name, text string) {
		if name == "" {
			name = ConfigFilePath // a config with no section header at all
		}
		seen[name]++
		if n := seen[name]; n > 1 {
			name = fmt.Sprintf("%s#%d", name, n)
		}
		sections = append(sections, Section{Kind: SectionKindCore, Name: name,
			TextDigest: DigestString(text), Length: len(text), Text: text, TextKnown: true})
	}
	// start opens the current section (-1: none open yet), last ends its
	// last line that is not a gap line.
	start, last, name, pos := -1, -1, "", 0
	for line := range strings.Lines(config) {
		end := pos + len(line)
		switch header := sectionHeader(line); {
		case header != "":
			switch {
			case name != "":
				add(name, config[start:last])
				start = pos
			case start < 0:
				start = pos
			}
			last, name = end, header
		case isGapLine(line):
		default:
			if start < 0 {
				start = pos
			}
			last = end
		}
		pos = end
	}
	if start >= 0 {
		add(name, config[start:last])
	}
	return sections
}

// isGapLine reports whether a config line is blank or only a comment: a
// line that separates sections rather than belonging to one.
func isGapLine(line string) bool {
	t := strings.TrimSpace(line)
	return t == "" || t[0] == '#'
}

// configSectionKeywords are the keywords that open a top-level section of
// an HAProxy configuration. HAProxy does not require the lines inside a
// section to be indented, so only these start a new section.
var configSectionKeywords = map[string]bool{
	"global": true, "defaults": true, "frontend": true, "backend": true, "listen": true,
	"userlist": true, "peers": true, "mailers": true, "resolvers": true, "program": true,
	"http-errors": true, "ring": true, "log-forward": true, "cache": true, "crt-store": true,
	"traces": true, "fcgi-app": true, "acme": true,
}

// sectionHeader returns the folded header of a line that opens a top-level
// section, or "" for any other line.
func sectionHeader(line string) string {
	if i := strings.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	words := strings.Fields(line)
	if len(words) == 0 || !configSectionKeywords[words[0]] {
		return ""
	}
	return strings.Join(words, " ")
}

// crtListNoArgOptions are the crt-list ssl options that take no argument.
var crtListNoArgOptions = map[string]bool{"allow-0rtt": true, "no-alpn": true, "no-ca-names": true}

// parseCRTList reads the entries of a crt-list file: per line, the
// certificate, the options inside "[...]", then the SNI filters. Blank and
// '#' lines are skipped.
func parseCRTList(content string) []CRTListEntry {
	var entries []CRTListEntry
	for line := range strings.SplitSeq(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		var e CRTListEntry
		e.Cert, line, _ = strings.Cut(line, " ")
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			opts, after, _ := strings.Cut(line[1:], "]")
			words := strings.Fields(opts)
			for i := 0; i < len(words); i++ {
				kw := KeywordArg{Name: words[i]}
				if !crtListNoArgOptions[kw.Name] && i+1 < len(words) {
					i++
					kw.Args = []string{words[i]}
				}
				e.Options = append(e.Options, kw)
			}
			line = after
		}
		if sni := strings.Fields(line); len(sni) > 0 {
			e.SNIFilters = sni
		}
		entries = append(entries, e)
	}
	return entries
}

// maxPEMBlocks bounds the blocks pemKind reads from one file; a real
// certificate chain has a handful.
const maxPEMBlocks = 1024

// pemKind classifies PEM content: cert when a block is a private key, ca
// when every block is a certificate, "" otherwise (not PEM, or other
// blocks such as a CRL).
func pemKind(content string) string {
	rest := []byte(content)
	blocks, certs, keys := 0, 0, 0
	for n := 0; n < maxPEMBlocks; n++ {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		blocks++
		switch {
		case strings.HasSuffix(b.Type, "PRIVATE KEY"):
			keys++
		case b.Type == "CERTIFICATE":
			certs++
		}
	}
	switch {
	case keys > 0:
		return FileKindCert
	case blocks > 0 && certs == blocks:
		return FileKindCA
	}
	return ""
}
