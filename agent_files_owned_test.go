// Tests that the agent's own paths in the base directory (its store
// directories, the state file, the plan blob) are really its own: a
// symbolic link, another kind of file or another owner is refused at
// startup, and nothing a planted link points to outside the base is ever
// deleted or chmodded, at startup or by a later sweep.

package haptic

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outsideDir is a directory outside the base holding one file, mode 0700:
// what a planted link would lead the agent to.
func outsideDir(t *testing.T) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "precious")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// checkOutsideUntouched fails the test if the agent deleted the outside
// file, changed the directory's mode or put anything beside the file.
func checkOutsideUntouched(t *testing.T, dir, file string) {
	t.Helper()
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("the outside file: %q, %v", b, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the outside directory's mode: %v, %v (want 0700)", fi.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the outside directory holds %d entries, want 1", len(entries))
	}
}

// TestTheAgentsOwnPathsMustBeRealAndItsOwn: a store directory, the state
// file or the plan blob replaced by a symbolic link, by another kind of
// file, or owned by another uid is refused at startup with an error naming
// the path, and nothing outside the base is deleted or chmodded.
func TestTheAgentsOwnPathsMustBeRealAndItsOwn(t *testing.T) {
	const otherUID = 54321
	tests := []struct {
		name  string
		path  string // relative to the base
		plant func(t *testing.T, p, outside, outsideFile string)
		want  string
	}{
		{"linked temp dir", storeTempDir, func(t *testing.T, p, outside, _ string) { symlink(t, outside, p) },
			"--base-dir: %s is a symbolic link"},
		{"linked backup dir", storeLinkDir, func(t *testing.T, p, outside, _ string) { symlink(t, outside, p) },
			"--base-dir: %s is a symbolic link"},
		{"linked state file", defaultStateFile, func(t *testing.T, p, _, outsideFile string) { symlink(t, outsideFile, p) },
			"--state-file: %s is a symbolic link"},
		{"linked plan blob", planBlobFile, func(t *testing.T, p, _, outsideFile string) { symlink(t, outsideFile, p) },
			"--state-file: %s is a symbolic link"},
		{"temp dir is a file", storeTempDir, func(t *testing.T, p, _, _ string) { writeFile(t, p, "x") },
			"--base-dir: %s is not a directory"},
		{"state file is a directory", defaultStateFile, func(t *testing.T, p, _, _ string) { mkdir(t, p) },
			"--state-file: %s is not a regular file"},
		{"temp dir of another user", storeTempDir, func(t *testing.T, p, _, _ string) { mkdir(t, p); chown(t, p, otherUID) },
			"--base-dir: %s is owned by uid 54321, not by the agent's uid"},
		{"backup dir of another user", storeLinkDir, func(t *testing.T, p, _, _ string) { mkdir(t, p); chown(t, p, otherUID) },
			"--base-dir: %s is owned by uid 54321, not by the agent's uid"},
		{"state file of another user", defaultStateFile, func(t *testing.T, p, _, _ string) { writeFile(t, p, "{}"); chown(t, p, otherUID) },
			"--state-file: %s is owned by uid 54321, not by the agent's uid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "another user") && os.Geteuid() != 0 {
				t.Skip("chown to another uid needs root")
			}
			cfg := validTestConfig(t)
			base, err := filepath.EvalSymlinks(cfg.BaseDir)
			if err != nil {
				t.Fatal(err)
			}
			outside, outsideFile := outsideDir(t)
			p := filepath.Join(base, tc.path)
			tc.plant(t, p, outside, outsideFile)
			err = newTestAgentOrError(t, cfg)
			want := strings.Replace(tc.want, "%s", p, 1)
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("NewAgent = %v\nwant an error starting %q", err, want)
			}
			checkOutsideUntouched(t, outside, outsideFile)
		})
	}
}

// TestTheSweepDoesNotFollowALinkPlantedAfterStartup: a temp directory
// swapped for a link once the store exists is not swept.
func TestTheSweepDoesNotFollowALinkPlantedAfterStartup(t *testing.T) {
	ts := newTestStore(t, nil)
	outside, outsideFile := outsideDir(t)
	tmp := filepath.Join(ts.dir, storeTempDir)
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	symlink(t, outside, tmp)
	err := ts.sweep(nil)
	if err == nil || !strings.Contains(err.Error(), tmp+" is a symbolic link") {
		t.Errorf("SweepTemp = %v", err)
	}
	checkOutsideUntouched(t, outside, outsideFile)
}

// TestAnExistingStoreDirIsKeptAndItsModeSet: the check does not refuse the
// agent's own directories from an earlier run, and still sets their mode.
func TestAnExistingStoreDirIsKeptAndItsModeSet(t *testing.T) {
	cfg := validTestConfig(t)
	for _, d := range []string{storeTempDir, storeLinkDir} {
		if err := os.Mkdir(filepath.Join(cfg.BaseDir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(cfg.BaseDir, defaultStateFile), "{}")
	if err := newTestAgentOrError(t, cfg); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{storeTempDir, storeLinkDir} {
		if fi, err := os.Stat(filepath.Join(cfg.BaseDir, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v", d, fi.Mode().Perm(), err)
		}
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Lchown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}
