// This file tests plan patches end to end: the agent takes a PlanPatch
// only by its hash and stores the plan as EncodePlanBlob's blob would be,
// refuses every patch that does not fit and stores nothing then, keeps the
// plan across a restart, and Deploy sends a patch exactly where the pod
// holds its base, the whole blob everywhere else.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// planPatchPlans are renders one host-map entry apart from each other, on a
// map large enough that a blob is kilobytes; the entry grows by a byte from
// one plan to the next, so that a splice moves what follows it.
func planPatchPlans(n int) []*Plan {
	plans := make([]*Plan, n)
	for i := range plans {
		plans[i] = examplePlan(bigHostMap(64<<10, "web-"+strings.Repeat("x", i+1), 8))
	}
	return plans
}

// podProxy stands between a Deploy and one agent: it records every request
// and lets a test edit the state answers the client reads, as an agent of
// another build would write them.
type podProxy struct {
	log       *requestLog
	editState func(*State)
}

func startPodProxy(t *testing.T, a *Agent, edit func(*State)) (*Client, *podProxy) {
	t.Helper()
	target, _ := url.Parse(agentBaseURL(a))
	pp := &podProxy{log: &requestLog{}, editState: edit}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if pp.editState == nil || resp.Request.URL.Path != PathState || resp.StatusCode != http.StatusOK {
			return nil
		}
		var st State
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		pp.editState(&st)
		b, _ = json.Marshal(&st)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		resp.Header.Del("Content-Length")
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		pp.log.add(recordedRequest{Method: r.Method, RequestURI: r.RequestURI, Header: r.Header.Clone(), Body: body})
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return deployClient(t, srv.URL), pp
}

// planUploads returns the plan PUTs since the last call: each body and
// its Content-Type.
func (pp *podProxy) planUploads() (bodies [][]byte, types []string) {
	for _, r := range routeRequests(pp.log, "PUT "+PathPlan) {
		bodies, types = append(bodies, r.Body), append(types, r.Header.Get("Content-Type"))
	}
	pp.log = &requestLog{}
	return bodies, types
}

// storedBlob is the blob the agent hands a cold leader.
func storedBlob(t *testing.T, c *Client) []byte {
	t.Helper()
	st, err := c.State(context.Background(), StateRead{Plan: true})
	if err != nil || !st.AppliedPlanStored {
		t.Fatalf("state: stored %v, %v", st != nil && st.AppliedPlanStored, err)
	}
	return st.AppliedPlan
}

func mustBlob(t *testing.T, p *Plan) []byte {
	t.Helper()
	b, err := EncodePlanBlob(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustDeploy(t *testing.T, c *Client, next *Plan, opts DeployOptions) *ApplyResult {
	t.Helper()
	opts.LeaderEpoch = 1
	res, err := Deploy(context.Background(), c, next, opts)
	if err != nil || !res.OK {
		t.Fatalf("deploy %s: %+v, %v", next.ID, res, err)
	}
	return res
}

// TestAPlanPatchIsTakenByItsHashAndKeptAsItsBlob: after a whole first
// upload, each next plan travels as a patch (after a runtime apply, and as
// the plan part of a reload), and the agent hands out the new plan's blob
// exactly as EncodePlanBlob writes it, before and after a kill and a start
// (which rebuild it from the last blob and the patches the log holds
// since), a whole upload in between, and a compaction.
func TestAPlanPatchIsTakenByItsHashAndKeptAsItsBlob(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	plans := planPatchPlans(4)
	c, pp := startPodProxy(t, e.a, nil)
	restarted := func(want *Plan, when string) {
		t.Helper()
		e.killAndRestart(t) // a stop would compact the log first
		c, pp = startPodProxy(t, e.a, nil)
		if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, want)) {
			t.Fatalf("after a restart %s the stored blob is not plan %s's", when, want.ID)
		}
	}
	mustDeploy(t, c, plans[0], DeployOptions{}) // a reload, which carries the blob
	if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, plans[0])) {
		t.Fatal("the stored blob is not the first plan's")
	}

	// A runtime apply, then its plan as a patch.
	pp.planUploads()
	if res := mustDeploy(t, c, plans[1], DeployOptions{Applied: plans[0]}); res.Mode != ResultRuntime {
		t.Fatalf("mode %s", res.Mode)
	}
	bodies, types := pp.planUploads()
	if len(bodies) != 1 || types[0] != "application/json" || len(bodies[0]) > 1<<10 {
		t.Fatalf("the next plan went as %v (%d uploads), want one patch under 1 KiB", types, len(bodies))
	}
	var patch PlanPatch
	if err := json.Unmarshal(bodies[0], &patch); err != nil || patch.BaseDigest != plans[0].ID || len(patch.Splices) != 2 {
		t.Fatalf("patch %+v, %v: want 2 splices of plan %s (the entry, the file's digest)", patch, err, plans[0].ID)
	}
	if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, plans[1])) {
		t.Fatal("the stored blob is not EncodePlanBlob's for the patched plan")
	}

	// A whole upload after the patch: the patch before it is history.
	noPatch, _ := startPodProxy(t, e.a, withoutPlanPatch)
	mustDeploy(t, noPatch, plans[2], DeployOptions{Applied: plans[1]})
	restarted(plans[2], "with a blob after the patch")

	// A reload carries the patch as its plan part.
	m := reloadDecision(t, c, plans[3], plans[2])
	parts := map[string]io.Reader{exampleHostMap: strings.NewReader(plans[3].Files[1].Content)}
	res, err := c.apply(context.Background(), m, parts, bytes.NewReader(planPatchJSON(plans[2], plans[3])), patchContentType)
	if err != nil || !res.OK {
		t.Fatalf("reload with a plan patch: %+v, %v", res, err)
	}
	if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, plans[3])) {
		t.Fatal("the stored blob is not EncodePlanBlob's for the plan the reload carried as a patch")
	}
	restarted(plans[3], "after a reload that carried a patch")
	if err := e.a.led.compact(); err != nil {
		t.Fatal(err)
	}
	restarted(plans[3], "after a compaction")
}

// TestAPatchWhoseBaseMovedBeforeItIsStoredIsAskedForWhole: a patch is
// checked against the held plan outside the apply lock and stored under
// it; when another upload replaced the held plan in between, the patch is
// not stored (its record would splice the wrong base on replay), and the
// controller is asked for the whole plan.
func TestAPatchWhoseBaseMovedBeforeItIsStoredIsAskedForWhole(t *testing.T) {
	plans := planPatchPlans(2)
	e, _, res := landWithoutItsPlan(t, plans)
	ref := planRef{ID: res.AppliedPlanID, Proof: res.AppliedPlanProof}
	staged, err := e.a.led.takePlan(planPatchJSON(plans[0], plans[1]), "application/json", plans[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := e.a.led.takePlan(mustBlob(t, plans[1]), "application/octet-stream", plans[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.led.storePlan(ref, whole); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.led.storePlan(ref, staged); !errors.Is(err, errPlanBaseGone) {
		t.Fatalf("storing the patch of a plan no longer held: %v", err)
	}
}

// landWithoutItsPlan deploys plans[0] with its plan, then plans[1] through
// a client that sends no patch and a blob too large to send, so that the
// agent holds plans[0]'s plan while plans[1] is applied. It returns the
// agent, a client that sends patches, and plans[1]'s result.
func landWithoutItsPlan(t *testing.T, plans []*Plan) (*testEnv, *Client, *ApplyResult) {
	t.Helper()
	e := newTestEnv(t, nil, nil)
	c, _ := startPodProxy(t, e.a, nil)
	mustDeploy(t, c, plans[0], DeployOptions{})
	noPatch, _ := startPodProxy(t, e.a, withoutPlanPatch)
	res, err := Deploy(context.Background(), noPatch, plans[1], DeployOptions{LeaderEpoch: 1, Applied: plans[0], PlanBlob: make([]byte, MaxPlanBlobBytes+1)})
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("deploy without a plan: %+v, %v", res, err)
	}
	return e, c, res
}

// reloadDecision is a reload of next over applied, as Deploy composes it,
// with the plan part left to the test.
func reloadDecision(t *testing.T, c *Client, next, applied *Plan) *Manifest {
	t.Helper()
	st, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	m := NewManifest(next, PrepareDeploy(applied, next).Decision(st), st, Token{LeaderEpoch: 1, RenderSeq: st.AppliedToken.RenderSeq + 1})
	m.Mode = ModeReload
	return m
}

// TestAPlanPatchThatDoesNotFitStoresNothing: through PUT /v1/plan and as
// an apply's plan part, a patch of a base the agent does not hold is asked
// for whole (409, missing "plan"), and one that does not decode, does not
// fit its base, is too large or makes another plan is refused (400): the
// state, its log and the stored plan are unchanged.
func TestAPlanPatchThatDoesNotFitStoresNothing(t *testing.T) {
	plans := planPatchPlans(3)
	e, c, _ := landWithoutItsPlan(t, plans)
	good := planPatchJSON(plans[0], plans[1])
	var p PlanPatch
	json.Unmarshal(good, &p)
	edited := func(edit func(p *PlanPatch)) []byte {
		q := p
		q.Splices = slices.Clone(p.Splices)
		edit(&q)
		b, _ := json.Marshal(&q)
		return b
	}
	size := p.BaseSize
	tests := []struct {
		name   string
		body   []byte
		status int
		want   string // the ApplyError message, or "missing"
	}{
		{"another base", edited(func(p *PlanPatch) { p.BaseDigest = plans[2].ID }), 409, "missing"},
		{"not JSON", []byte("{splices"), 400, "plan patch does not decode: invalid character 's' looking for beginning of object key string"},
		{"another base size", edited(func(p *PlanPatch) { p.BaseSize++ }), 400, fmt.Sprintf("plan patch is cut from %d bytes, the held plan has %d", size+1, size)},
		{"an offset past the base", edited(func(p *PlanPatch) { p.Splices[1].Offset = size + 1 }), 400,
			fmt.Sprintf("plan patch splice 1 (offset %d, length %d) is out of order or outside the %d-byte base", size+1, p.Splices[1].Length, size)},
		{"a length past the base", edited(func(p *PlanPatch) { p.Splices[1].Length = size }), 400,
			fmt.Sprintf("plan patch splice 1 (offset %d, length %d) is out of order or outside the %d-byte base", p.Splices[1].Offset, size, size)},
		{"splices out of order", edited(func(p *PlanPatch) { p.Splices[0], p.Splices[1] = p.Splices[1], p.Splices[0] }), 400,
			fmt.Sprintf("plan patch splice 1 (offset %d, length %d) is out of order or outside the %d-byte base", p.Splices[0].Offset, p.Splices[0].Length, size)},
		{"too many splices", edited(func(p *PlanPatch) { p.Splices = make([]PlanSplice, MaxPlanSplices+1) }), 400,
			fmt.Sprintf("plan patch has %d splices, more than %d", MaxPlanSplices+1, MaxPlanSplices)},
		{"another plan", planPatchJSON(plans[0], plans[2]), 400,
			fmt.Sprintf("plan patch makes a plan whose content hashes to %q, not plan %q", plans[2].ID, plans[1].ID)},
		{"too large", append(append([]byte(`{"splices":[],"x":"`), bytes.Repeat([]byte("x"), MaxPlanBlobBytes)...), `"}`...), 400,
			fmt.Sprintf("plan blob exceeds the %d-byte limit", MaxPlanBlobBytes)},
	}
	st, _ := c.State(context.Background(), StateRead{})
	statePath := filepath.Join(e.cfg.BaseDir, defaultStateFile)
	for _, tc := range tests {
		before := e.snapshot(t)
		logBefore, _ := os.ReadFile(logPathFor(statePath))
		check := func(via string, code int, body []byte) {
			t.Helper()
			switch {
			case code != tc.status:
				t.Errorf("%s via %s: %d %s", tc.name, via, code, body)
			case tc.want == "missing" && string(body) != `{"missing":["plan"]}`+"\n":
				t.Errorf("%s via %s: %s", tc.name, via, body)
			case tc.want != "missing" && applyErr(t, body).Message != tc.want:
				t.Errorf("%s via %s: %s, want %q", tc.name, via, body, tc.want)
			}
			e.unchanged(t, before)
			if after, _ := os.ReadFile(logPathFor(statePath)); !bytes.Equal(after, logBefore) {
				t.Errorf("%s via %s: the log changed", tc.name, via)
			}
		}
		query := "?plan_id=" + st.AppliedPlanID + "&proof=" + url.QueryEscape(st.AppliedPlanProof)
		code, _, body := e.c.do("PUT", PathPlan+query, bytes.NewReader(tc.body), "application/json")
		check("PUT", code, body)

		m := reloadDecision(t, c, plans[1], plans[1])
		code, body = e.c.post(applyRequest{manifest: m, plan: tc.body, planPatch: true})
		check("apply", code, body)
	}
	if st, _ := c.State(context.Background(), StateRead{}); st.AppliedPlanStored {
		t.Fatal("a refused patch stored a plan")
	}
}

// TestDeploySendsThePlanWholeWhereNoPatchFits: an agent that does not
// advertise plan_patch gets the blob byte for byte, as an upstream agent
// would; a pod that claims a base it has lost answers the patch with a
// Missing, and gets the blob (after a runtime apply, and with a reload).
func TestDeploySendsThePlanWholeWhereNoPatchFits(t *testing.T) {
	plans := planPatchPlans(3)
	for _, tc := range []struct {
		name string
		edit func(*State)
		// after the first deploy: the agent forgets the plan it holds
		forget bool
	}{
		{"an agent without plan_patch", withoutPlanPatch, false},
		{"an agent that lost its plan", func(st *State) { st.AppliedPlanStored = st.AppliedPlanID != "" }, true},
	} {
		e := newTestEnv(t, nil, nil)
		c, pp := startPodProxy(t, e.a, tc.edit)
		mustDeploy(t, c, plans[0], DeployOptions{})
		if tc.forget {
			e.a.led.mu.Lock()
			e.a.led.plan = nil // as after a start that could not read its blob
			e.a.led.mu.Unlock()
		}
		pp.planUploads()
		mustDeploy(t, c, plans[1], DeployOptions{Applied: plans[0]})
		bodies, types := pp.planUploads()
		last := len(bodies) - 1
		if last < 0 || types[last] != "application/octet-stream" || !bytes.Equal(bodies[last], mustBlob(t, plans[1])) {
			t.Errorf("%s: the plan went as %v, want the blob last", tc.name, types)
		}
		if tc.forget && (len(types) != 2 || types[0] != "application/json") {
			t.Errorf("%s: uploads %v, want the patch, then the blob", tc.name, types)
		}
		if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, plans[1])) {
			t.Errorf("%s: the stored blob is not plan 1's", tc.name)
		}

		// A reload carries the plan; with a lost base, the patch first.
		if tc.forget {
			e.a.led.mu.Lock()
			e.a.led.plan = nil
			e.a.led.mu.Unlock()
		}
		next := plans[2].Clone()
		next.Sections[0].Text += "# reload\n"
		next.Sections[0].TextDigest, next.Sections[0].Length = DigestString(next.Sections[0].Text), len(next.Sections[0].Text)
		next.Files[0].Content = next.Sections[0].Text
		next.Files[0].Digest, next.Files[0].Size = DigestString(next.Files[0].Content), int64(len(next.Files[0].Content))
		next.ComputeID()
		if res := mustDeploy(t, c, next, DeployOptions{Applied: plans[1]}); res.Mode != ResultReload {
			t.Fatalf("%s: mode %s", tc.name, res.Mode)
		}
		var parts []string
		for _, r := range routeRequests(pp.log, "POST "+PathApply) {
			parts = append(parts, planPartType(t, r))
		}
		// The first apply lacks the config, which the second one carries.
		want := []string{"application/octet-stream", "application/octet-stream"}
		if tc.forget {
			want[0] = "application/json"
		}
		if !slices.Equal(parts, want) {
			t.Errorf("%s: the reload's plan parts were %v, want %v", tc.name, parts, want)
		}
		if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, next)) {
			t.Errorf("%s: the stored blob is not the reload's plan's", tc.name)
		}
		e.stop()
	}
}

// withoutPlanPatch edits a state answer into one of an agent without the
// plan_patch feature.
func withoutPlanPatch(st *State) {
	st.Features = slices.DeleteFunc(st.Features, func(f string) bool { return f == FeaturePlanPatch })
}

// planPartType is the Content-Type of a recorded apply's plan part, "" for
// none.
func planPartType(t *testing.T, r recordedRequest) string {
	t.Helper()
	req := &http.Request{Header: r.Header, Body: io.NopCloser(bytes.NewReader(r.Body))}
	mr, err := req.MultipartReader()
	if err != nil {
		t.Fatal(err)
	}
	for {
		part, err := mr.NextPart()
		if err != nil {
			return ""
		}
		if part.FormName() == PartPlan {
			return part.Header.Get("Content-Type")
		}
	}
}

// TestAFleetOnTwoPreviousPlansGetsTheRightPlan: one change pushed to pods
// that hold two different previous plans. With a preparation per previous
// plan each pod gets the patch of the plan it holds; with one preparation
// for all, the pods that hold the other plan get the whole blob. Every pod
// ends up holding exactly the new plan's blob.
func TestAFleetOnTwoPreviousPlansGetsTheRightPlan(t *testing.T) {
	plans := planPatchPlans(3)
	next := plans[2]
	type pod struct {
		c    *Client
		pp   *podProxy
		held *Plan
	}
	var pods []pod
	for i := range 4 {
		e := newTestEnv(t, nil, nil)
		c, pp := startPodProxy(t, e.a, nil)
		mustDeploy(t, c, plans[0], DeployOptions{})
		held := plans[0]
		if i%2 == 1 {
			mustDeploy(t, c, plans[1], DeployOptions{Applied: plans[0]})
			held = plans[1]
		}
		pp.planUploads()
		pods = append(pods, pod{c, pp, held})
	}
	perPlan := map[string]*PreparedDeploy{plans[0].ID: PrepareDeploy(plans[0], next), plans[1].ID: PrepareDeploy(plans[1], next)}
	for i, p := range pods {
		applied, prep := p.held, perPlan[p.held.ID]
		if i >= 2 { // one preparation for the whole fleet, cut from plans[1]
			applied, prep = plans[1], perPlan[plans[1].ID]
		}
		mustDeploy(t, p.c, next, DeployOptions{Applied: applied, Prepared: prep})
		bodies, types := p.pp.planUploads()
		wantPatch := applied == p.held
		switch {
		case len(bodies) != 1:
			t.Errorf("pod %d: %d plan uploads", i, len(bodies))
		case wantPatch && types[0] != "application/json":
			t.Errorf("pod %d on %s: the plan went as %s, want a patch", i, p.held.ID, types[0])
		case wantPatch:
			var patch PlanPatch
			if json.Unmarshal(bodies[0], &patch); patch.BaseDigest != p.held.ID {
				t.Errorf("pod %d on %s: the patch is cut from %s", i, p.held.ID, patch.BaseDigest)
			}
		case types[0] != "application/octet-stream":
			t.Errorf("pod %d on %s: the plan went as %s, want the blob", i, p.held.ID, types[0])
		}
		if got := storedBlob(t, p.c); !bytes.Equal(got, mustBlob(t, next)) {
			t.Errorf("pod %d: the stored blob is not the new plan's", i)
		}
	}
}

// TestPlanPatchesBackAndForthKeepEveryPlanWhole: a pod flips between two
// plans, each time by a patch, with a refused patch before each: the agent
// splices into the memory of a plan it no longer holds, never into one it
// holds or reads, so every stored blob is exactly its plan's.
func TestPlanPatchesBackAndForthKeepEveryPlanWhole(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	plans := planPatchPlans(3)
	c, pp := startPodProxy(t, e.a, nil)
	mustDeploy(t, c, plans[0], DeployOptions{})
	for i := range 6 {
		prev, next := plans[i%2], plans[(i+1)%2]
		st, err := c.State(context.Background(), StateRead{})
		if err != nil {
			t.Fatal(err)
		}
		// The held plan is prev's; a patch of it into another plan is spliced, then refused.
		query := "?plan_id=" + st.AppliedPlanID + "&proof=" + url.QueryEscape(st.AppliedPlanProof)
		if code, _, body := e.c.do("PUT", PathPlan+query, bytes.NewReader(planPatchJSON(prev, plans[2])), "application/json"); code != http.StatusBadRequest && i > 0 {
			t.Fatalf("round %d: a patch into another plan: %d %s", i, code, body)
		}
		pp.planUploads()
		mustDeploy(t, c, next, DeployOptions{Applied: prev})
		if _, types := pp.planUploads(); !slices.Equal(types, []string{"application/json"}) {
			t.Fatalf("round %d: the plan went as %v", i, types)
		}
		if got := storedBlob(t, c); !bytes.Equal(got, mustBlob(t, next)) {
			t.Fatalf("round %d: the stored blob is not plan %s's", i, next.ID)
		}
	}
}
