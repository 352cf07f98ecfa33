// Tests of the reasons the agent logs for a reload.

package haptic

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// applyLogReasons are the reload_reason values of the "apply" log lines.
func applyLogReasons(t *testing.T, logs string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec struct {
			Msg    string `json:"msg"`
			Reason string `json:"reload_reason"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "apply" && rec.Reason != "" {
			out = append(out, rec.Reason)
		}
	}
	return out
}

// The log line of a reload the controller asked for carries Diff's
// reasons, not the mode.
func TestAgentLogsWhyItReloads(t *testing.T) {
	logs := &lockedBuffer{}
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	client, err := NewClient(&ClientConfig{BaseURL: "http://" + a.Addr(), Username: "haptic", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const config = "global\n    maxconn 100\n\nbackend web-servers\n    server web1 10.0.0.1:80\n"
	for _, cfg := range []string{config, config + "\nbackend api-servers\n    server api1 10.0.0.2:80\n"} {
		next := planOfFiles(t, map[string]string{"haproxy.cfg": cfg, "maps/host.map": "a.example.com web-servers\n"})
		if res, err := Deploy(t.Context(), client, next, DeployOptions{LeaderEpoch: 1}); err != nil || !res.OK || res.Mode != ResultReload {
			t.Fatalf("deploy: %+v %v", res, err)
		}
	}
	if got, want := applyLogReasons(t, logs.String()), []string{"no baseline", "core section backend api-servers added"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("reload reasons logged %q, want %q", got, want)
	}
}
