// Tests, through the HTTP API, of what the agent does with an apply's file
// parts that are not what the manifest says: a part of any size whose
// bytes do not hash to the manifest's digest is refused and nothing is
// written, and a patch whose base the agent does not hold is asked for
// again, whole, in the 409 Missing answer.

package haptic

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestAPartOfAnySizeMustHashToItsDigest sends a new file whose part has the
// declared size but other bytes, once small enough to be built in memory
// and once large enough to be streamed to its temp file: both are refused
// with 400, and the tree, the state and the temp directory are as before.
func TestAPartOfAnySizeMustHashToItsDigest(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	const path, small, large = "files/blob.bin", 1 << 10, 200 << 10
	if small > maxInlineBytes || large <= maxInlineBytes {
		t.Fatalf("the sizes no longer straddle maxInlineBytes (%d)", maxInlineBytes)
	}
	for _, size := range []int{small, large} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			declared := strings.Repeat("a", size)
			sent := declared[:size-1] + "b"
			fs2 := fs.clone()
			fs2[path] = declared
			before := e.snapshot(t)
			code, body := e.c.post(applyRequest{manifest: e.c.manifest("plan-2", fs2), files: fs2, override: map[string]string{path: sent}})
			want := fmt.Sprintf(`part does not match its manifest digest: %q hashes to %s, manifest says %s`,
				path, DigestString(sent), DigestString(declared))
			if ae := applyErr(t, body); code != http.StatusBadRequest || ae.Stage != StageParts || ae.Message != want {
				t.Errorf("%d %+v, want 400 %q", code, ae, want)
			}
			e.unchanged(t, before)
		})
	}
}

// TestAPatchWhoseBaseIsGoneIsAskedForAgainWhole sends the config as a patch
// over a base the agent does not hold: because the file on disk was changed
// behind the agent's back, or because the patch names another base, even
// when the manifest's bytes are the ones the agent holds. Each is a 409
// Missing naming the path, with nothing written; the same manifest with
// the whole file then lands.
func TestAPatchWhoseBaseIsGoneIsAskedForAgainWhole(t *testing.T) {
	for _, tc := range []struct {
		name string
		// prepare changes what the agent holds and returns the render to
		// send and the base its patch names.
		prepare func(t *testing.T, e *testEnv, fs fileSet) (next fileSet, base string)
	}{
		{"the disk changed behind the agent", func(t *testing.T, e *testEnv, fs fileSet) (fileSet, string) {
			if err := os.WriteFile(filepath.Join(e.cfg.BaseDir, ConfigFilePath), []byte(fs[ConfigFilePath]+"# edited by hand\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			next := fs.clone()
			next[ConfigFilePath] += "# 2\n"
			return next, fs[ConfigFilePath]
		}},
		{"to the bytes the agent holds", func(t *testing.T, e *testEnv, fs fileSet) (fileSet, string) {
			return fs, strings.Replace(fs[ConfigFilePath], "maxconn 100", "maxconn 999", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, fs := landedEnv(t, nil, nil)
			next, base := tc.prepare(t, e, fs)
			m := reloadManifest(e, "plan-2", next)
			patch, repl := patchOf(base, next[ConfigFilePath])
			m.Files[slices.IndexFunc(m.Files, func(f ManifestFile) bool { return f.Path == ConfigFilePath })].Patch = patch
			omit := map[string]bool{"maps/host.map": true}
			before := e.snapshot(t)
			code, body := e.c.post(applyRequest{manifest: m, files: next, omit: omit, override: map[string]string{ConfigFilePath: repl}})
			var miss Missing
			if err := json.Unmarshal(body, &miss); code != http.StatusConflict || err != nil || !slices.Equal(miss.Missing, []string{ConfigFilePath}) {
				t.Fatalf("%d %s, want 409 missing [%s]", code, body, ConfigFilePath)
			}
			e.unchanged(t, before)

			for i := range m.Files {
				m.Files[i].Patch = nil
			}
			code, body = e.c.post(applyRequest{manifest: m, files: next, omit: omit})
			if code != http.StatusOK || !strings.Contains(string(body), `"ok":true`) {
				t.Fatalf("the whole file: %d %s", code, body)
			}
			if got := e.disk(t)[ConfigFilePath]; got != next[ConfigFilePath] {
				t.Errorf("config on disk %q, want %q", got, next[ConfigFilePath])
			}
		})
	}
}
