// Package haptic is a reference implementation of the HAPTIC agent contract,
// API major version 1: the agent that runs beside HAProxy in every
// load-balancer pod, the render plan a controller describes its output with,
// the pure decision Diff that says whether a change can reach the running
// worker through the runtime API, and the client that drives one agent.
//
// # The contract's words
//
// A plan id is the digest of a render's whole content ([Plan.ComputeID]):
// two pods with the same id hold byte-identical files.
//
// A proof is the agent's own witness that it wrote and verified a plan's
// files: an opaque string it issues when an apply lands, never twice (not
// even across restarts), and reports beside the plan id. A controller
// quotes proofs back and never makes one up. An id with its proof is a
// pair; two pairs are the same only when both proofs are non-empty and ids
// and proofs are equal. A restart keeps the proofs while the files are
// exactly what the agent wrote (it re-hashes them at every start), so the
// next push can still be a runtime change; a file changed behind its back
// loses its proof and the plan id with it, and the next push reloads rather
// than run ops against a baseline nobody can vouch for. A file's proof
// ([ManifestFile].Proof) is the controller's witness instead: the agent
// asks for no part of a file whose record holds the proof, digest and size
// the manifest quotes.
//
// The agent reports four pairs, in [State], [ApplyResult] and [Conflict]:
//
//   - applied: the plan whose files are on disk, the baseline a manifest's
//     ExpectedPrev fields must name; none means the next push reloads.
//   - running: the plan the running worker loaded at its last reload.
//   - worker-ops: what the worker holds counting the runtime and in-place
//     ops since then, the worker baseline a manifest's ExpectedWorkerOps
//     fields must name. A runtime apply moves it with applied while running
//     stays at the last reload's plan: running lagging applied is normal.
//     While a reload is pending, the disk is ahead of the worker.
//   - last-known-good (lkg): the plan the agent restores and reloads when
//     HAProxy refuses a new one. A successful reload makes its plan the
//     last-known-good.
//
// The token ([Token]) is the leader epoch and render sequence of the apply
// that landed. An apply with a lower epoch is fenced (stale_epoch), so two
// controllers cannot interleave their renders on one pod; [Manifest] lists
// the seven fencing rules.
//
// The identity version (Manifest.IdentityVersion) is the proof protocol a
// manifest speaks. [ExactIdentityVersion] (1) is exact identity: pairs are
// compared with their proofs, and ops may run. Any other value is legacy: the agent turns
// the apply into a reload and drops its ops and every proof field.
//
// The validated pair (Manifest.ValidatedPlanID and ValidatedPlanProof) is
// the newest plan the controller's own haproxy -c passed. When it is the
// agent's applied pair, the agent makes that plan last-known-good before
// the apply runs: the set it falls back to when HAProxy refuses.
//
// In-place ops are ops for the worker that keeps serving while a reload
// waits; "Applies" below says when they run.
//
// A verdict, a mode and a result mode are three words for three moments:
// [Verdict], [Mode] and [ResultMode] say which, and how their sets overlap.
// Where an apply fails is its [Stage]; why the fence refused one, its
// [Reason].
//
// # The flow of one change
//
// A controller renders the whole configuration of a pod (haproxy.cfg, maps,
// certificates) and describes the render as a [Plan]. [Diff] compares it
// with what the pod holds ([BaselineFromState] of the agent's [State]) and
// returns a [Decision]: "runtime" with typed ops ([Op]) when every change can
// reach the running worker through HAProxy's runtime API, "file_only" when
// only files change, or "reload" with the reasons why not. [NewManifest] turns the
// decision into the body of one apply, and [Client.Apply] sends it; [Deploy]
// is that whole loop for one pod, with the resend of parts the agent lacks
// and the re-diff after a conflict. What changed travels, not what is
// held: a changed file as a [FilePatch] of the copy the pod holds, and the
// plan the pod stores for the next leader as a [PlanPatch] of the plan it
// holds, checked by its hash. A one-entry change of a map of 236,000
// entries costs a pod about 2 KB on the wire.
//
//	controller                                  one pod
//	render ─► Plan ─► Diff(next, Baseline)      Agent (NewAgent, Run)
//	            verdict, ops, reasons             POST /v1/apply: fence ─►
//	                    │                         stage parts ─► lock ─►
//	                    ▼                         pay owed ─► fence ─► cache
//	NewManifest ─► Client.Apply ── manifest ──►   ─► record (ops sent while
//	                            ◄─ ApplyResult ─  it syncs) ─► install ─► end
//	                            ◄─ 409 Conflict   ─► answer ─► compact; or
//	                               or Missing     record ─► install ─► reload
//	                                              ─► end ─► answer ─► compact
//	Deploy: State ─► Diff ─► Apply ─► resend        │ worker    │ master
//	        ─► re-diff ─► PutPlan (patch)           ▼ socket    ▼ socket
//	                                              HAProxy worker ◄─ master
//
// # Applies
//
// The [Agent] owns the pod's file tree. It writes each file set in one
// transaction, runs the ops or reloads, fences stale leaders, and reports
// what happened in an [ApplyResult]. Each apply is one record of an
// append-only log, synced before its first rename (once for a runtime,
// file_only or noop apply, while its ops travel and its files' bytes are
// written; once more after a reload took effect). A runtime, file_only or
// noop apply counts from that durable point, renames its files into the
// tree (unsynced: recovery redoes them from the record) and is answered: whoever reads the disk after an ACK
// sees the apply's files. Parts are read before the apply lock, so a slow
// upload holds up no other apply; a body below a minimum rate is cut, and
// the whole request has a deadline. runApply in agent_apply_run.go reads as
// that order: when an apply is durable, what happens when HAProxy refuses
// it, and when its files reach the disk. handleApply in agent_apply.go is
// the request around it: it answers with runApply's outcome, and only then
// compacts a log the apply made long.
//
// Which answers are promises. An ACK (ok: true) of mode runtime, file_only,
// noop or reload is one: it survives a crash or a power loss, and no
// rollback, recovery or restart takes it back, except in the one case
// below. So is an ACK whose install failed (a full or read-only disk): its
// Error says the files are owed, and the agent is not ready until a retry
// has put them in place; and one whose Error has stage in_place, where only
// the in-place ops failed. An ACK of mode scheduled is not a promise of
// the reload: its files are on disk and recorded, and it queues a reload
// for the end of the pacing window, whose verdict comes in the state's
// last_apply. If HAProxy refuses that reload (or gives no verdict), the
// tree goes back to what the pending reload's applies found, and last_apply
// says so. A NACK (ok: false) means the apply failed and its tree is put
// back; a 503 saying the outcome is unknown means the disk refused the
// record of that undo, and the apply may still count: it is known once the
// agent can write its disk again.
//
// A failure undoes only its own apply: it puts back exactly the tree the
// apply started from (ACKed runtime changes included), and where the
// worker may have seen the new one (its ops ran, or its reload may have
// taken effect) reloads that tree. The last-known-good set is loaded in one
// case only, besides a revert_lkg the controller asks for: HAProxy refuses
// that restored tree too. The agent then restores and reloads the
// last-known-good set, which takes back every apply answered since that
// plan became last-known-good; it logs so, and the answer's rollback says
// whether the files were put back and reloaded.
//
// Every writer of the log (an apply after its answer, a plan upload, the
// pacer, a read-back, a verified state read, the retry of what the disk
// owes) compacts it once it is due, before it lets go of the apply lock,
// and so do the start and the stop: no sequence of requests grows the log
// past what a start reads.
//
// In-place ops ([Manifest].InPlaceOps, [Decision].InPlace) run on the worker
// that keeps serving while a reload waits: one is pending, or this apply
// asks for a reload that the pacing window (AgentConfig.ReloadIntervalMin)
// schedules. Diff composes them against the exact worker-ops plan
// (Baseline.WorkerOps) and only for objects that worker already has and the
// reload's files carry too: server address, weight and state, added
// servers, certificate updates, and map sets and deletes, all or none across
// every map of the render. The worker then serves the new state until the
// reload fires. Afterwards the worker-ops pair names Decision.WorkerPlan, a
// derived plan, not the render. A failed in-place op leaves the apply an ACK
// whose Error has stage in_place and clears the baseline, so the next push
// reloads; it never causes a second reload.
//
// The known-bad cache remembers HAProxy's own refusal for 60 seconds: after
// HAProxy refused to reload a set of files, the same work (plan, files, ops
// and mode, whatever the token) is answered with the stored NACK, without
// writing or reloading again, so a controller retrying a configuration
// HAProxy refused does not roll every pod back and forth. I/O errors,
// timeouts and transport errors are never remembered. The fence runs before
// the cache, which holds one record and starts empty at every start.
//
// After every runtime apply that landed, a background read-back checks that
// HAProxy holds what the ops meant: every touched backend still answers
// show servers state, and every touched map's running keys are the map
// file's (a map too large to list is skipped). A divergence is counted
// (haptic_agent_map_divergence_total) and repaired by a reload of the
// applied plan, scheduled when the pacing window is open. The read-back
// lists what HAProxy holds without the apply lock, so that the next apply
// never waits for HAProxy's answer, then takes the lock to compare it with
// the files; it gives no verdict once a later apply moved the applied pair
// or the agent is stopping, and a failed repair clears the baseline. The
// apply's answer never waits for it.
//
// # How to read it
//
// Each file starts with what it owns and what it must never do, and reads in
// the order data flows through it. Start with the wire contract and the pure
// parts, then follow one apply through the agent:
//
//	haptic.go                 the wire contract: constants, limits, JSON types, the token grammar
//	renderplan.go             the render plan, its canonical encoding, plan ids, digests, PlanFromDir
//	planpatch.go              a plan as splices of the one a pod holds: cut, applied, made a blob again
//	deployplan.go             Diff, BaselineFromState and NewManifest: pure functions, tested as tables
//	client.go                 the controller's end of the wire, and Deploy
//	pathrules.go              the characters a manifest path may hold, shared by both ends
//	workersocket.go           whether a stats socket is the agent's: for the agent and haptic check
//	agent.go                  the agent's configuration, listeners, startup, handlers, the every loop
//	agent_apply.go            one apply request: the manifest, the fence, parts, admission, the answer
//	agent_apply_run.go        runApply: the apply in its durability order, each step returning what it did
//	agent_apply_ops.go        an apply's runtime ops: compiled, run on the expected worker, judged
//	agent_apply_steps.go      the apply's decisions as plain functions over data
//	agent_apply_bounds.go     what a request may cost: held bytes, decodes, a manifest's measure
//	agent_owed.go             what the disk and HAProxy owe the state, paid before anything else
//	agent_compact.go          compaction: the snapshot a long or broken log is due, then the sweep
//	agent_ledger.go           the agent's state: one type, every change a named transition
//	agent_log.go              how the state reaches the disk: the snapshot and the log
//	agent_files.go            the file store: staging, links aside (undo, journal), install, restore
//	agent_mounts.go           the volumes the tree spans, each with its own staging and links
//	agent_disk*.go            the one interface every file operation goes through
//	agent_worker.go           the worker the agent expects: check, adopt, reload
//	agent_runtime_compile.go  an Op compiled into HAProxy commands, packed into lines
//	agent_runtime.go          the runtime sockets: send, count, judge the replies; reads
//	agent_deferred_deletes.go the queue that deletes servers and backends off the apply path
//	agent_pacing.go           the pacer: a scheduled reload fired, or put back when refused
//	agent_readback.go         the read-back after a runtime apply, and its repair reload
//	agent_haproxy_watch.go    whether HAProxy is reachable now: the startup probe, the socket watch
//	agent_readiness.go        /readyz, and a state read's wait for initialisation
//	agent_auth.go             HTTP Basic and mutual TLS
//	agent_authfail.go         the budget of failed authentications per address
//	agent_listeners.go        per-listener timeouts and connection caps
//	agent_metrics.go          the Prometheus text exposition
//	agent_drain.go            the preStop drain
//	fakehaproxy*.go           FakeHAProxy: an in-process HAProxy for tests, held to the real one
//	harness_test.go           the harness every agent test builds on
//	cmd/haptic/               the command: agent (state, health, drain), install, plan, diff, push, demo
//	cmd/basic-apply/          the example program that drives an agent end to end
//	internal/example/         what cmd/basic-apply and haptic demo share
//	internal/yamlsubset/      the YAML subset the tests read deploy/ and api/ with
//	api/openapi.yaml          the wire contract as OpenAPI 3.1, held to this package by its tests
//	clients/typescript/       a controller written from api/openapi.yaml alone
//	deploy/, Dockerfile       Kubernetes and systemd files, the image, a Grafana dashboard, alerting rules
//	testdata/                 wire fixtures, real-HAProxy configurations, plan directories
//
// Pure decisions (Diff, the fence, the state an outcome leaves, compiling
// an op, judging a reply) are plain functions over data; I/O stays at the
// edges, and every loop is bounded by a named limit. The package depends on the
// standard library and github.com/klauspost/compress/zstd only.
package haptic
