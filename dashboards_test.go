// The tests that keep deploy/grafana and deploy/prometheus true to the
// agent's metrics: every metric, label and label value a dashboard query or
// an alerting rule names is one the agent exposes (or one Prometheus and
// kube-state-metrics add, from a short list), every per-agent query tells
// agents apart by pod or else by instance, the rules file has the shape
// Prometheus loads and pages only where HAProxy may run a configuration
// nobody chose, and the README's table lists every alert. promtool checks
// the rules for real in CI (.ci/contract); these tests need nothing but
// the files.

package haptic

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/haptic-agent/haptic/internal/yamlsubset"
)

// exposedFamily is one metric family as the agent exposes it.
type exposedFamily struct {
	typ    string
	labels []string
	// values are each label's values among the series present from the
	// start: all of them for a closed label set, none for an open one.
	values map[string][]string
}

// exposedFamilies are the agent's families, by name, read from a new
// agent's metrics.
func exposedFamilies() map[string]exposedFamily {
	out := map[string]exposedFamily{}
	for _, f := range newAgentMetrics("dev").families {
		e := exposedFamily{typ: f.typ, labels: f.labels, values: map[string][]string{}}
		f.mu.Lock()
		for _, s := range f.series {
			for i, l := range f.labels {
				if !slices.Contains(e.values[l], s.labelValues[i]) {
					e.values[l] = append(e.values[l], s.labelValues[i])
				}
			}
		}
		f.mu.Unlock()
		for _, l := range f.labels {
			slices.Sort(e.values[l])
		}
		out[f.name] = e
	}
	return out
}

// exposedSeries is each family's label values, by label name.
func exposedSeries(t *testing.T) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	for name, f := range exposedFamilies() {
		out[name] = f.values
	}
	return out
}

// externalMetrics are the series the rules read that Prometheus's other
// exporters provide, with their labels: kube-state-metrics' readiness of
// the agent's container, since an agent that is not ready cannot be
// trusted to say so on its own metrics.
var externalMetrics = map[string][]string{
	"kube_pod_container_status_ready": {"namespace", "pod", "container"},
}

// targetLabels are the labels a scrape adds to every series of an agent:
// Prometheus's own, and those the kubernetes-pods job sets.
var targetLabels = []string{"namespace", "pod", "instance", "job"}

// promWords are the PromQL functions, aggregations and keywords the files
// may use; any other bare word is a metric name.
var promWords = []string{
	"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "delta", "label_values",
	"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
}

// promQuery is one PromQL expression of a file, and the labels its
// legend or annotations print.
type promQuery struct {
	where, expr string
	printed     []string
}

var (
	promToken   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|"(?:[^"\\]|\\.)*"|[A-Za-z_:][A-Za-z0-9_:]*|\S`)
	promMatcher = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$`)
	legendLabel = regexp.MustCompile(`\{\{\s*(?:\$labels\.)?([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
	// annotationLabel is a label an alert's template prints, wherever it
	// stands in the template ({{ or $labels.pod $labels.instance }}).
	annotationLabel = regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`)
	labelValues     = regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)
)

// checkPromQL fails the test for every metric, label or label value q names
// that the agent does not expose. A label value with a dashboard variable
// in it is not checked; an op kind of op_errors_total is any Op* kind or
// unknown, the family's label set being open.
func checkPromQL(t *testing.T, q promQuery, families map[string]exposedFamily, opKindValues []string) {
	t.Helper()
	expr := q.expr
	printed := slices.Clone(q.printed)
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		expr, printed = m[1], append(printed, m[2])
	}
	tokens := promToken.FindAllString(expr, -1)
	var metrics []string
	labelsOf := map[string]bool{}
	for _, l := range targetLabels {
		labelsOf[l] = true
	}
	var grouping []string
	var outer []string // the first aggregation's by list: the result's labels
	for i := 0; i < len(tokens); i++ {
		tok := tokens[i]
		next := ""
		if i+1 < len(tokens) {
			next = tokens[i+1]
		}
		switch {
		case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, tok) && next == "(":
			var list []string
			for i += 2; i < len(tokens) && tokens[i] != ")"; i++ {
				if tokens[i] != "," {
					list = append(list, tokens[i])
				}
			}
			grouping = append(grouping, list...)
			if tok == "by" && outer == nil {
				outer = list
			}
		case slices.Contains(promWords, tok) || next == "(" || !isIdent(tok):
		default:
			labels, known := families[tok].labels, true
			if _, ok := families[tok]; !ok {
				labels, known = externalMetrics[tok]
				if !known {
					t.Errorf("%s: %q names the metric %s, which the agent does not expose", q.where, q.expr, tok)
					continue
				}
			}
			metrics = append(metrics, tok)
			for _, l := range labels {
				labelsOf[l] = true
			}
			if strings.HasPrefix(next, "{") {
				checkMatchers(t, q, tok, next, families, opKindValues)
				i++
			}
		}
	}
	if len(metrics) == 0 {
		t.Errorf("%s: %q names no metric", q.where, q.expr)
	}
	for _, l := range grouping {
		if !labelsOf[l] {
			t.Errorf("%s: %q groups by %s, which no series it reads carries", q.where, q.expr, l)
		}
	}
	for _, l := range printed {
		if outer != nil && !slices.Contains(outer, l) || outer == nil && !labelsOf[l] {
			t.Errorf("%s: prints the label %s, which %q does not keep", q.where, l, q.expr)
		}
	}
}

func isIdent(tok string) bool {
	return tok != "" && (tok[0] == '_' || tok[0] == ':' || tok[0] >= 'a' && tok[0] <= 'z' || tok[0] >= 'A' && tok[0] <= 'Z')
}

// checkMatchers checks the matchers of one selector of metric.
func checkMatchers(t *testing.T, q promQuery, metric, block string, families map[string]exposedFamily, opKindValues []string) {
	t.Helper()
	family, ours := families[metric]
	for _, m := range strings.Split(strings.Trim(block, "{}"), ",") {
		if strings.TrimSpace(m) == "" {
			continue
		}
		parts := promMatcher.FindStringSubmatch(m)
		if parts == nil {
			t.Errorf("%s: %q: cannot read the matcher %q", q.where, q.expr, m)
			continue
		}
		label, op, value := parts[1], parts[2], parts[3]
		switch {
		case slices.Contains(targetLabels, label):
		case !ours && slices.Contains(externalMetrics[metric], label):
		case !ours || !slices.Contains(family.labels, label):
			t.Errorf("%s: %q matches the label %s, which %s does not carry", q.where, q.expr, label, metric)
		case strings.Contains(value, "$") || op == "=~" || op == "!~":
		default:
			known := family.values[label]
			if metric == "haptic_agent_op_errors_total" && label == "kind" {
				known = opKindValues
			}
			if !slices.Contains(known, value) {
				t.Errorf("%s: %q matches %s=%q, which %s never carries (it carries %v)", q.where, q.expr, label, value, metric, known)
			}
		}
	}
}

// dashboardQueries are the queries of the Grafana dashboard: every
// panel's targets and every templating variable's query.
func dashboardQueries(t *testing.T) ([]promQuery, map[string]any) {
	t.Helper()
	b, err := os.ReadFile("deploy/grafana/haptic-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/haptic-agent.json: %v", err)
	}
	var out []promQuery
	for _, p := range anyList(dash["panels"]) {
		title, _ := node(p, "title").(string)
		for _, target := range anyList(node(p, "targets")) {
			expr, _ := node(target, "expr").(string)
			legend, _ := node(target, "legendFormat").(string)
			var printed []string
			for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
				printed = append(printed, m[1])
			}
			out = append(out, promQuery{where: fmt.Sprintf("panel %q %v", title, node(target, "refId")), expr: expr, printed: printed})
		}
	}
	for _, v := range anyList(node(dash, "templating", "list")) {
		if q, ok := node(v, "query", "query").(string); ok {
			out = append(out, promQuery{where: fmt.Sprintf("variable %v", node(v, "name")), expr: q})
		}
	}
	return out, dash
}

// rulesFile reads a Prometheus rules file, or its unit tests, with the
// YAML subset reader.
func rulesFile(t *testing.T, name string) map[string]any {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("deploy", "prometheus", name))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := yamlsubset.Parse(string(src))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return mapNode(doc)
}

func TestDashboardAndRulesNameOnlyExposedMetrics(t *testing.T) {
	families := exposedFamilies()
	opKindValues := append(slices.Clone(opKinds[:]), "unknown") // firstFailedKind's fallback
	queries, _ := dashboardQueries(t)
	onDashboard := map[string]bool{}
	for _, q := range queries {
		checkPromQL(t, q, families, opKindValues)
		for name := range families {
			if strings.Contains(q.expr, name) {
				onDashboard[name] = true
			}
		}
	}
	for name := range families {
		if !onDashboard[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}

	for _, g := range anyList(rulesFile(t, "haptic-agent-rules.yaml")["groups"]) {
		for _, r := range anyList(node(g, "rules")) {
			q := promQuery{where: fmt.Sprintf("rule %v", node(r, "alert")), expr: node(r, "expr").(string)}
			for _, a := range mapNode(r, "annotations") {
				for _, m := range annotationLabel.FindAllStringSubmatch(a.(string), -1) {
					q.printed = append(q.printed, m[1])
				}
			}
			checkPromQL(t, q, families, opKindValues)
		}
	}
	// The series the rules' unit tests feed are series an agent exposes.
	for _, tc := range anyList(rulesFile(t, "haptic-agent-rules.test.yaml")["tests"]) {
		for _, s := range anyList(node(tc, "input_series")) {
			checkPromQL(t, promQuery{where: "haptic-agent-rules.test.yaml", expr: node(s, "series").(string)}, families, opKindValues)
		}
	}
}

// TestDashboardNamesEachAgentByPodElseInstance holds every per-agent query
// of the dashboard to the key that tells agents apart on both paths: the
// pod where the scrape sets one (Kubernetes), else the scrape's instance (a
// VM, whose series carry no pod). A query grouped by pod alone collapses a
// fleet of VMs into one line.
func TestDashboardNamesEachAgentByPodElseInstance(t *testing.T) {
	const podIntoInstance = `, "instance", "$1", "pod", "(.+)")`
	queries, _ := dashboardQueries(t)
	perAgent := 0
	for _, q := range queries {
		by := regexp.MustCompile(`\bby \(([^)]*)\)`).FindStringSubmatch(q.expr)
		if by == nil {
			continue
		}
		keys := strings.Split(strings.ReplaceAll(by[1], " ", ""), ",")
		switch {
		case slices.Contains(keys, "pod"):
			t.Errorf("%s: %q groups by pod, which a VM's agent lacks", q.where, q.expr)
		case slices.Contains(keys, "instance") && !strings.HasSuffix(q.expr, podIntoInstance+")"):
			t.Errorf("%s: %q groups by instance without copying the pod into it first (label_replace(...%s)", q.where, q.expr, podIntoInstance)
		case slices.Contains(keys, "instance"):
			perAgent++
		}
	}
	if perAgent == 0 {
		t.Error("the dashboard has no per-agent query")
	}
}

// TestAlertingRulesHaveTheShapePrometheusLoads checks what promtool would
// refuse, and what an operator needs: a severity to route by and a summary
// that says what to do, for each of the alerts the agent's failures need.
// No critical alert reads a refused apply or a failed reload: HAProxy
// refuses a typo and the agent rolls it back with the previous
// configuration serving, which is a warning; a page is for a rollback that
// could not reload a configuration anyone chose (recovery_reload).
func TestAlertingRulesHaveTheShapePrometheusLoads(t *testing.T) {
	doc := rulesFile(t, "haptic-agent-rules.yaml")
	if keys := slices.Sorted(maps.Keys(doc)); !slices.Equal(keys, []string{"groups"}) {
		t.Errorf("the rules file holds %v, want only groups", keys)
	}
	alertName := regexp.MustCompile(`^HapticAgent[A-Z][A-Za-z]+$`)
	duration := regexp.MustCompile(`^[0-9]+[smh]$`)
	seen := map[string]bool{}
	var exprs []string
	for _, g := range anyList(doc["groups"]) {
		if name, _ := node(g, "name").(string); name == "" || len(anyList(node(g, "rules"))) == 0 {
			t.Errorf("a group without a name or rules: %v", g)
		}
		for _, r := range anyList(node(g, "rules")) {
			rule := mapNode(r)
			name, _ := rule["alert"].(string)
			for k := range rule {
				if !slices.Contains([]string{"alert", "expr", "for", "labels", "annotations"}, k) {
					t.Errorf("alert %s: unknown key %s", name, k)
				}
			}
			expr, _ := rule["expr"].(string)
			summary, _ := node(rule, "annotations", "summary").(string)
			description, _ := node(rule, "annotations", "description").(string)
			switch {
			case !alertName.MatchString(name) || seen[name]:
				t.Errorf("alert %q: want a unique HapticAgent... name", name)
			case expr == "":
				t.Errorf("alert %s has no expression", name)
			case rule["for"] != nil && !duration.MatchString(rule["for"].(string)):
				t.Errorf("alert %s: for %v is no duration", name, rule["for"])
			case !slices.Contains([]any{"critical", "warning"}, node(rule, "labels", "severity")):
				t.Errorf("alert %s: severity %v, want critical or warning", name, node(rule, "labels", "severity"))
			case summary == "" || strings.Contains(summary, "\n") || !strings.Contains(summary, "; "):
				t.Errorf("alert %s: the summary must say on one line what happened; then what to do: %q", name, summary)
			case strings.TrimSpace(description) == "":
				t.Errorf("alert %s has no description", name)
			}
			if node(rule, "labels", "severity") == "critical" &&
				(strings.Contains(expr, "haptic_agent_apply_rejected_total") || strings.Contains(expr, "haptic_agent_reloads_total")) {
				t.Errorf("alert %s pages on a refused apply or a failed reload, which the agent rolled back: %s", name, expr)
			}
			seen[name] = true
			exprs = append(exprs, expr)
		}
	}
	for _, concern := range []string{"haptic_agent_invariant_violations_total", "haptic_agent_apply_rejected_total",
		`haptic_agent_invariant_violations_total{name="recovery_reload"}`, "haptic_agent_map_divergence_total", "kube_pod_container_status_ready"} {
		if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, concern) }) {
			t.Errorf("no alert reads %s", concern)
		}
	}
}

// TestREADMEListsEveryAlert holds the README's table of alerts to the rules
// file: every alert there, with its severity, and nothing else.
func TestREADMEListsEveryAlert(t *testing.T) {
	rules := map[string]string{}
	for _, g := range anyList(rulesFile(t, "haptic-agent-rules.yaml")["groups"]) {
		for _, r := range anyList(node(g, "rules")) {
			rules[node(r, "alert").(string)], _ = node(r, "labels", "severity").(string)
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Dashboards and alerts\n")
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `(HapticAgent[A-Za-z]+)` \\| ([a-z]+) \\|")
	table := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		table[m[1]] = m[2]
	}
	for name, severity := range rules {
		if got, ok := table[name]; !ok || got != severity {
			t.Errorf("the README's table of alerts lists %s as %q, the rules file as %q", name, got, severity)
		}
	}
	for name := range table {
		if _, ok := rules[name]; !ok {
			t.Errorf("the README's table of alerts lists %s, which the rules file lacks", name)
		}
	}
}
