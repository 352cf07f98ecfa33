// This file tests the Client of client.go against httptest servers and,
// where a test needs a refused or reset connection, raw TCP listeners:
// construction and transport, requests, retries and their classification,
// Apply, PutPlan and version skew. Deploy has its own file,
// client_deploy_test.go, and the patches it sends client_patch_test.go.

package haptic

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Fixtures.

// recordedRequest is one request an httptest server received, body read.
type recordedRequest struct {
	Method     string
	RequestURI string
	Header     http.Header
	Body       []byte
}

// requestLog records requests; safe for concurrent handlers.
type requestLog struct {
	mu   sync.Mutex
	reqs []recordedRequest
}

func (l *requestLog) add(r recordedRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, r)
}

func (l *requestLog) all() []recordedRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]recordedRequest(nil), l.reqs...)
}

// startRecordingServer serves answer after reading and recording each
// request's whole body.
func startRecordingServer(t *testing.T, answer func(w http.ResponseWriter, req recordedRequest)) (*httptest.Server, *requestLog) {
	t.Helper()
	log := &requestLog{}
	srv := httptest.NewServer(recordingHandler(log, answer))
	t.Cleanup(srv.Close)
	return srv, log
}

func recordingHandler(log *requestLog, answer func(w http.ResponseWriter, req recordedRequest)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := recordedRequest{Method: r.Method, RequestURI: r.RequestURI, Header: r.Header.Clone(), Body: body}
		log.add(rec)
		answer(w, rec)
	})
}

// answerJSON writes status with v as JSON, the way the agent does.
func answerJSON(status int, v any) func(http.ResponseWriter, recordedRequest) {
	return func(w http.ResponseWriter, _ recordedRequest) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

// answerText writes status with a raw body.
func answerText(status int, body string) func(http.ResponseWriter, recordedRequest) {
	return func(w http.ResponseWriter, _ recordedRequest) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

var testAck = ApplyResult{PlanID: "plan-2", OK: true, Mode: ResultRuntime, AppliedPlanID: "plan-2", AppliedPlanProof: "proof-2"}

func newTestClient(t testing.TB, baseURL string, mutate func(*ClientConfig)) *Client {
	t.Helper()
	cfg := &ClientConfig{BaseURL: baseURL, Username: "admin", Password: "adminpwd", ConnectRetryBackoff: 10 * time.Millisecond}
	if mutate != nil {
		mutate(cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testManifest is a valid auto manifest of two files: haproxy.cfg ("globa")
// and maps/host.map ("a b").
func testManifest() *Manifest {
	return &Manifest{
		IdentityVersion:   ExactIdentityVersion,
		PlanID:            "plan-2",
		PlanSchemaVersion: PlanSchemaVersion,
		Token:             Token{LeaderEpoch: 7, RenderSeq: 1},
		Files: []ManifestFile{
			{Path: "haproxy.cfg", Digest: DigestString("globa"), Proof: DigestString("globa"), Size: 5, Kind: FileKindConfig, ReloadOnChange: true},
			{Path: "maps/host.map", Digest: DigestString("a b"), Proof: DigestString("a b"), Size: 3, Kind: FileKindMap},
		},
		Mode: ModeAuto,
	}
}

func testParts() map[string]io.Reader {
	return map[string]io.Reader{
		"maps/host.map": strings.NewReader("a b"),
		"haproxy.cfg":   strings.NewReader("globa"),
	}
}

// testPart is one multipart part as it crossed the wire.
type testPart struct {
	Name, FileName string // from the raw Content-Disposition header
	Header         map[string][]string
	Body           string
}

// multipartParts parses an apply request's body without Go's FileName
// clean-up, so that the full path in filename is visible.
func multipartParts(t *testing.T, req recordedRequest) []testPart {
	t.Helper()
	mediaType, params, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if err != nil || mediaType != "multipart/form-data" {
		t.Fatalf("Content-Type %q: %v", req.Header.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(bytes.NewReader(req.Body), params["boundary"])
	var parts []testPart
	for range MaxFiles + 2 {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			return parts
		}
		if err != nil {
			t.Fatal(err)
		}
		_, disp, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, testPart{Name: disp["name"], FileName: disp["filename"], Header: p.Header, Body: string(body)})
	}
	t.Fatal("too many parts")
	return nil
}

// closedAddr returns a loopback address nobody listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startRawServer accepts TCP connections and hands each, numbered from 1,
// to serve, for tests that need to reset a connection mid-request.
func startRawServer(t *testing.T, serve func(n int, conn *net.TCPConn)) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int32)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(accepted.Add(1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				serve(n, conn.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), accepted
}

// resetConn closes conn with a TCP reset instead of a FIN.
func resetConn(conn *net.TCPConn) {
	_ = conn.SetLinger(0)
	_ = conn.Close()
}

// readRequestHead reads up to the empty line that ends a request's header.
func readRequestHead(r *bufio.Reader) error {
	for range 100 {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			return nil
		}
	}
	return errors.New("request head too long")
}

func mustErrorContain(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
}

// ---------------------------------------------------------------------------
// Client construction and transport.

func TestNewClientRejectsUnusableBaseURL(t *testing.T) {
	_, parseErr := url.Parse("http://%zz")
	tests := []struct {
		name string
		cfg  *ClientConfig
		want string
	}{
		{"nil config", nil, "agent client: ClientConfig is required"},
		{"empty", &ClientConfig{}, "agent client: BaseURL is required"},
		{"unparsable", &ClientConfig{BaseURL: "http://%zz"}, fmt.Sprintf("agent client: BaseURL %q: %v", "http://%zz", parseErr)},
		{"unix scheme", &ClientConfig{BaseURL: "unix:///tmp/agent.sock"}, `agent client: BaseURL "unix:///tmp/agent.sock" must be http or https`},
		{"no host", &ClientConfig{BaseURL: "http://"}, `agent client: BaseURL "http://" has no host`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(tt.cfg)
			if c != nil || err == nil || err.Error() != tt.want {
				t.Fatalf("NewClient = %v, %v; want error %q", c, err, tt.want)
			}
		})
	}
}

func TestNewClientRejectsTransportMismatch(t *testing.T) {
	tlsConfig := &tls.Config{}
	tests := []struct {
		name string
		cfg  *ClientConfig
		want string
	}{
		{"http with TLS", &ClientConfig{BaseURL: "http://agent:5555", TLS: tlsConfig},
			`agent client: BaseURL "http://agent:5555" must be https when TLS is set`},
		{"https with UnixSocket", &ClientConfig{BaseURL: "https://localhost", UnixSocket: "/run/agent.sock"},
			`agent client: BaseURL "https://localhost" must be http when UnixSocket is set`},
		{"UnixSocket and TLS", &ClientConfig{BaseURL: "http://localhost", UnixSocket: "/run/agent.sock", TLS: tlsConfig},
			"agent client: UnixSocket and TLS cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewClient(tt.cfg)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("NewClient error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestNewClientAppliesDefaults(t *testing.T) {
	c := newTestClient(t, "http://agent:5555", func(cfg *ClientConfig) {
		cfg.ConnectRetryBackoff = -1
		cfg.ConnectRetries = -1
		cfg.Timeout = 0
	})
	if c.cfg.Timeout != 10*time.Second || c.cfg.PerPodApplyTimeout != 2*time.Minute ||
		c.cfg.ConnectRetries != 3 || c.cfg.ConnectRetryBackoff != 100*time.Millisecond {
		t.Fatalf("defaults %+v", c.cfg)
	}
	tr := c.transport
	if tr.Proxy != nil || tr.MaxIdleConns != 4 || tr.MaxIdleConnsPerHost != 2 || tr.IdleConnTimeout != 90*time.Second ||
		tr.TLSHandshakeTimeout != 10*time.Second || tr.ExpectContinueTimeout != time.Second || tr.ForceAttemptHTTP2 ||
		tr.Protocols.HTTP2() || !tr.Protocols.HTTP1() {
		t.Fatalf("transport settings %+v", tr)
	}
	if c.http.Timeout != 0 || c.http.CheckRedirect == nil {
		t.Fatal("the http.Client must have no Timeout and a CheckRedirect")
	}
}

func TestNewClientTrimsTrailingSlash(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, State{APIVersion: APIVersion}))
	c := newTestClient(t, srv.URL+"/", nil)
	if _, err := c.State(context.Background(), StateRead{Plan: true}); err != nil {
		t.Fatal(err)
	}
	if got := log.all()[0].RequestURI; got != "/v1/state" {
		t.Fatalf("request URI %q, want /v1/state", got)
	}
}

func TestBasicAuthOnlyWithCredentials(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, State{}))
	anonymous := newTestClient(t, srv.URL, func(cfg *ClientConfig) { cfg.Username, cfg.Password = "", "" })
	if _, err := anonymous.State(context.Background(), StateRead{}); err != nil {
		t.Fatal(err)
	}
	withCreds := newTestClient(t, srv.URL, nil)
	if _, err := withCreds.State(context.Background(), StateRead{}); err != nil {
		t.Fatal(err)
	}
	reqs := log.all()
	if h := reqs[0].Header.Get("Authorization"); h != "" {
		t.Fatalf("Authorization %q sent without credentials", h)
	}
	r := &http.Request{Header: reqs[1].Header}
	if user, pass, ok := r.BasicAuth(); !ok || user != "admin" || pass != "adminpwd" {
		t.Fatalf("basic auth %q %q %v", user, pass, ok)
	}
}

func TestAgentClientDoesNotFollowRedirects(t *testing.T) {
	target, targetLog := startRecordingServer(t, answerJSON(http.StatusOK, State{}))
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	c := newTestClient(t, redirect.URL, nil)
	_, err := c.State(context.Background(), StateRead{})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusTemporaryRedirect {
		t.Fatalf("State error %v, want *HTTPError 307", err)
	}
	if n := len(targetLog.all()); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

// startUnixServer serves h on a unix socket in a short temporary directory
// (socket paths are limited to about 100 bytes).
func startUnixServer(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func TestAgentClientCopiesSocketConfiguration(t *testing.T) {
	log := &requestLog{}
	sock := startUnixServer(t, recordingHandler(log, answerJSON(http.StatusOK, State{AgentVersion: "over-unix"})))
	cfg := &ClientConfig{BaseURL: "http://localhost", UnixSocket: sock, Username: "admin", Password: "adminpwd"}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg.UnixSocket = "/nonexistent/agent.sock"
	cfg.Username = "changed"
	s, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if s.AgentVersion != "over-unix" {
		t.Fatalf("state %+v", s)
	}
	if h := log.all()[0].Header.Get("Authorization"); h != "" {
		t.Fatalf("Authorization %q sent over a unix socket", h)
	}
}

func TestUnixSocketHealthAndState(t *testing.T) {
	log := &requestLog{}
	sock := startUnixServer(t, recordingHandler(log, func(w http.ResponseWriter, req recordedRequest) {
		if strings.HasPrefix(req.RequestURI, PathHealthz) {
			answerText(http.StatusOK, "ok\n")(w, req)
			return
		}
		answerJSON(http.StatusOK, State{APIVersion: APIVersion, AppliedPlanID: "plan-1"})(w, req)
	}))
	c := newTestClient(t, "http://localhost", func(cfg *ClientConfig) { cfg.UnixSocket = sock })
	if err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if s.AppliedPlanID != "plan-1" {
		t.Fatalf("state %+v", s)
	}
	reqs := log.all()
	if len(reqs) != 2 || reqs[0].RequestURI != "/healthz" || reqs[1].RequestURI != "/v1/state?plan=0" {
		t.Fatalf("requests %+v", reqs)
	}
}

func TestTLSClient(t *testing.T) {
	ca := newTestCA(t, "haptic test CA")
	serverCert, serverKey := ca.issue(t, testCertOptions{CommonName: "agent", DNSNames: []string{"agent.test"}})
	clientCert, clientKey := ca.issue(t, testCertOptions{CommonName: "controller", Client: true})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	serverPair, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	clientPair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewUnstartedServer(recordingHandler(&requestLog{}, answerJSON(http.StatusOK, State{AgentVersion: "tls"})))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()

	callerTLS := &tls.Config{RootCAs: pool, ServerName: "agent.test", Certificates: []tls.Certificate{clientPair}, NextProtos: []string{"h2"}}
	c := newTestClient(t, srv.URL, func(cfg *ClientConfig) { cfg.TLS = callerTLS })
	// The client cloned the config: stripping the caller's copy changes nothing.
	callerTLS.Certificates = nil
	callerTLS.RootCAs = nil
	s, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if s.AgentVersion != "tls" {
		t.Fatalf("state %+v", s)
	}

	noCert := newTestClient(t, srv.URL, func(cfg *ClientConfig) {
		cfg.TLS = &tls.Config{RootCAs: pool, ServerName: "agent.test"}
	})
	if _, err := noCert.State(context.Background(), StateRead{}); err == nil {
		t.Fatal("State without a client certificate succeeded")
	}
}

func TestCloseKeepsClientUsable(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, State{}))
	c := newTestClient(t, srv.URL, nil)
	if _, err := c.State(context.Background(), StateRead{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if _, err := c.State(context.Background(), StateRead{}); err != nil {
		t.Fatalf("State after Close: %v", err)
	}
	if n := len(log.all()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

// ---------------------------------------------------------------------------
// Requests, retries and classification.

func TestStateSuccess(t *testing.T) {
	want := State{
		APIVersion: APIVersion, AgentVersion: "v1.2.3", AgentOps: []string{OpMapSet},
		HAProxy:       HAProxyInfo{Version: "3.4.3", WorkerPID: 42, WorkerStartTimeUnixMicros: 1_700_000_000_000_000},
		Generation:    5,
		AppliedPlanID: "plan-1", AppliedPlanProof: "p1", AppliedToken: Token{LeaderEpoch: 3, RenderSeq: 9},
		Files: map[string]FileAt{"haproxy.cfg": {Digest: "0123456789abcdef", Size: 5}},
	}
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, want))
	c := newTestClient(t, srv.URL, nil)
	got, err := c.State(context.Background(), StateRead{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Fatalf("state\n%s\nwant\n%s", gotJSON, wantJSON)
	}
	req := log.all()[0]
	if req.Method != http.MethodGet || req.RequestURI != "/v1/state?verify=1&plan=0" {
		t.Fatalf("request %s %s", req.Method, req.RequestURI)
	}
	r := &http.Request{Header: req.Header}
	if user, pass, ok := r.BasicAuth(); !ok || user != "admin" || pass != "adminpwd" {
		t.Fatalf("basic auth %q %q %v", user, pass, ok)
	}
}

func TestStateUnauthorized(t *testing.T) {
	srv, _ := startRecordingServer(t, answerText(http.StatusUnauthorized, "unauthorized\n"))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.State(context.Background(), StateRead{})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized || !strings.Contains(he.Body, "unauthorized") {
		t.Fatalf("State error %v, want *HTTPError 401 unauthorized", err)
	}
}

// The two probes: no credentials, nil on 200, the agent's words on 503.
func TestHealthAndReady(t *testing.T) {
	probes := map[string]func(*Client) error{
		PathHealthz: func(c *Client) error { return c.Health(context.Background()) },
		PathReadyz:  func(c *Client) error { return c.Ready(context.Background()) },
	}
	tests := []struct {
		name       string
		status     int
		wantStatus int // 0 = nil error
	}{
		{"ok", http.StatusOK, 0},
		{"unavailable", http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	}
	for path, probe := range probes {
		for _, tt := range tests {
			t.Run(path+" "+tt.name, func(t *testing.T) {
				srv, log := startRecordingServer(t, answerText(tt.status, "haproxy unreachable\n"))
				c := newTestClient(t, srv.URL, nil)
				err := probe(c)
				var he *HTTPError
				switch {
				case tt.wantStatus == 0 && err != nil:
					t.Fatalf("%s = %v", path, err)
				case tt.wantStatus != 0 && (!errors.As(err, &he) || he.Status != tt.wantStatus || he.Body != "haproxy unreachable"):
					t.Fatalf("%s = %v, want *HTTPError %d with the agent's words", path, err, tt.wantStatus)
				}
				req := log.all()[0]
				if req.RequestURI != path || req.Header.Get("Authorization") != "" {
					t.Fatalf("request %s with Authorization %q", req.RequestURI, req.Header.Get("Authorization"))
				}
			})
		}
	}
}

func TestStatusClassification(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		check   func(error) bool
		wantErr string
	}{
		{"missing", 409, `{"missing":["haproxy.cfg","maps/host.map"]}`,
			func(err error) bool { var e *MissingError; return errors.As(err, &e) && len(e.Missing.Missing) == 2 },
			"agent is missing 2 file part(s): haproxy.cfg, maps/host.map"},
		{"conflict", 409, `{"applied_plan_id":"plan-9","applied_token":{"leader_epoch":8,"render_seq":3},"running_plan_id":"","worker_ops_plan_id":"","lkg_plan_id":"","reason":"prev_mismatch"}`,
			func(err error) bool {
				var e *ConflictError
				return errors.As(err, &e) && e.Reason == ReasonPrevMismatch && e.Conflict.AppliedPlanID == "plan-9"
			},
			`agent rejected the apply (prev_mismatch): its applied plan is "plan-9" at epoch 8/seq 3`},
		{"409 text", 409, "conflict\n",
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 409 },
			"agent returned HTTP 409: conflict"},
		{"409 array", 409, `["haproxy.cfg"]`,
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 409 },
			`agent returned HTTP 409: ["haproxy.cfg"]`},
		{"409 null", 409, `null`,
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 409 },
			`agent returned HTTP 409: null`},
		{"409 object that does not decode", 409, `{"reason":5}`,
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 409 },
			`agent returned HTTP 409: {"reason":5}`},
		{"500", 500, `{"stage":"lkg","message":"disk full"}` + "\n",
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 500 },
			`agent returned HTTP 500: {"stage":"lkg","message":"disk full"}`},
		{"500 empty", 500, "  \n",
			func(err error) bool { var e *HTTPError; return errors.As(err, &e) && e.Status == 500 && e.Body == "" },
			"agent returned HTTP 500"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := startRecordingServer(t, answerText(tt.status, tt.body))
			c := newTestClient(t, srv.URL, nil)
			res, err := c.Apply(context.Background(), testManifest(), nil, nil)
			if res != nil || !tt.check(err) {
				t.Fatalf("Apply = %v, %#v", res, err)
			}
			if err.Error() != tt.wantErr {
				t.Fatalf("Error() = %q, want %q", err.Error(), tt.wantErr)
			}
		})
	}
}

func TestHTTPErrorBodyIsCut(t *testing.T) {
	srv, _ := startRecordingServer(t, answerText(http.StatusInternalServerError, strings.Repeat("x", 5000)))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.State(context.Background(), StateRead{})
	var he *HTTPError
	if !errors.As(err, &he) {
		t.Fatalf("State error %v", err)
	}
	if he.Body != strings.Repeat("x", 4096)+"…" {
		t.Fatalf("body of %d bytes, want 4096 x and …", len(he.Body))
	}
}

func TestResponseSizeCap(t *testing.T) {
	srv, _ := startRecordingServer(t, func(w http.ResponseWriter, _ recordedRequest) {
		chunk := bytes.Repeat([]byte(" "), 1<<20)
		for range MaxApplyBodyBytes / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte("{"))
	})
	// 64 MiB through the race detector on two shared cores can take longer
	// than the default 10 s deadline; the cap, not the clock, must end it.
	c := newTestClient(t, srv.URL, func(cfg *ClientConfig) { cfg.Timeout = 2 * time.Minute })
	_, err := c.State(context.Background(), StateRead{})
	if err == nil || err.Error() != "agent client: response exceeds 67108864 bytes" {
		t.Fatalf("State error %v", err)
	}

	// A declared length over the cap fails before the body is read.
	declared, _ := startRecordingServer(t, func(w http.ResponseWriter, _ recordedRequest) {
		w.Header().Set("Content-Length", fmt.Sprint(MaxApplyBodyBytes+1))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("{}"))
	})
	_, err = newTestClient(t, declared.URL, nil).State(context.Background(), StateRead{})
	if err == nil || err.Error() != "agent client: response exceeds 67108864 bytes" {
		t.Fatalf("State error %v with a declared oversized length", err)
	}
}

func TestStateRetriesResetConnectionThenSucceeds(t *testing.T) {
	stateJSON, _ := json.Marshal(State{AppliedPlanID: "plan-3"})
	addr, accepted := startRawServer(t, func(n int, conn *net.TCPConn) {
		r := bufio.NewReader(conn)
		if err := readRequestHead(r); err != nil {
			return
		}
		if n <= 2 {
			resetConn(conn)
			return
		}
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(stateJSON), stateJSON)
	})
	c := newTestClient(t, "http://"+addr, nil)
	s, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if s.AppliedPlanID != "plan-3" {
		t.Fatalf("state %+v", s)
	}
	if n := accepted.Load(); n != 3 {
		t.Fatalf("%d accepted connections, want 3", n)
	}
}

func TestStateGivesUpAfterConnectRetries(t *testing.T) {
	c := newTestClient(t, "http://"+closedAddr(t), nil)
	start := time.Now()
	_, err := c.State(context.Background(), StateRead{})
	elapsed := time.Since(start)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v does not wrap ECONNREFUSED", err)
	}
	if !strings.HasPrefix(err.Error(), "agent client: 4 connect attempts failed: ") {
		t.Fatalf("error text %q", err.Error())
	}
	if elapsed < 30*time.Millisecond {
		t.Fatalf("gave up after %v, want at least 3 × 10 ms of backoff", elapsed)
	}
}

func TestNoRetryOnHTTPStatus(t *testing.T) {
	srv, log := startRecordingServer(t, answerText(http.StatusServiceUnavailable, "busy"))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.State(context.Background(), StateRead{})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable {
		t.Fatalf("State error %v", err)
	}
	if n := len(log.all()); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func TestApplyRetriesBeforeReadingParts(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	// The first dial goes to a closed port, so the kernel refuses it
	// before the body writer can read any part.
	refused := closedAddr(t)
	var dials atomic.Int32
	dial := c.transport.DialContext
	c.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return dial(ctx, network, refused)
		}
		return dial(ctx, network, addr)
	}
	res, err := c.Apply(context.Background(), testManifest(), testParts(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || dials.Load() != 2 {
		t.Fatalf("result %+v after %d dials", res, dials.Load())
	}
	reqs := log.all()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	parts := multipartParts(t, reqs[0])
	if len(parts) != 3 || parts[1].Body != "globa" || parts[2].Body != "a b" {
		t.Fatalf("parts %+v", parts)
	}
}

func TestApplyDoesNotRetryOnceThePartsWereRead(t *testing.T) {
	addr, accepted := startRawServer(t, func(_ int, conn *net.TCPConn) {
		var seen []byte
		buf := make([]byte, 4096)
		for len(seen) < 1<<20 {
			n, err := conn.Read(buf)
			seen = append(seen, buf[:n]...)
			if bytes.Contains(seen, []byte("globa")) {
				resetConn(conn)
				return
			}
			if err != nil {
				return
			}
		}
	})
	c := newTestClient(t, "http://"+addr, nil)
	_, err := c.Apply(context.Background(), testManifest(), testParts(), nil)
	if err == nil {
		t.Fatal("Apply succeeded against a reset connection")
	}
	// The transport reports the reset (retriable were the body still
	// replayable) or, when its writer notices first, the closed connection.
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d accepted connections, want 1 (error %v)", n, err)
	}
}

// TestRetryNeedsAReplayableBody pins the retry rule itself, without the
// transport's choice of which error to report first: a reset is retried
// only while the body can be replayed.
func TestRetryNeedsAReplayableBody(t *testing.T) {
	c := newTestClient(t, "http://agent:5555", nil)
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, tt := range []struct {
		replayable   bool
		wantAttempts int
	}{{true, 4}, {false, 1}} {
		attempts := 0
		_, err := c.exchange(context.Background(), func(context.Context) (int, []byte, error) {
			attempts++
			return 0, nil, reset
		}, func() bool { return tt.replayable })
		if attempts != tt.wantAttempts || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("replayable %v: %d attempts, error %v", tt.replayable, attempts, err)
		}
	}
}

func TestApplyHonoursContextCancellation(t *testing.T) {
	arrived := make(chan struct{}, 1)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := newTestClient(t, srv.URL, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := c.Apply(ctx, testManifest(), testParts(), nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply error %v, want context.Canceled", err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

// ---------------------------------------------------------------------------
// Apply.

func TestApplySendsManifestThenPlanThenFilesInManifestOrder(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	res, err := c.Apply(context.Background(), testManifest(), testParts(), strings.NewReader("zstd-blob"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.AppliedPlanProof != "proof-2" {
		t.Fatalf("result %+v", res)
	}
	req := log.all()[0]
	if req.Method != http.MethodPost || req.RequestURI != "/v1/apply" {
		t.Fatalf("request %s %s", req.Method, req.RequestURI)
	}
	parts := multipartParts(t, req)
	want := []struct{ name, body string }{
		{"manifest", ""}, {"plan", "zstd-blob"}, {"haproxy.cfg", "globa"}, {"maps/host.map", "a b"},
	}
	if len(parts) != len(want) {
		t.Fatalf("%d parts, want %d", len(parts), len(want))
	}
	for i, w := range want {
		if parts[i].Name != w.name || (w.body != "" && parts[i].Body != w.body) {
			t.Fatalf("part %d = %s %q, want %s %q", i, parts[i].Name, parts[i].Body, w.name, w.body)
		}
	}
	for _, p := range parts[2:] {
		if p.FileName != p.Name {
			t.Fatalf("part %s has filename %q", p.Name, p.FileName)
		}
	}
	var m Manifest
	if err := json.Unmarshal([]byte(parts[0].Body), &m); err != nil {
		t.Fatal(err)
	}
	if m.PlanID != "plan-2" || m.Token.LeaderEpoch != 7 {
		t.Fatalf("manifest %+v", m)
	}

	// Manifest order wins over sorted order.
	reversed := testManifest()
	reversed.Files[0], reversed.Files[1] = reversed.Files[1], reversed.Files[0]
	if _, err := c.Apply(context.Background(), reversed, testParts(), nil); err != nil {
		t.Fatal(err)
	}
	parts = multipartParts(t, log.all()[1])
	if len(parts) != 3 || parts[1].Name != "maps/host.map" || parts[2].Name != "haproxy.cfg" {
		t.Fatalf("parts %+v", parts)
	}
}

func TestApplyPartHeaders(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	if _, err := c.Apply(context.Background(), testManifest(), testParts(), strings.NewReader("zstd-blob")); err != nil {
		t.Fatal(err)
	}
	req := log.all()[0]
	if ct := req.Header.Get("Content-Type"); !strings.HasPrefix(ct, "multipart/form-data; boundary=") {
		t.Fatalf("Content-Type %q", ct)
	}
	parts := multipartParts(t, log.all()[0])
	if ct, ok := parts[0].Header["Content-Type"]; ok {
		t.Fatalf("manifest part has Content-Type %q", ct)
	}
	if cd := parts[0].Header["Content-Disposition"]; len(cd) != 1 || cd[0] != `form-data; name="manifest"` {
		t.Fatalf("manifest Content-Disposition %q", cd)
	}
	if parts[1].FileName != "plan" {
		t.Fatalf("plan part filename %q", parts[1].FileName)
	}
	for _, p := range parts[1:] {
		if ct := p.Header["Content-Type"]; len(ct) != 1 || ct[0] != "application/octet-stream" {
			t.Fatalf("part %s Content-Type %q", p.Name, ct)
		}
	}
	if parts[3].FileName != "maps/host.map" {
		t.Fatalf("file part filename %q", parts[3].FileName)
	}
}

func TestApplyConflict(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusConflict, Conflict{
		AppliedPlanID: "plan-9", AppliedToken: Token{LeaderEpoch: 8, RenderSeq: 2}, Reason: ReasonPrevMismatch,
	}))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.Apply(context.Background(), testManifest(), nil, nil)
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Apply error %v, want *ConflictError", err)
	}
	if ce.AppliedPlanID != "plan-9" || ce.Reason != ReasonPrevMismatch || ce.AppliedToken.LeaderEpoch != 8 {
		t.Fatalf("conflict %+v", ce.Conflict)
	}
}

func TestApplyMissingParts(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusConflict, Missing{Missing: []string{"maps/host.map"}}))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.Apply(context.Background(), testManifest(), nil, nil)
	var me *MissingError
	if !errors.As(err, &me) {
		t.Fatalf("Apply error %v, want *MissingError", err)
	}
	if len(me.Missing.Missing) != 1 || me.Missing.Missing[0] != "maps/host.map" {
		t.Fatalf("missing %v", me.Missing.Missing)
	}
}

func TestApplyNACKIsNotATransportError(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusOK, ApplyResult{
		PlanID: "plan-2", OK: false, Mode: ResultRejected, Error: &ApplyError{Stage: StageReload, Message: "Success=0"},
	}))
	c := newTestClient(t, srv.URL, nil)
	res, err := c.Apply(context.Background(), testManifest(), testParts(), nil)
	if err != nil {
		t.Fatalf("Apply error %v", err)
	}
	if res.OK || res.Mode != ResultRejected || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("result %+v", res)
	}
}

func TestApplyRejectsOversizedBodyBeforeSending(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	m := testManifest()
	m.Files[1].Size = MaxApplyBodyBytes + 1
	_, err := c.Apply(context.Background(), m, map[string]io.Reader{"maps/host.map": strings.NewReader("a b")}, nil)
	mustErrorContain(t, err, "exceeds the limit")
	if n := len(log.all()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

func TestApplyRejectsMalformedManifest(t *testing.T) {
	ops := func(n int) []Op {
		out := make([]Op, n)
		for i := range out {
			out[i] = Op{Kind: OpMapDel, Path: "maps/host.map", Key: fmt.Sprint(i)}
		}
		return out
	}
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		want   string
	}{
		{"no plan id", func(m *Manifest) { m.PlanID = "" }, "agent client: manifest has no plan_id"},
		{"unknown mode", func(m *Manifest) { m.Mode = "sideways" }, `agent client: unknown apply mode "sideways"`},
		{"too many files", func(m *Manifest) {
			m.Files = make([]ManifestFile, MaxFiles+1)
			for i := range m.Files {
				m.Files[i] = ManifestFile{Path: fmt.Sprintf("f%d", i), Digest: DigestString("")}
			}
		}, "agent client: 4097 files exceeds the limit of 4096"},
		{"absolute path", func(m *Manifest) { m.Files[0].Path = "/etc/haproxy/haproxy.cfg" },
			`agent client: file path "/etc/haproxy/haproxy.cfg" must be relative to the base dir`},
		{"escapes", func(m *Manifest) { m.Files[0].Path = "../haproxy.cfg" }, `agent client: file path "../haproxy.cfg" escapes the base dir`},
		{"dot dot", func(m *Manifest) { m.Files[0].Path = ".." }, `agent client: file path ".." escapes the base dir`},
		{"not clean", func(m *Manifest) { m.Files[1].Path = "maps/./host.map" }, `agent client: file path "maps/./host.map" is not in cleaned form`},
		{"trailing slash", func(m *Manifest) { m.Files[1].Path = "maps/" }, `agent client: file path "maps/" is not in cleaned form`},
		{"long path", func(m *Manifest) { m.Files[0].Path = strings.Repeat("a", 256) },
			fmt.Sprintf("agent client: file path %q exceeds 255 bytes", strings.Repeat("a", 256))},
		{"NUL", func(m *Manifest) { m.Files[0].Path = "haproxy\x00.cfg" }, `agent client: file path "haproxy\x00.cfg" contains a NUL byte`},
		{"empty path", func(m *Manifest) { m.Files[0].Path = "" }, "agent client: manifest has an empty file path"},
		{"declared twice", func(m *Manifest) { m.Files[1].Path = "haproxy.cfg" }, `agent client: file "haproxy.cfg" is declared twice`},
		{"no digest", func(m *Manifest) { m.Files[1].Digest = "" }, `agent client: file "maps/host.map" has no digest`},
		{"negative size", func(m *Manifest) { m.Files[1].Size = -1 }, `agent client: file "maps/host.map" has a negative size`},
		{"1001 ops", func(m *Manifest) { m.Ops = ops(1001) }, "agent client: 1001 ops exceed the 1000-op limit"},
		{"9 batches", func(m *Manifest) {
			m.OpBatches = [][]Op{ops(1), ops(1), ops(1), ops(1), ops(1), ops(1), ops(1), ops(1)}
		},
			"agent client: 9 operation batches exceed the 8-batch limit"},
		{"empty batch", func(m *Manifest) { m.OpBatches = [][]Op{{}} }, "agent client: operation batch 2 must contain 1 to 1000 ops; got 0"},
	}
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := testManifest()
			tt.mutate(m)
			_, err := c.Apply(context.Background(), m, nil, nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Apply error %v, want %q", err, tt.want)
			}
		})
	}
	if n := len(log.all()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
	if _, err := c.Apply(context.Background(), nil, nil, nil); err == nil || err.Error() != "agent client: manifest is required" {
		t.Fatalf("Apply(nil) error %v", err)
	}
}

func TestApplyValidationOrder(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)

	m := testManifest()
	m.PlanID, m.Mode = "", "sideways"
	_, err := c.Apply(context.Background(), m, nil, nil)
	mustErrorContain(t, err, "no plan_id")

	m = testManifest()
	m.Files[1].Size = MaxApplyBodyBytes + 1
	parts := map[string]io.Reader{"maps/host.map": strings.NewReader("a b"), "maps/other.map": strings.NewReader("x")}
	_, err = c.Apply(context.Background(), m, parts, nil)
	mustErrorContain(t, err, "not a file of this manifest")

	if n := len(log.all()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

func TestApplyRejectsPartForUndeclaredFile(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.Apply(context.Background(), testManifest(), map[string]io.Reader{"maps/other.map": strings.NewReader("x")}, nil)
	if err == nil || err.Error() != `agent client: part "maps/other.map" is not a file of this manifest` {
		t.Fatalf("Apply error %v", err)
	}
	// A nil reader counts as absent.
	if _, err := c.Apply(context.Background(), testManifest(), map[string]io.Reader{"maps/other.map": nil}, nil); err != nil {
		t.Fatalf("Apply with a nil reader: %v", err)
	}
	if n := len(log.all()); n != 1 {
		t.Fatalf("%d requests sent, want 1", n)
	}
}

func TestApplyRejectsShortPartContent(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	for _, tt := range []struct{ content, want string }{
		{"glob", `agent client: part "haproxy.cfg": manifest declares 5 bytes, content yielded 4`},
		{"global", `agent client: part "haproxy.cfg": manifest declares 5 bytes, content yielded 6`},
	} {
		_, err := c.Apply(context.Background(), testManifest(), map[string]io.Reader{"haproxy.cfg": strings.NewReader(tt.content)}, nil)
		if err == nil || err.Error() != tt.want {
			t.Fatalf("Apply error %v, want %q", err, tt.want)
		}
	}
}

// failingReader yields some bytes, then an error.
type failingReader struct{ sent bool }

func (f *failingReader) Read(p []byte) (int, error) {
	if !f.sent {
		f.sent = true
		return copy(p, "gl"), nil
	}
	return 0, errors.New("disk went away")
}

func TestApplyReportsReaderErrors(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	_, err := c.Apply(context.Background(), testManifest(), map[string]io.Reader{"haproxy.cfg": &failingReader{}}, nil)
	if err == nil || err.Error() != `agent client: part "haproxy.cfg": disk went away` {
		t.Fatalf("Apply error %v", err)
	}
	_, err = c.Apply(context.Background(), testManifest(), nil, &failingReader{})
	if err == nil || err.Error() != "agent client: plan blob: disk went away" {
		t.Fatalf("Apply error %v", err)
	}
}

func TestApplyPatchedPart(t *testing.T) {
	// haproxy.cfg is 5 bytes ("globa"); the patch replaces 2 bytes at
	// offset 1 of a 4-byte base, so the part carries 5 − 4 + 2 = 3 bytes.
	patched := func() *Manifest {
		m := testManifest()
		m.Files[0].Patch = &FilePatch{BaseDigest: DigestString("gxxa"), BaseSize: 4, Offset: 1, Length: 2}
		return m
	}
	tests := []struct {
		name   string
		mutate func(*Manifest)
		parts  map[string]io.Reader
		want   string // "" = sent
	}{
		{"replacement bytes", nil, map[string]io.Reader{"haproxy.cfg": strings.NewReader("lob")}, ""},
		{"whole file instead", nil, map[string]io.Reader{"haproxy.cfg": strings.NewReader("globa")}, "manifest declares 3 bytes"},
		{"no part", nil, nil, `agent client: file "haproxy.cfg" declares a patch without a part`},
		{"does not fit", func(m *Manifest) { m.Files[0].Patch.Offset = 3 }, map[string]io.Reader{"haproxy.cfg": strings.NewReader("lob")},
			`agent client: file "haproxy.cfg" declares a patch that does not fit its base`},
		{"negative offset", func(m *Manifest) { m.Files[0].Patch.Offset = -1 }, map[string]io.Reader{"haproxy.cfg": strings.NewReader("lob")},
			"does not fit its base"},
		{"negative replacement", func(m *Manifest) { m.Files[0].Size = 1; m.Files[0].Patch.Length = 0 },
			map[string]io.Reader{"haproxy.cfg": strings.NewReader("")}, "does not fit its base"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
			c := newTestClient(t, srv.URL, nil)
			m := patched()
			if tt.mutate != nil {
				tt.mutate(m)
			}
			_, err := c.Apply(context.Background(), m, tt.parts, nil)
			if tt.want != "" {
				mustErrorContain(t, err, tt.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			parts := multipartParts(t, log.all()[0])
			if len(parts) != 2 || parts[1].Name != "haproxy.cfg" || parts[1].Body != "lob" {
				t.Fatalf("parts %+v", parts)
			}
		})
	}
}

func TestApplyRejectsOversizedPlanBlob(t *testing.T) {
	srv, _ := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	blob := bytes.NewReader(make([]byte, MaxPlanBlobBytes+1))
	_, err := c.Apply(context.Background(), testManifest(), nil, blob)
	if err == nil || err.Error() != "agent client: plan blob exceeds 8388608 bytes" {
		t.Fatalf("Apply error %v", err)
	}
}

func TestApplyCountingWriterCapsTheBody(t *testing.T) {
	var buf bytes.Buffer
	cw := &countingWriter{w: &buf, limit: 10}
	if _, err := cw.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if _, err := cw.Write([]byte("x")); err == nil || err.Error() != "agent client: apply body exceeds 10 bytes" {
		t.Fatalf("write past the limit: %v", err)
	}
	if buf.Len() != 10 {
		t.Fatalf("%d bytes passed the cap", buf.Len())
	}
}

// ---------------------------------------------------------------------------
// PutPlan and skew.

func TestPutPlanMapsTheAgentsAnswers(t *testing.T) {
	tests := []struct {
		name    string
		answer  func(http.ResponseWriter, recordedRequest)
		planID  string
		proof   string
		blob    []byte
		want    func(error) bool
		wantReq bool
	}{
		{"stored", answerJSON(http.StatusOK, PlanStored{PlanID: "plan-1", Proof: "p"}), "plan-1", "p", []byte("blob"),
			func(err error) bool { return err == nil }, true},
		{"moved", answerJSON(http.StatusConflict, PlanMoved{AppliedPlanID: "plan-2"}), "plan-1", "p", []byte("blob"),
			func(err error) bool { return err == ErrPlanMoved }, true},
		{"409 text", answerText(http.StatusConflict, "moved"), "plan-1", "p", []byte("blob"),
			func(err error) bool { return err == ErrPlanMoved }, true},
		{"404", answerText(http.StatusNotFound, "404 page not found"), "plan-1", "p", []byte("blob"),
			func(err error) bool { return err == ErrNoPlanEndpoint }, true},
		{"405", answerText(http.StatusMethodNotAllowed, "Method Not Allowed"), "plan-1", "p", []byte("blob"),
			func(err error) bool { return err == ErrNoPlanEndpoint }, true},
		{"500", answerText(http.StatusInternalServerError, "disk full"), "plan-1", "p", []byte("blob"),
			func(err error) bool { var he *HTTPError; return errors.As(err, &he) && he.Status == 500 }, true},
		{"409 missing", answerJSON(http.StatusConflict, Missing{Missing: []string{"x"}}), "plan-1", "p", []byte("blob"),
			func(err error) bool { var me *MissingError; return errors.As(err, &me) }, true},
		{"empty plan id", nil, "", "p", []byte("blob"),
			func(err error) bool {
				return err != nil && err.Error() == "agent client: plan id and proof are required"
			}, false},
		{"empty proof", nil, "plan-1", "", []byte("blob"),
			func(err error) bool {
				return err != nil && err.Error() == "agent client: plan id and proof are required"
			}, false},
		{"nil blob", nil, "plan-1", "p", nil,
			func(err error) bool {
				return err != nil && err.Error() == "agent client: plan blob of 0 bytes is outside 1..8388608"
			}, false},
		{"oversized blob", nil, "plan-1", "p", make([]byte, MaxPlanBlobBytes+1),
			func(err error) bool {
				return err != nil && err.Error() == "agent client: plan blob of 8388609 bytes is outside 1..8388608"
			}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer := tt.answer
			if answer == nil {
				answer = answerJSON(http.StatusOK, PlanStored{})
			}
			srv, log := startRecordingServer(t, answer)
			c := newTestClient(t, srv.URL, nil)
			err := c.PutPlan(context.Background(), tt.planID, tt.proof, tt.blob)
			if !tt.want(err) {
				t.Fatalf("PutPlan = %v", err)
			}
			reqs := log.all()
			if !tt.wantReq {
				if len(reqs) != 0 {
					t.Fatalf("%d requests sent", len(reqs))
				}
				return
			}
			req := reqs[0]
			if req.Method != http.MethodPut || req.RequestURI != "/v1/plan?plan_id=plan-1&proof=p" || string(req.Body) != "blob" ||
				req.Header.Get("Content-Type") != "application/octet-stream" || req.Header.Get("Content-Length") != "4" {
				t.Fatalf("request %s %s %q %v", req.Method, req.RequestURI, req.Body, req.Header)
			}
			r := &http.Request{Header: req.Header}
			if user, _, ok := r.BasicAuth(); !ok || user != "admin" {
				t.Fatal("PutPlan sent no basic auth")
			}
		})
	}
}

// TestOnlyAConnectErrorIsRetried pins the client's retry rule through the
// transport: a request the agent received may have been acted on, so a
// connection closed after the request was read (a non-connect transport
// error) is returned at once, even for a call whose body can be replayed;
// a refused or reset connection is retried up to ConnectRetries times.
func TestOnlyAConnectErrorIsRetried(t *testing.T) {
	// The server reads the whole request, body included, and closes the
	// connection without answering.
	readThenClose := func(_ int, conn *net.TCPConn) {
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
	}
	calls := map[string]func(c *Client) error{
		"State":  func(c *Client) error { _, err := c.State(context.Background(), StateRead{}); return err },
		"Health": func(c *Client) error { return c.Health(context.Background()) },
		"PutPlan": func(c *Client) error {
			return c.PutPlan(context.Background(), "plan-1", "a:1", []byte("zstd-blob"))
		},
	}
	for name, call := range calls {
		t.Run(name+", closed after the request", func(t *testing.T) {
			addr, accepted := startRawServer(t, readThenClose)
			err := call(newTestClient(t, "http://"+addr, nil))
			if n := accepted.Load(); n != 1 {
				t.Errorf("%d requests reached the server, want 1 (error %v)", n, err)
			}
			if err == nil || isConnectError(err) || strings.Contains(err.Error(), "connect attempts failed") {
				t.Errorf("error %v, want the transport's own non-connect error", err)
			}
		})
	}
	t.Run("State, reset", func(t *testing.T) {
		addr, accepted := startRawServer(t, func(_ int, conn *net.TCPConn) {
			if readRequestHead(bufio.NewReader(conn)) == nil {
				resetConn(conn)
			}
		})
		_, err := newTestClient(t, "http://"+addr, nil).State(context.Background(), StateRead{})
		if !errors.Is(err, syscall.ECONNRESET) || !strings.HasPrefix(err.Error(), "agent client: 4 connect attempts failed: ") {
			t.Fatalf("error %v", err)
		}
		if n := accepted.Load(); n != 4 {
			t.Fatalf("%d connections, want 4", n)
		}
	})
	t.Run("State, refused", func(t *testing.T) {
		c := newTestClient(t, "http://"+closedAddr(t), nil)
		var dials atomic.Int32
		dial := c.transport.DialContext
		c.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}
		_, err := c.State(context.Background(), StateRead{})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("error %v", err)
		}
		if n := dials.Load(); n != 4 {
			t.Fatalf("%d dials, want 4", n)
		}
	})
}
