// This file owns the agent's metrics: the counters and the gauges every part
// of the agent updates, and their Prometheus text exposition (format 0.0.4),
// written by hand. Each agent owns one agentMetrics; there is no package-level
// state.
//
// The metrics lock is a leaf: held only to read, render or bump numbers,
// never across I/O, and no other lock is taken under it, so any part of the
// agent may count while holding its own locks. Nothing here panics, whatever the
// caller passes.

package haptic

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

// maxSeriesPerFamily caps the series of one family, so that a bug feeding
// free-form text into a label cannot grow the scrape without bound (the
// agent's label values come from closed sets or validated op kinds). An
// increment that would create a series beyond it is dropped.
const maxSeriesPerFamily = 256

// rejectedStageFencing is the apply_rejected_total stage of an apply refused
// by fencing. It has no Stage* constant because fencing answers 409 with a
// Conflict, not an ApplyError.
const rejectedStageFencing = "fencing"

// agentMetrics holds every metric family the agent exposes.
type agentMetrics struct {
	applyTotal          *metricFamily // label mode
	applyRejected       *metricFamily // label stage
	invariantViolations *metricFamily // label name
	reloads             *metricFamily // label result
	rollbacks           *metricFamily // no label
	deferredDeletes     *metricFamily // labels kind, outcome
	opErrors            *metricFamily // label kind
	mapDivergence       *metricFamily // no label
	generation          *metricFamily // a gauge
	authFailures        *metricFamily // label scheme
	connsRefused        *metricFamily // label listener
	stateLogBroken      *metricFamily // a gauge, 0 or 1
	diskBehind          *metricFamily // a gauge, 0 or 1
	lateMount           *metricFamily // a gauge, 0 or 1

	// families is the exposition order, fixed so that two scrapes of one
	// agent, or of two agents, diff line by line.
	families []*metricFamily
}

// newAgentMetrics builds the families with every series of a closed label
// set already present at 0, as Prometheus advises: a dashboard sees a flat
// line rather than missing data, and rate() and increase() see the first
// event, which a series born at 1 hides. So a series' presence says
// nothing: whoever waits for an event (a deferred delete with
// outcome="deferred") must wait for its value to rise.
//
// haptic_agent_build_info is the usual info gauge: always 1, its label the
// agent's version, so that a query can join any series to the build that
// produced it and a dashboard can show which versions a fleet runs.
func newAgentMetrics(version string) *agentMetrics {
	buildInfo := newGauge("haptic_agent_build_info", "Always 1; the label version is the agent's build version, as its state reports it.", "version")
	buildInfo.inc(version)
	m := &agentMetrics{
		applyTotal: newCounterVec("haptic_agent_apply_total",
			"Applies finished and reloads fired by the pacer, by result mode.",
			[]string{"mode"}, []string{ResultRuntime, ResultFileOnly, ResultReload, ResultScheduled, ResultNoop, ResultRejected}),
		applyRejected: newCounterVec("haptic_agent_apply_rejected_total",
			"Applies and scheduled reloads that failed, by the stage that refused or aborted them.",
			[]string{"stage"}, []string{rejectedStageFencing, StageParts, StageBackup, StageWrite, StageReload,
				StageRevert, StageRevertReload, StageScheduledReload}),
		invariantViolations: newCounterVec("haptic_agent_invariant_violations_total",
			"Internal invariants found false, by invariant name. Any non-zero value is a bug worth reporting.",
			[]string{"name"}, []string{"generation_monotonic", "disk_is_the_desired_set", "runtime_mode_does_not_reload",
				"reload_mode_reloads", "noop_runs_no_ops", "journal_only_while_diverged",
				"mount_probe_found_every_mount", "ops_executable", "recovery_reload"}),
		reloads: newCounterVec("haptic_agent_reloads_total",
			"HAProxy master reload attempts, by result.",
			[]string{"result"}, []string{"ok", "failed"}),
		rollbacks: newCounterVec("haptic_agent_rollbacks_total",
			"Aborted applies rolled back and reverts to the last-known-good file set.", nil),
		deferredDeletes: newCounterVec("haptic_agent_deferred_deletes_total",
			"Deferred server and backend deletes, by kind and queue outcome.",
			[]string{"kind", "outcome"}, []string{"server", "backend"},
			[]string{"done", "deferred", "abandoned", "superseded"}),
		opErrors: newCounterVec("haptic_agent_op_errors_total",
			"Runtime batches HAProxy rejected, by the kind of the first failed op (unknown when none is known).",
			[]string{"kind"}, slices.Concat(opKinds[:], []string{"unknown"})),
		mapDivergence: newCounterVec("haptic_agent_map_divergence_total",
			"Read-backs that found the running worker diverging from the files on disk.", nil),
		generation: newGauge("haptic_agent_generation",
			"The apply generation of the state the agent serves."),
		authFailures: newCounterVec("haptic_agent_auth_failures_total",
			"Requests to the API that failed authentication, by scheme.",
			[]string{"scheme"}, []string{authSchemeBasic, authSchemeTLS}),
		connsRefused: newCounterVec("haptic_agent_connections_refused_total",
			"Connections reset because their listener held its cap of connections (refused at once, or evicted before they authenticated), by listener.",
			[]string{"listener"}, []string{listenerAPI, listenerMetrics, listenerAdmin, listenerDrain}),
		stateLogBroken: newGauge("haptic_agent_state_log_broken",
			"1 while the agent's state log is broken (a synced write failed and no snapshot has been written since): applies and plan uploads are refused and /readyz answers 503; 0 otherwise."),
		diskBehind: newGauge("haptic_agent_disk_behind",
			"1 while the tree does not hold files the agent answered for: installing them failed, and is retried."),
		lateMount: newGauge("haptic_agent_late_mount",
			"1 once a mount made under the tree after the agent started refused a push: pushes that touch it are refused and /readyz answers 503 until the agent restarts."),
	}
	// The agent's own additions follow the contract's families.
	m.families = []*metricFamily{
		m.applyTotal, m.applyRejected, m.invariantViolations, m.reloads, m.rollbacks,
		m.deferredDeletes, m.opErrors, m.mapDivergence, m.generation,
		m.authFailures, m.connsRefused, m.stateLogBroken, m.diskBehind, m.lateMount, buildInfo,
	}
	return m
}

// writeText writes the whole exposition, families in their fixed order.
// The text is rendered first and written in one call, so the metrics lock
// is never held while a slow scraper reads.
func (m *agentMetrics) writeText(w io.Writer) error {
	var b []byte
	for _, f := range m.families {
		b = f.appendText(b)
	}
	_, err := w.Write(b)
	return err
}

// metricFamily is a counter or gauge family with a fixed list of label
// names. A family without labels holds exactly one series.
type metricFamily struct {
	name, help, typ string
	labels          []string

	mu     sync.Mutex
	series []counterSeries // sorted by label values, the exposition's order
}

type counterSeries struct {
	labelValues []string // never modified once stored
	value       uint64
}

// newCounterVec builds a family. closed, when given, holds one closed value
// set per label name; every combination of them is created at 0. A family
// without labels always has its single series at 0.
func newCounterVec(name, help string, labels []string, closed ...[]string) *metricFamily {
	c := &metricFamily{name: name, help: help, typ: "counter", labels: labels}
	if len(closed) != len(labels) {
		return c // an open label set: series appear when first incremented
	}
	var fill func(values []string)
	fill = func(values []string) {
		if len(values) == len(labels) {
			c.lookup(values)
			return
		}
		for _, v := range closed[len(values)] {
			fill(append(slices.Clip(values), v))
		}
	}
	fill(nil)
	return c
}

// inc adds one to the series with these label values, creating it at need.
// A call with the wrong number of label values is a programming error; it is
// dropped rather than allowed to panic the agent or corrupt the exposition.
func (c *metricFamily) inc(labelValues ...string) {
	if len(labelValues) != len(c.labels) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.lookup(labelValues); s != nil {
		s.value++
	}
}

// lookup finds or creates a series; nil when the family is full. The
// pointer is good until the next series is created: the caller holds c.mu
// (or owns c exclusively, in newCounterVec).
func (c *metricFamily) lookup(labelValues []string) *counterSeries {
	i, found := slices.BinarySearchFunc(c.series, labelValues, func(s counterSeries, values []string) int {
		return slices.Compare(s.labelValues, values)
	})
	if !found && len(c.series) >= maxSeriesPerFamily {
		return nil
	}
	if !found {
		c.series = slices.Insert(c.series, i, counterSeries{labelValues: cloneSlice(labelValues)})
	}
	return &c.series[i]
}

func (c *metricFamily) appendText(b []byte) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n", c.name, helpEscaper.Replace(c.help), c.name, c.typ)
	for _, s := range c.series {
		labels := ""
		for i, label := range c.labels {
			labels += "," + label + `="` + labelValueEscaper.Replace(s.labelValues[i]) + `"`
		}
		if labels != "" {
			labels = "{" + labels[1:] + "}"
		}
		b = fmt.Appendf(b, "%s%s %d\n", c.name, labels, s.value)
	}
	return b
}

func newGauge(name, help string, labels ...string) *metricFamily {
	g := newCounterVec(name, help, labels)
	g.typ = "gauge"
	return g
}

// set replaces the value of the gauge's one series.
func (c *metricFamily) set(v uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lookup(nil).value = v
}

// The text format 0.0.4 escapes backslash and newline in HELP text, and
// additionally the double quote in label values; anything else would end
// the line or the quoted value early and corrupt every series after it.
var (
	helpEscaper       = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelValueEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
)
