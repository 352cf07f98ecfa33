// This file tests the agent's defaults: DefaultAgentConfig is what NewAgent
// fills in, local paths resolve once, and the `haptic agent` default admin
// and drain socket names stay out of every manifest's reach, whatever
// sockets this agent binds.

package haptic

import (
	"net/http"
	"path/filepath"
	"reflect"
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

// DefaultAgentConfig is exactly what NewAgent gives an empty
// configuration (TestNewAgentFillsDefaults pins the values): the names and
// the reload timeout, and the drain's window; nothing that is off when
// empty.
func TestDefaultAgentConfigIsWhatNewAgentFillsIn(t *testing.T) {
	var filled AgentConfig
	fillAgentDefaults(&filled)
	quiet, maxWait, err := validateDrain(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	filled.DrainQuietPeriod, filled.DrainMaxWait = quiet, maxWait
	if got := DefaultAgentConfig(); !reflect.DeepEqual(got, filled) {
		t.Errorf("DefaultAgentConfig() =\n%+v\nNewAgent fills in\n%+v", got, filled)
	}
}

func TestResolvePaths(t *testing.T) {
	cfg := AgentConfig{BaseDir: "/srv/lb", ConfigFile: "conf/haproxy.cfg", MasterSocket: "run/master.sock",
		WorkerSocket: "/run/haproxy//worker.sock", StateFile: "./state/../agent.json", AdminSocket: "", DrainSocket: "drain.sock"}
	got, err := cfg.ResolvePaths()
	if err != nil {
		t.Fatal(err)
	}
	want := AgentConfig{BaseDir: "/srv/lb", ConfigFile: "conf/haproxy.cfg", MasterSocket: "/srv/lb/run/master.sock",
		WorkerSocket: "/run/haproxy/worker.sock", StateFile: "/srv/lb/agent.json", AdminSocket: "", DrainSocket: "/srv/lb/drain.sock"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ResolvePaths() =\n%+v\nwant\n%+v", got, want)
	}
	// Resolving again changes nothing: no base/base.
	if again, err := got.ResolvePaths(); err != nil || !reflect.DeepEqual(again, got) {
		t.Errorf("resolving twice: %+v %v", again, err)
	}
}

func TestARelativeBaseResolvesOnceAgainstTheWorkingDirectory(t *testing.T) {
	cfg := validTestConfig(t)
	parent, base := filepath.Split(cfg.BaseDir)
	t.Chdir(parent)
	cfg.BaseDir = base
	cfg.StateFile = "state.json"

	// What a caller resolves first, NewAgent resolves to the same files.
	resolved, err := cfg.ResolvePaths()
	if err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(parent, base)
	if want := filepath.Join(abs, "state.json"); resolved.StateFile != want {
		t.Errorf("ResolvePaths: state file %q, want %q", resolved.StateFile, want)
	}
	for _, c := range []AgentConfig{cfg, resolved} {
		a, err := NewAgent(c)
		if err != nil {
			t.Fatal(err)
		}
		a.close()
		if want := filepath.Join(abs, "haproxy-master.sock"); a.paths.master != want {
			t.Errorf("master socket %q, want %q", a.paths.master, want)
		}
		if want := filepath.Join(abs, "state.json"); a.paths.state != want {
			t.Errorf("state file %q, want %q", a.paths.state, want)
		}
		a.led.close()
	}
}
