// Tests of the agent's metrics (agent_metrics.go): the exact Prometheus
// text exposition, read back by an independent strict parser; a misused
// label count dropped and the series capped; counting from many goroutines
// at once; and a failed write reported to the caller.

package haptic

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestMetricsTextFormat(t *testing.T) {
	m := newAgentMetrics("v0.0.0-20261205020225-7510591d4e92+dirty")
	m.applyTotal.inc(ResultRuntime)
	m.applyTotal.inc(ResultRuntime)
	m.applyRejected.inc(rejectedStageFencing)
	m.invariantViolations.inc("ops_executable")
	m.reloads.inc("ok")
	m.reloads.inc("failed")
	m.rollbacks.inc()
	m.deferredDeletes.inc("server", "done")
	m.opErrors.inc(OpServerAdd)
	m.opErrors.inc("we\"ird\\kind\nx")
	m.opErrors.inc(OpBackendAdd)
	m.mapDivergence.inc()
	m.generation.set(7)
	m.authFailures.inc(authSchemeBasic)
	m.authFailures.inc(authSchemeBasic)
	m.connsRefused.inc(listenerMetrics)

	want := `# HELP haptic_agent_apply_total Applies finished and reloads fired by the pacer, by result mode.
# TYPE haptic_agent_apply_total counter
haptic_agent_apply_total{mode="file_only"} 0
haptic_agent_apply_total{mode="noop"} 0
haptic_agent_apply_total{mode="rejected"} 0
haptic_agent_apply_total{mode="reload"} 0
haptic_agent_apply_total{mode="runtime"} 2
haptic_agent_apply_total{mode="scheduled"} 0
# HELP haptic_agent_apply_rejected_total Applies and scheduled reloads that failed, by the stage that refused or aborted them.
# TYPE haptic_agent_apply_rejected_total counter
haptic_agent_apply_rejected_total{stage="backup"} 0
haptic_agent_apply_rejected_total{stage="fencing"} 1
haptic_agent_apply_rejected_total{stage="parts"} 0
haptic_agent_apply_rejected_total{stage="reload"} 0
haptic_agent_apply_rejected_total{stage="revert"} 0
haptic_agent_apply_rejected_total{stage="revert_reload"} 0
haptic_agent_apply_rejected_total{stage="scheduled_reload"} 0
haptic_agent_apply_rejected_total{stage="write"} 0
# HELP haptic_agent_invariant_violations_total Internal invariants found false, by invariant name. Any non-zero value is a bug worth reporting.
# TYPE haptic_agent_invariant_violations_total counter
haptic_agent_invariant_violations_total{name="disk_is_the_desired_set"} 0
haptic_agent_invariant_violations_total{name="generation_monotonic"} 0
haptic_agent_invariant_violations_total{name="journal_only_while_diverged"} 0
haptic_agent_invariant_violations_total{name="mount_probe_found_every_mount"} 0
haptic_agent_invariant_violations_total{name="noop_runs_no_ops"} 0
haptic_agent_invariant_violations_total{name="ops_executable"} 1
haptic_agent_invariant_violations_total{name="recovery_reload"} 0
haptic_agent_invariant_violations_total{name="reload_mode_reloads"} 0
haptic_agent_invariant_violations_total{name="runtime_mode_does_not_reload"} 0
# HELP haptic_agent_reloads_total HAProxy master reload attempts, by result.
# TYPE haptic_agent_reloads_total counter
haptic_agent_reloads_total{result="failed"} 1
haptic_agent_reloads_total{result="ok"} 1
# HELP haptic_agent_rollbacks_total Aborted applies rolled back and reverts to the last-known-good file set.
# TYPE haptic_agent_rollbacks_total counter
haptic_agent_rollbacks_total 1
# HELP haptic_agent_deferred_deletes_total Deferred server and backend deletes, by kind and queue outcome.
# TYPE haptic_agent_deferred_deletes_total counter
haptic_agent_deferred_deletes_total{kind="backend",outcome="abandoned"} 0
haptic_agent_deferred_deletes_total{kind="backend",outcome="deferred"} 0
haptic_agent_deferred_deletes_total{kind="backend",outcome="done"} 0
haptic_agent_deferred_deletes_total{kind="backend",outcome="superseded"} 0
haptic_agent_deferred_deletes_total{kind="server",outcome="abandoned"} 0
haptic_agent_deferred_deletes_total{kind="server",outcome="deferred"} 0
haptic_agent_deferred_deletes_total{kind="server",outcome="done"} 1
haptic_agent_deferred_deletes_total{kind="server",outcome="superseded"} 0
# HELP haptic_agent_op_errors_total Runtime batches HAProxy rejected, by the kind of the first failed op (unknown when none is known).
# TYPE haptic_agent_op_errors_total counter
haptic_agent_op_errors_total{kind="backend_add"} 1
haptic_agent_op_errors_total{kind="backend_del"} 0
haptic_agent_op_errors_total{kind="backend_publish"} 0
haptic_agent_op_errors_total{kind="backend_unpublish"} 0
haptic_agent_op_errors_total{kind="ca_new"} 0
haptic_agent_op_errors_total{kind="ca_set"} 0
haptic_agent_op_errors_total{kind="cert_new"} 0
haptic_agent_op_errors_total{kind="cert_set"} 0
haptic_agent_op_errors_total{kind="crtlist_add"} 0
haptic_agent_op_errors_total{kind="crtlist_del"} 0
haptic_agent_op_errors_total{kind="map_add"} 0
haptic_agent_op_errors_total{kind="map_del"} 0
haptic_agent_op_errors_total{kind="map_replace"} 0
haptic_agent_op_errors_total{kind="map_set"} 0
haptic_agent_op_errors_total{kind="server_add"} 1
haptic_agent_op_errors_total{kind="server_del"} 0
haptic_agent_op_errors_total{kind="server_disable"} 0
haptic_agent_op_errors_total{kind="server_enable"} 0
haptic_agent_op_errors_total{kind="server_set_addr"} 0
haptic_agent_op_errors_total{kind="server_set_state"} 0
haptic_agent_op_errors_total{kind="server_set_weight"} 0
haptic_agent_op_errors_total{kind="shutdown_sessions"} 0
haptic_agent_op_errors_total{kind="unknown"} 0
haptic_agent_op_errors_total{kind="wait_be_removable"} 0
haptic_agent_op_errors_total{kind="wait_srv_removable"} 0
haptic_agent_op_errors_total{kind="we\"ird\\kind\nx"} 1
# HELP haptic_agent_map_divergence_total Read-backs that found the running worker diverging from the files on disk.
# TYPE haptic_agent_map_divergence_total counter
haptic_agent_map_divergence_total 1
# HELP haptic_agent_generation The apply generation of the state the agent serves.
# TYPE haptic_agent_generation gauge
haptic_agent_generation 7
# HELP haptic_agent_auth_failures_total Requests to the API that failed authentication, by scheme.
# TYPE haptic_agent_auth_failures_total counter
haptic_agent_auth_failures_total{scheme="basic"} 2
haptic_agent_auth_failures_total{scheme="tls"} 0
# HELP haptic_agent_connections_refused_total Connections reset because their listener held its cap of connections (refused at once, or evicted before they authenticated), by listener.
# TYPE haptic_agent_connections_refused_total counter
haptic_agent_connections_refused_total{listener="admin"} 0
haptic_agent_connections_refused_total{listener="api"} 0
haptic_agent_connections_refused_total{listener="drain"} 0
haptic_agent_connections_refused_total{listener="metrics"} 1
# HELP haptic_agent_state_log_broken 1 while the agent's state log is broken (a synced write failed and no snapshot has been written since): applies and plan uploads are refused and /readyz answers 503; 0 otherwise.
# TYPE haptic_agent_state_log_broken gauge
haptic_agent_state_log_broken 0
# HELP haptic_agent_disk_behind 1 while the tree does not hold files the agent answered for: installing them failed, and is retried.
# TYPE haptic_agent_disk_behind gauge
haptic_agent_disk_behind 0
# HELP haptic_agent_late_mount 1 once a mount made under the tree after the agent started refused a push: pushes that touch it are refused and /readyz answers 503 until the agent restarts.
# TYPE haptic_agent_late_mount gauge
haptic_agent_late_mount 0
# HELP haptic_agent_build_info Always 1; the label version is the agent's build version, as its state reports it.
# TYPE haptic_agent_build_info gauge
haptic_agent_build_info{version="v0.0.0-20261205020225-7510591d4e92+dirty"} 1
`
	var b strings.Builder
	if err := m.writeText(&b); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != want {
		t.Errorf("exposition differs\n got:\n%s\nwant:\n%s", got, want)
	}

	// Two labels sort by the first, then the second; HELP escapes backslash
	// and newline; an open label set starts empty.
	c := newCounterVec("t_total", "first line\nback\\slash", []string{"a", "b"})
	c.inc("y", "1")
	c.inc("x", "2")
	c.inc("x", "10")
	c.inc("x", "10")
	wantSmall := `# HELP t_total first line\nback\\slash
# TYPE t_total counter
t_total{a="x",b="10"} 2
t_total{a="x",b="2"} 1
t_total{a="y",b="1"} 1
`
	if got := string(c.appendText(nil)); got != wantSmall {
		t.Errorf("small family differs\n got:\n%s\nwant:\n%s", got, wantSmall)
	}
}

// TestMetricsExpositionParsesBackIntoEveryFamily reads the exposition with
// an independent parser and checks its structure and every family's values.
func TestMetricsExpositionParsesBackIntoEveryFamily(t *testing.T) {
	const version = "v2 \\ \"x\"\n" // a link flag may set any text
	m := newAgentMetrics(version)
	m.applyTotal.inc(ResultNoop)
	m.applyRejected.inc(StageScheduledReload)
	m.invariantViolations.inc("recovery_reload")
	m.invariantViolations.inc("recovery_reload")
	m.reloads.inc("ok")
	m.rollbacks.inc()
	m.deferredDeletes.inc("backend", "superseded")
	m.opErrors.inc("unknown")
	m.opErrors.inc("a\\b\"c\nd")
	m.mapDivergence.inc()
	m.mapDivergence.inc()
	m.mapDivergence.inc()
	m.generation.set(1<<63 + 5)
	m.authFailures.inc(authSchemeTLS)
	m.connsRefused.inc(listenerAPI)
	m.connsRefused.inc(listenerAPI)
	m.stateLogBroken.set(1)

	var b strings.Builder
	if err := m.writeText(&b); err != nil {
		t.Fatal(err)
	}
	families, err := parseExposition(b.String())
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, b.String())
	}

	wantOrder := []string{
		"haptic_agent_apply_total", "haptic_agent_apply_rejected_total",
		"haptic_agent_invariant_violations_total", "haptic_agent_reloads_total",
		"haptic_agent_rollbacks_total", "haptic_agent_deferred_deletes_total",
		"haptic_agent_op_errors_total", "haptic_agent_map_divergence_total",
		"haptic_agent_generation", "haptic_agent_auth_failures_total",
		"haptic_agent_connections_refused_total", "haptic_agent_state_log_broken", "haptic_agent_disk_behind",
		"haptic_agent_late_mount", "haptic_agent_build_info",
	}
	var order []string
	for _, f := range families {
		order = append(order, f.name)
	}
	if !slices.Equal(order, wantOrder) {
		t.Fatalf("families %v, want %v", order, wantOrder)
	}

	// Every op kind is a series from the start, as is unknown.
	opErrorsWant := map[string]uint64{"kind=a\\b\"c\nd": 1, `kind=unknown`: 1}
	for _, kind := range opKinds {
		opErrorsWant["kind="+kind] = 0
	}
	type row struct {
		typ    string
		series map[string]uint64 // by the series' label text, "" when unlabelled
	}
	want := map[string]row{
		"haptic_agent_apply_total": {"counter", map[string]uint64{
			`mode=file_only`: 0, `mode=noop`: 1, `mode=rejected`: 0,
			`mode=reload`: 0, `mode=runtime`: 0, `mode=scheduled`: 0}},
		"haptic_agent_apply_rejected_total": {"counter", map[string]uint64{
			`stage=backup`: 0, `stage=fencing`: 0, `stage=parts`: 0, `stage=reload`: 0,
			`stage=revert`: 0, `stage=revert_reload`: 0, `stage=scheduled_reload`: 1, `stage=write`: 0}},
		"haptic_agent_invariant_violations_total": {"counter", map[string]uint64{
			`name=disk_is_the_desired_set`: 0, `name=generation_monotonic`: 0,
			`name=journal_only_while_diverged`: 0, `name=mount_probe_found_every_mount`: 0,
			`name=noop_runs_no_ops`: 0, `name=ops_executable`: 0, `name=recovery_reload`: 2,
			`name=reload_mode_reloads`: 0, `name=runtime_mode_does_not_reload`: 0}},
		"haptic_agent_reloads_total":   {"counter", map[string]uint64{`result=failed`: 0, `result=ok`: 1}},
		"haptic_agent_rollbacks_total": {"counter", map[string]uint64{``: 1}},
		"haptic_agent_deferred_deletes_total": {"counter", map[string]uint64{
			`kind=backend,outcome=abandoned`: 0, `kind=backend,outcome=deferred`: 0,
			`kind=backend,outcome=done`: 0, `kind=backend,outcome=superseded`: 1,
			`kind=server,outcome=abandoned`: 0, `kind=server,outcome=deferred`: 0,
			`kind=server,outcome=done`: 0, `kind=server,outcome=superseded`: 0}},
		"haptic_agent_op_errors_total":      {"counter", opErrorsWant},
		"haptic_agent_map_divergence_total": {"counter", map[string]uint64{``: 3}},
		"haptic_agent_generation":           {"gauge", map[string]uint64{``: 1<<63 + 5}},
		"haptic_agent_auth_failures_total":  {"counter", map[string]uint64{`scheme=basic`: 0, `scheme=tls`: 1}},
		"haptic_agent_connections_refused_total": {"counter", map[string]uint64{
			`listener=admin`: 0, `listener=api`: 2, `listener=drain`: 0, `listener=metrics`: 0}},
		"haptic_agent_state_log_broken": {"gauge", map[string]uint64{``: 1}},
		"haptic_agent_disk_behind":      {"gauge", map[string]uint64{``: 0}},
		"haptic_agent_late_mount":       {"gauge", map[string]uint64{``: 0}},
		"haptic_agent_build_info":       {"gauge", map[string]uint64{"version=" + version: 1}},
	}
	for _, f := range families {
		w := want[f.name]
		if f.typ != w.typ {
			t.Errorf("%s: TYPE %q, want %q", f.name, f.typ, w.typ)
		}
		if f.help == "" {
			t.Errorf("%s: empty HELP", f.name)
		}
		got := map[string]uint64{}
		var keys [][]string
		for _, s := range f.series {
			var parts []string
			for _, l := range s.labels {
				parts = append(parts, l.name+"="+l.value)
			}
			got[strings.Join(parts, ",")] = s.value
			var values []string
			for _, l := range s.labels {
				values = append(values, l.value)
			}
			keys = append(keys, values)
		}
		if len(got) != len(f.series) {
			t.Errorf("%s: duplicate series", f.name)
		}
		if !maps.Equal(got, w.series) {
			t.Errorf("%s: series %v, want %v", f.name, got, w.series)
		}
		if !slices.IsSortedFunc(keys, slices.Compare) {
			t.Errorf("%s: series are not sorted by label values: %q", f.name, keys)
		}
	}
}

// parsedFamily is one family as an independent reader of the text format
// 0.0.4 sees it.
type parsedFamily struct {
	name, help, typ string
	series          []parsedSeries
}

type parsedSeries struct {
	labels []parsedLabel
	value  uint64
}

type parsedLabel struct{ name, value string }

// parseExposition is a strict reader of the subset the agent writes: every
// family opens with "# HELP" then "# TYPE", each sample names its family,
// label values are quoted with the three escapes, values are unsigned
// decimal integers, and the text ends with a newline.
func parseExposition(text string) ([]parsedFamily, error) {
	if !strings.HasSuffix(text, "\n") {
		return nil, errors.New("exposition does not end with a newline")
	}
	var families []parsedFamily
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# HELP "):
			name, help, ok := strings.Cut(strings.TrimPrefix(line, "# HELP "), " ")
			if !ok || seen[name] {
				return nil, fmt.Errorf("line %d: bad or repeated HELP: %q", n, line)
			}
			seen[name] = true
			families = append(families, parsedFamily{name: name, help: help})
		case strings.HasPrefix(line, "# TYPE "):
			name, typ, ok := strings.Cut(strings.TrimPrefix(line, "# TYPE "), " ")
			if !ok || len(families) == 0 || families[len(families)-1].name != name ||
				families[len(families)-1].typ != "" {
				return nil, fmt.Errorf("line %d: TYPE not right after its HELP: %q", n, line)
			}
			if typ != "counter" && typ != "gauge" {
				return nil, fmt.Errorf("line %d: unknown type %q", n, typ)
			}
			families[len(families)-1].typ = typ
		default:
			if len(families) == 0 || families[len(families)-1].typ == "" {
				return nil, fmt.Errorf("line %d: sample before HELP and TYPE: %q", n, line)
			}
			f := &families[len(families)-1]
			s, name, err := parseSample(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
			if name != f.name {
				return nil, fmt.Errorf("line %d: sample %s inside family %s", n, name, f.name)
			}
			f.series = append(f.series, s)
		}
	}
	return families, sc.Err()
}

func parseSample(line string) (parsedSeries, string, error) {
	var s parsedSeries
	end := strings.IndexAny(line, "{ ")
	if end <= 0 {
		return s, "", fmt.Errorf("no metric name in %q", line)
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			eq := strings.Index(rest, `="`)
			if eq <= 0 {
				return s, "", fmt.Errorf("bad label in %q", line)
			}
			label := parsedLabel{name: rest[:eq]}
			rest = rest[eq+2:]
			var v strings.Builder
			for {
				if rest == "" {
					return s, "", fmt.Errorf("unterminated label value in %q", line)
				}
				c := rest[0]
				rest = rest[1:]
				if c == '"' {
					break
				}
				if c == '\\' {
					if rest == "" {
						return s, "", fmt.Errorf("dangling escape in %q", line)
					}
					switch rest[0] {
					case '\\':
						v.WriteByte('\\')
					case '"':
						v.WriteByte('"')
					case 'n':
						v.WriteByte('\n')
					default:
						return s, "", fmt.Errorf("unknown escape \\%c in %q", rest[0], line)
					}
					rest = rest[1:]
					continue
				}
				v.WriteByte(c)
			}
			label.value = v.String()
			s.labels = append(s.labels, label)
			if strings.HasPrefix(rest, ",") {
				rest = rest[1:]
				continue
			}
			if !strings.HasPrefix(rest, "}") {
				return s, "", fmt.Errorf("label set not closed in %q", line)
			}
			rest = rest[1:]
			break
		}
	}
	if !strings.HasPrefix(rest, " ") {
		return s, "", fmt.Errorf("no space before the value in %q", line)
	}
	v, err := strconv.ParseUint(rest[1:], 10, 64)
	if err != nil {
		return s, "", fmt.Errorf("value of %q is not a decimal integer", line)
	}
	s.value = v
	return s, name, nil
}

func TestMetricsDropAMisusedLabelCountAndCapTheSeries(t *testing.T) {
	m := newAgentMetrics("dev")
	m.reloads.inc()            // one label expected
	m.reloads.inc("ok", "two") // one label expected
	m.rollbacks.inc("extra")   // no label expected
	if got := m.reloads.value("ok"); got != 0 {
		t.Errorf("reloads{ok} = %d after misused calls, want 0", got)
	}
	if got := m.rollbacks.value(); got != 0 {
		t.Errorf("rollbacks = %d after a misused call, want 0", got)
	}
	if got := m.reloads.value("never"); got != 0 {
		t.Errorf("an absent series reads %d, want 0", got)
	}

	for i := range maxSeriesPerFamily + 10 {
		m.opErrors.inc("kind" + strconv.Itoa(i))
	}
	if got := len(m.opErrors.series); got != maxSeriesPerFamily {
		t.Errorf("op_errors holds %d series, want the cap %d", got, maxSeriesPerFamily)
	}
	m.opErrors.inc("kind0")
	if got := m.opErrors.value("kind0"); got != 2 {
		t.Errorf("an existing series past the cap counts %d, want 2", got)
	}
}

func TestMetricsAreSafeForConcurrentUse(t *testing.T) {
	m := newAgentMetrics("dev")
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				m.applyTotal.inc(ResultRuntime)
				m.opErrors.inc(opKindsForTest[(w+i)%len(opKindsForTest)])
				m.generation.set(uint64(i))
				if i%50 == 0 {
					var b strings.Builder
					if err := m.writeText(&b); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if got := m.applyTotal.value(ResultRuntime); got != workers*rounds {
		t.Errorf("apply_total{runtime} = %d, want %d", got, workers*rounds)
	}
	var total uint64
	for _, k := range opKindsForTest {
		total += m.opErrors.value(k)
	}
	if total != workers*rounds {
		t.Errorf("op_errors total = %d, want %d", total, workers*rounds)
	}
}

var opKindsForTest = []string{OpBackendAdd, OpServerAdd, OpBackendDel, "unknown"}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestMetricsWriteTextReportsAWriteError(t *testing.T) {
	if err := newAgentMetrics("dev").writeText(failingWriter{}); err == nil || err.Error() != "connection reset" {
		t.Errorf("writeText error = %v, want the writer's error", err)
	}
}

// value reads the series with these label values; 0 when it does not exist.
func (c *metricFamily) value(labelValues ...string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.series {
		if slices.Equal(s.labelValues, labelValues) {
			return s.value
		}
	}
	return 0
}
