// This file tests the pure half of plan patches: what cutPlanPatch cuts,
// what splicePlan refuses, and that planBlobOf is EncodePlanBlob byte for
// byte. The agent's and the client's use of them is tested in
// agent_planpatch_test.go.

package haptic

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// entriesJSON is a map-like JSON run of n entries, entry i's value given by
// value(i): the repetitive shape (the same punctuation every few dozen
// bytes) that a resync must not be fooled by.
func entriesJSON(n int, value func(i int) string) string {
	var b strings.Builder
	b.WriteString(`{"schemaVersion":1,"id":"","maps":[`)
	for i := range n {
		if v := value(i); v != "" {
			fmt.Fprintf(&b, `{"key":"tenant-%06d.example.com","value":%q},`, i, v)
		}
	}
	b.WriteString(`],"files":[{"digest":"0011223344556677","size":1234}]}`)
	return b.String()
}

func backendOf(i int) string { return fmt.Sprintf("backend_%d", i%32) }

// changesEvery10 changes the value of every tenth entry, n of them, far
// enough apart that each is a splice of its own.
func changesEvery10(n int) func(i int) string {
	return func(i int) string {
		if i%10 == 0 && i/10 < n {
			return "changed"
		}
		return backendOf(i)
	}
}

// TestCutPlanPatchRebuildsTheNextPlan cuts patches between pairs of JSONs
// and splices each back: the result is next, byte for byte, and a patch
// has no more splices than the pair has differences.
func TestCutPlanPatchRebuildsTheNextPlan(t *testing.T) {
	const n = 5000
	base := entriesJSON(n, backendOf)
	with := func(change func(i int) string) string { return entriesJSON(n, change) }
	tests := []struct {
		name        string
		base, next  string
		maxSplices  int // 0: the patch must be nil (the blob is better)
		maxDataSize int
	}{
		{"the same plan", base, base, 0 + 1, 0},
		{"one value", base, with(func(i int) string {
			if i == n/2 {
				return "backend_moved"
			}
			return backendOf(i)
		}), 1, 16},
		{"an entry added", base, strings.Replace(base, `{"key":"tenant-002500`, `{"key":"bench.test","value":"be-b"},{"key":"tenant-002500`, 1), 1, 64},
		{"an entry removed", base, with(func(i int) string {
			if i == 77 {
				return ""
			}
			return backendOf(i)
		}), 1, 0},
		{"an entry and the file digest", base, strings.Replace(with(func(i int) string {
			if i == 1000 {
				return "backend_x"
			}
			return backendOf(i)
		}), "0011223344556677", "8899aabbccddeeff", 1), 2, 32},
		{"the first byte", base, "[" + base[1:], 1, 1},
		{"the last byte", base, base[:len(base)-1] + "]", 1, 1},
		{"appended", base, base + "tail", 1, 4},
		{"truncated", base, base[:len(base)/3], 1, 0},
		{"from nothing", "", base, 0, 0},
		{"another plan", base, strings.Repeat("x", len(base)), 0, 0},
		{"a change every few entries", base, with(changesEvery10(n)), 0, 0},
		{"as many changes as a patch may splice", base, with(changesEvery10(MaxPlanSplices)), MaxPlanSplices, 16 * MaxPlanSplices},
		{"one change more than a patch may splice", base, with(changesEvery10(MaxPlanSplices + 1)), 0, 0},
	}
	for _, tc := range tests {
		p := cutPlanPatch(tc.base, tc.next, "base-id")
		if tc.maxSplices == 0 {
			if p != nil {
				t.Errorf("%s: cut %d splices, want the whole blob", tc.name, len(p.Splices))
			}
			continue
		}
		if p == nil {
			t.Errorf("%s: no patch", tc.name)
			continue
		}
		data := 0
		for _, s := range p.Splices {
			data += len(s.Data)
		}
		if len(p.Splices) > tc.maxSplices || data > tc.maxDataSize {
			t.Errorf("%s: %d splices of %d bytes, want at most %d of %d", tc.name, len(p.Splices), data, tc.maxSplices, tc.maxDataSize)
		}
		if p.BaseDigest != "base-id" || p.BaseSize != int64(len(tc.base)) {
			t.Errorf("%s: base %q of %d bytes", tc.name, p.BaseDigest, p.BaseSize)
		}
		got, err := splicePlan(nil, []byte(tc.base), p)
		if err != nil || string(got) != tc.next {
			t.Errorf("%s: spliced into %d bytes (%v), want next's %d", tc.name, len(got), err, len(tc.next))
		}
		// Into the memory of another plan, large enough: the same bytes.
		dst := bytes.Repeat([]byte{'#'}, len(tc.next)+7)
		if got, err := splicePlan(dst, []byte(tc.base), p); err != nil || string(got) != tc.next || &got[:1][0] != &dst[0] {
			t.Errorf("%s: spliced into a buffer of %d bytes: %d bytes (%v), want next's %d in the buffer", tc.name, len(dst), len(got), err, len(tc.next))
		}
	}
}

// TestSplicePlanRefusesAPatchThatDoesNotFit: every way a patch can fail
// to fit its base is refused with the reason, before anything is built.
func TestSplicePlanRefusesAPatchThatDoesNotFit(t *testing.T) {
	base := []byte(`{"schemaVersion":1,"id":"","maps":{}}`)
	size := int64(len(base))
	huge := make([]byte, MaxPlanJSONBytes/2+1)
	splices := func(s ...PlanSplice) *PlanPatch { return &PlanPatch{BaseSize: size, Splices: s} }
	tests := []struct {
		name  string
		patch *PlanPatch
		want  string
	}{
		{"another base size", &PlanPatch{BaseSize: size + 1}, fmt.Sprintf("plan patch is cut from %d bytes, the held plan has %d", size+1, size)},
		{"too many splices", splices(make([]PlanSplice, MaxPlanSplices+1)...), fmt.Sprintf("plan patch has %d splices, more than %d", MaxPlanSplices+1, MaxPlanSplices)},
		{"a negative offset", splices(PlanSplice{Offset: -1}), "plan patch splice 0 (offset -1, length 0) is out of order or outside the 37-byte base"},
		{"a negative length", splices(PlanSplice{Offset: 3, Length: -1}), "plan patch splice 0 (offset 3, length -1) is out of order or outside the 37-byte base"},
		{"an offset past the end", splices(PlanSplice{Offset: size + 1}), "plan patch splice 0 (offset 38, length 0) is out of order or outside the 37-byte base"},
		{"a length past the end", splices(PlanSplice{Offset: 30, Length: 8}), "plan patch splice 0 (offset 30, length 8) is out of order or outside the 37-byte base"},
		{"a length that overflows", splices(PlanSplice{Offset: 30, Length: 1<<63 - 1}), "plan patch splice 0 (offset 30, length 9223372036854775807) is out of order or outside the 37-byte base"},
		{"out of order", splices(PlanSplice{Offset: 10}, PlanSplice{Offset: 5}), "plan patch splice 1 (offset 5, length 0) is out of order or outside the 37-byte base"},
		{"overlapping", splices(PlanSplice{Offset: 5, Length: 10}, PlanSplice{Offset: 14, Length: 1}), "plan patch splice 1 (offset 14, length 1) is out of order or outside the 37-byte base"},
		{"a result too large", splices(PlanSplice{Offset: 1, Data: huge}, PlanSplice{Offset: 2, Data: huge}), fmt.Sprintf("plan patch makes a plan JSON of more than %d bytes", MaxPlanJSONBytes)},
	}
	for _, tc := range tests {
		got, err := splicePlan(nil, base, tc.patch)
		if got != nil || fmt.Sprint(err) != tc.want {
			t.Errorf("%s: %d bytes, %v; want %q", tc.name, len(got), err, tc.want)
		}
	}
	// Splices that meet end to end, at both ends of the base, fit.
	got, err := splicePlan(nil, base, splices(PlanSplice{Offset: 0, Length: 1, Data: []byte("[")}, PlanSplice{Offset: 1, Length: 0, Data: []byte("x")}, PlanSplice{Offset: size, Data: []byte("!")}))
	if err != nil || string(got) != "[x"+string(base[1:])+"!" {
		t.Errorf("adjacent splices: %q, %v", got, err)
	}
}

// TestPlanBlobOfIsEncodePlanBlob: the blob the agent makes of a canonical
// JSON and an id is the one EncodePlanBlob makes of the plan, byte for
// byte, for plans large and small; JSON that does not start with a blank
// id is refused.
func TestPlanBlobOfIsEncodePlanBlob(t *testing.T) {
	for _, p := range []*Plan{examplePlan("example.com be-a\n"), examplePlan(bigMap(7, "backend_x"))} {
		want, err := EncodePlanBlob(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := planBlobOf(p.Canonical(), p.ID)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("plan %s: %d bytes (%v), want EncodePlanBlob's %d", p.ID, len(got), err, len(want))
		}
	}
	for _, js := range []string{``, `{}`, `{"schemaVersion":1,"id":"x"}`, `{"schemaVersion":,"id":""}`, `{"id":"","schemaVersion":1}`} {
		if _, err := planBlobOf([]byte(js), "0123456789abcdef"); err == nil {
			t.Errorf("%q: encoded", js)
		}
	}
}

// FuzzPlanPatch: whatever two JSONs it is given, a patch cutPlanPatch cuts
// splices back into next, and splicePlan never panics on the cut or on
// one whose offsets were bent.
func FuzzPlanPatch(f *testing.F) {
	base := entriesJSON(300, backendOf)
	f.Add(base, strings.Replace(base, "backend_7", "backend_x", 1), int64(0))
	f.Add(base, base[:100]+base[200:], int64(-5))
	f.Add("", "abc", int64(3))
	f.Fuzz(func(t *testing.T, base, next string, bend int64) {
		p := cutPlanPatch(base, next, "id")
		if p == nil {
			return
		}
		got, err := splicePlan(nil, []byte(base), p)
		if err != nil || string(got) != next {
			t.Fatalf("spliced %q (%v), want %q", got, err, next)
		}
		if len(p.Splices) > 0 {
			p.Splices[0].Offset += bend
			splicePlan(nil, []byte(base), p)
		}
	})
}
