// This file owns the fake HAProxy's own tests, the harness every runtime
// and agent test starts a fake with (startTestFake, on a short temporary
// directory), the raw socket helpers, and the framing-limit table that
// runs on the fake here and on a real binary in fakehaproxy_real_test.go.
// It must never define a second fake harness or start a real HAProxy:
// those tests live in fakehaproxy_real_test.go, so this file's tests
// always run, offline.

package haptic

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTestFake starts a fake HAProxy on a fresh short directory
// (os.MkdirTemp, not t.TempDir, whose path can exceed the 107-byte socket
// limit) and closes it and removes the directory at cleanup. version ""
// is the 3.4 dialect.
func startTestFake(t testing.TB, version string) *FakeHAProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartFakeHAProxy(dir, version)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("closing the fake: %v", err)
		}
		os.RemoveAll(dir)
	})
	return f
}

// socketExchange writes data on a fresh connection to sock and reads until
// the peer closes or the timeout passes. A reset after the reply counts as
// closed: HAProxy closes with unread lines in its buffer, which the kernel
// reports as ECONNRESET once the reply has been read.
func socketExchange(t testing.TB, sock, data string, timeout time.Duration) (reply string, closed bool) {
	t.Helper()
	conn, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte(data)); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write %s: %v", sock, err)
	}
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		out.Write(buf[:n])
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return out.String(), false
		}
		return out.String(), true // EOF or reset
	}
}

// workerLine sends one line with the severity prefix to a worker socket and
// returns the responses of the commands after the prefix.
func workerLine(t testing.TB, sock, cmds string) []string {
	t.Helper()
	raw, _ := socketExchange(t, sock, "set severity-output number;"+cmds+"\n", 5*time.Second)
	resp, tail := splitResponses(raw)
	if tail != "" || len(resp) == 0 {
		t.Fatalf("%q: unreadable reply %q", cmds, raw)
	}
	return resp[1:]
}

// splitResponses cuts a raw reply into responses as a client counts them,
// a lone '\n' being a silent command's response and any other ending at a
// blank line: "" for a silent command, the text without its blank line
// otherwise; tail holds a partial response (such as the single-'\n' "too
// big" refusal), which is how a cut reply shows.
func splitResponses(raw string) (responses []string, tail string) {
	for pos := 0; pos < len(raw); {
		if raw[pos] == '\n' {
			responses = append(responses, "")
			pos++
			continue
		}
		i := strings.Index(raw[pos:], "\n\n")
		if i < 0 {
			return responses, raw[pos:]
		}
		responses = append(responses, raw[pos:pos+i])
		pos += i + 2
	}
	return responses, ""
}

// mapRows returns the rows of show map <path> without their addresses.
func mapRows(t testing.TB, sock, path string) []string {
	t.Helper()
	resp := workerLine(t, sock, "show map "+path)
	if len(resp) != 1 {
		t.Fatalf("show map %s: %q", path, resp)
	}
	var rows []string
	for _, row := range strings.Split(resp[0], "\n") {
		if row == "" {
			continue
		}
		_, rest, _ := strings.Cut(row, " ")
		rows = append(rows, rest)
	}
	return rows
}

func TestStartFakeHAProxyRefusesALongSocketPath(t *testing.T) {
	base := os.TempDir()
	long := filepath.Join(base, strings.Repeat("d", 120-len(base)-1))
	if len(long) != 120 {
		t.Fatalf("test setup: dir of %d bytes", len(long))
	}
	_, err := StartFakeHAProxy(long, "")
	want := fmt.Sprintf("fake haproxy: socket path %q is longer than 107 bytes", filepath.Join(long, "haproxy-worker.sock"))
	if err == nil || err.Error() != want {
		t.Fatalf("long dir: err = %v, want %s", err, want)
	}

	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if _, err := StartFakeHAProxy(dir, "unknown"); err == nil || err.Error() != `fake haproxy: unreadable version "unknown"` {
		t.Fatalf("unknown version: err = %v", err)
	}

	f := startTestFake(t, "")
	if f.Version() != "3.4.3-1deb11u1" {
		t.Fatalf("default version %q", f.Version())
	}
	if got := workerLine(t, f.WorkerSocket(), "experimental-mode on;add backend be-x from web"); got[1] != "[6]: New backend registered." {
		t.Fatalf("default version is not the 3.4 dialect: %q", got)
	}
}

// TestFakeDialects checks, per dialect, every behaviour in which HAProxy
// releases differ: del map of duplicates, the 3.4 backend verbs, clear map
// of a version, wait and its conditions (3.4 says why one failed),
// init-state (3.1 and later), the reload reply, the "# programs" line,
// set server addr's wording, the 2.6 short del server reply, the answer
// to an empty command, the commit of a certificate without its key (3.4
// takes it where nothing uses it, and fails to rebuild where something
// does), and where show proc lists the worker after a failed reload.
func TestFakeDialects(t *testing.T) {
	const unknown34 = "[6]: Unknown command: 'add', but maybe one of the following ones is a better match:"
	const unknown26 = "[6]: Unknown command, but maybe one of the following ones is a better match:"
	const unknown34u = "[6]: Unknown command: 'unpublish', but maybe one of the following ones is a better match:"
	keyless30 := func(name string) string {
		return "[3]: The transaction must contain at least a certificate and a private key!\nCan't commit " + name + "!"
	}
	rows := []struct {
		version        string
		dupsLeft       int    // "dup" entries left after one del map
		addBackend     string // first line of the add backend answer
		clearedVersion bool   // clear map @<v> emptied the prepared version
		beRemovable    string // first line of wait be-removable
		wait           string // first line of a plain wait
		initState      string
		reloadReply    string // first line of the reload reply
		programs       bool
		sameAddr       string // set server addr to the current address
		delServer      string // raw reply to del server of an enabled server, prefix included
		emptyCommand   string // first line of the answer to an empty command
		srvRemovable   string // wait srv-removable of an enabled server
		unpublish      string // first line of unpublish backend
		keylessUnused  string // commit of a certificate without its key, used by nothing
		keylessUsed    string // the same for a certificate a crt-list uses
		afterFailure   string // the section show proc lists the worker under after a failed reload
		failureLog     string // in the log of a failed reload (2.6 prints none)
	}{
		{"3.4.3", 1, "[6]: New backend registered.", false, "[6]: Done.", "[6]: Done.", "[6]: New server registered.", "Success=1", false,
			"[4]: nothing changed", "\n[3]: Only servers in maintenance mode can be deleted.\n\n", "",
			"[3]: Failed. Only servers in maintenance mode can be deleted.", "[6]: Backend unpublished.",
			"Committing u.pem\nSuccess!", "Committing c.pem\nunable to load SSL private key into SSL Context 'c.pem': passed a null parameter.\nFailed!",
			"old workers", "Failed to load worker (1002) exited with code 1 (Exit)"},
		{"3.1.5", 0, unknown34, true, "[3]: Usage: wait {-h|<duration>} [condition [args...]]", "[6]: Done.", "[6]: New server registered.", "Success=1", true,
			"[4]: nothing changed", "\n[3]: Only servers in maintenance mode can be deleted.\n\n", "",
			"[3]: Failed.", unknown34u, keyless30("u.pem"), keyless30("c.pem"), "workers", "Loading failure!"},
		{"3.0.11-1+deb13u4", 0, unknown34, true, "[3]: Usage: wait {-h|<duration>} [condition [args...]]", "[6]: Done.", "[3]: unknown keyword 'init-state'.", "Success=1", true,
			"[4]: nothing changed", "\n[3]: Only servers in maintenance mode can be deleted.\n\n", "",
			"[3]: Failed.", unknown34u, keyless30("u.pem"), keyless30("c.pem"), "workers", "Loading failure!"},
		{"2.6.12-1+deb12u4", 0, unknown26, true, unknown26, unknown26, "[3]: unknown keyword 'init-state'.", "", true,
			"[4]: no need to change the addr, no need to change the port by 'stats socket command'",
			"\n[3]: Only servers in maintenance mode can be deleted.\n",
			"[6]: Unknown command. Please enter one of the following commands only:",
			unknown26, unknown26, keyless30("u.pem"), keyless30("c.pem"), "workers", ""},
	}
	first := func(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }
	for _, row := range rows {
		t.Run(row.version, func(t *testing.T) {
			f := startTestFake(t, row.version)
			f.With(func(m *FakeModel) {
				m.Maps["m.map"] = []MapEntry{{"dup", "1"}, {"keep", "k"}, {"dup", "2"}}
				m.Maps["v.map"] = []MapEntry{{"old", "o"}}
				m.Backends["be-a"] = &FakeBackend{Mode: "http", Published: true}
				m.Backends["be-empty"] = &FakeBackend{Mode: "http"}
			})
			ws := f.WorkerSocket()
			workerLine(t, ws, "del map m.map dup")
			dups := 0
			for _, e := range f.MapEntries("m.map") {
				if e.Key == "dup" {
					dups++
				}
			}
			if dups != row.dupsLeft || len(f.MapEntries("m.map")) != row.dupsLeft+1 {
				t.Errorf("del map left %v", f.MapEntries("m.map"))
			}
			if got := first(workerLine(t, ws, "experimental-mode on;add backend be-b from web mode http")[1]); got != row.addBackend {
				t.Errorf("add backend: %q, want %q", got, row.addBackend)
			}
			got := workerLine(t, ws, "prepare map v.map")
			if got[0] != "[6]: New version created: 1" {
				t.Fatalf("prepare map: %q", got)
			}
			workerLine(t, ws, "add map @1 v.map new n")
			workerLine(t, ws, "clear map @1 v.map")
			workerLine(t, ws, "commit map @1 v.map")
			if cleared := len(f.MapEntries("v.map")) == 0; cleared != row.clearedVersion {
				t.Errorf("clear map @1 then commit: %v", f.MapEntries("v.map"))
			}
			if got := first(workerLine(t, ws, "wait 10 be-removable be-empty")[0]); got != row.beRemovable {
				t.Errorf("wait be-removable: %q, want %q", got, row.beRemovable)
			}
			if got := first(workerLine(t, ws, "wait 10")[0]); got != row.wait {
				t.Errorf("wait: %q, want %q", got, row.wait)
			}
			if got := workerLine(t, ws, "add server be-a/s1 10.0.0.1:80 check init-state up")[0]; got != row.initState {
				t.Errorf("init-state: %q, want %q", got, row.initState)
			}
			f.With(func(m *FakeModel) {
				m.Backends["be-a"].Servers = append(m.Backends["be-a"].Servers,
					&FakeServer{Name: "on", Address: "10.0.0.9", Port: 80, Weight: 1, State: "ready", Enabled: true})
			})
			if got := workerLine(t, ws, "set server be-a/on addr 10.0.0.9 port 80")[0]; got != row.sameAddr {
				t.Errorf("set server addr unchanged: %q, want %q", got, row.sameAddr)
			}
			if raw, _ := socketExchange(t, ws, "set severity-output number;del server be-a/on\n", 5*time.Second); raw != row.delServer {
				t.Errorf("del server: %q, want %q", raw, row.delServer)
			}
			if got := first(workerLine(t, ws, "show map m.map;")[1]); got != row.emptyCommand {
				t.Errorf("empty command: %q, want %q", got, row.emptyCommand)
			}
			f.With(func(m *FakeModel) {
				m.Backends["be-a"].Servers = append(m.Backends["be-a"].Servers,
					&FakeServer{Name: "up", Address: "10.0.0.8", Port: 80, Weight: 1, State: "ready", Enabled: true})
				m.Backends["be-empty"].Published = true
			})
			if got := first(workerLine(t, ws, "wait 10 srv-removable be-a/up")[0]); got != row.srvRemovable {
				t.Errorf("wait srv-removable of an enabled server: %q, want %q", got, row.srvRemovable)
			}
			if got := first(workerLine(t, ws, "unpublish backend be-empty")[0]); got != row.unpublish {
				t.Errorf("unpublish backend: %q, want %q", got, row.unpublish)
			}
			f.With(func(m *FakeModel) {
				m.Certs["u.pem"], m.Certs["c.pem"] = "old", "old"
				m.CRTLists["list.txt"] = []string{"c.pem [alpn h2]"}
			})
			keyless := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
			for cert, want := range map[string]string{"u.pem": row.keylessUnused, "c.pem": row.keylessUsed} {
				workerLine(t, ws, "set ssl cert "+cert+" <<\n"+keyless)
				if got := workerLine(t, ws, "commit ssl cert "+cert)[0]; got != want {
					t.Errorf("commit of %s without its key: %q, want %q", cert, got, want)
				}
				workerLine(t, ws, "abort ssl cert "+cert)
			}
			if pem, _ := f.Cert("c.pem"); pem != "old" {
				t.Errorf("a failed rebuild replaced c.pem with %q", pem)
			}
			proc, _ := socketExchange(t, f.MasterSocket(), "show proc;quit\n", 5*time.Second)
			if strings.Contains(proc, "\n# programs\n") != row.programs {
				t.Errorf("show proc programs line: %q", proc)
			}
			reply, _ := socketExchange(t, f.MasterSocket(), "reload;quit\n", 5*time.Second)
			if first(reply) != row.reloadReply {
				t.Errorf("reload reply %q, want first line %q", reply, row.reloadReply)
			}
			f.With(func(m *FakeModel) { m.ReloadFails, m.ReloadDelay = true, time.Millisecond })
			if reply, _ := socketExchange(t, f.MasterSocket(), "reload;quit\n", 5*time.Second); !strings.Contains(reply, row.failureLog) {
				t.Errorf("failed reload %q, want %q in its log", reply, row.failureLog)
			}
			waitFor(t, "the failed reload", func() bool {
				failed := 0
				f.With(func(m *FakeModel) { failed = m.FailedReloads })
				return failed == 1
			})
			proc, _ = socketExchange(t, f.MasterSocket(), "show proc;quit\n", 5*time.Second)
			if !strings.Contains(proc, "# "+row.afterFailure+"\n"+strconv.Itoa(f.Worker().WorkerPID)+" ") {
				t.Errorf("show proc after a failed reload lists the worker outside # %s: %q", row.afterFailure, proc)
			}
		})
	}
}

// framingRow is one row of the framing-limit table that runs on the fake
// (TestFakeFramingLimits) and on a real binary (TestRealHAProxyFramingLimits,
// TestFakeMatchesRealHAProxy). Keys are unique per row so rows share one map.
type framingRow struct {
	name     string
	dialects []fakeDialect // nil = every dialect
	send     string        // raw bytes, severity prefix included
	want     []string      // responses (splitResponses)
	tail     string        // partial last response
	present  []string      // show map rows ("key value") that must exist afterwards
	absent   []string      // keys that must not exist afterwards
}

const framingPrefix = "set severity-output number;"

// framingRows builds the framing-limit table for one dialect: the limit
// on either side of its edge (each command's 16383 bytes before 3.4, the
// whole line's on 3.4, which also lets a payload grow to 128 KiB),
// payload terminators, and what happens to the lines after the first.
// Every command is padded to an exact size. No row lands where a real
// binary misbehaves: 2.6.12 hangs on a payload command of exactly 16384
// framed bytes (it spins once the client gives up, until HAProxy aborts
// the worker and its master stops, ending every later test on that
// binary); 3.4.0 answers a line of exactly 16384 bytes with an endless
// stream of help text, and leaves a payload line of 16384 to 16390 bytes
// unanswered.
func framingRows(d fakeDialect) []framingRow {
	padded := func(key string, size int) string { // an add map command of exactly size bytes
		cmd := "add map maps/host.map " + key + " "
		return cmd + strings.Repeat("v", size-len(cmd))
	}
	tooBig := []string{"", ""}
	tooBigTail := "[3]: " + fakeTooBig + "\n"
	if d == fakeDialect26 {
		tooBigTail = ""
	}
	lineTooBig := fakeLineTooBig + "\n" // untagged: the line's severity-output never ran
	// A payload over the command limit: 300 lines of 58 bytes, framed >
	// 17000 bytes, so never exactly 16384 (see above).
	payloadOf := func(prefix string, lines int) (framed string) {
		var b strings.Builder
		for i := range lines {
			fmt.Fprintf(&b, "%s-%04d %s\n", prefix, i, strings.Repeat("x", 50))
		}
		if d == fakeDialect26 {
			return "add map maps/host.map <<\n" + b.String() + "\n"
		}
		return "add map maps/host.map <<HAPTIC\n" + b.String() + "HAPTIC\n"
	}
	var many []string
	for i := 0; i < 1400; i++ {
		many = append(many, fmt.Sprintf("add map maps/host.map fr4-%d v", i))
	}
	silent := func(n int) []string { return make([]string, n) }
	before34 := []fakeDialect{fakeDialect26, fakeDialect30}
	x3 := []fakeDialect{fakeDialect30, fakeDialect34}
	only := func(d fakeDialect) []fakeDialect { return []fakeDialect{d} }
	unknownFirst := "[6]: Unknown command, but maybe one of the following ones is a better match:"
	addMapUsage := "[3]: 'add map' expects three parameters (map identifier, key and value) or one parameter (map identifier) and a payload"
	rows := []framingRow{
		{name: "a 16383-byte command applies", dialects: before34,
			send: framingPrefix + padded("fr1", fakeCommandLimit-1) + "\n", want: silent(2),
			present: []string{"fr1 " + strings.Repeat("v", fakeCommandLimit-1-len("add map maps/host.map fr1 "))}},
		{name: "a 16384-byte command is refused, earlier commands stand, later ones do not run", dialects: before34,
			send: framingPrefix + "add map maps/host.map fr2-before v;" + padded("fr2-big", fakeCommandLimit) + ";add map maps/host.map fr2-after v\n",
			want: tooBig, tail: tooBigTail, present: []string{"fr2-before v"}, absent: []string{"fr2-big", "fr2-after"}},
		{name: "a payload command over the limit applies zero entries", dialects: before34,
			send: framingPrefix + payloadOf("fr3", 300), want: silent(1), tail: tooBigTail, absent: []string{"fr3-0000", "fr3-0299"}},
		{name: "a 40 KiB line of small commands applies all", dialects: before34,
			send: framingPrefix + strings.Join(many, ";") + "\n", want: silent(1401),
			present: []string{"fr4-0 v", "fr4-1399 v"}},
		{name: "3.4: a 16383-byte line applies", dialects: only(fakeDialect34),
			send: framingPrefix + "add map maps/host.map fr1-before v;" + padded("fr1", fakeCommandLimit-1-len(framingPrefix+"add map maps/host.map fr1-before v;")) + "\n",
			want: silent(3), present: []string{"fr1-before v"}},
		{name: "3.4: a 16385-byte line is refused whole", dialects: only(fakeDialect34),
			send: framingPrefix + "add map maps/host.map fr2-before v;" + padded("fr2-big", fakeCommandLimit+1-len(framingPrefix+"add map maps/host.map fr2-before v;")) + "\n",
			tail: lineTooBig, absent: []string{"fr2-before", "fr2-big"}},
		{name: "3.4: a 40 KiB line of small commands is refused whole", dialects: only(fakeDialect34),
			send: framingPrefix + strings.Join(many, ";") + "\n", tail: lineTooBig, absent: []string{"fr4-0", "fr4-1399"}},
		{name: "3.4: a payload command over 16383 bytes applies", dialects: only(fakeDialect34),
			send: framingPrefix + payloadOf("fr3", 300), want: silent(2), present: []string{"fr3-0000 " + strings.Repeat("x", 50), "fr3-0299 " + strings.Repeat("x", 50)}},
		{name: "3.4: a payload over 128 KiB is refused whole", dialects: only(fakeDialect34),
			send: framingPrefix + payloadOf("fr12", 2800), tail: fakePayloadTooBig + "\n", absent: []string{"fr12-0000", "fr12-2799"}},
		{name: "the default terminator is an empty line",
			send: framingPrefix + "add map maps/host.map <<\nfr5a v\nfr5b w x\n\n", want: silent(2),
			present: []string{"fr5a v", "fr5b w x"}},
		{name: "a custom terminator of 7 characters", dialects: x3,
			send: framingPrefix + "add map maps/host.map <<ABCDEFG\nfr6 v\n\nABCDEFG\n", want: silent(2),
			present: []string{"fr6 v"}},
		{name: "an 8-character pattern is not a payload; one further line runs", dialects: only(fakeDialect30),
			send:    framingPrefix + "add map maps/host.map <<ABCDEFGH\nadd map maps/host.map fr7a v\nadd map maps/host.map fr7b v\n",
			want:    []string{"", addMapUsage, ""},
			present: []string{"fr7a v"}, absent: []string{"fr7b"}},
		{name: "3.4: a custom terminator of 64 characters", dialects: only(fakeDialect34),
			send: framingPrefix + "add map maps/host.map <<" + strings.Repeat("T", 64) + "\nfr7 v\n" + strings.Repeat("T", 64) + "\n", want: silent(2),
			present: []string{"fr7 v"}},
		{name: "3.4: a 65-character pattern is not a payload; no further line runs", dialects: only(fakeDialect34),
			send: framingPrefix + "add map maps/host.map <<" + strings.Repeat("T", 65) + "\nadd map maps/host.map fr7a v\n",
			want: []string{"", addMapUsage}, absent: []string{"fr7a"}},
		{name: "the terminator must match exactly", dialects: x3,
			send: framingPrefix + "add map maps/host.map <<HAPTIC\nfr8 v\nHAPTIC \n HAPTIC\nHAPTIC\n", want: silent(2),
			present: []string{"fr8 v", "HAPTIC ", " HAPTIC"}},
		{name: "a second line on a non-interactive connection is not answered", dialects: x3,
			send: framingPrefix + "add map maps/host.map fr9a v\nadd map maps/host.map fr9b v\n", want: silent(2),
			present: []string{"fr9a v"}, absent: []string{"fr9b"}},
		{name: "2.6 runs the payload lines of <<HAPTIC as commands", dialects: only(fakeDialect26),
			send:    framingPrefix + "add map maps/host.map <<HAPTIC\nadd map maps/host.map fr10 v\nHAPTIC\n",
			want:    []string{"", addMapUsage, "", unknownFirst},
			present: []string{"fr10 v"}},
		{name: "2.6 answers every buffered line", dialects: only(fakeDialect26),
			send: framingPrefix + "add map maps/host.map fr11a v\nadd map maps/host.map fr11b v\nshow map maps/host.map\n",
			want: []string{"", "", "", "SHOW MAP"}, present: []string{"fr11a v", "fr11b v"}},
	}
	var out []framingRow
	for _, r := range rows {
		if r.dialects == nil || slices.Contains(r.dialects, d) {
			out = append(out, r)
		}
	}
	return out
}

// runFramingRows sends every row to sock and checks the replies and the
// map afterwards.
func runFramingRows(t *testing.T, sock string, d fakeDialect) {
	for _, row := range framingRows(d) {
		t.Run(row.name, func(t *testing.T) {
			raw, closed := socketExchange(t, sock, row.send, 5*time.Second)
			if !closed {
				t.Errorf("connection still open after %q", raw)
			}
			resp, tail := splitResponses(raw)
			for i := range resp {
				resp[i] = firstLineIfUnknown(resp[i])
				if i < len(row.want) && row.want[i] == "SHOW MAP" && strings.HasPrefix(resp[i], "0x") {
					resp[i] = "SHOW MAP"
				}
			}
			if strings.Join(resp, "\x00") != strings.Join(row.want, "\x00") || tail != row.tail {
				t.Errorf("reply:\n got %q tail %q\nwant %q tail %q", resp, tail, row.want, row.tail)
			}
			rows := mapRows(t, sock, "maps/host.map")
			for _, p := range row.present {
				if !slices.Contains(rows, p) {
					t.Errorf("row %.40q missing from the map", p)
				}
			}
			for _, key := range row.absent {
				for _, r := range rows {
					if strings.HasPrefix(r, key+" ") {
						t.Errorf("key %q present in the map", key)
					}
				}
			}
		})
	}
}

// firstLineIfUnknown keeps only the first line of an unknown-command
// answer: its help lines vary with the release and the verb.
func firstLineIfUnknown(resp string) string {
	if first, _, _ := strings.Cut(resp, "\n"); strings.Contains(first, "Unknown command") {
		return first
	}
	return resp
}

func TestFakeFramingLimits(t *testing.T) {
	for _, v := range []string{"3.4.3", "3.0.11-1+deb13u4", "2.6.12-1+deb12u4"} {
		t.Run(v, func(t *testing.T) {
			f := startTestFake(t, v)
			f.With(func(m *FakeModel) { m.Maps["maps/host.map"] = []MapEntry{{"example.com", "be-a"}} })
			runFramingRows(t, f.WorkerSocket(), f.dialect)
		})
	}
}

func TestFakeMapPayloadParsing(t *testing.T) {
	rows := []struct {
		name    string
		payload string
		want    []MapEntry
		refusal string
	}{
		{"a # line is an entry", "#x y\nk v\n", []MapEntry{{"#x", "y"}, {"k", "v"}}, ""},
		{"a line without a value glues onto the next", "k1\nk2 v2\n", []MapEntry{{"k1\nk2", "v2"}}, ""},
		{"a trailing space is an empty value", "k3 \nk4 v4\n", []MapEntry{{"k3", ""}, {"k4", "v4"}}, ""},
		{"separators after the first are skipped, inner spaces kept", "k\t  a  b\n", []MapEntry{{"k", "a  b"}}, ""},
		{"a leading space makes an empty key", " v\n", []MapEntry{{"", "v"}}, ""},
		{"a trailing key without value is refused, earlier entries kept", "a 1\nb 2\nlast\n", []MapEntry{{"a", "1"}, {"b", "2"}}, "[3]: Missing value for key 'last'."},
	}
	f := startTestFake(t, "")
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			path := fmt.Sprintf("m%d.map", i)
			f.With(func(m *FakeModel) { m.Maps[path] = nil })
			got := workerLine(t, f.WorkerSocket(), "add map "+path+" <<HAPTIC\n"+row.payload+"HAPTIC")
			if got[0] != row.refusal {
				t.Errorf("reply %q, want %q", got[0], row.refusal)
			}
			if entries := f.MapEntries(path); fmt.Sprint(entries) != fmt.Sprint(row.want) {
				t.Errorf("entries %q, want %q", entries, row.want)
			}
		})
	}
}

func TestFakeRecordsCommands(t *testing.T) {
	f := startTestFake(t, "")
	f.With(func(m *FakeModel) { m.Maps["m.map"] = nil })
	ws := f.WorkerSocket()
	socketExchange(t, ws, "set severity-output number;experimental-mode on;show map;add map m.map <<HAPTIC\nk v\nHAPTIC\n", 5*time.Second)
	socketExchange(t, ws, "prompt;set severity-output none;set map m.map k w;quit\n", 5*time.Second)
	socketExchange(t, ws, "experimental-mode off;;bogus verb\n", 5*time.Second)
	want := []string{"show map", "add map m.map", "set map m.map k w", "bogus verb"}
	if got := f.Sent(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Sent() = %q, want %q", got, want)
	}
	if e := f.MapEntries("m.map"); len(e) != 1 || e[0].Value != "w" {
		t.Fatalf("the recorded commands did not run: %v", e)
	}
	// Master commands are not recorded.
	socketExchange(t, f.MasterSocket(), "show proc;quit\n", 5*time.Second)
	if len(f.Sent()) != len(want) {
		t.Fatalf("master command recorded: %q", f.Sent())
	}
}

// TestFakeSurvivesACarelessSeed: nil collections and nil entries seeded
// through With get HAProxy's refusals, not a panic.
func TestFakeSurvivesACarelessSeed(t *testing.T) {
	f := startTestFake(t, "")
	f.With(func(m *FakeModel) {
		m.Maps, m.Certs, m.CAFiles, m.CRTLists, m.Frontends, m.BlockedServers = nil, nil, nil, nil, nil, nil
		m.Backends = map[string]*FakeBackend{"nil": nil, "be-a": {Servers: []*FakeServer{nil, {Name: "s1", Address: "10.0.0.1"}}}}
	})
	got := workerLine(t, f.WorkerSocket(), "new ssl cert c.pem;show servers state;show stat;enable server nil/s1;del server be-a/s1")
	want := []string{"[5]: New empty certificate store 'c.pem'!", "1\n" + fakeServersStateHeader + "\n1 be-a 1 s1 10.0.0.1 0 1 0 0 0 1 0 0 0 0 0 0 - 0 - 0 0 - - 0",
		"# pxname,svname,status,conn_tot,", "[3]: No such backend.", "[6]: Server deleted."}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("replies %q\nwant %q", got, want)
	}
}

func TestFakeHooks(t *testing.T) {
	seed := func(m *FakeModel) {
		m.Maps["m.map"] = []MapEntry{{"k", "v"}}
		m.Backends["be-a"] = &FakeBackend{Mode: "http", Published: true, Servers: []*FakeServer{
			{Name: "s1", Address: "10.0.0.1", Port: 80, Weight: 1, State: "maint"},
		}}
	}
	rows := []struct {
		name string
		run  func(t *testing.T, f *FakeHAProxy)
	}{
		{"Reject refuses with [3]: <message>", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) {
				m.Reject = func(cmd string) (string, bool) { return "no way", strings.HasPrefix(cmd, "set map") }
			})
			got := workerLine(t, f.WorkerSocket(), "set map m.map k w;show map m.map")
			if got[0] != "[3]: no way" || !strings.HasSuffix(got[1], " k v") {
				t.Fatalf("reply %q", got)
			}
		}},
		{"Reject is called without the lock held", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) {
				m.Reject = func(string) (string, bool) { return "", f.HasBackend("none") }
			})
			if got := workerLine(t, f.WorkerSocket(), "set map m.map k w"); got[0] != "" {
				t.Fatalf("reply %q", got)
			}
		}},
		{"BlockedServers: wait expires and del refuses until shutdown sessions", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) { m.BlockedServers["be-a/s1"] = true })
			ws := f.WorkerSocket()
			got := workerLine(t, ws, "wait 100 srv-removable be-a/s1;del server be-a/s1;shutdown sessions server be-a/s1;wait 100 srv-removable be-a/s1;del server be-a/s1")
			want := []string{"[3]: Wait delay expired. Server still has connections attached to it, cannot remove it.",
				"[3]: Server still has connections attached to it, cannot remove it.", "", "[6]: Done.", "[6]: Server deleted."}
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("reply %q, want %q", got, want)
			}
		}},
		{"OnReload state is visible after a reload", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) {
				m.OnReload = func(m *FakeModel) { m.Maps["loaded.map"] = []MapEntry{{"a", "b"}} }
			})
			before := f.Worker()
			reply, _ := socketExchange(t, f.MasterSocket(), "reload;quit\n", 5*time.Second)
			if !strings.HasPrefix(reply, "Success=1\n--\n") {
				t.Fatalf("reload reply %q", reply)
			}
			if got := f.MapEntries("loaded.map"); len(got) != 1 {
				t.Fatalf("OnReload map %v", got)
			}
			if after := f.Worker(); after.SameWorker(before) || after.WorkerPID != before.WorkerPID+1 {
				t.Fatalf("worker %v after reload from %v", after, before)
			}
		}},
		{"ReloadFails answers Success=0 with ReloadLog", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) { m.ReloadFails, m.ReloadLog = true, "[ALERT] bad config" })
			reply, _ := socketExchange(t, f.MasterSocket(), "reload;quit\n", 5*time.Second)
			if reply != "Success=0\n--\n[ALERT] bad config\n\n" {
				t.Fatalf("reload reply %q", reply)
			}
			proc, _ := socketExchange(t, f.MasterSocket(), "show proc;quit\n", 5*time.Second)
			if !strings.Contains(proc, "1 [failed: 1]") {
				t.Fatalf("show proc %q", proc)
			}
		}},
		{"ReloadHangs never answers", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) { m.ReloadHangs = true })
			before := f.Worker()
			reply, closed := socketExchange(t, f.MasterSocket(), "reload;quit\n", 200*time.Millisecond)
			if reply != "" || closed || !f.Worker().SameWorker(before) {
				t.Fatalf("reload reply %q closed %v", reply, closed)
			}
		}},
		{"CutReply keeps the first bytes and closes; the command ran", func(t *testing.T, f *FakeHAProxy) {
			f.With(func(m *FakeModel) {
				m.CutReply = func(line string) (int, bool) {
					// Without the lock held, the hook may use the fake.
					return 2, strings.Contains(line, "add server") && len(f.Sent()) > 0
				}
			})
			raw, closed := socketExchange(t, f.WorkerSocket(), "set severity-output number;experimental-mode on;add server be-a/s2 10.0.0.2:80\n", 5*time.Second)
			if raw != "\n\n" || !closed {
				t.Fatalf("reply %q closed %v", raw, closed)
			}
			if _, ok := f.Server("be-a", "s2"); !ok {
				t.Fatal("the cut command did not run")
			}
		}},
		{"changing StartTimeUnixMicros alone drops old connections", func(t *testing.T, f *FakeHAProxy) {
			conn, err := net.Dial("unix", f.WorkerSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1024)
			conn.Write([]byte("prompt\n"))
			if n, err := conn.Read(buf); err != nil || string(buf[:n]) != "\n> " {
				t.Fatalf("prompt reply %q %v", buf[:n], err)
			}
			f.With(func(m *FakeModel) { m.StartTimeUnixMicros++ })
			conn.Write([]byte("show map m.map\n"))
			if n, err := conn.Read(buf); err == nil {
				t.Fatalf("old connection answered %q", buf[:n])
			}
		}},
		{"StopMaster fails the master at transport", func(t *testing.T, f *FakeHAProxy) {
			f.StopMaster()
			if _, err := net.Dial("unix", f.MasterSocket()); err == nil {
				t.Fatal("master socket still answers")
			}
			if got := workerLine(t, f.WorkerSocket(), "show map m.map"); !strings.HasSuffix(got[0], " k v") {
				t.Fatalf("worker after StopMaster: %q", got)
			}
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			f := startTestFake(t, "")
			f.With(seed)
			row.run(t, f)
		})
	}
}

// TestFakeReloadOn26TakesEffectAfterTheDelay covers the 2.6 dialect's
// empty reload reply and delayed effect, which callers must poll for.
func TestFakeReloadOn26TakesEffectAfterTheDelay(t *testing.T) {
	f := startTestFake(t, "2.6.12-1+deb12u4")
	f.With(func(m *FakeModel) { m.ReloadDelay = 20 * time.Millisecond })
	before := f.Worker()
	reply, closed := socketExchange(t, f.MasterSocket(), "reload\n", 5*time.Second)
	if reply != "" || !closed {
		t.Fatalf("2.6 reload reply %q closed %v", reply, closed)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.Worker().SameWorker(before) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if f.Worker().WorkerPID != before.WorkerPID+1 {
		t.Fatalf("no new worker after the delay: %v", f.Worker())
	}
}

// TestFakeShowInfoPrintsTheStartTimeAsHAProxyDoes: six decimals with the
// trailing zeros trimmed, as HAProxy prints floats.
func TestFakeShowInfoPrintsTheStartTimeAsHAProxyDoes(t *testing.T) {
	rows := []struct {
		micros       int64
		float, plain string
	}{
		{1796197563683351, "1796197563.683351", "1796197563"},
		{1796197563360000, "1796197563.36", "1796197563"},
		{1700000000000000, "1700000000", "1700000000"},
	}
	f := startTestFake(t, "")
	for _, row := range rows {
		f.With(func(m *FakeModel) { m.StartTimeUnixMicros = row.micros })
		for arg, want := range map[string]string{"show info float": row.float, "show info": row.plain} {
			got := workerLine(t, f.WorkerSocket(), arg)[0]
			if !strings.Contains(got, "\nStart_time_sec: "+want) || !strings.Contains(got, "\nPid: 1000\n") {
				t.Errorf("%s at %d µs: %q", arg, row.micros, got)
			}
		}
	}
}

// TestFakeNumbersCRTListEntries: seeded entries from 1, each added entry
// one more than the last number assigned, deletes renumber nothing.
func TestFakeNumbersCRTListEntries(t *testing.T) {
	f := startTestFake(t, "")
	f.With(func(m *FakeModel) {
		m.Certs["a.pem"], m.Certs["b.pem"] = "A", "B"
		m.CRTLists["l.txt"] = []string{"a.pem", "b.pem [alpn h2] b.example.com"}
	})
	ws := f.WorkerSocket()
	got := workerLine(t, ws, "add ssl crt-list l.txt <<HAPTIC\nb.pem  [alpn  h2]  c.example.com\nHAPTIC")
	if got[0] != "Inserting certificate 'b.pem' in crt-list 'l.txt'.\nSuccess!" {
		t.Fatalf("add: %q", got)
	}
	steps := []struct{ cmd, want string }{
		{"del ssl crt-list l.txt b.pem", "[3]: Can't delete the entry: found the certificate 'b.pem' in several entries, please specify a line number preceded by colons (2, 3)!"},
		{"del ssl crt-list l.txt b.pem:2", "[5]: Entry 'b.pem' deleted in crtlist 'l.txt'!"},
		{"del ssl crt-list l.txt a.pem", "[5]: Entry 'a.pem' deleted in crtlist 'l.txt'!"},
		{"add ssl crt-list l.txt a.pem", "Inserting certificate 'a.pem' in crt-list 'l.txt'.\nSuccess!"},
		{"show ssl crt-list -n l.txt", "# l.txt\nb.pem:3 [alpn h2] c.example.com\na.pem:4"},
		{"show ssl crt-list l.txt", "# l.txt\nb.pem [alpn h2] c.example.com\na.pem"},
	}
	for _, step := range steps {
		if got := workerLine(t, ws, step.cmd)[0]; got != step.want {
			t.Errorf("%s: %q, want %q", step.cmd, got, step.want)
		}
	}
}

// TestFakeShowProcColumns pins the show proc layout byte for byte: HAProxy's
// column widths and section lines, which a client parses.
func TestFakeShowProcColumns(t *testing.T) {
	f := startTestFake(t, "3.0.11-1+deb13u4")
	got, _ := socketExchange(t, f.MasterSocket(), "show proc;quit\n", 5*time.Second)
	want := "#<PID>          <type>          <reloads>       <uptime>        <version>      \n" +
		"999             master          0 [failed: 0]   0d00h00m01s     3.0.11-1+deb13u4\n" +
		"# workers\n" +
		"1000            worker          0               0d00h00m01s     3.0.11-1+deb13u4\n" +
		"# programs\n\n"
	if got != want {
		t.Fatalf("show proc:\n%q\nwant\n%q", got, want)
	}
	// Without quit the master keeps the connection open.
	if _, closed := socketExchange(t, f.MasterSocket(), "show proc\n", 100*time.Millisecond); closed {
		t.Fatal("master closed a connection without quit")
	}
}
