// This file owns the wire contract: every constant, limit and JSON type that
// travels between a controller and an agent, the token grammar both ends
// assert, and the op-batch rules. It must never do I/O: the types here are
// shared by the agent, the client and Diff, and a change to any JSON name or
// field order is a change of the contract.

package haptic

import (
	"fmt"
	"strings"
)

// Versions.
const (
	// APIVersion is the agent API major version, reported in State.APIVersion.
	APIVersion = 1
	// ExactIdentityVersion is the role-proof protocol version. A manifest
	// whose identity_version is anything else is legacy: the agent forces
	// mode reload and drops everything that needs exact identity.
	ExactIdentityVersion = 1
)

// Endpoint paths and multipart part names.
const (
	PathState   = "/v1/state"
	PathApply   = "/v1/apply"
	PathPlan    = "/v1/plan"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathDrain   = "/drain" // served only on the drain unix socket

	PartManifest = "manifest" // form name of the manifest part, always first
	PartPlan     = "plan"     // form name (and filename) of the plan-blob part
)

// File kinds (ManifestFile.Kind and PlanFile.Kind).
const (
	FileKindConfig  = "config"
	FileKindMap     = "map"
	FileKindCert    = "cert"
	FileKindCA      = "ca"
	FileKindCRTList = "crtlist"
	FileKindGeneral = "general"
)

// A verdict, a mode and a result mode are three words for three moments:
// what a change needs (Diff's prediction, [Verdict]), what a manifest asks
// of the agent ([Mode]), and what happened ([ResultMode]). The wire fixes
// their JSON values, so the sets overlap, and a result can differ from the
// verdict: file_only lands as noop when the disk already holds the files,
// runtime lands as reload when HAProxy refuses an op or the worker changed,
// any apply lands as scheduled while a reload is pending (a reload too,
// inside the pacing window), and rejected is a NACK after a rollback. The
// types are names of string: the fields that carry them are strings on
// the wire and in Go.

// Mode is what a manifest asks of the agent (Manifest.Mode, and
// Decision.Mode, which NewManifest copies): auto or reload; revert_lkg
// only from a caller of its own. NewManifest asks for reload whatever the
// verdict when the pod reports no proofs to fence on, and the agent turns
// an auto apply into a reload when it names no worker-ops proof.
type Mode = string

// Apply modes.
const (
	ModeAuto      Mode = "auto"       // run the ops when the baseline matches; the agent decides
	ModeReload    Mode = "reload"     // write the files and reload; ops are not run
	ModeRevertLKG Mode = "revert_lkg" // restore the last-known-good set and reload
)

// ResultMode is what an apply did (ApplyResult.Mode); `haptic push` prints
// it, or failed for an error or a NACK.
type ResultMode = string

// Result modes.
const (
	ResultRuntime   ResultMode = "runtime"   // files written, runtime ops executed, no reload
	ResultFileOnly  ResultMode = "file_only" // files written, nothing to run, no reload
	ResultReload    ResultMode = "reload"    // files written and HAProxy reloaded
	ResultScheduled ResultMode = "scheduled" // files written, a reload is queued for the end of the pacing window
	ResultNoop      ResultMode = "noop"      // nothing changed on disk, nothing ran
	ResultRejected  ResultMode = "rejected"  // NACK: the apply failed and was rolled back
)

// Features the agent accepts in addition to its op kinds, in the order the
// agent advertises them.
const (
	FeatureFilePatch      = "file_patch"      // ManifestFile.Patch
	FeatureWorkerFence    = "worker_fence"    // the worker_ops_mismatch fence
	FeatureRuntimeBatches = "runtime_batches" // Manifest.OpBatches
	FeaturePlanPatch      = "plan_patch"      // PlanPatch as the plan part and the PUT /v1/plan body
)

// Reason is why the fence refused a manifest (Conflict.Reason); Manifest
// lists the rules in the order the agent checks them.
type Reason = string

// Conflict reasons.
const (
	ReasonStaleEpoch           Reason = "stale_epoch"
	ReasonRevertTargetMismatch Reason = "revert_target_mismatch"
	ReasonPrevMismatch         Reason = "prev_mismatch"
	ReasonUnknownBaseline      Reason = "unknown_baseline"
	ReasonWorkerOpsMismatch    Reason = "worker_ops_mismatch"
)

// Server states for server_set_state.
const (
	ServerStateReady = "ready"
	ServerStateMaint = "maint"
	ServerStateDrain = "drain"
)

// Stage is where an apply, an upload or a read failed (ApplyError.Stage).
// The first group is answered as an HTTP error body, the second travels
// inside an ApplyResult.
type Stage = string

// Stages.
const (
	StageStartup  Stage = "startup"
	StageRequest  Stage = "request"
	StageManifest Stage = "manifest"
	StageParts    Stage = "parts"
	StageLKG      Stage = "lkg"
	StageIdentity Stage = "identity"
	StageState    Stage = "state"
	StagePlan     Stage = "plan"

	StageInPlace         Stage = "in_place"
	StageBackup          Stage = "backup"
	StageWrite           Stage = "write"
	StageReload          Stage = "reload"
	StageRevert          Stage = "revert"
	StageRevertReload    Stage = "revert_reload"
	StageScheduledReload Stage = "scheduled_reload"
)

// Drain outcomes (DrainResult.Reason).
const (
	DrainReasonQuiet       = "quiet"
	DrainReasonBound       = "bound"
	DrainReasonUnavailable = "unavailable"
	DrainReasonCancelled   = "cancelled"
)

// Op kinds. The order of these declarations is the order the agent
// advertises them in State.AgentOps.
const (
	OpBackendAdd           = "backend_add"
	OpBackendPublish       = "backend_publish"
	OpBackendUnpublish     = "backend_unpublish"
	OpBackendDel           = "backend_del"
	OpBackendWaitRemovable = "wait_be_removable"
	OpServerAdd            = "server_add"
	OpServerEnable         = "server_enable"
	OpServerDisable        = "server_disable"
	OpServerSetAddr        = "server_set_addr"
	OpServerSetWeight      = "server_set_weight"
	OpServerSetState       = "server_set_state"
	OpServerWaitRemovable  = "wait_srv_removable"
	OpShutdownSessions     = "shutdown_sessions"
	OpServerDel            = "server_del"
	OpMapAdd               = "map_add"
	OpMapSet               = "map_set"
	OpMapDel               = "map_del"
	OpMapReplace           = "map_replace"
	OpCertSet              = "cert_set"
	OpCertNew              = "cert_new"
	OpCASet                = "ca_set"
	OpCANew                = "ca_new"
	OpCRTListAdd           = "crtlist_add"
	OpCRTListDel           = "crtlist_del"
)

// opKinds is the one list of op kinds, in the order of the constants above:
// the agent advertises it whole as State.AgentOps and ComposedOps derives
// Diff's kinds from it, so neither can drift from the other.
var opKinds = [...]string{
	OpBackendAdd, OpBackendPublish, OpBackendUnpublish, OpBackendDel, OpBackendWaitRemovable,
	OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight,
	OpServerSetState, OpServerWaitRemovable, OpShutdownSessions, OpServerDel,
	OpMapAdd, OpMapSet, OpMapDel, OpMapReplace,
	OpCertSet, OpCertNew, OpCASet, OpCANew, OpCRTListAdd, OpCRTListDel,
}

// Limits. Every agent loop is bounded by one of these or by a counted
// collection. Both ends assert the limits of what travels (a client
// refuses to send what the agent would refuse); the agent alone enforces
// its own loops' bounds.
const (
	MaxApplyBodyBytes        = 64 << 20 // one apply request body; one response body read by the client
	MaxFiles                 = 4096     // files per manifest; file parts per apply
	MaxPlanBlobBytes         = 8 << 20  // the plan blob; also the manifest part
	MaxPlanJSONBytes         = 64 << 20 // the plan JSON inside one plan blob
	MaxPlanSplices           = 256      // splices in one PlanPatch
	MaxPathBytes             = 255      // bytes in one file path
	MaxOpsPerApply           = 1000     // ops per batch; the first batch is ops plus in_place_ops
	MaxOpBatches             = 8        // batches per apply, counting the first
	MaxCommandLineBytes      = 12 << 10 // one ';'-joined runtime command line (tune.bufsize is 16 KiB)
	MaxPayloadBytes          = 12 << 10 // one payload ('<<') command
	MaxWaitBudgetMs          = 30000    // one wait op's timeout_ms, and one command line's total wait
	MaxReloadMs              = 60000    // one reload: the default and the largest --reload-timeout
	MaxReloadIntervalMs      = 60000    // upper bound of --reload-interval-min
	MaxPendingServerDeletes  = 1000     // deferred server deletes per pod
	MaxPendingBackendDeletes = 100      // deferred backend deletes per pod
	MaxSections              = 65536    // sections in one render
	MaxMapDelRepeat          = 64       // del map calls for one key (3.4 deletes one duplicate per call)
	MaxDeferredAttempts      = 5        // attempts per queued delete before the agent gives up
	MaxInventoryEntries      = 4096     // entries in one runtime listing
	MaxMapEntries            = 1 << 18  // entries in one map
	ConnectRetries           = 3        // default ClientConfig.ConnectRetries
	ConnectRetryBackoffMs    = 100      // default ClientConfig.ConnectRetryBackoff, in milliseconds
)

// Manifest is the first part of every apply: the complete desired file set,
// the fencing token and baseline the controller composed against, and the
// runtime ops to run when that baseline holds. NewManifest builds it from a
// Decision. Its JSON names are snake_case like every wire type's, while the
// plan's are camelCase (Plan): both are the upstream contract, and neither
// may be tidied to match the other.
//
// The agent first turns a legacy manifest, or an auto one that names no
// worker-ops proof and has no in-place ops, into a reload without ops. It
// then fences it before reading any part: the first of these rules that
// matches refuses the apply with a 409 Conflict of that Reason, and nothing
// is written.
//
//  1. stale_epoch: Token.LeaderEpoch is below the applied token's epoch.
//  2. revert_target_mismatch: a revert_lkg whose PlanID and PlanProof are
//     neither the applied nor the worker-ops pair, or are the running pair.
//     A revert is checked against nothing else.
//  3. ExpectedPrevPlanID is not the applied plan id: unknown_baseline when
//     the agent has none, prev_mismatch otherwise.
//  4. prev_mismatch: ExpectedPrevToken is not the applied token.
//  5. prev_mismatch: an exact auto manifest's ExpectedPrevPlanProof is empty
//     or not the applied proof.
//  6. prev_mismatch: an exact reload's ExpectedPrevPlanProof is not the
//     applied proof, when the agent holds one.
//  7. worker_ops_mismatch: an auto manifest, or in-place ops that will run,
//     whose ExpectedWorkerOpsPlanID and ExpectedWorkerOpsPlanProof are not
//     the agent's worker-ops pair.
type Manifest struct {
	// IdentityVersion is ExactIdentityVersion; anything else is legacy.
	IdentityVersion int `json:"identity_version,omitempty"`
	// PlanID is the desired plan's id; a revert_lkg names the plan it refuses.
	PlanID string `json:"plan_id"`
	// PlanProof is, for a revert_lkg only, the refused plan's proof.
	PlanProof string `json:"plan_proof,omitempty"`
	// PlanSchemaVersion is the plan's SchemaVersion, reported back in State.
	PlanSchemaVersion int `json:"plan_schema_version"`
	// Token fences this apply; it becomes the applied token when it lands.
	Token Token `json:"token"`
	// ExpectedPrevPlanID is the applied plan id it was composed against.
	ExpectedPrevPlanID string `json:"expected_prev_plan_id"`
	// ExpectedPrevPlanProof is that plan's proof.
	ExpectedPrevPlanProof string `json:"expected_prev_plan_proof,omitempty"`
	// ExpectedPrevToken is the applied token it was composed against.
	ExpectedPrevToken Token `json:"expected_prev_token"`
	// ExpectedWorkerOpsPlanID is the worker-ops plan id it was composed against.
	ExpectedWorkerOpsPlanID string `json:"expected_worker_ops_plan_id,omitempty"`
	// ExpectedWorkerOpsPlanProof is that plan's proof; without it no op runs.
	ExpectedWorkerOpsPlanProof string `json:"expected_worker_ops_plan_proof,omitempty"`
	// WorkerOpsPlanID names what the worker holds once InPlaceOps ran
	// (Decision.WorkerPlan.ID), not the render; required with them.
	WorkerOpsPlanID string `json:"worker_ops_plan_id,omitempty"`
	// WorkerOpsPlanProof is ignored: the agent issues the worker proof.
	WorkerOpsPlanProof string `json:"worker_ops_plan_proof,omitempty"`
	// ValidatedPlanID is the newest plan the caller's haproxy -c passed.
	ValidatedPlanID string `json:"validated_plan_id,omitempty"`
	// ValidatedPlanProof is its proof, set with the id or not at all.
	ValidatedPlanProof string `json:"validated_plan_proof,omitempty"`
	// Files is the complete desired set, the config file included: a path
	// the agent owns and Files lacks is deleted.
	Files []ManifestFile `json:"files"`
	// Ops is the first runtime batch, run only in mode auto.
	Ops []Op `json:"ops,omitempty"`
	// OpBatches are the batches run after Ops, for runtime_batches agents.
	OpBatches [][]Op `json:"op_batches,omitempty"`
	// InPlaceOps run on the serving worker while a reload waits.
	InPlaceOps []Op `json:"in_place_ops,omitempty"`
	// Mode is ModeAuto, ModeReload or ModeRevertLKG.
	Mode string `json:"mode"`
}

// Token is the fencing token of an apply. Tokens are compared by equality of
// both fields; only the epoch is ordered (stale_epoch).
type Token struct {
	LeaderEpoch uint64 `json:"leader_epoch"` // the controller's leadership epoch, raised when it becomes leader
	RenderSeq   uint64 `json:"render_seq"`   // counts the leader's renders within its epoch
}

// ManifestFile is one desired file. The agent treats a file as held (no part
// needed) only when its record has the same non-empty proof, digest and size.
type ManifestFile struct {
	Path           string     `json:"path"`             // base-relative and clean, at most MaxPathBytes, no dot-name
	Digest         string     `json:"digest"`           // Digest of the whole content; required
	Proof          string     `json:"proof,omitempty"`  // the controller's witness: ManifestFiles uses the digest
	Size           int64      `json:"size"`             // bytes of the whole file
	Kind           string     `json:"kind"`             // a FileKind* value
	ReloadOnChange bool       `json:"reload_on_change"` // a change to this file needs a reload
	Patch          *FilePatch `json:"patch,omitempty"`  // send a splice of the held copy (file_patch agents)
}

// FilePatch delivers a file as a splice of the held copy: the new content is
// base[:Offset] + part + base[Offset+Length:], and the part carries
// Size − BaseSize + Length bytes.
type FilePatch struct {
	BaseDigest string `json:"base_digest"` // the held copy's digest; another one makes the agent ask for the whole file
	BaseSize   int64  `json:"base_size"`   // the held copy's size
	Offset     int64  `json:"offset"`      // start of the replaced range in the base
	Length     int64  `json:"length"`      // bytes of the base replaced; Offset+Length <= BaseSize
}

// PlanPatch delivers a plan as splices of the canonical JSON (Plan.Canonical,
// the bytes its id is the digest of) of the plan the agent holds: an agent
// that advertises FeaturePlanPatch takes it, as JSON with Content-Type
// application/json, wherever it takes a plan blob (the apply's plan part,
// the PUT /v1/plan body). The new canonical JSON is the base with each
// splice's range replaced by its data, and the agent keeps it only when it
// hashes to the plan id the apply or the upload names. A base the agent
// does not hold (its stored plan is another, or none) is a 409 Missing that
// lists "plan": the controller then sends the whole blob.
type PlanPatch struct {
	BaseDigest string       `json:"base_digest"` // the held plan's id, the digest of its canonical JSON
	BaseSize   int64        `json:"base_size"`   // the length of that JSON
	Splices    []PlanSplice `json:"splices"`     // in ascending order, not overlapping; at most MaxPlanSplices
}

// PlanSplice replaces Length bytes of the base at Offset with Data, in the
// way FilePatch replaces a range of a file.
type PlanSplice struct {
	Offset int64  `json:"offset"` // start of the replaced range in the base
	Length int64  `json:"length"` // bytes of the base replaced; Offset+Length <= BaseSize
	Data   []byte `json:"data"`   // the replacement bytes (base64 in JSON)
}

// Op is one typed runtime command. Fields a kind does not use stay at their
// zero value; the agent compiles each kind into HAProxy runtime commands
// (compileOp in agent_runtime_compile.go).
type Op struct {
	Kind       string       `json:"kind"`                  // an Op* value
	Backend    string       `json:"backend,omitempty"`     // backend and server ops
	Server     string       `json:"server,omitempty"`      // server ops
	Profile    string       `json:"profile,omitempty"`     // backend_add: the defaults section it inherits
	Mode       string       `json:"mode,omitempty"`        // backend_add: http or tcp
	GUID       string       `json:"guid,omitempty"`        // backend_add: the backend's guid
	Address    string       `json:"address,omitempty"`     // server_add, server_set_addr
	Port       int          `json:"port,omitempty"`        // server_add, server_set_addr
	Weight     *int         `json:"weight,omitempty"`      // server_set_weight; a pointer, so that 0 travels
	State      string       `json:"state,omitempty"`       // server_set_state: a ServerState* value
	Health     bool         `json:"health,omitempty"`      // server_enable: enable health checks too
	Keywords   []KeywordArg `json:"keywords,omitempty"`    // server_add: the server line's keywords
	TimeoutMs  int          `json:"timeout_ms,omitempty"`  // wait ops, at most MaxWaitBudgetMs
	Path       string       `json:"path,omitempty"`        // map, cert, ca and crt-list ops: the file, base-relative
	Key        string       `json:"key,omitempty"`         // map_add, map_set, map_del
	Value      string       `json:"value,omitempty"`       // map_add (SafePayloadValue), map_set (SafeToken)
	Cert       string       `json:"cert,omitempty"`        // crt-list ops: the line's certificate
	Options    []KeywordArg `json:"options,omitempty"`     // crtlist_add: the line's ssl options
	SNIFilters []string     `json:"sni_filters,omitempty"` // crtlist_add: the line's SNI filters
}

// KeywordArg is one HAProxy keyword with its arguments, carried as data so
// that no consumer has to scan a line. It is part of the plan encoding too,
// so it has exactly these two fields in this order.
type KeywordArg struct {
	Name string   `json:"name"`           // the keyword, as HAProxy spells it
	Args []string `json:"args,omitempty"` // its arguments, in order
}

// OpResult is one executed op's verdict, in execution order.
type OpResult struct {
	Kind   string `json:"kind"`             // the op's kind
	OK     bool   `json:"ok"`               // HAProxy accepted every command of the op
	Output string `json:"output,omitempty"` // HAProxy's answer, when it said anything
}

// HAProxyInfo identifies the running worker. The PID and the start time
// together name one worker process; the start time catches a PID reused
// after a container restart.
type HAProxyInfo struct {
	Version                   string `json:"version"`                       // show info's Version, read by CapsFor ("3.0.11")
	FullVersion               string `json:"full_version"`                  // the same line: show info has no longer form
	WorkerPID                 int    `json:"worker_pid"`                    // the worker's process id
	WorkerStartTimeUnixMicros int64  `json:"worker_start_time_unix_micros"` // when the worker started
}

// State is the answer of GET /v1/state: the agent's four plan pairs and
// token, the files it holds and what the running worker loaded. A
// controller builds its Baseline from it (BaselineFromState) and quotes its
// pairs back in the next Manifest (NewManifest).
type State struct {
	// APIVersion is APIVersion; CheckSkew refuses another major.
	APIVersion int `json:"api_version"`
	// AgentVersion is AgentConfig.AgentVersion, "dev" by default.
	AgentVersion string `json:"agent_version"`
	// PlanSchemaVersion is the applied manifest's PlanSchemaVersion.
	PlanSchemaVersion int `json:"plan_schema_version"`
	// AgentOps are the op kinds the agent executes, in Op* order (CapsFor).
	AgentOps []string `json:"agent_ops"`
	// Features are the Feature* values the agent accepts.
	Features []string `json:"features,omitempty"`
	// HAProxy is the worker the agent last checked; verify=1 checks it now.
	HAProxy HAProxyInfo `json:"haproxy"`
	// Generation rises by one with every apply that lands.
	Generation uint64 `json:"generation"`
	// AppliedPlanID is the plan whose files are on disk; "" is no baseline.
	AppliedPlanID string `json:"applied_plan_id"`
	// AppliedPlanProof is the applied plan's proof.
	AppliedPlanProof string `json:"applied_plan_proof,omitempty"`
	// RunningPlanID is the plan the running worker loaded at its last reload.
	RunningPlanID string `json:"running_plan_id"`
	// RunningPlanProof is the running plan's proof.
	RunningPlanProof string `json:"running_plan_proof,omitempty"`
	// WorkerOpsPlanID is what the worker holds counting the ops since then.
	WorkerOpsPlanID string `json:"worker_ops_plan_id"`
	// WorkerOpsPlanProof is the worker-ops plan's proof.
	WorkerOpsPlanProof string `json:"worker_ops_plan_proof,omitempty"`
	// AppliedToken is the token of the apply that landed last.
	AppliedToken Token `json:"applied_token"`
	// LKGPlanID is the last-known-good plan, restored when HAProxy refuses.
	LKGPlanID string `json:"lkg_plan_id"`
	// LKGPlanProof is the last-known-good plan's proof.
	LKGPlanProof string `json:"lkg_plan_proof,omitempty"`
	// AppliedPlan is the applied plan's blob, byte for byte as the
	// controller sent it; left out when the read passed plan=0.
	AppliedPlan []byte `json:"applied_plan,omitempty"`
	// AppliedPlanStored reports that the agent holds that blob.
	AppliedPlanStored bool `json:"applied_plan_stored"`
	// Files are the held files by path; a part whose proof matches is not sent.
	Files map[string]FileAt `json:"files"`
	// Inventory is what the worker loaded; an op changes only a loaded object.
	Inventory Inventory `json:"runtime_inventory"`
	// ReloadPendingAt is a scheduled reload's due time (RFC 3339 ns, UTC).
	ReloadPendingAt string `json:"reload_pending_at,omitempty"`
	// PendingDeletes are the deferred deletes still queued.
	PendingDeletes PendingDeletes `json:"pending_deletes"`
	// LastApply is the latest apply's result, or a paced reload's.
	LastApply *ApplyResult `json:"last_apply,omitempty"`
	// InvariantViolation names the invariant that failed last; the agent
	// never stops over one, so this is where it shows.
	InvariantViolation string `json:"invariant_violation,omitempty"`
}

// FileAt is one held file as the agent last observed it.
type FileAt struct {
	Digest string `json:"digest"`          // Digest of the file's bytes
	Proof  string `json:"proof,omitempty"` // the proof its manifest entry quoted; "" once the file changed behind the agent
	Size   int64  `json:"size"`            // bytes
}

// Inventory is what the running worker has loaded, as base-relative paths,
// read after each reload and each new worker. Diff reads the lists as sets.
type Inventory struct {
	Generation uint64   `json:"generation"` // rises when the lists change; Diff ignores it
	Maps       []string `json:"maps"`       // show map
	Certs      []string `json:"certs"`      // show ssl cert
	CAFiles    []string `json:"ca_files"`   // show ssl ca-file
	CRLFiles   []string `json:"crl_files"`  // show ssl crl-file
	CRTLists   []string `json:"crt_lists"`  // show ssl crt-list; snake_case as on all the wire (the plan says crtLists)
}

// PendingDeletes lists the deferred deletes queued on the pod.
type PendingDeletes struct {
	Servers  []string `json:"servers"`  // each "backend/server"
	Backends []string `json:"backends"` // unpublished backends waiting for deletion
}

// ApplyResult is the 200 answer to an apply: an ACK (OK) or a NACK. Its
// pairs and token are the agent's state once the apply ended, which the
// next manifest must expect.
type ApplyResult struct {
	// PlanID is the manifest's plan id.
	PlanID string `json:"plan_id"`
	// OK is false for a NACK: the apply failed, Error says where.
	OK bool `json:"ok"`
	// Mode is what happened, a Result* value (the package doc's table).
	Mode string `json:"mode"`
	// AppliedPlanID is the applied plan id after the apply, as in State.
	AppliedPlanID string `json:"applied_plan_id"`
	// AppliedPlanProof is the applied proof the agent issued.
	AppliedPlanProof string `json:"applied_plan_proof,omitempty"`
	// RunningPlanID is the running plan id after the apply.
	RunningPlanID string `json:"running_plan_id"`
	// RunningPlanProof is the running plan's proof.
	RunningPlanProof string `json:"running_plan_proof,omitempty"`
	// WorkerOpsPlanID is the worker-ops plan id after the apply.
	WorkerOpsPlanID string `json:"worker_ops_plan_id"`
	// WorkerOpsPlanProof is the worker-ops plan's proof.
	WorkerOpsPlanProof string `json:"worker_ops_plan_proof,omitempty"`
	// AppliedToken is the applied token after the apply.
	AppliedToken Token `json:"applied_token"`
	// LKGPlanID is the last-known-good plan id after the apply.
	LKGPlanID string `json:"lkg_plan_id"`
	// LKGPlanProof is the last-known-good plan's proof.
	LKGPlanProof string `json:"lkg_plan_proof,omitempty"`
	// OpResults are the executed ops' verdicts, in execution order.
	OpResults []OpResult `json:"op_results,omitempty"`
	// Reload is the reload that ran or was scheduled, if any.
	Reload *ReloadInfo `json:"reload,omitempty"`
	// Rollback is set on a NACK and a revert: what was put back.
	Rollback *RollbackInfo `json:"rollback,omitempty"`
	// Error says where a NACK failed, or where in-place ops failed in an ACK.
	Error *ApplyError `json:"error,omitempty"`
	// HAProxy is the worker the agent expects after the apply.
	HAProxy HAProxyInfo `json:"haproxy"`
	// Inventory is the worker's, in the first answer after it changed only.
	Inventory *Inventory `json:"runtime_inventory,omitempty"`
	// At is when the apply started, RFC 3339 in UTC, to the second.
	At string `json:"at"`
	// Timing is where the apply spent its time.
	Timing ApplyTiming `json:"timing"`
}

// ApplyTiming splits one apply's duration into its stages, in milliseconds.
type ApplyTiming struct {
	StageMs  int64 `json:"stage_ms"`  // from the manifest's arrival to the parts verified: lock wait and fence included
	AdmitMs  int64 `json:"admit_ms"`  // held files, known-bad cache, last-known-good promotion, proofs
	WriteMs  int64 `json:"write_ms"`  // backing up and installing the files
	OpsMs    int64 `json:"ops_ms"`    // the runtime commands, or the reload that ran instead
	FinishMs int64 `json:"finish_ms"` // recording the outcome
	TotalMs  int64 `json:"total_ms"`  // from the manifest's arrival to the answer
}

// ReloadInfo reports a reload that ran, or one that was scheduled.
type ReloadInfo struct {
	Performed   bool   `json:"performed"`              // HAProxy took the reload and gave a verdict
	OK          bool   `json:"ok"`                     // the reload succeeded and a new worker answered
	WorkerPID   int    `json:"worker_pid,omitempty"`   // the new worker's pid
	TookMs      int64  `json:"took_ms,omitempty"`      // from sending reload to the new worker's answer
	Output      string `json:"output,omitempty"`       // HAProxy's startup log
	ScheduledAt string `json:"scheduled_at,omitempty"` // a scheduled reload's due time (RFC 3339 ns, UTC)
}

// RollbackInfo reports a restore of the files: a NACK's, or a revert's.
type RollbackInfo struct {
	Performed bool `json:"performed"` // the files were restored
	Reloaded  bool `json:"reloaded"`  // HAProxy reloaded the restored files
}

// ApplyError says where an apply failed. It is the body of every agent
// 4xx/5xx JSON answer and the error inside a NACK; Message carries
// HAProxy's own words where HAProxy refused something.
type ApplyError struct {
	Stage   string `json:"stage"`   // a Stage* value
	Message string `json:"message"` // what failed, in HAProxy's words where it refused
}

// StateRead selects what a state read asks for. It is never serialized.
type StateRead struct {
	Verify bool // re-hash the tree and re-check the worker before answering
	Plan   bool // include the stored plan blob
}

// Conflict is the 409 answer of a fenced apply. It reports the agent's
// actual baseline so that the caller can re-diff; nothing was written.
type Conflict struct {
	AppliedPlanID      string `json:"applied_plan_id"`                 // the applied pair, as in State
	AppliedPlanProof   string `json:"applied_plan_proof,omitempty"`    // its proof
	AppliedToken       Token  `json:"applied_token"`                   // the applied token
	RunningPlanID      string `json:"running_plan_id"`                 // the running pair
	RunningPlanProof   string `json:"running_plan_proof,omitempty"`    // its proof
	WorkerOpsPlanID    string `json:"worker_ops_plan_id"`              // the worker-ops pair
	WorkerOpsPlanProof string `json:"worker_ops_plan_proof,omitempty"` // its proof
	LKGPlanID          string `json:"lkg_plan_id"`                     // the last-known-good pair
	LKGPlanProof       string `json:"lkg_plan_proof,omitempty"`        // its proof
	Reason             string `json:"reason"`                          // the fencing rule that refused: a Reason* value
}

// Missing is the 409 answer naming the file parts the agent lacks, sorted.
type Missing struct {
	Missing []string `json:"missing"` // the paths to resend, whole ones for a patch whose base is gone; "plan" (PartPlan) asks for the whole plan blob instead of a PlanPatch
}

// PlanStored is the 200 answer to PUT /v1/plan.
type PlanStored struct {
	PlanID string `json:"plan_id"` // the applied plan the stored blob now describes
	Proof  string `json:"proof"`   // its proof
}

// PlanMoved is the 409 answer to PUT /v1/plan when the pod moved on.
type PlanMoved struct {
	AppliedPlanID    string `json:"applied_plan_id"`              // the applied pair now; the blob was dropped
	AppliedPlanProof string `json:"applied_plan_proof,omitempty"` // its proof
}

// DrainResult is the answer of GET /drain.
type DrainResult struct {
	Reason      string `json:"reason"`      // a DrainReason* value
	Waited      string `json:"waited"`      // the drain's duration to the millisecond, as time.Duration prints it
	Connections uint64 `json:"connections"` // connections the traffic frontends accepted, in total
}

// ValidateOpBatches checks the op budget of one apply: at most
// MaxOpsPerApply ops in the first batch (ops plus in-place ops), at most
// MaxOpBatches batches, and 1..MaxOpsPerApply ops in each continuation
// batch. Both ends run it, so its texts are contract.
func (m *Manifest) ValidateOpBatches() error {
	if m == nil {
		return nil
	}
	return validateOpCounts(len(m.Ops)+len(m.InPlaceOps), len(m.OpBatches), func(i int) int { return len(m.OpBatches[i]) })
}

// validateOpCounts is ValidateOpBatches on counts alone: first is the size
// of the first batch, batches the number of continuation batches and
// batchLen(i) the size of continuation batch i (asked only for i below
// batches, and only once batches is within the limit). The agent also runs
// it on a manifest it has counted but not decoded.
func validateOpCounts(first, batches int, batchLen func(i int) int) error {
	if first > MaxOpsPerApply {
		return fmt.Errorf("%d ops exceed the %d-op limit", first, MaxOpsPerApply)
	}
	if batches >= MaxOpBatches {
		return fmt.Errorf("%d operation batches exceed the %d-batch limit", 1+batches, MaxOpBatches)
	}
	for i := range batches {
		if n := batchLen(i); n == 0 || n > MaxOpsPerApply {
			return fmt.Errorf("operation batch %d must contain 1 to %d ops; got %d", i+2, MaxOpsPerApply, n)
		}
	}
	return nil
}

// RuntimeOps returns every runtime op in execution order: ops, then each
// continuation batch. In-place ops are not included. Without continuation
// batches it returns m.Ops itself.
func (m *Manifest) RuntimeOps() []Op {
	if m == nil {
		return nil
	}
	if len(m.OpBatches) == 0 {
		return m.Ops
	}
	n := len(m.Ops)
	for _, b := range m.OpBatches {
		n += len(b)
	}
	ops := make([]Op, 0, n)
	ops = append(ops, m.Ops...)
	for _, b := range m.OpBatches {
		ops = append(ops, b...)
	}
	return ops
}

// SafeToken reports whether s can travel as one word of a runtime command
// line: a name, a path, a map key, a set-map value, a keyword or a keyword
// argument. Whitespace would split the word, ';' would end the command, '<'
// could open a payload, a backslash is an escape, and control bytes break
// the line. Bytes 0x80 and above (UTF-8) are allowed.
func SafeToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c == 0x7f, c == ' ', c == ';', c == '<', c == '>', c == '\\':
			return false
		}
	}
	return true
}

// SafePayloadValue reports whether s can travel inside a payload block,
// where only line framing matters: it must hold no LF, CR or NUL. The empty
// string is allowed.
func SafePayloadValue(s string) bool {
	return !strings.ContainsAny(s, "\n\r\x00")
}

// HasWorkerIdentity reports whether h names one worker process.
func (h HAProxyInfo) HasWorkerIdentity() bool {
	return h.WorkerPID > 0 && h.WorkerStartTimeUnixMicros > 0
}

// SameWorker reports whether h and other name the same worker process. A
// reused PID with another start time is a different worker.
func (h HAProxyInfo) SameWorker(other HAProxyInfo) bool {
	return h.HasWorkerIdentity() &&
		h.WorkerPID == other.WorkerPID &&
		h.WorkerStartTimeUnixMicros == other.WorkerStartTimeUnixMicros
}

// HoldsAppliedPlan reports whether the agent holds the plan blob of its
// applied plan, whether or not this answer carried it.
func (s State) HoldsAppliedPlan() bool {
	return s.AppliedPlanStored || len(s.AppliedPlan) > 0
}

// Query returns the query string of a state read, "?" included.
func (r StateRead) Query() string {
	switch {
	case r.Verify && r.Plan:
		return "?verify=1"
	case r.Verify:
		return "?verify=1&plan=0"
	case r.Plan:
		return ""
	default:
		return "?plan=0"
	}
}
