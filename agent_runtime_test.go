// Tests of the HAProxy runtime layer and the deferred-delete queue
// (runtime.md §11, agent.md "Deferred deletes"). Pure decisions are tested
// with tables and no socket; the socket tests run on the fake HAProxy and,
// when HAPTIC_HAPROXY names a binary, on the real one.
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
	got := opKinds()
	if !slices.Equal(got, want) || len(got) != 24 {
		t.Fatalf("opKinds() = %v\nwant %v", got, want)
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
	// The framed size is bounded too.
	text := "add map " + strings.Repeat("p", 2000)
	err := checkCommand(command{Text: text, Payload: strings.Repeat("k v\n", 3000)}, payloadTerminator)
	if err == nil || !strings.Contains(err.Error(), "13312-byte framed limit") {
		t.Errorf("framed limit: err = %v", err)
	}
}

// ---------------------------------------------------------------------------
// Line building and judging (unit).

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

func TestSplitSegments(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\n\n\n", nil},
		{"\n\n[6]: New server registered.\n\n[6]: New server registered.", []string{"[6]: New server registered.", "[6]: New server registered."}},
		{"[3]: a\r\n\r\n[4]: b  \n", []string{"[3]: a", "[4]: b"}},
		{"\n\n\n[6]: Done.", []string{"[6]: Done."}},
		{"Committing certs/b.pem\nSuccess!", []string{"Committing certs/b.pem\nSuccess!"}},
		{"\n\n\n\n[5]: ok.\n\n\n\n[3]: no.", []string{"[5]: ok.", "[3]: no."}},
	}
	for _, tt := range tests {
		if got := splitSegments(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("splitSegments(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		segment, expect string
		want            error
	}{
		// Every row of runtime.md §4.5, judged through an anchor where it has one.
		{"[6]: New server registered.", "New server registered", nil},
		{"[3]: Already exists a server with the same name in backend.", "New server registered", errRejected},
		{"[4]: IP changed from '10.0.0.1' to '10.0.0.2', port changed from '80' to '81' by 'stats socket command'", "chang", nil},
		{"[4]: port changed from '80' to '81' by 'stats socket command'", "chang", nil},
		{"[4]: nothing changed", "chang", nil},
		{"[4]: Invalid addr 'bogus'", "chang", errRejected},
		{"[4]: problem converting port 'abc' to an int", "chang", errRejected},
		{"[6]: Unknown command: 'publish', but maybe one of the following ones is a better match:\n  add acl", "", errRejected},
		{"[3]: Wait delay expired.", "Done", errWaitExpired},
		{"backend 'be-a' name is already used by other proxy.", "New backend registered", errNameCollision},
		{"[3]: backend 'be-a' name is already used by other proxy.", "New backend registered", errNameCollision},
		{"[6]: backend 'be-a' name is already used by other proxy.", "New backend registered", errNameCollision},
		{"Committing certs/b.pem\nSuccess!", "Success!", nil},
		{"[3]: The transaction must contain at least a certificate and a private key!\nCan't commit certs/b.pem!", "Success!", errRejected},
		{"[5]: Entry 'certs/b.pem' deleted in crtlist 'certs/list.txt'!", "", nil},
		{"[3]: entry not found.", "", errRejected},
		{"[6]: Unknown command, but maybe one of the following ones is a better match:", "", errRejected},
		{"[6]: Wait delay expired.", "Done", errWaitExpired},
		{"[7]: anything at all", "", nil},
		{"[0]: emergency", "", errRejected},
	}
	for _, tt := range tests {
		if got := classify(tt.segment); tt.expect == "" && !errors.Is(got, tt.want) && got != tt.want {
			t.Errorf("classify(%q) = %v, want %v", tt.segment, got, tt.want)
		}
		c := command{Text: "cmd", Expect: tt.expect}
		errs := matchBatch([]string{tt.segment}, []command{prefixEntry, c})
		if errs[1] != tt.want {
			t.Errorf("%q with expect %q: %v, want %v", tt.segment, tt.expect, errs[1], tt.want)
		}
	}
	for _, phrase := range rejectionPhrases {
		for _, seg := range []string{"[4]: x " + phrase + " y", "x " + strings.ToUpper(phrase) + " y"} {
			if err := classify(seg); err == nil {
				t.Errorf("classify(%q) = nil, want a rejection", seg)
			}
		}
	}
	for _, seg := range []string{"[5]: plain text", "[6]: plain text", "[4]: plain text", "plain text"} {
		if err := classify(seg); err != nil {
			t.Errorf("classify(%q) = %v", seg, err)
		}
	}
	// Level 5..7 wins over phrases other than the three checked first.
	if err := classify("[5]: Transaction aborted for certificate 'x' - cannot"); err != nil {
		t.Errorf("[5] with a phrase: %v", err)
	}
}

func TestMatchBatch(t *testing.T) {
	quiet := func(text string) command { return command{Text: text} }
	anchor := func(text, expect string) command { return command{Text: text, Expect: expect} }
	U := errUnreadableResponse
	tests := []struct {
		name string
		segs []string
		cmds []command
		want []error
	}{
		{"silence is success", nil, []command{quiet("a"), quiet("b")}, []error{nil, nil}},
		{"optional prefix chatter is skipped", []string{"[6]: experimental mode on", "[6]: New server registered."},
			[]command{anchor("add", "New server registered")}, []error{nil}},
		{"prefix never takes the anchor's text", []string{"[6]: New server registered."},
			[]command{anchor("add", "New server registered")}, []error{nil}},
		{"prefix never takes an error", []string{"[3]: No such server."}, []command{quiet("disable")}, []error{errRejected}},
		{"quiet before an anchor", []string{"[6]: New server registered."},
			[]command{quiet("enable"), anchor("add", "New server registered")}, []error{nil, nil}},
		{"quiet refused before an anchor", []string{"[3]: No such server.", "[6]: New server registered."},
			[]command{quiet("enable"), anchor("add", "New server registered")}, []error{errRejected, U}},
		{"missing anchor", nil, []command{anchor("add", "New server registered")}, []error{U}},
		{"anchor without its text", []string{"[6]: something else"}, []command{anchor("add", "New server registered")}, []error{U}},
		{"failure then unreadable tail", []string{"[6]: New server registered.", "[3]: Already exists a server with the same name in backend."},
			[]command{anchor("add s1", "New server registered"), anchor("add s2", "New server registered"), quiet("enable"), anchor("add s3", "New server registered")},
			[]error{nil, errRejected, U, U}},
		{"warning anchored by words", []string{"[4]: nothing changed", "[4]: Invalid addr 'x'"},
			[]command{anchor("set addr", "chang"), anchor("set addr", "chang")}, []error{nil, errRejected}},
		{"quiet success with text", []string{"[5]: Entry 'c' deleted in crtlist 'l'!"}, []command{quiet("del crt")}, []error{nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := matchBatch(tt.segs, append([]command{prefixEntry}, tt.cmds...))
			if len(got) != len(tt.cmds)+1 {
				t.Fatalf("%d verdicts", len(got))
			}
			for i, want := range tt.want {
				if got[i+1] != want {
					t.Errorf("command %d: %v, want %v", i, got[i+1], want)
				}
			}
		})
	}
}

func TestCountResponses(t *testing.T) {
	tests := []struct {
		raw     string
		n       int
		partial bool
	}{
		{"\n\n[6]: New server registered.\n\n[6]: New server registered.\n\n\n\n", 6, false},
		{"\n\n[6]: New version created: 3\n\n", 3, false},
		{"\n\n[6]: New server registered.\n\n[6]: New ser", 3, true},
		{"\n\n[3]: The command is too big for the buffer size. Please change tune.bufsize in the configuration to use a bigger command.\n", 2, true},
		{"", 0, false},
		{"\n\n\n\n", 4, false},
		{"\n\nCommitting certs/b.pem\nSuccess!\n\n", 3, false},
	}
	for _, tt := range tests {
		n, partial := countResponses([]byte(tt.raw))
		if n != tt.n || partial != tt.partial {
			t.Errorf("countResponses(%q) = %d, %v; want %d, %v", tt.raw, n, partial, tt.n, tt.partial)
		}
	}
	// More responses than commands: judged unknown.
	v := judgeLine([]byte("\n\n\n\n"), []command{{Text: "disable server a/b"}})
	if !errors.Is(v.Errs[0], errUnreadableResponse) || !strings.Contains(v.Errs[0].Error(), "more responses than commands") {
		t.Errorf("extra response: %v", v.Errs[0])
	}
	// An empty reply (the connection closed before anything) is unknown.
	v = judgeLine(nil, []command{{Text: "disable server a/b"}})
	if !errors.Is(v.Errs[0], errUnreadableResponse) {
		t.Errorf("empty reply: %v", v.Errs[0])
	}
	// The exact reply of runtime.md §2.3 is complete and all success.
	cmds := []command{{Text: "add server be-a/s3 10.0.0.1:80", Expect: "New server registered"},
		{Text: "add server be-a/s4 10.0.0.1:80", Expect: "New server registered"},
		{Text: "enable server be-a/s3"}, {Text: "disable server be-a/s3"}}
	v = judgeLine([]byte(tests[0].raw), cmds)
	for i, err := range v.Errs {
		if err != nil {
			t.Errorf("command %d: %v", i, err)
		}
	}
}

func TestJudgeLineTreatsAnIncompleteReplyAsUnknown(t *testing.T) {
	cmds := []command{{Text: "disable server a/s1"}, {Text: "disable server a/s2"}, {Text: "disable server a/s3"}}
	// Cut after the prefix responses and the first command's.
	v := judgeLine([]byte("\n\n\n"), cmds)
	if v.Errs[0] != nil {
		t.Errorf("answered command: %v", v.Errs[0])
	}
	for i := 1; i < 3; i++ {
		if !errors.Is(v.Errs[i], errUnreadableResponse) || !strings.Contains(v.Errs[i].Error(), "incomplete reply") {
			t.Errorf("command %d after the cut: %v", i, v.Errs[i])
		}
	}
	// Cut inside the prefix: nothing is known.
	v = judgeLine([]byte("\n"), cmds)
	for i, err := range v.Errs {
		if !errors.Is(err, errUnreadableResponse) {
			t.Errorf("command %d: %v", i, err)
		}
	}
	// "Too big" ends in one '\n': a partial tail, never success.
	v = judgeLine([]byte("\n\n\n[3]: The command is too big for the buffer size.\n"), cmds)
	if v.Errs[0] == nil && v.Errs[1] == nil {
		t.Error("too big read as success")
	}
	if v.Errs[2] == nil {
		t.Error("command after too big read as success")
	}
}

func TestMapVersionCapture(t *testing.T) {
	capture := []command{{Text: "prepare map m", Capture: true, Expect: "version created"}}
	v := judgeLine([]byte("\n\n[6]: New version created: 3\n\n"), capture)
	if v.Errs[0] != nil || v.Version != "3" {
		t.Errorf("verdict %v, version %q", v.Errs[0], v.Version)
	}
	v = judgeLine([]byte("\n\n[6]: New version created: three\n\n"), capture)
	if !errors.Is(v.Errs[0], errUnreadableResponse) || v.Version != "" {
		t.Errorf("non-numeric: verdict %v, version %q", v.Errs[0], v.Version)
	}
	v = judgeLine([]byte("\n\n[6]: New version created: -1\n\n"), capture)
	if !errors.Is(v.Errs[0], errUnreadableResponse) {
		t.Errorf("negative: verdict %v", v.Errs[0])
	}
	for seg, want := range map[string]string{"[6]: New version created: 3": "3", "[6]: New version created: 18446744073709551615 ": "18446744073709551615"} {
		if got, ok := mapVersion(seg); !ok || got != want {
			t.Errorf("mapVersion(%q) = %q, %v", seg, got, ok)
		}
	}
	if _, ok := mapVersion("[6]: New version created: 18446744073709551616"); ok {
		t.Error("an overflowing version parsed")
	}
}

// statHeader is the start of HAProxy 3.0's show stat header: conn_tot is
// column 79.
const statHeader = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,"

func statRow(px, sv, connTot string) string {
	cells := make([]string, 84)
	cells[0], cells[1], cells[79] = px, sv, connTot
	return strings.Join(cells, ",")
}

func TestParseFrontendConnectionsSumsTrafficFrontends(t *testing.T) {
	text := strings.Join([]string{statHeader,
		statRow("status", "FRONTEND", "1000"),
		statRow("http-tcp", "FRONTEND", "17"),
		statRow("tls", "FRONTEND", "5"),
		statRow("idle", "FRONTEND", ""),
	}, "\n")
	got, err := parseFrontendConnections(text, map[string]bool{"status": true})
	if err != nil || got != 22 {
		t.Fatalf("got %d, %v; want 22", got, err)
	}
	got, err = parseFrontendConnections(text, nil)
	if err != nil || got != 1022 {
		t.Fatalf("without ignore: got %d, %v", got, err)
	}
	_, err = parseFrontendConnections(statHeader+"\n"+statRow("x", "FRONTEND", "12a"), nil)
	if err == nil || err.Error() != `show stat: conn_tot of x is not a number: "12a"` {
		t.Errorf("non-numeric: %v", err)
	}
}

func TestParseFrontendConnectionsLocatesTheColumnByHeader(t *testing.T) {
	cols := strings.Split(strings.TrimPrefix(statHeader, "# "), ",")
	if idx := slices.Index(cols, "conn_tot"); idx != 79 {
		t.Fatalf("conn_tot at %d in the real header", idx)
	}
	text := strings.Join([]string{statHeader,
		statRow("http-tcp", "FRONTEND", "3"),
		statRow("be-a", "BACKEND", "400"),
		statRow("be-a", "srv1", "400"),
	}, "\n")
	if got, err := parseFrontendConnections(text, nil); err != nil || got != 3 {
		t.Errorf("got %d, %v; want 3", got, err)
	}
	// Another layout: conn_tot at column 2.
	if got, err := parseFrontendConnections("# pxname,svname,conn_tot,\nfe,FRONTEND,9,\nbe,BACKEND,5,", nil); err != nil || got != 9 {
		t.Errorf("short layout: got %d, %v", got, err)
	}
}

func TestParseFrontendConnectionsRejectsAMissingHeader(t *testing.T) {
	for text, want := range map[string]string{
		"":                                   "show stat: missing CSV header",
		"pxname,svname,conn_tot\n":           "show stat: missing CSV header",
		"# pxname,svname,stot\nx,FRONTEND,1": "show stat: no conn_tot column",
	} {
		if _, err := parseFrontendConnections(text, nil); err == nil || err.Error() != want {
			t.Errorf("%q: err = %v, want %s", text, err, want)
		}
	}
}

const (
	showProc30 = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n" +
		"17361           master          3 [failed: 0]   0d00h00m28s     3.0.11-1+deb13u4\n" +
		"# workers\n" +
		"17607           worker          0               0d00h00m01s     3.0.11-1+deb13u4\n" +
		"# old workers\n" +
		"17546           worker          1               0d00h00m08s     3.0.11-1+deb13u4\n" +
		"# programs\n"
	showProc26 = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n" +
		"18020           master          1 [failed: 2]   0d00h00m04s     2.6.12-1+deb12u4\n" +
		"# workers\n" +
		"18157           worker          0               0d00h00m02s     2.6.12-1+deb12u4\n" +
		"# programs\n"
)

func TestParseShowProc(t *testing.T) {
	tests := []struct {
		name, text string
		want       procList
		err        string
	}{
		{"3.0 with old workers", showProc30, procList{MasterPID: 17361, Reloads: 3,
			Workers:    []procRow{{PID: 17607, Reloads: 0, Version: "3.0.11-1+deb13u4"}},
			OldWorkers: []procRow{{PID: 17546, Reloads: 1, Version: "3.0.11-1+deb13u4"}}}, ""},
		{"2.6", showProc26, procList{MasterPID: 18020, Reloads: 1, FailedReloads: 2,
			Workers: []procRow{{PID: 18157, Reloads: 0, Version: "2.6.12-1+deb12u4"}}}, ""},
		{"with programs", strings.Replace(showProc26, "# programs\n", "# programs\n19000           dataplane       0               0d00h00m02s     -\n# old programs\n", 1),
			procList{MasterPID: 18020, Reloads: 1, FailedReloads: 2,
				Workers: []procRow{{PID: 18157, Reloads: 0, Version: "2.6.12-1+deb12u4"}}}, ""},
		{"without programs (3.4)", strings.TrimSuffix(showProc26, "# programs\n"), procList{MasterPID: 18020, Reloads: 1, FailedReloads: 2,
			Workers: []procRow{{PID: 18157, Reloads: 0, Version: "2.6.12-1+deb12u4"}}}, ""},
		{"bad header", "PID type\n1 master 0 [failed: 0]\n", procList{}, `show proc: unexpected header "PID type"`},
		{"no master row", "#<PID>          <type>\n# workers\n1 worker 0 0d 3.0\n", procList{}, "show proc: no master row"},
		{"unreadable row", "#<PID>          <type>\nabc master 0 [failed: 0] 0d 3.0\n", procList{}, `show proc: unreadable row "abc master 0 [failed: 0] 0d 3.0"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseShowProc(trimReply(tt.text + "\n"))
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("err = %v, want %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestInfoRequiresCompleteWorkerIdentity(t *testing.T) {
	info := func(pid, start string) string {
		return "Name: HAProxy\nVersion: 3.0.11-1+deb13u4\nPid: " + pid + "\nUptime_sec: 4.39\nStart_time_sec: " + start
	}
	good := []struct {
		start string
		want  int64
	}{
		{"1796197563.683351", 1796197563683351},
		{"1796197563", 1796197563000000},
		{"1796197563.1", 1796197563100000},
		{"1796197563.683351999", 1796197563683351},
		{"0.000001", 1},
		{"9223372036854.775807", 9223372036854775807},
	}
	for _, tt := range good {
		got, err := parseWorkerInfo(info("17607", tt.start))
		if err != nil || got.WorkerStartTimeUnixMicros != tt.want || got.WorkerPID != 17607 ||
			got.Version != "3.0.11-1+deb13u4" || got.FullVersion != "3.0.11-1+deb13u4" {
			t.Errorf("start %q: %+v, %v", tt.start, got, err)
		}
	}
	badStart := []string{"", "-1", "0", "0.0", "1796197563.", "1796197563.1234567890", "17961975x3", "1.5e9", "9223372036854.775808", "99999999999999999999", " 1"}
	for _, start := range badStart {
		_, err := parseWorkerInfo(info("17607", start))
		if err == nil || !strings.HasPrefix(err.Error(), "show info: invalid worker start time") {
			if start == " 1" && err == nil {
				continue // the value is trimmed: " 1" is 1 second
			}
			t.Errorf("start %q: err = %v", start, err)
		}
	}
	for _, pid := range []string{"", "0", "-3", "abc", "99999999999999999999999"} {
		_, err := parseWorkerInfo(info(pid, "1796197563.683351"))
		if err == nil || err.Error() != "show info: missing or invalid worker identity" {
			t.Errorf("pid %q: err = %v", pid, err)
		}
	}
	if _, err := parseWorkerInfo("Name: HAProxy\nPid: 12\n"); err == nil || err.Error() != "show info: missing or invalid worker identity" {
		t.Errorf("missing start: err = %v", err)
	}
}

// ---------------------------------------------------------------------------
// Deferred deletes (unit).

func TestSplitSeparatesTheDeleteTail(t *testing.T) {
	ops := []Op{
		{Kind: OpBackendUnpublish, Backend: "be-b"},
		{Kind: OpServerDisable, Backend: "be-b", Server: "s1"},
		{Kind: OpServerWaitRemovable, Backend: "be-b", Server: "s1", TimeoutMs: 2000},
		{Kind: OpShutdownSessions, Backend: "be-b", Server: "s1"},
		{Kind: OpServerDel, Backend: "be-b", Server: "s1"},
		{Kind: OpBackendWaitRemovable, Backend: "be-b", TimeoutMs: 2000},
		{Kind: OpBackendDel, Backend: "be-b"},
		{Kind: OpMapSet, Path: "m", Key: "k", Value: "v"},
	}
	inline, servers, backends := splitDeletes(ops)
	if !reflect.DeepEqual(inline, []Op{ops[0], ops[1], ops[7]}) {
		t.Errorf("inline = %+v", inline)
	}
	if !reflect.DeepEqual(servers, []serverRef{{Backend: "be-b", Server: "s1"}}) {
		t.Errorf("servers = %+v", servers)
	}
	if !slices.Equal(backends, []string{"be-b"}) {
		t.Errorf("backends = %v", backends)
	}
	inline, servers, backends = splitDeletes(nil)
	if inline != nil || servers != nil || backends != nil {
		t.Errorf("empty split: %v %v %v", inline, servers, backends)
	}
}

func TestDeferralsRefuseMoreThanTheCap(t *testing.T) {
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), nil, nil)
	worker := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1}
	q.SetWorker(worker)
	servers := make([]serverRef, MaxPendingServerDeletes+1)
	for i := range servers {
		servers[i] = serverRef{Backend: "be", Server: fmt.Sprintf("s%d", i)}
	}
	backends := make([]string, MaxPendingBackendDeletes+1)
	for i := range backends {
		backends[i] = fmt.Sprintf("be%d", i)
	}
	if err := q.Check(servers, nil); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("1001 servers: %v", err)
	}
	if err := q.Check(nil, backends); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("101 backends: %v", err)
	}
	if err := q.Check(servers[:MaxPendingServerDeletes], backends[:MaxPendingBackendDeletes]); err != nil {
		t.Errorf("at the caps: %v", err)
	}
	// Queued items count: 1000 queued, then one more is refused.
	if err := q.Enqueue(worker, servers[:MaxPendingServerDeletes], nil); err != nil {
		t.Fatal(err)
	}
	if err := q.Check(servers[MaxPendingServerDeletes:], nil); !errors.Is(err, errDeferralOverflow) || err.Error() == "" {
		t.Errorf("1000 queued + 1: %v", err)
	}
	if err := q.Enqueue(worker, servers[MaxPendingServerDeletes:], nil); !errors.Is(err, errDeferralOverflow) {
		t.Errorf("enqueue 1000 queued + 1: %v", err)
	}
	// An item already pending is not added twice, and does not count twice.
	if err := q.Enqueue(worker, servers[:10], nil); err != nil {
		t.Errorf("re-enqueue of pending items: %v", err)
	}
	if got := len(q.Pending().Servers); got != MaxPendingServerDeletes {
		t.Errorf("%d pending", got)
	}
}

func TestDeferralsRefuseAnUnsafeName(t *testing.T) {
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), nil, nil)
	worker := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1}
	q.SetWorker(worker)
	for _, tt := range []struct {
		servers  []serverRef
		backends []string
	}{
		{[]serverRef{{Backend: "be-a", Server: "s1;del server be-a/s2"}}, nil},
		{[]serverRef{{Backend: "be a", Server: "s1"}}, nil},
		{[]serverRef{{Backend: "be-a"}}, nil},
		{nil, []string{"be;x"}},
		{nil, []string{""}},
	} {
		if err := q.Check(tt.servers, tt.backends); !errors.Is(err, errUnsafeToken) {
			t.Errorf("Check(%v, %v) = %v", tt.servers, tt.backends, err)
		}
		if err := q.Enqueue(worker, tt.servers, tt.backends); !errors.Is(err, errUnsafeToken) {
			t.Errorf("Enqueue(%v, %v) = %v", tt.servers, tt.backends, err)
		}
	}
	p := q.Pending()
	if p.Servers == nil || p.Backends == nil || len(p.Servers)+len(p.Backends) != 0 {
		t.Errorf("pending = %#v", p)
	}
}

func TestWorkerAdoptionDetectsTheSamePIDWithANewStartTime(t *testing.T) {
	var counted []string
	q := newDeleteQueue(newHAProxyRuntime(runtimeConfig{}), nil, func(kind, outcome string) { counted = append(counted, kind+":"+outcome) })
	old := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_000_000_000}
	q.SetWorker(old)
	if err := q.Enqueue(old, []serverRef{{Backend: "be-a", Server: "s1"}}, []string{"be-b"}); err != nil {
		t.Fatal(err)
	}
	q.SetWorker(old) // the same worker: nothing changes
	if p := q.Pending(); len(p.Servers) != 1 || len(p.Backends) != 1 {
		t.Fatalf("same worker dropped work: %+v", p)
	}
	reused := HAProxyInfo{WorkerPID: 1000, WorkerStartTimeUnixMicros: 1_700_000_001_000_000}
	q.SetWorker(reused)
	if p := q.Pending(); len(p.Servers)+len(p.Backends) != 0 {
		t.Errorf("a reused pid kept the old worker's work: %+v", p)
	}
	if !slices.Equal(counted, []string{"server:superseded", "backend:superseded"}) {
		t.Errorf("counted %v", counted)
	}
	if err := q.Enqueue(old, []serverRef{{Backend: "be-a", Server: "s2"}}, nil); !errors.Is(err, errWorkerGone) {
		t.Errorf("enqueue for the old start time: %v", err)
	}
	if err := q.Enqueue(reused, []serverRef{{Backend: "be-a", Server: "s2"}}, nil); err != nil {
		t.Errorf("enqueue for the new worker: %v", err)
	}
}
