// Tests of the client TLS material the commands load, with the one set of
// flags every command that reaches agents takes (--tls-cert, --tls-key,
// --tls-ca, --tls-server-name): `agent state --url` against a server that
// requires a client certificate, `push` against a real agent running with
// --tls-dir, and each flag's error naming the flag and its file.

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// testPKI is a CA with one serving and one client certificate, written as
// PEM files into dir.
type testPKI struct {
	dir                          string
	caFile                       string
	serverCert, serverKey        string
	clientCert, clientKey        string
	pool                         *x509.CertPool
	serverPair                   tls.Certificate
	caCert                       *x509.Certificate
	caKey                        *ecdsa.PrivateKey
	serialNumber                 int64
	serverDNSName, clientDNSName string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), serverDNSName: "agent.test", clientDNSName: "controller.test"}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	caDER := p.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "haptic test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, &p.caKey.PublicKey, nil)
	if p.caCert, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatal(err)
	}
	p.pool = x509.NewCertPool()
	p.pool.AddCert(p.caCert)
	p.caFile = p.write(t, "ca.crt", "CERTIFICATE", caDER)
	p.serverCert, p.serverKey = p.issue(t, "server", &x509.Certificate{Subject: pkix.Name{CommonName: p.serverDNSName},
		DNSNames: []string{p.serverDNSName}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	p.clientCert, p.clientKey = p.issue(t, "client", &x509.Certificate{Subject: pkix.Name{CommonName: p.clientDNSName},
		DNSNames: []string{p.clientDNSName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if p.serverPair, err = tls.LoadX509KeyPair(p.serverCert, p.serverKey); err != nil {
		t.Fatal(err)
	}
	return p
}

// sign makes a certificate signed by the CA (self-signed when parent is nil).
func (p *testPKI) sign(t *testing.T, tmpl *x509.Certificate, pub *ecdsa.PublicKey, parent *x509.Certificate) []byte {
	t.Helper()
	p.serialNumber++
	tmpl.SerialNumber = big.NewInt(p.serialNumber)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// issue writes <name>.crt and <name>.key and returns their paths.
func (p *testPKI) issue(t *testing.T, name string, tmpl *x509.Certificate) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".crt", "CERTIFICATE", p.sign(t, tmpl, &key.PublicKey, p.caCert)),
		p.write(t, name+".key", "PRIVATE KEY", keyDER)
}

func (p *testPKI) write(t *testing.T, name, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// linkDir makes a directory holding the given files under the names the
// agent's --tls-dir expects.
func linkDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		content, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestAgentStateOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	srv := httptest.NewUnstartedServer(&stateServer{state: recordedState()})
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.serverPair}, ClientCAs: pki.pool,
		ClientAuth: tls.RequireAndVerifyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below is expected
	srv.StartTLS()
	defer srv.Close()

	r := runCLI(t, nil, "agent", "state", "--url", srv.URL, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey, "--tls-ca", pki.caFile)
	if r.code != exitOK || r.out != recordedStateText {
		t.Errorf("with the client identity: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	// Without the CA the agent's certificate is not trusted.
	r = runCLI(t, nil, "agent", "state", "--url", srv.URL)
	if r.code != exitFailure || !strings.Contains(r.err, "certificate") {
		t.Errorf("without --tls-ca: code %d stderr %q", r.code, r.err)
	}
}

func TestPushOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	agentDir := linkDir(t, map[string]string{"tls.crt": pki.serverCert, "tls.key": pki.serverKey, "ca.crt": pki.caFile})
	agent := startCLIAgent(t, func(cfg *haptic.AgentConfig) {
		cfg.TLSDir, cfg.TLSClientName = agentDir, pki.clientDNSName
		cfg.Username, cfg.Password = "", ""
	})
	url := "https://" + agent.Addr()
	tlsFlags := []string{"--tls-ca", pki.caFile, "--tls-server-name", pki.serverDNSName}

	r := runCLI(t, nil, append(append([]string{"push", "--agent", url}, tlsFlags...),
		"--tls-cert", pki.clientCert, "--tls-key", pki.clientKey, testDir("shop-v1"))...)
	if r.code != exitOK || !strings.HasPrefix(r.out, url+": reload: no baseline; reloaded in ") {
		t.Errorf("with the client certificate: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	// The agent refuses a client without a certificate in the handshake.
	r = runCLI(t, nil, append(append([]string{"push", "--agent", url}, tlsFlags...), testDir("shop-v2"))...)
	if r.code != exitFailure || !strings.Contains(r.out, "tls: certificate required") {
		t.Errorf("without a client certificate: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
}
