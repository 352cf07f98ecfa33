// Tests of a fleet named by DNS (--agents-dns) and of the canary push:
// agents on fake HAProxies, each on a loopback address of its own and all
// on one port, named by one name through a resolver the test scripts; the
// fleet table of `agent state`, its order and its readiness column; TLS
// that verifies the name the operator gave; a canary that stops the push
// and leaves the rest of the fleet untouched.

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// fleetName is the name the test resolver gives the fleet's addresses.
const fleetName = "agents.test"

// testFleet is agents on 127.0.0.2, 127.0.0.3, ... sharing one port.
type testFleet struct {
	agents  []*testAgent
	port    string
	lookups atomic.Int32 // calls of the resolver
}

// startFleet starts n agents, each on its own loopback address and all on
// the port the first one got, so that one name with n addresses and one
// port reaches every one of them, as a headless Service's name does.
func startFleet(t *testing.T, n int, mutate func(*haptic.AgentConfig)) *testFleet {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no loopback address beyond 127.0.0.1 here: %v", err)
	}
	ln.Close()
	f := &testFleet{}
	for i := range n {
		f.agents = append(f.agents, startCLIAgent(t, func(cfg *haptic.AgentConfig) {
			cfg.Listen = net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i+2), cmp.Or(f.port, "0"))
			if mutate != nil {
				mutate(cfg)
			}
		}))
		_, f.port, _ = net.SplitHostPort(f.agents[0].Addr())
	}
	return f
}

// url is the fleet's --agents-dns URL.
func (f *testFleet) url(scheme, name string) string {
	return scheme + "://" + name + ":" + f.port
}

// lookup resolves each of names to every agent's address (in reverse
// order, and one of them twice, as a resolver may answer) and anything
// else to "no such host".
func (f *testFleet) lookup(names ...string) lookupFunc {
	return func(_ context.Context, host string) ([]net.IPAddr, error) {
		f.lookups.Add(1)
		if !slices.Contains(names, host) {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var addrs []net.IPAddr
		for i := len(f.agents) - 1; i >= 0; i-- {
			addrs = append(addrs, net.IPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", i+2))})
		}
		return append(addrs, addrs[0]), nil
	}
}

// urls are the agents' URLs, in address order.
func (f *testFleet) urls() []string {
	var urls []string
	for _, a := range f.agents {
		urls = append(urls, a.URL())
	}
	return urls
}

// matchLines checks that out holds, in order, lines matching each pattern.
func matchLines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(patterns) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(patterns), out)
	}
	for i, p := range patterns {
		if !regexp.MustCompile("^" + p + "$").MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %q", i+1, lines[i], p)
		}
	}
}

// A push to a name reaches every one of its addresses, resolved once;
// `agent state` on the same name prints one row per pod, the pod unlike
// the others first.
func TestPushToAFleetNamedByDNS(t *testing.T) {
	f := startFleet(t, 3, nil)
	lookup := f.lookup(fleetName)
	v1, v2 := planOf(t, "shop-v1"), planOf(t, "shop-v2")
	r := runCLIResolving(t, context.Background(), lookup, pushEnv, "push", "--agents-dns", f.url("http", fleetName), testDir("shop-v1"))
	if r.code != exitOK || r.err != "" {
		t.Fatalf("push: code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
	got := agentLines(r.out, f.urls()...)
	for i, url := range f.urls() {
		if i >= len(got) || !regexp.MustCompile("^"+regexp.QuoteMeta(url)+`: reload: no baseline; reloaded in \d+ ms, worker pid \d+$`).MatchString(got[i]) {
			t.Errorf("lines %q, want one reload line for %s", got, url)
		}
	}
	if !strings.HasSuffix(r.out, "plan "+v1+": 3 of 3 agent(s) took it\n") || f.lookups.Load() != 1 {
		t.Errorf("%d lookups, stdout\n%s", f.lookups.Load(), r.out)
	}
	for _, a := range f.agents {
		if st := agentState(t, a); st.AppliedPlanID != v1 {
			t.Errorf("%s applied %s, want %s", a.URL(), st.AppliedPlanID, v1)
		}
	}

	// One pod moves on: its row comes first.
	if r := runCLI(t, pushEnv, "push", "--agent", f.agents[1].URL(), testDir("shop-v2")); r.code != exitOK {
		t.Fatalf("push to one pod: %d %q", r.code, r.out)
	}
	r = runCLIResolving(t, context.Background(), lookup, pushEnv, "agent", "state", "--agents-dns", f.url("http", fleetName))
	if r.code != exitOK || r.err != "" {
		t.Fatalf("agent state: code %d stderr %q", r.code, r.err)
	}
	matchLines(t, r.out,
		`POD +APPLIED +GENERATION +DISK +READY`,
		regexp.QuoteMeta(f.agents[1].URL())+` +`+v2+` +2 +in step +ready`,
		regexp.QuoteMeta(f.agents[0].URL())+` +`+v1+` +1 +in step +ready`,
		regexp.QuoteMeta(f.agents[2].URL())+` +`+v1+` +1 +in step +ready`,
		`3 pods: 2 alike \(plan `+v1+`, disk in step, ready\), 1 differ`)

	// A name without records fails before anything is pushed.
	r = runCLIResolving(t, context.Background(), lookup, pushEnv, "push", "--agents-dns", "http://nowhere.test:1", testDir("shop-v1"))
	if r.code != exitFailure || r.out != "" || r.err != "haptic push: --agents-dns: lookup nowhere.test: no such host\n" {
		t.Errorf("an unknown name: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
}

// A fleet of pods that cannot be reached names each pod once: its error
// in the summary, and nothing above it.
func TestPushToUnreachablePodsNamesEachOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close() // nothing listens on this port now
	const pods = 30
	lookup := func(context.Context, string) ([]net.IPAddr, error) {
		var addrs []net.IPAddr
		for i := range pods {
			addrs = append(addrs, net.IPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))})
		}
		return addrs, nil
	}
	r := runCLIResolving(t, context.Background(), lookup, pushEnv, "push", "--agents-dns", "http://"+fleetName+":"+port, testDir("shop-v1"))
	if r.code != exitFailure {
		t.Errorf("code %d, want 1", r.code)
	}
	for i := range pods {
		pod := fmt.Sprintf("http://127.0.1.%d:%s: ", i+1, port)
		if n := strings.Count(r.out, pod); n != 1 {
			t.Errorf("%s is named %d times, want once", pod, n)
		}
	}
	if lines := strings.Count(r.out, "\n"); lines != pods+3 {
		t.Errorf("%d lines for %d pods, want one each and the summary's three:\n%s", lines, pods, r.out)
	}
}

// Over TLS each pod is reached at its address and verified by the name
// the operator gave: the URL's host, or --tls-server-name where the
// certificates name something else.
func TestFleetOverTLSVerifiesTheNameGiven(t *testing.T) {
	pki := newTestPKI(t)
	agentDir := linkDir(t, map[string]string{"tls.crt": pki.serverCert, "tls.key": pki.serverKey, "ca.crt": pki.caFile})
	f := startFleet(t, 2, func(cfg *haptic.AgentConfig) {
		cfg.TLSDir, cfg.TLSClientName = agentDir, pki.clientDNSName
		cfg.Username, cfg.Password = "", ""
	})
	const service = "haptic-agent.ns.svc"
	lookup := f.lookup(pki.serverDNSName, service)
	tlsFlags := []string{"--tls-ca", pki.caFile, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey}
	push := func(name string, extra ...string) cliResult {
		args := append(append([]string{"push", "--agents-dns", f.url("https", name)}, tlsFlags...), extra...)
		return runCLIResolving(t, context.Background(), lookup, nil, append(args, testDir("shop-v1"))...)
	}
	// The certificates name agent.test, and so does the URL.
	if r := push(pki.serverDNSName); r.code != exitOK || !strings.HasSuffix(r.out, ": 2 of 2 agent(s) took it\n") {
		t.Errorf("by the certificates' name: code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
	// The Service's name is not the certificates'.
	if r := push(service); r.code != exitFailure || strings.Count(r.out, "certificate is valid for "+pki.serverDNSName+", not "+service) != 2 {
		t.Errorf("by the Service's name alone: code %d stdout\n%s", r.code, r.out)
	}
	if r := push(service, "--tls-server-name", pki.serverDNSName); r.code != exitOK || !strings.Contains(r.out, "noop 2, failed 0\n") {
		t.Errorf("with --tls-server-name: code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
	// agent state takes the same name and flags.
	r := runCLIResolving(t, context.Background(), lookup, nil, append([]string{"agent", "state", "--agents-dns", f.url("https", service),
		"--tls-server-name", pki.serverDNSName}, tlsFlags...)...)
	if r.code != exitOK || !strings.HasSuffix(r.out, "2 pods, all alike (plan "+planOf(t, "shop-v1")+", disk in step, ready)\n") {
		t.Errorf("agent state over TLS: code %d stderr %q stdout\n%s", r.code, r.err, r.out)
	}
}

// A canary that fails stops the push: the pods after it are left
// untouched and named. A canary that passes lets the push go on.
func TestCanaryStopsThePushWhenACanaryFails(t *testing.T) {
	f := startFleet(t, 4, nil)
	lookup := f.lookup(fleetName)
	urls := f.urls()
	f.agents[0].fake.With(func(m *haptic.FakeModel) {
		m.ReloadFails, m.ReloadLog = true, "[ALERT]    (7) : config : Fatal errors found in configuration."
	})
	push := func(dir string, extra ...string) cliResult {
		args := append([]string{"push", "--agents-dns", f.url("http", fleetName)}, extra...)
		return runCLIResolving(t, context.Background(), lookup, pushEnv, append(args, testDir(dir))...)
	}
	v1 := planOf(t, "shop-v1")
	r := push("shop-v1", "--canary", "2")
	matchLines(t, r.out,
		regexp.QuoteMeta(urls[1])+`: reload: no baseline; .*`,
		`summary: runtime 0, file_only 0, reload 1, scheduled 0, noop 0, failed 1`,
		`failed:`,
		`  `+regexp.QuoteMeta(urls[0])+`: rejected at stage "reload"; the pod ran no pushed plan before this push, and the agent names none now:`,
		`      \[ALERT\] \(7\) : config : Fatal errors found in configuration\.`,
		`untouched \(the canary of 2 stopped the push: 1 failed\):`,
		`  `+regexp.QuoteMeta(urls[2]),
		`  `+regexp.QuoteMeta(urls[3]),
		`plan `+v1+`: 1 of 4 agent\(s\) took it, 2 left untouched`)
	if r.code != exitFailure {
		t.Errorf("code %d, want 1", r.code)
	}
	for _, a := range f.agents[2:] {
		if st := agentState(t, a); st.Generation != 0 || st.AppliedPlanID != "" {
			t.Errorf("%s was touched: generation %d, applied %q", a.URL(), st.Generation, st.AppliedPlanID)
		}
	}

	// Mended, the canary passes and the push goes on to the rest. (The
	// agent remembers the plan HAProxy refused, so the next render goes.)
	f.agents[0].fake.With(func(m *haptic.FakeModel) { m.ReloadFails = false })
	v2 := planOf(t, "shop-v2")
	r = push("shop-v2", "--canary", "2")
	if r.code != exitOK || !strings.Contains(r.out, "\ncanary: passed on 2 agents (took the plan as expected, ready after it); pushing the other 2\n") ||
		!strings.HasSuffix(r.out, "plan "+v2+": 4 of 4 agent(s) took it\n") {
		t.Errorf("a canary that passes: code %d stdout\n%s", r.code, r.out)
	}

	// A canary that does not do what --expect says stops the push too.
	r = push("shop-v3", "--canary", "1", "--expect", "runtime", "--quiet")
	matchLines(t, r.out,
		`summary: runtime 0, file_only 0, reload 1, scheduled 0, noop 0, failed 0`,
		`unexpected \(--expect runtime\):`,
		`  `+regexp.QuoteMeta(urls[0])+`: reload: core section backend web-servers changed; reloaded in \d+ ms, worker pid \d+`,
		`untouched \(the canary of 1 stopped the push: 1 not as --expect says\):`,
		`  `+regexp.QuoteMeta(urls[1]),
		`  `+regexp.QuoteMeta(urls[2]),
		`  `+regexp.QuoteMeta(urls[3]),
		`plan `+planOf(t, "shop-v3")+`: 1 of 4 agent\(s\) took it, 1 not as --expect says, 3 left untouched`)
	for _, a := range f.agents[1:] {
		if st := agentState(t, a); st.AppliedPlanID != v2 {
			t.Errorf("%s was touched: applied %q", a.URL(), st.AppliedPlanID)
		}
	}
}

// A canary that took the plan and is not ready after it stops the push;
// readiness is asked of canaries only.
func TestCanaryStopsThePushWhenACanaryIsNotReady(t *testing.T) {
	urls := []string{"http://agent-1", "http://agent-2", "http://agent-3"}
	var out strings.Builder
	var asked []string
	o := pushOptions{parallel: 1, timeout: time.Minute, deadline: time.Minute, canary: 1}
	p := pushAll(context.Background(), &out, urls, o, func(_ context.Context, url string, canary bool) pushResult {
		asked = append(asked, fmt.Sprintf("%s canary=%t", url, canary))
		return pushResult{result: &haptic.ApplyResult{OK: true, Mode: haptic.ResultNoop}, notReady: "haproxy unreachable: gone"}
	}, agentCredentials{})
	p.printSummary("p1")
	want := "summary: runtime 0, file_only 0, reload 0, scheduled 0, noop 1, failed 0\n" +
		"not ready after the push:\n" +
		"  http://agent-1: noop: the pod already holds this plan; not ready after the push: haproxy unreachable: gone\n" +
		"untouched (the canary of 1 stopped the push: 1 not ready after the push):\n" +
		"  http://agent-2\n" +
		"  http://agent-3\n" +
		"plan p1: 1 of 3 agent(s) took it, 1 not ready after it, 2 left untouched\n"
	if out.String() != want || !slices.Equal(asked, []string{"http://agent-1 canary=true"}) {
		t.Errorf("asked %q, output\n%s\nwant\n%s", asked, out.String(), want)
	}
}

// readPod says whether a pod is ready, or why not, and whether its disk
// is behind; a pod whose state cannot be read is a row that says so.
func TestReadPodSaysReadinessAndDisk(t *testing.T) {
	for _, c := range []struct {
		name        string
		stateStatus int
		ready       string // "" answers 200
		want        podRow
	}{
		{"ready", 0, "", podRow{applied: "8d43acb4ce8c3a97", generation: "7", disk: "in step", ready: "ready"}},
		{"disk behind", 0, diskBehindReason + ": no space left on device",
			podRow{applied: "8d43acb4ce8c3a97", generation: "7", disk: "behind", ready: diskBehindReason + ": no space left on device"}},
		{"haproxy unreachable", 0, "haproxy unreachable: the HAProxy worker socket does not answer",
			podRow{applied: "8d43acb4ce8c3a97", generation: "7", disk: "unknown", ready: "haproxy unreachable: the HAProxy worker socket does not answer"}},
		{"state unreadable", http.StatusServiceUnavailable, "initialising",
			podRow{applied: "?", generation: "?", disk: "?", ready: "not read: agent is waiting for HAProxy (HTTP 503, stage startup)", unread: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.URL.Path == haptic.PathState && c.stateStatus != 0:
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(c.stateStatus)
					json.NewEncoder(w).Encode(haptic.ApplyError{Stage: "startup", Message: "agent is waiting for HAProxy"})
				case r.URL.Path == haptic.PathState:
					json.NewEncoder(w).Encode(recordedState())
				case r.URL.Path == haptic.PathReadyz && c.ready != "":
					http.Error(w, c.ready, http.StatusServiceUnavailable)
				}
			}))
			defer srv.Close()
			c.want.pod = srv.URL
			if got := readPod(context.Background(), &haptic.ClientConfig{BaseURL: srv.URL}, haptic.StateRead{}, agentCredentials{}); got != c.want {
				t.Errorf("readPod = %+v, want %+v", got, c.want)
			}
		})
	}
}

// The fleet table puts the smallest group of alike pods first, keeps the
// address order within a group, and ignores generations in likeness.
func TestPrintFleetPutsThePodsUnlikeTheOthersFirst(t *testing.T) {
	ready := func(pod, plan, generation string) podRow {
		return podRow{pod: pod, applied: plan, generation: generation, disk: "in step", ready: "ready"}
	}
	unread := podRow{pod: "http://10.0.0.7:5555", applied: "?", generation: "?", disk: "?", ready: "not read: timed out", unread: true}
	rows := []podRow{
		ready("http://10.0.0.1:5555", "aaaa", "3"),
		{pod: "http://10.0.0.2:5555", applied: "aaaa", generation: "3", disk: "behind", ready: diskBehindReason + ": read-only file system"},
		ready("http://10.0.0.3:5555", "aaaa", "9"),
		ready("http://10.0.0.4:5555", "bbbb", "4"),
		ready("http://10.0.0.5:5555", "bbbb", "4"),
		ready("http://10.0.0.6:5555", "aaaa", "3"),
		unread,
	}
	var out strings.Builder
	printFleet(&out, rows)
	want := `POD                   APPLIED  GENERATION  DISK     READY
http://10.0.0.7:5555  ?        ?           ?        not read: timed out
http://10.0.0.2:5555  aaaa     3           behind   the agent's tree is not yet what its state says: read-only file system
http://10.0.0.4:5555  bbbb     4           in step  ready
http://10.0.0.5:5555  bbbb     4           in step  ready
http://10.0.0.1:5555  aaaa     3           in step  ready
http://10.0.0.3:5555  aaaa     9           in step  ready
http://10.0.0.6:5555  aaaa     3           in step  ready
7 pods: 3 alike (plan aaaa, disk in step, ready), 3 differ, 1 not read
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	// Only the summary changes when no pod is read, or all are alike.
	for _, c := range []struct {
		rows []podRow
		last string
	}{
		{[]podRow{unread}, "1 pod, none read\n"},
		{[]podRow{ready("http://10.0.0.1:5555", "aaaa", "3"), ready("http://10.0.0.3:5555", "aaaa", "9")},
			"2 pods, all alike (plan aaaa, disk in step, ready)\n"},
	} {
		out.Reset()
		printFleet(&out, c.rows)
		if !strings.HasSuffix(out.String(), c.last) {
			t.Errorf("got\n%s\nwant it to end with %q", out.String(), c.last)
		}
	}
}
