// Tests of `haptic certs` and of the one set of client TLS flags: the
// files it writes are what an agent's --tls-dir and every command's
// --tls-cert, --tls-key and --tls-ca read (push, diff --agent, agent state
// --url and --agents-dns all reach the agent with the same four flags);
// the agent refuses a client without the certificate; a second run
// overwrites nothing; each flag's error names the flag and its file.

package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/haptic-agent/haptic"
)

// devPKI runs `haptic certs` into a new directory and returns it.
func devPKI(t *testing.T, args ...string) (string, cliResult) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	r := runCLI(t, nil, append(append([]string{"certs"}, args...), dir)...)
	if r.code != exitOK {
		t.Fatalf("haptic certs: code %d stderr %q", r.code, r.err)
	}
	return dir, r
}

func TestCertsMakeWhatTheAgentAndEveryCommandRead(t *testing.T) {
	dir, made := devPKI(t)
	agent := startCLIAgent(t, func(cfg *haptic.AgentConfig) {
		cfg.TLSDir, cfg.TLSClientName = filepath.Join(dir, "agent"), defaultCertsClientName
		cfg.Username, cfg.Password = "", ""
	})
	_, port, _ := net.SplitHostPort(agent.Addr())
	url := "https://127.0.0.1:" + port
	controller := filepath.Join(dir, "controller")
	tlsFlags := []string{"--tls-cert", filepath.Join(controller, "tls.crt"), "--tls-key", filepath.Join(controller, "tls.key"),
		"--tls-ca", filepath.Join(controller, "ca.crt")}

	// What it printed runs as printed, with the agent's port.
	wantAgent := "haptic agent --tls-dir " + filepath.Join(dir, "agent") + " --tls-client-name " + defaultCertsClientName + " [flags]\n"
	wantPush := "haptic push --agent https://127.0.0.1:5555 " + strings.Join(tlsFlags, " ") + " DIR\n"
	if !strings.Contains(made.out, wantAgent) || !strings.Contains(made.out, wantPush) ||
		!strings.Contains(made.out, "For development and trials only") {
		t.Errorf("haptic certs printed\n%s\nwant the commands\n%s%s", made.out, wantAgent, wantPush)
	}

	v1 := planOf(t, "shop-v1")
	r := runCLI(t, nil, append(append([]string{"push", "--agent", url}, tlsFlags...), testDir("shop-v1"))...)
	if r.code != exitOK || !strings.HasPrefix(r.out, url+": reload: no baseline; reloaded in ") {
		t.Fatalf("push with the controller's files: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	// The agent refuses a client that has no certificate, in the handshake.
	r = runCLI(t, nil, "push", "--agent", url, "--tls-ca", filepath.Join(controller, "ca.crt"), testDir("shop-v2"))
	if r.code != exitFailure || !strings.Contains(r.out, "tls: certificate required") {
		t.Errorf("push without a client certificate: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	// The same flags serve diff --agent and agent state, one agent or a
	// fleet named by the agents' DNS name.
	r = runCLI(t, nil, append(append([]string{"diff", "--agent", url}, tlsFlags...), testDir("shop-v1"))...)
	if r.code != exitOK || !strings.Contains(r.out, "noop") {
		t.Errorf("diff --agent: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	r = runCLI(t, nil, append([]string{"agent", "state", "--url", url}, tlsFlags...)...)
	if r.code != exitOK || !strings.Contains(r.out, "applied: "+v1+" ") {
		t.Errorf("agent state --url: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		if host != defaultCertsAgentName {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return []net.IPAddr{{IP: net.IPv4(127, 0, 0, 1)}}, nil
	}
	r = runCLIResolving(t, context.Background(), lookup, nil,
		append([]string{"agent", "state", "--agents-dns", "https://" + defaultCertsAgentName + ":" + port}, tlsFlags...)...)
	if r.code != exitOK || !strings.HasSuffix(r.out, "1 pod, all alike (plan "+v1+", disk in step, ready)\n") {
		t.Errorf("agent state --agents-dns: code %d stderr %q stdout %q", r.code, r.err, r.out)
	}
}

// The files: names, modes, and certificates that say what each is for.
func TestCertsWritesTheFilesOnceWithPrivateKeys(t *testing.T) {
	dir, _ := devPKI(t, "--agent-name", "lb.example.net", "--client-name", "ctl.example.net", "--valid-for", "48h")
	modes := map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600}
	for _, side := range []string{"agent", "controller"} {
		modes[side+"/tls.crt"], modes[side+"/tls.key"], modes[side+"/ca.crt"] = 0o644, 0o600, 0o644
	}
	contents := map[string][]byte{}
	for rel, mode := range modes {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		// The umask may take bits away, never add them.
		if got := fi.Mode().Perm(); got&^mode != 0 || strings.HasSuffix(rel, ".key") && got != 0o600 {
			t.Errorf("%s: mode %o, want %o", rel, got, mode)
		}
		contents[rel], _ = os.ReadFile(filepath.Join(dir, rel))
	}
	leaf := func(rel string) *x509.Certificate {
		block, _ := pem.Decode(contents[rel])
		if block == nil {
			t.Fatalf("%s holds no PEM", rel)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca := leaf("ca.crt")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, c := range []struct {
		rel   string
		usage x509.ExtKeyUsage
		dns   []string
		ips   int
	}{
		{"agent/tls.crt", x509.ExtKeyUsageServerAuth, []string{"lb.example.net", "localhost"}, 2},
		{"controller/tls.crt", x509.ExtKeyUsageClientAuth, []string{"ctl.example.net"}, 0},
	} {
		cert := leaf(c.rel)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s: %v", c.rel, err)
		}
		if !slices.Equal(cert.DNSNames, c.dns) || len(cert.IPAddresses) != c.ips {
			t.Errorf("%s: DNS %q, IPs %v", c.rel, cert.DNSNames, cert.IPAddresses)
		}
		if d := cert.NotAfter.Sub(ca.NotBefore); d < 48*3600e9 || d > 49*3600e9 {
			t.Errorf("%s: valid %s, want 48h (and the backdating)", c.rel, d)
		}
	}
	if !ca.IsCA || !bytes.Equal(contents["agent/ca.crt"], contents["ca.crt"]) || !bytes.Equal(contents["controller/ca.crt"], contents["ca.crt"]) {
		t.Error("each side's ca.crt is not the CA")
	}

	// A second run refuses before it writes anything.
	r := runCLI(t, nil, "certs", dir)
	if r.code != exitFailure || !strings.Contains(r.err, "haptic certs: refusing to overwrite what exists: "+filepath.Join(dir, "ca.crt")) {
		t.Errorf("second run: code %d stderr %q", r.code, r.err)
	}
	os.Remove(filepath.Join(dir, "controller", "tls.key"))
	r = runCLI(t, nil, "certs", dir)
	if r.code != exitFailure {
		t.Errorf("a run over a partial directory: code %d", r.code)
	}
	for rel, before := range contents {
		if now, _ := os.ReadFile(filepath.Join(dir, rel)); rel != "controller/tls.key" && !bytes.Equal(now, before) {
			t.Errorf("%s changed", rel)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "controller", "tls.key")); err == nil {
		t.Error("a refused run wrote the missing key")
	}

	// A run that fails halfway removes what it wrote: controller is a
	// link to nowhere, so none of its files exists, and it cannot be made
	// a directory once the CA and the agent's files are written.
	half := filepath.Join(t.TempDir(), "half")
	if err := os.MkdirAll(half, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(half, "nowhere"), filepath.Join(half, "controller"))
	if r := runCLI(t, nil, "certs", half); r.code != exitFailure || !strings.Contains(r.err, "haptic certs: mkdir "+filepath.Join(half, "controller")) {
		t.Errorf("a run that cannot make controller/: code %d stderr %q", r.code, r.err)
	}
	for _, rel := range []string{"ca.crt", "ca.key", "agent/tls.crt", "agent/tls.key", "agent/ca.crt"} {
		if _, err := os.Stat(filepath.Join(half, rel)); err == nil {
			t.Errorf("a failed run left %s behind", rel)
		}
	}
}

func TestCertsUsage(t *testing.T) {
	d := filepath.Join(t.TempDir(), "d") // were a check to let a run through, it writes here
	for _, c := range []struct {
		args []string
		err  string
	}{
		{nil, "want one directory, got 0 arguments"},
		{[]string{"a", "b"}, "want one directory, got 2 arguments"},
		{[]string{"--agent-name", "a b", d}, `--agent-name "a b" is not a DNS name`},
		{[]string{"--client-name", "", d}, `--client-name "" is not a DNS name`},
		{[]string{"--valid-for", "0s", d}, "--valid-for must be positive, got 0s"},
	} {
		r := runCLI(t, nil, append([]string{"certs"}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.err, c.err) {
			t.Errorf("certs %q: code %d stderr %q, want %q", c.args, r.code, r.err, c.err)
		}
	}
	if r := runCLI(t, nil, "certs", "-h"); r.code != exitOK || !strings.Contains(r.err, "for development and trials, not production PKI") {
		t.Errorf("certs -h: %q", r.err)
	}
}

// Every command that reaches agents names the flag and the file it could
// not use.
func TestClientTLSFlagErrorsNameTheFlagAndTheFile(t *testing.T) {
	dir, _ := devPKI(t)
	cert, key := filepath.Join(dir, "controller", "tls.crt"), filepath.Join(dir, "controller", "tls.key")
	missing := filepath.Join(dir, "ctl", "ca.crt")
	for _, c := range []struct {
		flags []string
		err   string
	}{
		{[]string{"--tls-cert", missing, "--tls-key", key}, "--tls-cert: open " + missing + ": no such file or directory"},
		{[]string{"--tls-cert", cert, "--tls-key", missing}, "--tls-key: open " + missing + ": no such file or directory"},
		{[]string{"--tls-ca", missing}, "--tls-ca: open " + missing + ": no such file or directory"},
		{[]string{"--tls-ca", key}, "--tls-ca " + key + " holds no PEM certificate"},
		{[]string{"--tls-cert", cert, "--tls-key", filepath.Join(dir, "agent", "tls.key")},
			"--tls-cert " + cert + " and --tls-key " + filepath.Join(dir, "agent", "tls.key") + ": tls: private key does not match public key"},
		{[]string{"--tls-cert", cert}, "--tls-cert and --tls-key go together: give both, or neither"},
	} {
		for _, cmd := range []struct {
			name string
			args []string
			code int
		}{
			{"push", []string{"--agent", "https://127.0.0.1:1", testDir("shop-v1")}, exitFailure},
			{"diff", []string{"--agent", "https://127.0.0.1:1", testDir("shop-v1")}, exitUsage},
			{"agent state", []string{"--url", "https://127.0.0.1:1"}, exitFailure},
		} {
			r := runCLI(t, nil, slices.Concat(strings.Fields(cmd.name), cmd.args, c.flags)...)
			if want := "haptic " + cmd.name + ": " + c.err + "\n"; r.code != cmd.code || r.err != want {
				t.Errorf("%s %q: code %d stderr %q, want %d and %q", cmd.name, c.flags, r.code, r.err, cmd.code, want)
			}
		}
	}
}
