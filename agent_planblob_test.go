// Tests of the check a plan blob passes before the agent stores it
// (checkPlanBlob in agent.go): it must decode within the plan limits and
// hold the plan of the id it is stored for, by its carried id and by the
// digest of its content; PUT /v1/plan refuses any other blob with 400 and
// stores nothing.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// blobOf is the plan blob of p, whose id is set first.
func blobOf(t *testing.T, p *Plan) []byte {
	t.Helper()
	p.ComputeID()
	b, err := EncodePlanBlob(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// zeroBomb is a zstd frame of n zero bytes that declares no size: a few
// kilobytes that inflate without end for a decoder that does not stop.
func zeroBomb(t *testing.T, n int) []byte {
	t.Helper()
	return zstdStreamedFrame(t, func(w *zstd.Encoder) {
		zeros := make([]byte, 1<<20)
		for range n >> 20 {
			w.Write(zeros)
		}
	})
}

// forged is the blob of other's content carrying the id id.
func forged(t *testing.T, other *Plan, id string) []byte {
	t.Helper()
	p := other.Clone()
	p.ID = id
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return zstdSizedFrame(t, js)
}

func TestCheckPlanBlob(t *testing.T) {
	plan := blobOf(t, allFieldsExamplePlan())
	p, err := DecodePlanBlob(plan)
	if err != nil {
		t.Fatal(err)
	}
	other := p.Clone()
	other.Sections = other.Sections[:1]
	other.ComputeID()
	// Bytes that are not UTF-8 do not survive JSON: the decoded plan holds
	// others, so it is not the plan of its id.
	notUTF8 := p.Clone()
	notUTF8.Sections[0].Name = "glob\xffal"
	notUTF8Blob := blobOf(t, notUTF8)
	decoded, _ := DecodePlanBlob(notUTF8Blob)
	decoded.ComputeID()

	tests := []struct {
		name, planID string
		blob         []byte
		want         string // "" = admitted
	}{
		{"the plan of its id", p.ID, plan, ""},
		{"garbage", p.ID, []byte("garbage"), "plan blob does not decode: decompress: invalid input: magic number mismatch"},
		{"a zstd bomb", p.ID, zeroBomb(t, 128<<20), "plan blob does not decode: decompressed plan exceeds the 67108864-byte limit"},
		{"JSON that is no plan", p.ID, zstdSizedFrame(t, []byte(`{"schemaVersion":1,"files":7}`)),
			"plan blob does not decode: decode: json: cannot unmarshal number into Go struct field Plan.files of type []haptic.PlanFile"},
		{"another plan", p.ID, blobOf(t, other.Clone()),
			fmt.Sprintf("plan blob holds plan %q (its content hashes to %q), not plan %q", other.ID, other.ID, p.ID)},
		{"another plan carrying this id", p.ID, forged(t, other, p.ID),
			fmt.Sprintf("plan blob holds plan %q (its content hashes to %q), not plan %q", p.ID, other.ID, p.ID)},
		{"this plan carrying another id", p.ID, forged(t, p, other.ID),
			fmt.Sprintf("plan blob holds plan %q (its content hashes to %q), not plan %q", other.ID, p.ID, p.ID)},
		{"bytes that are not UTF-8", notUTF8.ID, notUTF8Blob,
			fmt.Sprintf("plan blob holds plan %q (its content hashes to %q), not plan %q", notUTF8.ID, decoded.ID, notUTF8.ID)},
	}
	for _, tc := range tests {
		_, err := checkPlanBlob(tc.blob, tc.planID)
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestPutPlanStoresOnlyThePlanOfItsID lands a plan whose id is its digest
// and PUTs blobs for it: each blob that is not that plan is refused with
// 400, and nothing is stored; an upload for another pair, garbage or a
// valid blob, is a 409 before its body is read; the plan's own blob is
// stored.
func TestPutPlanStoresOnlyThePlanOfItsID(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	p := planOfFiles(t, fs)
	e.land(t, p.ID, fs)
	st := e.c.state("")
	applied := "?plan_id=" + st.AppliedPlanID + "&proof=" + st.AppliedPlanProof
	other := p.Clone()
	other.Sections = other.Sections[:1]
	other.ComputeID()

	for _, tc := range []struct {
		name  string
		query string
		blob  []byte
	}{
		{"garbage", applied, []byte("garbage")},
		{"a zstd bomb", applied, zeroBomb(t, 128<<20)},
		{"another plan", applied, blobOf(t, other.Clone())},
		{"another plan carrying the applied id", applied, forged(t, other, p.ID)},
	} {
		code, _, body := e.c.do("PUT", PathPlan+tc.query, bytes.NewReader(tc.blob), "application/octet-stream")
		ae := applyErr(t, body)
		if code != http.StatusBadRequest || ae.Stage != StagePlan || ae.Message != planBlobRefusal(tc.blob, p.ID) {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		if st := e.c.state(""); st.AppliedPlanStored || len(st.AppliedPlan) != 0 {
			t.Fatalf("%s: stored %d bytes", tc.name, len(st.AppliedPlan))
		}
		if ps := readStateFile(t, e.cfg.BaseDir); ps.Blob.ID != "" {
			t.Fatalf("%s: the state names a stored blob of %q", tc.name, ps.Blob.ID)
		}
	}

	for _, blob := range [][]byte{[]byte("garbage"), blobOf(t, other.Clone())} {
		if code, _, body := e.c.do("PUT", PathPlan+"?plan_id="+other.ID+"&proof=a:9", bytes.NewReader(blob), ""); code != http.StatusConflict {
			t.Errorf("%.10q for a pair that moved on: %d %s", blob, code, body)
		}
	}
	blob := blobOf(t, p.Clone())
	if code, _, body := e.c.do("PUT", PathPlan+applied, bytes.NewReader(blob), ""); code != http.StatusOK {
		t.Fatalf("the applied plan's blob: %d %s", code, body)
	}
	if st := e.c.state(""); !st.AppliedPlanStored || !bytes.Equal(st.AppliedPlan, blob) {
		t.Errorf("stored %v, %d bytes", st.AppliedPlanStored, len(st.AppliedPlan))
	}
}

// TestAnApplysPlanPartIsCheckedBeforeAnythingIsWritten: the plan part of an
// apply is held to the rules of PUT /v1/plan (it decodes within the limits
// and is the plan of the manifest's id); one that is not refuses the whole
// apply with a 400 (stage parts, like every part) before a file, a record
// or a blob is written.
func TestAnApplysPlanPartIsCheckedBeforeAnythingIsWritten(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	p := planOfFiles(t, fs)
	e.land(t, p.ID, fs)
	next := fs.clone()
	next["maps/host.map"] = "example.com be-b\n"
	np := planOfFiles(t, next)
	other := np.Clone()
	other.Sections = other.Sections[:1]
	other.ComputeID()
	before := e.c.state("")
	for _, tc := range []struct {
		name string
		blob []byte
	}{
		{"garbage", []byte("garbage")},
		{"a zstd bomb", zeroBomb(t, 128<<20)},
		{"another plan carrying the manifest's id", forged(t, other, np.ID)},
	} {
		m := e.c.manifest(np.ID, next)
		code, body := e.c.post(applyRequest{manifest: m, files: next, plan: tc.blob})
		ae := applyErr(t, body)
		if code != http.StatusBadRequest || ae.Stage != StageParts || ae.Message != planBlobRefusal(tc.blob, np.ID) {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		st := e.c.state("")
		if st.Generation != before.Generation || st.AppliedPlanID != p.ID || st.AppliedPlanStored || !sameSet(e.disk(t), fs) {
			t.Fatalf("%s: the refused apply changed the agent: generation %d, applied %s, stored %v",
				tc.name, st.Generation, st.AppliedPlanID, st.AppliedPlanStored)
		}
	}
}

// planBlobRefusal is the message the agent refuses blob with, for plan id.
func planBlobRefusal(blob []byte, id string) string {
	_, err := checkPlanBlob(blob, id)
	return fmt.Sprint(err)
}
