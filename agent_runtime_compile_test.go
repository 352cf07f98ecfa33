// Table tests for the op compiler and the line packer: for each op and
// worker version, the exact lines put on the wire or the exact refusal;
// which commands judge their replies by which text; and the packer's line
// and wait budgets under random commands.
//
// It must never open a socket: the compiler is a pure function of the op,
// the file contents and the worker's terminator, and the tests that send
// compiled lines live in agent_runtime_test.go.

package haptic

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// Helpers, and what each op compiles to.

func intPtr(v int) *int { return &v }

func contentOf(files map[string]string) func(string) ([]byte, error) {
	return func(path string) ([]byte, error) {
		data, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no file %s", path)
		}
		return []byte(data), nil
	}
}

const testPEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"

func TestCompileCoversEveryOpKind(t *testing.T) {
	want := []string{
		OpBackendAdd, OpBackendPublish, OpBackendUnpublish, OpBackendDel, OpBackendWaitRemovable,
		OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight,
		OpServerSetState, OpServerWaitRemovable, OpShutdownSessions, OpServerDel,
		OpMapAdd, OpMapSet, OpMapDel, OpMapReplace,
		OpCertSet, OpCertNew, OpCASet, OpCANew, OpCRTListAdd, OpCRTListDel,
	}
	got := opKinds[:]
	if !slices.Equal(got, want) || len(got) != 24 {
		t.Fatalf("opKinds = %v\nwant %v", got, want)
	}
	files := contentOf(map[string]string{"m.map": "k v\n", "c.pem": testPEM})
	for _, kind := range got {
		op := Op{Kind: kind, Backend: "be", Server: "s", Profile: "web", Mode: "http", Address: "10.0.0.1",
			Weight: intPtr(1), State: "ready", TimeoutMs: 1, Path: "c.pem", Key: "k", Value: "v", Cert: "c.pem"}
		if kind == OpMapReplace {
			op.Path = "m.map"
		}
		if _, err := compileOp(&op, files, payloadTerminator); err != nil {
			t.Errorf("compileOp(%s): %v", kind, err)
		}
	}
}

func TestCompileCommandTable(t *testing.T) {
	files := contentOf(map[string]string{"certs/b.pem": testPEM, "ca/c.pem": testPEM})
	ver := "@" + versionPlaceholder + " "
	tests := []struct {
		op    Op
		cmds  []command
		abort []command
	}{
		{Op{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http", GUID: "be-b-guid"},
			[]command{{Text: "add backend be-b from web mode http guid be-b-guid", Expect: "New backend registered"}}, nil},
		{Op{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "tcp"},
			[]command{{Text: "add backend be-b from web mode tcp", Expect: "New backend registered"}}, nil},
		{Op{Kind: OpBackendPublish, Backend: "be-b"},
			[]command{{Text: "publish backend be-b", Expect: "Backend published"}}, nil},
		{Op{Kind: OpBackendUnpublish, Backend: "be-b"},
			[]command{{Text: "unpublish backend be-b"}}, nil},
		{Op{Kind: OpBackendDel, Backend: "be-b"},
			[]command{{Text: "del backend be-b", Expect: "Backend deleted"}}, nil},
		{Op{Kind: OpBackendWaitRemovable, Backend: "be-b", TimeoutMs: 2000},
			[]command{{Text: "wait 2000 be-removable be-b", Expect: "Done"}}, nil},
		{Op{Kind: OpServerAdd, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 8080,
			Keywords: []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"2s"}}, {Name: "init-state", Args: []string{"up"}}}},
			[]command{{Text: "add server be-a/srv1 10.0.0.1:8080 check inter 2s init-state up", Expect: "New server registered"}}, nil},
		{Op{Kind: OpServerAdd, Backend: "be-a", Server: "sock", Address: "/run/app.sock"},
			[]command{{Text: "add server be-a/sock /run/app.sock", Expect: "New server registered"}}, nil},
		{Op{Kind: OpServerEnable, Backend: "be-a", Server: "srv1", Health: true},
			[]command{{Text: "enable health be-a/srv1"}, {Text: "enable server be-a/srv1"}}, nil},
		{Op{Kind: OpServerEnable, Backend: "be-a", Server: "srv1"},
			[]command{{Text: "enable server be-a/srv1"}}, nil},
		{Op{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
			[]command{{Text: "disable server be-a/srv1"}}, nil},
		{Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2", Port: 81},
			[]command{{Text: "set server be-a/srv1 addr 10.0.0.2 port 81", Expect: "chang"}}, nil},
		{Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2"},
			[]command{{Text: "set server be-a/srv1 addr 10.0.0.2", Expect: "chang"}}, nil},
		{Op{Kind: OpServerSetWeight, Backend: "be-a", Server: "srv1", Weight: intPtr(0)},
			[]command{{Text: "set server be-a/srv1 weight 0"}}, nil},
		{Op{Kind: OpServerSetState, Backend: "be-a", Server: "srv1", State: "drain"},
			[]command{{Text: "set server be-a/srv1 state drain"}}, nil},
		{Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: 2000},
			[]command{{Text: "wait 2000 srv-removable be-a/srv1", Expect: "Done"}}, nil},
		{Op{Kind: OpShutdownSessions, Backend: "be-a", Server: "srv1"},
			[]command{{Text: "shutdown sessions server be-a/srv1"}}, nil},
		{Op{Kind: OpServerDel, Backend: "be-a", Server: "srv1"},
			[]command{{Text: "del server be-a/srv1", Expect: "Server deleted"}}, nil},
		{Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.com", Value: "be-a"},
			[]command{{Text: "add map maps/host.map", Payload: "example.com be-a\n"}}, nil},
		{Op{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-b"},
			[]command{{Text: "set map maps/host.map example.com be-b"}}, nil},
		{Op{Kind: OpMapDel, Path: "maps/host.map", Key: "example.com"},
			[]command{{Text: "del map maps/host.map example.com", Repeat: true}}, nil},
		{Op{Kind: OpCertSet, Path: "certs/b.pem"},
			[]command{
				{Text: "set ssl cert certs/b.pem", Payload: testPEM, Expect: "transaction"},
				{Text: "commit ssl cert certs/b.pem", Expect: "Success!"}},
			[]command{{Text: "abort ssl cert certs/b.pem"}}},
		{Op{Kind: OpCertNew, Path: "certs/b.pem"},
			[]command{
				{Text: "new ssl cert certs/b.pem", Expect: "New empty certificate store"},
				{Text: "set ssl cert certs/b.pem", Payload: testPEM, Expect: "transaction"},
				{Text: "commit ssl cert certs/b.pem", Expect: "Success!"}},
			[]command{{Text: "abort ssl cert certs/b.pem"}}},
		{Op{Kind: OpCASet, Path: "ca/c.pem"},
			[]command{
				{Text: "set ssl ca-file ca/c.pem", Payload: testPEM, Expect: "transaction"},
				{Text: "commit ssl ca-file ca/c.pem", Expect: "Success!"}},
			[]command{{Text: "abort ssl ca-file ca/c.pem"}}},
		{Op{Kind: OpCANew, Path: "ca/c.pem"},
			[]command{
				{Text: "new ssl ca-file ca/c.pem", Expect: "New CA file created"},
				{Text: "set ssl ca-file ca/c.pem", Payload: testPEM, Expect: "transaction"},
				{Text: "commit ssl ca-file ca/c.pem", Expect: "Success!"}},
			[]command{{Text: "abort ssl ca-file ca/c.pem"}}},
		{Op{Kind: OpCRTListAdd, Path: "certs/list.txt", Cert: "certs/c.pem"},
			[]command{{Text: "add ssl crt-list certs/list.txt", Payload: "certs/c.pem\n", Expect: "Success"}}, nil},
		{Op{Kind: OpCRTListDel, Path: "certs/list.txt", Cert: "certs/c.pem"},
			[]command{{Text: "del ssl crt-list certs/list.txt certs/c.pem"}}, nil},
	}
	for _, tt := range tests {
		name := tt.op.Kind + "/" + tt.cmds[0].Text
		t.Run(name, func(t *testing.T) {
			p, err := compileOp(&tt.op, files, payloadTerminator)
			if err != nil {
				t.Fatal(err)
			}
			want := program{Kind: tt.op.Kind, Commands: tt.cmds, Abort: tt.abort, Terminator: payloadTerminator}
			if !reflect.DeepEqual(p, want) {
				t.Errorf("got  %+v\nwant %+v", p, want)
			}
		})
	}
	t.Run("map_replace", func(t *testing.T) {
		p, err := compileOp(&Op{Kind: OpMapReplace, Path: "m.map"}, contentOf(map[string]string{"m.map": "a 1\n"}), payloadTerminator)
		if err != nil {
			t.Fatal(err)
		}
		want := []command{
			{Text: "prepare map m.map", Capture: true, Expect: "version created"},
			{Text: "add map " + ver + "m.map", Payload: "a 1\n"},
			{Text: "commit map " + ver + "m.map"},
		}
		if !reflect.DeepEqual(p.Commands, want) || p.Abort != nil {
			t.Errorf("got %+v / %+v\nwant %+v", p.Commands, p.Abort, want)
		}
	})
}

// ---------------------------------------------------------------------------
// The op table: what each op puts on the wire, or why it is refused.

// compileOpCase is one op compiled for one worker. A case that compiles
// lists the lines the executor sends for it, in order, and the lines it
// sends to clean up after a failure; a refused case names the sentinel it
// wraps (nil for none) and the refusal's exact text.
type compileOpCase struct {
	group   string            // the existing test that also runs the case
	name    string            // what the case pins
	op      Op                // the op, as Diff emits it
	files   map[string]string // the held file contents, by path
	version string            // the worker's version; "" is 3.4.3
	lines   []string          // the lines sent, prefix and payload framing included
	abort   []string          // the lines sent after a failure of the op
	err     error             // the sentinel a refusal wraps, nil for none
	errText string            // the refusal's text; "" when the op compiles
}

// wantLine is the line HAProxy receives for commands without a payload.
func wantLine(cmds ...string) string { return linePrefix + strings.Join(cmds, ";") + "\n" }

// wantPayload is the line HAProxy receives for a payload command: the
// pattern after "<<", the payload, then the pattern alone on a line (an
// empty line for HAProxy's default terminator).
func wantPayload(term, text, payload string) string {
	return linePrefix + text + " <<" + term + "\n" + payload + term + "\n"
}

// wireLines packs a program into the lines the executor sends: the
// commands through the line builder, a repeated command (del map) alone on
// a line of its own, each abort command alone. A captured map version
// stays the placeholder the executor substitutes.
func wireLines(p program) (lines, abort []string) {
	var b lineBuilder
	send := func(line []lineCommand) {
		if len(line) > 0 {
			lines = append(lines, renderLine(line, p.Terminator))
		}
	}
	for _, c := range p.Commands {
		if c.Repeat {
			send(b.take())
			send([]lineCommand{{command: c}})
			continue
		}
		for _, line := range b.add(lineCommand{command: c}) {
			send(line)
		}
	}
	send(b.take())
	for _, c := range p.Abort {
		abort = append(abort, renderLine([]lineCommand{{command: c}}, p.Terminator))
	}
	return lines, abort
}

func (tc compileOpCase) run(t *testing.T) {
	t.Helper()
	version := tc.version
	if version == "" {
		version = "3.4.3"
	}
	p, err := compileOp(&tc.op, contentOf(tc.files), terminatorFor(version))
	if tc.errText != "" {
		if err == nil || err.Error() != tc.errText {
			t.Fatalf("err = %v, want %s", err, tc.errText)
		}
		if tc.err != nil && !errors.Is(err, tc.err) || tc.err == nil && errors.Is(err, errUnsafeToken) {
			t.Errorf("err %v wraps the wrong sentinel, want %v", err, tc.err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	lines, abort := wireLines(p)
	if !slices.Equal(lines, tc.lines) {
		t.Errorf("lines\n got %q\nwant %q", lines, tc.lines)
	}
	if !slices.Equal(abort, tc.abort) {
		t.Errorf("abort lines\n got %q\nwant %q", abort, tc.abort)
	}
}

// compileServerAdd is a valid server_add with one field changed.
func compileServerAdd(mut func(*Op)) Op {
	op := Op{Kind: OpServerAdd, Backend: "be-a", Server: "s1", Address: "10.0.0.1", Port: 80}
	mut(&op)
	return op
}

var compileOpCases = func() []compileOpCase {
	ver := "@" + versionPlaceholder + " "
	pems := map[string]string{"certs/b.pem": testPEM, "ca/c.pem": testPEM}
	certAbort := []string{wantLine("abort ssl cert certs/b.pem")}
	certLines := func(payload string) []string {
		return []string{
			wantPayload("HAPTIC", "set ssl cert certs/b.pem", payload),
			wantLine("commit ssl cert certs/b.pem"),
		}
	}
	const unsafe = "unsafe runtime token: "
	blankPEM := "-----BEGIN CERTIFICATE-----\nMIIB\n\n-----END CERTIFICATE-----\n"
	bigPEM := "-----BEGIN CERTIFICATE-----\n" + strings.Repeat("A", MaxPayloadBytes) + "\n"
	fullSet := "set map maps/host.map k " + strings.Repeat("v", lineBudget-len("set map maps/host.map k "))
	fullMapLine := "k " + strings.Repeat("x", MaxPayloadBytes-3) + "\n"
	return []compileOpCase{
		// Every op kind: one command per line unless the packer joins them.
		{group: "command", name: "backend_add with a guid",
			op:    Op{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http", GUID: "be-b-guid"},
			lines: []string{wantLine("add backend be-b from web mode http guid be-b-guid")}},
		{group: "command", name: "backend_add in tcp mode",
			op:    Op{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "tcp"},
			lines: []string{wantLine("add backend be-b from web mode tcp")}},
		{group: "command", name: "backend_publish",
			op:    Op{Kind: OpBackendPublish, Backend: "be-b"},
			lines: []string{wantLine("publish backend be-b")}},
		{group: "command", name: "backend_unpublish",
			op:    Op{Kind: OpBackendUnpublish, Backend: "be-b"},
			lines: []string{wantLine("unpublish backend be-b")}},
		{group: "command", name: "backend_del",
			op:    Op{Kind: OpBackendDel, Backend: "be-b"},
			lines: []string{wantLine("del backend be-b")}},
		{group: "command", name: "wait_be_removable",
			op:    Op{Kind: OpBackendWaitRemovable, Backend: "be-b", TimeoutMs: 2000},
			lines: []string{wantLine("wait 2000 be-removable be-b")}},
		{group: "command", name: "server_add with a port and keywords",
			op: Op{Kind: OpServerAdd, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 8080,
				Keywords: []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"2s"}}, {Name: "init-state", Args: []string{"up"}}}},
			lines: []string{wantLine("add server be-a/srv1 10.0.0.1:8080 check inter 2s init-state up")}},
		{group: "command", name: "server_add on a unix socket",
			op:    Op{Kind: OpServerAdd, Backend: "be-a", Server: "sock", Address: "/run/app.sock"},
			lines: []string{wantLine("add server be-a/sock /run/app.sock")}},
		{group: "command", name: "server_enable with health checks",
			op:    Op{Kind: OpServerEnable, Backend: "be-a", Server: "srv1", Health: true},
			lines: []string{wantLine("enable health be-a/srv1", "enable server be-a/srv1")}},
		{group: "command", name: "server_enable",
			op:    Op{Kind: OpServerEnable, Backend: "be-a", Server: "srv1"},
			lines: []string{wantLine("enable server be-a/srv1")}},
		{group: "command", name: "server_disable",
			op:    Op{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
			lines: []string{wantLine("disable server be-a/srv1")}},
		{group: "command", name: "server_set_addr with a port",
			op:    Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2", Port: 81},
			lines: []string{wantLine("set server be-a/srv1 addr 10.0.0.2 port 81")}},
		{group: "command", name: "server_set_addr without a port",
			op:    Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2"},
			lines: []string{wantLine("set server be-a/srv1 addr 10.0.0.2")}},
		{group: "command", name: "server_set_weight to zero",
			op:    Op{Kind: OpServerSetWeight, Backend: "be-a", Server: "srv1", Weight: intPtr(0)},
			lines: []string{wantLine("set server be-a/srv1 weight 0")}},
		{group: "command", name: "server_set_state",
			op:    Op{Kind: OpServerSetState, Backend: "be-a", Server: "srv1", State: "drain"},
			lines: []string{wantLine("set server be-a/srv1 state drain")}},
		{group: "command", name: "wait_srv_removable",
			op:    Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: 2000},
			lines: []string{wantLine("wait 2000 srv-removable be-a/srv1")}},
		{group: "command", name: "shutdown_sessions",
			op:    Op{Kind: OpShutdownSessions, Backend: "be-a", Server: "srv1"},
			lines: []string{wantLine("shutdown sessions server be-a/srv1")}},
		{group: "command", name: "server_del",
			op:    Op{Kind: OpServerDel, Backend: "be-a", Server: "srv1"},
			lines: []string{wantLine("del server be-a/srv1")}},
		{group: "payload form", name: "map_add travels as a payload",
			op:    Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.com", Value: "be-a"},
			lines: []string{wantPayload("HAPTIC", "add map maps/host.map", "example.com be-a\n")}},
		{group: "payload form", name: "map_add keeps the spaces of a value",
			op:    Op{Kind: OpMapAdd, Path: "m.map", Key: "k", Value: "a  b c"},
			lines: []string{wantPayload("HAPTIC", "add map m.map", "k a  b c\n")}},
		{group: "payload form", name: "map_add of an empty value keeps the space",
			op:    Op{Kind: OpMapAdd, Path: "m.map", Key: "k"},
			lines: []string{wantPayload("HAPTIC", "add map m.map", "k \n")}},
		{group: "command", name: "map_set",
			op:    Op{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-b"},
			lines: []string{wantLine("set map maps/host.map example.com be-b")}},
		{group: "command", name: "map_del travels alone",
			op:    Op{Kind: OpMapDel, Path: "maps/host.map", Key: "example.com"},
			lines: []string{wantLine("del map maps/host.map example.com")}},
		{group: "command", name: "map_replace prepares, fills and commits a version",
			op: Op{Kind: OpMapReplace, Path: "m.map"}, files: map[string]string{"m.map": "a 1\n"},
			lines: []string{
				wantLine("prepare map m.map"),
				wantPayload("HAPTIC", "add map "+ver+"m.map", "a 1\n"),
				wantLine("commit map " + ver + "m.map")}},
		{group: "payload form", name: "cert_set sends the PEM and aborts on failure",
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, files: pems,
			lines: certLines(testPEM), abort: certAbort},
		{group: "command", name: "cert_new creates the store first",
			op: Op{Kind: OpCertNew, Path: "certs/b.pem"}, files: pems,
			lines: append([]string{wantLine("new ssl cert certs/b.pem")}, certLines(testPEM)...), abort: certAbort},
		{group: "command", name: "ca_set",
			op: Op{Kind: OpCASet, Path: "ca/c.pem"}, files: pems,
			lines: []string{
				wantPayload("HAPTIC", "set ssl ca-file ca/c.pem", testPEM),
				wantLine("commit ssl ca-file ca/c.pem")},
			abort: []string{wantLine("abort ssl ca-file ca/c.pem")}},
		{group: "command", name: "ca_new creates the CA file first",
			op: Op{Kind: OpCANew, Path: "ca/c.pem"}, files: pems,
			lines: []string{
				wantLine("new ssl ca-file ca/c.pem"),
				wantPayload("HAPTIC", "set ssl ca-file ca/c.pem", testPEM),
				wantLine("commit ssl ca-file ca/c.pem")},
			abort: []string{wantLine("abort ssl ca-file ca/c.pem")}},
		{group: "command", name: "crtlist_add of a bare certificate",
			op:    Op{Kind: OpCRTListAdd, Path: "certs/list.txt", Cert: "certs/c.pem"},
			lines: []string{wantPayload("HAPTIC", "add ssl crt-list certs/list.txt", "certs/c.pem\n")}},
		{group: "payload form", name: "crtlist_add with options and SNI filters",
			op: Op{Kind: OpCRTListAdd, Path: "l.txt", Cert: "c", Options: []KeywordArg{{Name: "alpn", Args: []string{"h2"}}},
				SNIFilters: []string{"*.example.com", "!secret.example.com"}},
			lines: []string{wantPayload("HAPTIC", "add ssl crt-list l.txt", "c [alpn h2] *.example.com !secret.example.com\n")}},
		{group: "payload form", name: "crtlist_add puts every option in one bracket pair",
			op: Op{Kind: OpCRTListAdd, Path: "l.txt", Cert: "c", Options: []KeywordArg{
				{Name: "alpn", Args: []string{"h2"}}, {Name: "verify", Args: []string{"none"}}, {Name: "no-ca-names"}}},
			lines: []string{wantPayload("HAPTIC", "add ssl crt-list l.txt", "c [alpn h2 verify none no-ca-names]\n")}},
		{group: "command", name: "crtlist_del",
			op:    Op{Kind: OpCRTListDel, Path: "certs/list.txt", Cert: "certs/c.pem"},
			lines: []string{wantLine("del ssl crt-list certs/list.txt certs/c.pem")}},

		// The worker's version picks the payload terminator.
		{group: "worker version", name: "3.0 takes the custom terminator", version: "3.0.11-1+deb13u4",
			op:    Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "v"},
			lines: []string{wantPayload("HAPTIC", "add map m", "k v\n")}},
		{group: "worker version", name: "2.6 gets the default empty-line terminator", version: "2.6.12",
			op:    Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "v"},
			lines: []string{wantPayload("", "add map m", "k v\n")}},
		{group: "worker version", name: "an unreadable version gets the default terminator", version: "unknown",
			op:    Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "v"},
			lines: []string{wantPayload("", "add map m", "k v\n")}},
		{group: "worker version", name: "3.0 takes a PEM with a blank line", version: "3.0.11",
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, files: map[string]string{"certs/b.pem": blankPEM},
			lines: certLines(blankPEM), abort: certAbort},
		{group: "worker version", name: "2.6 refuses a PEM with a blank line, as a limit of its version", version: "2.6.12",
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, files: map[string]string{"certs/b.pem": blankPEM},
			err: errVersionLimit, errText: unsafe + "payload contains the terminator line (an empty line, the only terminator before HAProxy 3.0)"},

		// map_replace sends the parsed entries, never the file.
		{group: "entries not the file", name: "comments and blank lines dropped, tabs and empty values rewritten",
			op: Op{Kind: OpMapReplace, Path: "m"}, files: map[string]string{"m": "# generated by haptic\n\nexample.com be-a\n\n" +
				"# ingress/default\nb.example.com\tbe-b\nempty.example.com\n  spaced.example.com   a  b  \n"},
			lines: []string{
				wantLine("prepare map m"),
				wantPayload("HAPTIC", "add map "+ver+"m", "example.com be-a\nb.example.com be-b\nempty.example.com \nspaced.example.com a  b\n"),
				wantLine("commit map " + ver + "m")}},
		{group: "empty map", name: "an empty file",
			op: Op{Kind: OpMapReplace, Path: "m"}, files: map[string]string{"m": ""},
			lines: []string{wantLine("prepare map m"), wantLine("commit map " + ver + "m")}},
		{group: "empty map", name: "a file of comments only",
			op: Op{Kind: OpMapReplace, Path: "m"}, files: map[string]string{"m": "# only a comment\n\n"},
			lines: []string{wantLine("prepare map m"), wantLine("commit map " + ver + "m")}},
		{group: "map line limit", name: "a line over the payload limit",
			op: Op{Kind: OpMapReplace, Path: "m"}, files: map[string]string{"m": "a 1\nlong " + strings.Repeat("x", MaxPayloadBytes) + "\nb 2\n"},
			err: errUnsafeToken, errText: fmt.Sprintf(unsafe+"map line of %d bytes exceeds the %d-byte payload limit", len("long \n")+MaxPayloadBytes, MaxPayloadBytes)},
		{group: "map line limit", name: "a line of exactly the payload limit travels",
			op: Op{Kind: OpMapReplace, Path: "m"}, files: map[string]string{"m": fullMapLine},
			lines: []string{
				wantLine("prepare map m"),
				wantPayload("HAPTIC", "add map "+ver+"m", fullMapLine),
				wantLine("commit map " + ver + "m")}},

		// A payload line equal to the terminator would end the payload early.
		{group: "ends itself", name: "a terminator line", files: map[string]string{"c.pem": "-----BEGIN CERTIFICATE-----\nHAPTIC\n-----END CERTIFICATE-----\n"},
			op: Op{Kind: OpCertSet, Path: "c.pem"}, err: errUnsafeToken, errText: unsafe + "payload contains the terminator line"},
		{group: "ends itself", name: "a terminator line ending in CR LF", files: map[string]string{"c.pem": "-----BEGIN CERTIFICATE-----\r\nHAPTIC\r\n-----END CERTIFICATE-----\r\n"},
			op: Op{Kind: OpCertSet, Path: "c.pem"}, err: errUnsafeToken, errText: unsafe + "payload contains the terminator line"},
		{group: "ends itself", name: "a last line that is the terminator", files: map[string]string{"c.pem": "-----BEGIN CERTIFICATE-----\nMIIB\nHAPTIC"},
			op: Op{Kind: OpCertSet, Path: "c.pem"}, err: errUnsafeToken, errText: unsafe + "payload contains the terminator line"},
		{group: "ends itself", name: "the terminator and a space is data", files: map[string]string{"certs/b.pem": "HAPTIC \n"},
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, lines: certLines("HAPTIC \n"), abort: certAbort},
		{group: "ends itself", name: "a space and the terminator is data", files: map[string]string{"certs/b.pem": " HAPTIC\n"},
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, lines: certLines(" HAPTIC\n"), abort: certAbort},
		{group: "ends itself", name: "a longer word is data", files: map[string]string{"certs/b.pem": "HAPTICS\n"},
			op: Op{Kind: OpCertSet, Path: "certs/b.pem"}, lines: certLines("HAPTICS\n"), abort: certAbort},

		// Sizes: a command fits the line budget, a payload its limit.
		{group: "oversized", name: "a command over the line budget",
			op:      Op{Kind: OpMapSet, Path: "maps/host.map", Key: "k", Value: strings.Repeat("v", lineBudget)},
			errText: fmt.Sprintf("command of %d bytes exceeds the %d-byte line limit", len("set map maps/host.map k ")+lineBudget, lineBudget)},
		{group: "oversized", name: "a command of exactly the line budget",
			op:    Op{Kind: OpMapSet, Path: "maps/host.map", Key: "k", Value: strings.TrimPrefix(fullSet, "set map maps/host.map k ")},
			lines: []string{wantLine(fullSet)}},
		{group: "oversized", name: "a payload over the payload limit",
			op: Op{Kind: OpCertSet, Path: "c.pem"}, files: map[string]string{"c.pem": bigPEM},
			errText: fmt.Sprintf("payload of %d bytes exceeds the %d-byte payload limit", len(bigPEM), MaxPayloadBytes)},

		// An empty PEM is refused; an unreadable file is an error of its own.
		{group: "empty payload", name: "cert_set", op: Op{Kind: OpCertSet, Path: "c.pem"}, files: map[string]string{"c.pem": ""},
			err: errUnsafeToken, errText: unsafe + "payload is empty"},
		{group: "empty payload", name: "cert_new", op: Op{Kind: OpCertNew, Path: "c.pem"}, files: map[string]string{"c.pem": ""},
			err: errUnsafeToken, errText: unsafe + "payload is empty"},
		{group: "empty payload", name: "ca_set", op: Op{Kind: OpCASet, Path: "c.pem"}, files: map[string]string{"c.pem": ""},
			err: errUnsafeToken, errText: unsafe + "payload is empty"},
		{group: "empty payload", name: "ca_new", op: Op{Kind: OpCANew, Path: "c.pem"}, files: map[string]string{"c.pem": ""},
			err: errUnsafeToken, errText: unsafe + "payload is empty"},
		{group: "empty payload", name: "an unreadable file is not an empty payload", op: Op{Kind: OpCertSet, Path: "missing.pem"},
			errText: "reading missing.pem: no file missing.pem"},

		{group: "unknown kind", name: "an op kind the agent does not know",
			op: Op{Kind: "backend_teleport", Backend: "b"}, err: errUnknownOp, errText: `unknown op kind: "backend_teleport"`},

		// Words that fail the token grammar: refused, never sanitised.
		{group: "unsafe token", name: "semicolon in backend", op: compileServerAdd(func(o *Op) { o.Backend = "be;a" }),
			err: errUnsafeToken, errText: unsafe + `backend "be;a"`},
		{group: "unsafe token", name: "newline in server", op: compileServerAdd(func(o *Op) { o.Server = "s\n1" }),
			err: errUnsafeToken, errText: unsafe + `server "s\n1"`},
		{group: "unsafe token", name: "payload opener in address", op: compileServerAdd(func(o *Op) { o.Address = "<<EOF" }),
			err: errUnsafeToken, errText: unsafe + `address "<<EOF"`},
		{group: "unsafe token", name: "backslash in keyword", op: compileServerAdd(func(o *Op) { o.Keywords = []KeywordArg{{Name: `ch\eck`}} }),
			err: errUnsafeToken, errText: unsafe + `keyword "ch\\eck"`},
		{group: "unsafe token", name: "tab in keyword argument", op: compileServerAdd(func(o *Op) { o.Keywords = []KeywordArg{{Name: "inter", Args: []string{"2\ts"}}} }),
			err: errUnsafeToken, errText: unsafe + `keyword argument "2\ts"`},
		{group: "unsafe token", name: "empty keyword argument", op: compileServerAdd(func(o *Op) { o.Keywords = []KeywordArg{{Name: "inter", Args: []string{""}}} }),
			err: errUnsafeToken, errText: unsafe + "keyword argument is empty"},
		{group: "unsafe token", name: "port 65536", op: compileServerAdd(func(o *Op) { o.Port = 65536 }),
			err: errUnsafeToken, errText: unsafe + "port 65536 outside 0..65535"},
		{group: "unsafe token", name: "negative port", op: compileServerAdd(func(o *Op) { o.Port = -1 }),
			err: errUnsafeToken, errText: unsafe + "port -1 outside 0..65535"},
		{group: "unsafe token", name: "empty backend", op: compileServerAdd(func(o *Op) { o.Backend = "" }),
			err: errUnsafeToken, errText: unsafe + "backend is empty"},
		{group: "unsafe token", name: "space in map_set value", op: Op{Kind: OpMapSet, Path: "m", Key: "k", Value: "a b"},
			err: errUnsafeToken, errText: unsafe + `value "a b"`},
		{group: "unsafe token", name: "empty map_set value", op: Op{Kind: OpMapSet, Path: "m", Key: "k"},
			err: errUnsafeToken, errText: unsafe + "value is empty"},
		{group: "unsafe token", name: "newline in map_add value", op: Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "a\nb"},
			err: errUnsafeToken, errText: unsafe + `value "a\nb"`},
		{group: "unsafe token", name: "carriage return in map_add value", op: Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "a\rb"},
			err: errUnsafeToken, errText: unsafe + `value "a\rb"`},
		{group: "unsafe token", name: "space in map_add key", op: Op{Kind: OpMapAdd, Path: "m", Key: "k k", Value: "v"},
			err: errUnsafeToken, errText: unsafe + `key "k k"`},
		{group: "unsafe token", name: "semicolon in map path", op: Op{Kind: OpMapDel, Path: "m;show info", Key: "k"},
			err: errUnsafeToken, errText: unsafe + `path "m;show info"`},
		{group: "unsafe token", name: "bad mode", op: Op{Kind: OpBackendAdd, Backend: "b", Profile: "web", Mode: "udp"},
			err: errUnsafeToken, errText: unsafe + `mode "udp"`},
		{group: "unsafe token", name: "empty mode", op: Op{Kind: OpBackendAdd, Backend: "b", Profile: "web"},
			err: errUnsafeToken, errText: unsafe + `mode ""`},
		{group: "unsafe token", name: "unsafe guid", op: Op{Kind: OpBackendAdd, Backend: "b", Profile: "web", Mode: "http", GUID: "g g"},
			err: errUnsafeToken, errText: unsafe + `guid "g g"`},
		{group: "unsafe token", name: "bad state", op: Op{Kind: OpServerSetState, Backend: "b", Server: "s", State: "up"},
			err: errUnsafeToken, errText: unsafe + `state "up"`},
		{group: "unsafe token", name: "empty state", op: Op{Kind: OpServerSetState, Backend: "b", Server: "s"},
			err: errUnsafeToken, errText: unsafe + `state ""`},
		{group: "unsafe token", name: "timeout_ms 0", op: Op{Kind: OpServerWaitRemovable, Backend: "b", Server: "s"},
			err: errUnsafeToken, errText: unsafe + "timeout_ms 0 outside 1..30000"},
		{group: "unsafe token", name: "timeout_ms 30001", op: Op{Kind: OpBackendWaitRemovable, Backend: "b", TimeoutMs: 30001},
			err: errUnsafeToken, errText: unsafe + "timeout_ms 30001 outside 1..30000"},
		{group: "unsafe token", name: "nil weight", op: Op{Kind: OpServerSetWeight, Backend: "b", Server: "s"},
			err: errUnsafeToken, errText: unsafe + "weight is unset"},
		{group: "unsafe token", name: "weight 257", op: Op{Kind: OpServerSetWeight, Backend: "b", Server: "s", Weight: intPtr(257)},
			err: errUnsafeToken, errText: unsafe + "weight 257 outside 0..256"},
		{group: "unsafe token", name: "set addr port 70000", op: Op{Kind: OpServerSetAddr, Backend: "b", Server: "s", Address: "10.0.0.1", Port: 70000},
			err: errUnsafeToken, errText: unsafe + "port 70000 outside 0..65535"},
		{group: "unsafe token", name: "DEL byte in cert", op: Op{Kind: OpCRTListDel, Path: "l", Cert: "c\x7f"},
			err: errUnsafeToken, errText: unsafe + `cert "c\x7f"`},
		{group: "unsafe token", name: "space in SNI filter", op: Op{Kind: OpCRTListAdd, Path: "l", Cert: "c", SNIFilters: []string{"a b"}},
			err: errUnsafeToken, errText: unsafe + `sni filter "a b"`},
		{group: "unsafe token", name: "unsafe crt-list option", op: Op{Kind: OpCRTListAdd, Path: "l", Cert: "c", Options: []KeywordArg{{Name: "alpn", Args: []string{"h2]"}}}},
			err: errUnsafeToken, errText: unsafe + `crt-list word "h2]"`},
		{group: "unsafe token", name: "unsafe cert path", op: Op{Kind: OpCertSet, Path: "certs/a b.pem"},
			err: errUnsafeToken, errText: unsafe + `path "certs/a b.pem"`},
	}
}()

// TestCompileOpTable compiles every case of the op table for its worker
// and checks the exact lines sent, or the exact refusal.
func TestCompileOpTable(t *testing.T) {
	for _, tc := range compileOpCases {
		t.Run(tc.group+": "+tc.name, tc.run)
	}
}

// runCompileOpGroup runs the op table's cases of one group, the ones an
// existing test pins.
func runCompileOpGroup(t *testing.T, group string) {
	ran := 0
	for _, tc := range compileOpCases {
		if tc.group == group {
			ran++
			t.Run(tc.name, tc.run)
		}
	}
	if ran == 0 {
		t.Fatalf("the op table has no %q case", group)
	}
}

// The tests below each pin one group of the op table.

// TestCompilePayloadForms pins what a payload op carries: a map value keeps
// its spaces and an empty one its separating space, a PEM travels whole
// with the abort that closes its transaction, and a crt-list entry puts its
// options in one bracket pair before its SNI filters.
func TestCompilePayloadForms(t *testing.T) { runCompileOpGroup(t, "payload form") }

// TestCompileRejectsUnsafeTokens pins that a word failing the token grammar
// is refused with errUnsafeToken naming its field, never cleaned up.
func TestCompileRejectsUnsafeTokens(t *testing.T) { runCompileOpGroup(t, "unsafe token") }

// TestCompileRefusesUnknownOpKind pins that a kind the agent does not
// execute is refused with errUnknownOp before anything is sent.
func TestCompileRefusesUnknownOpKind(t *testing.T) { runCompileOpGroup(t, "unknown kind") }

// TestCompileRefusesAnOversizedCommand pins the size limits: a command over
// the line budget or a payload over MaxPayloadBytes is refused, and a
// command of exactly the budget compiles.
func TestCompileRefusesAnOversizedCommand(t *testing.T) { runCompileOpGroup(t, "oversized") }

// TestCompileRefusesAnEmptyPayload pins that an empty PEM is refused (an
// empty payload is misparsed by HAProxy), while a file that cannot be read
// is an error of its own, not an unsafe token.
func TestCompileRefusesAnEmptyPayload(t *testing.T) { runCompileOpGroup(t, "empty payload") }

// TestMapReplaceSendsTheEntriesNotTheFile pins that map_replace sends the
// parsed entries: HAProxy's payload parser has no comments and reads a key
// up to the first space or tab, newlines included.
func TestMapReplaceSendsTheEntriesNotTheFile(t *testing.T) {
	runCompileOpGroup(t, "entries not the file")
}

// TestMapReplaceOfAnEmptyMapIsPrepareAndCommit pins that a map without
// entries installs an empty version: prepare, then commit, no chunk.
func TestMapReplaceOfAnEmptyMapIsPrepareAndCommit(t *testing.T) { runCompileOpGroup(t, "empty map") }

// TestAPayloadThatEndsItselfIsRefused pins that a payload line equal to the
// terminator, which would end the payload early, is refused, and that the
// terminator inside a longer line is data.
func TestAPayloadThatEndsItselfIsRefused(t *testing.T) { runCompileOpGroup(t, "ends itself") }

// TestMapReplaceRefusesALineOverThePayloadLimit pins that a map line that
// cannot fit one payload is refused, and one of exactly the limit travels.
func TestMapReplaceRefusesALineOverThePayloadLimit(t *testing.T) {
	runCompileOpGroup(t, "map line limit")
}

func mapReplaceBody(t *testing.T, p program) string {
	t.Helper()
	var body strings.Builder
	for _, c := range p.Commands[1 : len(p.Commands)-1] {
		body.WriteString(c.Payload)
	}
	return body.String()
}

func TestMapReplaceChunksThePayload(t *testing.T) {
	var file, want strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&file, "host-%04d.example.com backend-%04d\n", i, i)
	}
	want.WriteString(file.String())
	p, err := compileOp(&Op{Kind: OpMapReplace, Path: "m"}, contentOf(map[string]string{"m": file.String()}), payloadTerminator)
	if err != nil {
		t.Fatal(err)
	}
	first, last := p.Commands[0], p.Commands[len(p.Commands)-1]
	if first.Text != "prepare map m" || !first.Capture || first.Expect != "version created" {
		t.Errorf("first = %+v", first)
	}
	if last.Text != "commit map @"+versionPlaceholder+" m" || last.Payload != "" {
		t.Errorf("last = %+v", last)
	}
	chunks := p.Commands[1 : len(p.Commands)-1]
	if len(chunks) < 2 {
		t.Fatalf("%d chunks, want several", len(chunks))
	}
	for _, c := range chunks {
		if c.Text != "add map @"+versionPlaceholder+" m" || len(c.Payload) > MaxPayloadBytes || !strings.HasSuffix(c.Payload, "\n") {
			t.Errorf("chunk %q of %d bytes", c.Text, len(c.Payload))
		}
	}
	if got := mapReplaceBody(t, p); got != want.String() {
		t.Errorf("chunks do not reassemble the body")
	}
}

// parsedMapPayload is the payload by its definition: the parsed entries,
// "key value\n" each.
func parsedMapPayload(data string) string {
	var b strings.Builder
	for _, e := range ParseMapEntries(data) {
		b.WriteString(e.Key + " " + e.Value + "\n")
	}
	return b.String()
}

// TestMapPayloadTakesACanonicalFileAsItIs pins which files are their own
// payload, and that the scan never takes a file the parse would change.
func TestMapPayloadTakesACanonicalFileAsItIs(t *testing.T) {
	tests := []struct {
		file      string
		canonical bool
	}{
		{"", true},
		{"a 1\n", true},
		{"example.com be-a\nexample.org be-b\n", true},
		{"k value with spaces\n", true},
		{"a 1", false},         // no final newline
		{"a\n", false},         // no value: the payload needs "a \n"
		{"a \n", false},        // trailing space
		{"a  1\n", false},      // value starts with a space
		{" a 1\n", false},      // leading space
		{"#a 1\n", false},      // a comment
		{"a\t1\n", false},      // a tab separates
		{"a 1\r\n", false},     // CRLF
		{"\n", false},          // a blank line
		{"a 1\x00\n", false},   // a control byte
		{"a 1\u00a0\n", false}, // non-ASCII, which TrimSpace may trim
	}
	for _, tt := range tests {
		if got := canonicalMapFile([]byte(tt.file)); got != tt.canonical {
			t.Errorf("canonicalMapFile(%q) = %v, want %v", tt.file, got, tt.canonical)
		}
		if tt.canonical && parsedMapPayload(tt.file) != tt.file {
			t.Errorf("%q is called canonical but parses to %q", tt.file, parsedMapPayload(tt.file))
		}
	}
	if !canonicalMapFile([]byte(benchMap10k("be-a"))) {
		t.Error("a rendered host map is not canonical: the fast path never runs")
	}
	alphabet := []string{"a", "b", " ", " ", "\t", "#", "\r", "\n", "\n", "\u00a0", "\x00", "~"}
	rng := rand.New(rand.NewPCG(15, 16))
	for range 20000 {
		var file strings.Builder
		for range rng.IntN(12) {
			file.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		data := file.String()
		got, err := mapPayload([]byte(data))
		if err != nil {
			continue // an entry HAProxy's payload cannot carry
		}
		if want := parsedMapPayload(data); got != want {
			t.Fatalf("mapPayload(%q) = %q, want %q", data, got, want)
		}
	}
}

func TestPayloadFramingFollowsTheWorkerVersion(t *testing.T) {
	tests := []struct {
		version, term, line string
	}{
		{"3.4.3", "HAPTIC", "set severity-output number;experimental-mode on;add map m <<HAPTIC\nk v\nHAPTIC\n"},
		{"3.0.11-1+deb13u4", "HAPTIC", "set severity-output number;experimental-mode on;add map m <<HAPTIC\nk v\nHAPTIC\n"},
		{"v3.1.0", "HAPTIC", "set severity-output number;experimental-mode on;add map m <<HAPTIC\nk v\nHAPTIC\n"},
		{"2.6.12", "", "set severity-output number;experimental-mode on;add map m <<\nk v\n\n"},
		{"2.9.0", "", "set severity-output number;experimental-mode on;add map m <<\nk v\n\n"},
		{"", "", "set severity-output number;experimental-mode on;add map m <<\nk v\n\n"},
		{"unknown", "", "set severity-output number;experimental-mode on;add map m <<\nk v\n\n"},
	}
	for _, tt := range tests {
		term := terminatorFor(tt.version)
		if term != tt.term {
			t.Errorf("terminatorFor(%q) = %q, want %q", tt.version, term, tt.term)
			continue
		}
		p, err := compileOp(&Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "v"}, nil, term)
		if err != nil {
			t.Fatal(err)
		}
		if got := renderLine([]lineCommand{{command: p.Commands[0]}}, p.Terminator); got != tt.line {
			t.Errorf("%q: line = %q, want %q", tt.version, got, tt.line)
		}
		blank := "-----BEGIN CERTIFICATE-----\nMIIB\n\n-----END CERTIFICATE-----\n"
		_, err = compileOp(&Op{Kind: OpCertSet, Path: "c.pem"}, contentOf(map[string]string{"c.pem": blank}), term)
		if (err != nil) != (term == "") || err != nil && (!errors.Is(err, errUnsafeToken) || !errors.Is(err, errVersionLimit)) {
			t.Errorf("%q: PEM with a blank line: err = %v", tt.version, err)
		}
	}
	// The framed size is bounded too.
	text := "add map " + strings.Repeat("p", 2000)
	err := checkCommand(command{Text: text, Payload: strings.Repeat("k v\n", 3000)}, payloadTerminator)
	if err == nil || !strings.Contains(err.Error(), "13312-byte framed limit") {
		t.Errorf("framed limit: err = %v", err)
	}
}

// ---------------------------------------------------------------------------
// Line building (unit).

func TestLineBuilderKeepsEveryLineWithinTheBudget(t *testing.T) {
	// The reserve holds the longest head a line gets: the prefix, and on
	// the apply path the read of the worker's identity.
	if head := len(linePrefix + identityCommand + ";"); head > lineReserve {
		t.Fatalf("a line's head is %d bytes, over the %d-byte reserve", head, lineReserve)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var b lineBuilder
		var lines [][]lineCommand
		var sent []lineCommand
		for i := range 400 {
			var c command
			switch k := rng.IntN(20); {
			case k == 0:
				c = command{Text: "add map m", Payload: "k v\n"}
			case k == 1:
				c = command{Text: "prepare map m", Capture: true}
			case k < 4:
				c = command{Text: fmt.Sprintf("wait %d srv-removable be/s%d", 1+rng.IntN(MaxWaitBudgetMs), i), Expect: "Done"}
			default:
				c = command{Text: strings.Repeat("x", 1+rng.IntN(lineBudget))}
			}
			lc := lineCommand{command: c, prog: i}
			sent = append(sent, lc)
			lines = append(lines, b.add(lc)...)
		}
		if last := b.take(); last != nil {
			lines = append(lines, last)
		}
		if b.take() != nil {
			t.Fatal("take after take returned a line")
		}
		var got []lineCommand
		for _, line := range lines {
			if len(line) == 0 {
				t.Fatalf("round %d: an empty line was produced", round)
			}
			got = append(got, line...)
			rendered := linePrefix
			for i, c := range line {
				if i > 0 {
					rendered += ";"
				}
				rendered += c.Text
			}
			if len(rendered)+1 > MaxCommandLineBytes {
				t.Errorf("round %d: line of %d bytes", round, len(rendered)+1)
			}
			if ms := lineWaitBudget(line); ms.Milliseconds() > MaxWaitBudgetMs {
				t.Errorf("round %d: wait budget %v", round, ms)
			}
			for i, c := range line {
				if (c.Payload != "" || c.Capture) && len(line) != 1 {
					t.Errorf("round %d: solo command %q shares a line of %d (position %d)", round, c.Text, len(line), i)
				}
			}
		}
		if len(got) != len(sent) {
			t.Fatalf("round %d: %d commands out of %d", round, len(got), len(sent))
		}
		for i := range got {
			if got[i].prog != sent[i].prog {
				t.Fatalf("round %d: order changed at %d", round, i)
			}
		}
	}
}
