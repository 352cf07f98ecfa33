// The test that keeps the deployment examples' memory limits at or above
// the bound the agent is held to under hostile uploads: the README states
// it once, TestHostileUploadsStayWithinTheMemoryBound measures it, and a
// container or unit limited below it would be killed by the kernel where
// the agent keeps its word.

package haptic

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/haptic-agent/haptic/internal/yamlsubset"
)

// memoryMiB reads a memory size in MiB: a Kubernetes quantity (binary Ki,
// Mi, Gi or decimal k, M, G suffixes, or bytes) or, with systemd, a
// MemoryMax= value, whose K, M and G are powers of 1024.
func memoryMiB(t *testing.T, value string, systemd bool) float64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|k|K|M|G)?$`).FindStringSubmatch(value)
	if m == nil {
		t.Fatalf("cannot read the memory size %q", value)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	unit := map[string]float64{"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "M": 1e6, "G": 1e9}[m[2]]
	if systemd {
		unit = map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
	}
	if unit == 0 {
		t.Fatalf("the memory size %q has a unit this reader does not know", value)
	}
	return n * unit / (1 << 20)
}

func TestDeployedMemoryLimitsHoldTheHostileUploadsBound(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	stated := fmt.Sprintf("**%d MiB resident**", hostileUploadsPeakMiB)
	if n := strings.Count(string(readme), fmt.Sprintf("%d MiB", hostileUploadsPeakMiB)); n != 1 || !strings.Contains(string(readme), stated) {
		t.Errorf("the README states %d MiB %d time(s), want once, as %s", hostileUploadsPeakMiB, n, stated)
	}

	src, err := os.ReadFile("deploy/kubernetes/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := yamlsubset.Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range anyList(node(doc, "spec", "template", "spec", "containers")) {
		if node(c, "name") != "agent" {
			continue
		}
		found = true
		limit, _ := node(c, "resources", "limits", "memory").(string)
		if mib := memoryMiB(t, limit, false); mib < hostileUploadsPeakMiB {
			t.Errorf("deploy/kubernetes: the agent's memory limit %s is %.0f MiB, below the %d MiB bound", limit, mib, hostileUploadsPeakMiB)
		}
	}
	if !found {
		t.Error("deploy/kubernetes/deployment.yaml has no agent container")
	}

	unit, err := os.ReadFile("deploy/systemd/haptic-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MemoryMax=(\S+)$`).FindAllStringSubmatch(string(unit), -1)
	if len(m) != 1 {
		t.Fatalf("deploy/systemd/haptic-agent.service sets MemoryMax %d time(s), want once", len(m))
	}
	if mib := memoryMiB(t, m[0][1], true); mib < hostileUploadsPeakMiB {
		t.Errorf("deploy/systemd: MemoryMax=%s is %.0f MiB, below the %d MiB bound", m[0][1], mib, hostileUploadsPeakMiB)
	}
}
