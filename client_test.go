// This file tests client.go against httptest servers and, where a test
// needs a refused or reset connection, raw TCP listeners. Deploy is tested
// against scripted handlers and against the real agent on the fake HAProxy.

package haptic

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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

func TestHealth(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		wantStatus int // 0 = nil error
	}{
		{"ok", http.StatusOK, 0},
		{"unavailable", http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, log := startRecordingServer(t, answerText(tt.status, "whatever\n"))
			c := newTestClient(t, srv.URL, nil)
			err := c.Health(context.Background())
			var he *HTTPError
			switch {
			case tt.wantStatus == 0 && err != nil:
				t.Fatalf("Health = %v", err)
			case tt.wantStatus != 0 && (!errors.As(err, &he) || he.Status != tt.wantStatus):
				t.Fatalf("Health = %v, want *HTTPError %d", err, tt.wantStatus)
			}
			req := log.all()[0]
			if req.RequestURI != "/healthz" || req.Header.Get("Authorization") != "" {
				t.Fatalf("request %s with Authorization %q", req.RequestURI, req.Header.Get("Authorization"))
			}
		})
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
		_, _, err := c.exchange(context.Background(), func(context.Context) (int, []byte, error) {
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

// ---------------------------------------------------------------------------
// Deploy.

// exampleConfig is the example's haproxy.cfg, the file cmd/basic-apply and
// haptic demo read through internal/example (which imports this package, so
// this test embeds the file rather than the package).
//
//go:embed internal/example/haproxy.cfg
var exampleConfig string

const exampleHostMap = "maps/host.map"

// examplePlan is the plan the example program's buildPlan builds
// (cmd/basic-apply), with the contents known, so that Deploy can resend the
// parts an agent asks for.
func examplePlan(hostMapContent string) *Plan {
	p := &Plan{
		SchemaVersion: PlanSchemaVersion,
		Sections: []Section{{Kind: SectionKindCore, Name: ConfigFilePath, TextDigest: DigestString(exampleConfig),
			Length: len(exampleConfig), Text: exampleConfig, TextKnown: true}},
		Maps: map[string]Map{exampleHostMap: {Path: exampleHostMap, Entries: ParseMapEntries(hostMapContent)}},
		Files: []PlanFile{
			{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true, Digest: DigestString(exampleConfig),
				Size: int64(len(exampleConfig)), Content: exampleConfig, ContentKnown: true},
			{Path: exampleHostMap, Kind: FileKindMap, Digest: DigestString(hostMapContent),
				Size: int64(len(hostMapContent)), Content: hostMapContent, ContentKnown: true},
		},
	}
	p.ComputeID()
	return p
}

const (
	hostMapV1 = "shop.example.com web-servers\n"
	hostMapV2 = "shop.example.com web-servers\nblog.example.com web-servers\n"
	hostMapV3 = "shop.example.com web-servers\nblog.example.com web-servers\nwiki.example.com web-servers\n"
)

// manyKeysMap is a host map of n keys: n map_add ops against an empty map.
func manyKeysMap(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "host%d.example.com web-servers\n", i)
	}
	return b.String()
}

// podState is the state of a pod that applied plan at token, with the blob
// stored and the map loaded: a baseline Diff composes runtime ops against.
func podState(t *testing.T, applied *Plan, token Token) State {
	t.Helper()
	blob, err := EncodePlanBlob(applied)
	if err != nil {
		t.Fatal(err)
	}
	proof := "proof-" + applied.ID
	return State{
		APIVersion: APIVersion, AgentVersion: "scripted", PlanSchemaVersion: PlanSchemaVersion,
		AgentOps: ComposedOps(), Features: []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches},
		HAProxy:       HAProxyInfo{Version: "3.4.3", WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_000_000_000},
		AppliedPlanID: applied.ID, AppliedPlanProof: proof,
		RunningPlanID: applied.ID, RunningPlanProof: proof,
		WorkerOpsPlanID: applied.ID, WorkerOpsPlanProof: proof,
		AppliedToken: token, AppliedPlan: blob, AppliedPlanStored: true,
		Inventory: Inventory{Maps: []string{exampleHostMap}},
	}
}

// ackFor is the ACK an agent gives after applying next.
func ackFor(next *Plan, mode string) ApplyResult {
	return ApplyResult{PlanID: next.ID, OK: true, Mode: mode, AppliedPlanID: next.ID, AppliedPlanProof: "proof-" + next.ID}
}

// scriptedAgent answers Deploy's three routes from scripts; n counts the
// calls of each route from 1. A nil putPlan stores every blob.
type scriptedAgent struct {
	state   func(n int) State
	apply   func(n int, req recordedRequest) (status int, body any)
	putPlan func(n int) (status int, body any)

	log    *requestLog
	mu     sync.Mutex
	counts map[string]int
}

func startScriptedAgent(t *testing.T, a *scriptedAgent) *Client {
	t.Helper()
	a.log = &requestLog{}
	a.counts = map[string]int{}
	srv := httptest.NewServer(recordingHandler(a.log, func(w http.ResponseWriter, req recordedRequest) {
		route := req.Method + " " + strings.SplitN(req.RequestURI, "?", 2)[0]
		a.mu.Lock()
		a.counts[route]++
		n := a.counts[route]
		a.mu.Unlock()
		switch route {
		case "GET " + PathState:
			s := a.state(n)
			if strings.Contains(req.RequestURI, "plan=0") {
				s.AppliedPlan = nil
			}
			answerJSON(http.StatusOK, s)(w, req)
		case "POST " + PathApply:
			status, body := a.apply(n, req)
			answerScripted(status, body)(w, req)
		case "PUT " + PathPlan:
			if a.putPlan == nil {
				answerJSON(http.StatusOK, PlanStored{})(w, req)
				return
			}
			status, body := a.putPlan(n)
			answerScripted(status, body)(w, req)
		default:
			http.NotFound(w, nil)
		}
	}))
	t.Cleanup(srv.Close)
	return newTestClient(t, srv.URL, nil)
}

func answerScripted(status int, body any) func(http.ResponseWriter, recordedRequest) {
	if text, ok := body.(string); ok {
		return answerText(status, text)
	}
	return answerJSON(status, body)
}

// requests returns the recorded requests of one route, e.g. "POST /v1/apply".
func (a *scriptedAgent) requests(route string) []recordedRequest {
	var out []recordedRequest
	for _, r := range a.log.all() {
		if r.Method+" "+strings.SplitN(r.RequestURI, "?", 2)[0] == route {
			out = append(out, r)
		}
	}
	return out
}

// sentApply is one apply request as Deploy sent it.
type sentApply struct {
	manifest     Manifest
	manifestJSON string
	parts        map[string]string // by form name, plan included
	names        []string          // form names in order
}

func decodeApply(t *testing.T, req recordedRequest) sentApply {
	t.Helper()
	parts := multipartParts(t, req)
	if len(parts) == 0 || parts[0].Name != PartManifest {
		t.Fatalf("apply without a leading manifest part: %+v", parts)
	}
	s := sentApply{manifestJSON: parts[0].Body, parts: map[string]string{}}
	if err := json.Unmarshal([]byte(parts[0].Body), &s.manifest); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts[1:] {
		s.parts[p.Name] = p.Body
		s.names = append(s.names, p.Name)
	}
	return s
}

func TestDeployPreconditions(t *testing.T) {
	c := newTestClient(t, "http://agent:5555", nil)
	noID := examplePlan(hostMapV1)
	noID.ID = ""
	for _, tt := range []struct {
		c    *Client
		next *Plan
		want string
	}{
		{nil, examplePlan(hostMapV1), "agent client: deploy: client is required"},
		{c, nil, "agent client: deploy: plan is required"},
		{c, noID, "agent client: deploy: plan has no id"},
	} {
		if _, err := Deploy(context.Background(), tt.c, tt.next, DeployOptions{}); err == nil || err.Error() != tt.want {
			t.Fatalf("Deploy error %v, want %q", err, tt.want)
		}
	}
}

func TestDeployToken(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 3, RenderSeq: 41}) },
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 4}); err != nil {
		t.Fatal(err)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Token != (Token{LeaderEpoch: 4, RenderSeq: 42}) {
		t.Fatalf("token %+v, want {4 42}", sent.manifest.Token)
	}
	if sent.manifest.ExpectedPrevToken != (Token{LeaderEpoch: 3, RenderSeq: 41}) {
		t.Fatalf("expected previous token %+v", sent.manifest.ExpectedPrevToken)
	}
}

func TestDeployUsesCallersAppliedPlan(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1}); err != nil {
		t.Fatal(err)
	}
	reads := agent.requests("GET /v1/state")
	if len(reads) != 1 || reads[0].RequestURI != "/v1/state?plan=0" {
		t.Fatalf("state reads %+v", reads)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Mode != ModeAuto || len(sent.manifest.Ops) != 1 || sent.manifest.Ops[0].Kind != OpMapAdd {
		t.Fatalf("manifest mode %s ops %+v", sent.manifest.Mode, sent.manifest.Ops)
	}
}

func TestDeployRereadsWhenCallersPlanIsStale(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	other := examplePlan("other.example.com web-servers\n")
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: other}); err != nil {
		t.Fatal(err)
	}
	reads := agent.requests("GET /v1/state")
	if len(reads) != 2 || reads[0].RequestURI != "/v1/state?plan=0" || reads[1].RequestURI != "/v1/state" {
		t.Fatalf("state reads %+v", reads)
	}
	// The second read's blob is the baseline: the change stays runtime.
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Mode != ModeAuto || len(sent.manifest.Ops) != 1 {
		t.Fatalf("manifest mode %s ops %+v", sent.manifest.Mode, sent.manifest.Ops)
	}
}

func TestDeployRediffsOnBaselineConflict(t *testing.T) {
	for _, reason := range []string{ReasonPrevMismatch, ReasonUnknownBaseline, ReasonWorkerOpsMismatch} {
		t.Run(reason, func(t *testing.T) {
			v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(hostMapV3)
			agent := &scriptedAgent{
				// The pod moved from v1 to v2 under the first round.
				state: func(n int) State {
					if n == 1 {
						return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1})
					}
					return podState(t, v2, Token{LeaderEpoch: 1, RenderSeq: 2})
				},
				apply: func(n int, _ recordedRequest) (int, any) {
					if n == 1 {
						return 409, Conflict{AppliedPlanID: v2.ID, AppliedToken: Token{LeaderEpoch: 1, RenderSeq: 2}, Reason: reason}
					}
					return 200, ackFor(v3, ResultRuntime)
				},
			}
			c := startScriptedAgent(t, agent)
			res, err := Deploy(context.Background(), c, v3, DeployOptions{LeaderEpoch: 1})
			if err != nil || !res.OK {
				t.Fatalf("Deploy = %+v, %v", res, err)
			}
			applies := agent.requests("POST /v1/apply")
			if n := len(agent.requests("GET /v1/state")); n != 2 || len(applies) != 2 {
				t.Fatalf("%d state reads, %d applies; want 2 and 2", n, len(applies))
			}
			second := decodeApply(t, applies[1]).manifest
			if second.ExpectedPrevPlanID != v2.ID || second.Token.RenderSeq != 3 || len(second.Ops) != 1 {
				t.Fatalf("re-diffed manifest %+v", second)
			}
		})
	}
}

func TestDeployGivesUpAfterThreeRediffs(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) {
			return 409, Conflict{AppliedPlanID: "elsewhere", Reason: ReasonPrevMismatch}
		},
	}
	c := startScriptedAgent(t, agent)
	_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Reason != ReasonPrevMismatch {
		t.Fatalf("Deploy error %v, want the prev_mismatch conflict", err)
	}
	if r, a := len(agent.requests("GET /v1/state")), len(agent.requests("POST /v1/apply")); r != 4 || a != 4 {
		t.Fatalf("%d state reads, %d applies; want 4 and 4", r, a)
	}
}

func TestDeployReturnsStaleEpochAtOnce(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	for _, reason := range []string{ReasonStaleEpoch, ReasonRevertTargetMismatch, "some_future_reason"} {
		agent := &scriptedAgent{
			state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 9, RenderSeq: 1}) },
			apply: func(int, recordedRequest) (int, any) {
				return 409, Conflict{AppliedPlanID: v1.ID, AppliedToken: Token{LeaderEpoch: 9, RenderSeq: 1}, Reason: reason}
			},
		}
		c := startScriptedAgent(t, agent)
		_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 8})
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Reason != reason {
			t.Fatalf("Deploy error %v, want the %s conflict", err, reason)
		}
		if a := len(agent.requests("POST /v1/apply")); a != 1 {
			t.Fatalf("%s: %d applies, want 1", reason, a)
		}
	}
}

func TestDeployResendsExactlyTheMissingParts(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(n int, _ recordedRequest) (int, any) {
			if n == 1 {
				return 409, Missing{Missing: []string{exampleHostMap}}
			}
			return 200, ackFor(v2, ResultRuntime)
		},
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	applies := agent.requests("POST /v1/apply")
	if len(applies) != 2 || len(agent.requests("GET /v1/state")) != 1 {
		t.Fatalf("%d applies", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if len(first.names) != 0 {
		t.Fatalf("first apply carried parts %v", first.names)
	}
	if len(resend.names) != 1 || resend.parts[exampleHostMap] != hostMapV2 {
		t.Fatalf("resend carried %v", resend.names)
	}
	if resend.manifestJSON != first.manifestJSON {
		t.Fatalf("the resend changed the manifest:\n%s\n%s", first.manifestJSON, resend.manifestJSON)
	}
}

func TestDeployMissingContentIsAnError(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	v2.Files[1].Content, v2.Files[1].ContentKnown = "", false
	for _, tt := range []struct {
		missing string
		want    string
	}{
		{exampleHostMap, fmt.Sprintf("agent client: deploy: plan %s has no content for %q", v2.ID, exampleHostMap)},
		{"maps/other.map", fmt.Sprintf("agent client: deploy: the agent asks for %q, which is not a file of plan %s", "maps/other.map", v2.ID)},
	} {
		agent := &scriptedAgent{
			state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
			apply: func(int, recordedRequest) (int, any) { return 409, Missing{Missing: []string{tt.missing}} },
		}
		c := startScriptedAgent(t, agent)
		_, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
		if err == nil || err.Error() != tt.want {
			t.Fatalf("Deploy error %v, want %q", err, tt.want)
		}
		if a := len(agent.requests("POST /v1/apply")); a != 1 {
			t.Fatalf("%d applies, want 1", a)
		}
	}
}

func TestDeployNoPlanEndpoint(t *testing.T) {
	v1, v2, v3 := examplePlan(hostMapV1), examplePlan(hostMapV2), examplePlan(hostMapV3)
	var current atomic.Pointer[Plan]
	current.Store(v1)
	agent := &scriptedAgent{
		state: func(int) State {
			s := podState(t, current.Load(), Token{LeaderEpoch: 1, RenderSeq: 1})
			s.AppliedPlan, s.AppliedPlanStored = nil, false
			return s
		},
		apply: func(n int, req recordedRequest) (int, any) {
			next := v2
			if n == 2 {
				next = v3
			}
			current.Store(next)
			return 200, ackFor(next, ResultRuntime)
		},
		putPlan: func(int) (int, any) { return 404, "404 page not found" },
	}
	c := startScriptedAgent(t, agent)
	res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, Applied: v1})
	if err != nil || !res.OK {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if n := len(agent.requests("PUT /v1/plan")); n != 1 {
		t.Fatalf("%d PutPlan calls, want 1", n)
	}
	if _, err := Deploy(context.Background(), c, v3, DeployOptions{LeaderEpoch: 1, Applied: v2}); err != nil {
		t.Fatal(err)
	}
	applies := agent.requests("POST /v1/apply")
	first, second := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if _, ok := first.parts[PartPlan]; ok {
		t.Fatal("the first runtime apply carried the blob")
	}
	blob, ok := second.parts[PartPlan]
	if !ok || second.manifest.Mode != ModeAuto {
		t.Fatalf("the second apply (mode %s) carried no plan part: %v", second.manifest.Mode, second.names)
	}
	decoded, err := DecodePlanBlob([]byte(blob))
	if err != nil || decoded.ID != v3.ID {
		t.Fatalf("plan part decodes to %v, %v", decoded, err)
	}
	if n := len(agent.requests("PUT /v1/plan")); n != 1 {
		t.Fatalf("%d PutPlan calls after the blob rode the apply, want still 1", n)
	}
}

func TestDeployIgnoresPlanMoved(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	for _, answer := range []struct {
		status int
		body   any
	}{
		{409, PlanMoved{AppliedPlanID: "plan-later"}},
		{500, ApplyError{Stage: StagePlan, Message: "disk full"}},
	} {
		agent := &scriptedAgent{
			state:   func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
			apply:   func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultRuntime) },
			putPlan: func(int) (int, any) { return answer.status, answer.body },
		}
		c := startScriptedAgent(t, agent)
		res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
		if err != nil || !res.OK || res.AppliedPlanID != v2.ID {
			t.Fatalf("PutPlan %d: Deploy = %+v, %v", answer.status, res, err)
		}
		puts := agent.requests("PUT /v1/plan")
		wantURI := "/v1/plan?" + url.Values{"plan_id": {v2.ID}, "proof": {"proof-" + v2.ID}}.Encode()
		if len(puts) != 1 || puts[0].RequestURI != wantURI {
			t.Fatalf("PutPlan requests %+v", puts)
		}
	}
}

func TestDeployNACKIsNotAnError(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) },
		apply: func(int, recordedRequest) (int, any) {
			return 200, ApplyResult{PlanID: v2.ID, Mode: ResultRejected, Error: &ApplyError{Stage: StageReload, Message: "Success=0"}}
		},
	}
	c := startScriptedAgent(t, agent)
	res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1})
	if err != nil || res.OK || res.Error == nil || res.Error.Stage != StageReload {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if a, p := len(agent.requests("POST /v1/apply")), len(agent.requests("PUT /v1/plan")); a != 1 || p != 0 {
		t.Fatalf("%d applies and %d PutPlan calls, want 1 and 0", a, p)
	}
}

func TestDeployMajorSkewReloads(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	agent := &scriptedAgent{
		state: func(int) State {
			s := podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1})
			s.APIVersion = APIVersion + 1
			return s
		},
		apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, ResultReload) },
	}
	c := startScriptedAgent(t, agent)
	if _, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
	if sent.manifest.Mode != ModeReload || len(sent.manifest.Ops) != 0 || len(sent.manifest.Files) != len(v2.Files) {
		t.Fatalf("manifest mode %s, %d ops, %d files", sent.manifest.Mode, len(sent.manifest.Ops), len(sent.manifest.Files))
	}
	if _, ok := sent.parts[PartPlan]; !ok {
		t.Fatal("the reload apply carried no blob")
	}
	if p := len(agent.requests("PUT /v1/plan")); p != 0 {
		t.Fatalf("%d PutPlan calls after a reload apply", p)
	}
}

func TestDeployNeverSendsBatchesWithoutRuntimeBatches(t *testing.T) {
	empty, big := examplePlan(""), examplePlan(manyKeysMap(MaxOpsPerApply+1))
	for _, tt := range []struct {
		name        string
		features    []string
		wantMode    string
		wantBatches int
	}{
		{"with runtime_batches", []string{FeatureFilePatch, FeatureWorkerFence, FeatureRuntimeBatches}, ModeAuto, 1},
		{"without runtime_batches", []string{FeatureFilePatch, FeatureWorkerFence}, ModeReload, 0},
		{"no features", nil, ModeReload, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			agent := &scriptedAgent{
				state: func(int) State {
					s := podState(t, empty, Token{LeaderEpoch: 1, RenderSeq: 1})
					s.Features = tt.features
					return s
				},
				apply: func(int, recordedRequest) (int, any) { return 200, ackFor(big, ResultRuntime) },
			}
			c := startScriptedAgent(t, agent)
			if _, err := Deploy(context.Background(), c, big, DeployOptions{LeaderEpoch: 1}); err != nil {
				t.Fatal(err)
			}
			m := decodeApply(t, agent.requests("POST /v1/apply")[0]).manifest
			if m.Mode != tt.wantMode || len(m.OpBatches) != tt.wantBatches {
				t.Fatalf("manifest mode %s with %d op batches", m.Mode, len(m.OpBatches))
			}
		})
	}
}

func TestDeployBlobOverLimitIsNotSent(t *testing.T) {
	v1, v2 := examplePlan(hostMapV1), examplePlan(hostMapV2)
	oversized := make([]byte, MaxPlanBlobBytes+1)
	for _, tt := range []struct {
		name  string
		state func() State
		mode  string
	}{
		{"runtime", func() State { return podState(t, v1, Token{LeaderEpoch: 1, RenderSeq: 1}) }, ResultRuntime},
		{"reload", func() State { return State{APIVersion: APIVersion, AgentOps: ComposedOps()} }, ResultReload},
	} {
		t.Run(tt.name, func(t *testing.T) {
			agent := &scriptedAgent{
				state: func(int) State { return tt.state() },
				apply: func(int, recordedRequest) (int, any) { return 200, ackFor(v2, tt.mode) },
			}
			c := startScriptedAgent(t, agent)
			res, err := Deploy(context.Background(), c, v2, DeployOptions{LeaderEpoch: 1, PlanBlob: oversized})
			if err != nil || !res.OK {
				t.Fatalf("Deploy = %+v, %v", res, err)
			}
			sent := decodeApply(t, agent.requests("POST /v1/apply")[0])
			if _, ok := sent.parts[PartPlan]; ok {
				t.Fatal("an oversized blob was sent as the plan part")
			}
			if p := len(agent.requests("PUT /v1/plan")); p != 0 {
				t.Fatalf("%d PutPlan calls with an oversized blob", p)
			}
		})
	}
}

func TestCheckSkew(t *testing.T) {
	composable := ComposableOps()
	lacksLastTwo := composable[:len(composable)-2]
	tests := []struct {
		name        string
		state       *State
		wantMajor   bool
		wantMissing []string
	}{
		{"matching agent", &State{APIVersion: APIVersion, AgentOps: composable}, false, nil},
		{"agent advertising more kinds", &State{APIVersion: APIVersion, AgentOps: append(ComposableOps(), OpShutdownSessions)}, false, nil},
		{"newer major", &State{APIVersion: APIVersion + 1, AgentOps: composable}, true, nil},
		{"lacks the last two kinds", &State{APIVersion: APIVersion, AgentOps: lacksLastTwo},
			false, composable[len(composable)-2:]},
		{"nil state", nil, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			major, missing := CheckSkew(tt.state)
			if major != tt.wantMajor || !slices.Equal(missing, tt.wantMissing) || (tt.wantMissing == nil) != (missing == nil) {
				t.Fatalf("CheckSkew = %v, %#v; want %v, %#v", major, missing, tt.wantMajor, tt.wantMissing)
			}
		})
	}
	if _, missing := CheckSkew(&State{APIVersion: APIVersion, AgentOps: lacksLastTwo}); !slices.Equal(missing, []string{OpCRTListAdd, OpCRTListDel}) {
		t.Fatalf("missing %v, want crtlist_add and crtlist_del", missing)
	}
}

func TestComposableOpsEqualsComposedOps(t *testing.T) {
	got := ComposableOps()
	if !slices.Equal(got, ComposedOps()) {
		t.Fatalf("ComposableOps %v, ComposedOps %v", got, ComposedOps())
	}
	got[0] = "mutated"
	if again := ComposableOps(); again[0] == "mutated" || !slices.Equal(again, ComposedOps()) {
		t.Fatal("mutating the returned slice changed the next call's result")
	}
}

// ---------------------------------------------------------------------------
// Deploy against the real agent on the fake HAProxy.

// weightPlan is a render with one dynamic backend, web-servers, whose one
// server web1 has the given weight: a weight change is one
// server_set_weight at runtime.
func weightPlan(weight int) *Plan {
	const global = "global\n    stats socket /etc/haproxy/haproxy-worker.sock mode 600 level admin\n\n"
	const defaults = "defaults web\n    mode http\n    timeout connect 5s\n\n"
	const body = "    balance roundrobin\n"
	backend := fmt.Sprintf("backend web-servers\n%s    server web1 192.168.1.10:80 weight %d\n", body, weight)
	config := global + defaults + backend
	w := weight
	p := &Plan{
		SchemaVersion: PlanSchemaVersion,
		Sections: []Section{
			{Kind: SectionKindCore, Name: "global", TextDigest: DigestString(global), Length: len(global), Text: global, TextKnown: true},
			{Kind: SectionKindProfile, Name: "web", TextDigest: DigestString(defaults), Length: len(defaults), Text: defaults, TextKnown: true},
			{Kind: SectionKindBackend, Name: "web-servers", TextDigest: DigestString(backend), Length: len(backend), Text: backend, TextKnown: true},
		},
		Backends: map[string]Backend{"web-servers": {
			Name: "web-servers", Profile: "web", Mode: "http", Balance: "roundrobin", Shape: ShapeDynamic,
			Servers:        []Server{{Name: "web1", Address: "192.168.1.10", Port: 80, Weight: &w}},
			BodyDigest:     DigestString(body),
			CommentsDigest: DigestString(""),
			RecordDigest:   DigestString(fmt.Sprintf("web-servers web http roundrobin web1 192.168.1.10:80 weight %d", weight)),
			TextDigest:     DigestString(backend),
		}},
		Profiles: map[string]Profile{"web": {Name: "web", BodyDigest: DigestString(defaults)}},
		Files: []PlanFile{{Path: ConfigFilePath, Kind: FileKindConfig, ReloadOnChange: true, Digest: DigestString(config),
			Size: int64(len(config)), Content: config, ContentKnown: true}},
	}
	p.ComputeID()
	return p
}

// seedWebServers gives the fake's worker the backend weightPlan describes.
func seedWebServers(fake *FakeHAProxy) {
	fake.With(func(m *FakeModel) {
		if m.Backends == nil {
			m.Backends = map[string]*FakeBackend{}
		}
		m.Backends["web-servers"] = &FakeBackend{Profile: "web", Mode: "http", Published: true, Servers: []*FakeServer{
			{Name: "web1", Address: "192.168.1.10", Port: 80, Weight: 1, State: ServerStateReady, Enabled: true},
		}}
	})
}

// seedHostMap gives the fake's worker the example's host map, loaded.
func seedHostMap(fake *FakeHAProxy, content string) {
	fake.With(func(m *FakeModel) {
		if m.Maps == nil {
			m.Maps = map[string][]MapEntry{}
		}
		m.Maps[exampleHostMap] = ParseMapEntries(content)
	})
}

// startRecordingProxy forwards every request to the agent at addr after
// recording it and running before (when set), so that a test sees the
// wire of a Deploy that talks to a real agent.
func startRecordingProxy(t testing.TB, addr string, before func(req recordedRequest)) (string, *requestLog) {
	t.Helper()
	target, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	log := &requestLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := recordedRequest{Method: r.Method, RequestURI: r.RequestURI, Header: r.Header.Clone(), Body: body}
		log.add(rec)
		if before != nil {
			before(rec)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.TransferEncoding = nil
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, log
}

// routeRequests returns the recorded requests of one route, e.g. "POST /v1/apply".
func routeRequests(log *requestLog, route string) []recordedRequest {
	var out []recordedRequest
	for _, r := range log.all() {
		if r.Method+" "+strings.SplitN(r.RequestURI, "?", 2)[0] == route {
			out = append(out, r)
		}
	}
	return out
}

func deployClient(t testing.TB, baseURL string) *Client {
	t.Helper()
	return newTestClient(t, baseURL, func(cfg *ClientConfig) { cfg.Username, cfg.Password = "haptic", "s3cret" })
}

func TestDeployToAFreshAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedHostMap(fake, hostMapV1)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)

	v1 := examplePlan(hostMapV1)
	res, err := Deploy(context.Background(), c, v1, DeployOptions{LeaderEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Mode != ResultReload || res.AppliedPlanID != v1.ID {
		t.Fatalf("result %+v", res)
	}
	applies := routeRequests(log, "POST /v1/apply")
	if len(applies) != 2 {
		t.Fatalf("%d applies, want 2", len(applies))
	}
	first, resend := decodeApply(t, applies[0]), decodeApply(t, applies[1])
	if first.manifest.Mode != ModeReload || len(first.names) != 1 || first.names[0] != PartPlan {
		t.Fatalf("first apply: mode %s, parts %v", first.manifest.Mode, first.names)
	}
	if len(resend.names) != 3 || resend.names[0] != PartPlan ||
		resend.parts[ConfigFilePath] != exampleConfig || resend.parts[exampleHostMap] != hostMapV1 {
		t.Fatalf("resend parts %v", resend.names)
	}
	if resend.manifestJSON != first.manifestJSON {
		t.Fatal("the resend changed the manifest")
	}
	if n := len(routeRequests(log, "PUT /v1/plan")); n != 0 {
		t.Fatalf("%d PutPlan calls after a reload deploy", n)
	}
	state, err := c.State(context.Background(), StateRead{})
	if err != nil {
		t.Fatal(err)
	}
	if !state.AppliedPlanStored || state.AppliedPlanID != v1.ID {
		t.Fatalf("state: applied %s, stored %v", state.AppliedPlanID, state.AppliedPlanStored)
	}
}

func TestDeployRuntimeChangeStoresTheBlob(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)

	v10, v20, v30 := weightPlan(10), weightPlan(20), weightPlan(30)
	if res, err := Deploy(context.Background(), c, v10, DeployOptions{LeaderEpoch: 1}); err != nil || res.Mode != ResultReload {
		t.Fatalf("first deploy = %+v, %v", res, err)
	}
	before := len(log.all())
	res, err := Deploy(context.Background(), c, v20, DeployOptions{LeaderEpoch: 1, Applied: v10})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Mode != ResultRuntime || res.AppliedPlanProof == "" {
		t.Fatalf("second deploy = %+v", res)
	}
	var applies, puts []recordedRequest
	for _, r := range log.all()[before:] {
		switch r.Method + " " + strings.SplitN(r.RequestURI, "?", 2)[0] {
		case "POST /v1/apply":
			applies = append(applies, r)
		case "PUT /v1/plan":
			puts = append(puts, r)
		}
	}
	for _, a := range applies {
		if sent := decodeApply(t, a); sent.parts[PartPlan] != "" {
			t.Fatalf("a runtime apply carried the blob (mode %s)", sent.manifest.Mode)
		}
	}
	wantURI := "/v1/plan?" + url.Values{"plan_id": {res.AppliedPlanID}, "proof": {res.AppliedPlanProof}}.Encode()
	if len(puts) != 1 || puts[0].RequestURI != wantURI {
		t.Fatalf("PutPlan requests %+v, want one to %s", puts, wantURI)
	}
	if s, ok := fake.Server("web-servers", "web1"); !ok || s.Weight != 20 {
		t.Fatalf("web1 = %+v", s)
	}

	// A cold leader: a new client, no plan of its own. The stored blob is
	// its baseline, and the next change is runtime again.
	cold := deployClient(t, agentBaseURL(agent))
	res, err = Deploy(context.Background(), cold, v30, DeployOptions{LeaderEpoch: 2})
	if err != nil || res.Mode != ResultRuntime {
		t.Fatalf("cold deploy = %+v, %v", res, err)
	}
	if s, _ := fake.Server("web-servers", "web1"); s.Weight != 30 {
		t.Fatalf("web1 weight %d, want 30", s.Weight)
	}
}

func agentBaseURL(a *Agent) string { return "http://" + a.Addr() }

func TestDeployRediffsAgainstTheAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	direct := deployClient(t, agentBaseURL(agent))
	if _, err := Deploy(context.Background(), direct, weightPlan(10), DeployOptions{LeaderEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	// Another controller moves the pod while this deploy's first apply is
	// on its way: the agent fences it, and the deploy re-diffs.
	var once sync.Once
	proxyURL, log := startRecordingProxy(t, agent.Addr(), func(req recordedRequest) {
		if req.Method == http.MethodPost {
			once.Do(func() {
				if _, err := Deploy(context.Background(), direct, weightPlan(15), DeployOptions{LeaderEpoch: 1}); err != nil {
					t.Error(err)
				}
			})
		}
	})
	res, err := Deploy(context.Background(), deployClient(t, proxyURL), weightPlan(20), DeployOptions{LeaderEpoch: 1})
	if err != nil || !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("Deploy = %+v, %v", res, err)
	}
	if n := len(routeRequests(log, "GET /v1/state")); n != 2 {
		t.Fatalf("%d state reads, want 2", n)
	}
	if s, _ := fake.Server("web-servers", "web1"); s.Weight != 20 {
		t.Fatalf("web1 weight %d, want 20", s.Weight)
	}
}

func TestDeployStaleEpochAgainstTheAgent(t *testing.T) {
	fake := startTestFake(t, "")
	seedWebServers(fake)
	agent := startTestAgent(t, fake, nil)
	proxyURL, log := startRecordingProxy(t, agent.Addr(), nil)
	c := deployClient(t, proxyURL)
	if _, err := Deploy(context.Background(), c, weightPlan(10), DeployOptions{LeaderEpoch: 5}); err != nil {
		t.Fatal(err)
	}
	before := len(routeRequests(log, "POST /v1/apply"))
	_, err := Deploy(context.Background(), c, weightPlan(20), DeployOptions{LeaderEpoch: 4})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Reason != ReasonStaleEpoch || ce.AppliedToken.LeaderEpoch != 5 {
		t.Fatalf("Deploy error %v, want stale_epoch", err)
	}
	if n := len(routeRequests(log, "POST /v1/apply")) - before; n != 1 {
		t.Fatalf("%d applies, want 1", n)
	}
}

// ---------------------------------------------------------------------------
// Benchmarks.

// hostMapValue is the example map with shop.example.com pointing at value:
// two of them differ by one map_set.
func hostMapValue(value string) string { return "shop.example.com " + value + "\n" }

func BenchmarkDeployRuntimeMapEntry(b *testing.B) {
	fake := startTestFake(b, "")
	seedHostMap(fake, hostMapValue("web-a"))
	agent := startTestAgent(b, fake, nil)
	c := deployClient(b, agentBaseURL(agent))
	plans := [2]*Plan{examplePlan(hostMapValue("web-a")), examplePlan(hostMapValue("web-b"))}
	var blobs [2][]byte
	for i, p := range plans {
		blob, err := EncodePlanBlob(p)
		if err != nil {
			b.Fatal(err)
		}
		blobs[i] = blob
	}
	ctx := context.Background()
	if _, err := Deploy(ctx, c, plans[0], DeployOptions{LeaderEpoch: 1, PlanBlob: blobs[0]}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		next, prev := (i+1)%2, i%2
		res, err := Deploy(ctx, c, plans[next], DeployOptions{LeaderEpoch: 1, Applied: plans[prev], PlanBlob: blobs[next]})
		if err != nil || res.Mode != ResultRuntime {
			b.Fatalf("Deploy = %+v, %v", res, err)
		}
	}
}

func BenchmarkApplyRuntimeMapEntry(b *testing.B) {
	fake := startTestFake(b, "")
	seedHostMap(fake, hostMapValue("web-a"))
	agent := startTestAgent(b, fake, nil)
	c := deployClient(b, agentBaseURL(agent))
	ctx := context.Background()
	plans := [2]*Plan{examplePlan(hostMapValue("web-a")), examplePlan(hostMapValue("web-b"))}
	if _, err := Deploy(ctx, c, plans[0], DeployOptions{LeaderEpoch: 1}); err != nil {
		b.Fatal(err)
	}
	state, err := c.State(ctx, StateRead{})
	if err != nil {
		b.Fatal(err)
	}
	// Both directions are one map_set; each apply carries the map's part.
	var decisions [2]Decision
	for i := range plans {
		base, err := BaselineFromState(state)
		if err != nil {
			b.Fatal(err)
		}
		base.Applied, base.Running, base.WorkerOps = plans[i], plans[i], plans[i]
		decisions[(i+1)%2] = Diff(plans[(i+1)%2], base)
		if decisions[(i+1)%2].Verdict != VerdictRuntime {
			b.Fatalf("decision %+v", decisions[(i+1)%2])
		}
	}
	b.ResetTimer()
	for i := range b.N {
		next := (i + 1) % 2
		m := NewManifest(plans[next], decisions[next], state, Token{LeaderEpoch: 1, RenderSeq: state.AppliedToken.RenderSeq + 1})
		part := map[string]io.Reader{exampleHostMap: strings.NewReader(plans[next].Files[1].Content)}
		res, err := c.Apply(ctx, m, part, nil)
		if err != nil || res.Mode != ResultRuntime {
			b.Fatalf("Apply = %+v, %v", res, err)
		}
		state.AppliedPlanID, state.AppliedPlanProof = res.AppliedPlanID, res.AppliedPlanProof
		state.WorkerOpsPlanID, state.WorkerOpsPlanProof = res.WorkerOpsPlanID, res.WorkerOpsPlanProof
		state.RunningPlanID, state.RunningPlanProof = res.RunningPlanID, res.RunningPlanProof
		state.AppliedToken = res.AppliedToken
	}
}

func TestDeployOverTheAdminSocketIsRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fake := startTestFake(t, "")
	sock := filepath.Join(dir, "admin.sock")
	startTestAgent(t, fake, func(cfg *AgentConfig) { cfg.AdminSocket = sock })
	c := newTestClient(t, "http://localhost", func(cfg *ClientConfig) { cfg.UnixSocket = sock })
	if err := c.Health(context.Background()); err != nil {
		t.Fatalf("Health over the admin socket: %v", err)
	}
	_, err = Deploy(context.Background(), c, examplePlan(hostMapV1), DeployOptions{LeaderEpoch: 1})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound {
		t.Fatalf("Deploy over the admin socket: %v, want *HTTPError 404", err)
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
