// This file owns the end-to-end proof against a real HAProxy (HAPTIC_HAPROXY):
// the agent and Deploy drive a master-worker HAProxy that serves HTTP and TLS
// on loopback ports to two small Go backends, and every step is judged by
// real traffic — which backend answers, which certificate the handshake
// shows, which worker PID serves — not only by `show` output. Plans are
// rendered the way a controller renders them (sections, backend records,
// maps, files with digests), so Diff composes real runtime ops.
//
// It must never talk to an HAProxy that HAPTIC_HAPROXY did not name, never
// send traffic outside 127.0.0.1, and never edit the agent's or HAProxy's
// files behind the agent's back.

package haptic

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The environment: one real HAProxy, two Go backends, one agent, one client.

// e2eBackend is a small Go HTTP server that answers with its own name. A
// request to /slow holds its answer until release is closed, so a test can
// keep a connection open across a server removal and see it drain.
type e2eBackend struct {
	name    string
	srv     *httptest.Server
	port    int
	slowIn  chan struct{} // one value per /slow request that arrived
	release chan struct{}
	once    sync.Once
}

func startE2EBackend(t testing.TB, name string) *e2eBackend {
	t.Helper()
	b := &e2eBackend{name: name, slowIn: make(chan struct{}, 16), release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			b.slowIn <- struct{}{}
			select {
			case <-b.release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("X-Backend", name)
		io.WriteString(w, name+"\n")
	}))
	t.Cleanup(func() {
		b.releaseSlow()
		b.srv.Close()
	})
	b.port = b.srv.Listener.Addr().(*net.TCPAddr).Port
	return b
}

// releaseSlow lets every held /slow request answer.
func (b *e2eBackend) releaseSlow() { b.once.Do(func() { close(b.release) }) }

// e2eEnv is the whole stack of one end-to-end test.
type e2eEnv struct {
	h           *realHAProxy
	a           *Agent
	c           *Client
	alpha, beta *e2eBackend
	httpPort    int
	tlsPort     int
	ca          *testCA
	caps        Caps
	traffic     *http.Client
	epoch       uint64
}

// freeLoopbackPort asks the kernel for a free TCP port on 127.0.0.1. The
// port is free when the call returns; HAProxy binds it moments later.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startE2E starts the real HAProxy of startRealHAProxy (skipping without
// HAPTIC_HAPROXY), two backends, and an agent whose base directory is
// HAProxy's directory. The first Deploy replaces the harness fixture's
// configuration with the end-to-end one.
func startE2E(t testing.TB, mutate func(*AgentConfig)) *e2eEnv {
	t.Helper()
	h := startRealHAProxy(t)
	e := &e2eEnv{
		h:        h,
		alpha:    startE2EBackend(t, "alpha"),
		beta:     startE2EBackend(t, "beta"),
		httpPort: freeLoopbackPort(t),
		tlsPort:  freeLoopbackPort(t),
		ca:       newTestCA(t, "haptic e2e CA"),
		caps:     CapsFor(h.Version(), nil),
		traffic:  &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		epoch:    1,
	}
	cfg := AgentConfig{
		BaseDir:       h.Dir,
		ConfigFile:    ConfigFilePath,
		StateFile:     ".haptic-agent.json",
		Username:      "haptic",
		Password:      "s3cret",
		MasterSocket:  h.MasterSocket(),
		WorkerSocket:  h.WorkerSocket(),
		Listen:        "127.0.0.1:0",
		ReloadTimeout: 30 * time.Second,
		Logger:        testLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	e.a, _ = launchTestAgent(t, cfg, true)
	c, err := NewClient(&ClientConfig{BaseURL: "http://" + e.a.Addr(), Username: "haptic", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e.c = c
	return e
}

// deploy runs Deploy for p and fails the test on an error (a NACK is not an
// error: the caller reads OK).
func (e *e2eEnv) deploy(t testing.TB, p *Plan) *ApplyResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Deploy(ctx, e.c, p, DeployOptions{LeaderEpoch: e.epoch})
	if err != nil {
		t.Fatalf("Deploy %s: %v", p.ID, err)
	}
	return res
}

// state reads the agent's state without the blob.
func (e *e2eEnv) state(t testing.TB) *State {
	t.Helper()
	st, err := e.c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ---------------------------------------------------------------------------
// Renders: what a controller would produce for this small site.

// e2eServer is one server line.
type e2eServer struct {
	name string
	port int // on 127.0.0.1
}

// e2eRender is one desired state of the site.
type e2eRender struct {
	label   string                 // the X-Render header the HTTP frontend adds; a change reloads
	hostMap string                 // maps/host.map: host → backend
	servers map[string][]e2eServer // by backend: be-a, be-b
	certPEM string                 // certs/site.pem: certificate and key
	bogus   bool                   // a keyword HAProxy refuses, in the global section
}

const (
	e2eHostMap = "maps/host.map"
	e2eCert    = "certs/site.pem"
)

// with returns a copy of r changed by edit; the server lists are copied so
// that edits never reach an earlier render.
func (r e2eRender) with(edit func(*e2eRender)) e2eRender {
	out := r
	out.servers = make(map[string][]e2eServer, len(r.servers))
	for be, list := range r.servers {
		out.servers[be] = slices.Clone(list)
	}
	edit(&out)
	return out
}

// firstRender routes a.test to be-a (alpha) and b.test to be-b (beta);
// every other host falls back to be-a.
func (e *e2eEnv) firstRender(t testing.TB) e2eRender {
	return e2eRender{
		label:   "r1",
		hostMap: "a.test be-a\nb.test be-b\n",
		servers: map[string][]e2eServer{
			"be-a": {{name: "alpha", port: e.alpha.port}},
			"be-b": {{name: "beta", port: e.beta.port}},
		},
		certPEM: e.issueSiteCert(t, "site v1"),
	}
}

// issueSiteCert issues a certificate for site.test and returns it with its
// key, as HAProxy's crt file holds them.
func (e *e2eEnv) issueSiteCert(t testing.TB, cn string) string {
	cert, key := e.ca.issue(t, testCertOptions{CommonName: cn, DNSNames: []string{"site.test"}})
	return string(cert) + string(key)
}

// plan renders r as a plan: one core section per top-level section, the
// named defaults as a profile, one backend section and record per backend
// (the body is everything but the server lines), the host map with its
// entries, and the three files with their contents known.
func (e *e2eEnv) plan(r e2eRender) *Plan {
	dir := e.h.Dir
	global := "global\n" +
		"    stats socket " + filepath.Join(dir, "haproxy-worker.sock") + " mode 600 level admin\n" +
		"    default-path origin " + dir + "\n"
	if r.bogus {
		global += "    bogus_keyword here\n"
	}
	global += "\n"
	defaults := "defaults web\n" +
		"    mode http\n" +
		"    timeout connect 5s\n" +
		"    timeout client 30s\n" +
		"    timeout server 30s\n\n"
	// The map is read in a set-var rule, not inside use_backend: HAProxy
	// 2.6 resolves a use_backend expression after parsing, where
	// default-path no longer applies, and cannot find a relative map.
	httpIn := "frontend http-in\n" +
		"    bind 127.0.0.1:" + strconv.Itoa(e.httpPort) + "\n" +
		"    http-response set-header X-Render " + r.label + "\n" +
		"    http-request set-var(txn.backend) req.hdr(host),lower,map(" + e2eHostMap + ",be-a)\n" +
		"    use_backend %[var(txn.backend)]\n\n"
	httpsIn := "frontend https-in\n" +
		"    bind 127.0.0.1:" + strconv.Itoa(e.tlsPort) + " ssl crt " + e2eCert + "\n" +
		"    default_backend be-a\n\n"

	p := &Plan{
		SchemaVersion: PlanSchemaVersion,
		Backends:      map[string]Backend{},
		Profiles:      map[string]Profile{"web": {Name: "web", BodyDigest: DigestString(defaults)}},
		Maps: map[string]Map{e2eHostMap: {Path: e2eHostMap, Ordered: false,
			Entries: ParseMapEntries(r.hostMap)}},
	}
	addSection := func(kind, name, text string) {
		p.Sections = append(p.Sections, Section{Kind: kind, Name: name, TextDigest: DigestString(text),
			Length: len(text), Text: text, TextKnown: true})
	}
	addSection(SectionKindCore, "global", global)
	addSection(SectionKindProfile, "web", defaults)
	addSection(SectionKindCore, "frontend http-in", httpIn)
	addSection(SectionKindCore, "frontend https-in", httpsIn)
	for _, name := range slices.Sorted(maps.Keys(r.servers)) {
		be := e2eBackendRecord(name, r.servers[name])
		text := "backend " + name + "\n"
		for _, line := range be.Body {
			text += "    " + line + "\n"
		}
		for _, s := range be.Servers {
			text += fmt.Sprintf("    server %s %s:%d\n", s.Name, s.Address, s.Port)
		}
		text += "\n"
		be.TextDigest = DigestString(text)
		p.Backends[name] = be
		addSection(SectionKindBackend, name, text)
	}
	var config strings.Builder
	for _, s := range p.Sections {
		config.WriteString(s.Text)
	}
	addFile := func(path, kind, content string) {
		p.Files = append(p.Files, PlanFile{Path: path, Kind: kind, ReloadOnChange: kind == FileKindConfig,
			Digest: DigestString(content), Size: int64(len(content)), Content: content, ContentKnown: true})
	}
	addFile(ConfigFilePath, FileKindConfig, config.String())
	addFile(e2eHostMap, FileKindMap, r.hostMap)
	addFile(e2eCert, FileKindCert, r.certPEM)
	p.ComputeID()
	return p
}

// e2eBackendRecord describes one backend the way a renderer does: the
// record's fields, the body lines (everything but the server lines), and
// digests of each, so that Diff compares a decoded baseline exactly.
func e2eBackendRecord(name string, servers []e2eServer) Backend {
	be := Backend{Name: name, Profile: "web", Mode: "http", Balance: "roundrobin", Shape: ShapeDynamic,
		Body: []string{"balance roundrobin"}, ContentKnown: true}
	for _, s := range servers {
		be.Servers = append(be.Servers, Server{Name: s.name, Address: "127.0.0.1", Port: s.port})
	}
	record, _ := json.Marshal(struct {
		Name, Profile, Mode, Balance, Shape string
		Servers                             []Server
	}{be.Name, be.Profile, be.Mode, be.Balance, be.Shape, be.Servers})
	be.RecordDigest = DigestString(string(record))
	be.BodyDigest = DigestString(strings.Join(be.Body, "\n"))
	be.CommentsDigest = DigestString("")
	return be
}

// ---------------------------------------------------------------------------
// Observations: traffic, certificates, the worker.

// e2eAnswer is what one request through HAProxy saw.
type e2eAnswer struct {
	backend string // X-Backend, "" when HAProxy answered itself
	render  string // X-Render
	status  int
	err     error
}

// get sends one request for host through the HTTP frontend, on a new
// connection, so every request reaches the current worker.
func (e *e2eEnv) get(host, path string) e2eAnswer {
	req, err := http.NewRequest("GET", "http://127.0.0.1:"+strconv.Itoa(e.httpPort)+path, nil)
	if err != nil {
		return e2eAnswer{err: err}
	}
	req.Host = host
	resp, err := e.traffic.Do(req)
	if err != nil {
		return e2eAnswer{err: err}
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return e2eAnswer{backend: resp.Header.Get("X-Backend"), render: resp.Header.Get("X-Render"), status: resp.StatusCode}
}

// tally sends n requests for host and counts the answering backends;
// failures count under "error" and HAProxy's own answers under "status
// <code>".
func (e *e2eEnv) tally(host string, n int) map[string]int {
	counts := map[string]int{}
	for range n {
		a := e.get(host, "/")
		switch {
		case a.err != nil:
			counts["error"]++
		case a.backend == "":
			counts["status "+strconv.Itoa(a.status)]++
		default:
			counts[a.backend]++
		}
	}
	return counts
}

// onlyBackend holds when every request was answered by name.
func onlyBackend(name string) func(map[string]int) bool {
	return func(c map[string]int) bool { return len(c) == 1 && c[name] > 0 }
}

// bothBackends holds when alpha and beta both answered and nothing failed.
func bothBackends(c map[string]int) bool { return len(c) == 2 && c["alpha"] > 0 && c["beta"] > 0 }

// expectTraffic requires that 8 requests for host satisfy ok now.
func (e *e2eEnv) expectTraffic(t testing.TB, host, what string, ok func(map[string]int) bool) {
	t.Helper()
	if c := e.tally(host, 8); !ok(c) {
		t.Fatalf("traffic for %s: want %s, got %v", host, what, c)
	}
}

// awaitTraffic polls until 8 requests for host satisfy ok, for up to 10 s:
// some changes (HAProxy 3.0's set server addr) take effect asynchronously.
func (e *e2eEnv) awaitTraffic(t testing.TB, host, what string, ok func(map[string]int) bool) {
	t.Helper()
	var c map[string]int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c = e.tally(host, 8); ok(c) {
			return
		}
	}
	t.Fatalf("traffic for %s: want %s, last saw %v", host, what, c)
}

// render reads the X-Render header of one answer for host.
func (e *e2eEnv) render(t testing.TB, host string) string {
	t.Helper()
	a := e.get(host, "/")
	if a.err != nil {
		t.Fatalf("GET %s: %v", host, a.err)
	}
	return a.render
}

// servedCert completes a TLS handshake with the HTTPS frontend, verifying
// the chain against the test CA, and returns the leaf HAProxy served.
func (e *e2eEnv) servedCert(t testing.TB) *x509.Certificate {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.ca.CertPEM)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp",
		"127.0.0.1:"+strconv.Itoa(e.tlsPort), &tls.Config{RootCAs: roots, ServerName: "site.test"})
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// workerPID reads the current worker's PID from its stats socket.
func (e *e2eEnv) workerPID(t testing.TB) int {
	t.Helper()
	reply, _ := socketExchange(t, e.h.WorkerSocket(), "show info\n", 5*time.Second)
	m := regexp.MustCompile(`(?m)^Pid: (\d+)$`).FindStringSubmatch(reply)
	if m == nil {
		t.Fatalf("show info: no Pid in %q", reply)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// serverNamesOf lists the servers `show servers state <backend>` reports.
func (e *e2eEnv) serverNamesOf(t testing.TB, backend string) []string {
	t.Helper()
	reply, _ := socketExchange(t, e.h.WorkerSocket(), "show servers state "+backend+"\n", 5*time.Second)
	var names []string
	for _, line := range strings.Split(reply, "\n") {
		f := strings.Fields(line)
		// be_id be_name srv_id srv_name ...
		if len(f) > 4 && f[1] == backend && !strings.HasPrefix(line, "#") {
			names = append(names, f[3])
		}
	}
	slices.Sort(names)
	return names
}

// expectDisk fails unless every file of p is on disk with p's content.
func (e *e2eEnv) expectDisk(t testing.TB, p *Plan) {
	t.Helper()
	for _, f := range p.Files {
		b, err := os.ReadFile(filepath.Join(e.h.Dir, f.Path))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != f.Content {
			t.Fatalf("%s on disk is not the one of plan %s", f.Path, p.ID)
		}
	}
}

// resultOpKinds lists the kinds of a result's op results.
func resultOpKinds(res *ApplyResult) []string {
	var kinds []string
	for _, r := range res.OpResults {
		kinds = append(kinds, r.Kind)
	}
	return kinds
}

// expectMode fails unless res is an ACK of the given mode.
func expectMode(t testing.TB, res *ApplyResult, mode string) {
	t.Helper()
	if !res.OK || res.Mode != mode {
		b, _ := json.Marshal(res)
		t.Fatalf("want an OK %s apply, got %s", mode, b)
	}
}

// awaitReadBacks waits for the background read-backs the last runtime
// apply started, so their verdict is in the metrics.
func (e *e2eEnv) awaitReadBacks() { awaitReadBacks(e.a) }

// ---------------------------------------------------------------------------
// The tests.

// TestRealHAProxyServesDeployedChanges walks one site through every kind of
// change a controller sends, each judged by the traffic HAProxy serves.
// HAProxy 2.6 has no dynamic servers: there, adding or removing a server
// reloads (Caps), and the steps assert the reload and the traffic instead
// of an unchanged worker.
func TestRealHAProxyServesDeployedChanges(t *testing.T) {
	e := startE2E(t, nil)
	r1 := e.firstRender(t)
	var current e2eRender
	var lkg *Plan // the last reloaded plan, which a rollback restores
	var pid int

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"first deploy reloads and serves the render", func(t *testing.T) {
			before := e.workerPID(t)
			lkg = e.plan(r1)
			res := e.deploy(t, lkg)
			expectMode(t, res, ResultReload)
			if pid = e.workerPID(t); pid == before || res.HAProxy.WorkerPID != pid {
				t.Fatalf("worker pid %d before, %d after, ACK says %d", before, pid, res.HAProxy.WorkerPID)
			}
			e.expectTraffic(t, "a.test", "alpha only", onlyBackend("alpha"))
			e.expectTraffic(t, "b.test", "beta only", onlyBackend("beta"))
			if got := e.render(t, "a.test"); got != "r1" {
				t.Fatalf("X-Render %q, want r1", got)
			}
			current = r1
		}},
		{"map change reroutes without a reload", func(t *testing.T) {
			next := current.with(func(r *e2eRender) { r.hostMap = "a.test be-b\nb.test be-b\n" })
			res := e.deploy(t, e.plan(next))
			expectMode(t, res, ResultRuntime)
			if got := resultOpKinds(res); !slices.Equal(got, []string{OpMapSet}) {
				t.Fatalf("ops %v, want [map_set]", got)
			}
			if got := e.workerPID(t); got != pid {
				t.Fatalf("worker pid changed from %d to %d", pid, got)
			}
			e.expectTraffic(t, "a.test", "beta only", onlyBackend("beta"))
			e.awaitReadBacks()
			if n := metricValue(e.a, "map_divergence_total"); n != 0 {
				t.Fatalf("read-back found %d divergences", n)
			}
			current = next
		}},
		{"server added at runtime receives traffic", func(t *testing.T) {
			next := current.with(func(r *e2eRender) {
				r.servers["be-a"] = append(r.servers["be-a"], e2eServer{name: "gamma", port: e.beta.port})
			})
			res := e.deploy(t, e.plan(next))
			if e.caps.DynamicServers {
				expectMode(t, res, ResultRuntime)
				if got := resultOpKinds(res); !slices.Equal(got, []string{OpServerAdd, OpServerEnable}) {
					t.Fatalf("ops %v, want [server_add server_enable]", got)
				}
				if got := e.workerPID(t); got != pid {
					t.Fatalf("worker pid changed from %d to %d", pid, got)
				}
			} else {
				t.Logf("HAProxy %s has no add server: the new server arrives by reload", e.h.Version())
				expectMode(t, res, ResultReload)
				pid, lkg = e.workerPID(t), e.plan(next)
			}
			e.expectTraffic(t, "c.test", "alpha and beta (gamma)", bothBackends)
			current = next
		}},
		{"server removed drains and is deleted", func(t *testing.T) {
			// A request held open on alpha while alpha is removed must
			// complete: the removal disables the server, waits for it to
			// become removable, and only then deletes it.
			held := make(chan e2eAnswer, 4)
			sent, onAlpha := 0, false
			for ; sent < 4 && !onAlpha; sent++ {
				go func() { held <- e.get("c.test", "/slow") }()
				select {
				case <-e.alpha.slowIn:
					onAlpha = true
				case <-e.beta.slowIn:
				case <-time.After(5 * time.Second):
					t.Fatal("a /slow request reached no backend")
				}
			}
			if !onAlpha {
				t.Fatal("no /slow request reached alpha")
			}
			next := current.with(func(r *e2eRender) { r.servers["be-a"] = r.servers["be-a"][1:] })
			res := e.deploy(t, e.plan(next))
			e.beta.releaseSlow()
			if e.caps.DynamicServers {
				expectMode(t, res, ResultRuntime)
				if got := resultOpKinds(res); !slices.Equal(got, []string{OpServerDisable}) {
					t.Fatalf("inline ops %v, want [server_disable]", got)
				}
				if got := e.workerPID(t); got != pid {
					t.Fatalf("worker pid changed from %d to %d", pid, got)
				}
				// Disabled at once: new requests avoid alpha.
				e.expectTraffic(t, "c.test", "beta only", onlyBackend("beta"))
				if names := e.serverNamesOf(t, "be-a"); !slices.Contains(names, "alpha") {
					t.Fatalf("alpha deleted while a request was still in flight: be-a has %v", names)
				}
			} else {
				t.Logf("HAProxy %s has no del server: the removal reloads and the old worker finishes its requests", e.h.Version())
				expectMode(t, res, ResultReload)
				pid, lkg = e.workerPID(t), e.plan(next)
				e.expectTraffic(t, "c.test", "beta only", onlyBackend("beta"))
			}
			time.Sleep(300 * time.Millisecond)
			e.alpha.releaseSlow()
			drained := false
			for range sent {
				select {
				case a := <-held:
					if a.err != nil || a.status != http.StatusOK {
						t.Fatalf("a held request failed instead of draining: %+v", a)
					}
					drained = drained || a.backend == "alpha"
				case <-time.After(10 * time.Second):
					t.Fatal("a held request never completed")
				}
			}
			if !drained {
				t.Fatal("the request held on alpha was not answered by alpha")
			}
			if e.caps.DynamicServers {
				waitFor(t, "alpha to be deleted", func() bool {
					return slices.Equal(e.serverNamesOf(t, "be-a"), []string{"gamma"})
				})
				waitFor(t, "the deferred delete to be done", func() bool {
					return metricValue(e.a, "deferred_deletes_total", "server", "done") == 1
				})
				if p := e.state(t).PendingDeletes; len(p.Servers) != 0 {
					t.Fatalf("pending deletes %+v after the delete", p)
				}
			}
			current = next
		}},
		{"address change moves traffic", func(t *testing.T) {
			next := current.with(func(r *e2eRender) { r.servers["be-a"][0].port = e.alpha.port })
			res := e.deploy(t, e.plan(next))
			expectMode(t, res, ResultRuntime)
			if got := resultOpKinds(res); !slices.Equal(got, []string{OpServerSetAddr}) {
				t.Fatalf("ops %v, want [server_set_addr]", got)
			}
			if got := e.workerPID(t); got != pid {
				t.Fatalf("worker pid changed from %d to %d", pid, got)
			}
			e.awaitTraffic(t, "c.test", "alpha only", onlyBackend("alpha"))
			current = next
		}},
		{"certificate set at runtime is served", func(t *testing.T) {
			before := e.servedCert(t)
			if before.Subject.CommonName != "site v1" {
				t.Fatalf("served %q before the change, want site v1", before.Subject.CommonName)
			}
			next := current.with(func(r *e2eRender) { r.certPEM = e.issueSiteCert(t, "site v2") })
			res := e.deploy(t, e.plan(next))
			expectMode(t, res, ResultRuntime)
			if got := resultOpKinds(res); !slices.Equal(got, []string{OpCertSet}) {
				t.Fatalf("ops %v, want [cert_set]", got)
			}
			if got := e.workerPID(t); got != pid {
				t.Fatalf("worker pid changed from %d to %d", pid, got)
			}
			after := e.servedCert(t)
			if after.Subject.CommonName != "site v2" || after.SerialNumber.Cmp(before.SerialNumber) == 0 {
				t.Fatalf("served %q (serial %v) after the change, want site v2", after.Subject.CommonName, after.SerialNumber)
			}
			current = next
		}},
		{"refused configuration is rolled back and the previous set keeps serving", func(t *testing.T) {
			next := current.with(func(r *e2eRender) { r.bogus = true; r.label = "bad" })
			res := e.deploy(t, e.plan(next))
			if res.OK || res.Mode != ResultRejected || res.Error == nil || res.Error.Stage != StageReload {
				b, _ := json.Marshal(res)
				t.Fatalf("want a rejected reload, got %s", b)
			}
			if res.Rollback == nil || !res.Rollback.Performed {
				t.Fatalf("rollback %+v, want performed", res.Rollback)
			}
			if CapsFor(e.h.Version(), nil).DynamicServers { // 3.0 answers Success=0 with its startup log
				if !strings.Contains(res.Error.Message, "unknown keyword 'bogus_keyword'") {
					t.Fatalf("error.message %q lacks HAProxy's own words", res.Error.Message)
				}
			} else if res.Error.Message == "" {
				t.Fatal("empty error.message")
			} else {
				t.Logf("HAProxy %s prints no reload log; the agent reports %q", e.h.Version(), res.Error.Message)
			}
			// The tree goes back to the set the apply found, runtime
			// changes since the last reload included: the worker keeps what
			// those gave it, so disk and traffic are the previous render's.
			e.expectDisk(t, e.plan(current))
			if got := e.workerPID(t); got != pid {
				t.Fatalf("worker pid changed from %d to %d", pid, got)
			}
			if got := e.render(t, "a.test"); got != current.label {
				t.Fatalf("X-Render %q, want %q: the previous set must keep serving", got, current.label)
			}
			e.expectTraffic(t, "a.test", "beta only", onlyBackend("beta"))
			e.expectTraffic(t, "c.test", "alpha only", onlyBackend("alpha"))
			// HAProxy refused the set and the previous worker serves on: the
			// baseline is the one the apply started from.
			if st := e.state(t); st.AppliedPlanID != e.plan(current).ID || st.RunningPlanID == "" {
				t.Fatalf("applied plan %q running %q after a NACK, want %q", st.AppliedPlanID, st.RunningPlanID, e.plan(current).ID)
			}
		}},
		{"the next good deploy reloads and serves", func(t *testing.T) {
			next := current.with(func(r *e2eRender) { r.label = "r2" })
			res := e.deploy(t, e.plan(next))
			expectMode(t, res, ResultReload)
			if got := e.render(t, "a.test"); got != "r2" {
				t.Fatalf("X-Render %q, want r2", got)
			}
			e.expectTraffic(t, "a.test", "beta only", onlyBackend("beta"))
			if served := e.servedCert(t); served.Subject.CommonName != "site v2" {
				t.Fatalf("served %q after the reload, want site v2", served.Subject.CommonName)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
	if v := e.state(t).InvariantViolation; v != "" {
		t.Fatalf("invariant violation %q", v)
	}
}

// TestRealHAProxyPacedReloadServesTheNewSet: with a one-second reload
// interval, a reload asked for right after another is scheduled, not
// dropped; the pacer fires it and the new worker serves the new set.
func TestRealHAProxyPacedReloadServesTheNewSet(t *testing.T) {
	e := startE2E(t, func(c *AgentConfig) { c.ReloadIntervalMin = time.Second })
	r1 := e.firstRender(t)
	expectMode(t, e.deploy(t, e.plan(r1)), ResultReload)
	pid := e.workerPID(t)

	next := r1.with(func(r *e2eRender) { r.label = "r2" })
	p2 := e.plan(next)
	res := e.deploy(t, p2)
	expectMode(t, res, ResultScheduled)
	if res.Reload == nil || res.Reload.ScheduledAt == "" {
		t.Fatalf("reload %+v, want scheduled_at", res.Reload)
	}
	due, err := time.Parse(time.RFC3339Nano, res.Reload.ScheduledAt)
	if err != nil {
		t.Fatal(err)
	}
	if st := e.state(t); st.ReloadPendingAt != res.Reload.ScheduledAt {
		t.Fatalf("reload_pending_at %q, scheduled_at %q", st.ReloadPendingAt, res.Reload.ScheduledAt)
	}
	// An answer of r2 seen before due would mean the reload was not paced.
	waitFor(t, "the paced reload to serve r2", func() bool {
		served := e.render(t, "a.test")
		if seen := time.Now(); served == "r2" && seen.Before(due) {
			t.Fatalf("r2 was served by %v, before the reload was due at %v", seen, due)
		}
		return served == "r2"
	})
	if got := e.workerPID(t); got == pid {
		t.Fatalf("worker pid %d unchanged after the paced reload", got)
	}
	waitFor(t, "last_apply to show the pacer's reload", func() bool {
		st := e.state(t)
		return st.ReloadPendingAt == "" && st.LastApply != nil && st.LastApply.PlanID == p2.ID && st.LastApply.Mode == ResultReload
	})
	st := e.state(t)
	if !st.LastApply.OK || st.RunningPlanID != p2.ID || st.LKGPlanID != p2.ID {
		t.Fatalf("after the paced reload: last_apply ok=%v, running %q, lkg %q, want %q", st.LastApply.OK, st.RunningPlanID, st.LKGPlanID, p2.ID)
	}
	// A controller that got "scheduled" takes last_apply as the final
	// result, baseline included.
	if la := st.LastApply; la.AppliedPlanID != p2.ID || la.AppliedPlanProof != st.AppliedPlanProof || la.RunningPlanID != p2.ID ||
		la.WorkerOpsPlanProof != st.WorkerOpsPlanProof || la.LKGPlanID != p2.ID || la.AppliedToken != st.AppliedToken ||
		la.HAProxy.WorkerPID != e.workerPID(t) || la.Inventory == nil || len(la.Inventory.Maps) == 0 {
		t.Fatalf("last_apply after the paced reload: %+v", la)
	}
	e.expectTraffic(t, "a.test", "alpha only", onlyBackend("alpha"))
}
