// This file owns the proof, on a real HAProxy (HAPTIC_HAPROXY), that what
// one version cannot take at runtime reaches the worker by a reload and is
// reported as that version's limit: a certificate whose PEM holds an
// empty line, which HAProxy before 3.0 takes for the end of the payload.
//
// It must never talk to an HAProxy HAPTIC_HAPROXY did not name, and never
// write the agent's files itself: the renders go through Deploy.

package haptic

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// TestRealHAProxyTakesACertificateWithABlankLine deploys a PEM with an
// empty line between its certificate and its key. From 3.0 the agent
// frames it with its own terminator and the running worker serves it; 2.6
// ends every payload at an empty line, so there the agent refuses the op
// as a limit of the version, reloads instead, and the new worker serves it.
func TestRealHAProxyTakesACertificateWithABlankLine(t *testing.T) {
	logs := &lockedBuffer{}
	e := startE2E(t, func(c *AgentConfig) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	r1 := e.firstRender(t)
	expectMode(t, e.deploy(t, e.plan(r1)), ResultReload)
	pid := e.workerPID(t)

	cert, key := e.ca.issue(t, testCertOptions{CommonName: "site blank", DNSNames: []string{"site.test"}})
	next := r1.with(func(r *e2eRender) { r.certPEM = string(cert) + "\n" + string(key) })
	res := e.deploy(t, e.plan(next))
	if served := e.servedCert(t); served.Subject.CommonName != "site blank" {
		t.Fatalf("served %q, want the certificate with the blank line", served.Subject.CommonName)
	}
	_, err := compileOp(&Op{Kind: OpCertSet, Path: e2eCert}, contentOf(map[string]string{e2eCert: next.certPEM}), e.a.rt.terminator())

	if e.caps.DynamicServers { // custom terminators came with 3.0
		expectMode(t, res, ResultRuntime)
		if got := resultOpKinds(res); !slices.Equal(got, []string{OpCertSet}) || err != nil {
			t.Fatalf("ops %v, compile %v: want one cert_set that compiles", got, err)
		}
		if got := e.workerPID(t); got != pid {
			t.Fatalf("worker pid changed from %d to %d", pid, got)
		}
		return
	}
	expectMode(t, res, ResultReload)
	if got := e.workerPID(t); got == pid {
		t.Fatalf("worker pid %d unchanged: the certificate did not arrive by reload", got)
	}
	if !errors.Is(err, errVersionLimit) || !errors.Is(err, errUnsafeToken) {
		t.Fatalf("compiling for HAProxy %s: %v, want a limit of the version", e.h.Version(), err)
	}
	if !strings.Contains(logs.String(), "the only terminator before HAProxy 3.0") {
		t.Fatalf("the agent's log does not name the version's limit:\n%s", logs.String())
	}
	// A limit of the version is a reason to reload, not a broken invariant.
	if st := e.state(t); st.InvariantViolation != "" || strings.Contains(logs.String(), "invariant violated") {
		t.Fatalf("a version limit was reported as an invariant violation %q:\n%s", st.InvariantViolation, logs.String())
	}
}
