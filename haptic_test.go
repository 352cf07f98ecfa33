// This file tests haptic.go, the types and helpers both ends of the wire
// share: every wire type's JSON shape (by reflection and by golden fixtures
// under testdata/wire/), the constants and limits, the token grammar, op
// batches and the small helpers.

package haptic

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// budgetOps returns n ops of one kind, for the op-budget tables.
func budgetOps(n int) []Op {
	ops := make([]Op, n)
	for i := range ops {
		ops[i] = Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "k" + strconv.Itoa(i), Value: "v"}
	}
	return ops
}

// budgetBatches returns count continuation batches of size ops each.
func budgetBatches(count, size int) [][]Op {
	batches := make([][]Op, count)
	for i := range batches {
		batches[i] = budgetOps(size)
	}
	return batches
}

func TestManifestOperationBudgets(t *testing.T) {
	rows := []struct {
		name  string
		m     Manifest
		valid bool
	}{
		{"empty", Manifest{}, true},
		{"1000 ops", Manifest{Ops: budgetOps(1000)}, true},
		{"600 ops + 400 in-place", Manifest{Ops: budgetOps(600), InPlaceOps: budgetOps(400)}, true},
		{"1001 ops", Manifest{Ops: budgetOps(1001)}, false},
		{"600 ops + 401 in-place", Manifest{Ops: budgetOps(600), InPlaceOps: budgetOps(401)}, false},
		{"1000 ops + 7 batches of 1000", Manifest{Ops: budgetOps(1000), OpBatches: budgetBatches(7, 1000)}, true},
		{"8 continuation batches of 1", Manifest{OpBatches: budgetBatches(8, 1)}, false},
		{"1 continuation batch of 0", Manifest{OpBatches: budgetBatches(1, 0)}, false},
		{"1 continuation batch of 1001", Manifest{OpBatches: budgetBatches(1, 1001)}, false},
		{"1000 in-place + 1 batch of 1", Manifest{InPlaceOps: budgetOps(1000), OpBatches: budgetBatches(1, 1)}, true},
	}
	for _, r := range rows {
		if err := r.m.ValidateOpBatches(); (err == nil) != r.valid {
			t.Errorf("%s: ValidateOpBatches = %v, want valid=%v", r.name, err, r.valid)
		}
	}
}

func TestValidateOpBatchesErrorTexts(t *testing.T) {
	rows := []struct {
		m    Manifest
		want string
	}{
		{Manifest{Ops: budgetOps(1001)}, "1001 ops exceed the 1000-op limit"},
		{Manifest{OpBatches: budgetBatches(8, 1)}, "9 operation batches exceed the 8-batch limit"},
		{Manifest{OpBatches: budgetBatches(1, 0)}, "operation batch 2 must contain 1 to 1000 ops; got 0"},
		{Manifest{OpBatches: [][]Op{budgetOps(1), budgetOps(1001)}}, "operation batch 3 must contain 1 to 1000 ops; got 1001"},
		// The checks run in order: the first-batch budget before the batch count.
		{Manifest{Ops: budgetOps(1001), OpBatches: budgetBatches(8, 0)}, "1001 ops exceed the 1000-op limit"},
		{Manifest{OpBatches: budgetBatches(9, 0)}, "10 operation batches exceed the 8-batch limit"},
	}
	for _, r := range rows {
		if err := r.m.ValidateOpBatches(); err == nil || err.Error() != r.want {
			t.Errorf("ValidateOpBatches = %v, want %q", err, r.want)
		}
	}
	var nilManifest *Manifest
	if err := nilManifest.ValidateOpBatches(); err != nil {
		t.Errorf("nil manifest: %v", err)
	}
}

func TestRuntimeOps(t *testing.T) {
	a, b, c, d := Op{Kind: "a"}, Op{Kind: "b"}, Op{Kind: "c"}, Op{Kind: "d"}
	m := &Manifest{Ops: []Op{a}, OpBatches: [][]Op{{b, c}, {d}}, InPlaceOps: []Op{{Kind: "in-place"}}}
	if got, want := m.RuntimeOps(), []Op{a, b, c, d}; !reflect.DeepEqual(got, want) {
		t.Errorf("RuntimeOps = %v, want %v", got, want)
	}
	single := &Manifest{Ops: []Op{a, b}, InPlaceOps: []Op{c}}
	got := single.RuntimeOps()
	if len(got) != 2 || &got[0] != &single.Ops[0] {
		t.Error("without batches RuntimeOps is not m.Ops itself")
	}
	var nilManifest *Manifest
	if nilManifest.RuntimeOps() != nil {
		t.Error("nil manifest: RuntimeOps is not nil")
	}
	// With batches the result is a new slice: appending to it cannot reach m.Ops.
	ops := m.RuntimeOps()
	ops[0].Kind = "changed"
	if m.Ops[0].Kind != "a" {
		t.Error("RuntimeOps with batches shares m.Ops")
	}
}

func TestSafeToken(t *testing.T) {
	rows := []struct {
		s    string
		want bool
	}{
		{"maps/route-backend.map", true},
		{"a.example.com", true},
		{"h2,http/1.1", true},
		{"é", true},
		{"", false},
		{"a b", false},
		{"a\tb", false},
		{"a;b", false},
		{"<<", false},
		{"a>b", false},
		{`a\b`, false},
		{"a\nb", false},
		{"a\rb", false},
		{"a\x00b", false},
		{"a\vb", false},
		{"a\x7fb", false},
	}
	for _, r := range rows {
		if got := SafeToken(r.s); got != r.want {
			t.Errorf("SafeToken(%q) = %v, want %v", r.s, got, r.want)
		}
	}
}

func TestSafePayloadValue(t *testing.T) {
	rows := []struct {
		s    string
		want bool
	}{
		{"", true},
		{"301|https|example.com; x", true},
		{"a>b", true},
		{"a\nb", false},
		{"a\rb", false},
		{"a\x00b", false},
	}
	for _, r := range rows {
		if got := SafePayloadValue(r.s); got != r.want {
			t.Errorf("SafePayloadValue(%q) = %v, want %v", r.s, got, r.want)
		}
	}
}

func TestWorkerIdentity(t *testing.T) {
	const pid, start = 1000, int64(1.7e15)
	reference := HAProxyInfo{Version: "3.0.5", WorkerPID: pid, WorkerStartTimeUnixMicros: start}
	rows := []struct {
		name      string
		info      HAProxyInfo
		has, same bool
	}{
		{"same worker", HAProxyInfo{WorkerPID: pid, WorkerStartTimeUnixMicros: start}, true, true},
		{"zero value", HAProxyInfo{}, false, false},
		{"missing PID", HAProxyInfo{WorkerStartTimeUnixMicros: start}, false, false},
		{"missing start time", HAProxyInfo{WorkerPID: pid}, false, false},
		{"negative PID", HAProxyInfo{WorkerPID: -pid, WorkerStartTimeUnixMicros: start}, false, false},
		{"negative start time", HAProxyInfo{WorkerPID: pid, WorkerStartTimeUnixMicros: -start}, false, false},
		{"reused PID", HAProxyInfo{WorkerPID: pid, WorkerStartTimeUnixMicros: start + 1}, true, false},
		{"different PID", HAProxyInfo{WorkerPID: pid + 1, WorkerStartTimeUnixMicros: start}, true, false},
	}
	for _, r := range rows {
		if got := r.info.HasWorkerIdentity(); got != r.has {
			t.Errorf("%s: HasWorkerIdentity = %v, want %v", r.name, got, r.has)
		}
		if got := r.info.SameWorker(reference); got != r.same {
			t.Errorf("%s: SameWorker = %v, want %v", r.name, got, r.same)
		}
	}
	all := []HAProxyInfo{reference}
	for _, r := range rows {
		all = append(all, r.info)
	}
	for _, a := range all {
		if a.SameWorker(a) != a.HasWorkerIdentity() {
			t.Errorf("%+v: SameWorker with itself is %v, identity complete is %v", a, a.SameWorker(a), a.HasWorkerIdentity())
		}
		for _, b := range all {
			if a.SameWorker(b) != b.SameWorker(a) {
				t.Errorf("SameWorker is not symmetric for %+v and %+v", a, b)
			}
		}
	}
}

func TestHoldsAppliedPlan(t *testing.T) {
	rows := []struct {
		name string
		s    State
		want bool
	}{
		{"stored flag only", State{AppliedPlanStored: true}, true},
		{"blob only", State{AppliedPlan: []byte{0x28, 0xb5, 0x2f, 0xfd}}, true},
		{"both", State{AppliedPlanStored: true, AppliedPlan: []byte{1}}, true},
		{"neither", State{AppliedPlan: []byte{}}, false},
	}
	for _, r := range rows {
		if got := r.s.HoldsAppliedPlan(); got != r.want {
			t.Errorf("%s: HoldsAppliedPlan = %v, want %v", r.name, got, r.want)
		}
	}
}

func TestStateReadQuery(t *testing.T) {
	rows := []struct {
		read StateRead
		want string
	}{
		{StateRead{}, "?plan=0"},
		{StateRead{Verify: true}, "?verify=1&plan=0"},
		{StateRead{Plan: true}, ""},
		{StateRead{Verify: true, Plan: true}, "?verify=1"},
	}
	for _, r := range rows {
		if got := r.read.Query(); got != r.want {
			t.Errorf("%+v.Query() = %q, want %q", r.read, got, r.want)
		}
	}
}

// wireField is one wire struct field as the wire format fixes it: Go name,
// Go type, JSON name and whether it is omitted when empty.
type wireField struct {
	name, goType, jsonName string
	omitempty              bool
}

func TestWireFieldInventory(t *testing.T) {
	rows := []struct {
		typ  reflect.Type
		want []wireField
	}{
		{reflect.TypeFor[Manifest](), []wireField{
			{"IdentityVersion", "int", "identity_version", true},
			{"PlanID", "string", "plan_id", false},
			{"PlanProof", "string", "plan_proof", true},
			{"PlanSchemaVersion", "int", "plan_schema_version", false},
			{"Token", "haptic.Token", "token", false},
			{"ExpectedPrevPlanID", "string", "expected_prev_plan_id", false},
			{"ExpectedPrevPlanProof", "string", "expected_prev_plan_proof", true},
			{"ExpectedPrevToken", "haptic.Token", "expected_prev_token", false},
			{"ExpectedWorkerOpsPlanID", "string", "expected_worker_ops_plan_id", true},
			{"ExpectedWorkerOpsPlanProof", "string", "expected_worker_ops_plan_proof", true},
			{"WorkerOpsPlanID", "string", "worker_ops_plan_id", true},
			{"WorkerOpsPlanProof", "string", "worker_ops_plan_proof", true},
			{"ValidatedPlanID", "string", "validated_plan_id", true},
			{"ValidatedPlanProof", "string", "validated_plan_proof", true},
			{"Files", "[]haptic.ManifestFile", "files", false},
			{"Ops", "[]haptic.Op", "ops", true},
			{"OpBatches", "[][]haptic.Op", "op_batches", true},
			{"InPlaceOps", "[]haptic.Op", "in_place_ops", true},
			{"Mode", "string", "mode", false},
		}},
		{reflect.TypeFor[Token](), []wireField{
			{"LeaderEpoch", "uint64", "leader_epoch", false},
			{"RenderSeq", "uint64", "render_seq", false},
		}},
		{reflect.TypeFor[ManifestFile](), []wireField{
			{"Path", "string", "path", false},
			{"Digest", "string", "digest", false},
			{"Proof", "string", "proof", true},
			{"Size", "int64", "size", false},
			{"Kind", "string", "kind", false},
			{"ReloadOnChange", "bool", "reload_on_change", false},
			{"Patch", "*haptic.FilePatch", "patch", true},
		}},
		{reflect.TypeFor[FilePatch](), []wireField{
			{"BaseDigest", "string", "base_digest", false},
			{"BaseSize", "int64", "base_size", false},
			{"Offset", "int64", "offset", false},
			{"Length", "int64", "length", false},
		}},
		{reflect.TypeFor[Op](), []wireField{
			{"Kind", "string", "kind", false},
			{"Backend", "string", "backend", true},
			{"Server", "string", "server", true},
			{"Profile", "string", "profile", true},
			{"Mode", "string", "mode", true},
			{"GUID", "string", "guid", true},
			{"Address", "string", "address", true},
			{"Port", "int", "port", true},
			{"Weight", "*int", "weight", true},
			{"State", "string", "state", true},
			{"Health", "bool", "health", true},
			{"Keywords", "[]haptic.KeywordArg", "keywords", true},
			{"TimeoutMs", "int", "timeout_ms", true},
			{"Path", "string", "path", true},
			{"Key", "string", "key", true},
			{"Value", "string", "value", true},
			{"Cert", "string", "cert", true},
			{"Options", "[]haptic.KeywordArg", "options", true},
			{"SNIFilters", "[]string", "sni_filters", true},
		}},
		{reflect.TypeFor[KeywordArg](), []wireField{
			{"Name", "string", "name", false},
			{"Args", "[]string", "args", true},
		}},
		{reflect.TypeFor[OpResult](), []wireField{
			{"Kind", "string", "kind", false},
			{"OK", "bool", "ok", false},
			{"Output", "string", "output", true},
		}},
		{reflect.TypeFor[HAProxyInfo](), []wireField{
			{"Version", "string", "version", false},
			{"FullVersion", "string", "full_version", false},
			{"WorkerPID", "int", "worker_pid", false},
			{"WorkerStartTimeUnixMicros", "int64", "worker_start_time_unix_micros", false},
		}},
		{reflect.TypeFor[State](), []wireField{
			{"APIVersion", "int", "api_version", false},
			{"AgentVersion", "string", "agent_version", false},
			{"PlanSchemaVersion", "int", "plan_schema_version", false},
			{"AgentOps", "[]string", "agent_ops", false},
			{"Features", "[]string", "features", true},
			{"HAProxy", "haptic.HAProxyInfo", "haproxy", false},
			{"Generation", "uint64", "generation", false},
			{"AppliedPlanID", "string", "applied_plan_id", false},
			{"AppliedPlanProof", "string", "applied_plan_proof", true},
			{"RunningPlanID", "string", "running_plan_id", false},
			{"RunningPlanProof", "string", "running_plan_proof", true},
			{"WorkerOpsPlanID", "string", "worker_ops_plan_id", false},
			{"WorkerOpsPlanProof", "string", "worker_ops_plan_proof", true},
			{"AppliedToken", "haptic.Token", "applied_token", false},
			{"LKGPlanID", "string", "lkg_plan_id", false},
			{"LKGPlanProof", "string", "lkg_plan_proof", true},
			{"AppliedPlan", "[]uint8", "applied_plan", true},
			{"AppliedPlanStored", "bool", "applied_plan_stored", false},
			{"Files", "map[string]haptic.FileAt", "files", false},
			{"Inventory", "haptic.Inventory", "runtime_inventory", false},
			{"ReloadPendingAt", "string", "reload_pending_at", true},
			{"PendingDeletes", "haptic.PendingDeletes", "pending_deletes", false},
			{"LastApply", "*haptic.ApplyResult", "last_apply", true},
			{"InvariantViolation", "string", "invariant_violation", true},
		}},
		{reflect.TypeFor[FileAt](), []wireField{
			{"Digest", "string", "digest", false},
			{"Proof", "string", "proof", true},
			{"Size", "int64", "size", false},
		}},
		{reflect.TypeFor[Inventory](), []wireField{
			{"Generation", "uint64", "generation", false},
			{"Maps", "[]string", "maps", false},
			{"Certs", "[]string", "certs", false},
			{"CAFiles", "[]string", "ca_files", false},
			{"CRLFiles", "[]string", "crl_files", false},
			{"CRTLists", "[]string", "crt_lists", false},
		}},
		{reflect.TypeFor[PendingDeletes](), []wireField{
			{"Servers", "[]string", "servers", false},
			{"Backends", "[]string", "backends", false},
		}},
		{reflect.TypeFor[ApplyResult](), []wireField{
			{"PlanID", "string", "plan_id", false},
			{"OK", "bool", "ok", false},
			{"Mode", "string", "mode", false},
			{"AppliedPlanID", "string", "applied_plan_id", false},
			{"AppliedPlanProof", "string", "applied_plan_proof", true},
			{"RunningPlanID", "string", "running_plan_id", false},
			{"RunningPlanProof", "string", "running_plan_proof", true},
			{"WorkerOpsPlanID", "string", "worker_ops_plan_id", false},
			{"WorkerOpsPlanProof", "string", "worker_ops_plan_proof", true},
			{"AppliedToken", "haptic.Token", "applied_token", false},
			{"LKGPlanID", "string", "lkg_plan_id", false},
			{"LKGPlanProof", "string", "lkg_plan_proof", true},
			{"OpResults", "[]haptic.OpResult", "op_results", true},
			{"Reload", "*haptic.ReloadInfo", "reload", true},
			{"Rollback", "*haptic.RollbackInfo", "rollback", true},
			{"Error", "*haptic.ApplyError", "error", true},
			{"HAProxy", "haptic.HAProxyInfo", "haproxy", false},
			{"Inventory", "*haptic.Inventory", "runtime_inventory", true},
			{"At", "string", "at", false},
			{"Timing", "haptic.ApplyTiming", "timing", false},
		}},
		{reflect.TypeFor[ApplyTiming](), []wireField{
			{"StageMs", "int64", "stage_ms", false},
			{"AdmitMs", "int64", "admit_ms", false},
			{"WriteMs", "int64", "write_ms", false},
			{"OpsMs", "int64", "ops_ms", false},
			{"FinishMs", "int64", "finish_ms", false},
			{"TotalMs", "int64", "total_ms", false},
		}},
		{reflect.TypeFor[ReloadInfo](), []wireField{
			{"Performed", "bool", "performed", false},
			{"OK", "bool", "ok", false},
			{"WorkerPID", "int", "worker_pid", true},
			{"TookMs", "int64", "took_ms", true},
			{"Output", "string", "output", true},
			{"ScheduledAt", "string", "scheduled_at", true},
		}},
		{reflect.TypeFor[RollbackInfo](), []wireField{
			{"Performed", "bool", "performed", false},
			{"Reloaded", "bool", "reloaded", false},
		}},
		{reflect.TypeFor[ApplyError](), []wireField{
			{"Stage", "string", "stage", false},
			{"Message", "string", "message", false},
		}},
		{reflect.TypeFor[Conflict](), []wireField{
			{"AppliedPlanID", "string", "applied_plan_id", false},
			{"AppliedPlanProof", "string", "applied_plan_proof", true},
			{"AppliedToken", "haptic.Token", "applied_token", false},
			{"RunningPlanID", "string", "running_plan_id", false},
			{"RunningPlanProof", "string", "running_plan_proof", true},
			{"WorkerOpsPlanID", "string", "worker_ops_plan_id", false},
			{"WorkerOpsPlanProof", "string", "worker_ops_plan_proof", true},
			{"LKGPlanID", "string", "lkg_plan_id", false},
			{"LKGPlanProof", "string", "lkg_plan_proof", true},
			{"Reason", "string", "reason", false},
		}},
		{reflect.TypeFor[Missing](), []wireField{
			{"Missing", "[]string", "missing", false},
		}},
		{reflect.TypeFor[PlanStored](), []wireField{
			{"PlanID", "string", "plan_id", false},
			{"Proof", "string", "proof", false},
		}},
		{reflect.TypeFor[PlanMoved](), []wireField{
			{"AppliedPlanID", "string", "applied_plan_id", false},
			{"AppliedPlanProof", "string", "applied_plan_proof", true},
		}},
		{reflect.TypeFor[DrainResult](), []wireField{
			{"Reason", "string", "reason", false},
			{"Waited", "string", "waited", false},
			{"Connections", "uint64", "connections", false},
		}},
	}
	for _, r := range rows {
		var got []wireField
		for i := range r.typ.NumField() {
			f := r.typ.Field(i)
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if opts != "" && opts != "omitempty" || string(f.Tag) != `json:"`+tag+`"` {
				t.Errorf("%s.%s: tag %q is not json:\"name\" or json:\"name,omitempty\"", r.typ, f.Name, f.Tag)
			}
			got = append(got, wireField{f.Name, f.Type.String(), name, opts == "omitempty"})
		}
		if !slices.Equal(got, r.want) {
			t.Errorf("%s fields:\n got %v\nwant %v", r.typ, got, r.want)
		}
	}
	// StateRead is never serialized: two plain flags.
	if got := declaredFields(reflect.TypeFor[StateRead]()); !slices.Equal(got, []declaredField{{"Verify", "bool", ""}, {"Plan", "bool", ""}}) {
		t.Errorf("StateRead fields: %v", got)
	}
}

// TestWireGoldenJSON decodes each fixture under testdata/wire/ strictly
// (every member known) and re-encodes it: the bytes, the agent's trailing
// newline included, must come back unchanged, which pins field order,
// omitempty and escaping of every type they carry.
func TestWireGoldenJSON(t *testing.T) {
	rows := []struct {
		file string
		into func() any
	}{
		{"manifest.json", func() any { return new(Manifest) }},
		{"state.json", func() any { return new(State) }},
		{"apply_ack.json", func() any { return new(ApplyResult) }},
		{"apply_nack.json", func() any { return new(ApplyResult) }},
		{"conflict.json", func() any { return new(Conflict) }},
		{"missing.json", func() any { return new(Missing) }},
	}
	decoded := map[string]any{}
	for _, r := range rows {
		golden, err := os.ReadFile(filepath.Join("testdata", "wire", r.file))
		if err != nil {
			t.Fatal(err)
		}
		v := r.into()
		d := json.NewDecoder(bytes.NewReader(golden))
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			t.Fatalf("%s: %v", r.file, err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if again = append(again, '\n'); !bytes.Equal(again, golden) {
			t.Errorf("%s does not re-encode byte for byte:\n got %s\nwant %s", r.file, again, golden)
		}
		decoded[r.file] = v
	}
	// The fixtures say what their names claim.
	m := decoded["manifest.json"].(*Manifest)
	if len(m.OpBatches) == 0 || m.Files[1].Patch == nil || m.ValidateOpBatches() != nil {
		t.Error("manifest.json: want valid op_batches and a patch")
	}
	s := decoded["state.json"].(*State)
	plan, err := DecodePlanBlob(s.AppliedPlan)
	if err != nil || plan.ID != s.AppliedPlanID || !s.HoldsAppliedPlan() {
		t.Errorf("state.json: applied_plan does not hold the applied plan %s: %v", s.AppliedPlanID, err)
	}
	if ack := decoded["apply_ack.json"].(*ApplyResult); !ack.OK || ack.Mode != ResultRuntime {
		t.Error("apply_ack.json is not an ACK")
	}
	if nack := decoded["apply_nack.json"].(*ApplyResult); nack.OK || nack.Mode != ResultRejected || nack.Error == nil {
		t.Error("apply_nack.json is not a NACK")
	}
	if c := decoded["conflict.json"].(*Conflict); c.Reason != ReasonStaleEpoch {
		t.Error("conflict.json has no conflict reason")
	}
}

func TestWireZeroValues(t *testing.T) {
	const token = `{"leader_epoch":0,"render_seq":0}`
	const haproxy = `{"version":"","full_version":"","worker_pid":0,"worker_start_time_unix_micros":0}`
	const inventory = `{"generation":0,"maps":null,"certs":null,"ca_files":null,"crl_files":null,"crt_lists":null}`
	const timing = `{"stage_ms":0,"admit_ms":0,"write_ms":0,"ops_ms":0,"finish_ms":0,"total_ms":0}`
	rows := []struct {
		name string
		v    any
		want string
	}{
		{"Op weight 0", Op{Kind: OpServerSetWeight, Weight: weightOf(0)}, `{"kind":"server_set_weight","weight":0}`},
		{"Op", Op{}, `{"kind":""}`},
		{"Token", Token{}, token},
		{"Inventory", Inventory{}, inventory},
		{"Manifest", Manifest{}, `{"plan_id":"","plan_schema_version":0,"token":` + token + `,"expected_prev_plan_id":"","expected_prev_token":` + token + `,"files":null,"mode":""}`},
		{"ManifestFile", ManifestFile{}, `{"path":"","digest":"","size":0,"kind":"","reload_on_change":false}`},
		{"FilePatch", FilePatch{}, `{"base_digest":"","base_size":0,"offset":0,"length":0}`},
		{"KeywordArg", KeywordArg{}, `{"name":""}`},
		{"OpResult", OpResult{}, `{"kind":"","ok":false}`},
		{"HAProxyInfo", HAProxyInfo{}, haproxy},
		{"State", State{}, `{"api_version":0,"agent_version":"","plan_schema_version":0,"agent_ops":null,"haproxy":` + haproxy +
			`,"generation":0,"applied_plan_id":"","running_plan_id":"","worker_ops_plan_id":"","applied_token":` + token +
			`,"lkg_plan_id":"","applied_plan_stored":false,"files":null,"runtime_inventory":` + inventory +
			`,"pending_deletes":{"servers":null,"backends":null}}`},
		{"FileAt", FileAt{}, `{"digest":"","size":0}`},
		{"PendingDeletes", PendingDeletes{}, `{"servers":null,"backends":null}`},
		{"ApplyResult", ApplyResult{}, `{"plan_id":"","ok":false,"mode":"","applied_plan_id":"","running_plan_id":"","worker_ops_plan_id":"","applied_token":` + token +
			`,"lkg_plan_id":"","haproxy":` + haproxy + `,"at":"","timing":` + timing + `}`},
		{"ApplyTiming", ApplyTiming{}, timing},
		{"ReloadInfo", ReloadInfo{}, `{"performed":false,"ok":false}`},
		{"RollbackInfo", RollbackInfo{}, `{"performed":false,"reloaded":false}`},
		{"ApplyError", ApplyError{}, `{"stage":"","message":""}`},
		{"Conflict", Conflict{}, `{"applied_plan_id":"","applied_token":` + token + `,"running_plan_id":"","worker_ops_plan_id":"","lkg_plan_id":"","reason":""}`},
		{"Missing", Missing{}, `{"missing":null}`},
		{"PlanStored", PlanStored{}, `{"plan_id":"","proof":""}`},
		{"PlanMoved", PlanMoved{}, `{"applied_plan_id":""}`},
		{"DrainResult", DrainResult{}, `{"reason":"","waited":"","connections":0}`},
		{"State applied_plan base64", State{AppliedPlan: []byte{0xff, 0xfe, 0xfd}}, `"applied_plan":"//79"`},
	}
	for _, r := range rows {
		got, err := json.Marshal(r.v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(got, []byte(r.want)) || (r.want[0] == '{' && string(got) != r.want) {
			t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
		}
	}
}

func TestUnknownFieldsAreIgnored(t *testing.T) {
	var s State
	if err := json.Unmarshal([]byte(`{"api_version":1,"a_future_field":{"x":[1,2]},"generation":3}`), &s); err != nil || s.Generation != 3 {
		t.Errorf("State with an unknown field: %v (generation %d)", err, s.Generation)
	}
	var r ApplyResult
	if err := json.Unmarshal([]byte(`{"plan_id":"p","ok":true,"future":"x","timing":{"total_ms":5,"new_stage_ms":1}}`), &r); err != nil || !r.OK || r.Timing.TotalMs != 5 {
		t.Errorf("ApplyResult with unknown fields: %v (%+v)", err, r)
	}
}

func TestConstants(t *testing.T) {
	rows := []struct{ got, want string }{
		{ModeAuto, "auto"}, {ModeReload, "reload"}, {ModeRevertLKG, "revert_lkg"},
		{ResultRuntime, "runtime"}, {ResultFileOnly, "file_only"}, {ResultReload, "reload"},
		{ResultScheduled, "scheduled"}, {ResultNoop, "noop"}, {ResultRejected, "rejected"},
		{FeatureFilePatch, "file_patch"}, {FeatureWorkerFence, "worker_fence"}, {FeatureRuntimeBatches, "runtime_batches"},
		{ReasonStaleEpoch, "stale_epoch"}, {ReasonRevertTargetMismatch, "revert_target_mismatch"},
		{ReasonPrevMismatch, "prev_mismatch"}, {ReasonUnknownBaseline, "unknown_baseline"},
		{ReasonWorkerOpsMismatch, "worker_ops_mismatch"},
		{FileKindConfig, "config"}, {FileKindMap, "map"}, {FileKindCert, "cert"}, {FileKindCA, "ca"},
		{FileKindCRTList, "crtlist"}, {FileKindGeneral, "general"},
		{PathState, "/v1/state"}, {PathApply, "/v1/apply"}, {PathPlan, "/v1/plan"},
		{PathHealthz, "/healthz"}, {PathReadyz, "/readyz"}, {PathDrain, "/drain"},
		{PartManifest, "manifest"}, {PartPlan, "plan"},
		{StageStartup, "startup"}, {StageRequest, "request"}, {StageManifest, "manifest"}, {StageParts, "parts"},
		{StageLKG, "lkg"}, {StageIdentity, "identity"}, {StageState, "state"}, {StagePlan, "plan"},
		{StageInPlace, "in_place"}, {StageBackup, "backup"}, {StageWrite, "write"}, {StageReload, "reload"},
		{StageRevert, "revert"}, {StageRevertReload, "revert_reload"}, {StageScheduledReload, "scheduled_reload"},
		{ServerStateReady, "ready"}, {ServerStateMaint, "maint"}, {ServerStateDrain, "drain"},
		{DrainReasonQuiet, "quiet"}, {DrainReasonBound, "bound"}, {DrainReasonUnavailable, "unavailable"},
		{DrainReasonCancelled, "cancelled"},
	}
	for _, r := range rows {
		if r.got != r.want {
			t.Errorf("constant is %q, want %q", r.got, r.want)
		}
	}
	if APIVersion != 1 || ExactIdentityVersion != 1 {
		t.Errorf("APIVersion, ExactIdentityVersion = %d, %d; want 1, 1", APIVersion, ExactIdentityVersion)
	}
}

// wireOpKindsInOrder is every op kind the wire carries, in the order of
// the constants.
var wireOpKindsInOrder = []string{
	"backend_add", "backend_publish", "backend_unpublish", "backend_del", "wait_be_removable",
	"server_add", "server_enable", "server_disable", "server_set_addr", "server_set_weight",
	"server_set_state", "wait_srv_removable", "shutdown_sessions", "server_del",
	"map_add", "map_set", "map_del", "map_replace", "cert_set", "cert_new", "ca_set", "ca_new",
	"crtlist_add", "crtlist_del",
}

func TestOpKinds(t *testing.T) {
	got := []string{OpBackendAdd, OpBackendPublish, OpBackendUnpublish, OpBackendDel, OpBackendWaitRemovable,
		OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight,
		OpServerSetState, OpServerWaitRemovable, OpShutdownSessions, OpServerDel,
		OpMapAdd, OpMapSet, OpMapDel, OpMapReplace, OpCertSet, OpCertNew, OpCASet, OpCANew,
		OpCRTListAdd, OpCRTListDel}
	if !slices.Equal(got, wireOpKindsInOrder) {
		t.Errorf("op kinds:\n got %v\nwant %v", got, wireOpKindsInOrder)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(got)))) != 24 {
		t.Error("op kinds are not 24 distinct strings")
	}
	// The declaration order is the advertised order: read it from the source.
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "haptic.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, decl := range file.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			for i, name := range spec.(*ast.ValueSpec).Names {
				if !strings.HasPrefix(name.Name, "Op") {
					continue
				}
				lit, ok := spec.(*ast.ValueSpec).Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a string literal", name.Name)
				}
				v, _ := strconv.Unquote(lit.Value)
				declared = append(declared, v)
			}
		}
	}
	if !slices.Equal(declared, wireOpKindsInOrder) {
		t.Errorf("Op* declarations in haptic.go, in order:\n got %v\nwant %v", declared, wireOpKindsInOrder)
	}
}

func TestLimits(t *testing.T) {
	rows := []struct {
		name      string
		got, want int
	}{
		{"MaxApplyBodyBytes", MaxApplyBodyBytes, 67108864},
		{"MaxFiles", MaxFiles, 4096},
		{"MaxPlanBlobBytes", MaxPlanBlobBytes, 8388608},
		{"MaxPlanJSONBytes", MaxPlanJSONBytes, 67108864},
		{"MaxPathBytes", MaxPathBytes, 255},
		{"MaxOpsPerApply", MaxOpsPerApply, 1000},
		{"MaxOpBatches", MaxOpBatches, 8},
		{"MaxCommandLineBytes", MaxCommandLineBytes, 12288},
		{"MaxPayloadBytes", MaxPayloadBytes, 12288},
		{"MaxWaitBudgetMs", MaxWaitBudgetMs, 30000},
		{"MaxReloadMs", MaxReloadMs, 60000},
		{"MaxReloadIntervalMs", MaxReloadIntervalMs, 60000},
		{"MaxPendingServerDeletes", MaxPendingServerDeletes, 1000},
		{"MaxPendingBackendDeletes", MaxPendingBackendDeletes, 100},
		{"MaxSections", MaxSections, 65536},
		{"MaxMapDelRepeat", MaxMapDelRepeat, 64},
		{"MaxDeferredAttempts", MaxDeferredAttempts, 5},
		{"MaxInventoryEntries", MaxInventoryEntries, 4096},
		{"MaxMapEntries", MaxMapEntries, 262144},
		{"ConnectRetries", ConnectRetries, 3},
		{"ConnectRetryBackoffMs", ConnectRetryBackoffMs, 100},
	}
	for _, r := range rows {
		if r.got != r.want {
			t.Errorf("%s = %d, want %d", r.name, r.got, r.want)
		}
	}
}
