// Tests of Deploy (client.go), the controller's whole exchange with one
// pod: its preconditions and token, the baseline it diffs against (the
// caller's applied plan, re-read when stale, re-diffed on a conflict at
// most three times), stale_epoch returned at once, exactly the missing parts
// resent, an agent without the plan endpoint, a NACK that is not an error,
// version skew, batches and plan blobs over the limit. Deploy runs against
// scripted handlers and against the real agent on the fake HAProxy; the
// benchmarks time one runtime map change through Deploy and through Apply.
// The client's fixtures (recordedRequest, newTestClient, raw servers) are
// in client_test.go.

package haptic

import (
	"bytes"
	"context"
	_ "embed"
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
	"sync"
	"sync/atomic"
	"testing"
)

// ---------------------------------------------------------------------------
// Deploy.

// exampleConfig is the example's haproxy.cfg, the file cmd/basic-apply and
// haptic demo read through internal/example (which imports this package, so
// this test embeds the file rather than the package).
//
//go:embed internal/example/haproxy.cfg
var exampleConfig string

const exampleHostMap = "maps/host.map"

// examplePlan is the plan the example program's buildPlan builds
// (cmd/basic-apply), with the contents known, so that Deploy can resend the
// parts an agent asks for.
func examplePlan(hostMapContent string) *Plan {
	p := &Plan{
		SchemaVersion: PlanSchemaVersion,
		Sections: []Section{{Kind: SectionKindCore, Name: ConfigFilePath, TextDigest: DigestString(exampleConfig),
			Length: len(exampleConfig), Text: exampleConfig, TextKnown: true}},
		Maps: map[string]Map{exampleHostMap: {Path: exampleHostMap, Entries: ParseMapEntries(hostMapContent)}},
		Files: []PlanFile{
			{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true, Digest: DigestString(exampleConfig),
				Size: int64(len(exampleConfig)), Content: exampleConfig, ContentKnown: true},
			{Path: exampleHostMap, Kind: FileKindMap, Digest: DigestString(hostMapContent),
				Size: int64(len(hostMapContent)), Content: hostMapContent, ContentKnown: true},
		},
	}
	p.ComputeID()
	return p
}

const (
	hostMapV1 = "shop.example.com web-servers\n"
	hostMapV2 = "shop.example.com web-servers\nblog.example.com web-servers\n"
	hostMapV3 = "shop.example.com web-servers\nblog.example.com web-servers\nwiki.example.com web-servers\n"
)

// manyKeysMap is a host map of n keys: n map_add ops against an empty map.
func manyKeysMap(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "host%d.example.com web-servers\n", i)
	}
	return b.String()
}

// podState is the state of a pod that applied plan at token, with the blob
// stored and the map loaded: a baseline Diff composes runtime ops against.
func podState(t *testing.T, applied *Plan, token Token) State {
	t.Helper()
	blob, err := EncodePlanBlob(applied)
	if err != nil {
		t.Fatal(err)
	}
	proof := "proof-" + applied.ID
	return State{
		APIVersion: APIVersion, AgentVersion: "scripted", PlanSchemaVersion: PlanSchemaVersion,
		AgentOps: ComposedOps(), Features: []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches},
		HAProxy:       HAProxyInfo{Version: "3.4.3", WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_000_000_000},
		AppliedPlanID: applied.ID, AppliedPlanProof: proof,
		RunningPlanID: applied.ID, RunningPlanProof: proof,
		WorkerOpsPlanID: applied.ID, WorkerOpsPlanProof: proof,
		AppliedToken: token, AppliedPlan: blob, AppliedPlanStored: true,
		Inventory: Inventory{Maps: []string{exampleHostMap}},
	}
}

// ackFor is the ACK an agent gives after applying next.
func ackFor(next *Plan, mode string) ApplyResult {
	return ApplyResult{PlanID: next.ID, OK: true, Mode: mode, AppliedPlanID: next.ID, AppliedPlanProof: "proof-" + next.ID}
}

// scriptedAgent answers Deploy's three routes from scripts; n counts the
// calls of each route from 1. A nil putPlan stores every blob.
type scriptedAgent struct {
	state   func(n int) State
	apply   func(n int, req recordedRequest) (status int, body any)
	putPlan func(n int) (status int, body any)

	log    *requestLog
	mu     sync.Mutex
	counts map[string]int
}

func startScriptedAgent(t *testing.T, a *scriptedAgent) *Client {
	t.Helper()
	a.log = &requestLog{}
	a.counts = map[string]int{}
	srv := httptest.NewServer(recordingHandler(a.log, func(w http.ResponseWriter, req recordedRequest) {
		route := req.Method + " " + strings.SplitN(req.RequestURI, "?", 2)[0]
		a.mu.Lock()
		a.counts[route]++
		n := a.counts[route]
		a.mu.Unlock()
		switch route {
		case "GET " + PathState:
			s := a.state(n)
			if strings.Contains(req.RequestURI, "plan=0") {
				s.AppliedPlan = nil
			}
			answerJSON(http.StatusOK, s)(w, req)
		case "POST " + PathApply:
			status, body := a.apply(n, req)
			answerScripted(status, body)(w, req)
		case "PUT " + PathPlan:
			if a.putPlan == nil {
				answerJSON(http.StatusOK, PlanStored{})(w, req)
				return
			}
			status, body := a.putPlan(n)
			answerScripted(status, body)(w, req)
		default:
			http.NotFound(w, nil)
		}
	}))
	t.Cleanup(srv.Close)
	return newTestClient(t, srv.URL, nil)
}

func answerScripted(status int, body any) func(http.ResponseWriter, recordedRequest) {
	if text, ok := body.(string); ok {
		return answerText(status, text)
	}
	return answerJSON(status, body)
}

// requests returns the recorded requests of one route, e.g. "POST /v1/apply".
func (a *scriptedAgent) requests(route string) []recordedRequest {
	var out []recordedRequest
	for _, r := range a.log.all() {
		if r.Method+" "+strings.SplitN(r.RequestURI, "?", 2)[0] == route {
			out = append(out, r)
		}
	}
	return out
}

// sentApply is one apply request as Deploy sent it.
type sentApply struct {
	manifest     Manifest
	manifestJSON string
	parts        map[string]string // by form name, plan included
	names        []string          // form names in order
}

func decodeApply(t *testing.T, req recordedRequest) sentApply {
	t.Helper()
	parts := multipartParts(t, req)
	if len(parts) == 0 || parts[0].Name != PartManifest {
		t.Fatalf("apply without a leading manifest part: %+v", parts)
	}
	s := sentApply{manifestJSON: parts[0].Body, parts: map[string]string{}}
	if err := json.Unmarshal([]byte(parts[0].Body), &s.manifest); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts[1:] {
		s.parts[p.Name] = p.Body
		s.names = append(s.names, p.Name)
	}
	return s
}

func TestDeployPreconditions(t *testing.T) {
	c := newTestClient(t, "http://agent:5555", nil)
	noID := examplePlan(hostMapV1)
	noID.ID = ""
	for _, tt := range []struct {
		c    *Client
		next *Plan
		want string
	}{
		{nil, examplePlan(hostMapV1), "agent client: deploy: client is required"},
		{c, nil, "agent client: deploy: plan is required"},
		{c, noID, "agent client: deploy: plan has no id"},
	} {
		if _, err := Deploy(context.Background(), tt.c, tt.next, DeployOptions{}); err == nil || err.Error() != tt.want {
			t.Fatalf("Deploy error %v, want %q", err, tt.want)
		}
	}
}

func TestDeployToken(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 3, RenderSeq: 41}) },
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 4}); err != nil {
		t.Fatal(err)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Token != (Token{LeaderEpoch: 4, RenderSeq: 42}) {
		t.Fatalf("token %+v, want {4 42}", sent.manifest.Token)
	}
	if sent.manifest.ExpectedPrevToken != (Token{LeaderEpoch: 3, RenderSeq: 41}) {
		t.Fatalf("expected previous token %+v", sent.manifest.ExpectedPrevToken)
	}
}

func TestDeployUsesCallersAppliedPlan(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1}); err != nil {
		t.Fatal(err)
	}
	reads := agent.requests("GET /v1/state")
	if len(reads) != 1 || reads[0].RequestURI != "/v1/state?plan=0" {
		t.Fatalf("state reads %+v", reads)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Mode != ModeAuto || len(sent.manifest.Ops) != 1 || sent.manifest.Ops[0].Kind != OpMapAdd {
		t.Fatalf("manifest mode %s ops %+v", sent.manifest.Mode, sent.manifest.Ops)
	}
}

// TestDeployRereadsWhenCallersPlanIsStale: the pod holds another plan than
// the caller's, so its blob is the baseline, with or without a preparation
// for the caller's plan; the preparation keeps no decision for that pod.
func TestDeployRereadsWhenCallersPlanIsStale(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	other := examplePlan("other.example.com web-servers\n")
	for _, prep := range []*PreparedDeploy{nil, PrepareDeploy(other, v2)} {
		agent := &scriptedAgent{
			state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
			apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
		}
		c := startScriptedAgent(t, agent)
		if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: other, Prepared: prep}); err != nil {
			t.Fatal(err)
		}
		reads := agent.requests("GET /v1/state")
		if len(reads) != 2 || reads[0].RequestURI != "/v1/state?plan=0" || reads[1].RequestURI != "/v1/state" {
			t.Fatalf("prepared %v: state reads %+v", prep != nil, reads)
		}
		// The second read's blob is the baseline: the change stays runtime.
		sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
		if sent.manifest.Mode != ModeAuto || len(sent.manifest.Ops) != 1 || sent.manifest.Ops[0].Key != "blog.example.com" {
			t.Fatalf("prepared %v: manifest mode %s ops %+v", prep != nil, sent.manifest.Mode, sent.manifest.Ops)
		}
		if prep != nil && len(prep.decisions) != 0 {
			t.Fatalf("the preparation kept %d decisions for a pod that does not hold its applied plan", len(prep.decisions))
		}
	}
}

// TestPreparedDeployDiffsEachBaselineOnce: pods whose baselines differ only
// in what Diff ignores share one decision; a pod that loaded other maps,
// or holds another plan, gets the decision of its own baseline; and the
// kept decisions are bounded.
func TestPreparedDeployDiffsEachBaselineOnce(t *testing.T) {
	v0, v1, v2 := examplePlan("old.example.com web-servers\n"), examplePlan(hostMapV1), examplePlan(hostMapV2)
	pod := func(applied *Plan, edit func(s *State)) *State {
		s := podState(t, applied, Token{LeaderEpoch: 1, RenderSeq: 1})
		if applied == v1 {
			s.AppliedPlan = nil // read with plan=0: the caller's plan stands for it
		}
		if edit != nil {
			edit(&s)
		}
		return &s
	}
	prep := PrepareDeploy(v1, v2)
	first := prep.Decision(pod(v1, nil))
	if first.Verdict != VerdictRuntime || len(first.Ops) != 1 || first.Ops[0].Kind != OpMapAdd {
		t.Fatalf("decision %+v, want one map_add", first)
	}
	// Another pod, another inventory generation: the same decision, shared.
	again := prep.Decision(pod(v1, func(s *State) { s.Inventory.Generation = 7 }))
	if len(prep.decisions) != 1 || &again.Ops[0] != &first.Ops[0] {
		t.Fatalf("%d decisions kept, shared %v; want the first pod's decision again", len(prep.decisions), &again.Ops[0] == &first.Ops[0])
	}
	// A pod whose worker has not loaded the map cannot take map ops.
	unloaded := pod(v1, func(s *State) { s.Inventory.Maps = nil })
	base := deployBaseline(unloaded, v1)
	if got, want := prep.Decision(unloaded), Diff(v2, base); got.Verdict != want.Verdict || got.Verdict == first.Verdict {
		t.Fatalf("unloaded map: verdict %s, want %s (Diff's own)", got.Verdict, want.Verdict)
	}
	// A pod holding another plan is diffed against its blob, and kept apart.
	kept := len(prep.decisions)
	if got := prep.Decision(pod(v0, nil)); got.Verdict != VerdictRuntime || !slices.ContainsFunc(got.Ops, func(op Op) bool { return op.Key == "old.example.com" }) {
		t.Fatalf("a pod holding v0: %+v, want the delta from v0", got)
	}
	if len(prep.decisions) != kept {
		t.Fatalf("%d decisions kept after a pod holding another plan, want %d", len(prep.decisions), kept)
	}
	// Pods past the bound are diffed on their own, and still correctly.
	for i := range maxPreparedBaselines + 3 {
		d := prep.Decision(pod(v1, func(s *State) { s.Inventory.Certs = []string{fmt.Sprintf("certs/%d.pem", i)} }))
		if d.Verdict != VerdictRuntime || len(d.Ops) != 1 {
			t.Fatalf("pod %d: %+v", i, d)
		}
	}
	if len(prep.decisions) != maxPreparedBaselines {
		t.Fatalf("%d decisions kept, want the bound %d", len(prep.decisions), maxPreparedBaselines)
	}
}

// TestDeployWithAPreparation: two pods that hold the caller's plan take the
// change through one preparation, which then holds one decision; a
// preparation for another render is not used, and the pod takes the
// render it is given.
func TestDeployWithAPreparation(t *testing.T) {
	v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(hostMapV3)
	prep := PrepareDeploy(v1, v2)
	var fakes []*FakeHAProxy
	var clients []*Client
	for range 2 {
		fake := startTestFake(t, "")
		seedHostMap(fake, hostMapV1)
		c := deployClient(t, agentBaseURL(startTestAgent(t, fake, nil)))
		if res, err := Deploy(context.Background(), c, v1, DeployOptions{LeaderEpoch: 1}); err != nil || !res.OK {
			t.Fatalf("first deploy = %+v, %v", res, err)
		}
		fakes, clients = append(fakes, fake), append(clients, c)
	}
	for i, c := range clients {
		res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1, Prepared: prep})
		if err != nil || res.Mode != ResultRuntime || res.AppliedPlanID != v2.ID {
			t.Fatalf("pod %d: Deploy = %+v, %v", i, res, err)
		}
		if !slices.Contains(fakes[i].MapEntries(exampleHostMap), MapEntry{Key: "blog.example.com", Value: "web-servers"}) {
			t.Fatalf("pod %d lacks blog.example.com", i)
		}
	}
	if len(prep.decisions) != 1 {
		t.Fatalf("%d decisions kept for two pods of one baseline, want 1", len(prep.decisions))
	}
	res, err := Deploy(context.Background(), clients[0], v3, DeployOptions{LeaderEpoch: 1, Applied: v2, Prepared: prep})
	if err != nil || res.Mode != ResultRuntime || res.AppliedPlanID != v3.ID {
		t.Fatalf("Deploy of v3 with v2's preparation = %+v, %v", res, err)
	}
	if !slices.Contains(fakes[0].MapEntries(exampleHostMap), MapEntry{Key: "wiki.example.com", Value: "web-servers"}) {
		t.Fatal("the pod lacks wiki.example.com")
	}
}

func TestDeployRediffsOnBaselineConflict(t *testing.T) {
	for _, reason := range []string{ReasonPrevMismatch, ReasonUnknownBaseline, ReasonWorkerOpsMismatch} {
		t.Run(reason, func(t *testing.T) {
			v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(hostMapV3)
			agent := &scriptedAgent{
				// The pod moved from v1 to v2 under the first round.
				state: func(n int) State {
					if n == 1 {
						return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1})
					}
					return podState(t, v2, Token{LeaderEpoch: 1, RenderSeq: 2})
				},
				apply: func(n int, _ recordedRequest) (int, any) {
					if n == 1 {
						return 409, Conflict{AppliedPlanID: v2.ID, AppliedToken: Token{LeaderEpoch: 1, RenderSeq: 2}, Reason: reason}
					}
					return 200, ackFor(v3, ResultRuntime)
				},
			}
			c := startScriptedAgent(t, agent)
			res, err := Deploy(context.Background(), c, v3, DeployOptions{LeaderEpoch: 1})
			if err != nil || !res.OK {
				t.Fatalf("Deploy = %+v, %v", res, err)
			}
			applies := agent.requests("POST /v1/apply")
			if n := len(agent.requests("GET /v1/state")); n != 2 || len(applies) != 2 {
				t.Fatalf("%d state reads, %d applies; want 2 and 2", n, len(applies))
			}
			second := decodeApply(t, applies[1]).manifest
			if second.ExpectedPrevPlanID != v2.ID || second.Token.RenderSeq != 3 || len(second.Ops) != 1 {
				t.Fatalf("re-diffed manifest %+v", second)
			}
		})
	}
}

func TestDeployGivesUpAfterThreeRediffs(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) {
			return 409, Conflict{AppliedPlanID: "elsewhere", Reason: ReasonPrevMismatch}
		},
	}
	c := startScriptedAgent(t, agent)
	_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Reason != ReasonPrevMismatch {
		t.Fatalf("Deploy error %v, want the prev_mismatch conflict", err)
	}
	if r, a := len(agent.requests("GET /v1/state")), len(agent.requests("POST /v1/apply")); r != 4 || a != 4 {
		t.Fatalf("%d state reads, %d applies; want 4 and 4", r, a)
	}
}

func TestDeployReturnsStaleEpochAtOnce(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	for _, reason := range []string{ReasonStaleEpoch, ReasonRevertTargetMismatch, "some_future_reason"} {
		agent := &scriptedAgent{
			state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 9, RenderSeq: 1}) },
			apply: func(int, recordedRequest) (int, any) {
				return 409, Conflict{AppliedPlanID: v1.ID, AppliedToken: Token{LeaderEpoch: 9, RenderSeq: 1}, Reason: reason}
			},
		}
		c := startScriptedAgent(t, agent)
		_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 8})
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Reason != reason {
			t.Fatalf("Deploy error %v, want the %s conflict", err, reason)
		}
		if a := len(agent.requests("POST /v1/apply")); a != 1 {
			t.Fatalf("%s: %d applies, want 1", reason, a)
		}
	}
}

func TestDeployResendsExactlyTheMissingParts(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(n int, _ recordedRequest) (int, any) {
			if n == 1 {
				return 409, Missing{Missing: []string{exampleHostMap}}
			}
			return 200, ackFor(v2, ResultRuntime)
		},
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	applies := agent.requests("POST /v1/apply")
	if len(applies) != 2 || len(agent.requests("GET /v1/state")) != 1 {
		t.Fatalf("%d applies", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if len(first.names) != 0 {
		t.Fatalf("first apply carried parts %v", first.names)
	}
	if len(resend.names) != 1 || resend.parts[exampleHostMap] != hostMapV2 {
		t.Fatalf("resend carried %v", resend.names)
	}
	if resend.manifestJSON != first.manifestJSON {
		t.Fatalf("the resend changed the manifest:\n%s\n%s", first.manifestJSON, resend.manifestJSON)
	}
}

func TestDeployMissingContentIsAnError(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	v2.Files[1].Content, v2.Files[1].ContentKnown = "", false
	for _, tt := range []struct {
		missing string
		want    string
	}{
		{exampleHostMap, fmt.Sprintf("agent client: deploy: plan %s has no content for %q", v2.ID, exampleHostMap)},
		{"maps/other.map", fmt.Sprintf("agent client: deploy: the agent asks for %q, which is not a file of plan %s", "maps/other.map", v2.ID)},
	} {
		agent := &scriptedAgent{
			state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
			apply: func(int, recordedRequest) (int, any) { return 409, Missing{Missing: []string{tt.missing}} },
		}
		c := startScriptedAgent(t, agent)
		_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
		if err == nil || err.Error() != tt.want {
			t.Fatalf("Deploy error %v, want %q", err, tt.want)
		}
		if a := len(agent.requests("POST /v1/apply")); a != 1 {
			t.Fatalf("%d applies, want 1", a)
		}
	}
}

func TestDeployNoPlanEndpoint(t *testing.T) {
	v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(hostMapV3)
	var current atomic.Pointer[Plan]
	current.Store(v1)
	agent := &scriptedAgent{
		state: func(int) State {
			s := podState(t, current.Load(), Token{LeaderEpoch: 1, RenderSeq: 1})
			s.AppliedPlan, s.AppliedPlanStored = nil, false
			return s
		},
		apply: func(n int, req recordedRequest) (int, any) {
			next := v2
			if n == 2 {
				next = v3
			}
			current.Store(next)
			return 200, ackFor(next, ResultRuntime)
		},
		putPlan: func(int) (int, any) { return 404, "404 page not found" },
	}
	c := startScriptedAgent(t, agent)
	res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1})
	if err != nil || !res.OK {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if n := len(agent.requests("PUT /v1/plan")); n != 1 {
		t.Fatalf("%d PutPlan calls, want 1", n)
	}
	if _, err := Deploy(context.Background(), c, v3, DeployOptions{LeaderEpoch: 1, Applied: v2}); err != nil {
		t.Fatal(err)
	}
	applies := agent.requests("POST /v1/apply")
	first, second := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if _, ok := first.parts[PartPlan]; ok {
		t.Fatal("the first runtime apply carried the blob")
	}
	blob, ok := second.parts[PartPlan]
	if !ok || second.manifest.Mode != ModeAuto {
		t.Fatalf("the second apply (mode %s) carried no plan part: %v", second.manifest.Mode, second.names)
	}
	decoded, err := DecodePlanBlob([]byte(blob))
	if err != nil || decoded.ID != v3.ID {
		t.Fatalf("plan part decodes to %v, %v", decoded, err)
	}
	if n := len(agent.requests("PUT /v1/plan")); n != 1 {
		t.Fatalf("%d PutPlan calls after the blob rode the apply, want still 1", n)
	}
}

func TestDeployIgnoresPlanMoved(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	for _, answer := range []struct {
		status int
		body   any
	}{
		{409, PlanMoved{AppliedPlanID: "plan-later"}},
		{500, ApplyError{Stage: StagePlan, Message: "disk full"}},
	} {
		agent := &scriptedAgent{
			state:   func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
			apply:   func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
			putPlan: func(int) (int, any) { return answer.status, answer.body },
		}
		c := startScriptedAgent(t, agent)
		res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
		if err != nil || !res.OK || res.AppliedPlanID != v2.ID {
			t.Fatalf("PutPlan %d: Deploy = %+v, %v", answer.status, res, err)
		}
		puts := agent.requests("PUT /v1/plan")
		wantURI := "/v1/plan?" + url.Values{"plan_id": {v2.ID}, "proof": {"proof-" + v2.ID}}.Encode()
		if len(puts) != 1 || puts[0].RequestURI != wantURI {
			t.Fatalf("PutPlan requests %+v", puts)
		}
	}
}

func TestDeployNACKIsNotAnError(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) {
			return 200, ApplyResult{PlanID: v2.ID, Mode: ResultRejected, Error: &ApplyError{Stage: StageReload, Message: "Success=0"}}
		},
	}
	c := startScriptedAgent(t, agent)
	res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
	if err != nil || res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if a, p := len(agent.requests("POST /v1/apply")), len(agent.requests("PUT /v1/plan")); a != 1 || p != 0 {
		t.Fatalf("%d applies and %d PutPlan calls, want 1 and 0", a, p)
	}
}

func TestDeployMajorSkewReloads(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State {
			s := podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1})
			s.APIVersion = APIVersion + 1
			return s
		},
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultReload) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Mode != ModeReload || len(sent.manifest.Ops) != 0 || len(sent.manifest.Files) != len(v2.Files) {
		t.Fatalf("manifest mode %s, %d ops, %d files", sent.manifest.Mode, len(sent.manifest.Ops), len(sent.manifest.Files))
	}
	if _, ok := sent.parts[PartPlan]; !ok {
		t.Fatal("the reload apply carried no blob")
	}
	if p := len(agent.requests("PUT /v1/plan")); p != 0 {
		t.Fatalf("%d PutPlan calls after a reload apply", p)
	}
}

func TestDeployNeverSendsBatchesWithoutRuntimeBatches(t *testing.T) {
	empty, big := examplePlan(""), examplePlan(manyKeysMap(MaxOpsPerApply+1))
	for _, tt := range []struct {
		name        string
		features    []string
		wantMode    string
		wantBatches int
	}{
		{"with runtime_batches", []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches}, ModeAuto, 1},
		{"without runtime_batches", []string{FeatureFilePatch, FeatureWorkerFence}, ModeReload, 0},
		{"no features", nil, ModeReload, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			agent := &scriptedAgent{
				state: func(int) State {
					s := podState(t, empty, Token{LeaderEpoch: 1, RenderSeq: 1})
					s.Features = tt.features
					return s
				},
				apply: func(int, recordedRequest) (int, any) { return 200, ackFor(big, ResultRuntime) },
			}
			c := startScriptedAgent(t, agent)
			if _, err := Deploy(context.Background(), c, big, DeployOptions{LeaderEpoch: 1}); err != nil {
				t.Fatal(err)
			}
			m := decodeApply(t, agent.requests("POST /v1/apply")[0]).manifest
			if m.Mode != tt.wantMode || len(m.OpBatches) != tt.wantBatches {
				t.Fatalf("manifest mode %s with %d op batches", m.Mode, len(m.OpBatches))
			}
		})
	}
}

func TestDeployBlobOverLimitIsNotSent(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	oversized := make([]byte, MaxPlanBlobBytes+1)
	for _, tt := range []struct {
		name  string
		state func() State
		mode  string
	}{
		{"runtime", func() State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) }, ResultRuntime},
		{"reload", func() State { return State{APIVersion: APIVersion, AgentOps: ComposedOps()} }, ResultReload},
	} {
		t.Run(tt.name, func(t *testing.T) {
			agent := &scriptedAgent{
				state: func(int) State { return tt.state() },
				apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, tt.mode) },
			}
			c := startScriptedAgent(t, agent)
			res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, PlanBlob: oversized})
			if err != nil || !res.OK {
				t.Fatalf("Deploy = %+v, %v", res, err)
			}
			sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
			if _, ok := sent.parts[PartPlan]; ok {
				t.Fatal("an oversized blob was sent as the plan part")
			}
			if p := len(agent.requests("PUT /v1/plan")); p != 0 {
				t.Fatalf("%d PutPlan calls with an oversized blob", p)
			}
		})
	}
}

func TestCheckSkew(t *testing.T) {
	composable := ComposableOps()
	lacksLastTwo := composable[:len(composable)-2]
	tests := []struct {
		name        string
		state       *State
		wantMajor   bool
		wantMissing []string
	}{
		{"matching agent", &State{APIVersion: APIVersion, AgentOps: composable}, false, nil},
		{"agent advertising more kinds", &State{APIVersion: APIVersion, AgentOps: append(ComposableOps(), OpShutdownSessions)}, false, nil},
		{"newer major", &State{APIVersion: APIVersion + 1, AgentOps: composable}, true, nil},
		{"lacks the last two kinds", &State{APIVersion: APIVersion, AgentOps: lacksLastTwo},
			false, composable[len(composable)-2:]},
		{"nil state", nil, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			major, missing := CheckSkew(tt.state)
			if major != tt.wantMajor || !slices.Equal(missing, tt.wantMissing) || (tt.wantMissing == nil) != (missing == nil) {
				t.Fatalf("CheckSkew = %v, %#v; want %v, %#v", major, missing, tt.wantMajor, tt.wantMissing)
			}
		})
	}
	if _, missing := CheckSkew(&State{APIVersion: APIVersion, AgentOps: lacksLastTwo}); !slices.Equal(missing, []string{OpCRTListAdd, OpCRTListDel}) {
		t.Fatalf("missing %v, want crtlist_add and crtlist_del", missing)
	}
}

func TestComposableOpsEqualsComposedOps(t *testing.T) {
	got := ComposableOps()
	if !slices.Equal(got, ComposedOps()) {
		t.Fatalf("ComposableOps %v, ComposedOps %v", got, ComposedOps())
	}
	got[0] = "mutated"
	if again := ComposableOps(); again[0] == "mutated" || !slices.Equal(again, ComposedOps()) {
		t.Fatal("mutating the returned slice changed the next call's result")
	}
}

// ---------------------------------------------------------------------------
// Deploy against the real agent on the fake HAProxy.

// weightPlan is a render with one dynamic backend, web-servers, whose one
// server web1 has the given weight: a weight change is one
// server_set_weight at runtime.
func weightPlan(weight int) *Plan {
	const global = "global\n    stats socket /etc/haproxy/haproxy-worker.sock mode 600 level admin\n\n"
	const defaults = "defaults web\n    mode http\n    timeout connect 5s\n\n"
	const body = "    balance roundrobin\n"
	backend := fmt.Sprintf("backend web-servers\n%s    server web1 192.168.1.10:80 weight %d\n", body, weight)
	config := global + defaults + backend
	w := weight
	p := &Plan{
		SchemaVersion: PlanSchemaVersion,
		Sections: []Section{
			{Kind: SectionKindCore, Name: "global", TextDigest: DigestString(global), Length: len(global), Text: global, TextKnown: true},
			{Kind: SectionKindProfile, Name: "web", TextDigest: DigestString(defaults), Length: len(defaults), Text: defaults, TextKnown: true},
			{Kind: SectionKindBackend, Name: "web-servers", TextDigest: DigestString(backend), Length: len(backend), Text: backend, TextKnown: true},
		},
		Backends: map[string]Backend{"web-servers": {
			Name: "web-servers", Profile: "web", Mode: "http", Balance: "roundrobin", Shape: ShapeDynamic,
			Servers:        []Server{{Name: "web1", Address: "192.168.1.10", Port: 80, Weight: &w}},
			BodyDigest:     DigestString(body),
			CommentsDigest: DigestString(""),
			RecordDigest:   DigestString(fmt.Sprintf("web-servers web http roundrobin web1 192.168.1.10:80 weight %d", weight)),
			TextDigest:     DigestString(backend),
		}},
		Profiles: map[string]Profile{"web": {Name: "web", BodyDigest: DigestString(defaults)}},
		Files: []PlanFile{{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true, Digest: DigestString(config),
			Size: int64(len(config)), Content: config, ContentKnown: true}},
	}
	p.ComputeID()
	return p
}

// seedWebServers gives the fake's worker the backend weightPlan describes.
func seedWebServers(fake *FakeHAProxy) {
	fake.With(func(m *FakeModel) {
		if m.Backends == nil {
			m.Backends = map[string]*FakeBackend{}
		}
		m.Backends["web-servers"] = &FakeBackend{Profile: "web", Mode: "http", Published: true, Servers: []*FakeServer{
			{Name: "web1", Address: "192.168.1.10", Port: 80, Weight: 1, State: ServerStateReady, Enabled: true},
		}}
	})
}

// seedHostMap gives the fake's worker the example's host map, loaded.
func seedHostMap(fake *FakeHAProxy, content string) {
	fake.With(func(m *FakeModel) {
		if m.Maps == nil {
			m.Maps = map[string][]MapEntry{}
		}
		m.Maps[exampleHostMap] = ParseMapEntries(content)
	})
}

// startRecordingProxy forwards every request to the agent at addr after
// recording it and running before (when set), so that a test sees the
// wire of a Deploy that talks to a real agent.
func startRecordingProxy(t testing.TB, addr string, before func(req recordedRequest)) (string, *requestLog) {
	t.Helper()
	target, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	log := &requestLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := recordedRequest{Method: r.Method, RequestURI: r.RequestURI, Header: r.Header.Clone(), Body: body}
		log.add(rec)
		if before != nil {
			before(rec)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.TransferEncoding = nil
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, log
}

// routeRequests returns the recorded requests of one route, e.g. "POST /v1/apply".
func routeRequests(log *requestLog, route string) []recordedRequest {
	var out []recordedRequest
	for _, r := range log.all() {
		if r.Method+" "+strings.SplitN(r.RequestURI, "?", 2)[0] == route {
			out = append(out, r)
		}
	}
	return out
}

func deployClient(t testing.TB, baseURL string) *Client {
	t.Helper()
	return newTestClient(t, baseURL, func(cfg *ClientConfig) { cfg.Username, cfg.Password = "haptic", "s3cret" })
}

func TestDeployToAFreshAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedHostMap(fake, hostMapV1)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)

	v1 := examplePlan(hostMapV1)
	res, err := Deploy(context.Background(), c, v1, DeployOptions{LeaderEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != v1.ID {
		t.Fatalf("result %+v", res)
	}
	applies := routeRequests(log, "POST /v1/apply")
	if len(applies) != 2 {
		t.Fatalf("%d applies, want 2", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if first.manifest.Mode != ModeReload || len(first.names) != 1 || first.names[0] != PartPlan {
		t.Fatalf("first apply: mode %s, parts %v", first.manifest.Mode, first.names)
	}
	if len(resend.names) != 3 || resend.names[0] != PartPlan ||
		resend.parts[ConfigFilePath] != exampleConfig || resend.parts[exampleHostMap] != hostMapV1 {
		t.Fatalf("resend parts %v", resend.names)
	}
	if resend.manifestJSON != first.manifestJSON {
		t.Fatal("the resend changed the manifest")
	}
	if n := len(routeRequests(log, "PUT /v1/plan")); n != 0 {
		t.Fatalf("%d PutPlan calls after a reload deploy", n)
	}
	state, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if !state.AppliedPlanStored || state.AppliedPlanID != v1.ID {
		t.Fatalf("state: applied %s, stored %v", state.AppliedPlanID, state.AppliedPlanStored)
	}
}

func TestDeployRuntimeChangeStoresTheBlob(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)

	v10, v20, v30 := weightPlan(10), weightPlan(20), weightPlan(30)
	if res, err := Deploy(context.Background(), c, v10, DeployOptions{LeaderEpoch: 1}); err != nil || res.Mode != ResultReload {
		t.Fatalf("first deploy = %+v, %v", res, err)
	}
	before := len(log.all())
	res, err := Deploy(context.Background(), c, v20, DeployOptions{LeaderEpoch: 1, Applied: v10})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Mode != ResultRuntime || res.AppliedPlanProof == "" {
		t.Fatalf("second deploy = %+v", res)
	}
	var applies, puts []recordedRequest
	for _, r := range log.all()[before:] {
		switch r.Method + " " + strings.SplitN(r.RequestURI, "?", 2)[0] {
		case "POST /v1/apply":
			applies = append(applies, r)
		case "PUT /v1/plan":
			puts = append(puts, r)
		}
	}
	for _, a := range applies {
		if sent := decodeApply(t, a); sent.parts[PartPlan] != "" {
			t.Fatalf("a runtime apply carried the blob (mode %s)", sent.manifest.Mode)
		}
	}
	wantURI := "/v1/plan?" + url.Values{"plan_id": {res.AppliedPlanID}, "proof": {res.AppliedPlanProof}}.Encode()
	if len(puts) != 1 || puts[0].RequestURI != wantURI {
		t.Fatalf("PutPlan requests %+v, want one to %s", puts, wantURI)
	}
	if s, ok := fake.Server("web-servers", "web1"); !ok || s.Weight != 20 {
		t.Fatalf("web1 = %+v", s)
	}

	// A cold leader: a new client, no plan of its own. The stored blob is
	// its baseline, and the next change is runtime again.
	cold := deployClient(t, agentBaseURL(agent))
	res, err = Deploy(context.Background(), cold, v30, DeployOptions{LeaderEpoch: 2})
	if err != nil || res.Mode != ResultRuntime {
		t.Fatalf("cold deploy = %+v, %v", res, err)
	}
	if s, _ := fake.Server("web-servers", "web1"); s.Weight != 30 {
		t.Fatalf("web1 weight %d, want 30", s.Weight)
	}
}

func agentBaseURL(a *Agent) string { return "http://" + a.Addr() }

func TestDeployRediffsAgainstTheAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	direct := deployClient(t, agentBaseURL(agent))
	if _, err := Deploy(context.Background(), direct, weightPlan(10), DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	// Another controller moves the pod while this deploy's first apply is
	// on its way: the agent fences it, and the deploy re-diffs.
	var once sync.Once
	proxyURL, log := startRecordingProxy(t, agent.Addr(), func(req recordedRequest) {
		if req.Method == http.MethodPost {
			once.Do(func() {
				if _, err := Deploy(context.Background(), direct, weightPlan(15), DeployOptions{LeaderEpoch: 1}); err != nil {
					t.Error(err)
				}
			})
		}
	})
	res, err := Deploy(context.Background(), deployClient(t, proxyURL), weightPlan(20), DeployOptions{LeaderEpoch: 1})
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if n := len(routeRequests(log, "GET /v1/state")); n != 2 {
		t.Fatalf("%d state reads, want 2", n)
	}
	if s, _ := fake.Server("web-servers", "web1"); s.Weight != 20 {
		t.Fatalf("web1 weight %d, want 20", s.Weight)
	}
}

func TestDeployStaleEpochAgainstTheAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)
	if _, err := Deploy(context.Background(), c, weightPlan(10), DeployOptions{LeaderEpoch: 5}); err != nil {
		t.Fatal(err)
	}
	before := len(routeRequests(log, "POST /v1/apply"))
	_, err := Deploy(context.Background(), c, weightPlan(20), DeployOptions{LeaderEpoch: 4})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Reason != ReasonStaleEpoch || ce.AppliedToken.LeaderEpoch != 5 {
		t.Fatalf("Deploy error %v, want stale_epoch", err)
	}
	if n := len(routeRequests(log, "POST /v1/apply")) - before; n != 1 {
		t.Fatalf("%d applies, want 1", n)
	}
}

// ---------------------------------------------------------------------------
// Benchmarks.

// hostMapValue is the example map with shop.example.com pointing at value:
// two of them differ by one map_set.
func hostMapValue(value string) string { return "shop.example.com " + value + "\n" }

func BenchmarkDeployRuntimeMapEntry(b *testing.B) {
	fake := startTestFake(b, "")
	seedHostMap(fake, hostMapValue("web-a"))
	agent := startTestAgent(b, fake, nil)
	c := deployClient(b, agentBaseURL(agent))
	plans := [2]*Plan{examplePlan(hostMapValue("web-a")), examplePlan(hostMapValue("web-b"))}
	var blobs [2][]byte
	for i, p := range plans {
		blob, err := EncodePlanBlob(p)
		if err != nil {
			b.Fatal(err)
		}
		blobs[i] = blob
	}
	ctx := context.Background()
	if _, err := Deploy(ctx, c, plans[0], DeployOptions{LeaderEpoch: 1, PlanBlob: blobs[0]}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		next, prev := (i+1)%2, i%2
		res, err := Deploy(ctx, c, plans[next], DeployOptions{LeaderEpoch: 1, Applied: plans[prev], PlanBlob: blobs[next]})
		if err != nil || res.Mode != ResultRuntime {
			b.Fatalf("Deploy = %+v, %v", res, err)
		}
	}
}

func BenchmarkApplyRuntimeMapEntry(b *testing.B) {
	fake := startTestFake(b, "")
	seedHostMap(fake, hostMapValue("web-a"))
	agent := startTestAgent(b, fake, nil)
	c := deployClient(b, agentBaseURL(agent))
	ctx := context.Background()
	plans := [2]*Plan{examplePlan(hostMapValue("web-a")), examplePlan(hostMapValue("web-b"))}
	if _, err := Deploy(ctx, c, plans[0], DeployOptions{LeaderEpoch: 1}); err != nil {
		b.Fatal(err)
	}
	state, err := c.State(ctx, StateRead{})
	if err != nil {
		b.Fatal(err)
	}
	// Both directions are one map_set; each apply carries the map's part.
	var decisions [2]Decision
	for i := range plans {
		base, err := BaselineFromState(state)
		if err != nil {
			b.Fatal(err)
		}
		base.Applied, base.Running, base.WorkerOps = plans[i], plans[i], plans[i]
		decisions[(i+1)%2] = Diff(plans[(i+1)%2], base)
		if decisions[(i+1)%2].Verdict != VerdictRuntime {
			b.Fatalf("decision %+v", decisions[(i+1)%2])
		}
	}
	b.ResetTimer()
	for i := range b.N {
		next := (i + 1) % 2
		m := NewManifest(plans[next], decisions[next], state, Token{LeaderEpoch: 1, RenderSeq: state.AppliedToken.RenderSeq + 1})
		part := map[string]io.Reader{exampleHostMap: strings.NewReader(plans[next].Files[1].Content)}
		res, err := c.Apply(ctx, m, part, nil)
		if err != nil || res.Mode != ResultRuntime {
			b.Fatalf("Apply = %+v, %v", res, err)
		}
		state.AppliedPlanID, state.AppliedPlanProof = res.AppliedPlanID, res.AppliedPlanProof
		state.WorkerOpsPlanID, state.WorkerOpsPlanProof = res.WorkerOpsPlanID, res.WorkerOpsPlanProof
		state.RunningPlanID, state.RunningPlanProof = res.RunningPlanID, res.RunningPlanProof
		state.AppliedToken = res.AppliedToken
	}
}

func TestDeployOverTheAdminSocketIsRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fake := startTestFake(t, "")
	sock := filepath.Join(dir, "admin.sock")
	startTestAgent(t, fake, func(cfg *AgentConfig) { cfg.AdminSocket = sock })
	c := newTestClient(t, "http://localhost", func(cfg *ClientConfig) { cfg.UnixSocket = sock })
	if err := c.Health(context.Background()); err != nil {
		t.Fatalf("Health over the admin socket: %v", err)
	}
	_, err = Deploy(context.Background(), c, examplePlan(hostMapV1), DeployOptions{LeaderEpoch: 1})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound {
		t.Fatalf("Deploy over the admin socket: %v, want *HTTPError 404", err)
	}
}

// TestDeployTakesTheWorkerBaselineFromThePod: the caller's own plan stands
// for the pod's applied plan only. Here the pod applied v2 and waits to
// reload it, while its worker still runs v1, which lacks the key whose value
// v3 changes; the caller deploys v3. Its copy of v2 is no proof of what the
// worker runs, so no in-place map_set is composed against it (it would fail
// on that worker); when the worker does run v2, the same deploy composes
// one, so the test is not passing for want of in-place ops.
func TestDeployTakesTheWorkerBaselineFromThePod(t *testing.T) {
	v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(strings.Replace(hostMapV2, "blog.example.com web-servers", "blog.example.com blog-servers", 1))
	for _, tc := range []struct {
		name        string
		worker      *Plan
		wantInPlace bool
	}{
		{"the worker runs another plan", v1, false},
		{"the worker runs the applied plan", v2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := &scriptedAgent{
				state: func(int) State {
					s := podState(t, v2, Token{LeaderEpoch: 1, RenderSeq: 2})
					s.RunningPlanID, s.RunningPlanProof = v1.ID, "proof-"+v1.ID
					s.WorkerOpsPlanID, s.WorkerOpsPlanProof = tc.worker.ID, "proof-"+tc.worker.ID
					s.ReloadPendingAt = "2026-01-01T00:00:00Z"
					return s
				},
				apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v3, ResultRuntime) },
			}
			c := startScriptedAgent(t, agent)
			if _, err := Deploy(context.Background(), c, v3, DeployOptions{LeaderEpoch: 1, Applied: v2}); err != nil {
				t.Fatal(err)
			}
			m := decodeApply(t, agent.requests("POST /v1/apply")[0]).manifest
			if got := len(m.InPlaceOps) > 0; got != tc.wantInPlace {
				t.Errorf("in-place ops %+v (worker ops plan %q), want some: %v", m.InPlaceOps, m.WorkerOpsPlanID, tc.wantInPlace)
			}
			if m.ExpectedWorkerOpsPlanID != tc.worker.ID {
				t.Errorf("expected worker ops plan %q, the pod's is %q", m.ExpectedWorkerOpsPlanID, tc.worker.ID)
			}
		})
	}
}
