// This file owns the controller's end of the wire: one pooled HTTP/1.1 client
// per agent, the state read, the streamed multipart apply, the plan upload,
// the health probe, the error types a deployer acts on, and Deploy, the whole
// state → diff → apply loop for one pod.
//
// It must never send a request it has not validated, never replay a body
// whose readers already yielded bytes, never follow a redirect, never send
// credentials over a unix socket, and never read a caller's reader after the
// call that was given it has returned.

package haptic

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Client-only values: the agent never sees them, so they are not part of
// the wire contract.
const (
	defaultTimeout      = 10 * time.Second // State, Health and Ready calls
	defaultApplyTimeout = 2 * time.Minute  // Apply and PutPlan calls
	dialTimeout         = 5 * time.Second  // TCP and unix dial
	idleConnTimeout     = 90 * time.Second // idle pooled connections
	maxErrorBodyBytes   = 4 << 10          // truncation of HTTPError.Body
)

// ClientConfig configures one Client. NewClient copies it: changing it
// afterwards has no effect on the client.
type ClientConfig struct {
	// BaseURL is http://host:port or https://host:port, optionally with a
	// path prefix. Required.
	BaseURL string
	// Username and Password are the HTTP Basic credentials, sent when either
	// is non-empty, never over a unix socket.
	Username, Password string
	// TLS holds the client TLS settings (roots, client certificate or
	// GetClientCertificate for rotation, server name). It requires an https
	// BaseURL. nil means Go's defaults for https.
	TLS *tls.Config
	// UnixSocket is the path of a unix socket to dial instead of TCP (the
	// agent's admin socket). It requires an http BaseURL such as
	// http://localhost, whose host only fills the Host header.
	UnixSocket string
	// The rest take their default when zero or negative.
	Timeout             time.Duration // of State, Health and Ready calls; 10 s
	PerPodApplyTimeout  time.Duration // of Apply and PutPlan calls; 2 min
	ConnectRetries      int           // retries after a refused or reset connection; ConnectRetries (3)
	ConnectRetryBackoff time.Duration // the fixed wait before each retry; 100 ms
}

// Client talks to one agent over one pooled keep-alive HTTP/1.1 client. It
// is safe for concurrent use by several goroutines.
type Client struct {
	cfg       ClientConfig // the caller's config, copied, defaults applied, TLS cloned
	baseURL   string       // cfg.BaseURL without one trailing slash
	transport *http.Transport
	http      *http.Client

	// noPlanEndpoint is set once PUT /v1/plan answered 404 or 405: every
	// later Deploy through this client carries the blob as the plan part.
	noPlanEndpoint atomic.Bool
}

// NewClient checks cfg, in a fixed order so that a bad configuration always
// gets the same error, and builds a client with its own transport.
func NewClient(cfg *ClientConfig) (*Client, error) {
	if cfg == nil {
		return nil, errors.New("agent client: ClientConfig is required")
	}
	u, err := url.Parse(cfg.BaseURL)
	switch {
	case cfg.BaseURL == "":
		return nil, errors.New("agent client: BaseURL is required")
	case err != nil:
		return nil, fmt.Errorf("agent client: BaseURL %q: %v", cfg.BaseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("agent client: BaseURL %q must be http or https", cfg.BaseURL)
	case u.Host == "":
		return nil, fmt.Errorf("agent client: BaseURL %q has no host", cfg.BaseURL)
	case cfg.UnixSocket != "" && cfg.TLS != nil:
		return nil, errors.New("agent client: UnixSocket and TLS cannot be combined")
	case cfg.TLS != nil && u.Scheme == "http":
		return nil, fmt.Errorf("agent client: BaseURL %q must be https when TLS is set", cfg.BaseURL)
	case cfg.UnixSocket != "" && u.Scheme == "https":
		return nil, fmt.Errorf("agent client: BaseURL %q must be http when UnixSocket is set", cfg.BaseURL)
	}
	c := &Client{cfg: *cfg, baseURL: strings.TrimSuffix(cfg.BaseURL, "/")}
	c.cfg.Timeout = positiveOr(c.cfg.Timeout, defaultTimeout)
	c.cfg.PerPodApplyTimeout = positiveOr(c.cfg.PerPodApplyTimeout, defaultApplyTimeout)
	c.cfg.ConnectRetries = positiveOr(c.cfg.ConnectRetries, ConnectRetries)
	c.cfg.ConnectRetryBackoff = positiveOr(c.cfg.ConnectRetryBackoff, ConnectRetryBackoffMs*time.Millisecond)
	if cfg.TLS != nil {
		c.cfg.TLS = cfg.TLS.Clone()
	}
	c.transport = newAgentTransport(c.cfg.TLS, c.cfg.UnixSocket)
	c.http = &http.Client{
		Transport: c.transport,
		// A redirect is never followed: an agent never sends one, so a 3xx
		// is a misrouted request, and following it would carry the
		// credentials and the body to a host nobody configured.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

func positiveOr[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// newAgentTransport builds the transport of one client. It never uses a proxy:
// an inherited HTTPS_PROXY must not divert pod-IP traffic. It speaks HTTP/1.1
// only: the agent serves nothing else, and the streamed apply body relies on
// one request per connection.
func newAgentTransport(tlsConfig *tls.Config, unixSocket string) *http.Transport {
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          4,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       idleConnTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		TLSClientConfig:       tlsConfig,
	}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP1(true)
	if tlsConfig != nil {
		// Offer only HTTP/1.1 in ALPN, so that a caller's NextProtos
		// listing h2 cannot make the server pick a protocol this
		// transport does not speak. The config is already our own clone.
		tlsConfig.NextProtos = []string{"http/1.1"}
	}
	if unixSocket != "" {
		t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", unixSocket)
		}
	}
	return t
}

// Close closes the idle pooled connections and returns nil. The client
// stays usable: a later call opens new connections.
func (c *Client) Close() error {
	c.transport.CloseIdleConnections()
	return nil
}

// ---------------------------------------------------------------------------
// Errors.

// ErrPlanMoved is PutPlan's answer when the pod's applied plan is no longer
// the one the blob was meant for: the pod moved on and the blob was dropped.
var ErrPlanMoved = errors.New("agent client: the pod's applied plan has moved on")

// ErrNoPlanEndpoint is PutPlan's answer when the agent has no PUT /v1/plan
// (404 or 405): the blob must then ride the next apply as its plan part.
var ErrNoPlanEndpoint = errors.New("agent client: the agent has no plan endpoint")

// ConflictError is a 409 whose body is a Conflict: fencing refused the
// manifest and nothing was written. It reports the agent's actual baseline
// so the caller can re-diff.
type ConflictError struct{ Conflict }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("agent rejected the apply (%s): its applied plan is %q at epoch %d/seq %d",
		e.Reason, e.AppliedPlanID, e.AppliedToken.LeaderEpoch, e.AppliedToken.RenderSeq)
}

// MissingError is a 409 whose body is a Missing: the agent needs these file
// parts and wrote nothing.
type MissingError struct{ Missing }

func (e *MissingError) Error() string {
	return fmt.Sprintf("agent is missing %d file part(s): %s", len(e.Missing.Missing), strings.Join(e.Missing.Missing, ", "))
}

// HTTPError is any other answer than 200 that is not a Conflict or a
// Missing: a 3xx, a 4xx, a 5xx, or a 409 whose body is not a JSON object.
type HTTPError struct {
	Status int    // HTTP status code
	Body   string // response text, surrounding white space trimmed, cut to 4096 bytes plus "…" when cut
}

func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("agent returned HTTP %d", e.Status)
	}
	return fmt.Sprintf("agent returned HTTP %d: %s", e.Status, e.Body)
}

// ServerFault reports a 5xx answer: the agent failed on its side (a full or
// read-only disk, still initialising, a failing proxy in front of it), and
// the request may well be fine. The client does not retry it (an apply may
// have been acted on, its body may not replay); a controller should, later
// and with a backoff, rather than treat its render as refused. A 4xx would
// be refused again as is.
func (e *HTTPError) ServerFault() bool { return e.Status >= 500 && e.Status <= 599 }

func newHTTPError(status int, body []byte) *HTTPError {
	text := strings.TrimSpace(string(body))
	if len(text) > maxErrorBodyBytes {
		text = text[:maxErrorBodyBytes] + "…"
	}
	return &HTTPError{Status: status, Body: text}
}

// classifyAnswer turns a non-200 answer into its error. A 409 is a
// MissingError when its body is a JSON object with the key "missing" and a
// ConflictError when it is any other JSON object; the key alone decides,
// because a Conflict never carries it.
func classifyAnswer(status int, body []byte) error {
	var object map[string]json.RawMessage
	if status == http.StatusConflict && json.Unmarshal(body, &object) == nil && object != nil {
		var m MissingError
		var cf ConflictError
		if _, ok := object["missing"]; ok && json.Unmarshal(body, &m.Missing) == nil {
			return &m
		} else if !ok && json.Unmarshal(body, &cf.Conflict) == nil {
			return &cf
		}
	}
	return newHTTPError(status, body)
}

// ---------------------------------------------------------------------------
// Requests, retries and answers.

// exchange runs the retry rules around attempt, which returns the answer's
// status and body, already read: at most ConnectRetries+1 attempts, a retry
// only after a refused or reset connection and only while replayable says
// the body can be sent again, with ConnectRetryBackoff before each retry.
// Every HTTP status returns at once, the body of a 200 or the classified
// answer: a 5xx is the agent's answer, not a transport fault, and
// (*HTTPError).ServerFault marks it for the caller's own, later retry.
func (c *Client) exchange(ctx context.Context, attempt func(context.Context) (int, []byte, error), replayable func() bool) ([]byte, error) {
	attempts := c.cfg.ConnectRetries + 1
	var lastErr error
	for i := range attempts {
		if i > 0 {
			wait := time.NewTimer(c.cfg.ConnectRetryBackoff)
			select {
			case <-ctx.Done():
				wait.Stop()
				return nil, ctx.Err()
			case <-wait.C:
			}
		}
		status, body, err := attempt(ctx)
		switch {
		case err == nil && status == http.StatusOK:
			return body, nil
		case err == nil:
			return nil, classifyAnswer(status, body)
		case ctx.Err() != nil || !isConnectError(err) || !replayable():
			return nil, err
		}
		lastErr = err
	}
	return nil, fmt.Errorf("agent client: %d connect attempts failed: %w", attempts, lastErr)
}

// isConnectError reports whether err is a refused or reset connection: the
// only faults after which the agent cannot have acted on the request.
func isConnectError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

func alwaysReplayable() bool { return true }

// newRequest builds one attempt's request for BaseURL + target. A length
// of -1 sends the body chunked; an empty contentType sets none.
func (c *Client) newRequest(ctx context.Context, method, target string, body io.Reader, length int64, contentType string, auth bool) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+target, body)
	if err != nil {
		return nil, fmt.Errorf("agent client: %v", err)
	}
	req.ContentLength = length
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if auth && c.cfg.UnixSocket == "" && (c.cfg.Username != "" || c.cfg.Password != "") {
		req.SetBasicAuth(c.cfg.Username, c.cfg.Password)
	}
	return req, nil
}

// send builds and sends one attempt's request, and reads its answer.
func (c *Client) send(ctx context.Context, method, target string, body io.Reader, length int64, contentType string, auth bool) (int, []byte, error) {
	req, err := c.newRequest(ctx, method, target, body, length, contentType, auth)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	return readAnswer(resp)
}

// readAnswer reads at most MaxApplyBodyBytes+1 bytes of a response: a
// state answer carries the plan blob, and nothing larger is legitimate.
func readAnswer(resp *http.Response) (int, []byte, error) {
	if resp.ContentLength > MaxApplyBodyBytes {
		return 0, nil, fmt.Errorf("agent client: response exceeds %d bytes", MaxApplyBodyBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxApplyBodyBytes+1))
	if err != nil {
		return 0, nil, fmt.Errorf("agent client: read response: %v", err)
	}
	if len(body) > MaxApplyBodyBytes {
		return 0, nil, fmt.Errorf("agent client: response exceeds %d bytes", MaxApplyBodyBytes)
	}
	return resp.StatusCode, body, nil
}

// get sends a body-less GET for target and returns the 200 body, or the
// classified answer.
func (c *Client) get(ctx context.Context, target string, auth bool) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	return c.exchange(ctx, func(ctx context.Context) (int, []byte, error) {
		return c.send(ctx, http.MethodGet, target, http.NoBody, 0, "", auth)
	}, alwaysReplayable)
}

// State reads GET /v1/state with the query of read.
func (c *Client) State(ctx context.Context, read StateRead) (*State, error) {
	body, err := c.get(ctx, PathState+read.Query(), true)
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("agent client: decode state: %v", err)
	}
	return &s, nil
}

// Health reads GET /healthz without credentials (the route needs none) and
// returns nil on 200 whatever the body says.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.get(ctx, PathHealthz, false)
	return err
}

// Ready sends GET /readyz without credentials: nil when the agent is
// ready (it adopted its files and reaches HAProxy now), an *HTTPError
// whose Body says why not otherwise. A push checks it after a canary.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.get(ctx, PathReadyz, false)
	return err
}

// PutPlan stores blob for the pod's applied plan (planID, proof) with
// PUT /v1/plan. A 409 (the pod moved on) is ErrPlanMoved; a 404 or 405 (an
// agent without the endpoint) is ErrNoPlanEndpoint.
func (c *Client) PutPlan(ctx context.Context, planID, proof string, blob []byte) error {
	return c.putPlan(ctx, planID, proof, blob, blobContentType)
}

// putPlan is PutPlan of a blob or, with patchContentType, of a PlanPatch's
// JSON. An agent that does not hold the patch's base answers a Missing
// that lists "plan", returned as a *MissingError.
func (c *Client) putPlan(ctx context.Context, planID, proof string, blob []byte, contentType string) error {
	if planID == "" || proof == "" {
		return errors.New("agent client: plan id and proof are required")
	}
	if len(blob) == 0 || len(blob) > MaxPlanBlobBytes {
		return fmt.Errorf("agent client: plan blob of %d bytes is outside 1..%d", len(blob), MaxPlanBlobBytes)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PerPodApplyTimeout)
	defer cancel()
	target := PathPlan + "?" + url.Values{"plan_id": {planID}, "proof": {proof}}.Encode()
	_, err := c.exchange(ctx, func(ctx context.Context) (int, []byte, error) {
		return c.send(ctx, http.MethodPut, target, bytes.NewReader(blob), int64(len(blob)), contentType, true)
	}, alwaysReplayable)
	var me *MissingError
	var ce *ConflictError
	var he *HTTPError
	switch {
	case errors.As(err, &me):
		return err
	case errors.As(err, &ce) || errors.As(err, &he) && he.Status == http.StatusConflict:
		return ErrPlanMoved
	case errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusMethodNotAllowed):
		return ErrNoPlanEndpoint
	}
	return err
}

// ---------------------------------------------------------------------------
// Apply.

// applyPart is one file part of an apply, in manifest order.
type applyPart struct {
	path     string
	expected int64 // size, or size − base_size + length for a patched file
	r        io.Reader
}

// Apply posts m, then the optional plan blob, then one part per entry of
// parts, in manifest order, as one streamed multipart body. parts maps a
// manifest path to the reader of that file's part; a nil reader counts as
// absent. Nothing is sent unless the manifest and the parts pass
// validateApply's checks: a request the agent would refuse is refused here,
// before a byte of a large body travels.
//
// A 200 is returned as the ApplyResult whether it is an ACK or a NACK
// (OK false is not an error). Apply returns only once it has stopped
// reading parts and plan, so a reader must not block forever.
func (c *Client) Apply(ctx context.Context, m *Manifest, parts map[string]io.Reader, plan io.Reader) (*ApplyResult, error) {
	return c.apply(ctx, m, parts, plan, blobContentType)
}

// The Content-Types of a plan as it travels (the apply's plan part, the
// PUT /v1/plan body): the agent takes a PlanPatch for application/json,
// and a blob for anything else.
const (
	blobContentType  = "application/octet-stream"
	patchContentType = "application/json"
)

// apply is Apply with the plan part's Content-Type.
func (c *Client) apply(ctx context.Context, m *Manifest, parts map[string]io.Reader, plan io.Reader, planType string) (*ApplyResult, error) {
	if m == nil {
		return nil, errors.New("agent client: manifest is required")
	}
	manifestJSON, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("agent client: encode manifest: %v", err)
	}
	ordered, err := validateApply(m, manifestJSON, parts)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(ctx, c.cfg.PerPodApplyTimeout)
	defer cancel()

	// The first read of the body that yields bytes marks the call consumed,
	// and from then on a refused or reset connection is not retried: the
	// agent may have acted on what it read.
	var consumed atomic.Bool
	body := &applyBody{manifest: manifestJSON, parts: ordered, plan: plan, planType: planType}
	attempt := func(ctx context.Context) (int, []byte, error) { return c.applyAttempt(ctx, body) }
	if body.small() {
		// A small body is built once in memory and sent with its length, in
		// one write: streaming it through a pipe in chunks costs a
		// goroutine hand-off and a write per part on both ends, which is
		// most of what a one-entry change costs besides HAProxy itself.
		buffered, contentType, err := body.buffer()
		if err != nil {
			return nil, err
		}
		attempt = func(ctx context.Context) (int, []byte, error) {
			body := &markReader{r: bytes.NewReader(buffered), consumed: &consumed}
			return c.send(ctx, http.MethodPost, PathApply, body, int64(len(buffered)), contentType, true)
		}
	} else {
		if plan != nil {
			body.plan = &markReader{r: plan, consumed: &consumed}
		}
		for i := range body.parts {
			body.parts[i].r = &markReader{r: body.parts[i].r, consumed: &consumed}
		}
	}

	answer, err := c.exchange(ctx, attempt, func() bool { return !consumed.Load() })
	if err != nil {
		return nil, err
	}
	var result ApplyResult
	if err := json.Unmarshal(answer, &result); err != nil {
		return nil, fmt.Errorf("agent client: decode apply result: %v", err)
	}
	return &result, nil
}

// validateApply runs the client-side checks in their contract order, first
// failure wins, and returns the parts in manifest order.
func validateApply(m *Manifest, manifestJSON []byte, parts map[string]io.Reader) ([]applyPart, error) {
	switch err := m.ValidateOpBatches(); {
	case m.PlanID == "":
		return nil, errors.New("agent client: manifest has no plan_id")
	case m.Mode != ModeAuto && m.Mode != ModeReload && m.Mode != ModeRevertLKG:
		return nil, fmt.Errorf("agent client: unknown apply mode %q", m.Mode)
	case len(m.Files) > MaxFiles:
		return nil, fmt.Errorf("agent client: %d files exceeds the limit of %d", len(m.Files), MaxFiles)
	case err != nil:
		return nil, fmt.Errorf("agent client: %v", err)
	}
	declared := make(map[string]*ManifestFile, len(m.Files))
	for i := range m.Files {
		f := &m.Files[i]
		_, dup := declared[f.Path]
		switch err := checkManifestPath(f.Path); {
		case err != nil:
			return nil, err
		case dup:
			return nil, fmt.Errorf("agent client: file %q is declared twice", f.Path)
		case f.Size < 0:
			return nil, fmt.Errorf("agent client: file %q has a negative size", f.Path)
		case f.Digest == "":
			return nil, fmt.Errorf("agent client: file %q has no digest", f.Path)
		}
		declared[f.Path] = f
	}

	estimate := int64(len(manifestJSON))
	keys := make([]string, 0, len(parts))
	for p, r := range parts {
		if r != nil {
			keys = append(keys, p)
		}
	}
	sort.Strings(keys)
	for _, p := range keys {
		f, ok := declared[p]
		if !ok {
			return nil, fmt.Errorf("agent client: part %q is not a file of this manifest", p)
		}
		estimate += expectedPartBytes(f)
	}

	var ordered []applyPart
	for i := range m.Files {
		f, r := &m.Files[i], parts[m.Files[i].Path]
		if p := f.Patch; p != nil && r == nil {
			return nil, fmt.Errorf("agent client: file %q declares a patch without a part", f.Path)
		} else if p != nil && (p.Offset < 0 || p.Length < 0 || p.BaseSize < 0 || p.Offset+p.Length > p.BaseSize || f.Size-p.BaseSize+p.Length < 0) {
			return nil, fmt.Errorf("agent client: file %q declares a patch that does not fit its base", f.Path)
		}
		if r != nil {
			ordered = append(ordered, applyPart{path: f.Path, expected: expectedPartBytes(f), r: r})
		}
	}
	if estimate > MaxApplyBodyBytes {
		return nil, fmt.Errorf("agent client: apply body of %d bytes exceeds the limit of %d", estimate, MaxApplyBodyBytes)
	}
	if len(manifestJSON) > MaxPlanBlobBytes {
		return nil, fmt.Errorf("agent client: manifest of %d bytes exceeds the %d-byte limit", len(manifestJSON), MaxPlanBlobBytes)
	}
	return ordered, nil
}

// checkManifestPath refuses, in the client's words, a path the agent would
// refuse for its form.
func checkManifestPath(p string) error {
	if p == "" {
		return errors.New("agent client: manifest has an empty file path")
	}
	if why := manifestPathProblem(p, true); why != "" {
		return fmt.Errorf("agent client: file path %q %s", p, why)
	}
	return nil
}

// expectedPartBytes is the length of a file's part: the whole file, or the
// replacement bytes of a patch.
func expectedPartBytes(f *ManifestFile) int64 {
	if f.Patch != nil {
		return f.Size - f.Patch.BaseSize + f.Patch.Length
	}
	return f.Size
}

// applyBody is what one apply streams: the manifest bytes, the optional
// plan reader and the parts, shared by every attempt of the call.
type applyBody struct {
	manifest []byte
	plan     io.Reader
	planType string
	parts    []applyPart
}

// maxBufferedApplyBytes is the largest body (manifest and parts, as the
// manifest declares them) sent from memory in one piece; larger ones stream.
const maxBufferedApplyBytes = 1 << 20

// small reports whether the body is sent from memory: it fits
// maxBufferedApplyBytes and carries no plan blob, whose size is unknown
// until read.
func (b *applyBody) small() bool {
	if b.plan != nil {
		return false
	}
	n := int64(len(b.manifest))
	for _, p := range b.parts {
		n += p.expected
	}
	return n <= maxBufferedApplyBytes
}

// buffer writes the whole multipart body into memory.
func (b *applyBody) buffer() ([]byte, string, error) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := b.writeTo(mw); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), mw.FormDataContentType(), nil
}

// errAttemptOver closes an attempt's pipe once the attempt has its answer
// or its error, so that a writer still blocked on the pipe stops.
var errAttemptOver = errors.New("agent client: apply attempt is over")

// applyAttempt sends the body once through a new pipe. It waits for the
// writer goroutine before returning, so that the next attempt's writer
// never reads a reader this one still reads, and so that no reader is read
// after Apply returns.
func (c *Client) applyAttempt(ctx context.Context, body *applyBody) (int, []byte, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(&countingWriter{w: pw, limit: MaxApplyBodyBytes})
	var writeErr error
	written := make(chan struct{})
	go func() {
		defer close(written)
		writeErr = body.writeTo(mw)
		pw.CloseWithError(writeErr) // nil: a plain Close
	}()
	stopWriter := func() {
		pr.CloseWithError(errAttemptOver)
		<-written
	}

	// Unknown length, sent chunked, and no GetBody (a pipe has none): the
	// transport must never replay a part reader on its own.
	req, err := c.newRequest(ctx, http.MethodPost, PathApply, pr, -1, mw.FormDataContentType(), true)
	if err != nil {
		stopWriter()
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		stopWriter()
		if writeErr != nil && !errors.Is(writeErr, io.ErrClosedPipe) && !errors.Is(writeErr, errAttemptOver) {
			return 0, nil, writeErr
		}
		return 0, nil, err
	}
	// A response wins, even when the agent answered before it read the
	// whole body (a Conflict is decided on the manifest alone).
	status, answer, err := readAnswer(resp)
	resp.Body.Close()
	stopWriter()
	return status, answer, err
}

// writeTo writes and closes the multipart stream: manifest, plan, then the
// parts in manifest order, the order the agent stages them in.
func (b *applyBody) writeTo(mw *multipart.Writer) error {
	w, err := mw.CreateFormField(PartManifest)
	if err == nil {
		_, err = w.Write(b.manifest)
	}
	if err != nil {
		return err
	}
	if b.plan != nil {
		n, err := writePart(mw, PartPlan, b.planType, b.plan, MaxPlanBlobBytes, "plan blob")
		if err != nil {
			return err
		}
		if n > MaxPlanBlobBytes {
			return fmt.Errorf("agent client: plan blob exceeds %d bytes", MaxPlanBlobBytes)
		}
	}
	for _, p := range b.parts {
		n, err := writePart(mw, p.path, blobContentType, p.r, p.expected, fmt.Sprintf("part %q", p.path))
		if err != nil {
			return err
		}
		if n != p.expected {
			return fmt.Errorf("agent client: part %q: manifest declares %d bytes, content yielded %d", p.path, p.expected, n)
		}
	}
	return mw.Close()
}

// writePart writes the part name, a form file of contentType, from at most
// limit+1 bytes of r. A failure of r is reported as the caller's reader's
// (what), never as the pipe's.
func writePart(mw *multipart.Writer, name, contentType string, r io.Reader, limit int64, what string) (int64, error) {
	w, err := mw.CreatePart(textproto.MIMEHeader{
		"Content-Disposition": {multipart.FileContentDisposition(name, name)},
		"Content-Type":        {contentType},
	})
	if err != nil {
		return 0, err
	}
	src := &markReader{r: io.LimitReader(r, limit+1)}
	n, err := copyBytes(w, src)
	if src.err != nil {
		return n, fmt.Errorf("agent client: %s: %w", what, src.err)
	}
	return n, err
}

// countingWriter fails once more than limit bytes were written through it,
// so that a reader yielding more than its manifest declared cannot produce
// an oversized request.
type countingWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	if cw.n+int64(len(p)) > cw.limit {
		return 0, fmt.Errorf("agent client: apply body exceeds %d bytes", cw.limit)
	}
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	return n, err
}

// markReader remembers its reader's error, so that a failing caller's
// reader is reported as such and a failing pipe is not mistaken for it, and
// marks consumed (when set) once the reader yielded any bytes.
type markReader struct {
	r        io.Reader
	consumed *atomic.Bool
	err      error
}

func (m *markReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	if n > 0 && m.consumed != nil {
		m.consumed.Store(true)
	}
	if err != nil && err != io.EOF {
		m.err = err
	}
	return n, err
}

// ---------------------------------------------------------------------------
// Skew.

// ComposableOps returns the op kinds Diff can emit, a fresh copy of
// ComposedOps, so that the skew check cannot drift from the composer.
func ComposableOps() []string { return ComposedOps() }

// CheckSkew compares an agent's state with this package. majorMismatch is
// true when the agent speaks another API major version (or state is nil);
// missingOps lists, in ComposableOps order, the kinds Diff can emit that the
// agent does not execute, nil when none is missing. Neither finding is a
// refusal: a refusal correlated across the fleet would fence off the repair
// path. A major mismatch makes Deploy send the full file set with mode
// reload; a missing kind makes Diff reload instead of composing it.
func CheckSkew(state *State) (majorMismatch bool, missingOps []string) {
	if state == nil {
		return true, nil
	}
	for _, kind := range ComposableOps() {
		if !slices.Contains(state.AgentOps, kind) {
			missingOps = append(missingOps, kind)
		}
	}
	return state.APIVersion != APIVersion, missingOps
}

// ---------------------------------------------------------------------------
// Deploy.

// DeployOptions tunes one Deploy.
type DeployOptions struct {
	LeaderEpoch uint64          // the caller's leadership epoch; the token epoch of every apply
	Applied     *Plan           // optional: the caller's own copy of the plan the pod last applied; its contents enable patches
	PlanBlob    []byte          // optional: EncodePlanBlob(next), computed once for a fleet; nil or empty = Deploy encodes it
	Prepared    *PreparedDeploy // optional: PrepareDeploy(Applied, next), shared by a fleet; nil = Deploy prepares its own
	Verify      bool            // read state with verify=1
}

// maxDeployRounds bounds Deploy: one round plus at most three re-diffs
// after a baseline conflict or a second Missing answer. A pod that keeps
// moving under the controller is reported, not chased.
const maxDeployRounds = 4

// Deploy brings one pod to next: it reads the pod's state, diffs next
// against the pod's baseline, applies, resends the file parts the agent
// asks for, re-diffs when the pod's baseline moved, and stores the plan
// blob after an apply that did not carry it. Run one Deploy per pod, in
// parallel across pods, each with that pod's Client.
//
// A changed file travels as a patch (see deployPatches) only with
// opts.Applied: the pod's stored blob carries no file contents, so only the
// caller's own plan can be the base. A caller deploying one change to many
// pods prepares it once (PrepareDeploy) and passes it as opts.Prepared, so
// that each pod costs only its own state read, apply and blob upload. A 200
// answer, ACK or NACK, is returned with a nil error and not retried; any
// other conflict than a moved baseline, and every transport or HTTP error,
// is returned at once.
func Deploy(ctx context.Context, c *Client, next *Plan, opts DeployOptions) (*ApplyResult, error) {
	switch {
	case c == nil:
		return nil, errors.New("agent client: deploy: client is required")
	case next == nil:
		return nil, errors.New("agent client: deploy: plan is required")
	case next.ID == "":
		return nil, errors.New("agent client: deploy: plan has no id")
	}
	prep := opts.Prepared
	if prep == nil || planID(prep.applied) != planID(opts.Applied) || planID(prep.next) != next.ID {
		prep = PrepareDeploy(opts.Applied, next)
	}
	blob := func() ([]byte, error) {
		switch {
		case len(opts.PlanBlob) > MaxPlanBlobBytes:
			// Only a caller's blob can be this large; the agent would
			// refuse it, so the deploy proceeds without one.
			return nil, nil
		case len(opts.PlanBlob) > 0:
			return opts.PlanBlob, nil
		}
		blob, err := prep.blob()
		if err != nil {
			return nil, fmt.Errorf("agent client: deploy: encode plan blob: %w", err)
		}
		return blob, nil
	}

	var err error
	for range maxDeployRounds {
		var result *ApplyResult
		result, err = c.deployRound(ctx, next, opts, prep, blob)
		if err == nil {
			return result, nil
		}
		if !needsRediff(err) {
			return nil, err
		}
	}
	return nil, err
}

// needsRediff reports whether err means the pod's baseline moved under the
// round, so that a new round (state, diff, apply) can succeed: a baseline
// conflict, or a Missing answer to the resend.
func needsRediff(err error) bool {
	var ce *ConflictError
	var me *MissingError
	if errors.As(err, &ce) {
		return ce.Reason == ReasonPrevMismatch || ce.Reason == ReasonUnknownBaseline || ce.Reason == ReasonWorkerOpsMismatch
	}
	return errors.As(err, &me)
}

// deployRound is one round: read state, decide, apply (with the patched
// files' parts, if any), resend the missing parts once, and store the plan
// after an ACK. blob is next's plan blob, encoded when first needed; nil
// means the deploy sends none.
func (c *Client) deployRound(ctx context.Context, next *Plan, opts DeployOptions, prep *PreparedDeploy, blob func() ([]byte, error)) (*ApplyResult, error) {
	state, err := c.deployState(ctx, opts)
	if err != nil {
		return nil, err
	}
	m := NewManifest(next, prep.Decision(state), state, Token{LeaderEpoch: opts.LeaderEpoch, RenderSeq: state.AppliedToken.RenderSeq + 1})

	// The plan rides an apply that reloads (a cold leader must find it
	// at once) or an agent without PUT /v1/plan; any other apply is
	// answered sooner without it, and the plan is stored after the ACK.
	// Either way it travels as the prepared patch where the agent holds
	// the plan the patch is cut from.
	patch := prep.planPatchFor(state)
	withApply := m.Mode == ModeReload || c.noPlanEndpoint.Load()
	var plan []byte
	if withApply {
		if plan = patch; plan == nil {
			if plan, err = blob(); err != nil {
				return nil, err
			}
		}
	}
	planPart := func() (io.Reader, string) {
		switch {
		case plan == nil:
			return nil, ""
		case patch != nil:
			return bytes.NewReader(plan), patchContentType
		}
		return bytes.NewReader(plan), blobContentType
	}

	// The first apply carries the patches and no whole file: the agent
	// lacks a changed file anyway, and a patch small enough to send costs
	// less than the round trip that would ask for it.
	patches := deployPatches(state, m.Files, prep)
	sent, parts := patchedManifest(m, patches, nil)
	r, planType := planPart()
	result, err := c.apply(ctx, sent, parts, r, planType)
	var me *MissingError
	if errors.As(err, &me) {
		missing := me.Missing.Missing
		if plan != nil && patch != nil && slices.Contains(missing, PartPlan) {
			// The agent lost the plan the patch is cut from: the plan
			// travels whole, and "plan" names a file only if next has one.
			if plan, err = blob(); err != nil {
				return nil, err
			}
			patch = nil
			if _, ok := planFilesByPath(next)[PartPlan]; !ok {
				missing = slices.DeleteFunc(slices.Clone(missing), func(p string) bool { return p == PartPlan })
			}
		}
		whole, perr := missingParts(next, missing)
		if perr != nil {
			return nil, perr
		}
		// A patched path the agent lists has lost its base (the file on
		// disk is not the one its state named): it travels whole, and the
		// other patches stand.
		sent, parts = patchedManifest(m, patches, missing)
		maps.Copy(parts, whole)
		r, planType = planPart()
		result, err = c.apply(ctx, sent, parts, r, planType)
	}
	if err != nil {
		return nil, err
	}

	alreadyStored := state.AppliedPlanID == next.ID && state.HoldsAppliedPlan()
	if result.OK && !withApply && result.AppliedPlanID == next.ID && result.AppliedPlanProof != "" && !alreadyStored {
		c.storePlan(ctx, result, patch, blob)
	}
	return result, nil
}

// storePlan stores next's plan for the pair an apply landed without it:
// as the patch when there is one, whole when there is none or the agent
// asks for it. A plan that fails to store only costs a reload for a leader
// that has no plan of its own, so failures are not reported.
func (c *Client) storePlan(ctx context.Context, result *ApplyResult, patch []byte, blob func() ([]byte, error)) {
	id, proof := result.AppliedPlanID, result.AppliedPlanProof
	if patch != nil {
		// An agent that takes patches has the endpoint: only a Missing
		// answer (the base is gone) calls for the whole blob.
		var me *MissingError
		if err := c.putPlan(ctx, id, proof, patch, patchContentType); !errors.As(err, &me) {
			return
		}
	}
	if whole, err := blob(); err == nil && whole != nil {
		if err := c.PutPlan(ctx, id, proof, whole); errors.Is(err, ErrNoPlanEndpoint) {
			c.noPlanEndpoint.Store(true)
		}
	}
}

// deployState reads the pod's state for one round. With the caller's own
// applied plan the blob is left out, unless the pod holds another applied
// plan whose blob it can hand over.
func (c *Client) deployState(ctx context.Context, opts DeployOptions) (*State, error) {
	if opts.Applied == nil {
		return c.State(ctx, StateRead{Verify: opts.Verify, Plan: true})
	}
	state, err := c.State(ctx, StateRead{Verify: opts.Verify})
	if err != nil {
		return nil, err
	}
	if state.AppliedPlanID != "" && state.AppliedPlanID != opts.Applied.ID && state.HoldsAppliedPlan() {
		return c.State(ctx, StateRead{Verify: opts.Verify, Plan: true})
	}
	return state, nil
}

// deployBaseline builds the round's baseline from the pod's state. A blob that
// does not decode leaves the baseline unknown, and Diff reloads. The caller's
// own plan replaces the decoded one only by id equality with the pod's applied
// plan, and stands for the running and worker plans only where their ids equal
// it too.
func deployBaseline(state *State, applied *Plan) *Baseline {
	base, err := BaselineFromState(state)
	if err != nil {
		return nil
	}
	if applied != nil && state.AppliedPlanID != "" && applied.ID == state.AppliedPlanID {
		base.Applied, base.Running, base.WorkerOps = applied, nil, nil
		if state.RunningPlanID == applied.ID {
			base.Running = applied
		}
		if state.WorkerOpsPlanID == applied.ID {
			base.WorkerOps = applied
		}
	}
	return base
}

// ---------------------------------------------------------------------------
// Work shared by a fleet.

// maxPreparedBaselines bounds the decisions one PreparedDeploy keeps: a
// fleet's pods share a few baselines (one per HAProxy version, loaded set
// and queue of deferred deletes), and a pod past the bound is diffed on
// its own.
const maxPreparedBaselines = 64

// PreparedDeploy is the work of a Deploy that depends only on the change
// from an applied plan to the next one, not on the pod, done once for a
// whole fleet: the patches that turn the applied plan's files into next's,
// each cut on first use, Diff's decision for each pod baseline built on
// the applied plan, computed for the first pod that has it, next's plan
// blob and the plan patch from the applied plan, each made when a pod
// first needs it. For a one-entry change of a large map those are the diff
// of every entry, a scan of the whole file and of the plan's JSON, and the
// compression of that JSON, which a pod would otherwise pay for again.
//
// Deploy uses it only when it was prepared for plans with the ids of its
// Applied and next, and prepares its own otherwise. Within it, a pod whose
// applied plan is another (its stored blob is the baseline) is diffed on
// its own, and a patch goes only to a pod that holds exactly the bytes it
// was cut from. It is safe for concurrent use; the plans must not change
// while it is in use.
type PreparedDeploy struct {
	applied, next *Plan
	patches       map[string]preparedPatch // by path; read-only once prepared
	blob          func() ([]byte, error)   // EncodePlanBlob(next)
	planPatch     func() []byte            // the PlanPatch JSON from applied to next; nil: send the blob

	mu        sync.Mutex
	decisions map[string]func() Decision // by baselineKey, at most maxPreparedBaselines
}

// preparedPatch is one file of next that may travel as a patch: the
// applied plan's file it is cut from, and the cut, made once on first use.
type preparedPatch struct {
	base *PlanFile
	cut  func() *filePatch
}

// PrepareDeploy prepares the deploys of next to the pods that last applied
// applied (nil when the caller has no plan of its own). It does no work
// yet: each part is computed when the first pod needs it.
func PrepareDeploy(applied, next *Plan) *PreparedDeploy {
	p := &PreparedDeploy{applied: applied, next: next, patches: map[string]preparedPatch{}, decisions: map[string]func() Decision{},
		blob:      sync.OnceValues(func() ([]byte, error) { return EncodePlanBlob(next) }),
		planPatch: sync.OnceValue(func() []byte { return planPatchJSON(applied, next) })}
	if applied == nil || next == nil {
		return p
	}
	prev := planFilesByPath(applied)
	for i := range next.Files {
		nf := &next.Files[i]
		pf := prev[nf.Path]
		if pf == nil || !pf.ContentKnown || !nf.ContentKnown || int64(len(pf.Content)) != pf.Size || int64(len(nf.Content)) != nf.Size {
			continue
		}
		p.patches[nf.Path] = preparedPatch{base: pf, cut: sync.OnceValue(func() *filePatch {
			// A plan whose bytes are not its digest's would have the
			// patch spliced into other bytes than it was cut from.
			if fp := patchFor(pf.Content, nf.Content); fp != nil && fp.patch.BaseDigest == pf.Digest {
				return fp
			}
			return nil
		})}
	}
	return p
}

// planPatchFor is the prepared plan patch for the pod in state, or nil: the
// pod must take plan patches and hold the prepared applied plan as its
// stored plan, the one the patch is cut from.
func (p *PreparedDeploy) planPatchFor(state *State) []byte {
	if p.applied == nil || !slices.Contains(state.Features, FeaturePlanPatch) || !state.HoldsAppliedPlan() || state.AppliedPlanID != p.applied.ID {
		return nil
	}
	return p.planPatch()
}

// planPatchJSON is the encoded PlanPatch that turns applied into next, or
// nil: no applied plan, a plan whose canonical JSON does not hash to its
// id (the agent would refuse what the patch makes), or a change the whole
// blob carries better (cutPlanPatch).
func planPatchJSON(applied, next *Plan) []byte {
	if applied == nil || next == nil {
		return nil
	}
	base, to := string(applied.Canonical()), string(next.Canonical())
	if DigestString(base) != applied.ID || DigestString(to) != next.ID {
		return nil
	}
	patch := cutPlanPatch(base, to, applied.ID)
	if patch == nil {
		return nil
	}
	js, err := json.Marshal(patch)
	if err != nil || len(js) > MaxPlanBlobBytes {
		return nil
	}
	return js
}

// Decision is what a Deploy round decides for a pod in state, read the way
// Deploy reads it: Diff of next against the pod's baseline, the prepared
// applied plan when the pod's applied plan has its id and otherwise the
// plan the state carries; against no baseline (a reload) when the agent
// speaks another API major version, or when the change needs more than
// one op batch and the agent does not take op_batches.
func (p *PreparedDeploy) Decision(state *State) Decision {
	base := deployBaseline(state, p.applied)
	if major, _ := CheckSkew(state); major {
		base = nil
	}
	d := p.diff(base)
	if len(d.Chunk()) > 1 && !slices.Contains(state.Features, FeatureRuntimeBatches) {
		// An agent that ignores op_batches would run only the first batch
		// and report success.
		d = Diff(p.next, nil)
	}
	return d
}

// diff is Diff(p.next, base), shared by the pods whose baselines are
// equal and built on the prepared applied plan. Diff is a pure function of
// its arguments, so an equal baseline gets an equal decision; the
// decision's slices are shared and read only.
func (p *PreparedDeploy) diff(base *Baseline) Decision {
	if base == nil || p.applied == nil || base.Applied != p.applied {
		return Diff(p.next, base)
	}
	key := baselineKey(base)
	p.mu.Lock()
	d, ok := p.decisions[key]
	if !ok && len(p.decisions) < maxPreparedBaselines {
		d = sync.OnceValue(func() Decision { return Diff(p.next, base) })
		p.decisions[key] = d
	}
	p.mu.Unlock()
	if d == nil {
		return Diff(p.next, base)
	}
	return d()
}

// baselineKey is equal for two baselines exactly when Diff reads the same
// from them. %#v prints every field, strings quoted and map keys sorted,
// and the plans as their addresses: an equal key means the same plan
// objects. The inventory's generation is left out: Diff ignores it, and it
// differs from pod to pod.
func baselineKey(base *Baseline) string {
	k := *base
	k.Inventory.Generation = 0
	return fmt.Sprintf("%#v", k)
}

// planID is p's id, "" for no plan.
func planID(p *Plan) string {
	if p == nil {
		return ""
	}
	return p.ID
}

// missingParts builds the resend's parts: exactly the listed paths, each
// with the content next holds for it.
func missingParts(next *Plan, missing []string) (map[string]io.Reader, error) {
	files := planFilesByPath(next)
	parts := make(map[string]io.Reader, len(missing))
	for _, p := range missing {
		f, ok := files[p]
		if !ok {
			return nil, fmt.Errorf("agent client: deploy: the agent asks for %q, which is not a file of plan %s", p, next.ID)
		}
		if !f.ContentKnown {
			return nil, fmt.Errorf("agent client: deploy: plan %s has no content for %q", next.ID, p)
		}
		parts[p] = strings.NewReader(f.Content)
	}
	return parts, nil
}

// ---------------------------------------------------------------------------
// File patches.

// minPatchFileBytes is the smallest file Deploy sends as a patch. Below it
// the whole file is a few packets, and a patch would only add the chance
// of a second apply when the agent has lost the base.
const minPatchFileBytes = 8 << 10

// filePatch is one file ready to travel as a patch: the manifest's
// FilePatch and the replacement bytes its part carries.
type filePatch struct {
	patch       FilePatch
	replacement string
}

// patchFor returns the patch that turns base into next by replacing one
// byte range of base, the smallest such range (the longest common prefix,
// then the longest common suffix of what is left), or nil when next is
// better sent whole: next is shorter than minPatchFileBytes, or the
// replacement is more than half of next. Past half a patch saves little,
// and a patch whose base turns out to be gone costs its bytes on top of the
// whole file's.
//
// The patch names base by its digest and size, so the agent applies it only
// to exactly these bytes; the new content is
// base[:Offset] + replacement + base[Offset+Length:].
func patchFor(base, next string) *filePatch {
	if len(next) < minPatchFileBytes {
		return nil
	}
	prefix := commonPrefixLen(base, next)
	suffix := commonSuffixLen(base[prefix:], next[prefix:])
	replacement := next[prefix : len(next)-suffix]
	if len(replacement) > len(next)/2 {
		return nil
	}
	return &filePatch{replacement: replacement, patch: FilePatch{BaseDigest: DigestString(base), BaseSize: int64(len(base)),
		Offset: int64(prefix), Length: int64(len(base) - prefix - suffix)}}
}

// patchCompareBlock is the stride of the prefix and suffix scans: whole
// blocks compare as strings (a vectorised memory compare), and only the
// block that differs is scanned byte by byte.
const patchCompareBlock = 4 << 10

// commonPrefixLen is the length of the longest common prefix of a and b.
func commonPrefixLen(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+patchCompareBlock <= n && a[i:i+patchCompareBlock] == b[i:i+patchCompareBlock] {
		i += patchCompareBlock
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// commonSuffixLen is the length of the longest common suffix of a and b.
func commonSuffixLen(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+patchCompareBlock <= n && a[len(a)-i-patchCompareBlock:len(a)-i] == b[len(b)-i-patchCompareBlock:len(b)-i] {
		i += patchCompareBlock
	}
	for i < n && a[len(a)-1-i] == b[len(b)-1-i] {
		i++
	}
	return i
}

// deployPatches chooses the files of one apply that travel as patches, by
// path. A file qualifies only when all of these hold:
//   - the agent advertises file_patch (an agent that ignores the field
//     would take the replacement bytes for the whole file);
//   - the agent's state lists the path with a proof, that is a file an
//     apply landed, and not the file the manifest wants (the agent would
//     not need its bytes at all);
//   - the prepared applied plan holds the path's content, and that content
//     has exactly the digest and size the state lists, so the agent splices
//     the patch into the very bytes it was computed from;
//   - next holds the new content, of the size its plan (and so the
//     manifest) declares;
//   - patchFor finds the patch worth sending.
//
// The applied plan need not be the pod's: the digest check alone decides
// whether its bytes are the agent's.
func deployPatches(state *State, files []ManifestFile, prep *PreparedDeploy) map[string]*filePatch {
	if !slices.Contains(state.Features, FeatureFilePatch) {
		return nil
	}
	var patches map[string]*filePatch
	for _, f := range files {
		held, ok := state.Files[f.Path]
		if !ok || held.Proof == "" {
			continue
		}
		if held.Proof == f.Proof && held.Digest == f.Digest && held.Size == f.Size {
			continue
		}
		// The plan's own digest is a cheap first filter; the cut hashes
		// the bytes themselves.
		pp, ok := prep.patches[f.Path]
		if !ok || pp.base.Digest != held.Digest || pp.base.Size != held.Size {
			continue
		}
		p := pp.cut()
		if p == nil {
			continue
		}
		if patches == nil {
			patches = make(map[string]*filePatch)
		}
		patches[f.Path] = p
	}
	return patches
}

// planFilesByPath indexes p's files by path.
func planFilesByPath(p *Plan) map[string]*PlanFile {
	files := make(map[string]*PlanFile, len(p.Files))
	for i := range p.Files {
		files[p.Files[i].Path] = &p.Files[i]
	}
	return files
}

// patchedManifest returns m with its patched files carrying their patch,
// and the parts of those files; a path listed in whole keeps no patch and
// gets no part here (the caller sends it whole). Without a patch to set, m
// itself is returned, so the manifest is byte for byte the one NewManifest
// built. m's files are shared with the decision, so they are copied before
// a patch is set.
func patchedManifest(m *Manifest, patches map[string]*filePatch, whole []string) (*Manifest, map[string]io.Reader) {
	parts := make(map[string]io.Reader)
	var files []ManifestFile
	for i, f := range m.Files {
		p, ok := patches[f.Path]
		if !ok || slices.Contains(whole, f.Path) {
			continue
		}
		if files == nil {
			files = slices.Clone(m.Files)
		}
		patch := p.patch
		files[i].Patch = &patch
		parts[f.Path] = strings.NewReader(p.replacement)
	}
	if files == nil {
		return m, parts
	}
	patched := *m
	patched.Files = files
	return &patched, parts
}
