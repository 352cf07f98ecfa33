// Tests of the character rules a manifest path obeys at both ends of the
// wire (pathrules.go): control characters, bidirectional controls and
// invalid UTF-8 are refused by the client before sending and by the agent
// in validation with the same reason; ';' is refused in the paths HAProxy's
// runtime API names (maps, certificates, CA files, crt-lists) and allowed
// elsewhere; a body that is not multipart/form-data is refused; and an
// owned path that the rules now refuse is left on disk rather than deleted.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestPathCharacterRulesAtBothEnds: control characters, bidirectional
// controls and invalid UTF-8 are refused by the agent's path rules and by
// the client before it sends anything, with the same reason.
func TestPathCharacterRulesAtBothEnds(t *testing.T) {
	tests := []struct {
		rel, why string // why "" = accepted
	}{
		{"maps/a\nb.map", "contains a control character"},
		{"maps/a\rb.map", "contains a control character"},
		{"maps/a\tb.map", "contains a control character"},
		{"maps/a\x1bb.map", "contains a control character"},
		{"maps/a\x7fb.map", "contains a control character"},
		{"maps/a\u0085b.map", "contains a control character"},
		{"maps/a\u009fb.map", "contains a control character"},
		{"certs/gpj.\u202ecrt.pem", "contains a bidirectional control character"},
		{"maps/a\u202ab.map", "contains a bidirectional control character"},
		{"maps/a\u2066b.map", "contains a bidirectional control character"},
		{"maps/a\u2069b.map", "contains a bidirectional control character"},
		{"maps/a\u200eb.map", "contains a bidirectional control character"},
		{"maps/a\u200fb.map", "contains a bidirectional control character"},
		{"maps/a\u061cb.map", "contains a bidirectional control character"},
		{"maps/a\xffb.map", "is not valid UTF-8"},
		{"maps/a\xc3.map", "is not valid UTF-8"},
		{"maps/ünïcödé.map", ""},
		{"maps/日本.map", ""},
		{"maps/a\u00a0b.map", ""}, // no-break space: printable, not a control
		{"conf;d/x.lua", ""},      // ';' is a matter of the file kind, not of the path
		{"maps/a b.map", ""},
	}
	for _, tc := range tests {
		err := validatePath(tc.rel)
		cerr := checkManifestPath(tc.rel)
		if tc.why == "" {
			if err != nil || cerr != nil {
				t.Errorf("%q: agent %v, client %v; want both accepted", tc.rel, err, cerr)
			}
			continue
		}
		want := `invalid manifest path: ` + quote(tc.rel) + " " + tc.why
		if err == nil || err.Error() != want || !errors.Is(err, errInvalidPath) {
			t.Errorf("agent %q: %v, want %q", tc.rel, err, want)
		}
		if want := "agent client: file path " + quote(tc.rel) + " " + tc.why; cerr == nil || cerr.Error() != want {
			t.Errorf("client %q: %v, want %q", tc.rel, cerr, want)
		}
	}
}

// quote formats s as the error texts do.
func quote(s string) string { return fmt.Sprintf("%q", s) }

func TestRuntimePathKindsRefuseSemicolon(t *testing.T) {
	for _, kind := range []string{FileKindMap, FileKindCert, FileKindCA, FileKindCRTList} {
		err := checkRuntimePath(kind, "x/a;b")
		if err == nil || !errors.Is(err, errInvalidPath) || !strings.Contains(err.Error(), `"x/a;b" contains ';'`) {
			t.Errorf("kind %s: %v", kind, err)
		}
		if err := checkRuntimePath(kind, "x/a b"); err != nil {
			t.Errorf("kind %s, a space: %v", kind, err)
		}
	}
	for _, kind := range []string{FileKindConfig, FileKindGeneral} {
		if err := checkRuntimePath(kind, "x/a;b"); err != nil {
			t.Errorf("kind %s: %v", kind, err)
		}
	}
}

// TestApplyRefusesUnsafePathsAndNonFormBodies drives the agent: a newline,
// a bidi override or a map path with ';' is a 400 manifest answer and
// nothing moves; a general file with ';' lands; a multipart/mixed body is a
// 400 request answer naming multipart/form-data.
func TestApplyRefusesUnsafePathsAndNonFormBodies(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)

	refused := []struct {
		name, path, kind, want string
	}{
		{"newline", "maps/a\nb.map", FileKindMap, `invalid manifest path: "maps/a\nb.map" contains a control character`},
		{"bidi override", "certs/x\u202egpj.pem", FileKindCert, `invalid manifest path: "certs/x\u202egpj.pem" contains a bidirectional control character`},
		{"semicolon in a map", "maps/a;b.map", FileKindMap,
			`invalid manifest path: "maps/a;b.map" contains ';', which ends a runtime API command, and the path of a map file travels in runtime commands`},
		{"semicolon in a crt-list", "certs/a;b.crt-list", FileKindCRTList, `contains ';'`},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot(t)
			fs2 := fs.clone()
			fs2[tc.path] = "x y\n"
			m := e.c.manifest("plan-2", fs2)
			for i := range m.Files {
				if m.Files[i].Path == tc.path {
					m.Files[i].Kind = tc.kind
				}
			}
			code, body := e.c.post(applyRequest{manifest: m, files: fs2})
			if ae := applyErr(t, body); code != http.StatusBadRequest || ae.Stage != StageManifest || !strings.Contains(ae.Message, tc.want) {
				t.Errorf("got %d %+v, want 400 manifest %q", code, ae, tc.want)
			}
			e.unchanged(t, before)
		})
	}

	t.Run("semicolon in a general file", func(t *testing.T) {
		fs2 := fs.clone()
		fs2["lua/a;b.lua"] = "-- lua\n"
		res := e.c.apply(e.c.manifest("plan-3", fs2), fs2)
		if !res.OK {
			t.Fatalf("%+v", res)
		}
		if got := e.disk(t)["lua/a;b.lua"]; got != "-- lua\n" {
			t.Errorf("the file holds %q", got)
		}
		fs = fs2
	})

	t.Run("multipart/mixed", func(t *testing.T) {
		before := e.snapshot(t)
		fs2 := fs.clone()
		fs2["maps/host.map"] += "mixed.example be-m\n"
		body, ct := applyRequest{manifest: e.c.manifest("plan-4", fs2), files: fs2}.body(t)
		mixed := strings.Replace(ct, "multipart/form-data", "multipart/mixed", 1)
		code, _, b := e.c.do("POST", PathApply, body, mixed)
		ae := applyErr(t, b)
		if code != http.StatusBadRequest || ae.Stage != StageRequest || !strings.Contains(ae.Message, "multipart/form-data") {
			t.Errorf("got %d %+v", code, ae)
		}
		e.unchanged(t, before)
	})
}

// TestClientRefusesAControlCharacterBeforeSending: nothing reaches the
// agent when a path holds a newline.
func TestClientRefusesAControlCharacterBeforeSending(t *testing.T) {
	srv, log := startRecordingServer(t, answerJSON(http.StatusOK, testAck))
	c := newTestClient(t, srv.URL, nil)
	m := testManifest()
	m.Files[1].Path = "maps/host\n.map"
	_, err := c.Apply(context.Background(), m, nil, nil)
	if err == nil || err.Error() != `agent client: file path "maps/host\n.map" contains a control character` {
		t.Fatalf("Apply error %v", err)
	}
	if n := len(log.all()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

// TestEachEndKeepsItsOwnWordsAndOrder: one set of rules, read by the agent
// and by the client in their own words and order. Only the agent refuses a
// dot name other than "..", and a path that breaks two rules is refused
// for the one each end checks first.
func TestEachEndKeepsItsOwnWordsAndOrder(t *testing.T) {
	for _, tc := range []struct{ rel, agent, client string }{
		{".hidden/x.map", `invalid manifest path: ".hidden/x.map" has a component starting with a dot`, ""},
		{"maps/.x", `invalid manifest path: "maps/.x" has a component starting with a dot`, ""},
		{"../x", `invalid manifest path: "../x" has a component starting with a dot`, `agent client: file path "../x" escapes the base dir`},
		{"a//b\x00", `invalid manifest path: "a//b\x00" is not canonical`, `agent client: file path "a//b\x00" contains a NUL byte`},
		{"a/./b\n", `invalid manifest path: "a/./b\n" is not canonical`, `agent client: file path "a/./b\n" contains a control character`},
		{"/a", `invalid manifest path: "/a" is absolute`, `agent client: file path "/a" must be relative to the base dir`},
		{"", `invalid manifest path: "" is empty`, "agent client: manifest has an empty file path"},
	} {
		if err := validatePath(tc.rel); err == nil || err.Error() != tc.agent {
			t.Errorf("agent %q: %v, want %s", tc.rel, err, tc.agent)
		}
		err := checkManifestPath(tc.rel)
		if (tc.client == "" && err != nil) || (tc.client != "" && (err == nil || err.Error() != tc.client)) {
			t.Errorf("client %q: %v, want %q", tc.rel, err, tc.client)
		}
	}
}
