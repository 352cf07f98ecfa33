// Package haptic is a reference implementation of the HAPTIC agent contract,
// API major version 1: the agent that runs beside HAProxy in every
// load-balancer pod, the render plan a controller describes its output with,
// the pure decision Diff that says whether a change can reach the running
// worker through the runtime API, and the client that drives one agent.
//
// # The flow of one change
//
// A controller renders the whole configuration of a pod (haproxy.cfg, maps,
// certificates) and describes the render as a [Plan]. [Diff] compares it
// with what the pod holds ([BaselineFromState] of the agent's [State]) and
// returns a [Decision]: "runtime" with typed [Op]s when every change can reach
// the running worker through HAProxy's runtime API, "file_only" when only
// files change, or "reload" with the reasons why not. [NewManifest] turns the
// decision into the body of one apply, and [Client.Apply] sends it; [Deploy]
// is that whole loop for one pod, with the resend of parts the agent lacks
// and the re-diff after a conflict.
//
//	controller                                     one pod
//	render ─► Plan ─► Diff(plan, baseline)         Agent (NewAgent, Run)
//	                    │ runtime / file_only        fence ─► stage parts
//	                    │ / reload + reasons         ─► journal + intent
//	                    ▼                            ─► runtime ops, write │
//	NewManifest ─► Client.Apply ── POST /v1/apply ─► write, reload ─► commit
//	Deploy: state ─► diff ─► apply ─► resend       │ worker   │ master
//	        ─► re-diff on a conflict              ▼ socket   ▼ socket
//	                                              HAProxy worker ◄─ master
//
// The [Agent] owns the pod's file tree. It writes each file set in one
// transaction with a backup journal, runs the ops or reloads, rolls back to
// the last known good set when HAProxy refuses, fences stale leaders with an
// epoch and the plan the controller believes the pod holds, and reports what
// happened in an [ApplyResult]. What it promised survives a crash or a power
// loss: every change of its state is a record in an append-only log that is
// synced before the answer leaves.
//
// # How to read it
//
// Each file starts with what it owns and what it must never do, and reads in
// the order data flows through it. Start with the wire contract and the pure
// parts, then follow one apply through the agent:
//
//	haptic.go                 the wire contract: constants, limits, JSON types, the token grammar
//	renderplan.go             the render plan, its canonical encoding, plan ids, digests, PlanFromDir
//	deployplan.go             Diff, BaselineFromState and NewManifest: pure functions, tested as tables
//	client.go                 the controller's end of the wire, and Deploy
//	pathrules.go              the characters a manifest path may hold, shared by both ends
//	agent.go                  the agent's configuration, listeners, startup and handlers
//	agent_apply.go            one apply, from manifest to commit
//	agent_apply_bounds.go     what an apply may cost before it is admitted
//	agent_ledger.go           the agent's state: one type, every change a named transition
//	agent_log.go              how the state reaches the disk: the snapshot and the log
//	agent_files.go            the file store: staging, the backup journal, install, restore
//	agent_disk.go             the one interface every file operation goes through
//	agent_worker.go           the worker the agent expects: check, adopt, reload
//	agent_runtime_compile.go  an Op compiled into HAProxy commands, packed into lines
//	agent_runtime.go          the runtime sockets: send, count, judge the replies; reads
//	agent_deferred_deletes.go the queue that deletes servers and backends off the apply path
//	agent_pacing.go           scheduled reloads and the read-back that repairs a divergence
//	agent_readiness.go        whether HAProxy is reachable now (/readyz)
//	agent_auth.go             HTTP Basic and mutual TLS; agent_authfail.go, failed attempts
//	agent_listeners.go        per-listener timeouts and connection caps
//	agent_metrics.go          the Prometheus text exposition
//	agent_drain.go            the preStop drain
//	agent_reasons.go          why a reload the controller asked for is logged as it is
//	fakehaproxy*.go           FakeHAProxy: an in-process HAProxy for tests, held to the real one
//	harness_test.go           the harness every agent test builds on
//
// Pure decisions (Diff, the fence, settling a reload's verdict, compiling an
// op, judging a reply) are plain functions over data; I/O stays at the edges,
// and every loop is bounded by a named limit. The package depends on the
// standard library and github.com/klauspost/compress/zstd only.
package haptic
