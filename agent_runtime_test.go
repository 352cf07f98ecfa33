// Tests of the runtime layer's I/O: judging replies (tables, no socket),
// executing compiled lines, the reads, the master's show proc and reload,
// and the interactive worker session; then the benchmarks of the layer
// against a bare socket. Each socket test body runs on the fake HAProxy in
// its three dialects and, when HAPTIC_HAPROXY names a binary, on the real
// one. This file also holds the targets and helpers the deferred-delete
// tests share.
//
// It must never read back through the layer under test: a read-back goes
// through a raw socket of its own (target.show), so a bug in the layer
// cannot confirm itself.

package haptic

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Judging (unit).

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
		// Every verdict the layer relies on, judged through an anchor where it
		// has one.
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

// TestAnAnchoredCommandNeedsItsText pins the anchor check: a command with a
// success text takes the next segment, and a segment without that text is
// an unreadable answer even when HAProxy's level calls it a success. In
// each row the optional prefix cannot swallow the wrong segment: it took
// its own chatter, or the segment before holds the anchor's text.
func TestAnAnchoredCommandNeedsItsText(t *testing.T) {
	anchor := func(text string) command { return command{Text: text, Expect: "New server registered"} }
	U := errUnreadableResponse
	for _, tc := range []struct {
		name    string
		segs    []string
		cmds    []command
		want    []error
		outputs []string
	}{
		{"after the prefix's chatter, the anchor's own text",
			[]string{"[6]: experimental mode on", "[6]: New server registered."},
			[]command{anchor("add server be-a/s1")}, []error{nil},
			[]string{"[6]: New server registered."}},
		{"after the prefix's chatter, another text",
			[]string{"[6]: experimental mode on", "[6]: Server s1 is ready."},
			[]command{anchor("add server be-a/s1")}, []error{U},
			[]string{"[6]: Server s1 is ready."}},
		{"the second anchor answered with another text",
			[]string{"[6]: New server registered.", "[6]: Server s2 is ready."},
			[]command{anchor("add server be-a/s1"), anchor("add server be-a/s2")}, []error{nil, U},
			[]string{"[6]: New server registered.", "[6]: Server s2 is ready."}},
		{"an untagged answer without the text",
			[]string{"[6]: New server registered.", "Server s2 is ready."},
			[]command{anchor("add server be-a/s1"), anchor("add server be-a/s2")}, []error{nil, U},
			[]string{"[6]: New server registered.", "Server s2 is ready."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, outputs := matchSegments(tc.segs, append([]command{prefixEntry}, tc.cmds...))
			if !slices.Equal(errs[1:], tc.want) {
				t.Errorf("verdicts %v, want %v", errs[1:], tc.want)
			}
			if !slices.Equal(outputs[1:], tc.outputs) {
				t.Errorf("outputs %q, want %q", outputs[1:], tc.outputs)
			}
		})
	}
	// The same through a raw reply: the prefix commands are silent, so the
	// first segment is the first anchor's.
	cmds := []command{anchor("add server be-a/s1"), anchor("add server be-a/s2")}
	v := judgeLine([]byte("\n\n[6]: New server registered.\n\n[6]: Server s2 is ready.\n\n"), cmds)
	if v.Errs[0] != nil || !errors.Is(v.Errs[1], errUnreadableResponse) {
		t.Errorf("judgeLine: %v", v.Errs)
	}
}

// TestALevelThreeReplyIsARejection pins the severity rule: a reply tagged
// at level 0 to 3 is a refusal on its level alone, whatever its words; a
// level-4 reply is judged by its words.
func TestALevelThreeReplyIsARejection(t *testing.T) {
	texts := []string{"Require 'backend/server'.", "Only servers in maintenance mode can be deleted.", "Out of memory."}
	for _, text := range texts {
		for _, phrase := range rejectionPhrases {
			if strings.Contains(strings.ToLower(text), phrase) {
				t.Fatalf("%q holds the rejection phrase %q: the row would not test the level", text, phrase)
			}
		}
		if err := classify("[4]: " + text); err != nil {
			t.Errorf("classify([4]: %q) = %v, want nil", text, err)
		}
		for level := range 4 {
			seg := fmt.Sprintf("[%d]: %s", level, text)
			if err := classify(seg); err != errRejected {
				t.Errorf("classify(%q) = %v, want %v", seg, err, errRejected)
			}
			quiet := matchBatch([]string{seg}, []command{prefixEntry, {Text: "disable server be-a/s1"}})
			anchored := matchBatch([]string{seg}, []command{prefixEntry, {Text: "add server be-a/s1", Expect: "New server registered"}})
			if quiet[1] != errRejected || anchored[1] != errRejected {
				t.Errorf("%q: quiet %v, anchored %v, want %v", seg, quiet[1], anchored[1], errRejected)
			}
		}
	}
	// Through the runtime layer: the fake answers one command at level 3.
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	tg.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			return "Require 'backend/server'.", strings.HasPrefix(cmd, "disable server")
		}
	})
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"}}, nil), nil)
	if !errors.Is(err, errRejected) || len(results) != 1 || results[0].OK || results[0].Output != "[3]: Require 'backend/server'." {
		t.Errorf("err = %v, results %+v", err, results)
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
	// HAProxy's reply to two server adds, an enable and a disable (the two
	// prefix commands silent) is complete and all success.
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

// TestResponsesTakesExactlyOneResponsePerCommand: a read's reply is cut
// into responses only when it holds exactly one per command sent. One more
// (a listing whose empty line split it in two, a reply meant for another
// line) is as unreadable as one fewer: cutting it short would hand each
// command a response that may not be its own.
func TestResponsesTakesExactlyOneResponsePerCommand(t *testing.T) {
	raw := []byte("\n\nkey1 v1\n\nkey2 v2\n\n") // two silent prefix commands, two listings
	if got, err := responses(raw, 4); err != nil || len(got) != 4 || got[3] != "key2 v2\n\n" {
		t.Errorf("4 responses to 4 commands: %q, %v", got, err)
	}
	for _, k := range []int{3, 5} {
		if got, err := responses(raw, k); !errors.Is(err, errUnreadableResponse) || got != nil {
			t.Errorf("4 responses to %d commands: %q, %v; want %v", k, got, err, errUnreadableResponse)
		}
	}
}

// TestRoundTripCapsTheReply: a reply of exactly the cap is read whole; one
// byte more is refused after delivery, never cut into a shorter reply.
func TestRoundTripCapsTheReply(t *testing.T) {
	for _, size := range []int{maxRuntimeReplyBytes, maxRuntimeReplyBytes + 1} {
		r := newHAProxyRuntime(runtimeConfig{WorkerSocket: "worker.sock"})
		r.dial = func(context.Context, string, time.Time) (net.Conn, error) {
			agent, haproxy := net.Pipe()
			go func() {
				defer haproxy.Close()
				if _, err := io.ReadFull(haproxy, make([]byte, len("show map\n"))); err == nil {
					haproxy.Write(make([]byte, size))
				}
			}()
			return agent, nil
		}
		raw, delivered, err := r.roundTrip(t.Context(), r.WorkerSocket, "show map\n", time.Now().Add(time.Minute))
		if size == maxRuntimeReplyBytes && (err != nil || !delivered || len(raw) != size) {
			t.Errorf("a reply at the cap: %d bytes, delivered %v, %v", len(raw), delivered, err)
		}
		if size > maxRuntimeReplyBytes && (err == nil || err.Error() != "runtime socket: reply exceeds 67108864 bytes" || !delivered || raw != nil) {
			t.Errorf("a reply over the cap: %d bytes, delivered %v, %v", len(raw), delivered, err)
		}
	}
}

// TestJudgeLineTreatsAnIncompleteReplyAsUnknown: a reply is judged by its
// responses only when it holds exactly one whole response per command.
// Commands past the last whole response are outcome unknown, and a reply
// with more than that (a whole extra response, or every response whole and
// a cut-off tail) belongs to no command: every one of its commands is
// unknown, whatever its segments say.
func TestJudgeLineTreatsAnIncompleteReplyAsUnknown(t *testing.T) {
	cmds := []command{{Text: "disable server a/s1"}, {Text: "disable server a/s2"}, {Text: "disable server a/s3"}}
	U := errUnreadableResponse
	for _, tc := range []struct {
		name string
		raw  string
		want []error
		says string // what the unknown verdicts say
	}{
		{"cut after the prefix responses and the first command's", "\n\n\n", []error{nil, U, U}, "incomplete reply"},
		{"cut inside the prefix", "\n", []error{U, U, U}, "incomplete reply"},
		// "Too big" ends in one '\n': a partial tail, never success.
		{"too big", "\n\n\n[3]: The command is too big for the buffer size.\n", []error{errRejected, U, U}, ""},
		{"a whole extra response", "\n\n\n\n\n\n", []error{U, U, U}, "more responses than commands"},
		{"every response whole and a cut-off tail", "\n\n\n\n\n[3]: No such ser", []error{U, U, U}, "more responses than commands"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judgeLine([]byte(tc.raw), cmds)
			for i, want := range tc.want {
				if err := v.Errs[i]; !errors.Is(err, want) || want == nil && err != nil ||
					want == U && tc.says != "" && !strings.Contains(err.Error(), tc.says) {
					t.Errorf("command %d: %v, want %v (%s)", i, err, want, tc.says)
				}
			}
		})
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
		{"3.0 with old workers", showProc30, procList{Workers: []int{17607}, OldWorkers: []int{17546}}, ""},
		{"2.6", showProc26, procList{FailedReloads: 2, Workers: []int{18157}}, ""},
		{"with programs", strings.Replace(showProc26, "# programs\n", "# programs\n19000           dataplane       0               0d00h00m02s     -\nodd program row\n# old programs\n", 1),
			procList{FailedReloads: 2, Workers: []int{18157}}, ""},
		{"without programs (3.4)", strings.TrimSuffix(showProc26, "# programs\n"), procList{FailedReloads: 2, Workers: []int{18157}}, ""},
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
// Targets: the fake HAProxy in its dialects, and the real binary.

// runtimeTarget is what a "both" test needs from an HAProxy: its sockets
// and its version. *FakeHAProxy and *realHAProxy both satisfy it;
// read-backs go through a raw socket (target.show), never through the
// layer under test.
type runtimeTarget interface {
	WorkerSocket() string
	MasterSocket() string
	Version() string
}

// target is one HAProxy holding the runtime fixture: maps/host.map,
// certs/a.pem, certs/ca.pem, certs/list.txt, and backend be-a with srv1
// and srv-check.
type target struct {
	runtimeTarget
	fake *FakeHAProxy // nil on the real binary
	real *realHAProxy // nil on the fake
}

// runtimeFakeVersions are the fake's dialects the "both" tests run on.
var runtimeFakeVersions = []string{"3.4.3-1deb11u1", "3.0.11-1+deb13u4", "2.6.12-1+deb12u4"}

// dialectOf names the dialect of a version, by CapsFor's version rule:
// "3.4" from 3.4 on (dynamic backends), "3.0" from 3.0 (dynamic servers),
// "2.6" below.
func dialectOf(version string) string {
	switch caps := CapsFor(version, nil); {
	case caps.DynamicBackends:
		return "3.4"
	case caps.DynamicServers:
		return "3.0"
	}
	return "2.6"
}

func (tg *target) dialect() string { return dialectOf(tg.Version()) }

func (tg *target) requireDialect(t *testing.T, dialects ...string) {
	t.Helper()
	if !slices.Contains(dialects, tg.dialect()) {
		t.Skipf("needs dialect %v; %s is %s", dialects, tg.Version(), tg.dialect())
	}
}

// onFakes runs a "both" test body on each of the fake's dialects; the real
// half runs under TestRuntimeAgainstRealHAProxy.
func onFakes(t *testing.T, body func(t *testing.T, tg *target)) {
	for _, v := range runtimeFakeVersions {
		t.Run("fake-"+dialectOf(v), func(t *testing.T) { body(t, fakeTarget(t, v)) })
	}
}

func fakeTarget(t *testing.T, version string) *target {
	f := startTestFake(t, version)
	seedRuntimeFixture(t, f)
	return &target{runtimeTarget: f, fake: f}
}

// seedRuntimeFixture gives the fake what the real fixture's configuration
// loads, through the harness's own seeding.
func seedRuntimeFixture(t *testing.T, f *FakeHAProxy) {
	ca := newTestCA(t, "haptic fixture CA")
	cert, key := ca.issue(t, testCertOptions{CommonName: "a.example.com", DNSNames: []string{"a.example.com"}})
	fx := realFixture{certPEM: string(cert) + string(key), caPEM: string(ca.CertPEM), ca: ca}
	f.With(fx.seedFake)
}

// bothRuntimeTests are the runtime tests that must hold on the real binary
// as on the fake: each runs on the fake (TestX) and on the real binary
// (TestRuntimeAgainstRealHAProxy/TestX).
var bothRuntimeTests = []struct {
	name string
	run  func(t *testing.T, tg *target)
}{
	{"TestExecuteRunsTheOrderedCreateSequence", testExecuteRunsTheOrderedCreateSequence},
	{"TestExecuteReportsANameCollision", testExecuteReportsANameCollision},
	{"TestExecuteStopsAtTheFirstRejection", testExecuteStopsAtTheFirstRejection},
	{"TestExecuteBatchesCommandsWithinTheLineLimit", testExecuteBatchesCommandsWithinTheLineLimit},
	{"TestExecuteSwitchesAMapAtomically", testExecuteSwitchesAMapAtomically},
	{"TestACertificateWithABlankLineArrivesWhole", testACertificateWithABlankLineArrivesWhole},
	{"TestExecuteRepeatsMapDelUntilTheKeyIsGone", testExecuteRepeatsMapDelUntilTheKeyIsGone},
	{"TestExecuteAbortsACertTransactionOnFailure", testExecuteAbortsACertTransactionOnFailure},
	{"TestExecuteCommitsAValidCertificate", testExecuteCommitsAValidCertificate},
	{"TestExecuteReadsSetServerAddrByItsWords", testExecuteReadsSetServerAddrByItsWords},
	{"TestExecuteRefusesBackendOpsOn30", testExecuteRefusesBackendOpsOn30},
	{"TestAgentLimitsStayUnderHAProxyLimits", testAgentLimitsStayUnderHAProxyLimits},
	{"TestInfoReadsTheWorkerIdentity", testInfoReadsTheWorkerIdentity},
	{"TestShowProcAnswersOnTheMasterSocket", testShowProcAnswersOnTheMasterSocket},
	{"TestReloadReportsFailureWithHAProxysWords", testReloadReportsFailureWithHAProxysWords},
	{"TestReloadWithoutASuccessLine", testReloadWithoutASuccessLine},
	{"TestInventoryListsWhatTheWorkerLoaded", testInventoryListsWhatTheWorkerLoaded},
	{"TestInventoryReadsTheCAListing", testInventoryReadsTheCAListing},
	{"TestInventoryDeduplicatesTransactionRows", testInventoryDeduplicatesTransactionRows},
	{"TestReadBackSeesWhatTheOpsWrote", testReadBackSeesWhatTheOpsWrote},
}

func TestRuntimeAgainstRealHAProxy(t *testing.T) {
	for _, bt := range bothRuntimeTests {
		t.Run(bt.name, func(t *testing.T) {
			h := startRealHAProxy(t)
			bt.run(t, &target{runtimeTarget: h, real: h})
		})
	}
}

// newRuntime builds the layer for a target and reads the worker's identity,
// so payloads are framed for its version, as the agent does.
func (tg *target) newRuntime(t *testing.T, mutate func(*runtimeConfig)) *haproxyRuntime {
	t.Helper()
	cfg := runtimeConfig{WorkerSocket: tg.WorkerSocket(), MasterSocket: tg.MasterSocket(),
		IOTimeout: 10 * time.Second, ReloadTimeout: 20 * time.Second}
	if mutate != nil {
		mutate(&cfg)
	}
	r := newHAProxyRuntime(cfg)
	if _, err := r.info(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r
}

// compileAll compiles ops for the runtime's worker, reading files from a map.
func compileAll(t *testing.T, r *haproxyRuntime, ops []Op, files map[string]string) []program {
	t.Helper()
	programs := make([]program, len(ops))
	for i := range ops {
		p, err := compileOp(&ops[i], contentOf(files), r.terminator())
		if err != nil {
			t.Fatalf("compile %s: %v", ops[i].Kind, err)
		}
		programs[i] = p
	}
	return programs
}

// mustExecute runs ops and fails the test on any error.
func mustExecute(t *testing.T, r *haproxyRuntime, ops []Op, files map[string]string) []OpResult {
	t.Helper()
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, ops, files), nil)
	if err != nil {
		t.Fatalf("execute: %v (results %+v)", err, results)
	}
	return results
}

// show sends one command on a raw connection of its own, outside the layer
// under test, and returns the command's response without its framing.
func (tg *target) show(t *testing.T, cmd string) string {
	t.Helper()
	conn, err := net.Dial("unix", tg.WorkerSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, linePrefix+cmd+"\n"); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(strings.TrimPrefix(string(raw), "\n\n"), "\n")
}

// mapRows reads a map's entries in order through a raw socket.
func (tg *target) mapRows(t *testing.T, path string) []MapEntry {
	t.Helper()
	var rows []MapEntry
	for row := range strings.SplitSeq(tg.show(t, "show map "+path), "\n") {
		if row == "" {
			continue
		}
		f := strings.SplitN(row, " ", 3)
		if len(f) < 2 || !strings.HasPrefix(f[0], "0x") {
			t.Fatalf("show map %s: unexpected row %q", path, row)
		}
		e := MapEntry{Key: f[1]}
		if len(f) == 3 {
			e.Value = f[2]
		}
		rows = append(rows, e)
	}
	return rows
}

// serverRows reads "show servers state <be>" rows as name → fields.
func (tg *target) serverRows(t *testing.T, backend string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	for line := range strings.SplitSeq(tg.show(t, "show servers state "+backend), "\n") {
		if f := strings.Fields(line); len(f) >= 8 && !strings.HasPrefix(line, "#") {
			rows[f[3]] = f
		}
	}
	return rows
}

// lineRecorder sees every write and dial the layer makes.
type lineRecorder struct {
	mu     sync.Mutex
	dials  int
	writes []string
}

type recordingConn struct {
	net.Conn
	rec *lineRecorder
}

func (c *recordingConn) Write(b []byte) (int, error) {
	c.rec.mu.Lock()
	c.rec.writes = append(c.rec.writes, string(b))
	c.rec.mu.Unlock()
	return c.Conn.Write(b)
}

func recordLines(r *haproxyRuntime) *lineRecorder {
	rec := &lineRecorder{}
	dial := r.dial
	r.dial = func(ctx context.Context, path string, deadline time.Time) (net.Conn, error) {
		rec.mu.Lock()
		rec.dials++
		rec.mu.Unlock()
		conn, err := dial(ctx, path, deadline)
		if err != nil {
			return nil, err
		}
		return &recordingConn{Conn: conn, rec: rec}, nil
	}
	return rec
}

func (rec *lineRecorder) lines() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.writes)
}

func (rec *lineRecorder) dialCount() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.dials
}

// issuePEM returns a certificate with its key, PEM, and its serial as
// HAProxy prints it (upper-case hex of the serial's bytes).
func issuePEM(t *testing.T, cn string) (pemText string, serial string) {
	ca := newTestCA(t, "haptic test CA")
	cert, key := ca.issue(t, testCertOptions{CommonName: cn, DNSNames: []string{cn}})
	block, _ := pem.Decode(cert)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return string(cert) + string(key), strings.ToUpper(hex.EncodeToString(c.SerialNumber.Bytes()))
}

// ---------------------------------------------------------------------------
// Execute.

func TestExecuteRunsTheOrderedCreateSequence(t *testing.T) {
	onFakes(t, testExecuteRunsTheOrderedCreateSequence)
}

func testExecuteRunsTheOrderedCreateSequence(t *testing.T, tg *target) {
	tg.requireDialect(t, "3.4")
	r := tg.newRuntime(t, nil)
	mustExecute(t, r, []Op{
		{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http", GUID: "be-b-guid"},
		{Kind: OpServerAdd, Backend: "be-b", Server: "s1", Address: "10.0.0.1", Port: 8080, Keywords: []KeywordArg{{Name: "check"}}},
		{Kind: OpServerEnable, Backend: "be-b", Server: "s1", Health: true},
		{Kind: OpBackendPublish, Backend: "be-b"},
		{Kind: OpMapAdd, Path: "maps/host.map", Key: "new.example.com", Value: "be-b"},
	}, nil)
	if rows := tg.serverRows(t, "be-b"); rows["s1"] == nil || rows["s1"][6] != "0" {
		t.Errorf("be-b/s1 not enabled: %v", rows)
	}
	if rows := tg.mapRows(t, "maps/host.map"); !slices.Contains(rows, MapEntry{Key: "new.example.com", Value: "be-b"}) {
		t.Errorf("map rows %v", rows)
	}
	if f := tg.fake; f != nil {
		f.With(func(m *FakeModel) {
			be := m.Backends["be-b"]
			if be == nil || !be.Published || be.GUID != "be-b-guid" || be.Mode != "http" || len(be.Servers) != 1 ||
				!be.Servers[0].Enabled || !be.Servers[0].Health {
				t.Errorf("be-b = %+v", be)
			}
		})
	}
}

func TestExecuteReportsANameCollision(t *testing.T) { onFakes(t, testExecuteReportsANameCollision) }

func testExecuteReportsANameCollision(t *testing.T, tg *target) {
	tg.requireDialect(t, "3.4")
	r := tg.newRuntime(t, nil)
	add := []Op{{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http"}}
	mustExecute(t, r, add, nil)
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, add, nil), nil)
	if !errors.Is(err, errNameCollision) || results[0].OK || !strings.Contains(results[0].Output, "already used by other proxy") {
		t.Fatalf("err = %v, results %+v", err, results)
	}
	if f := tg.fake; f != nil && !slices.Equal(f.Backends(), []string{"be-a", "be-b"}) {
		t.Errorf("backends %v", f.Backends())
	}
}

func TestExecuteStopsAtTheFirstRejection(t *testing.T) {
	onFakes(t, testExecuteStopsAtTheFirstRejection)
}

func testExecuteStopsAtTheFirstRejection(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	ops := []Op{
		{Kind: OpServerAdd, Backend: "be-a", Server: "t1", Address: "10.0.0.1", Port: 80},
		{Kind: OpServerAdd, Backend: "be-a", Server: "srv1", Address: "10.0.0.1", Port: 80}, // exists
		{Kind: OpServerAdd, Backend: "be-a", Server: "t2", Address: "10.0.0.1", Port: 80},
		{Kind: OpMapAdd, Path: "maps/host.map", Key: "never.example.com", Value: "x"}, // a payload: a line of its own
	}
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, ops, nil), nil)
	if !errors.Is(err, errRejected) {
		t.Fatalf("err = %v", err)
	}
	if !results[0].OK || results[1].OK || results[2].OK {
		t.Errorf("results %+v", results)
	}
	if !strings.Contains(results[1].Output, "Already exists a server") {
		t.Errorf("output %q", results[1].Output)
	}
	if tg.serverRows(t, "be-a")["t1"] == nil {
		t.Error("the op before the failure did not run")
	}
	if rows := tg.mapRows(t, "maps/host.map"); len(rows) != 2 {
		t.Errorf("a line after the failure was sent: %v", rows)
	}
}

func TestExecuteBatchesCommandsWithinTheLineLimit(t *testing.T) {
	onFakes(t, testExecuteBatchesCommandsWithinTheLineLimit)
}

func testExecuteBatchesCommandsWithinTheLineLimit(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	rec := recordLines(r)
	ops := make([]Op, 400)
	for i := range ops {
		ops[i] = Op{Kind: OpServerAdd, Backend: "be-a", Server: fmt.Sprintf("bulk-server-%03d", i), Address: "10.0.0.1", Port: 8080,
			Keywords: []KeywordArg{{Name: "weight", Args: []string{"10"}}}}
	}
	mustExecute(t, r, ops, nil)
	lines := rec.lines()
	if len(lines) < 2 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, line := range lines {
		if len(line) > MaxCommandLineBytes || !strings.HasPrefix(line, linePrefix) || strings.Count(line, "\n") != 1 {
			t.Errorf("line of %d bytes", len(line))
		}
	}
	rows := tg.serverRows(t, "be-a")
	for _, op := range ops {
		if rows[op.Server] == nil {
			t.Fatalf("%s missing", op.Server)
		}
	}
}

func TestExecuteSwitchesAMapAtomically(t *testing.T) { onFakes(t, testExecuteSwitchesAMapAtomically) }

func testExecuteSwitchesAMapAtomically(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	var file strings.Builder
	var want []MapEntry
	for i := range 1500 {
		// Reverse order, so a sorted read-back would be caught.
		e := MapEntry{Key: fmt.Sprintf("h%04d.example.com", 1500-i), Value: fmt.Sprintf("be-%d", i%7)}
		want = append(want, e)
		fmt.Fprintf(&file, "%s %s\n", e.Key, e.Value)
	}
	mustExecute(t, r, []Op{{Kind: OpMapReplace, Path: "maps/host.map"}}, map[string]string{"maps/host.map": "# generated\n" + file.String()})
	if got := tg.mapRows(t, "maps/host.map"); !reflect.DeepEqual(got, want) {
		t.Errorf("map has %d entries, want %d in order", len(got), len(want))
	}
}

func TestACertificateWithABlankLineArrivesWhole(t *testing.T) {
	onFakes(t, testACertificateWithABlankLineArrivesWhole)
}

func testACertificateWithABlankLineArrivesWhole(t *testing.T, tg *target) {
	tg.requireDialect(t, "3.4", "3.0") // 2.6 frames with an empty line: compileOp refuses (TestPayloadFramingFollowsTheWorkerVersion)
	r := tg.newRuntime(t, nil)
	pemText, serial := issuePEM(t, "a.example.com")
	cert, key, _ := strings.Cut(pemText, "-----END CERTIFICATE-----\n")
	pemText = cert + "-----END CERTIFICATE-----\n\n" + key
	mustExecute(t, r, []Op{{Kind: OpCertSet, Path: "certs/a.pem"}}, map[string]string{"certs/a.pem": pemText})
	if f := tg.fake; f != nil {
		if got, _ := f.Cert("certs/a.pem"); got != pemText {
			t.Errorf("stored %q\nwant %q", got, pemText)
		}
		return
	}
	if out := tg.show(t, "show ssl cert certs/a.pem"); !strings.Contains(out, "Serial: "+serial) {
		t.Errorf("show ssl cert: %s\nwant serial %s", out, serial)
	}
}

func TestExecuteRepeatsMapDelUntilTheKeyIsGone(t *testing.T) {
	onFakes(t, testExecuteRepeatsMapDelUntilTheKeyIsGone)
}

func testExecuteRepeatsMapDelUntilTheKeyIsGone(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	dup := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "dup.example.com", Value: "x"}
	mustExecute(t, r, []Op{dup, dup, dup}, nil)
	rec := recordLines(r)
	mustExecute(t, r, []Op{{Kind: OpMapDel, Path: "maps/host.map", Key: "dup.example.com"}}, nil)
	calls := 0
	for _, line := range rec.lines() {
		if line == linePrefix+"del map maps/host.map dup.example.com\n" {
			calls++
		}
	}
	want := 2
	if tg.dialect() == "3.4" {
		want = 4
	}
	if calls != want {
		t.Errorf("%d del map calls, want %d", calls, want)
	}
	want2 := []MapEntry{{Key: "example.com", Value: "be-a"}, {Key: "b.example.com", Value: "be-b"}}
	if got := tg.mapRows(t, "maps/host.map"); !reflect.DeepEqual(got, want2) {
		t.Errorf("map %v", got)
	}
	// Deleting an absent key is the refusal.
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpMapDel, Path: "maps/host.map", Key: "dup.example.com"}}, nil), nil)
	if !errors.Is(err, errRejected) || results[0].OK || !strings.Contains(results[0].Output, "Key not found") {
		t.Errorf("absent key: %v %+v", err, results)
	}
}

func TestExecuteAbortsACertTransactionOnFailure(t *testing.T) {
	onFakes(t, testExecuteAbortsACertTransactionOnFailure)
}

func testExecuteAbortsACertTransactionOnFailure(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	rec := recordLines(r)
	pemText, _ := issuePEM(t, "a.example.com")
	certOnly, _, _ := strings.Cut(pemText, "-----BEGIN EC PRIVATE KEY-----")
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpCertSet, Path: "certs/a.pem"}}, map[string]string{"certs/a.pem": certOnly}), nil)
	if !errors.Is(err, errRejected) || results[0].OK {
		t.Fatalf("err = %v, results %+v", err, results)
	}
	lines := rec.lines()
	if last := lines[len(lines)-1]; last != linePrefix+"abort ssl cert certs/a.pem\n" {
		t.Errorf("last line %q", last)
	}
	// The transaction is closed: no '*' row remains.
	if out := tg.show(t, "show ssl cert"); strings.Contains(out, "*certs/a.pem") {
		t.Errorf("transaction still open:\n%s", out)
	}
}

func TestExecuteCommitsAValidCertificate(t *testing.T) {
	onFakes(t, testExecuteCommitsAValidCertificate)
}

func testExecuteCommitsAValidCertificate(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	pemText, serial := issuePEM(t, "n.example.com")
	mustExecute(t, r, []Op{{Kind: OpCertNew, Path: "certs/n.pem"}}, map[string]string{"certs/n.pem": pemText})
	if f := tg.fake; f != nil {
		if got, ok := f.Cert("certs/n.pem"); !ok || got != pemText {
			t.Errorf("stored %q", got)
		}
	}
	if out := tg.show(t, "show ssl cert certs/n.pem"); !strings.Contains(out, "Serial: "+serial) && tg.fake == nil {
		t.Errorf("show ssl cert: %s", out)
	}
	if out := tg.show(t, "show ssl cert"); !strings.Contains(out, "\ncerts/n.pem") {
		t.Errorf("listing:\n%s", out)
	}
}

func TestExecuteReadsSetServerAddrByItsWords(t *testing.T) {
	onFakes(t, testExecuteReadsSetServerAddrByItsWords)
}

func testExecuteReadsSetServerAddrByItsWords(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	for _, op := range []Op{
		{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2"},
		{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2", Port: 81},
		{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "10.0.0.2", Port: 81},
	} {
		mustExecute(t, r, []Op{op}, nil)
	}
	// HAProxy 3.0 and later apply a new address and port from a task of
	// their own, a moment after the command's answer: the row settles.
	waitFor(t, "srv1 at 10.0.0.2:81", func() bool {
		f := tg.serverRows(t, "be-a")["srv1"]
		return f[4] == "10.0.0.2" && f[18] == "81"
	})
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpServerSetAddr, Backend: "be-a", Server: "srv1", Address: "bogus"}}, nil), nil)
	if !errors.Is(err, errRejected) || !strings.Contains(results[0].Output, "Invalid addr") {
		t.Errorf("invalid address: %v %+v", err, results)
	}
}

func TestExecuteRefusesBackendOpsOn30(t *testing.T) { onFakes(t, testExecuteRefusesBackendOpsOn30) }

func testExecuteRefusesBackendOpsOn30(t *testing.T, tg *target) {
	tg.requireDialect(t, "3.0")
	r := tg.newRuntime(t, nil)
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpBackendAdd, Backend: "be-b", Profile: "web", Mode: "http"}}, nil), nil)
	if !errors.Is(err, errRejected) || results[0].OK || !strings.Contains(results[0].Output, "Unknown command") {
		t.Fatalf("err = %v, results %+v", err, results)
	}
	if out := tg.show(t, "show servers state be-b"); !strings.Contains(out, "Can't find backend") {
		t.Errorf("be-b exists: %s", out)
	}
}

func TestExecuteRefusesMoreThanMaxOps(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	before := len(tg.fake.Sent())
	programs := make([]program, MaxOpsPerApply+1)
	for i := range programs {
		programs[i] = program{Kind: OpServerDisable, Commands: []command{{Text: "disable server be-a/srv1"}}}
	}
	results, _, err := r.executeAs(t.Context(), programs, nil)
	if err == nil || err.Error() != "1001 ops exceed the 1000-op limit" || len(results) != len(programs) {
		t.Fatalf("err = %v", err)
	}
	if sent := tg.fake.Sent()[before:]; len(sent) != 0 {
		t.Errorf("sent %v", sent)
	}
}

func TestExecuteTreatsACutReplyAsUnknown(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	tg.fake.With(func(m *FakeModel) {
		m.CutReply = func(line string) (int, bool) { return 2, strings.Contains(line, "add server be-a/cut") }
	})
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{
		{Kind: OpServerAdd, Backend: "be-a", Server: "cut", Address: "10.0.0.1", Port: 80},
		{Kind: OpServerDisable, Backend: "be-a", Server: "cut"},
	}, nil), nil)
	if !errors.Is(err, errUnreadableResponse) || results[0].OK || results[1].OK {
		t.Fatalf("err = %v, results %+v", err, results)
	}
	if _, ok := tg.fake.Server("be-a", "cut"); !ok {
		t.Error("the command did not land in the model")
	}
}

// TestExecuteTreatsATailPastTheLastResponseAsUnknown: the fake refuses the
// second command of a line with a message of two paragraphs, and the
// connection is cut inside the second: the reply holds one whole response
// per command and a cut-off tail. Which command the refusal belongs to
// cannot be read from it, so neither op is judged, not even the first,
// whose silent success the refusal's first paragraph would otherwise be
// taken for.
func TestExecuteTreatsATailPastTheLastResponseAsUnknown(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	const refusal = "the first paragraph\n\nthe second paragraph"
	tg.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) { return refusal, cmd == "disable server be-a/srv2" }
		// The prefix and the first disable answer silently: "\n" each.
		whole := len("\n\n\n[3]: " + refusal + "\n\n")
		m.CutReply = func(line string) (int, bool) { return whole - 4, strings.Contains(line, "be-a/srv2") }
	})
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{
		{Kind: OpServerDisable, Backend: "be-a", Server: "srv1"},
		{Kind: OpServerDisable, Backend: "be-a", Server: "srv2"},
	}, nil), nil)
	if !errors.Is(err, errUnreadableResponse) || errors.Is(err, errRejected) || len(results) != 2 || results[0].OK || results[1].OK {
		t.Fatalf("err = %v, results %+v", err, results)
	}
}

func TestExecuteRetriesOnlyAConnectFailure(t *testing.T) {
	op := []Op{{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-z"}}
	t.Run("a listener appears within the pause", func(t *testing.T) {
		dir, err := os.MkdirTemp("", "hp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		r := newHAProxyRuntime(runtimeConfig{WorkerSocket: dir + "/haproxy-worker.sock", IOTimeout: 10 * time.Second})
		rec := recordLines(r)
		var fake *FakeHAProxy
		dial := r.dial
		r.dial = func(ctx context.Context, path string, deadline time.Time) (net.Conn, error) {
			conn, err := dial(ctx, path, deadline)
			if fake == nil {
				if err == nil {
					t.Error("the first dial found a listener")
				}
				var startErr error
				if fake, startErr = StartFakeHAProxy(dir, ""); startErr != nil {
					t.Fatal(startErr)
				}
				t.Cleanup(func() { fake.Close() })
				seedRuntimeFixture(t, fake)
			}
			return conn, err
		}
		programs := compileAll(t, r, op, nil)
		if _, _, err := r.executeAs(t.Context(), programs, nil); err != nil {
			t.Fatal(err)
		}
		if n := rec.dialCount(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
		if got := fake.MapEntries("maps/host.map"); got[0].Value != "be-z" {
			t.Errorf("map %v", got)
		}
	})
	t.Run("two dial failures", func(t *testing.T) {
		dir, err := os.MkdirTemp("", "hp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		r := newHAProxyRuntime(runtimeConfig{WorkerSocket: dir + "/haproxy-worker.sock"})
		rec := recordLines(r)
		results, _, err := r.executeAs(t.Context(), compileAll(t, r, op, nil), nil)
		if err == nil || !strings.HasPrefix(err.Error(), "runtime socket: ") || results[0].OK {
			t.Fatalf("err = %v, results %+v", err, results)
		}
		if n := rec.dialCount(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
	})
	t.Run("a connection closed after the write is not retried", func(t *testing.T) {
		tg := fakeTarget(t, "")
		r := tg.newRuntime(t, nil)
		rec := recordLines(r)
		tg.fake.With(func(m *FakeModel) {
			m.CutReply = func(line string) (int, bool) { return 0, strings.Contains(line, "set map") }
		})
		results, _, err := r.executeAs(t.Context(), compileAll(t, r, op, nil), nil)
		if !errors.Is(err, errUnreadableResponse) || results[0].OK {
			t.Fatalf("err = %v, results %+v", err, results)
		}
		if n := rec.dialCount(); n != 1 {
			t.Errorf("%d dials, want 1", n)
		}
		sent := 0
		for _, c := range tg.fake.Sent() {
			if strings.HasPrefix(c, "set map") {
				sent++
			}
		}
		if sent != 1 {
			t.Errorf("set map sent %d times", sent)
		}
	})
}

// TestARuntimeTransportErrorAfterTheWriteIsNotRetried pins the runtime
// layer's retry rule from the worker's side: once a line was written the
// worker may have run it, so a transport error while the reply is read (a
// reset, or the deadline) fails the op and the line is never sent again;
// only a failed dial is retried, once.
func TestARuntimeTransportErrorAfterTheWriteIsNotRetried(t *testing.T) {
	op := []Op{{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "be-z"}}
	for _, tc := range []struct {
		name  string
		serve func(conn net.Conn, done <-chan struct{})
		want  string // in the error
	}{
		// Closing with unread bytes makes the reader see a reset.
		{"reset after the worker read the line", func(conn net.Conn, _ <-chan struct{}) {
			conn.Read(make([]byte, 1))
			conn.Close()
		}, "connection reset by peer"},
		{"no reply within the deadline", func(conn net.Conn, done <-chan struct{}) {
			bufio.NewReader(conn).ReadString('\n')
			<-done // the worker never answers
			conn.Close()
		}, "i/o timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "hp")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			path := filepath.Join(dir, "w.sock")
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu       sync.Mutex
				accepted int
				wg       sync.WaitGroup
			)
			done := make(chan struct{})
			t.Cleanup(func() { close(done); ln.Close(); wg.Wait() })
			wg.Go(func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					accepted++
					mu.Unlock()
					wg.Go(func() { tc.serve(conn, done) })
				}
			})
			r := newHAProxyRuntime(runtimeConfig{WorkerSocket: path, IOTimeout: 200 * time.Millisecond})
			results, _, err := r.executeAs(t.Context(), compileAll(t, r, op, nil), nil)
			mu.Lock()
			n := accepted
			mu.Unlock()
			if n != 1 {
				t.Errorf("the worker accepted %d connections, want 1 (error %v)", n, err)
			}
			if err == nil || !strings.HasPrefix(err.Error(), "runtime socket: ") || !strings.Contains(err.Error(), tc.want) ||
				len(results) != 1 || results[0].OK {
				t.Errorf("err = %v, results %+v", err, results)
			}
		})
	}
}

func TestExecuteHonoursTheDeadline(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, func(c *runtimeConfig) { c.IOTimeout = 200 * time.Millisecond })
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	tg.fake.With(func(m *FakeModel) {
		m.Reject = func(cmd string) (string, bool) {
			if strings.HasPrefix(cmd, "set map") {
				<-release
			}
			return "", false
		}
	})
	results, _, err := r.executeAs(t.Context(), compileAll(t, r, []Op{{Kind: OpMapSet, Path: "maps/host.map", Key: "example.com", Value: "x"}}, nil), nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, errUnreadableResponse) || results[0].OK {
		t.Fatalf("err = %v, results %+v", err, results)
	}
}

func TestAgentLimitsStayUnderHAProxyLimits(t *testing.T) {
	onFakes(t, testAgentLimitsStayUnderHAProxyLimits)
}

func testAgentLimitsStayUnderHAProxyLimits(t *testing.T, tg *target) {
	// A map under a 255-byte path, loaded by the worker.
	longPath := "maps/" + strings.Repeat("l", MaxPathBytes-len("maps/")-len(".map")) + ".map"
	if tg.fake != nil {
		tg.fake.With(func(m *FakeModel) { m.Maps[longPath] = nil })
	} else {
		loadRealMap(t, tg, longPath)
	}
	r := tg.newRuntime(t, nil)
	rec := recordLines(r)

	// One chunk of exactly MaxPayloadBytes.
	var file strings.Builder
	var want []MapEntry
	for i := 0; file.Len() < MaxPayloadBytes-64; i++ {
		e := MapEntry{Key: fmt.Sprintf("k%05d", i), Value: strings.Repeat("v", 40)}
		want = append(want, e)
		fmt.Fprintf(&file, "%s %s\n", e.Key, e.Value)
	}
	pad := MaxPayloadBytes - file.Len() - len("kpad \n")
	want = append(want, MapEntry{Key: "kpad", Value: strings.Repeat("p", pad)})
	fmt.Fprintf(&file, "kpad %s\n", strings.Repeat("p", pad))
	if file.Len() != MaxPayloadBytes {
		t.Fatalf("body of %d bytes", file.Len())
	}
	mustExecute(t, r, []Op{{Kind: OpMapReplace, Path: longPath}}, map[string]string{longPath: file.String()})
	if got := tg.mapRows(t, longPath); !reflect.DeepEqual(got, want) {
		t.Errorf("long-path map has %d entries, want %d", len(got), len(want))
	}

	// A line filled to the budget, as an apply sends it (behind the read of
	// the worker's identity, the longest form): map_set on every key.
	var sets []Op
	for i := range want {
		sets = append(sets, Op{Kind: OpMapSet, Path: longPath, Key: want[i].Key, Value: fmt.Sprintf("set-%05d", i)})
		want[i].Value = fmt.Sprintf("set-%05d", i)
	}
	info, err := r.info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	before := len(rec.lines())
	if results, _, err := r.executeAs(t.Context(), compileAll(t, r, sets, nil), &info); err != nil {
		t.Fatalf("execute: %v (results %+v)", err, results)
	}
	longest := 0
	for _, line := range rec.lines()[before:] {
		longest = max(longest, len(line))
	}
	if longest > MaxCommandLineBytes || longest < MaxCommandLineBytes-len(longPath)-64 {
		t.Errorf("longest line %d bytes, want close to %d", longest, MaxCommandLineBytes)
	}
	if got := tg.mapRows(t, longPath); !reflect.DeepEqual(got, want) {
		t.Errorf("after map_set: %d entries differ", len(got))
	}
}

// loadRealMap makes the real worker load a map file under path: the file is
// written, a frontend that uses it is added and HAProxy reloaded.
func loadRealMap(t *testing.T, tg *target, path string) {
	t.Helper()
	dir := tg.real.Dir
	if err := os.WriteFile(filepath.Join(dir, path), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "\nfrontend long-map\n    bind unix@%s/long.sock\n    http-request set-var(txn.x) req.hdr(host),map(%s)\n", dir, path)
	f.Close()
	r := tg.newRuntime(t, nil)
	if log, err := r.reload(t.Context()); err != nil {
		t.Fatalf("reload: %v\n%s", err, log)
	}
	awaitWorkerAnswer(t, r)
}

// awaitWorkerAnswer polls show info until the (new) worker answers.
func awaitWorkerAnswer(t *testing.T, r *haproxyRuntime) HAProxyInfo {
	t.Helper()
	var err error
	for range 100 {
		var info HAProxyInfo
		if info, err = r.info(t.Context()); err == nil {
			return info
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the worker does not answer: %v", err)
	return HAProxyInfo{}
}

// ---------------------------------------------------------------------------
// Identity, master, reload.

func TestInfoReadsTheWorkerIdentity(t *testing.T) { onFakes(t, testInfoReadsTheWorkerIdentity) }

func testInfoReadsTheWorkerIdentity(t *testing.T, tg *target) {
	r := newHAProxyRuntime(runtimeConfig{WorkerSocket: tg.WorkerSocket()})
	rec := recordLines(r)
	info, err := r.info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !info.HasWorkerIdentity() || info.Version != tg.Version() || info.FullVersion != tg.Version() {
		t.Errorf("info %+v, version %q", info, tg.Version())
	}
	if f := tg.fake; f != nil && !f.Worker().SameWorker(info) {
		t.Errorf("info %+v, fake worker %+v", info, f.Worker())
	}
	if lines := rec.lines(); !slices.Equal(lines, []string{"set severity-output number;show info float\n"}) {
		t.Errorf("sent %q", lines)
	}
	if want := terminatorFor(tg.Version()); r.terminator() != want {
		t.Errorf("terminator %q, want %q", r.terminator(), want)
	}
}

func TestShowProcAnswersOnTheMasterSocket(t *testing.T) {
	onFakes(t, testShowProcAnswersOnTheMasterSocket)
}

func testShowProcAnswersOnTheMasterSocket(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	info, err := r.info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	procs, err := r.showProc(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if procs.FailedReloads != 0 || len(procs.Workers) != 1 || procs.Workers[0] != info.WorkerPID {
		t.Errorf("show proc %+v, worker %d", procs, info.WorkerPID)
	}
}

func TestMasterCommandsEndWithQuit(t *testing.T) {
	tg := fakeTarget(t, "")
	conn, err := net.Dial("unix", tg.MasterSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "show proc\n")
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	got, err := io.ReadAll(conn)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.HasPrefix(string(got), "#<PID>") {
		t.Fatalf("without quit: %q, %v (the master should keep the connection open)", got, err)
	}
	r := tg.newRuntime(t, func(c *runtimeConfig) { c.IOTimeout = 5 * time.Second })
	procs, err := r.showProc(t.Context())
	if err != nil || len(procs.Workers) != 1 {
		t.Fatalf("show proc: %+v, %v", procs, err)
	}
}

func TestReloadReportsFailureWithHAProxysWords(t *testing.T) {
	onFakes(t, testReloadReportsFailureWithHAProxysWords)
}

func testReloadReportsFailureWithHAProxysWords(t *testing.T, tg *target) {
	tg.requireDialect(t, "3.4", "3.0")
	r := tg.newRuntime(t, nil)
	before, err := r.info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	restore := breakConfig(t, tg)
	// 3.0's master logs its own verdict ("Loading failure!"); 3.4's relays
	// the new worker's startup log. Both carry the parser's words.
	log, err := r.reload(t.Context())
	if !errors.Is(err, errReloadRejected) || errors.Is(err, errReloadTimeout) || !strings.Contains(log, "Fatal errors found in configuration.") {
		t.Fatalf("failed reload: %v\n%s", err, log)
	}
	// The worker that keeps serving keeps the agent ready, although 3.4
	// then lists it as an old worker.
	if got, _, err := r.probe(t.Context()); err != nil || !got.SameWorker(before) {
		t.Fatalf("probe after the failed reload: %+v, %v", got, err)
	}
	restore()
	log, err = r.reload(t.Context())
	if err != nil || !strings.Contains(log, "Loading success.") || strings.HasPrefix(log, "Success=") {
		t.Fatalf("reload: %v\n%s", err, log)
	}
	after := awaitWorkerAnswer(t, r)
	if after.WorkerPID == before.WorkerPID {
		t.Errorf("worker pid unchanged: %d", after.WorkerPID)
	}
}

// breakConfig makes the next reload fail: ReloadFails on the fake, an
// unknown keyword in the real configuration. restore undoes it.
func breakConfig(t *testing.T, tg *target) (restore func()) {
	if f := tg.fake; f != nil {
		f.With(func(m *FakeModel) { m.ReloadFails = true })
		return func() { f.With(func(m *FakeModel) { m.ReloadFails = false }) }
	}
	cfg := filepath.Join(tg.real.Dir, "haproxy.cfg")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(slices.Clone(orig), "\nbogus_keyword here\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(cfg, orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReloadReportsABusyMaster(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	tg.fake.With(func(m *FakeModel) {
		m.ReloadFails = true
		m.ReloadLog = "Another reload is still in progress."
	})
	log, err := r.reload(t.Context())
	if !errors.Is(err, errReloadBusy) || errors.Is(err, errReloadRejected) || log != "Another reload is still in progress." {
		t.Fatalf("err = %v, log %q", err, log)
	}
}

func TestReloadWithoutASuccessLine(t *testing.T) { onFakes(t, testReloadWithoutASuccessLine) }

func testReloadWithoutASuccessLine(t *testing.T, tg *target) {
	tg.requireDialect(t, "2.6")
	r := tg.newRuntime(t, func(c *runtimeConfig) { c.ReloadTimeout = 5 * time.Second })
	before, err := r.info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if log, err := r.reload(t.Context()); err != nil || log != "" {
		t.Fatalf("reload: %v, log %q", err, log)
	}
	after := awaitWorkerAnswer(t, r)
	if after.SameWorker(before) {
		t.Errorf("no new worker: %+v", after)
	}
	restore := breakConfig(t, tg)
	log, err := r.reload(t.Context())
	if !errors.Is(err, errReloadRejected) || log != "reload failed: show proc failed count rose from 0 to 1" {
		t.Fatalf("failed reload: %v, log %q", err, log)
	}
	restore()
	f := tg.fake
	if f == nil {
		return
	}
	f.With(func(m *FakeModel) { m.ReloadHangs = true })
	r = tg.newRuntime(t, func(c *runtimeConfig) { c.ReloadTimeout = 300 * time.Millisecond })
	_, err = r.reload(t.Context())
	if !errors.Is(err, errReloadTimeout) || errors.Is(err, errReloadRejected) || !strings.Contains(err.Error(), "no new worker within") {
		t.Fatalf("hung reload: %v", err)
	}
}

func TestReloadThatHangs(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, func(c *runtimeConfig) { c.ReloadTimeout = 300 * time.Millisecond })
	before := tg.fake.Worker()
	tg.fake.With(func(m *FakeModel) { m.ReloadHangs = true })
	_, err := r.reload(t.Context())
	if !errors.Is(err, errReloadTimeout) || errors.Is(err, errReloadRejected) || !strings.Contains(err.Error(), "no reply within") {
		t.Fatalf("err = %v", err)
	}
	if after := tg.fake.Worker(); !after.SameWorker(before) {
		t.Errorf("worker changed: %+v", after)
	}
}

func TestStopMasterFailsAtTransport(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, func(c *runtimeConfig) { c.ConnectRetryPause = time.Millisecond })
	tg.fake.StopMaster()
	if _, err := r.showProc(t.Context()); err == nil || !strings.Contains(err.Error(), "runtime socket: ") {
		t.Errorf("show proc: %v", err)
	}
	_, err := r.reload(t.Context())
	if err == nil || !strings.Contains(err.Error(), "runtime socket: ") || errors.Is(err, errReloadRejected) || errors.Is(err, errReloadTimeout) {
		t.Errorf("reload: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Read-backs and inventory.

func TestInventoryListsWhatTheWorkerLoaded(t *testing.T) {
	onFakes(t, testInventoryListsWhatTheWorkerLoaded)
}

func testInventoryListsWhatTheWorkerLoaded(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	pemText, _ := issuePEM(t, "n.example.com")
	ca := newTestCA(t, "second CA")
	mustExecute(t, r, []Op{{Kind: OpCertNew, Path: "certs/n.pem"}, {Kind: OpCANew, Path: "certs/ca2.pem"}},
		map[string]string{"certs/n.pem": pemText, "certs/ca2.pem": string(ca.CertPEM)})
	_, inv, err := r.listWorker(t.Context(), 7, false)
	if err != nil {
		t.Fatal(err)
	}
	want := Inventory{Generation: 7, Maps: []string{"maps/host.map"}, Certs: []string{"certs/a.pem", "certs/n.pem"},
		CAFiles: []string{"certs/ca.pem", "certs/ca2.pem"}, CRLFiles: []string{}, CRTLists: []string{"certs/list.txt"}}
	if !reflect.DeepEqual(inv, want) {
		t.Errorf("inventory %#v\nwant %#v", inv, want)
	}
	if _, probed, err := r.probe(t.Context()); err != nil || probed.Generation != 1 || !slices.Equal(probed.Certs, want.Certs) {
		t.Errorf("probe: %+v, %v", probed, err)
	}
}

func TestInventoryReadsTheCAListing(t *testing.T) { onFakes(t, testInventoryReadsTheCAListing) }

func testInventoryReadsTheCAListing(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	if out := tg.show(t, "show ssl ca-file"); !strings.Contains(out, "certs/ca.pem - 1 certificate(s)") {
		t.Fatalf("listing:\n%s", out)
	}
	_, inv, err := r.listWorker(t.Context(), 1, false)
	if err != nil || !slices.Equal(inv.CAFiles, []string{"certs/ca.pem"}) {
		t.Errorf("CA files %v, %v", inv.CAFiles, err)
	}
}

func TestInventoryDeduplicatesTransactionRows(t *testing.T) {
	onFakes(t, testInventoryDeduplicatesTransactionRows)
}

func testInventoryDeduplicatesTransactionRows(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	pemText, _ := issuePEM(t, "a.example.com")
	open := program{Kind: OpCertSet, Terminator: r.terminator(),
		Commands: []command{{Text: "set ssl cert certs/a.pem", Payload: pemText, Expect: "transaction"}}}
	if _, _, err := r.executeAs(t.Context(), []program{open}, nil); err != nil {
		t.Fatal(err)
	}
	if out := tg.show(t, "show ssl cert"); !strings.Contains(out, "*certs/a.pem") {
		t.Fatalf("no transaction row:\n%s", out)
	}
	_, inv, err := r.listWorker(t.Context(), 1, false)
	if err != nil || !slices.Equal(inv.Certs, []string{"certs/a.pem"}) {
		t.Errorf("certs %v, %v", inv.Certs, err)
	}
}

func TestReadBackSeesWhatTheOpsWrote(t *testing.T) { onFakes(t, testReadBackSeesWhatTheOpsWrote) }

func testReadBackSeesWhatTheOpsWrote(t *testing.T, tg *target) {
	r := tg.newRuntime(t, nil)
	mustExecute(t, r, []Op{
		{Kind: OpMapAdd, Path: "maps/host.map", Key: "dup.example.com", Value: "a  b"},
		{Kind: OpMapAdd, Path: "maps/host.map", Key: "dup.example.com", Value: "c"},
		{Kind: OpMapAdd, Path: "maps/host.map", Key: "empty.example.com"},
		{Kind: OpServerAdd, Backend: "be-a", Server: "rb1", Address: "10.0.0.7", Port: 80},
	}, nil)
	entries, err := r.mapEntries(t.Context(), "maps/host.map")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"example.com": {"be-a"}, "b.example.com": {"be-b"}, "dup.example.com": {"a  b", "c"}, "empty.example.com": {""}}
	if !reflect.DeepEqual(entries, want) {
		t.Errorf("entries %q\nwant %q", entries, want)
	}
	names, err := r.serverNames(t.Context(), "be-a")
	if err != nil || !reflect.DeepEqual(names, map[string]struct{}{"srv1": {}, "srv-check": {}, "rb1": {}}) {
		t.Errorf("servers %v, %v", names, err)
	}
	if _, err := r.serverNames(t.Context(), "be-nope"); !errors.Is(err, errRejected) || !strings.Contains(err.Error(), "Can't find backend.") {
		t.Errorf("unknown backend: %v", err)
	}
	if _, err := r.mapEntries(t.Context(), "maps/nope.map"); !errors.Is(err, errRejected) || !strings.Contains(err.Error(), "Unknown map identifier") {
		t.Errorf("unknown map: %v", err)
	}
	n, err := r.frontendConnections(t.Context(), map[string]bool{"status": true})
	if err != nil {
		t.Errorf("frontend connections: %d, %v", n, err)
	}
}

func TestListingCaps(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	big := make([]MapEntry, MaxMapEntries+1)
	for i := range big {
		big[i] = MapEntry{Key: fmt.Sprintf("k%d", i), Value: "v"}
	}
	tg.fake.With(func(m *FakeModel) {
		for i := range MaxInventoryEntries + 1 {
			m.Certs[fmt.Sprintf("certs/c%05d.pem", i)] = "x"
		}
		m.Maps["maps/big.map"] = big
	})
	if _, _, err := r.listWorker(t.Context(), 1, false); !errors.Is(err, errTooManyEntries) {
		t.Errorf("4097 certificates: %v", err)
	}
	if _, err := r.mapEntries(t.Context(), "maps/big.map"); !errors.Is(err, errTooManyEntries) {
		t.Errorf("a map over MaxMapEntries: %v", err)
	}
	tg.fake.With(func(m *FakeModel) { m.Maps["maps/big.map"] = big[:MaxMapEntries] })
	if got, err := r.mapEntries(t.Context(), "maps/big.map"); err != nil || len(got) != MaxMapEntries {
		t.Errorf("a map of exactly MaxMapEntries: %d, %v", len(got), err)
	}
}

func TestReadsRequireACompleteReply(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	for keep := range 30 {
		tg.fake.With(func(m *FakeModel) {
			m.CutReply = func(line string) (int, bool) { return keep, strings.Contains(line, "show map maps/host.map") }
		})
		if got, err := r.mapEntries(t.Context(), "maps/host.map"); err == nil {
			t.Fatalf("cut at %d: read %v", keep, got)
		}
	}
}

// ---------------------------------------------------------------------------
// Interactive session.

func TestWorkerSessionAcknowledgesEachSetupCommand(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	rec := recordLines(r)
	s, err := r.openWorker(t.Context(), tg.fake.Worker())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []string{"prompt\n", "set severity-output number\n", "experimental-mode on\n", "show info float\n"}
	if got := rec.lines(); !slices.Equal(got, want) {
		t.Errorf("sent %q", got)
	}
	out, err := s.execute("show servers state be-a")
	if err != nil || !strings.Contains(out, "srv-check") {
		t.Errorf("command after setup: %q, %v", out, err)
	}
}

// scriptedWorker is a prompt-mode worker socket whose replies a test
// scripts: the setup commands and show info are answered as HAProxy does,
// every other command by reply, which may close the connection after its
// bytes.
func scriptedWorker(t *testing.T, info HAProxyInfo, reply func(cmd string) (out string, closeAfter bool)) string {
	dir, err := os.MkdirTemp("", "hp")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "w.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		os.RemoveAll(dir)
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				lines := bufio.NewScanner(conn)
				for lines.Scan() {
					out, closeAfter := "", false
					switch cmd := lines.Text(); cmd {
					case "prompt", "set severity-output number", "experimental-mode on":
						out = "\n> "
					case "show info float":
						out = fmt.Sprintf("Name: HAProxy\nVersion: 3.4.3\nPid: %d\nStart_time_sec: %d.%06d\n\n> ",
							info.WorkerPID, info.WorkerStartTimeUnixMicros/1e6, info.WorkerStartTimeUnixMicros%1e6)
					default:
						out, closeAfter = reply(cmd)
					}
					if _, err := io.WriteString(conn, out); err != nil || closeAfter {
						return
					}
				}
			})
		}
	})
	return path
}

func TestWorkerSessionRequiresACompleteBoundedReply(t *testing.T) {
	info := HAProxyInfo{WorkerPID: 42, WorkerStartTimeUnixMicros: 1_700_000_000_123_456}
	tests := []struct {
		name, reply string
		close       bool
		want, err   string
	}{
		{name: "silence", reply: "\n> ", want: ""},
		{name: "server deleted", reply: "[6]: Server deleted.\n\n> ", want: "[6]: Server deleted."},
		{name: "closed", close: true, err: "incomplete worker reply: EOF"},
		{name: "truncated", reply: "[6]: Server del", close: true, err: "incomplete worker reply: EOF"},
		{name: "different prompt", reply: "[6]: Done.\n\n123> ", err: "incomplete worker reply: "},
		{name: "oversized", reply: strings.Repeat("x", maxSessionReplyBytes+10) + "\n> ", err: "worker reply exceeds 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := scriptedWorker(t, info, func(string) (string, bool) { return tt.reply, tt.close })
			r := newHAProxyRuntime(runtimeConfig{WorkerSocket: path, SessionTimeout: 300 * time.Millisecond})
			s, err := r.openWorker(t.Context(), info)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, err := s.execute("del server be-a/s1")
			if tt.err == "" {
				if err != nil || got != tt.want {
					t.Errorf("got %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
				t.Errorf("got %q, %v; want error %q", got, err, tt.err)
			}
		})
	}
}

func TestWorkerSessionRefusesAnotherWorker(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	w := tg.fake.Worker()
	for _, expected := range []HAProxyInfo{
		{WorkerPID: w.WorkerPID + 1, WorkerStartTimeUnixMicros: w.WorkerStartTimeUnixMicros},
		{WorkerPID: w.WorkerPID, WorkerStartTimeUnixMicros: w.WorkerStartTimeUnixMicros + 1},
	} {
		if _, err := r.openWorker(t.Context(), expected); !errors.Is(err, errWorkerGone) {
			t.Errorf("expected %+v: %v", expected, err)
		}
	}
	if _, err := r.openWorker(t.Context(), HAProxyInfo{}); err == nil {
		t.Error("a session without an identity to bind to was opened")
	}
	ctx, cancel := context.WithCancel(t.Context())
	s, err := r.openWorker(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cancel()
	if _, err := s.execute("show servers state be-a"); !errors.Is(err, context.Canceled) {
		t.Errorf("after cancel: %v", err)
	}
}

func TestOldWorkerConnectionsAreDropped(t *testing.T) {
	tg := fakeTarget(t, "")
	r := tg.newRuntime(t, nil)
	s, err := r.openWorker(t.Context(), tg.fake.Worker())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tg.fake.With(func(m *FakeModel) { m.Pid++ })
	if _, err := s.execute("show servers state be-a"); err == nil || !strings.HasPrefix(err.Error(), "incomplete worker reply") {
		t.Errorf("err = %v", err)
	}
}

// ---------------------------------------------------------------------------
// Benchmarks against a real HAProxy (HAPTIC_HAPROXY): the layer's overhead
// over a bare socket exchange of the same bytes.

// rawExchange writes one line on a connection of its own and reads to EOF.
func rawExchange(b *testing.B, socket, line string) []byte {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, line); err != nil {
		b.Fatal(err)
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

func benchRuntime(b *testing.B) (*realHAProxy, *haproxyRuntime) {
	h := startRealHAProxy(b)
	r := newHAProxyRuntime(runtimeConfig{WorkerSocket: h.WorkerSocket(), MasterSocket: h.MasterSocket()})
	if _, err := r.info(b.Context()); err != nil {
		b.Fatal(err)
	}
	return h, r
}

func BenchmarkMapAddRoundTrip(b *testing.B) {
	_, r := benchRuntime(b)
	op := Op{Kind: OpMapAdd, Path: "maps/host.map", Key: "bench.example.com", Value: "be-a"}
	for b.Loop() {
		p, err := compileOp(&op, nil, r.terminator())
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := r.executeAs(b.Context(), []program{p}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMapAddRawSocket(b *testing.B) {
	h, r := benchRuntime(b)
	line := linePrefix + frameCommand("add map maps/host.map", "bench.example.com be-a\n", r.terminator())
	for b.Loop() {
		if raw := rawExchange(b, h.WorkerSocket(), line); string(raw) != "\n\n\n" {
			b.Fatalf("reply %q", raw)
		}
	}
}

// benchMapFile is a 10k-entry map file.
func benchMapFile() string {
	var file strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&file, "host-%05d.example.com backend-%d\n", i, i%50)
	}
	return file.String()
}

func BenchmarkMapReplace10k(b *testing.B) {
	_, r := benchRuntime(b)
	files := contentOf(map[string]string{"maps/host.map": benchMapFile()})
	op := Op{Kind: OpMapReplace, Path: "maps/host.map"}
	for b.Loop() {
		p, err := compileOp(&op, files, r.terminator())
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := r.executeAs(b.Context(), []program{p}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMapReplace10kRaw(b *testing.B) {
	h, r := benchRuntime(b)
	chunks, err := chunkLines(benchMapFile(), MaxPayloadBytes)
	if err != nil {
		b.Fatal(err)
	}
	term := r.terminator()
	for b.Loop() {
		raw := string(rawExchange(b, h.WorkerSocket(), linePrefix+"prepare map maps/host.map\n"))
		version := strings.TrimSpace(raw[strings.LastIndexByte(raw, ':')+1:])
		for _, chunk := range chunks {
			rawExchange(b, h.WorkerSocket(), linePrefix+frameCommand("add map @"+version+" maps/host.map", chunk, term))
		}
		rawExchange(b, h.WorkerSocket(), linePrefix+"commit map @"+version+" maps/host.map\n")
	}
}

// matchBatch judges the commands of one line against its segments;
// cmds[0] is the optional prefix entry.
func matchBatch(segments []string, cmds []command) []error {
	errs, _ := matchSegments(segments, cmds)
	return errs
}

func countResponses(raw []byte) (n int, partial bool) {
	ends, partial := responseEnds(raw)
	return len(ends), partial
}
