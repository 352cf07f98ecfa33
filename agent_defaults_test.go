// This file tests what the agent reserves for the `haptic agent` defaults:
// the default admin and drain socket names stay out of every manifest's
// reach, whatever sockets this agent binds.

package haptic

import (
	"net/http"
	"testing"
)

func TestTheCommandsDefaultSocketNamesAreReserved(t *testing.T) {
	// The harness agent binds neither an admin nor a drain socket.
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	for _, name := range []string{"haptic-agent.sock", "haptic-drain.sock"} {
		t.Run(name, func(t *testing.T) {
			before := e.snapshot(t)
			next := fs.clone()
			next[name] = "not a socket\n"
			code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-2", next), files: next})
			want := `invalid manifest path: "` + name + `" is a reserved path`
			if ae := applyErr(t, body); code != http.StatusBadRequest || ae.Message != want {
				t.Fatalf("got %d %+v, want 400 %q", code, ae, want)
			}
			e.unchanged(t, before)
		})
	}
	// Another name beside them is an ordinary file.
	next := fs.clone()
	next["haptic-agent.sock.d/readme"] = "x\n"
	if res := e.c.apply(e.c.manifest("plan-3", next), next); !res.OK {
		t.Fatalf("an ordinary path: %+v", res)
	}
}
