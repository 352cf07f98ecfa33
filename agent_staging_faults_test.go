// Tests of how a staging failure is answered: a fault of the agent's own
// disk (full, read-only, immutable, no permission, an I/O error) is a
// server error, 507 when the disk is full and 500 otherwise, with the cause
// in the message, while a bad body stays the client's 400; the package's
// Client reports it as a server fault. One test makes a real kernel refuse
// staging on a tmpfs in a private mount namespace, and skips where it
// cannot make one.

package haptic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

func TestStagingStatusTellsTheAgentsFaultFromTheClients(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"disk full", diskFault("a", &os.PathError{Op: "write", Path: "/b/.haptic-tmp/part-1", Err: syscall.ENOSPC}), 507},
		{"quota", diskFault("a", &os.PathError{Op: "write", Path: "/b/.haptic-tmp/part-1", Err: syscall.EDQUOT}), 507},
		{"read-only", diskFault("a", &os.PathError{Op: "open", Path: "/b/.haptic-tmp/part-1", Err: syscall.EROFS}), 500},
		{"immutable", diskFault("a", &os.PathError{Op: "open", Path: "/b/.haptic-tmp/part-1", Err: syscall.EPERM}), 500},
		{"permission", diskFault("a", &os.PathError{Op: "open", Path: "/b/.haptic-tmp/part-1", Err: syscall.EACCES}), 500},
		{"I/O error", diskFault("a", &os.PathError{Op: "fsync", Path: "/b/.haptic-tmp/part-1", Err: syscall.EIO}), 500},
		{"wrapped once more", fmt.Errorf("staging: %w", diskFault("a", syscall.ENOSPC)), 507},
		{"digest mismatch", fmt.Errorf("%w: %q hashes to x", errDigestMismatch, "a"), 400},
		{"body too large", &http.MaxBytesError{Limit: MaxApplyBodyBytes}, 400},
		{"body cut short", io.ErrUnexpectedEOF, 400},
		// ENOSPC that is not the staging disk's (it came with the client's
		// body, say) is not the agent's fault by itself.
		{"unmarked errno", syscall.ENOSPC, 400},
	}
	for _, tc := range tests {
		if got := stagingStatus(tc.err); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestAStagingFaultIsAServerErrorEndToEnd breaks the agent's staging
// directory (a regular file where .haptic-tmp should be), which works on
// any machine and as any user: the apply of a part too large to ride in
// the record (so staged in a temp file) is answered 500 with a message
// naming the cause, the client sees a server fault, and nothing moves.
func TestAStagingFaultIsAServerErrorEndToEnd(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	before := e.snapshot(t)

	tmp := filepath.Join(e.a.files.base, storeTempDir)
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	writeFile(t, tmp, "not a directory")

	fs2 := fs.clone()
	fs2["maps/host.map"] += strings.Repeat("b.example be-b\n", maxInlineBytes/15+1)
	he := clientApply(t, e, "plan-2", fs2)
	if he.Status != http.StatusInternalServerError || !he.ServerFault() {
		t.Fatalf("got %+v, want a 500 server fault", he)
	}
	want := `{"stage":"parts","message":"cannot stage \"maps/host.map\": the agent's disk failed: open ` + tmp
	if !strings.HasPrefix(he.Body, want) || !strings.HasSuffix(he.Body, `: not a directory"}`) {
		t.Errorf("body %s\nwant it to start %s", he.Body, want)
	}
	if got := metricValue(e.a, "apply_rejected_total", StageParts); got != 1 {
		t.Errorf("apply_rejected_total{stage=parts} = %d", got)
	}
	e.unchanged(t, before)
}

// clientApply applies fs as planID through the package's Client, sending
// every part, and returns the *HTTPError it must fail with.
func clientApply(t *testing.T, e *testEnv, planID string, fs fileSet) *HTTPError {
	t.Helper()
	c, err := NewClient(&ClientConfig{BaseURL: "http://" + e.a.Addr(), Username: "haptic", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	parts := map[string]io.Reader{}
	for p, content := range fs {
		parts[p] = strings.NewReader(content)
	}
	_, err = c.Apply(context.Background(), e.c.manifest(planID, fs), parts, nil)
	var he *HTTPError
	if !errors.As(err, &he) {
		t.Fatalf("Apply = %v, want an *HTTPError", err)
	}
	return he
}

func TestHTTPErrorServerFault(t *testing.T) {
	for status, want := range map[int]bool{500: true, 503: true, 507: true, 599: true, 400: false, 401: false, 404: false, 409: false, 302: false} {
		if got := newHTTPError(status, nil).ServerFault(); got != want {
			t.Errorf("%d: ServerFault() = %v, want %v", status, got, want)
		}
	}
}

// mountNamespaceEnv marks the child process of
// TestStagingFaultsOnARealFilesystem, which runs in its own mount
// namespace.
const mountNamespaceEnv = "HAPTIC_TEST_IN_MOUNT_NAMESPACE"

// TestStagingFaultsOnARealFilesystem puts the base directory on a tiny
// tmpfs in a private mount namespace and makes the kernel refuse staging
// for real: a full disk is 507, a read-only staging directory (its own
// read-only mount) and an immutable one are 500, each with the kernel's
// reason in the message, and the agent applies again once the disk is
// repaired. It re-runs itself as a child process in a new mount namespace,
// and skips where the machine cannot make one or mount a tmpfs.
func TestStagingFaultsOnARealFilesystem(t *testing.T) {
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestStagingFaultsOnARealFilesystem")
		return
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=512k,mode=0755"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })

	e := newTestEnv(t, func(c *AgentConfig) { c.BaseDir = dir }, nil)
	fs := seedFiles()
	e.land(t, "plan-1", fs)
	fs2 := fs.clone()
	// Too large to ride in the record: it is staged in a temp file.
	fs2["maps/host.map"] += strings.Repeat("b.example be-b\n", maxInlineBytes/15+1)

	t.Run("disk full", func(t *testing.T) {
		filler := filepath.Join(dir, ".filler")
		fillDisk(t, filler)
		before := e.snapshot(t)
		he := clientApply(t, e, "plan-2", fs2)
		if he.Status != http.StatusInsufficientStorage || !he.ServerFault() ||
			!strings.Contains(he.Body, `"stage":"parts"`) ||
			!strings.Contains(he.Body, `cannot stage \"maps/host.map\": the agent's disk is full: write `) ||
			!strings.Contains(he.Body, "no space left on device") {
			t.Errorf("got %d %s", he.Status, he.Body)
		}
		e.unchanged(t, before)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		// The agent holds its log open for writing, so the tmpfs itself
		// cannot be remounted read-only; the staging directory becomes a
		// read-only mount of its own instead, a bind mount of itself.
		tmp := filepath.Join(dir, storeTempDir)
		if err := syscall.Mount(tmp, tmp, "", syscall.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount %s: %v", tmp, err)
		}
		defer syscall.Unmount(tmp, syscall.MNT_DETACH)
		if err := syscall.Mount("", tmp, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount %s read-only: %v", tmp, err)
		}
		before := e.snapshot(t)
		he := clientApply(t, e, "plan-2", fs2)
		if err := syscall.Unmount(tmp, 0); err != nil {
			t.Fatalf("unmount %s: %v", tmp, err)
		}
		e.unchanged(t, before)
		if he.Status != http.StatusInternalServerError || !strings.Contains(he.Body, "the agent's disk failed: open ") ||
			!strings.Contains(he.Body, "read-only file system") {
			t.Errorf("got %d %s", he.Status, he.Body)
		}
	})
	t.Run("immutable staging directory", func(t *testing.T) {
		tmp := filepath.Join(dir, storeTempDir)
		if out, err := exec.Command("chattr", "+i", tmp).CombinedOutput(); err != nil {
			t.Skipf("chattr +i is not available here: %v %s", err, out)
		}
		he := clientApply(t, e, "plan-2", fs2)
		if out, err := exec.Command("chattr", "-i", tmp).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i: %v %s", err, out)
		}
		if he.Status != http.StatusInternalServerError || !strings.Contains(he.Body, "operation not permitted") {
			t.Errorf("got %d %s", he.Status, he.Body)
		}
	})
	if res := e.c.apply(e.c.manifest("plan-2", fs2), fs2); !res.OK {
		t.Errorf("the apply after the repair: %+v", res)
	}
}

// maxFillChunks bounds fillDisk: the tmpfs holds 512 KiB, filled 64 KiB at
// a time.
const maxFillChunks = 64

// fillDisk writes p until the filesystem is full.
func fillDisk(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for range maxFillChunks {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
	t.Fatal("the filesystem never filled up")
}

// runInMountNamespace re-runs the named test of this binary in a child
// process with its own mount namespace (Go makes its mounts private), and
// reports the child's outcome; it skips when the child cannot be started
// there or skipped itself.
func runInMountNamespace(t *testing.T, name string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), mountNamespaceEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exitErr):
		t.Skipf("cannot start a process in a new mount namespace here (%v)", err)
	case err != nil:
		t.Fatalf("the child in its own mount namespace failed:\n%s", out)
	case strings.Contains(string(out), "--- SKIP: "+name+" "):
		t.Skipf("the child skipped:\n%s", out)
	}
	t.Logf("child:\n%s", out)
}

// remountBase remounts the bind mount at base read-only, or back to
// read-write.
func remountBase(t *testing.T, base string, readOnly bool) {
	t.Helper()
	flags := uintptr(syscall.MS_REMOUNT | syscall.MS_BIND)
	if readOnly {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount("", base, "", flags, ""); err != nil {
		t.Fatalf("remount %s (read-only %v): %v", base, readOnly, err)
	}
}

// TestTheDiskTurnsReadOnlyDuringAnApply remounts the base directory
// read-only while an apply is held at its install, in a private mount
// namespace. The kernel refuses to remount a mount read-only while a file
// on it is open for writing, as the agent's log is; so the state lives
// beside the tree, and its writes fail with EROFS from that moment on, as
// they would on the same volume. The agent never reloads HAProxy onto a
// tree it cannot write (a real master cannot even keep its socket there,
// and exits): it turns not ready and says why, and answers a refusal only
// where its undo holds at the next start. Once the disk takes writes again,
// it puts the tree back as its state says (reloading where the worker may
// hold what it undid), is ready again, and a restart brings nothing
// refused back.
func TestTheDiskTurnsReadOnlyDuringAnApply(t *testing.T) {
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestTheDiskTurnsReadOnlyDuringAnApply")
		return
	}
	type outcome struct {
		code int
		body string
	}
	for _, tc := range []struct {
		name    string
		next    func(set fileSet) (fileSet, *Manifest, func(*testEnv))
		want    func(t *testing.T, got outcome)
		landed  bool // the apply stays: it was answered before its install
		reloads int  // reloads once the disk takes writes again
	}{
		{"a reload apply", func(set fileSet) (fileSet, *Manifest, func(*testEnv)) {
			next := set.clone()
			next[ConfigFilePath] += "# 2\n"
			return next, &Manifest{Mode: ModeReload}, nil
		}, func(t *testing.T, got outcome) {
			// Its record is open: a start undoes it whatever the disk kept.
			if got.code != http.StatusOK || !strings.Contains(got.body, `"ok":false`) || !strings.Contains(got.body, `"stage":"write"`) {
				t.Errorf("the answer: %d %s", got.code, got.body)
			}
		}, false, 0},
		{"a runtime apply that falls back to a reload", func(set fileSet) (fileSet, *Manifest, func(*testEnv)) {
			next, op := mapEntryChange(set, "refused.example", "be-b")
			return next, &Manifest{Mode: ModeAuto, Ops: []Op{op}}, func(e *testEnv) {
				e.fake.With(func(m *FakeModel) {
					m.Reject = func(cmd string) (string, bool) { return "Unknown map.", strings.HasPrefix(cmd, "add map") }
				})
			}
		}, func(t *testing.T, got outcome) {
			// Its record counts: only the record of its undo, which the disk
			// refused, would say otherwise.
			if got.code != http.StatusServiceUnavailable || !strings.Contains(got.body, msgOutcomeUnknown) {
				t.Errorf("the answer: %d %s", got.code, got.body)
			}
		}, false, 1},
		{"a runtime apply answered before its install", func(set fileSet) (fileSet, *Manifest, func(*testEnv)) {
			next, op := mapEntryChange(set, "answered.example", "be-b")
			return next, &Manifest{Mode: ModeAuto, Ops: []Op{op}}, nil
		}, func(t *testing.T, got outcome) {
			if got.code != http.StatusOK || !strings.Contains(got.body, `"ok":true`) || !strings.Contains(got.body, `"mode":"runtime"`) {
				t.Errorf("the answer: %d %s", got.code, got.body)
			}
		}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, stateDir := bindMountTree(t), t.TempDir()
			d := &hookDisk{}
			e := newTestEnvWithDisk(t, d, func(c *AgentConfig) {
				c.BaseDir, c.StateFile = base, filepath.Join(stateDir, ".haptic-agent.json")
			})
			set := seedFiles()
			e.land(t, "plan-1", set)
			before := e.c.state("?plan=0")
			next, shape, arm := tc.next(set)
			m := e.c.manifest("plan-2", next, shape.Ops...)
			m.Mode = shape.Mode
			if arm != nil {
				arm(e)
			}
			target := filepath.Join(e.a.files.base, "maps/host.map")
			if shape.Mode == ModeReload {
				target = filepath.Join(e.a.files.base, ConfigFilePath)
			}
			var readOnly atomic.Bool
			entered, released := make(chan struct{}), make(chan struct{})
			var once sync.Once
			d.setHook(func(o diskOp) error {
				if o.Op == "exchange" && o.Path == target {
					once.Do(func() { close(entered); <-released })
				}
				if readOnly.Load() && strings.HasPrefix(o.Path, stateDir) {
					return &fs.PathError{Op: o.Op, Path: o.Path, Err: syscall.EROFS}
				}
				return nil
			})
			answered := make(chan outcome, 1)
			go func() {
				body, ct := applyRequest{manifest: m, files: next}.body(t)
				code, _, b := e.c.do("POST", PathApply, body, ct)
				answered <- outcome{code, string(b)}
			}()
			<-entered
			reloads := fakeReloads(e.fake)
			remountBase(t, base, true)
			readOnly.Store(true)
			close(released)
			got := <-answered
			tc.want(t, got)
			e.a.deps.applyMu.Lock() // what follows the answer is done
			e.a.deps.applyMu.Unlock()
			e.fake.With(func(m *FakeModel) { m.Reject = nil })
			if n := fakeReloads(e.fake); n != reloads {
				t.Errorf("HAProxy was reloaded onto a read-only tree: %d reloads, %d before", n, reloads)
			}
			if code, _, body := e.c.do("GET", PathReadyz, nil, ""); code != http.StatusServiceUnavailable {
				t.Errorf("on a read-only disk the agent answers /readyz %d %s", code, body)
			}

			remountBase(t, base, false)
			readOnly.Store(false)
			want := set
			if tc.landed {
				want = next
			}
			waitFor(t, "the agent to be ready again", func() bool {
				code, _, _ := e.c.do("GET", PathReadyz, nil, "")
				return code == http.StatusOK
			})
			if got := e.disk(t); !sameSet(got, want) {
				t.Errorf("once the disk takes writes again:\n%s", describeSetDiff(got, want))
			}
			if n := fakeReloads(e.fake); n != reloads+tc.reloads {
				t.Errorf("%d reloads once the disk takes writes again, want %d", n-reloads, tc.reloads)
			}
			e.restart(t)
			st := e.c.state("?plan=0")
			if got := e.disk(t); !sameSet(got, want) {
				t.Errorf("after a restart:\n%s", describeSetDiff(got, want))
			}
			if tc.landed && st.AppliedPlanID != "plan-2" || !tc.landed && st.AppliedPlanID != "" && st.AppliedPlanID != before.AppliedPlanID {
				t.Errorf("after a restart the applied plan is %q (before the apply %q)", st.AppliedPlanID, before.AppliedPlanID)
			}
		})
	}
}
