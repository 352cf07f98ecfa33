// agentclient.go owns how the operator commands reach an agent over TCP:
// the --agent URLs, the credentials from the environment and the client TLS
// material. It builds haptic.ClientConfig values and nothing else; the
// requests themselves are the package client's.

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/haptic-agent/haptic"
)

// agentClientFlags are the flags `haptic push` and `haptic diff --agent`
// share; the credentials come from the environment (credentialsFrom).
type agentClientFlags struct {
	urls []string
	clientTLSFlags
}

func (f *agentClientFlags) register(fs *flag.FlagSet, agentUsage string) {
	fs.Func("agent", agentUsage, func(v string) error {
		if v == "" {
			return errors.New("empty agent URL")
		}
		f.urls = append(f.urls, v)
		return nil
	})
	f.clientTLSFlags.register(fs)
}

// clientConfig is the configuration of a client for one agent URL. The TLS
// configuration is shared between agents: NewClient clones it.
func (f *agentClientFlags) clientConfig(url string, tlsConfig *tls.Config, creds agentCredentials) *haptic.ClientConfig {
	return &haptic.ClientConfig{BaseURL: url, Username: creds.user, Password: creds.pass, TLS: tlsConfig}
}

// clientTLSFlags are the client side of the agent's mutual TLS, one set
// for every command that reaches agents over the network (push, diff
// --agent, agent state --url or --agents-dns), so that the files a
// controller holds (a client identity and the CA of the agents) are named
// the same way everywhere, whatever directory they sit in.
type clientTLSFlags struct {
	tlsCert, tlsKey, tlsCA, tlsServerName string
}

func (f *clientTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate (PEM) for agents that run with --tls-dir")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA certificates (PEM) that sign the agents' serving certificates; default: the system roots")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name the agents' serving certificates must carry; default: the URL's host")
}

// set reports whether any TLS flag is given.
func (f *clientTLSFlags) set() bool {
	return f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" || f.tlsServerName != ""
}

// tlsConfig loads the files the flags name, or returns nil when no flag is
// set (Go's defaults then apply to https URLs). Each error names the flag
// and its file, so that a path given to the wrong flag, or a directory
// laid out differently, is found at once. A certificate without its key
// (or the reverse) is an error rather than a silent anonymous client the
// agent would refuse with a less helpful 401.
func (f *clientTLSFlags) tlsConfig() (*tls.Config, error) {
	if !f.set() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.tlsServerName}
	switch {
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return nil, errors.New("--tls-cert and --tls-key go together: give both, or neither")
	case f.tlsCert != "":
		certPEM, err := readFlagFile("tls-cert", f.tlsCert)
		if err != nil {
			return nil, err
		}
		keyPEM, err := readFlagFile("tls-key", f.tlsKey)
		if err != nil {
			return nil, err
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s and --tls-key %s: %w", f.tlsCert, f.tlsKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if f.tlsCA != "" {
		pem, err := readFlagFile("tls-ca", f.tlsCA)
		if err != nil {
			return nil, err
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", f.tlsCA)
		}
		cfg.RootCAs = roots
	}
	return cfg, nil
}

// readFlagFile reads the file a flag names; the error names both (the
// os error already names the path).
func readFlagFile(flagName, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	return b, nil
}
