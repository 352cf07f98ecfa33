// The tests that keep deploy/grafana and deploy/prometheus true to the
// agent's metrics: every metric, label and label value a dashboard query or
// an alerting rule names is one the agent exposes (or one Prometheus and
// kube-state-metrics add, from a short list), and the rules file has the
// shape Prometheus loads. promtool checks the rules for real in CI
// (.ci/contract); this test needs nothing but the files.

package haptic

import (
	"slices"
	"testing"
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
	for _, f := range newAgentMetrics().families {
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
