// This file owns plan patches: the splices that turn the canonical JSON of
// one plan into the next one's (cutPlanPatch, the controller's side), their
// application (splicePlan, the agent's side), and the way back from a
// canonical JSON to the plan blob EncodePlanBlob writes (planBlobOf). It
// never decodes a plan: a spliced plan is vouched for by its hash alone,
// which is what makes a one-entry change of a large map cheap to carry and
// cheap to check.

package haptic

import (
	"bytes"
	"fmt"
)

// The resync search of cutPlanPatch. After a difference, the cut looks for
// the nearest point where both JSONs agree again: a planPatchWindow-byte
// window of the next plan found in the base within planPatchReach bytes,
// and confirmed by planPatchConfirm bytes in common (or both ends). A
// change of a map entry or a file digest differs by a few dozen bytes, so
// the reach is generous; a window alone could land on JSON punctuation that
// repeats from entry to entry, so the confirmation reaches into the next
// entry's key.
const (
	planPatchWindow  = 32
	planPatchReach   = 4 << 10
	planPatchConfirm = 128
)

// cutPlanPatch returns the splices that turn base, the canonical JSON of
// the plan baseID, into next, or nil when the whole blob is the better
// thing to send: more than MaxPlanSplices differences, or replacement data
// of more than half of next or of MaxPlanBlobBytes/2 (a patch carries its
// data in base64, and must fit where a blob does).
//
// It walks both JSONs once: the common run is skipped, then the nearest
// resync (see planPatchReach) ends a splice; with none in reach, the rest
// up to the common suffix is one splice. Any splices that rebuild next are
// correct, so a resync that is not the closest costs bytes, never
// correctness; the agent checks the result by its hash anyway.
func cutPlanPatch(base, next, baseID string) *PlanPatch {
	p := &PlanPatch{BaseDigest: baseID, BaseSize: int64(len(base)), Splices: []PlanSplice{}}
	limit := min(len(next)/2, MaxPlanBlobBytes/2)
	data := 0
	i, j := 0, 0 // positions in base and next
	for {
		n := commonPrefixLen(base[i:], next[j:])
		i, j = i+n, j+n
		if i == len(base) && j == len(next) {
			return p
		}
		if len(p.Splices) == MaxPlanSplices {
			return nil
		}
		di, dj, ok := planResync(base[i:], next[j:])
		if !ok {
			s := commonSuffixLen(base[i:], next[j:])
			di, dj = len(base)-i-s, len(next)-j-s
		}
		if data += dj; data > limit {
			return nil
		}
		p.Splices = append(p.Splices, PlanSplice{Offset: int64(i), Length: int64(di), Data: []byte(next[j : j+dj])})
		i, j = i+di, j+dj
	}
}

// planResync finds the nearest point where a and b agree again after they
// differ at their first byte: the smallest offset in b, then the smallest
// in a, whose planPatchWindow bytes match and go on matching for
// planPatchConfirm bytes or to both ends.
func planResync(a, b string) (da, db int, ok bool) {
	windows := make(map[string]int, planPatchReach)
	for k := 0; k <= planPatchReach && k+planPatchWindow <= len(a); k++ {
		if _, seen := windows[a[k:k+planPatchWindow]]; !seen {
			windows[a[k:k+planPatchWindow]] = k
		}
	}
	for db = 0; db <= planPatchReach && db+planPatchWindow <= len(b); db++ {
		da, ok = windows[b[db:db+planPatchWindow]]
		if !ok {
			continue
		}
		n := commonPrefixLen(a[da:], b[db:])
		if n >= planPatchConfirm || da+n == len(a) && db+n == len(b) {
			return da, db, true
		}
	}
	return 0, 0, false
}

// splicePlan applies p to base, the canonical JSON of the plan whose id is
// p.BaseDigest (the caller has matched it), refusing a patch that does not
// fit: another base size, too many splices, a splice out of order or
// outside the base, a result over MaxPlanJSONBytes. It writes the result
// into dst when dst is large enough (dst must not overlap base), and into
// a new slice otherwise. What it returns is still to be hashed against the
// plan id it claims to be.
func splicePlan(dst, base []byte, p *PlanPatch) ([]byte, error) {
	switch {
	case p.BaseSize != int64(len(base)):
		return nil, fmt.Errorf("plan patch is cut from %d bytes, the held plan has %d", p.BaseSize, len(base))
	case len(p.Splices) > MaxPlanSplices:
		return nil, fmt.Errorf("plan patch has %d splices, more than %d", len(p.Splices), MaxPlanSplices)
	}
	size, at := int64(len(base)), int64(0)
	for k, s := range p.Splices {
		if s.Offset < at || s.Length < 0 || s.Offset > p.BaseSize || s.Length > p.BaseSize-s.Offset {
			return nil, fmt.Errorf("plan patch splice %d (offset %d, length %d) is out of order or outside the %d-byte base", k, s.Offset, s.Length, p.BaseSize)
		}
		at = s.Offset + s.Length
		if size += int64(len(s.Data)) - s.Length; size > MaxPlanJSONBytes {
			return nil, fmt.Errorf("plan patch makes a plan JSON of more than %d bytes", MaxPlanJSONBytes)
		}
	}
	out := dst[:0]
	if int64(cap(out)) < size {
		out = make([]byte, 0, size)
	}
	at = 0
	for _, s := range p.Splices {
		out = append(append(out, base[at:s.Offset]...), s.Data...)
		at = s.Offset + s.Length
	}
	return append(out, base[at:]...), nil
}

// planBlobOf is EncodePlanBlob of the plan whose canonical JSON is js and
// whose id is id, byte for byte, without decoding it: the JSON json.Marshal
// writes for a plan starts with its schema version and then its id, so the
// plan's JSON is js with id written into the blank id. A plan id is a
// Digest, hex digits that need no escaping.
func planBlobOf(js []byte, id string) ([]byte, error) {
	head := planJSONHead(js)
	if head < 0 || len(js) < head+1 || js[head] != '"' {
		return nil, fmt.Errorf("haptic: plan blob: the plan JSON does not start with a blank id")
	}
	withID := make([]byte, 0, len(js)+len(id))
	withID = append(append(append(withID, js[:head]...), id...), js[head:]...)
	return compressPlanJSON(withID)
}

// planJSONHead is the offset of the id's value in a plan's JSON, just past
// `{"schemaVersion":N,"id":"`, or -1 when js does not start that way.
func planJSONHead(js []byte) int {
	rest, ok := bytes.CutPrefix(js, []byte(`{"schemaVersion":`))
	if !ok {
		return -1
	}
	n := 0
	for n < len(rest) && n < 20 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || !bytes.HasPrefix(rest[n:], []byte(`,"id":"`)) {
		return -1
	}
	return len(js) - len(rest) + n + len(`,"id":"`)
}
