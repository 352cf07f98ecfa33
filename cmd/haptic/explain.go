// explain.go owns how the operator commands put what went wrong into
// words: the credentials a client command read and a refusal of them, an
// agent's error answer, a request that timed out (which step, after how
// long), and HAProxy's own log of a refused configuration, most important
// lines first.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/haptic-agent/haptic"
)

// The two credential pairs a client command reads, in this order: the
// example's and push's own pair, then the agent's, so that a shell that
// starts an agent with DATAPLANE_* can drive it with the same variables.
const (
	credsHaptic    = "HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS"
	credsDataplane = "DATAPLANE_USERNAME/DATAPLANE_PASSWORD"
)

// agentCredentials are the HTTP Basic credentials of a client command and
// the variables they came from ("" when neither pair is set).
type agentCredentials struct {
	user, pass, source string
}

// credentialsFrom reads HAPTIC_AGENT_USER/HAPTIC_AGENT_PASS, or when both
// are empty DATAPLANE_USERNAME/DATAPLANE_PASSWORD. A pair is taken whole:
// a user from one pair and a password from the other would be a
// credential nobody configured.
func credentialsFrom(getenv func(string) string) agentCredentials {
	if u, p := getenv("HAPTIC_AGENT_USER"), getenv("HAPTIC_AGENT_PASS"); u != "" || p != "" {
		return agentCredentials{u, p, credsHaptic}
	}
	if u, p := getenv("DATAPLANE_USERNAME"), getenv("DATAPLANE_PASSWORD"); u != "" || p != "" {
		return agentCredentials{u, p, credsDataplane}
	}
	return agentCredentials{}
}

// refused says what a 401 means for these credentials, with the agent's
// own words (body) when it gave any.
func (c agentCredentials) refused(body string) string {
	status := "HTTP 401"
	if body != "" {
		status += ": " + body
	}
	if c.source == "" {
		return fmt.Sprintf("the agent refused the request (%s); no HTTP Basic credentials were sent: neither %s nor %s is set",
			status, credsHaptic, credsDataplane)
	}
	return fmt.Sprintf("the agent refused the credentials from %s (%s); client commands read %s first, then %s",
		c.source, status, credsHaptic, credsDataplane)
}

// explainErr puts an error of a request to an agent into one line: a 401
// names the credentials' variables, an agent's JSON error answer shows its
// message, a timeout names the request and how long it waited, and a
// connection that could not be made names where it went.
func explainErr(err error, creds agentCredentials, waited time.Duration) string {
	var he *haptic.HTTPError
	if errors.As(err, &he) {
		if he.Status == http.StatusUnauthorized {
			return creds.refused(he.Body)
		}
		var ae haptic.ApplyError
		if json.Unmarshal([]byte(he.Body), &ae) == nil && ae.Message != "" {
			return fmt.Sprintf("%s (HTTP %d, stage %s)", ae.Message, he.Status, ae.Stage)
		}
		return errText(err)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		step := requestStep(ue)
		var oe *net.OpError
		switch {
		case errors.Is(err, context.DeadlineExceeded) || ue.Timeout():
			return fmt.Sprintf("timed out after %s waiting for %s: the agent did not answer", seconds(waited), step)
		case errors.Is(err, context.Canceled):
			return fmt.Sprintf("stopped after %s while waiting for %s", seconds(waited), step)
		case errors.As(err, &oe) && oe.Op == "dial":
			return fmt.Sprintf("cannot reach the agent for %s: %v", step, oe)
		}
		return fmt.Sprintf("%s: %v", step, ue.Err)
	}
	return errText(err)
}

// requestStep names the request of a url.Error as the operator knows it.
func requestStep(ue *url.Error) string {
	path := ue.URL
	if u, err := url.Parse(ue.URL); err == nil {
		path = u.Path
	}
	method := strings.ToUpper(ue.Op)
	for _, known := range [][2]string{{haptic.PathState, "the state read"}, {haptic.PathApply, "the apply"}, {haptic.PathPlan, "storing the plan"},
		{haptic.PathHealthz, "the liveness probe"}, {haptic.PathReadyz, "the readiness probe"}} {
		if strings.HasSuffix(path, known[0]) {
			return method + " " + known[0] + " (" + known[1] + ")"
		}
	}
	return method + " " + path
}

// seconds prints a wait in seconds to a tenth, the precision an operator
// reads a timeout at.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// errText is an error as the command prints it after its own "haptic X: "
// prefix: the package's own "haptic: " prefix would say it twice.
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "haptic: ")
}

// haproxyTag matches the severity tag HAProxy starts a log line with and
// the padding after it.
var haproxyTag = regexp.MustCompile(`^\[(ALERT|WARNING|NOTICE)\]\s+`)

// haproxyLines orders a message that may hold HAProxy's log of a refused
// configuration for an operator: the ALERT lines first, then the WARNING
// lines, then any other line, each in its own order; the NOTICE lines
// (HAProxy's version and executable path, printed on every start) are
// dropped. The full text stays in the agent's log and on the wire. A
// message without any tagged line comes back line by line, unchanged.
func haproxyLines(message string) []string {
	var alerts, warnings, other []string
	for line := range strings.SplitSeq(strings.TrimSpace(message), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		m := haproxyTag.FindStringSubmatch(line)
		if m == nil {
			other = append(other, line)
			continue
		}
		line = "[" + m[1] + "] " + line[len(m[0]):]
		switch m[1] {
		case "ALERT":
			alerts = append(alerts, line)
		case "WARNING":
			warnings = append(warnings, line)
		}
	}
	return append(append(alerts, warnings...), other...)
}
