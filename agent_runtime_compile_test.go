// Tests of the op compiler and the line packer: pure functions, tested as
// tables with no socket. TestCompileOpTable pins the bytes every op puts on
// the wire for each HAProxy dialect; the other tests pin the command
// table, the token checks, the payload forms and the line budget.

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
// Compile (unit).

func intPtr(v int) *int { return &v }

func noContent(string) ([]byte, error) { return nil, errors.New("no file expected") }

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

// packLines is what the executor sends for one program before any reply
// comes back: the commands packed by lineBuilder and rendered with the
// program's terminator, a Repeat command alone on its line (as repeat sends
// it). A captured map version stays versionPlaceholder: the executor
// substitutes it only once prepare map has answered.
func packLines(p program) []string {
	var lines []string
	var b lineBuilder
	emit := func(ready ...[]lineCommand) {
		for _, line := range ready {
			if len(line) > 0 {
				lines = append(lines, renderLine(line, p.Terminator))
			}
		}
	}
	for _, c := range p.Commands {
		if c.Repeat {
			emit(b.take(), []lineCommand{{command: c}})
			continue
		}
		emit(b.add(lineCommand{command: c})...)
	}
	emit(b.take())
	return lines
}

// TestCompileOpTable pins, one op per row, the bytes the compiler puts on
// the wire for the HAProxy version the row names, or the refusal. The
// version's caps pick the payload terminator: 3.0 and later frame a payload
// with "<<HAPTIC", 2.6 has no custom terminators and gets HAProxy's default
// empty line, which a blank line inside a PEM would end early.
func TestCompileOpTable(t *testing.T) {
	const (
		v34 = "3.4.3-1deb11u1"
		v30 = "3.0.11-1+deb13u4"
		v26 = "2.6.12-1+deb12u4"
		pre = linePrefix
	)
	ver := "@" + versionPlaceholder + " "
	blankPEM := "-----BEGIN CERTIFICATE-----\nMIIB\n\n-----END CERTIFICATE-----\n"
	bigPEM := "-----BEGIN CERTIFICATE-----\n" + strings.Repeat("A", MaxPayloadBytes) + "\n"
	files := contentOf(map[string]string{
		"certs/b.pem":     testPEM,
		"ca/c.pem":        testPEM,
		"certs/blank.pem": blankPEM,
		"certs/term.pem":  "-----BEGIN CERTIFICATE-----\nHAPTIC\n-----END CERTIFICATE-----\n",
		"certs/empty.pem": "",
		"certs/big.pem":   bigPEM,
		"maps/full.map":   "# generated by haptic\na 1\n\nb  2 3\nempty\n",
		"maps/empty.map":  "# only a comment\n\n",
		"maps/long.map":   "a 1\nk " + strings.Repeat("x", MaxPayloadBytes) + "\n",
	})
	srv := func(mut func(*Op)) Op {
		op := Op{Kind: OpServerAdd, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 80}
		mut(&op)
		return op
	}
	tests := []struct {
		name    string
		op      Op
		version string   // the worker's HAProxy version
		lines   []string // every line sent, in order
		err     error    // the sentinel a refusal wraps, if any
		errText string   // a refusal's exact text
	}{
		// Backends (3.4).
		{name: "backend_add with a guid", version: v34,
			op:    Op{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http", GUID: "be-b-guid"},
			lines: []string{pre + "add backend be-b from web mode http guid be-b-guid\n"}},
		{name: "backend_publish", version: v34, op: Op{Kind: OpBackendPublish, Backend: "be-b"},
			lines: []string{pre + "publish backend be-b\n"}},
		{name: "backend_unpublish", version: v34, op: Op{Kind: OpBackendUnpublish, Backend: "be-b"},
			lines: []string{pre + "unpublish backend be-b\n"}},
		{name: "backend_del", version: v34, op: Op{Kind: OpBackendDel, Backend: "be-b"},
			lines: []string{pre + "del backend be-b\n"}},
		{name: "wait_be_removable", version: v34, op: Op{Kind: OpBackendWaitRemovable, Backend: "be-b", TimeoutMs: 2000},
			lines: []string{pre + "wait 2000 be-removable be-b\n"}},

		// Servers.
		{name: "server_add with keywords", version: v30,
			op: Op{Kind: OpServerAdd, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 8080,
				Keywords: []KeywordArg{{Name: "check"}, {Name: "inter", Args: []string{"2s"}}}},
			lines: []string{pre + "add server be-a/srv1 10.0.0.1:8080 check inter 2s\n"}},
		{name: "server_add on a unix path has no port", version: v30,
			op:    Op{Kind: OpServerAdd, Backend: "be-a", Server: "sock", Address: "/run/app.sock"},
			lines: []string{pre + "add server be-a/sock /run/app.sock\n"}},
		{name: "server_enable with health shares one line", version: v30,
			op:    Op{Kind: OpServerEnable, Backend: "be-a", Server: "srv1", Health: true},
			lines: []string{pre + "enable health be-a/srv1;enable server be-a/srv1\n"}},
		{name: "server_disable", version: v26, op: Op{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
			lines: []string{pre + "disable server be-a/srv1\n"}},
		{name: "server_set_addr with a port", version: v26,
			op:    Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2", Port: 81},
			lines: []string{pre + "set server be-a/srv1 addr 10.0.0.2 port 81\n"}},
		{name: "server_set_weight 0", version: v26,
			op:    Op{Kind: OpServerSetWeight, Backend: "be-a", Server: "srv1", Weight: intPtr(0)},
			lines: []string{pre + "set server be-a/srv1 weight 0\n"}},
		{name: "server_set_state drain", version: v26,
			op:    Op{Kind: OpServerSetState, Backend: "be-a", Server: "srv1", State: ServerStateDrain},
			lines: []string{pre + "set server be-a/srv1 state drain\n"}},
		{name: "wait_srv_removable", version: v30,
			op:    Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1", TimeoutMs: MaxWaitBudgetMs},
			lines: []string{pre + "wait 30000 srv-removable be-a/srv1\n"}},
		{name: "shutdown_sessions", version: v30, op: Op{Kind: OpShutdownSessions, Backend: "be-a", Server: "srv1"},
			lines: []string{pre + "shutdown sessions server be-a/srv1\n"}},
		{name: "server_del", version: v30, op: Op{Kind: OpServerDel, Backend: "be-a", Server: "srv1"},
			lines: []string{pre + "del server be-a/srv1\n"}},

		// Maps.
		{name: "map_add on 3.4", version: v34,
			op:    Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.com", Value: "be-a"},
			lines: []string{pre + "add map maps/host.map <<HAPTIC\nexample.com be-a\nHAPTIC\n"}},
		{name: "map_add keeps a value's spaces", version: v30,
			op:    Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "k", Value: "a  b c"},
			lines: []string{pre + "add map maps/host.map <<HAPTIC\nk a  b c\nHAPTIC\n"}},
		{name: "map_add of an empty value", version: v30,
			op:    Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "k"},
			lines: []string{pre + "add map maps/host.map <<HAPTIC\nk \nHAPTIC\n"}},
		{name: "map_add on 2.6 ends with an empty line", version: v26,
			op:    Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.com", Value: "be-a"},
			lines: []string{pre + "add map maps/host.map <<\nexample.com be-a\n\n"}},
		{name: "map_set", version: v30, op: Op{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-b"},
			lines: []string{pre + "set map maps/host.map example.com be-b\n"}},
		{name: "map_del goes alone", version: v34, op: Op{Kind: OpMapDel, Path: "maps/host.map", Key: "example.com"},
			lines: []string{pre + "del map maps/host.map example.com\n"}},
		{name: "map_replace sends the entries, not the file", version: v34,
			op: Op{Kind: OpMapReplace, Path: "maps/full.map"},
			lines: []string{
				pre + "prepare map maps/full.map\n",
				pre + "add map " + ver + "maps/full.map <<HAPTIC\na 1\nb 2 3\nempty \nHAPTIC\n",
				pre + "commit map " + ver + "maps/full.map\n"}},
		{name: "map_replace on 2.6", version: v26, op: Op{Kind: OpMapReplace, Path: "maps/full.map"},
			lines: []string{
				pre + "prepare map maps/full.map\n",
				pre + "add map " + ver + "maps/full.map <<\na 1\nb 2 3\nempty \n\n",
				pre + "commit map " + ver + "maps/full.map\n"}},
		{name: "map_replace of an empty map", version: v30, op: Op{Kind: OpMapReplace, Path: "maps/empty.map"},
			lines: []string{pre + "prepare map maps/empty.map\n", pre + "commit map " + ver + "maps/empty.map\n"}},

		// Certificates, CA files, crt-lists: a payload travels alone.
		{name: "cert_set", version: v34, op: Op{Kind: OpCertSet, Path: "certs/b.pem"},
			lines: []string{
				pre + "set ssl cert certs/b.pem <<HAPTIC\n" + testPEM + "HAPTIC\n",
				pre + "commit ssl cert certs/b.pem\n"}},
		{name: "cert_new", version: v30, op: Op{Kind: OpCertNew, Path: "certs/b.pem"},
			lines: []string{
				pre + "new ssl cert certs/b.pem\n",
				pre + "set ssl cert certs/b.pem <<HAPTIC\n" + testPEM + "HAPTIC\n",
				pre + "commit ssl cert certs/b.pem\n"}},
		{name: "cert_set with a blank line on 3.0", version: v30, op: Op{Kind: OpCertSet, Path: "certs/blank.pem"},
			lines: []string{
				pre + "set ssl cert certs/blank.pem <<HAPTIC\n" + blankPEM + "HAPTIC\n",
				pre + "commit ssl cert certs/blank.pem\n"}},
		{name: "ca_set on 2.6", version: v26, op: Op{Kind: OpCASet, Path: "ca/c.pem"},
			lines: []string{
				pre + "set ssl ca-file ca/c.pem <<\n" + testPEM + "\n",
				pre + "commit ssl ca-file ca/c.pem\n"}},
		{name: "ca_new", version: v34, op: Op{Kind: OpCANew, Path: "ca/c.pem"},
			lines: []string{
				pre + "new ssl ca-file ca/c.pem\n",
				pre + "set ssl ca-file ca/c.pem <<HAPTIC\n" + testPEM + "HAPTIC\n",
				pre + "commit ssl ca-file ca/c.pem\n"}},
		{name: "crtlist_add with options and SNI filters", version: v30,
			op: Op{Kind: OpCRTListAdd, Path: "certs/list.txt", Cert: "certs/c.pem",
				Options:    []KeywordArg{{Name: "alpn", Args: []string{"h2"}}, {Name: "no-ca-names"}},
				SNIFilters: []string{"*.example.com", "!secret.example.com"}},
			lines: []string{pre + "add ssl crt-list certs/list.txt <<HAPTIC\ncerts/c.pem [alpn h2 no-ca-names] *.example.com !secret.example.com\nHAPTIC\n"}},
		{name: "crtlist_del", version: v30, op: Op{Kind: OpCRTListDel, Path: "certs/list.txt", Cert: "certs/c.pem"},
			lines: []string{pre + "del ssl crt-list certs/list.txt certs/c.pem\n"}},

		// Refusals.
		{name: "an unknown kind", version: v34, op: Op{Kind: "backend_teleport", Backend: "b"},
			err: errUnknownOp, errText: `unknown op kind: "backend_teleport"`},
		{name: "a semicolon in a name", version: v34, op: srv(func(o *Op) { o.Backend = "be;a" }),
			err: errUnsafeToken, errText: `unsafe runtime token: backend "be;a"`},
		{name: "an empty name", version: v34, op: srv(func(o *Op) { o.Backend = "" }),
			err: errUnsafeToken, errText: "unsafe runtime token: backend is empty"},
		{name: "a payload opener in an address", version: v34, op: srv(func(o *Op) { o.Address = "<<EOF" }),
			err: errUnsafeToken, errText: `unsafe runtime token: address "<<EOF"`},
		{name: "a port HAProxy would wrap", version: v34,
			op:  Op{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 70000},
			err: errUnsafeToken, errText: "unsafe runtime token: port 70000 outside 0..65535"},
		{name: "an unset weight", version: v34, op: Op{Kind: OpServerSetWeight, Backend: "be-a", Server: "srv1"},
			err: errUnsafeToken, errText: "unsafe runtime token: weight is unset"},
		{name: "a wait without a timeout", version: v34, op: Op{Kind: OpServerWaitRemovable, Backend: "be-a", Server: "srv1"},
			err: errUnsafeToken, errText: "unsafe runtime token: timeout_ms 0 outside 1..30000"},
		{name: "a mode HAProxy lacks", version: v34, op: Op{Kind: OpBackendAdd, Backend: "b", Profile: "web", Mode: "udp"},
			err: errUnsafeToken, errText: `unsafe runtime token: mode "udp"`},
		{name: "a space in a map_set value", version: v34, op: Op{Kind: OpMapSet, Path: "m", Key: "k", Value: "a b"},
			err: errUnsafeToken, errText: `unsafe runtime token: value "a b"`},
		{name: "a bracket in a crt-list option", version: v34,
			op:  Op{Kind: OpCRTListAdd, Path: "l", Cert: "c", Options: []KeywordArg{{Name: "alpn", Args: []string{"h2]"}}}},
			err: errUnsafeToken, errText: `unsafe runtime token: crt-list word "h2]"`},
		{name: "a command over the line budget", version: v34,
			op:      Op{Kind: OpMapSet, Path: "m", Key: "k", Value: strings.Repeat("v", lineBudget-len("set map m k ")+1)},
			errText: fmt.Sprintf("command of %d bytes exceeds the %d-byte line limit", lineBudget+1, lineBudget)},
		{name: "a payload over the payload limit", version: v34, op: Op{Kind: OpCertSet, Path: "certs/big.pem"},
			errText: fmt.Sprintf("payload of %d bytes exceeds the %d-byte payload limit", len(bigPEM), MaxPayloadBytes)},
		{name: "a map line over the payload limit", version: v34, op: Op{Kind: OpMapReplace, Path: "maps/long.map"},
			err: errUnsafeToken, errText: fmt.Sprintf("unsafe runtime token: map line of %d bytes exceeds the %d-byte payload limit",
				len("k \n")+MaxPayloadBytes, MaxPayloadBytes)},
		{name: "an empty PEM", version: v34, op: Op{Kind: OpCASet, Path: "certs/empty.pem"},
			err: errUnsafeToken, errText: "unsafe runtime token: payload is empty"},
		{name: "a PEM holding the terminator line", version: v34, op: Op{Kind: OpCertSet, Path: "certs/term.pem"},
			err: errUnsafeToken, errText: "unsafe runtime token: payload contains the terminator line"},
		{name: "a PEM with a blank line on 2.6", version: v26, op: Op{Kind: OpCertSet, Path: "certs/blank.pem"},
			err: errUnsafeToken, errText: "unsafe runtime token: payload contains the terminator line"},
		{name: "a file that cannot be read", version: v34, op: Op{Kind: OpCertSet, Path: "certs/missing.pem"},
			errText: "reading certs/missing.pem: no file certs/missing.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := compileOp(&tt.op, files, terminatorFor(tt.version))
			if tt.err != nil || tt.errText != "" {
				if err == nil || tt.err != nil && !errors.Is(err, tt.err) || err.Error() != tt.errText {
					t.Fatalf("err = %v, want %v (%s)", err, tt.errText, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := packLines(p); !slices.Equal(got, tt.lines) {
				t.Errorf("lines\n got %q\nwant %q", got, tt.lines)
			}
		})
	}
}

func TestCompilePayloadForms(t *testing.T) {
	compile := func(op Op, files map[string]string) program {
		t.Helper()
		p, err := compileOp(&op, contentOf(files), payloadTerminator)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := compile(Op{Kind: OpMapAdd, Path: "m.map", Key: "k", Value: "a  b c"}, nil); p.Commands[0].Payload != "k a  b c\n" {
		t.Errorf("map_add payload = %q", p.Commands[0].Payload)
	}
	if p := compile(Op{Kind: OpMapAdd, Path: "m.map", Key: "k"}, nil); p.Commands[0].Payload != "k \n" {
		t.Errorf("map_add empty value = %q", p.Commands[0].Payload)
	}
	p := compile(Op{Kind: OpCertSet, Path: "certs/a.pem"}, map[string]string{"certs/a.pem": testPEM})
	if p.Commands[0].Payload != testPEM || !reflect.DeepEqual(p.Abort, []command{{Text: "abort ssl cert certs/a.pem"}}) {
		t.Errorf("cert program = %+v", p)
	}
	p = compile(Op{Kind: OpCRTListAdd, Path: "l.txt", Cert: "c", Options: []KeywordArg{{Name: "alpn", Args: []string{"h2"}}},
		SNIFilters: []string{"*.example.com", "!secret.example.com"}}, nil)
	if got := p.Commands[0].Payload; got != "c [alpn h2] *.example.com !secret.example.com\n" {
		t.Errorf("crt-list payload = %q", got)
	}
	p = compile(Op{Kind: OpCRTListAdd, Path: "l.txt", Cert: "c", Options: []KeywordArg{
		{Name: "alpn", Args: []string{"h2"}}, {Name: "verify", Args: []string{"none"}}, {Name: "no-ca-names"}}}, nil)
	if got := p.Commands[0].Payload; got != "c [alpn h2 verify none no-ca-names]\n" {
		t.Errorf("crt-list options payload = %q", got)
	}
	if got := renderLine([]lineCommand{{command: compile(Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "example.com", Value: "be-a"}, nil).Commands[0]}}, payloadTerminator); got != "set severity-output number;experimental-mode on;add map maps/host.map <<HAPTIC\nexample.com be-a\nHAPTIC\n" {
		t.Errorf("rendered map_add = %q", got)
	}
}

func TestCompileRejectsUnsafeTokens(t *testing.T) {
	server := func(mut func(*Op)) Op {
		op := Op{Kind: OpServerAdd, Backend: "be-a", Server: "s1", Address: "10.0.0.1", Port: 80}
		mut(&op)
		return op
	}
	tests := []struct {
		name string
		op   Op
	}{
		{"semicolon in backend", server(func(o *Op) { o.Backend = "be;a" })},
		{"newline in server", server(func(o *Op) { o.Server = "s\n1" })},
		{"payload opener in address", server(func(o *Op) { o.Address = "<<EOF" })},
		{"backslash in keyword", server(func(o *Op) { o.Keywords = []KeywordArg{{Name: `ch\eck`}} })},
		{"tab in keyword argument", server(func(o *Op) { o.Keywords = []KeywordArg{{Name: "inter", Args: []string{"2\ts"}}} })},
		{"empty keyword argument", server(func(o *Op) { o.Keywords = []KeywordArg{{Name: "inter", Args: []string{""}}} })},
		{"port 65536", server(func(o *Op) { o.Port = 65536 })},
		{"negative port", server(func(o *Op) { o.Port = -1 })},
		{"empty backend", server(func(o *Op) { o.Backend = "" })},
		{"space in map_set value", Op{Kind: OpMapSet, Path: "m", Key: "k", Value: "a b"}},
		{"empty map_set value", Op{Kind: OpMapSet, Path: "m", Key: "k"}},
		{"newline in map_add value", Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "a\nb"}},
		{"carriage return in map_add value", Op{Kind: OpMapAdd, Path: "m", Key: "k", Value: "a\rb"}},
		{"space in map_add key", Op{Kind: OpMapAdd, Path: "m", Key: "k k", Value: "v"}},
		{"semicolon in map path", Op{Kind: OpMapDel, Path: "m;show info", Key: "k"}},
		{"bad mode", Op{Kind: OpBackendAdd, Backend: "b", Profile: "web", Mode: "udp"}},
		{"empty mode", Op{Kind: OpBackendAdd, Backend: "b", Profile: "web"}},
		{"unsafe guid", Op{Kind: OpBackendAdd, Backend: "b", Profile: "web", Mode: "http", GUID: "g g"}},
		{"bad state", Op{Kind: OpServerSetState, Backend: "b", Server: "s", State: "up"}},
		{"empty state", Op{Kind: OpServerSetState, Backend: "b", Server: "s"}},
		{"timeout_ms 0", Op{Kind: OpServerWaitRemovable, Backend: "b", Server: "s"}},
		{"timeout_ms 30001", Op{Kind: OpBackendWaitRemovable, Backend: "b", TimeoutMs: 30001}},
		{"nil weight", Op{Kind: OpServerSetWeight, Backend: "b", Server: "s"}},
		{"weight 257", Op{Kind: OpServerSetWeight, Backend: "b", Server: "s", Weight: intPtr(257)}},
		{"set addr port 70000", Op{Kind: OpServerSetAddr, Backend: "b", Server: "s", Address: "10.0.0.1", Port: 70000}},
		{"DEL byte in cert", Op{Kind: OpCRTListDel, Path: "l", Cert: "c\x7f"}},
		{"space in SNI filter", Op{Kind: OpCRTListAdd, Path: "l", Cert: "c", SNIFilters: []string{"a b"}}},
		{"unsafe crt-list option", Op{Kind: OpCRTListAdd, Path: "l", Cert: "c", Options: []KeywordArg{{Name: "alpn", Args: []string{"h2]"}}}}},
		{"unsafe cert path", Op{Kind: OpCertSet, Path: "certs/a b.pem"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := compileOp(&tt.op, contentOf(nil), payloadTerminator)
			if !errors.Is(err, errUnsafeToken) {
				t.Fatalf("err = %v, want errUnsafeToken", err)
			}
			if !strings.HasPrefix(err.Error(), "unsafe runtime token: ") {
				t.Errorf("err text = %q", err)
			}
		})
	}
	_, err := compileOp(&Op{Kind: OpServerAdd, Backend: "be;a", Server: "s", Address: "a"}, nil, payloadTerminator)
	if err == nil || err.Error() != `unsafe runtime token: backend "be;a"` {
		t.Errorf("err = %v", err)
	}
	_, err = compileOp(&Op{Kind: OpServerAdd, Server: "s", Address: "a"}, nil, payloadTerminator)
	if err == nil || err.Error() != `unsafe runtime token: backend is empty` {
		t.Errorf("err = %v", err)
	}
}

func TestCompileRefusesUnknownOpKind(t *testing.T) {
	_, err := compileOp(&Op{Kind: "backend_teleport", Backend: "b"}, nil, payloadTerminator)
	if !errors.Is(err, errUnknownOp) || err.Error() != `unknown op kind: "backend_teleport"` {
		t.Fatalf("err = %v", err)
	}
}

func TestCompileRefusesAnOversizedCommand(t *testing.T) {
	op := Op{Kind: OpMapSet, Path: "maps/host.map", Key: "k", Value: strings.Repeat("v", lineBudget)}
	_, err := compileOp(&op, nil, payloadTerminator)
	if err == nil || !strings.Contains(err.Error(), "line limit") {
		t.Fatalf("err = %v", err)
	}
	// Exactly at the budget is allowed.
	op.Value = strings.Repeat("v", lineBudget-len("set map maps/host.map k "))
	if _, err := compileOp(&op, nil, payloadTerminator); err != nil {
		t.Fatalf("a command of exactly %d bytes: %v", lineBudget, err)
	}
	// A payload over MaxPayloadBytes is refused too.
	big := "-----BEGIN CERTIFICATE-----\n" + strings.Repeat("A", MaxPayloadBytes) + "\n"
	_, err = compileOp(&Op{Kind: OpCertSet, Path: "c.pem"}, contentOf(map[string]string{"c.pem": big}), payloadTerminator)
	if err == nil || !strings.Contains(err.Error(), "payload limit") {
		t.Fatalf("oversized payload err = %v", err)
	}
}

func TestCompileRefusesAnEmptyPayload(t *testing.T) {
	for _, kind := range []string{OpCertSet, OpCertNew, OpCASet, OpCANew} {
		_, err := compileOp(&Op{Kind: kind, Path: "c.pem"}, contentOf(map[string]string{"c.pem": ""}), payloadTerminator)
		if !errors.Is(err, errUnsafeToken) || err.Error() != "unsafe runtime token: payload is empty" {
			t.Errorf("%s: err = %v", kind, err)
		}
	}
	// A file that cannot be read is an error, not an empty payload.
	if _, err := compileOp(&Op{Kind: OpCertSet, Path: "missing.pem"}, contentOf(nil), payloadTerminator); err == nil || errors.Is(err, errUnsafeToken) {
		t.Errorf("unreadable file: err = %v", err)
	}
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

func TestMapReplaceSendsTheEntriesNotTheFile(t *testing.T) {
	file := "# generated by haptic\n\nexample.com be-a\n\n# ingress/default\nb.example.com\tbe-b\nempty.example.com\n  spaced.example.com   a  b  \n"
	p, err := compileOp(&Op{Kind: OpMapReplace, Path: "m"}, contentOf(map[string]string{"m": file}), payloadTerminator)
	if err != nil {
		t.Fatal(err)
	}
	want := "example.com be-a\nb.example.com be-b\nempty.example.com \nspaced.example.com a  b\n"
	if got := mapReplaceBody(t, p); got != want {
		t.Errorf("payload = %q\nwant %q", got, want)
	}
}

func TestMapReplaceOfAnEmptyMapIsPrepareAndCommit(t *testing.T) {
	for _, file := range []string{"", "# only a comment\n\n"} {
		p, err := compileOp(&Op{Kind: OpMapReplace, Path: "m"}, contentOf(map[string]string{"m": file}), payloadTerminator)
		if err != nil {
			t.Fatal(err)
		}
		texts := []string{}
		for _, c := range p.Commands {
			texts = append(texts, c.Text)
		}
		if !slices.Equal(texts, []string{"prepare map m", "commit map @" + versionPlaceholder + " m"}) {
			t.Errorf("%q: commands %q", file, texts)
		}
	}
}

func TestAPayloadThatEndsItselfIsRefused(t *testing.T) {
	for _, pem := range []string{
		"-----BEGIN CERTIFICATE-----\nHAPTIC\n-----END CERTIFICATE-----\n",
		"-----BEGIN CERTIFICATE-----\r\nHAPTIC\r\n-----END CERTIFICATE-----\r\n",
		"-----BEGIN CERTIFICATE-----\nMIIB\nHAPTIC",
	} {
		_, err := compileOp(&Op{Kind: OpCertSet, Path: "c.pem"}, contentOf(map[string]string{"c.pem": pem}), payloadTerminator)
		if !errors.Is(err, errUnsafeToken) || !strings.Contains(err.Error(), "payload contains the terminator line") {
			t.Errorf("%q: err = %v", pem, err)
		}
	}
	// The terminator as part of a line is data.
	for _, pem := range []string{"HAPTIC \n", " HAPTIC\n", "HAPTICS\n"} {
		if _, err := compileOp(&Op{Kind: OpCertSet, Path: "c.pem"}, contentOf(map[string]string{"c.pem": pem}), payloadTerminator); err != nil {
			t.Errorf("%q: %v", pem, err)
		}
	}
}

func TestMapReplaceRefusesALineOverThePayloadLimit(t *testing.T) {
	file := "a 1\nlong " + strings.Repeat("x", MaxPayloadBytes) + "\nb 2\n"
	_, err := compileOp(&Op{Kind: OpMapReplace, Path: "m"}, contentOf(map[string]string{"m": file}), payloadTerminator)
	if !errors.Is(err, errUnsafeToken) {
		t.Fatalf("err = %v", err)
	}
	// A line of exactly MaxPayloadBytes (its '\n' included) travels.
	file = "k " + strings.Repeat("x", MaxPayloadBytes-3) + "\n"
	if _, err := compileOp(&Op{Kind: OpMapReplace, Path: "m"}, contentOf(map[string]string{"m": file}), payloadTerminator); err != nil {
		t.Fatalf("a line of exactly %d bytes: %v", MaxPayloadBytes, err)
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
		if (err != nil) != (term == "") || err != nil && !errors.Is(err, errUnsafeToken) {
			t.Errorf("%q: PEM with a blank line: err = %v", tt.version, err)
		}
	}
	for _, payload := range []string{"k v\n", "no final newline", "a\nb\n"} {
		for _, term := range []string{payloadTerminator, ""} {
			if got, want := framedLen("add map m", payload, term), len(frameCommand("add map m", payload, term)); got != want {
				t.Errorf("framedLen(%q, %q) = %d, rendered %d", payload, term, got, want)
			}
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
