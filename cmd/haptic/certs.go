// certs.go owns `haptic certs`: a development CA and the two identities
// mutual TLS between a controller and its agents needs, written as the
// files `haptic agent --tls-dir` reads and the --tls-* flags of the client
// commands name. It is for development and trials: the CA's key lies
// beside what it signed, and nothing revokes or rotates. It never
// overwrites a file, and removes the files it wrote when it fails.

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Defaults of `haptic certs`: the names the Kubernetes example gives the
// agents' Service and the controller, and a validity long enough for a
// trial and short enough that a forgotten development CA expires.
const (
	defaultCertsAgentName  = "haptic-agent"
	defaultCertsClientName = "haptic-controller"
	defaultCertsValidFor   = 30 * 24 * time.Hour
	// certsClockSkew backdates every certificate, so that a machine whose
	// clock is a little behind the one that made them accepts them at once.
	certsClockSkew = 5 * time.Minute
)

// dnsName is what --agent-name and --client-name accept: a DNS name, since
// the agent matches a client by its DNS SAN and a client verifies an agent
// by one.
var dnsName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)

// certFile is one file `haptic certs` writes: its path under DIR, its PEM
// block, and its mode (keys are read by their owner alone).
type certFile struct {
	rel   string
	block *pem.Block
	mode  os.FileMode
}

func runCerts(args []string, s stdio) int {
	fs := newFlagSet("certs", "haptic certs [--agent-name NAME] [--client-name NAME] [--valid-for D] DIR\n"+
		"Writes a development CA and the certificates mutual TLS needs, for development and trials, not production PKI\n"+
		"(the CA's key lies beside what it signed; nothing revokes or rotates them):\n"+
		"  DIR/ca.crt, DIR/ca.key                         the CA\n"+
		"  DIR/agent/tls.crt, tls.key, ca.crt             what haptic agent --tls-dir DIR/agent reads\n"+
		"  DIR/controller/tls.crt, tls.key, ca.crt        what --tls-cert, --tls-key, --tls-ca of push, diff and agent state name\n"+
		"Existing files are never overwritten.", s)
	agentName := fs.String("agent-name", defaultCertsAgentName, "DNS name of the agents' serving certificate (besides localhost, 127.0.0.1 and ::1): what --tls-server-name or the URL names")
	clientName := fs.String("client-name", defaultCertsClientName, "DNS name of the controller's client certificate: what haptic agent --tls-client-name requires")
	validFor := fs.Duration("valid-for", defaultCertsValidFor, "how long the CA and the certificates are valid")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	switch {
	case len(positional) != 1:
		return usageError(fs, "want one directory, got %s", countOf(len(positional), "argument"))
	case !dnsName.MatchString(*agentName):
		return usageError(fs, "--agent-name %q is not a DNS name", *agentName)
	case !dnsName.MatchString(*clientName):
		return usageError(fs, "--client-name %q is not a DNS name", *clientName)
	case *validFor <= 0:
		return usageError(fs, "--valid-for must be positive, got %s", *validFor)
	}
	now := time.Now()
	dir, err := filepath.Abs(positional[0])
	if err == nil {
		var files []certFile
		if files, err = devCertificates(*agentName, *clientName, now, *validFor); err == nil {
			err = writeNew(dir, files)
		}
	}
	if err != nil {
		fmt.Fprintf(s.err, "haptic certs: %v\n", err)
		return exitFailure
	}
	agentDir, controller := filepath.Join(dir, "agent"), filepath.Join(dir, "controller")
	fmt.Fprintf(s.out, "wrote a development CA (%s) and, signed by it, valid until %s:\n", filepath.Join(dir, "ca.crt"),
		now.Add(*validFor).UTC().Format(time.RFC3339))
	fmt.Fprintf(s.out, "  %s: the agent's identity (%s, localhost, 127.0.0.1, ::1) and the CA of controllers\n", agentDir, *agentName)
	fmt.Fprintf(s.out, "  %s: the controller's identity (%s) and the CA of agents\n", controller, *clientName)
	fmt.Fprint(s.out, "For development and trials only: keep ca.key private, and use your own PKI in production.\n\n")
	fmt.Fprintf(s.out, "Run an agent with them:\n  haptic agent --tls-dir %s --tls-client-name %s [flags]\n", shellWord(agentDir), *clientName)
	fmt.Fprintf(s.out, "Push to it (from another host: --agent https://ADDRESS:5555 --tls-server-name %s):\n", *agentName)
	fmt.Fprintf(s.out, "  haptic push --agent https://127.0.0.1:5555 --tls-cert %s --tls-key %s --tls-ca %s DIR\n",
		shellWord(filepath.Join(controller, "tls.crt")), shellWord(filepath.Join(controller, "tls.key")), shellWord(filepath.Join(controller, "ca.crt")))
	return exitOK
}

// devCertificates makes the CA, the agent's serving identity and the
// controller's client identity, each with an ECDSA P-256 key, and returns
// the files to write. One CA signs both identities, so each side's ca.crt
// is the same certificate: the agent trusts it for clients, the controller
// for agents.
func devCertificates(agentName, clientName string, now time.Time, validFor time.Duration) ([]certFile, error) {
	notBefore, notAfter := now.Add(-certsClockSkew), now.Add(validFor)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		Subject:   pkix.Name{CommonName: "haptic development CA"},
		NotBefore: notBefore, NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, caKeyPEM, err := certificate(caTemplate, nil, caKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	caPEM := &pem.Block{Type: "CERTIFICATE", Bytes: caDER}
	files := []certFile{{"ca.crt", caPEM, 0o644}, {"ca.key", caKeyPEM, 0o600}}
	for _, id := range []struct {
		dir      string
		template *x509.Certificate
	}{
		{"agent", &x509.Certificate{
			Subject:  pkix.Name{CommonName: agentName},
			DNSNames: []string{agentName, "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}},
		{"controller", &x509.Certificate{
			Subject:     pkix.Name{CommonName: clientName},
			DNSNames:    []string{clientName},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	} {
		id.template.NotBefore, id.template.NotAfter = notBefore, notAfter
		id.template.KeyUsage = x509.KeyUsageDigitalSignature
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, keyPEM, err := certificate(id.template, ca, key, caKey)
		if err != nil {
			return nil, err
		}
		files = append(files,
			certFile{id.dir + "/tls.crt", &pem.Block{Type: "CERTIFICATE", Bytes: der}, 0o644},
			certFile{id.dir + "/tls.key", keyPEM, 0o600},
			certFile{id.dir + "/ca.crt", caPEM, 0o644})
	}
	return files, nil
}

// certificate signs template for key's public half with signer (parent
// nil: self-signed), under a random 128-bit serial number, and returns
// the certificate and key's PEM block (PKCS #8).
func certificate(template, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) ([]byte, *pem.Block, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	template.SerialNumber = serial
	if parent == nil {
		parent = template
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return der, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}, nil
}

// writeNew writes files under dir, refusing before it writes anything if
// one of them exists: a second run must not replace a CA whose
// certificates are in use. Each file is created exclusively with its mode,
// so a key is never readable by others even for a moment; on a failure
// the files this run created are removed.
func writeNew(dir string, files []certFile) (err error) {
	var exist []string
	for _, f := range files {
		switch _, err := os.Lstat(filepath.Join(dir, f.rel)); {
		case err == nil:
			exist = append(exist, filepath.Join(dir, f.rel))
		case !errors.Is(err, os.ErrNotExist):
			return err
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("refusing to overwrite what exists: %s", strings.Join(exist, ", "))
	}
	var created []string
	defer func() {
		if err != nil {
			for _, p := range created {
				os.Remove(p)
			}
		}
	}()
	for _, f := range files {
		p := filepath.Join(dir, f.rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return err
		}
		created = append(created, p)
		err = pem.Encode(out, f.block)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// shellWord quotes a path for a POSIX shell when it holds anything beyond
// the characters a shell leaves alone, so that a printed command can be
// pasted as it is.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:=@,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
