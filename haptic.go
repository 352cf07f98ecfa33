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

// Apply modes (Manifest.Mode).
const (
	ModeAuto      = "auto"       // run the ops when the baseline matches; the agent decides
	ModeReload    = "reload"     // write the files and reload; ops are not run
	ModeRevertLKG = "revert_lkg" // restore the last-known-good set and reload
)

// Result modes (ApplyResult.Mode).
const (
	ResultRuntime   = "runtime"   // files written, runtime ops executed, no reload
	ResultFileOnly  = "file_only" // files written, nothing to run, no reload
	ResultReload    = "reload"    // files written and HAProxy reloaded
	ResultScheduled = "scheduled" // files written, a reload is queued for the end of the pacing window
	ResultNoop      = "noop"      // nothing changed on disk, nothing ran
	ResultRejected  = "rejected"  // NACK: the apply failed and was rolled back
)

// Features the agent accepts in addition to its op kinds, in the order the
// agent advertises them.
const (
	FeatureFilePatch      = "file_patch"      // ManifestFile.Patch
	FeatureWorkerFence    = "worker_fence"    // the worker_ops_mismatch fence
	FeatureRuntimeBatches = "runtime_batches" // Manifest.OpBatches
)

// Conflict reasons (Conflict.Reason).
const (
	ReasonStaleEpoch           = "stale_epoch"
	ReasonRevertTargetMismatch = "revert_target_mismatch"
	ReasonPrevMismatch         = "prev_mismatch"
	ReasonUnknownBaseline      = "unknown_baseline"
	ReasonWorkerOpsMismatch    = "worker_ops_mismatch"
)

// Server states for server_set_state.
const (
	ServerStateReady = "ready"
	ServerStateMaint = "maint"
	ServerStateDrain = "drain"
)

// ApplyError stages. The first group is answered as an HTTP error body, the
// second travels inside an ApplyResult.
const (
	StageStartup  = "startup"
	StageRequest  = "request"
	StageManifest = "manifest"
	StageParts    = "parts"
	StageLKG      = "lkg"
	StageIdentity = "identity"
	StageState    = "state"
	StagePlan     = "plan"

	StageInPlace         = "in_place"
	StageBackup          = "backup"
	StageWrite           = "write"
	StageReload          = "reload"
	StageRevert          = "revert"
	StageRevertReload    = "revert_reload"
	StageScheduledReload = "scheduled_reload"
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
// runtime ops to run when that baseline holds.
type Manifest struct {
	IdentityVersion            int            `json:"identity_version,omitempty"`
	PlanID                     string         `json:"plan_id"`
	PlanProof                  string         `json:"plan_proof,omitempty"`
	PlanSchemaVersion          int            `json:"plan_schema_version"`
	Token                      Token          `json:"token"`
	ExpectedPrevPlanID         string         `json:"expected_prev_plan_id"`
	ExpectedPrevPlanProof      string         `json:"expected_prev_plan_proof,omitempty"`
	ExpectedPrevToken          Token          `json:"expected_prev_token"`
	ExpectedWorkerOpsPlanID    string         `json:"expected_worker_ops_plan_id,omitempty"`
	ExpectedWorkerOpsPlanProof string         `json:"expected_worker_ops_plan_proof,omitempty"`
	WorkerOpsPlanID            string         `json:"worker_ops_plan_id,omitempty"`
	WorkerOpsPlanProof         string         `json:"worker_ops_plan_proof,omitempty"`
	ValidatedPlanID            string         `json:"validated_plan_id,omitempty"`
	ValidatedPlanProof         string         `json:"validated_plan_proof,omitempty"`
	Files                      []ManifestFile `json:"files"`
	Ops                        []Op           `json:"ops,omitempty"`
	OpBatches                  [][]Op         `json:"op_batches,omitempty"`
	InPlaceOps                 []Op           `json:"in_place_ops,omitempty"`
	Mode                       string         `json:"mode"`
}

// Token is the fencing token of an apply. Tokens are compared by equality of
// both fields; only the epoch is ordered (stale_epoch).
type Token struct {
	LeaderEpoch uint64 `json:"leader_epoch"`
	RenderSeq   uint64 `json:"render_seq"`
}

// ManifestFile is one desired file. The agent treats a file as held (no part
// needed) only when its record has the same non-empty proof, digest and size.
type ManifestFile struct {
	Path           string     `json:"path"`
	Digest         string     `json:"digest"`
	Proof          string     `json:"proof,omitempty"`
	Size           int64      `json:"size"`
	Kind           string     `json:"kind"`
	ReloadOnChange bool       `json:"reload_on_change"`
	Patch          *FilePatch `json:"patch,omitempty"`
}

// FilePatch delivers a file as a splice of the held copy: the new content is
// base[:Offset] + part + base[Offset+Length:], and the part carries
// Size − BaseSize + Length bytes.
type FilePatch struct {
	BaseDigest string `json:"base_digest"`
	BaseSize   int64  `json:"base_size"`
	Offset     int64  `json:"offset"`
	Length     int64  `json:"length"`
}

// Op is one typed runtime command. Fields a kind does not use stay at their
// zero value; the agent compiles each kind into HAProxy runtime commands
// (compileOp in agent_runtime_compile.go).
type Op struct {
	Kind       string       `json:"kind"`
	Backend    string       `json:"backend,omitempty"`
	Server     string       `json:"server,omitempty"`
	Profile    string       `json:"profile,omitempty"`
	Mode       string       `json:"mode,omitempty"`
	GUID       string       `json:"guid,omitempty"`
	Address    string       `json:"address,omitempty"`
	Port       int          `json:"port,omitempty"`
	Weight     *int         `json:"weight,omitempty"` // a pointer, so that 0 travels
	State      string       `json:"state,omitempty"`
	Health     bool         `json:"health,omitempty"`
	Keywords   []KeywordArg `json:"keywords,omitempty"`
	TimeoutMs  int          `json:"timeout_ms,omitempty"`
	Path       string       `json:"path,omitempty"`
	Key        string       `json:"key,omitempty"`
	Value      string       `json:"value,omitempty"`
	Cert       string       `json:"cert,omitempty"`
	Options    []KeywordArg `json:"options,omitempty"`
	SNIFilters []string     `json:"sni_filters,omitempty"`
}

// KeywordArg is one HAProxy keyword with its arguments, carried as data so
// that no consumer has to scan a line. It is part of the plan encoding too,
// so it has exactly these two fields in this order.
type KeywordArg struct {
	Name string   `json:"name"`
	Args []string `json:"args,omitempty"`
}

// OpResult is one executed op's verdict, in execution order.
type OpResult struct {
	Kind   string `json:"kind"`
	OK     bool   `json:"ok"`
	Output string `json:"output,omitempty"`
}

// HAProxyInfo identifies the running worker. The PID and the start time
// together name one worker process; the start time catches a PID reused
// after a container restart.
type HAProxyInfo struct {
	Version                   string `json:"version"`
	FullVersion               string `json:"full_version"`
	WorkerPID                 int    `json:"worker_pid"`
	WorkerStartTimeUnixMicros int64  `json:"worker_start_time_unix_micros"`
}

// State is the answer of GET /v1/state.
type State struct {
	APIVersion         int               `json:"api_version"`
	AgentVersion       string            `json:"agent_version"`
	PlanSchemaVersion  int               `json:"plan_schema_version"`
	AgentOps           []string          `json:"agent_ops"`
	Features           []string          `json:"features,omitempty"`
	HAProxy            HAProxyInfo       `json:"haproxy"`
	Generation         uint64            `json:"generation"`
	AppliedPlanID      string            `json:"applied_plan_id"`
	AppliedPlanProof   string            `json:"applied_plan_proof,omitempty"`
	RunningPlanID      string            `json:"running_plan_id"`
	RunningPlanProof   string            `json:"running_plan_proof,omitempty"`
	WorkerOpsPlanID    string            `json:"worker_ops_plan_id"`
	WorkerOpsPlanProof string            `json:"worker_ops_plan_proof,omitempty"`
	AppliedToken       Token             `json:"applied_token"`
	LKGPlanID          string            `json:"lkg_plan_id"`
	LKGPlanProof       string            `json:"lkg_plan_proof,omitempty"`
	AppliedPlan        []byte            `json:"applied_plan,omitempty"`
	AppliedPlanStored  bool              `json:"applied_plan_stored"`
	Files              map[string]FileAt `json:"files"`
	Inventory          Inventory         `json:"runtime_inventory"`
	ReloadPendingAt    string            `json:"reload_pending_at,omitempty"`
	PendingDeletes     PendingDeletes    `json:"pending_deletes"`
	LastApply          *ApplyResult      `json:"last_apply,omitempty"`
	InvariantViolation string            `json:"invariant_violation,omitempty"`
}

// FileAt is one held file as the agent last observed it.
type FileAt struct {
	Digest string `json:"digest"`
	Proof  string `json:"proof,omitempty"`
	Size   int64  `json:"size"`
}

// Inventory is what the running worker has loaded, as base-relative paths.
type Inventory struct {
	Generation uint64   `json:"generation"`
	Maps       []string `json:"maps"`
	Certs      []string `json:"certs"`
	CAFiles    []string `json:"ca_files"`
	CRLFiles   []string `json:"crl_files"`
	CRTLists   []string `json:"crt_lists"`
}

// PendingDeletes lists the deferred deletes queued on the pod.
type PendingDeletes struct {
	Servers  []string `json:"servers"`  // each "backend/server"
	Backends []string `json:"backends"` // unpublished backends waiting for deletion
}

// ApplyResult is the 200 answer to an apply: an ACK (OK) or a NACK.
type ApplyResult struct {
	PlanID             string        `json:"plan_id"`
	OK                 bool          `json:"ok"`
	Mode               string        `json:"mode"`
	AppliedPlanID      string        `json:"applied_plan_id"`
	AppliedPlanProof   string        `json:"applied_plan_proof,omitempty"`
	RunningPlanID      string        `json:"running_plan_id"`
	RunningPlanProof   string        `json:"running_plan_proof,omitempty"`
	WorkerOpsPlanID    string        `json:"worker_ops_plan_id"`
	WorkerOpsPlanProof string        `json:"worker_ops_plan_proof,omitempty"`
	AppliedToken       Token         `json:"applied_token"`
	LKGPlanID          string        `json:"lkg_plan_id"`
	LKGPlanProof       string        `json:"lkg_plan_proof,omitempty"`
	OpResults          []OpResult    `json:"op_results,omitempty"`
	Reload             *ReloadInfo   `json:"reload,omitempty"`
	Rollback           *RollbackInfo `json:"rollback,omitempty"`
	Error              *ApplyError   `json:"error,omitempty"`
	HAProxy            HAProxyInfo   `json:"haproxy"`
	Inventory          *Inventory    `json:"runtime_inventory,omitempty"`
	At                 string        `json:"at"`
	Timing             ApplyTiming   `json:"timing"`
}

// ApplyTiming splits one apply's duration into its stages, in milliseconds.
type ApplyTiming struct {
	StageMs  int64 `json:"stage_ms"`
	AdmitMs  int64 `json:"admit_ms"`
	WriteMs  int64 `json:"write_ms"`
	OpsMs    int64 `json:"ops_ms"`
	FinishMs int64 `json:"finish_ms"`
	TotalMs  int64 `json:"total_ms"`
}

// ReloadInfo reports a reload that ran, or one that was scheduled.
type ReloadInfo struct {
	Performed   bool   `json:"performed"`
	OK          bool   `json:"ok"`
	WorkerPID   int    `json:"worker_pid,omitempty"`
	TookMs      int64  `json:"took_ms,omitempty"`
	Output      string `json:"output,omitempty"`
	ScheduledAt string `json:"scheduled_at,omitempty"`
}

// RollbackInfo reports an abort's restore of the last-known-good set.
type RollbackInfo struct {
	Performed bool `json:"performed"`
	Reloaded  bool `json:"reloaded"`
}

// ApplyError says where an apply failed. It is the body of every agent
// 4xx/5xx JSON answer and the error inside a NACK; Message carries
// HAProxy's own words where HAProxy refused something.
type ApplyError struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
}

// StateRead selects what a state read asks for. It is never serialized.
type StateRead struct {
	Verify bool // re-hash the tree and re-check the worker before answering
	Plan   bool // include the stored plan blob
}

// Conflict is the 409 answer of a fenced apply. It reports the agent's
// actual baseline so that the caller can re-diff; nothing was written.
type Conflict struct {
	AppliedPlanID      string `json:"applied_plan_id"`
	AppliedPlanProof   string `json:"applied_plan_proof,omitempty"`
	AppliedToken       Token  `json:"applied_token"`
	RunningPlanID      string `json:"running_plan_id"`
	RunningPlanProof   string `json:"running_plan_proof,omitempty"`
	WorkerOpsPlanID    string `json:"worker_ops_plan_id"`
	WorkerOpsPlanProof string `json:"worker_ops_plan_proof,omitempty"`
	LKGPlanID          string `json:"lkg_plan_id"`
	LKGPlanProof       string `json:"lkg_plan_proof,omitempty"`
	Reason             string `json:"reason"`
}

// Missing is the 409 answer naming the file parts the agent lacks, sorted.
type Missing struct {
	Missing []string `json:"missing"`
}

// PlanStored is the 200 answer to PUT /v1/plan.
type PlanStored struct {
	PlanID string `json:"plan_id"`
	Proof  string `json:"proof"`
}

// PlanMoved is the 409 answer to PUT /v1/plan when the pod moved on.
type PlanMoved struct {
	AppliedPlanID    string `json:"applied_plan_id"`
	AppliedPlanProof string `json:"applied_plan_proof,omitempty"`
}

// DrainResult is the answer of GET /drain.
type DrainResult struct {
	Reason      string `json:"reason"`
	Waited      string `json:"waited"`
	Connections uint64 `json:"connections"`
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
