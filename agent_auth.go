// This file owns how the agent authenticates the controller (agent.md §7,
// README decision 9): HTTP Basic with constant-time comparison, or mutual
// TLS whose certificate files are re-read when they change, so a rotation
// needs no restart. It never authenticates the probes (/healthz, /readyz)
// and never touches the admin or drain sockets, which file permissions
// protect.
package haptic

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

const (
	basicRealmHeader    = `Basic realm="haptic-agent"`
	msgUnauthorized     = "unauthorized"
	msgClientCertDenied = "client certificate rejected"
	tlsCertFile         = "tls.crt"
	tlsKeyFile          = "tls.key"
	tlsCAFile           = "ca.crt"
)

// authenticated wraps a handler of the network API with the configured
// authentication. With --insecure-no-auth and nothing configured, every
// request passes. A failure is counted, logged (rate-limited) and, for an
// address that keeps failing, answered late (agent_authfail.go).
func (a *Agent) authenticated(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case a.tls != nil:
			if !a.tls.verifyPeer(r.TLS, a.cfg.TLSClientName, time.Now()) {
				waitBeforeRefusal(r.Context(), a.authFail.failed(r, authSchemeTLS))
				writeText(w, http.StatusUnauthorized, msgClientCertDenied)
				return
			}
			a.authFail.succeeded(r)
		case a.cfg.Username != "":
			if !basicMatches(r, a.cfg.Username, a.cfg.Password) {
				waitBeforeRefusal(r.Context(), a.authFail.failed(r, authSchemeBasic))
				w.Header().Set("WWW-Authenticate", basicRealmHeader)
				writeText(w, http.StatusUnauthorized, msgUnauthorized)
				return
			}
			a.authFail.succeeded(r)
		}
		h(w, r)
	}
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

// fileStamp identifies one version of a file by modification time and size.
type fileStamp struct {
	mod  time.Time
	size int64
}

// tlsMaterial is the agent's serving identity and the CA pool of controller
// client certificates, re-read from --tls-dir when the files change.
type tlsMaterial struct {
	dir    string
	logger *slog.Logger

	mu         sync.Mutex
	cert       *tls.Certificate
	pool       *x509.CertPool
	stamps     [3]fileStamp // of tls.crt, tls.key, ca.crt as loaded
	failedAt   [3]fileStamp // the last change whose reload failed, logged once
	haveFailed bool
}

func loadTLSMaterial(dir string, logger *slog.Logger) (*tlsMaterial, error) {
	m := &tlsMaterial{dir: dir, logger: logger}
	stamps, err := m.stat()
	if err != nil {
		return nil, err
	}
	cert, pool, err := m.read()
	if err != nil {
		return nil, err
	}
	m.cert, m.pool, m.stamps = cert, pool, stamps
	return m, nil
}

func (m *tlsMaterial) files() [3]string {
	return [3]string{filepath.Join(m.dir, tlsCertFile), filepath.Join(m.dir, tlsKeyFile), filepath.Join(m.dir, tlsCAFile)}
}

// stat follows symlinks, so that Kubernetes' secret swaps (a symlinked
// directory replaced atomically) are seen.
func (m *tlsMaterial) stat() ([3]fileStamp, error) {
	var out [3]fileStamp
	for i, p := range m.files() {
		fi, err := os.Stat(p)
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return out, nil
}

func (m *tlsMaterial) read() (*tls.Certificate, *x509.CertPool, error) {
	f := m.files()
	cert, err := tls.LoadX509KeyPair(f[0], f[1])
	if err != nil {
		return nil, nil, err
	}
	caPEM, err := os.ReadFile(f[2])
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%s holds no PEM certificate", f[2])
	}
	return &cert, pool, nil
}

// refresh reloads all three files when any of them changed. A reload that
// fails keeps the previous material and is logged once per change.
func (m *tlsMaterial) refresh() {
	m.mu.Lock()
	defer m.mu.Unlock()
	stamps, err := m.stat()
	if err == nil && stamps == m.stamps {
		return
	}
	if err == nil {
		var cert *tls.Certificate
		var pool *x509.CertPool
		if cert, pool, err = m.read(); err == nil {
			m.cert, m.pool, m.stamps = cert, pool, stamps
			m.haveFailed = false
			m.logger.Info("reloaded the TLS material", "dir", m.dir)
			return
		}
	}
	if m.haveFailed && stamps == m.failedAt {
		return
	}
	m.haveFailed, m.failedAt = true, stamps
	m.logger.Error("could not reload the TLS material; keeping the previous one", "dir", m.dir, "err", err)
}

func (m *tlsMaterial) current() (*tls.Certificate, *x509.CertPool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert, m.pool
}

// serverConfig requests (does not require) a client certificate, so that
// probes reach /healthz and /readyz without one; authenticated routes
// verify the peer themselves on every request.
func (m *tlsMaterial) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequestClientCert,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			m.refresh()
			cert, _ := m.current()
			return cert, nil
		},
	}
}

// verifyPeer accepts a client whose leaf verifies against the current CA
// pool for client auth and carries clientName as a DNS SAN (ASCII
// case-insensitive, wildcards not expanded).
func (m *tlsMaterial) verifyPeer(cs *tls.ConnectionState, clientName string, now time.Time) bool {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return false
	}
	_, pool := m.current()
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
	if err != nil {
		return false
	}
	for _, name := range leaf.DNSNames {
		if strings.EqualFold(name, clientName) {
			return true
		}
	}
	return false
}

// tlsListener serves TLS over ln with cfg.
func tlsListener(ln net.Listener, cfg *tls.Config) net.Listener {
	return tls.NewListener(ln, cfg)
}
