// The machine-crash simulation: an agent runs its applies on the recording
// disk of memdisk_test.go, and before every file operation of each kind of
// apply the crash test interrupts (runtime, file_only, reload, large parts
// whole or patched, refused), and of the compaction that follows it (and
// after the last), the disk images a power loss could leave there are
// forked. On each image a ledger and a file store start afresh and recover,
// exactly as a restarting agent does, and the four requirements of the
// agent's durability are checked:
//
//  1. the tree is the set before the apply or the apply's set, never a mix;
//  2. a plan the state names has its files on disk;
//  3. an apply whose commit was durable (so it may have been answered OK)
//     is still the applied plan;
//  4. the generation and the proof counter never fall below what the agent
//     may have reported;
//
// and that a refused apply, once its undo began, left the tree and the
// pairs it found; and, for the worker, that a recovery which changed the
// tree asks HAProxy to reload it: after a power loss HAProxy may boot
// before the agent and load what the recovery then changes.
//
// HAPTIC_POWERLOSS=1 forks up to maxCrashImages images per operation
// instead of the quick run's few.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// powerLossImagesPerOp is how many images the quick run forks per file
// operation; the extremes (nothing unsynced survives, everything does) are
// always among them.
const powerLossImagesPerOp = 12

// powerLossZeroAhead is the zeros the simulated agent keeps past its log's
// end: two blocks, so that records land on zeros, a torn one ends on them,
// and they are renewed every few applies, while the images it forks copy
// kilobytes, not logZeroAhead.
const powerLossZeroAhead = 2 * memBlockSize

// forkingDisk is a memDisk that calls before(op) ahead of every operation
// that changes something or syncs, outside the memDisk's lock, so that
// before can fork crash images of the instant between two operations.
type forkingDisk struct {
	*memDisk
	before func(op diskOp)
	// other is signalled by every operation; a sync of the log waits for
	// one (or a moment) first, so that an operation that does not wait
	// for the sync to finish runs before it: the interleaving a rename
	// issued before the record is durable would meet on a real disk.
	other chan struct{}
}

func (d *forkingDisk) at(op, path string) {
	select {
	case d.other <- struct{}{}:
	default:
	}
	if d.before != nil {
		d.before(diskOp{Op: op, Path: path})
	}
}

// holdSync lets whatever the agent does meanwhile go first, for a moment.
func (d *forkingDisk) holdSync() {
	select {
	case <-d.other:
	default:
	}
	select {
	case <-d.other:
	case <-time.After(20 * time.Millisecond):
	}
}

func (d *forkingDisk) OpenFile(name string, flag int, perm fs.FileMode) (diskFile, error) {
	if flag&(os.O_CREATE|os.O_TRUNC) != 0 {
		d.at("create", name)
	}
	f, err := d.memDisk.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &forkingFile{diskFile: f, d: d}, nil
}

func (d *forkingDisk) CreateTemp(dir, pattern string) (diskFile, error) {
	d.at("create", dir)
	f, err := d.memDisk.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &forkingFile{diskFile: f, d: d}, nil
}

func (d *forkingDisk) Rename(o, n string) error { d.at("rename", n); return d.memDisk.Rename(o, n) }
func (d *forkingDisk) Exchange(o, n string) error {
	d.at("exchange", n)
	return d.memDisk.Exchange(o, n)
}
func (d *forkingDisk) Link(o, n string) error   { d.at("link", n); return d.memDisk.Link(o, n) }
func (d *forkingDisk) Remove(name string) error { d.at("remove", name); return d.memDisk.Remove(name) }
func (d *forkingDisk) SyncDir(name string) error {
	d.at("syncdir", name)
	return d.memDisk.SyncDir(name)
}

func (d *forkingDisk) Mkdir(name string, perm fs.FileMode) error {
	d.at("mkdir", name)
	return d.memDisk.Mkdir(name, perm)
}

// landedEnd matches the frame of an end record that lands its apply.
var landedEnd = regexp.MustCompile(`"kind":"end".*"end":\d+,"ok":true`)

type forkingFile struct {
	diskFile
	d *forkingDisk
}

func (f *forkingFile) Write(p []byte) (int, error) {
	op := "write"
	// The record from whose sync on an apply counts: a runtime or file_only
	// apply's own, or the end record of an open (reload) apply that landed.
	if bytes.Contains(p, []byte(`"kind":"apply"`)) && !bytes.Contains(p, []byte(`"open":true`)) || landedEnd.Match(p) {
		op = "write-commit"
	}
	f.d.at(op, f.Name())
	return f.diskFile.Write(p)
}

func (f *forkingFile) Sync() error {
	if filepath.Base(f.Name()) == logFileName {
		f.d.holdSync()
	}
	f.d.at("sync", f.Name())
	err := f.diskFile.Sync()
	// The instant after: what the sync made durable must survive from here
	// on, while operations that run beside the sync go on.
	f.d.at("synced", f.Name())
	return err
}

func (f *forkingFile) Truncate(size int64) error {
	f.d.at("truncate", f.Name())
	return f.diskFile.Truncate(size)
}

// TestPowerLossAtEveryFileOperation runs the simulation for each kind of
// apply the kill -9 test interrupts.
func TestPowerLossAtEveryFileOperation(t *testing.T) {
	perOp := powerLossImagesPerOp
	if os.Getenv("HAPTIC_POWERLOSS") != "" {
		perOp = maxCrashImages
	}
	for _, k := range append(crashKinds(), mountedCrashKinds(true)...) {
		t.Run(k.name, func(t *testing.T) { runPowerLoss(t, k, perOp) })
	}
}

func runPowerLoss(t *testing.T, k crashKind, perOp int) {
	base, _ := filepath.EvalSymlinks(t.TempDir()) // exists on the real disk too: the store resolves it there
	md := newMemDisk()
	if err := md.mkdirAll(base); err != nil {
		t.Fatal(err)
	}
	// The mounts are the recording disk's, and the mount table says so.
	var points []string
	for _, m := range k.mounts {
		points = append(points, filepath.Join(base, m))
		if err := md.mkdirAll(points[len(points)-1]); err != nil {
			t.Fatal(err)
		}
	}
	md.mounts = points
	mountInfo := mountInfoFile(t, points...)
	fd := &forkingDisk{memDisk: md, other: make(chan struct{}, 1)}
	fake := startTestFake(t, "")
	// A reload "loads" the maps of the recording disk, as a worker would.
	fake.With(func(m *FakeModel) {
		m.OnReload = func(m *FakeModel) {
			m.Maps = map[string][]MapEntry{}
			if b, err := md.readFile(filepath.Join(base, "maps/host.map")); err == nil {
				m.Maps["maps/host.map"] = ParseMapEntries(string(b))
			}
		}
	})
	cfg := testAgentConfig(t, fake)
	cfg.BaseDir = base
	var master *refusingMaster
	if k.rejectOps {
		master = newRefusingMaster(t, fake)
		cfg.MasterSocket = master.path
	}
	a, _ := launchAgentWith(t, cfg, agentOptions{disk: fd, mountInfo: mountInfo, logZeroAhead: powerLossZeroAhead}, nil, true)
	c := newAgentClient(t, a)
	if k.warmup == nil {
		if res := c.apply(c.manifest(k.planID(1), k.before), k.before); !res.OK {
			t.Fatalf("landing the set before: %+v", res)
		}
	} else {
		if res := c.apply(c.manifest(k.planID(0), k.landed), k.landed); !res.OK {
			t.Fatalf("landing the first set: %+v", res)
		}
		if res := c.apply(c.manifest(k.planID(1), k.before, k.warmup...), k.before); res.Mode != ResultRuntime {
			t.Fatalf("the warmup: %+v", res)
		}
		awaitReadBacks(a)
	}
	if k.plans != nil {
		st := c.state("")
		blob, _ := EncodePlanBlob(k.plans[0])
		query := "?plan_id=" + st.AppliedPlanID + "&proof=" + st.AppliedPlanProof
		if code, _, body := c.do("PUT", PathPlan+query, bytes.NewReader(blob), "application/octet-stream"); code != http.StatusOK {
			t.Fatalf("storing the plan before: %d %s", code, body)
		}
		k.uploadPlanAgain(t, k.uploads, func(body []byte, contentType string) error {
			if code, _, b := c.do("PUT", PathPlan+query, bytes.NewReader(body), contentType); code != http.StatusOK {
				return fmt.Errorf("%d %s", code, b)
			}
			return nil
		})
	}
	st := c.state("")
	before := struct {
		gen, proof uint64
	}{st.Generation, proofNumber(st.AppliedPlanProof)}

	// Fork images before every operation of the apply, and check each on
	// the spot. Once the commit record is synced, the apply counts as
	// answered, unless HAProxy refuses it; a refused runtime apply's undo
	// begins with the first change of the tree after the refusal.
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, uint64(len(k.name))))
	seen := map[string]bool{}
	var committed, acked, undoing atomic.Bool
	var ops, images int
	var failures []string
	check := func(op diskOp) {
		mu.Lock()
		defer mu.Unlock()
		ops++
		if master != nil && master.refused.Load() > 0 && changesTheTree(base, op) {
			undoing.Store(true)
		}
		if op.Op == "synced" && committed.Load() && !k.refused {
			acked.Store(true)
		}
		for _, img := range md.crashImages(perOp, rng) {
			key := img.canonical()
			if seen[key] {
				continue
			}
			seen[key] = true
			images++
			if msg := checkRecovery(img, cfg, mountInfo, k, before.gen, before.proof, acked.Load(), k.mustFindTheSetBefore(undoing.Load())); msg != "" && len(failures) < 10 {
				failures = append(failures, fmt.Sprintf("before %s %s (op %d): %s", op.Op, op.Path, ops, msg))
			}
		}
		if op.Op == "write-commit" {
			committed.Store(true)
		}
	}
	// The apply under test follows a compaction: the bytes it replaces are
	// then in the snapshot's tree alone, not in any record that could put
	// them back, as in a pod's steady state. One that promotes its plan
	// before does not: the journal then links files installed unsynced.
	if !k.promote {
		a.deps.applyMu.Lock()
		a.deps.compact()
		a.deps.applyMu.Unlock()
	}
	fd.before = check
	st = c.state("")
	m := c.manifestFrom(st, k.planID(2), k.after, k.ops...)
	m.Mode = k.mode
	if k.promote {
		m.ValidatedPlanID, m.ValidatedPlanProof = st.AppliedPlanID, st.AppliedPlanProof
	}
	k.haproxyRefuses(fake, master, true)
	code, body := c.post(applyRequest{manifest: m, files: k.after, override: patchesFor(m, k.patchBase(), k.after), plan: k.planPatch(), planPatch: true})
	var res ApplyResult
	if code != 200 || json.Unmarshal(body, &res) != nil {
		t.Fatalf("the apply: %d %s", code, body)
	}
	k.haproxyRefuses(fake, master, false)
	awaitReadBacks(a)
	// A compaction right after the answer: its snapshot must be durable
	// before the log it replaces is emptied, and the links it sweeps must
	// be ones no record can still need.
	a.deps.applyMu.Lock()
	a.deps.compact()
	a.deps.applyMu.Unlock()
	fd.before = nil
	check(diskOp{Op: "end", Path: "after the answer"})
	if res.OK == k.refused || res.Mode != k.wantMode {
		t.Fatalf("the apply: %+v", res)
	}
	// What the answer left, before any recovery: a refused apply put back
	// exactly the tree it found, answered changes included.
	if live := treeOf(md, base); k.refused && !sameSet(live, k.before) {
		t.Errorf("the refused apply's answer left %v, want the set it found", live.paths())
	}
	t.Logf("%s apply: %d file operations, %d distinct power-loss images checked", k.name, ops, images)
	for _, f := range failures {
		t.Error(f)
	}
}

// checkRecovery recovers a fresh ledger and file store on img, as a
// restarting agent does before it probes HAProxy, and checks the four
// requirements, and with refused that the refused apply left the tree and
// the pairs it found. It returns what failed, or "".
func checkRecovery(img *memDisk, cfg AgentConfig, mountInfo string, k crashKind, genBefore, proofBefore uint64, acked, refused bool) string {
	logger := testLogger()
	paths, err := resolveAgentPaths(&cfg)
	if err != nil {
		return err.Error()
	}
	files, err := newFileStore(fileStoreConfig{Base: cfg.BaseDir, Config: cfg.ConfigFile, Logger: logger, Disk: img, MountInfo: mountInfo,
		Reserved: []string{paths.state, paths.log, paths.planBlob}})
	if err != nil {
		return "file store: " + err.Error()
	}
	led, loaded, err := newLedger(img, paths.state, paths.planBlob, powerLossZeroAhead, logger)
	if err != nil {
		return "ledger: " + err.Error()
	}
	defer led.log.f.Close()
	beforeRecovery := treeOf(img, cfg.BaseDir)
	st, _, reload, owed, err := recoverDisk(files, led, loaded, logger, time.Now())
	if err != nil {
		return "recovery: " + err.Error()
	}
	if owed != nil {
		// Nothing fails a write here: a power loss must leave what
		// recovery needs, not a tree it can only retry.
		return "recovery could not put the tree back: " + owed.err.Error()
	}
	if !reload && !sameSet(beforeRecovery, treeOf(img, cfg.BaseDir)) {
		// HAProxy may have booted before the agent and loaded the tree the
		// recovery changed: it must load the recovered one.
		return "the worker: recovery changed the tree without asking HAProxy to reload it"
	}

	got := treeOf(img, cfg.BaseDir)
	isBefore, isAfter := sameSet(got, k.before), sameSet(got, k.after)
	switch {
	case !isBefore && !isAfter:
		return fmt.Sprintf("requirement 1: the tree is a mix: %v", got.paths())
	case st.Applied.ID == k.planID(1) && !isBefore:
		return "requirement 2: plan-1 is applied over the apply's set"
	case st.Applied.ID == k.planID(2) && !isAfter:
		return "requirement 2: plan-2 is applied over the set before"
	case acked && st.Applied.ID != k.planID(2):
		return fmt.Sprintf("requirement 3: a durable commit was lost: applied %q", st.Applied.ID)
	case acked && !isAfter:
		return "an ACK taken back: the answered apply's files are not on disk"
	case refused && !isBefore:
		return "the refused apply's files stayed, or its undo took an answered change back"
	case refused && slices.Contains([]string{st.Applied.ID, st.Running.ID, st.WorkerOps.ID, st.LKG.ID}, k.planID(2)):
		return fmt.Sprintf("the refused apply's pairs stayed: applied %q, running %q, worker ops %q, lkg %q", st.Applied.ID, st.Running.ID, st.WorkerOps.ID, st.LKG.ID)
	case st.Generation < genBefore || (acked && st.Generation < genBefore+1):
		return fmt.Sprintf("requirement 4: generation %d, reported %d (answered: %v)", st.Generation, genBefore, acked)
	case st.ProofGeneration < proofBefore || (acked && st.ProofGeneration <= proofBefore):
		return fmt.Sprintf("requirement 4: proof counter %d, reported a:%d (answered: %v)", st.ProofGeneration, proofBefore, acked)
	}
	stored, blob := "", []byte(nil)
	if st.Blob.complete() {
		led.mu.Lock()
		stored = st.Blob.ID
		blob, _ = led.storedBlob()
		led.mu.Unlock()
	}
	if msg := k.heldPlanProblem(stored, blob, acked); msg != "" {
		return msg
	}
	// A revert to the last-known-good set must still find every backup the
	// journal names: links to bytes installed without a sync are made again.
	for _, e := range append(st.Journal, st.PendingUndo...) {
		if e.At == nil {
			continue
		}
		if b, err := img.readFile(e.Backup); err != nil || DigestString(string(b)) != e.At.Digest {
			return fmt.Sprintf("the journal's backup of %s does not hold its bytes after recovery: %v", e.Path, err)
		}
	}
	return ""
}

// treeOf reads the files under base on img, leaving out the agent's own
// dot-prefixed names.
func treeOf(img *memDisk, base string) fileSet {
	out := fileSet{}
	for p, content := range img.dump() {
		rel, err := filepath.Rel(base, p)
		if err != nil || strings.HasPrefix(rel, "..") || strings.HasSuffix(p, "/") {
			continue
		}
		if slices.ContainsFunc(strings.Split(rel, "/"), func(c string) bool { return strings.HasPrefix(c, ".") }) {
			continue
		}
		out[rel] = content
	}
	return out
}
