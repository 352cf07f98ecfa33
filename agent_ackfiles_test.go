// This file owns the promise of an ACK to whoever reads the disk: when the
// agent answers ok, every file of the apply is in the tree, for a runtime,
// a file_only and a noop apply alike, on the fake and on real HAProxy. The
// renames are slowed down on purpose, so that an answer sent before them
// is seen every time, not once in a while.

package haptic

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// applyCountForTheACKRead is how many applies each run reads behind: a
// quarter of each kind.
const applyCountForTheACKRead = 204

// slowTreeRenames is a disk whose renames into the tree (not the agent's
// own dot-prefixed directories) take a millisecond longer: an apply that
// answered before them would be caught by the very next read.
func slowTreeRenames() *hookDisk {
	d := &hookDisk{}
	d.setHook(func(op diskOp) error {
		if (op.Op == "rename" || op.Op == "exchange") && !strings.Contains(op.Path, "/.") {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	return d
}

func TestFilesAreInPlaceAtTheACK(t *testing.T) {
	e := newTestEnvWithDisk(t, slowTreeRenames(), nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	readEveryFileAfterEachACK(t, e.c, e.cfg.BaseDir, fs)
}

func TestRealFilesAreInPlaceAtTheACK(t *testing.T) {
	e := startRealLedgerEnv(t, 10*time.Second)
	e.stopAgent()
	e.a, e.stop = launchAgentWith(t, e.cfg, agentOptions{disk: slowTreeRenames()}, nil, true)
	e.c = newAgentClient(t, e.a)
	e.land(t, "plan-1", e.fs)
	readEveryFileAfterEachACK(t, e.c, e.cfg.BaseDir, e.fs)
}

// readEveryFileAfterEachACK sends a runtime apply that adds a map entry,
// a file_only, a noop, and a runtime apply that deletes the entry again in
// turn, and reads every file of each from the disk as soon as its answer is
// decoded. The file_only apply changes a file larger than a record carries
// inline, so that the staged temp file's rename is read behind too; the
// delete writes a map shorter than the version its install displaces last,
// whose file it reuses.
func readEveryFileAfterEachACK(t *testing.T, c *agentClient, base string, fs fileSet) {
	t.Helper()
	for i := range applyCountForTheACKRead {
		id := fmt.Sprintf("ack-%d", i)
		var res ApplyResult
		want := ResultRuntime
		switch i % 4 {
		case 0:
			var op Op
			fs, op = mapEntryChange(fs, fmt.Sprintf("k%d.example", i), "be-a")
			res = c.apply(c.manifest(id, fs, op), fs)
		case 1:
			fs = fs.clone()
			fs["notes/big.txt"] = strings.Repeat(fmt.Sprintf("%d\n", i), maxInlineBytes/2)
			want, res = ResultFileOnly, c.apply(c.manifest(id, fs), fs)
		case 2:
			// Every file is held with its proof: no part travels.
			omit := map[string]bool{}
			for p := range fs {
				omit[p] = true
			}
			m := c.manifest(id, fs)
			code, b := c.post(applyRequest{manifest: m, files: fs, omit: omit})
			if code != 200 || json.Unmarshal(b, &res) != nil {
				t.Fatalf("apply %d: %d %s", i, code, b)
			}
			want = ResultNoop
		case 3:
			key := fmt.Sprintf("k%d.example", i-3)
			fs = fs.clone()
			fs["maps/host.map"] = strings.Replace(fs["maps/host.map"], key+" be-a\n", "", 1)
			res = c.apply(c.manifest(id, fs, Op{Kind: OpMapDel, Path: "maps/host.map", Key: key}), fs)
		}
		if !res.OK || res.Mode != want || res.Error != nil {
			t.Fatalf("apply %d: want an ok %s without error, got %s", i, want, jsonOf(res))
		}
		for p, content := range fs {
			b, err := os.ReadFile(filepath.Join(base, p))
			if err != nil || string(b) != content {
				t.Fatalf("apply %d (%s): right after its ACK %s holds %d bytes (%v), want the apply's %d", i, want, p, len(b), err, len(content))
			}
		}
	}
}
