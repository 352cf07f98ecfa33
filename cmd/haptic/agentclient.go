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
	urls                                  []string
	tlsCert, tlsKey, tlsCA, tlsServerName string
}

func (f *agentClientFlags) register(fs *flag.FlagSet, agentUsage string) {
	fs.Func("agent", agentUsage, func(v string) error {
		if v == "" {
			return errors.New("empty agent URL")
		}
		f.urls = append(f.urls, v)
		return nil
	})
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate (PEM) for agents that run with --tls-dir")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA certificates (PEM) that sign the agents' serving certificates; default: the system roots")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name the agents' serving certificates must carry; default: the URL's host")
}

// clientConfig is the configuration of a client for one agent URL. The TLS
// configuration is shared between agents: NewClient clones it.
func (f *agentClientFlags) clientConfig(url string, tlsConfig *tls.Config, creds agentCredentials) *haptic.ClientConfig {
	return &haptic.ClientConfig{BaseURL: url, Username: creds.user, Password: creds.pass, TLS: tlsConfig}
}

// tlsConfig loads the TLS flags, or returns nil when none is set (Go's
// defaults then apply to https URLs).
func (f *agentClientFlags) tlsConfig() (*tls.Config, error) {
	return clientTLS(f.tlsCert, f.tlsKey, f.tlsCA, f.tlsServerName)
}

// clientTLS builds the client side of the agent's mutual TLS: the client
// identity, the roots that verify the agent, the expected server name.
// All empty gives nil. A certificate without its key (or the reverse) is an
// error rather than a silent anonymous client the agent would refuse with
// a less helpful 401.
func clientTLS(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && caFile == "" && serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	switch {
	case (certFile == "") != (keyFile == ""):
		return nil, errors.New("a client certificate and its key go together")
	case certFile != "":
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = roots
	}
	return cfg, nil
}
