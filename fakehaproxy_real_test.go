// This file owns the real-HAProxy side of the fake's tests: the harness
// every runtime and agent test shares to start a real binary
// (startRealHAProxy, on the binary HAPTIC_HAPROXY names, skipping when it
// is unset), the fixture that binary and a matching fake both load, and
// the parity test that holds the fake's replies to the real ones. It must
// never define a second harness or start a binary HAPTIC_HAPROXY did not
// name: the suite passes offline on the fake alone.

package haptic

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// realHAProxy is a real HAProxy master and worker started in a short
// temporary directory on the fixture writeRealFixture writes (the
// configuration is testdata/haproxy/runtime.cfg). Its frontends bind unix
// sockets, so parallel runs never collide on ports.
type realHAProxy struct {
	Dir     string
	bin     string
	version string
	fixture realFixture
	cmd     *exec.Cmd
	output  *lockedBuffer
	stop    sync.Once
	exited  chan struct{}
}

// realFixture is the files the real HAProxy loads; seedFake gives the fake
// the same state.
type realFixture struct {
	certPEM, caPEM string // certs/a.pem (certificate and key), certs/ca.pem
	ca             *testCA
}

const realFixtureMap = "example.com be-a\nb.example.com be-b\n"
const realFixtureCRTList = "certs/a.pem [alpn h2] a.example.com\n"

// startRealHAProxy starts the binary named by HAPTIC_HAPROXY, or skips the
// test when the variable is unset. Cleanup stops it and removes the
// directory.
func startRealHAProxy(t testing.TB) *realHAProxy {
	t.Helper()
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set; real-HAProxy tests skipped")
	}
	out, err := exec.Command(bin, "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -v: %v\n%s", bin, err, out)
	}
	firstLine, _, _ := strings.Cut(string(out), "\n")
	words := strings.Fields(firstLine)
	if len(words) < 3 {
		t.Fatalf("%s -v: unreadable first line %q", bin, firstLine)
	}
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	h := &realHAProxy{Dir: dir, bin: bin, version: words[2], output: &lockedBuffer{}, exited: make(chan struct{})}
	t.Cleanup(func() {
		h.Stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", bin, h.Output())
		}
		os.RemoveAll(dir)
	})
	h.fixture = writeRealFixture(t, dir)
	h.cmd = exec.Command(bin, "-W", "-db", "-S", filepath.Join(dir, "haproxy-master.sock")+",level,admin", "--", filepath.Join(dir, "haproxy.cfg"))
	h.cmd.Stdout, h.cmd.Stderr = h.output, h.output
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	go func() {
		h.cmd.Wait()
		close(h.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !h.ready() {
		select {
		case <-h.exited:
			t.Fatalf("%s exited at start:\n%s", bin, h.output.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 10s:\n%s", bin, h.output.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return h
}

// ready reports whether show proc lists a worker and the worker answers
// show info.
func (h *realHAProxy) ready() bool {
	exchange := func(sock, line string) string {
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return ""
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		conn.Write([]byte(line))
		var b bytes.Buffer
		b.ReadFrom(conn)
		return b.String()
	}
	proc := exchange(h.MasterSocket(), "show proc;quit\n")
	_, workers, ok := strings.Cut(proc, "# workers\n")
	// After a failed reload 3.4 lists the worker that keeps serving under
	// "# old workers".
	if !ok || !regexp.MustCompile(`(?m)^\d+\s+worker`).MatchString(workers) {
		return false
	}
	return strings.Contains(exchange(h.WorkerSocket(), "show info\n"), "Pid: ")
}

// writeRealFixture writes the map, the certificate and key, the CA file,
// the crt-list and the configuration the real binary loads; the
// certificates are made here, with no network and no openssl.
func writeRealFixture(t testing.TB, dir string) realFixture {
	t.Helper()
	ca := newTestCA(t, "haptic test CA")
	cert, key := ca.issue(t, testCertOptions{CommonName: "a.example.com", DNSNames: []string{"a.example.com"}})
	fx := realFixture{certPEM: string(cert) + string(key), caPEM: string(ca.CertPEM), ca: ca}
	cfg, err := os.ReadFile(filepath.Join("testdata", "haproxy", "runtime.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"maps/host.map":  realFixtureMap,
		"certs/a.pem":    fx.certPEM,
		"certs/ca.pem":   fx.caPEM,
		"certs/list.txt": realFixtureCRTList,
		"haproxy.cfg":    strings.ReplaceAll(string(cfg), "<dir>", dir),
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return fx
}

// waitReady polls every 50 ms for up to 10 s until the master lists a
// worker and the worker answers, as after a reload.
func (h *realHAProxy) waitReady(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !h.ready(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 10s:\n%s", h.bin, h.output.String())
		}
	}
}

// WorkerSocket is the worker's stats socket.
func (h *realHAProxy) WorkerSocket() string { return filepath.Join(h.Dir, "haproxy-worker.sock") }

// MasterSocket is the master CLI socket.
func (h *realHAProxy) MasterSocket() string { return filepath.Join(h.Dir, "haproxy-master.sock") }

// Version is word 3 of the first line of `<bin> -v`.
func (h *realHAProxy) Version() string { return h.version }

// Output is what HAProxy printed so far.
func (h *realHAProxy) Output() string { return h.output.String() }

// Stop sends SIGTERM to the master, waits up to 5 s, then kills it. It is
// idempotent.
func (h *realHAProxy) Stop() {
	h.stop.Do(func() {
		if h.cmd == nil || h.cmd.Process == nil {
			return
		}
		h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(5 * time.Second):
			h.cmd.Process.Kill()
			<-h.exited
		}
	})
}

// seedFake gives a fake model what the real binary loads from the
// fixture, so both start equal: the map, the certificate, the CA file,
// the crt-list, be-a with srv1 enabled and srv-check with check, and the
// three frontends.
func (fx realFixture) seedFake(m *FakeModel) {
	m.Maps = map[string][]MapEntry{"maps/host.map": ParseMapEntries(realFixtureMap)}
	m.Certs = map[string]string{"certs/a.pem": fx.certPEM}
	m.CAFiles = map[string]string{"certs/ca.pem": fx.caPEM}
	m.CRLFiles = map[string]string{}
	m.CRTLists = map[string][]string{"certs/list.txt": {strings.TrimSuffix(realFixtureCRTList, "\n")}}
	m.Frontends = map[string]uint64{"status": 0, "http-tcp": 0, "tls": 0}
	m.Backends = map[string]*FakeBackend{"be-a": {Profile: "web", Mode: "http", Published: true, Referenced: true, Servers: []*FakeServer{
		{Name: "srv1", Address: "127.0.0.1", Port: 9, Weight: 1, State: "ready", Enabled: true},
		{Name: "srv-check", Address: "127.0.0.1", Port: 9, Keywords: []string{"check", "inter", "60s"},
			Weight: 1, State: "ready", Enabled: true, Check: true, Health: true},
	}}}
	m.BlockedServers = map[string]bool{}
}

// startMatchingFake starts a fake with the real binary's version, seeded
// with its fixture; a reload resets it to the fixture, as the real worker
// reloads the files.
func (h *realHAProxy) startMatchingFake(t testing.TB) *FakeHAProxy {
	t.Helper()
	f := startTestFake(t, h.version)
	f.With(func(m *FakeModel) {
		h.fixture.seedFake(m)
		m.OnReload = h.fixture.seedFake
	})
	return f
}

// dialect is the fake dialect of the real binary's version.
func (h *realHAProxy) dialect() fakeDialect {
	return fakeDialectOf(CapsFor(h.version, nil))
}

func TestRealHAProxyFramingLimits(t *testing.T) {
	h := startRealHAProxy(t)
	runFramingRows(t, h.WorkerSocket(), h.dialect())
}

// ---------------------------------------------------------------------------
// Parity: the same lines to the real binary and to the fake, replies
// compared once the parts that differ between any two runs are masked.

var (
	parityHex       = regexp.MustCompile(`0x[0-9a-f]+`)
	parityCommit    = regexp.MustCompile(`(?m)^(Committing .*?)\.*$`)
	paritySystemCA  = regexp.MustCompile(`@system-ca - \d+ certificate`)
	parityMapSource = regexp.MustCompile(`used by map at file '[^']*' line \d+`)
	parityStartTime = regexp.MustCompile(`^\d+(\.\d{1,6})?$`)
	parityDigits    = regexp.MustCompile(`^\d+$`)
	parityUnixDir   = regexp.MustCompile(`unix@/\S*/`)
	paritySockpair  = regexp.MustCompile(`sockpair@\d+`)
)

// normaliseReply rewrites a raw reply into comparable text, response by
// response as splitResponses cuts them, with what varies between runs or
// hosts masked: NUL bytes, addresses, PIDs, uptimes, the map's
// configuration line, the @system-ca count, the dots after "Committing",
// the help lines of an unknown command, the directory of a listed unix
// socket and the descriptor of the master's socket pair, and all but the shape of show info, show stat, show servers
// state, show proc and reload replies.
func normaliseReply(raw string) string {
	resp, tail := splitResponses(raw)
	var out []string
	for _, r := range resp {
		out = append(out, normaliseResponse(r))
	}
	if tail != "" {
		out = append(out, "partial: "+normaliseResponse(tail))
	}
	return strings.Join(out, "\n--- next response ---\n")
}

func normaliseResponse(r string) string {
	r = strings.ReplaceAll(r, "\x00", "")
	switch {
	case strings.HasPrefix(r, "Name: HAProxy\n"):
		return normaliseShowInfo(r)
	case strings.HasPrefix(r, "# pxname,"):
		return normaliseShowStat(r)
	case strings.HasPrefix(r, "1\n# be_id "):
		return normaliseServersState(r)
	case strings.HasPrefix(r, "#<PID>"):
		return normaliseShowProc(r)
	case strings.HasPrefix(r, "# socket lvl processes\n"):
		return paritySockpair.ReplaceAllString(parityUnixDir.ReplaceAllString(r, "unix@DIR/"), "sockpair@N")
	case strings.HasPrefix(r, "Success="):
		status, _, _ := strings.Cut(r, "\n")
		return fmt.Sprintf("%s (log separator: %v)", status, strings.Contains(r, "\n--\n") || strings.HasSuffix(r, "\n--"))
	}
	r = firstLineIfUnknown(r)
	r = parityHex.ReplaceAllString(r, "0xADDR")
	r = parityCommit.ReplaceAllString(r, "$1")
	r = paritySystemCA.ReplaceAllString(r, "@system-ca - N certificate")
	r = parityMapSource.ReplaceAllString(r, "used by map at file 'CFG' line N")
	return r
}

// normaliseShowInfo keeps the presence and format of the identity fields.
func normaliseShowInfo(r string) string {
	fields := map[string]string{}
	for _, line := range strings.Split(r, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			fields[k] = v
		}
	}
	return fmt.Sprintf("show info: Name=%s Version=%s Pid digits=%v Start_time_sec float=%v",
		fields["Name"], fields["Version"], parityDigits.MatchString(fields["Pid"]),
		parityStartTime.MatchString(fields["Start_time_sec"]))
}

// normaliseShowStat keeps the conn_tot column's presence and the FRONTEND
// names.
func normaliseShowStat(r string) string {
	lines := strings.Split(r, "\n")
	header := strings.Split(strings.TrimPrefix(lines[0], "# "), ",")
	var frontends []string
	for _, line := range lines[1:] {
		cols := strings.Split(line, ",")
		if len(cols) > 1 && cols[1] == "FRONTEND" {
			frontends = append(frontends, cols[0])
		}
	}
	sort.Strings(frontends) // a set: HAProxy lists them in configuration order
	return fmt.Sprintf("show stat: conn_tot=%v frontends=%s", slices.Contains(header, "conn_tot"), strings.Join(frontends, ","))
}

// normaliseServersState keeps be_name, srv_name, srv_addr, srv_admin_state
// and srv_port of every row.
func normaliseServersState(r string) string {
	var rows []string
	for _, line := range strings.Split(r, "\n")[2:] {
		f := strings.Fields(line)
		if len(f) < 19 {
			rows = append(rows, "short row: "+line)
			continue
		}
		rows = append(rows, strings.Join([]string{f[1], f[3], f[4], f[6], f[18]}, " "))
	}
	return "show servers state:\n" + strings.Join(rows, "\n")
}

// normaliseShowProc keeps the header and section lines exactly, and of
// each row its type, field count and failed count.
func normaliseShowProc(r string) string {
	var out []string
	for i, line := range strings.Split(r, "\n") {
		switch {
		case i == 0 || strings.HasPrefix(line, "#"):
			out = append(out, line)
		default:
			f := strings.Fields(line)
			row := fmt.Sprintf("row: %d fields", len(f))
			if len(f) > 1 {
				row += " type " + f[1]
			}
			if m := regexp.MustCompile(`\[failed: \d+\]`).FindString(line); m != "" {
				row += " " + m
			}
			out = append(out, row)
		}
	}
	return strings.Join(out, "\n")
}

// parityScript is the worker script of the parity test, in order, for
// the real binary's dialect: every worker command both sides support,
// each in success and refusal. Each entry is one line without the
// severity prefix; payload commands are framed for the dialect.
func parityScript(t testing.TB, h *realHAProxy) []string {
	d := h.dialect()
	payload := func(cmd, body string) string {
		if d == fakeDialect26 {
			return cmd + " <<\n" + body // the line's own '\n' makes the empty terminator line
		}
		return cmd + " <<HAPTIC\n" + body + "HAPTIC"
	}
	certB, keyB := h.fixture.ca.issue(t, testCertOptions{CommonName: "b.example.com", DNSNames: []string{"b.example.com"}})
	validB := string(certB) + string(keyB)
	ca2 := newTestCA(t, "haptic second CA")
	lines := []string{
		// identity and stats
		"show info float",
		"show stat -1 1 -1",
		"show cli sockets",
		// maps
		"show map",
		"show map maps/host.map",
		payload("add map maps/host.map", "p1.example.com be-p\nspaced.example.com a value  with spaces\nempty.example.com \n"),
		"show map maps/host.map",
		"set map maps/host.map example.com be-z",
		"set map maps/host.map absent.example.com be-z",
		"set map maps/host.map example.com",
		"add map maps/host.map dup d1;add map maps/host.map dup d2;del map maps/host.map dup;show map maps/host.map",
		"del map maps/host.map dup",
		"prepare map maps/host.map",
		"add map @1 maps/host.map v1.example.com be-v",
		payload("add map @1 maps/host.map", "v2.example.com be-v\n"),
		"show map",
		"show map @1 maps/host.map",
		"add map @9 maps/host.map k v",
		"commit map @9 maps/host.map",
		"commit map @1 maps/host.map",
		"show map;show map maps/host.map",
		"prepare map maps/host.map",
		"add map @2 maps/host.map c1 v;clear map @2 maps/host.map;commit map @2 maps/host.map;show map maps/host.map",
		"add map maps/host.map example.com be-a",
		"show map nope.map",
		"add map nope.map k v",
		"set map nope.map k v",
		"del map nope.map k",
		"prepare map nope.map",
		"commit map @1 nope.map",
		"clear map nope.map",
		"add map maps/host.map k1",
		// TLS
		"show ssl cert",
		"show ssl ca-file",
		"show ssl crl-file",
		"show ssl crt-list",
		"show ssl crt-list -n certs/list.txt",
		"show ssl crt-list certs/list.txt",
		"show ssl crt-list nope.txt",
		"new ssl cert certs/b.pem",
		"new ssl cert certs/b.pem",
		payload("add ssl crt-list certs/list.txt", "certs/b.pem\n"),
		payload("set ssl cert certs/b.pem", string(certB)),
		"show ssl cert",
		"commit ssl cert certs/b.pem",
		"abort ssl cert certs/b.pem",
		payload("set ssl cert certs/b.pem", "hello\n"),
		payload("set ssl cert certs/zz.pem", validB),
		"commit ssl cert certs/b.pem",
		"abort ssl cert certs/b.pem",
		payload("set ssl cert certs/b.pem", validB),
		payload("set ssl cert certs/a.pem", string(certB)),
		"commit ssl cert certs/a.pem",
		"abort ssl cert certs/a.pem",
		payload("set ssl cert certs/a.pem", h.fixture.certPEM),
		"commit ssl cert certs/a.pem",
		"abort ssl cert certs/a.pem",
		"commit ssl cert certs/b.pem",
		"show ssl cert",
		"new ssl ca-file certs/ca2.pem",
		"new ssl ca-file certs/ca2.pem",
		payload("set ssl ca-file certs/ca2.pem", "hello\n"),
		payload("set ssl ca-file certs/ca2.pem", string(ca2.CertPEM)),
		payload("set ssl ca-file certs/ca2.pem", string(ca2.CertPEM)),
		"show ssl ca-file",
		payload("set ssl ca-file certs/ca.pem", h.fixture.caPEM),
		"commit ssl ca-file certs/ca.pem",
		"abort ssl ca-file certs/ca.pem",
		"commit ssl ca-file certs/ca2.pem",
		"commit ssl ca-file certs/ca2.pem",
		"abort ssl ca-file certs/ca2.pem",
		payload("set ssl ca-file certs/zz.pem", string(ca2.CertPEM)),
		payload("set ssl ca-file certs/ca2.pem", string(ca2.CertPEM)),
		"abort ssl ca-file certs/ca2.pem",
		"show ssl ca-file",
		payload("add ssl crt-list certs/list.txt", "certs/b.pem [alpn h2 ssl-min-ver TLSv1.2] b.example.com !x.example.com\n"),
		payload("add ssl crt-list certs/list.txt", "certs/zz.pem\n"),
		payload("add ssl crt-list certs/nolist.txt", "certs/b.pem\n"),
		"show ssl crt-list -n certs/list.txt",
		"del ssl crt-list certs/list.txt certs/b.pem",
		"del ssl crt-list certs/list.txt certs/b.pem",
		"del ssl crt-list certs/list.txt certs/zz.pem",
		"del ssl crt-list certs/nolist.txt certs/b.pem",
		"show ssl crt-list -n certs/list.txt",
		// servers
		"add server be-a/s1 127.0.0.1:80",
		"add server be-a/s2 127.0.0.1:80 check inter 2s",
		"add server be-a/s1 127.0.0.1:80",
		"add server nope/s1 127.0.0.1:80",
		"add server be-a/s3 127.0.0.1:80 bogus",
		"add server be-a/t1 127.0.0.1:443 ssl",
		"add server be-a/t2 127.0.0.1:443 ssl verify none",
		"add server be-a/t3 127.0.0.1:443 ssl verify none crt certs/zz.pem",
		"add server be-a/t4 127.0.0.1:443 ssl verify none ca-file certs/zz.pem",
		"add server be-a/t5 127.0.0.1:443 ssl crt certs/a.pem ca-file certs/ca.pem",
		"add server be-a/t6 127.0.0.1:443 ssl crt certs/b.pem verify none",
		"add server be-a/t7 127.0.0.1:443 crt certs/zz.pem",
		"add server be-a/t8 127.0.0.1:443 ssl ca-file certs/ca2.pem verify required",
		"add server be-a/s3",
		"add server bea 127.0.0.1:80",
		"enable server be-a/s1",
		"disable server be-a/s1",
		"enable server be-a/nope",
		"enable server nope/s1",
		"enable server bea",
		"enable health be-a/s1",
		"enable health be-a/s2",
		"enable server be-a/s1",
		"set server be-a/s1 addr 127.0.0.2",
		"set server be-a/s1 addr 127.0.0.2 port 81",
		"set server be-a/s1 addr 127.0.0.3 port 82",
		"set server be-a/s1 addr 127.0.0.3",
		"set server be-a/s1 addr bogus",
		"set server be-a/s1 addr 127.0.0.3 port abc",
		"set server be-a/s1 weight 5",
		"set server be-a/s1 weight 999",
		"set server be-a/s1 state drain",
		"set server be-a/s1 state bogus",
		"set server be-a/s1 bogus",
		"show servers state be-a",
		"show servers state nope",
		"shutdown sessions server be-a/s1",
		"wait 100 srv-removable be-a/s1",
		"del server be-a/s1",
		"disable server be-a/s1",
		"wait 100 srv-removable be-a/s1",
		"del server be-a/s1",
		"del server be-a/s1",
		"wait 100 srv-removable bea",
		"wait 100 srv-removable be-a/nope",
		"wait 100 srv-removable nope/s1",
		"wait 100 srv-removable",
		"show servers state be-a",
		// backends, which only 3.4 has: the others answer unknown command,
		// or the wait usage on 3.0
		"add backend be-x from web mode http",
		"add backend be-a from web mode http",
		"add backend http-tcp from web mode http",
		"add backend be-y",
		"add backend be-y from web mode bogus",
		"add backend be-y from web bogus x",
		"add backend be-y from web mode http guid g1",
		"add backend be-z from web mode http guid g1",
		"publish backend nope",
		"unpublish backend nope",
		"wait 100 be-removable be-x",
		"experimental-mode on;publish backend be-x",
		"wait 100 be-removable be-x",
		"del backend be-x",
		"unpublish backend be-x",
		"add server be-x/s1 127.0.0.1:80",
		"wait 100 be-removable be-x",
		"del backend be-x",
		"del server be-x/s1",
		"del backend be-x extra",
		// A successful del backend prints the messages earlier commands
		// left on the worker thread (a del server's "Server deleted."),
		// which unpublish clears first when it runs on the same one.
		"unpublish backend be-x;del backend be-x",
		"del backend be-x",
		"del backend be-a",
		"wait 100 be-removable nope",
		"wait 100 be-removable be-a",
		"wait 100 be-removable",
		"wait 100",
		"bogus verb",
	}
	if !CapsFor(h.version, nil).ServerInitState {
		lines = append(lines, "add server be-a/s4 127.0.0.1:80 init-state up")
	}
	return lines
}

// awaitRealServerAddr polls show servers state for up to 2 s until the
// real server shows the address and port the fake holds: HAProxy 3.0
// applies set server addr asynchronously, so a command on the next
// connection can still see the old address.
func awaitRealServerAddr(t testing.TB, h *realHAProxy, backend, server, want string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp := workerLine(t, h.WorkerSocket(), "show servers state "+backend)
		for _, row := range strings.Split(resp[0], "\n") {
			if f := strings.Fields(row); len(f) > 18 && f[3] == server && f[4]+" "+f[18] == want {
				return
			}
		}
	}
}

// TestFakeMatchesRealHAProxy sends the same lines to the real binary and
// to a fake of the same version and fixture, and compares the normalised
// replies: the fake is only an oracle while it answers as HAProxy does.
func TestFakeMatchesRealHAProxy(t *testing.T) {
	h := startRealHAProxy(t)
	f := h.startMatchingFake(t)
	compare := func(what, realRaw, fakeRaw string) {
		t.Helper()
		if r, fk := normaliseReply(realRaw), normaliseReply(fakeRaw); r != fk {
			t.Errorf("%s:\nreal: %q\nfake: %q\nnormalised real:\n%s\nnormalised fake:\n%s", what, realRaw, fakeRaw, r, fk)
		}
	}
	worker := func(line string) {
		t.Helper()
		realRaw, _ := socketExchange(t, h.WorkerSocket(), line, 5*time.Second)
		fakeRaw, _ := socketExchange(t, f.WorkerSocket(), line, 5*time.Second)
		compare(fmt.Sprintf("%.120q", line), realRaw, fakeRaw)
	}
	for _, line := range parityScript(t, h) {
		worker(framingPrefix + line + "\n")
		if strings.HasPrefix(line, "set server be-a/s1 addr ") {
			want, _ := f.Server("be-a", "s1")
			awaitRealServerAddr(t, h, "be-a", "s1", fmt.Sprintf("%s %d", want.Address, want.Port))
		}
	}
	for _, row := range framingRows(h.dialect()) {
		worker(row.send)
	}
	master := func(line string) {
		t.Helper()
		realRaw, _ := socketExchange(t, h.MasterSocket(), line, 30*time.Second)
		fakeRaw, _ := socketExchange(t, f.MasterSocket(), line, 30*time.Second)
		compare("master "+strings.TrimSpace(line), realRaw, fakeRaw)
	}
	master("show proc;quit\n")
	master("@1 show cli sockets;quit\n")
	// A 3.x master answers a target it cannot find, then neither quits
	// nor closes: the closing is compared too.
	realRaw, realClosed := socketExchange(t, h.MasterSocket(), "@2 show cli sockets;quit\n", time.Second)
	fakeRaw, fakeClosed := socketExchange(t, f.MasterSocket(), "@2 show cli sockets;quit\n", time.Second)
	compare(fmt.Sprintf("master @2 (closed: real %v, fake %v)", realClosed, fakeClosed), realRaw, fakeRaw)
	if realClosed != fakeClosed {
		t.Errorf("master @2: real closed %v, fake closed %v", realClosed, fakeClosed)
	}
	master("bogus;quit\n")
	master("reload;quit\n")
	h.waitReady(t) // a 2.6 master re-executes and refuses connections meanwhile

	cfg := filepath.Join(h.Dir, "haproxy.cfg")
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(append([]byte{}, good...), "bogus_keyword here\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	f.With(func(m *FakeModel) { m.ReloadFails = true })
	master("reload;quit\n")
	// A 2.6 master re-executes even for a failed reload, and the fake's 2.6
	// reload takes effect after ReloadDelay: wait for both.
	h.waitReady(t)
	waitFor(t, "the fake's failed reload", func() bool {
		failed := 0
		f.With(func(m *FakeModel) { failed = m.FailedReloads })
		return failed > 0
	})
	master("show proc;quit\n") // 3.4 lists the worker that keeps serving as old
	if err := os.WriteFile(cfg, good, 0o600); err != nil {
		t.Fatal(err)
	}
	f.With(func(m *FakeModel) { m.ReloadFails = false })
}
