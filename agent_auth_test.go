// Tests of how the agent authenticates the controller with HTTP Basic
// (agent_auth.go): the API refuses a request without the right credentials
// while the probes stay open, and --insecure-no-auth lets every route
// answer without any. Mutual TLS is tested in agent_tls_test.go, the
// counting and budget of failures in agent_authfail_test.go.

package haptic

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestAuthenticationIsRequiredForTheAPIButNotTheProbes(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, nil)
	for _, p := range []string{PathHealthz, PathReadyz} {
		if code, _ := getText(t, a, p); code != http.StatusOK {
			t.Errorf("%s without auth: %d", p, code)
		}
	}
	c := newAgentClient(t, a)
	for _, tc := range []struct {
		name, user, pass, method, path string
	}{
		{"no header", "", "", "GET", PathState},
		{"wrong password", "haptic", "wrong", "GET", PathState},
		{"wrong user", "admin", "s3cret", "GET", PathState},
		{"apply without auth", "", "", "POST", PathApply},
		{"plan without auth", "", "", "PUT", PathPlan + "?plan_id=a&proof=b"},
	} {
		c.user, c.pass = tc.user, tc.pass
		code, h, b := c.do(tc.method, tc.path, strings.NewReader("x"), "text/plain")
		if code != http.StatusUnauthorized || h.Get("WWW-Authenticate") != `Basic realm="haptic-agent"` ||
			string(b) != "unauthorized\n" || h.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("%s: %d %q %q", tc.name, code, h.Get("WWW-Authenticate"), b)
		}
	}
	c.user, c.pass = "haptic", "s3cret"
	if st := c.state(""); st.APIVersion != 1 {
		t.Errorf("with auth: %+v", st)
	}
}

func TestInsecureNoAuthAllowsStartingWithoutCredentials(t *testing.T) {
	fake := startTestFake(t, "")
	a := startTestAgent(t, fake, func(c *AgentConfig) {
		c.Username, c.Password, c.InsecureNoAuth = "", "", true
	})
	c := newAgentClient(t, a)
	c.user = ""
	if st := c.state(""); st.APIVersion != 1 {
		t.Errorf("state: %+v", st)
	}
	fs := seedFiles()
	if res := c.apply(c.manifest("plan-1", fs), fs); !res.OK {
		t.Errorf("apply: %+v", res)
	}
	other := planOfFiles(t, map[string]string{"haproxy.cfg": "global\n"})
	if code, _, b := c.do("PUT", PathPlan+"?plan_id="+other.ID+"&proof=y", bytes.NewReader(blobOf(t, other)), ""); code != http.StatusConflict {
		t.Errorf("put plan: %d %s", code, b)
	}
}

// Basic credentials served without TLS on an address other hosts reach
// get one warning at start; on loopback, or with TLS, none.
func TestBasicAuthWithoutTLSOffLoopbackIsWarnedAbout(t *testing.T) {
	const warning = "the API takes HTTP Basic credentials without TLS on a non-loopback address"
	for _, c := range []struct {
		listen, tlsDir string
		warns          bool
	}{
		{":5555", "", true},
		{"0.0.0.0:5555", "", true},
		{"[::]:5555", "", true},
		{"10.0.0.7:5555", "", true},
		{"127.0.0.1:5555", "", false},
		{"127.0.0.2:5555", "", false},
		{"[::1]:5555", "", false},
		{"localhost:5555", "", false},
		{":5555", "/etc/haptic/tls", false},
	} {
		var logs bytes.Buffer
		a := &Agent{cfg: AgentConfig{Listen: c.listen, TLSDir: c.tlsDir, Username: "admin", Password: "admin"},
			logger: slog.New(slog.NewJSONHandler(&logs, nil))}
		a.warnAboutAuth()
		if got := strings.Count(logs.String(), warning); got != map[bool]int{true: 1, false: 0}[c.warns] {
			t.Errorf("listen %q tls-dir %q: %d warning(s):\n%s", c.listen, c.tlsDir, got, logs.String())
		}
	}
}
