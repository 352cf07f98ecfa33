// This file owns how the agent authenticates the controller: HTTP Basic
// with constant-time comparison, or mutual TLS 1.3 from files re-read when
// they change (tlsMaterial). It never authenticates the admin and drain
// sockets: file permissions protect them.

package haptic

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	msgTooManyAuthFailures = "too many failed authentications from this address"
	tlsCertFile            = "tls.crt"
	tlsKeyFile             = "tls.key"
	tlsCAFile              = "ca.crt"
	// The CA rotation overlap: the CA ca.crt replaced, and when its trust ends.
	tlsPreviousCAFile    = "previous-ca.crt"
	tlsPreviousUntilFile = "previous-ca-until"
)

// authenticated wraps a handler of the network API with the configured
// authentication; with --insecure-no-auth and nothing configured, every
// request passes. With HTTP Basic a request on a connection that has not
// authenticated first spends a check of its address's budget
// (agent_authfail.go), and once that is spent is refused with 429
// unchecked, the right password too: a controller and a guesser behind one
// address differ in nothing else, so serving the right one would tell every
// guess whether it was right. A failure answers at once and closes its
// connection.
func (a *Agent) authenticated(h http.HandlerFunc) http.HandlerFunc {
	var scheme string
	switch {
	case a.tls != nil:
		scheme = authSchemeTLS
	case a.cfg.Username != "":
		scheme = authSchemeBasic
	default:
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _ := r.Context().Value(connAuthKey{}).(*cappedConn)
		took := scheme == authSchemeBasic && (conn == nil || !conn.authed.Load())
		if took {
			if ok, wait := a.authFail.take(r); !ok {
				w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
				a.refuse(w, r, scheme, false, http.StatusTooManyRequests, msgTooManyAuthFailures)
				return
			}
		}
		switch {
		case scheme == authSchemeTLS && !a.tls.verifyPeer(r.TLS, a.cfg.TLSClientName, a.now()):
			a.refuse(w, r, scheme, true, http.StatusUnauthorized, "client certificate rejected")
			return
		case scheme == authSchemeBasic && !basicMatches(r, a.cfg.Username, a.cfg.Password):
			w.Header().Set("WWW-Authenticate", `Basic realm="haptic-agent"`)
			a.refuse(w, r, scheme, true, http.StatusUnauthorized, "unauthorized")
			return
		}
		if took {
			a.authFail.giveBack(r)
		}
		if conn.authenticate() {
			h(w, r)
		}
	}
}

// refuse counts, logs and answers a failed authentication, and closes its
// connection.
func (a *Agent) refuse(w http.ResponseWriter, r *http.Request, scheme string, checked bool, code int, text string) {
	a.authFail.failed(r, scheme, checked)
	w.Header().Set("Connection", "close")
	writeText(w, code, text)
}

// connAuthKey keys, in a connection's context, its *cappedConn, which owns
// whether a request on it authenticated.
type connAuthKey struct{}

// withConnAuth is the API server's ConnContext.
func withConnAuth(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	conn, _ := c.(*cappedConn)
	return context.WithValue(ctx, connAuthKey{}, conn)
}

// basicMatches compares user and password in constant time. Both sides are
// hashed first, so that not even their lengths leak through timing.
func basicMatches(r *http.Request, user, pass string) bool {
	u, p, ok := r.BasicAuth()
	uh, wantU := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(user))
	ph, wantP := sha256.Sum256([]byte(p)), sha256.Sum256([]byte(pass))
	userOK := subtle.ConstantTimeCompare(uh[:], wantU[:])
	passOK := subtle.ConstantTimeCompare(ph[:], wantP[:])
	return ok && userOK&passOK == 1
}

// fileStamp identifies one version of a file by modification time and size;
// the zero stamp is an optional file that does not exist.
type fileStamp struct {
	mod  time.Time
	size int64
}

// tlsFiles are the files of --tls-dir, in stamp order. The first three are
// required; the last two are the CA rotation overlap and optional.
var tlsFiles = [...]string{tlsCertFile, tlsKeyFile, tlsCAFile, tlsPreviousCAFile, tlsPreviousUntilFile}

// tlsMaterial is the agent's serving identity and the trust of controller
// client certificates, re-read from --tls-dir when the files change.
//
// A CA rotation has an overlap: while previous-ca.crt and previous-ca-until
// (an RFC 3339 time) are present, certificates of the previous CA are
// trusted beside those of ca.crt until that time, then ignored, without a
// restart. Controllers can so move to certificates of the new CA one by one
// while every agent already trusts both. A previous-ca.crt without a
// readable previous-ca-until is refused like any broken file: an overlap
// with no end would trust the old CA for ever.
type tlsMaterial struct {
	dir    string
	logger *slog.Logger
	now    func() time.Time // the clock of the overlap and of handshake verification

	mu           sync.Mutex
	tlsTrust          // what the files held at stamps
	overlapEnded bool // the end of the overlap was logged
	stamps       [len(tlsFiles)]fileStamp
	failedAt     *[len(tlsFiles)]fileStamp // the last change whose reload failed, logged once
}

// tlsTrust is what one read of --tls-dir yields.
type tlsTrust struct {
	cert          *tls.Certificate
	pool          *x509.CertPool // ca.crt
	overlap       *x509.CertPool // ca.crt and previous-ca.crt; nil without a previous CA
	previousUntil time.Time
}

func loadTLSMaterial(dir string, logger *slog.Logger, now func() time.Time) (*tlsMaterial, error) {
	m := &tlsMaterial{dir: dir, logger: logger, now: now}
	stamps, err := m.stat()
	if err != nil {
		return nil, err
	}
	t, err := m.read()
	if err != nil {
		return nil, err
	}
	m.adoptLocked(t, stamps)
	return m, nil
}

// stat follows symlinks, so that Kubernetes' secret swaps (a symlinked
// directory replaced atomically) are seen. A missing optional file has the
// zero stamp.
func (m *tlsMaterial) stat() ([len(tlsFiles)]fileStamp, error) {
	var out [len(tlsFiles)]fileStamp
	for i, name := range tlsFiles {
		fi, err := os.Stat(filepath.Join(m.dir, name))
		if i >= 3 && errors.Is(err, fs.ErrNotExist) { // the overlap's files are optional
			continue
		}
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return out, nil
}

func (m *tlsMaterial) read() (out tlsTrust, err error) {
	path := func(name string) string { return filepath.Join(m.dir, name) }
	cert, err := tls.LoadX509KeyPair(path(tlsCertFile), path(tlsKeyFile))
	if err != nil {
		return out, err
	}
	caPEM, err := os.ReadFile(path(tlsCAFile))
	if err != nil {
		return out, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return out, fmt.Errorf("%s holds no PEM certificate", path(tlsCAFile))
	}
	out.cert, out.pool = &cert, pool

	previousPEM, err := os.ReadFile(path(tlsPreviousCAFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	untilText, err := os.ReadFile(path(tlsPreviousUntilFile))
	if err != nil {
		return out, fmt.Errorf("%s needs %s, the RFC 3339 time its trust ends: %w", tlsPreviousCAFile, tlsPreviousUntilFile, err)
	}
	until, err := time.Parse(time.RFC3339, strings.TrimSpace(string(untilText)))
	if err != nil {
		return out, fmt.Errorf("%s: not an RFC 3339 time: %w", path(tlsPreviousUntilFile), err)
	}
	overlap := pool.Clone()
	if !overlap.AppendCertsFromPEM(previousPEM) {
		return out, fmt.Errorf("%s holds no PEM certificate", path(tlsPreviousCAFile))
	}
	out.overlap, out.previousUntil = overlap, until
	return out, nil
}

func (m *tlsMaterial) adoptLocked(t tlsTrust, stamps [len(tlsFiles)]fileStamp) {
	m.tlsTrust, m.stamps, m.overlapEnded, m.failedAt = t, stamps, false, nil
	if t.overlap != nil {
		m.logger.Info("trusting the previous client CA beside the current one", "dir", m.dir, "until", t.previousUntil)
	}
}

// refresh reloads all files when any of them changed. A reload that fails
// keeps the previous material and is logged once per change.
func (m *tlsMaterial) refresh() {
	m.mu.Lock()
	defer m.mu.Unlock()
	stamps, err := m.stat()
	if err == nil && stamps == m.stamps {
		return
	}
	if err == nil {
		var t tlsTrust
		if t, err = m.read(); err == nil {
			m.adoptLocked(t, stamps)
			m.logger.Info("reloaded the TLS material", "dir", m.dir)
			return
		}
	}
	if m.failedAt != nil && *m.failedAt == stamps {
		return
	}
	m.failedAt = &stamps
	m.logger.Error("could not reload the TLS material; keeping the previous one", "dir", m.dir, "err", err)
}

// current returns the serving identity and the CA pool trusted at now: the
// overlap pool strictly before previous-ca-until, ca.crt alone from then on.
func (m *tlsMaterial) current(now time.Time) (*tls.Certificate, *x509.CertPool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.overlap != nil && now.Before(m.previousUntil) {
		return m.cert, m.overlap
	}
	if m.overlap != nil && !m.overlapEnded {
		m.overlapEnded = true
		m.logger.Info("the previous client CA is no longer trusted", "dir", m.dir, "until", m.previousUntil)
	}
	return m.cert, m.pool
}

// serverConfig requires TLS 1.3 and a client certificate that verifies
// against the trusted CAs in the handshake, so that a client no CA vouches
// for never reaches an HTTP handler. Each handshake builds its own
// configuration from the files as they are now (rotation needs no restart)
// and the CA pool trusted at this moment (the overlap ends on time); the
// outer configuration only hands it over. Session tickets are off: a
// resumed session would skip that verification.
func (m *tlsMaterial) serverConfig() *tls.Config {
	return &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m.refresh()
		cert, pool := m.current(m.now())
		return &tls.Config{
			MinVersion:             tls.VersionTLS13,
			Certificates:           []tls.Certificate{*cert},
			ClientAuth:             tls.RequireAndVerifyClientCert,
			ClientCAs:              pool,
			NextProtos:             []string{"http/1.1"},
			Time:                   m.now,
			SessionTicketsDisabled: true,
		}, nil
	}}
}

// verifyPeer accepts a client whose leaf verifies against the CA pool
// trusted at now for client auth and carries clientName as a DNS SAN (ASCII
// case-insensitive, wildcards not expanded). The handshake already checked
// the chain; checking it again on every request ends a keep-alive
// connection's trust when its CA stops being trusted (a rotation, the end
// of the overlap), not only the next connection's.
func (m *tlsMaterial) verifyPeer(cs *tls.ConnectionState, clientName string, now time.Time) bool {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return false
	}
	_, pool := m.current(now)
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		CurrentTime:   now,
	})
	return err == nil && slices.ContainsFunc(leaf.DNSNames, func(name string) bool { return strings.EqualFold(name, clientName) })
}
