// The disk-full sweep: the agent's base directory on a small tmpfs whose
// free space is swept across what one apply needs, for a file_only, a
// runtime and a reload apply, with a restart after every apply. An
// acknowledged apply must survive the restart; any other answer must leave
// the previous set, plan and generation; and the agent must start however
// full the disk is. It needs a private mount namespace and skips without
// one.

package haptic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// diskFullMaxFreePages is the top of the sweep, in pages of the tmpfs. It
// is above what any of the sweep's applies needs (staged parts, the intent
// and the commit records with the new bytes inline), so that every kind of
// apply meets both ends: refused at the bottom, acknowledged at the top.
const diskFullMaxFreePages = 12

// diskFullStartTimeout bounds how long one restart may take to become
// ready; a start that a full disk stops never gets there.
const diskFullStartTimeout = 10 * time.Second

// diskFullPads are how many noop applies each case sends before it fills
// the disk. A noop writes only a commit record, so each one moves the end
// of the agent's log within its last page: the sweep meets the apply's
// records at different offsets of that page, not only at its start.
var diskFullPads = []int{0, 3}

// diskFullFiller is the file that takes the tmpfs's free space away. Its
// name starts with a dot, so that neither the agent nor the fake HAProxy's
// reload nor diskSet takes it for part of the tree.
const diskFullFiller = ".diskfull-filler"

// diskFullKind is one kind of apply the sweep sends against a full disk.
type diskFullKind struct {
	name string
	mode string // the answer's mode when it is acknowledged
	// next turns the first set into this kind's plan for id.
	next   func(base fileSet, id string) (fileSet, []Op)
	reload bool // sent with mode reload
}

// diskFullBase is the first set: the seed plus a map and a general file of a
// few KiB, so that the applies below write whole pages and their commit
// records carry kilobytes.
func diskFullBase() fileSet {
	fs := seedFiles()
	var m strings.Builder
	for i := range 120 {
		fmt.Fprintf(&m, "host-%03d.example be-%03d\n", i, i%7)
	}
	fs["maps/host.map"] = m.String()
	fs["notes/blob.txt"] = diskFullText("base", 5<<10)
	return fs
}

// diskFullText is n bytes of text that differ with seed.
func diskFullText(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s line %05d\n", seed, i)
	}
	return b.String()[:n]
}

func diskFullKinds() []diskFullKind {
	return []diskFullKind{
		{name: "file_only", mode: ResultFileOnly, next: func(base fileSet, id string) (fileSet, []Op) {
			fs := base.clone()
			fs["notes/blob.txt"] = diskFullText(id, 6<<10)
			return fs, nil
		}},
		{name: "runtime", mode: ResultRuntime, next: func(base fileSet, id string) (fileSet, []Op) {
			fs := base.clone()
			key := id + ".example"
			fs["maps/host.map"] += key + " be-new\n"
			return fs, []Op{{Kind: OpMapAdd, Path: "maps/host.map", Key: key, Value: "be-new"}}
		}},
		{name: "reload", mode: ResultReload, reload: true, next: func(base fileSet, id string) (fileSet, []Op) {
			fs := base.clone()
			fs["haproxy.cfg"] += "# " + id + "\n" + "#" + diskFullText(id, 2<<10) + "\n"
			return fs, nil
		}},
	}
}

// diskFullSweep is the running sweep: the agent under test, its tmpfs and
// what the agent has reported so far.
type diskFullSweep struct {
	t      *testing.T
	e      *testEnv
	dir    string
	filler string

	behind     int               // acknowledged applies whose files waited for room after the restart
	lastGen    uint64            // the highest generation reported so far
	lastAckGen uint64            // the generation of the last acknowledged apply
	proofs     map[string]string // every proof reported, and the plan it was reported for
	logs       logCounter
	stuck      int // the starts so far that could not compact
}

// TestDiskFullSweep sweeps the free space of a small tmpfs under the agent
// across what one apply needs, for a file_only, a runtime and a reload
// apply, restarting the agent after every apply with the disk still as
// full as it was. An apply answered ok:true must survive the restart (its
// plan applied, its generation kept, its files on disk); any other answer
// must restore the set from before the apply, never name the refused plan
// as applied and never advance the generation. The agent must start at
// every level, 0 free pages included; a generation never goes backwards
// and no proof is reported for two plans. It re-runs itself in a private
// mount namespace and skips where the machine cannot make one or mount a
// tmpfs.
func TestDiskFullSweep(t *testing.T) {
	if os.Getenv(mountNamespaceEnv) == "" {
		runInMountNamespace(t, "TestDiskFullSweep")
		return
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })

	logs := newLogCounter(testLogger().Handler())
	e := newTestEnv(t, func(c *AgentConfig) { c.BaseDir, c.Logger = dir, slog.New(logs) }, nil)
	s := &diskFullSweep{t: t, e: e, dir: dir, filler: filepath.Join(dir, diskFullFiller), proofs: map[string]string{}, logs: logs}
	base := diskFullBase()
	start := time.Now()

	type tally struct{ ok, refused []string }
	tallies := map[string]*tally{}
	for _, k := range diskFullKinds() {
		tl := &tally{}
		tallies[k.name] = tl
		for _, pad := range diskFullPads {
			for n := uint64(0); n <= diskFullMaxFreePages; n++ {
				free, ok := s.sweepCase(k, pad, n, base)
				at := fmt.Sprintf("%d+%d", free, pad)
				if ok {
					tl.ok = append(tl.ok, at)
				} else {
					tl.refused = append(tl.refused, at)
				}
			}
		}
	}
	s.unfill()
	for _, k := range diskFullKinds() {
		tl := tallies[k.name]
		t.Logf("%s: %d acknowledged at free pages+noops [%s]; %d refused at [%s]",
			k.name, len(tl.ok), strings.Join(tl.ok, " "), len(tl.refused), strings.Join(tl.refused, " "))
		// A sweep that never meets a refusal, or never an acknowledgement,
		// did not cross what the apply needs.
		if len(tl.ok) == 0 || len(tl.refused) == 0 {
			t.Errorf("%s: the sweep did not cross the apply's needs (%d acknowledged, %d refused)", k.name, len(tl.ok), len(tl.refused))
		}
	}
	// The starts at the bottom of the sweep must have met a disk too full
	// for a new snapshot, or the sweep never tested starting on a full disk.
	if n := logs.count(msgStartupCompactFailed); n == 0 {
		t.Errorf("no start met a disk too full to compact the agent's state")
	} else {
		t.Logf("%d starts could not compact the agent's state for lack of space, and said so on /readyz", n)
	}
	t.Logf("%d acknowledged applies found no room for their files until space was freed after the restart", s.behind)
	t.Logf("the sweep took %s", time.Since(start).Round(time.Millisecond))
}

// sweepCase runs one point of the sweep: the first set landed on a disk
// with room and the agent restarted there (so that its log is compacted
// and the case inherits nothing from the one before), pad noop applies,
// the disk filled to n free pages, the apply of kind k, and a restart on
// the disk as full as the apply left it. It returns the free pages the
// apply met and whether it was acknowledged.
func (s *diskFullSweep) sweepCase(k diskFullKind, pad int, n uint64, base fileSet) (uint64, bool) {
	t := s.t
	id := fmt.Sprintf("%s-%d-%02d", k.name, pad, n)
	s.unfill()
	s.landBase("base-"+id, base)
	s.restart("before " + id)
	for i := range pad {
		s.noop(fmt.Sprintf("noop-%s-%d", id, i), base)
	}
	free := s.fill(n)
	logBytes := s.logBytes()
	label := fmt.Sprintf("%s (%d free pages, a log of %d bytes)", id, free, logBytes)

	before := s.state(label + ", before the apply")
	next, ops := k.next(base, id)
	m := s.e.c.manifestFrom(before, id, next, ops...)
	if k.reload {
		m.Mode = ModeReload
	}
	code, res, body := s.post(before, m, next)
	ok := code == http.StatusOK && res.OK
	mem := s.state(label + ", after the answer")
	if ok {
		s.checkAcknowledged(label, k, before, mem, res)
	} else {
		s.checkRefusedAnswer(label, id, code, body, before, mem, res)
		// A refusal restores the set from before the apply at once, not
		// only at the next start.
		if onDisk := diskSet(t, s.dir); !sameSet(onDisk, base) {
			t.Errorf("%s: refused (rollback %+v; the answer reports running %q %s, last-known-good %q %s), but the tree is not the set from before:\n%s",
				label, res.Rollback, res.RunningPlanID, res.RunningPlanProof, res.LKGPlanID, res.LKGPlanProof, describeSetDiff(onDisk, base))
		}
	}

	s.restart(label)
	after := s.state(label + ", after the restart")
	onDisk := diskSet(t, s.dir)
	if n := s.logs.count(msgStartupCompactFailed); n > s.stuck {
		// Pushes are refused until a compaction can run: the agent must
		// not say it is ready.
		s.stuck = n
		if code, body := getText(t, s.e.a, PathReadyz); code != http.StatusServiceUnavailable ||
			!strings.HasPrefix(body, msgLogStuck) && !strings.HasPrefix(body, msgDiskBehind) {
			t.Errorf("%s: the start could not compact its state, and readyz answers %d %q", label, code, body)
		}
	}
	if ok {
		if after.AppliedPlanID != id || after.AppliedPlanProof != res.AppliedPlanProof || after.Generation != s.lastAckGen {
			t.Errorf("%s: acknowledged as %s generation %d, but after the restart the agent reports %q %s generation %d",
				label, res.AppliedPlanProof, s.lastAckGen, after.AppliedPlanID, after.AppliedPlanProof, after.Generation)
		}
		if !sameSet(onDisk, next) {
			// Its files were installed after the answer, on a disk too full
			// for them: the agent owes them, says so, and installs them as
			// soon as there is room.
			code, _, body := s.e.c.do("GET", PathReadyz, nil, "")
			if code != http.StatusServiceUnavailable || !strings.HasPrefix(string(body), msgDiskBehind) {
				t.Errorf("%s: acknowledged, but after the restart the tree is not its set, and the agent is ready (%d %s):\n%s",
					label, code, body, describeSetDiff(onDisk, next))
			}
			// Room again: what the retry loop does every second, at once.
			s.unfill()
			s.e.a.deps.applyMu.Lock()
			err := s.e.a.deps.payOwed(context.Background())
			s.e.a.deps.applyMu.Unlock()
			if onDisk := diskSet(t, s.dir); err != nil || !sameSet(onDisk, next) {
				t.Errorf("%s: with room again the owed files are not in place (%v):\n%s", label, err, describeSetDiff(onDisk, next))
			}
			s.behind++
		}
	} else {
		// The applied plan is the one from before the refused apply, or
		// unknown; never the refused one.
		if after.AppliedPlanID == id || (after.AppliedPlanID != "" &&
			(after.AppliedPlanID != before.AppliedPlanID || after.AppliedPlanProof != before.AppliedPlanProof)) {
			t.Errorf("%s: refused, but after the restart the applied plan is %q %s (before the apply: %q %s)",
				label, after.AppliedPlanID, after.AppliedPlanProof, before.AppliedPlanID, before.AppliedPlanProof)
		}
		if after.Generation != s.lastAckGen {
			t.Errorf("%s: refused, but after the restart the generation is %d, the last acknowledged one %d",
				label, after.Generation, s.lastAckGen)
		}
		if !sameSet(onDisk, base) {
			t.Errorf("%s: refused, but after the restart the tree is not the set from before:\n%s", label, describeSetDiff(onDisk, base))
		}
	}
	t.Logf("%-16s %2d free pages, log %5d bytes: %s; after the restart: applied %q, generation %d, %d free pages",
		id, free, logBytes, answerSummary(code, res, body), after.AppliedPlanID, after.Generation, s.freePages())
	return free, ok
}

// noop lands the first set again, sending nothing: an acknowledged apply
// that writes only its commit record.
func (s *diskFullSweep) noop(planID string, base fileSet) {
	t := s.t
	t.Helper()
	before := s.state("before " + planID)
	code, res, body := s.post(before, s.e.c.manifestFrom(before, planID, base), base)
	if code != http.StatusOK || !res.OK || res.Mode != ResultNoop {
		t.Fatalf("%s: %d %s", planID, code, body)
	}
	s.checkAcknowledged(planID, diskFullKind{mode: ResultNoop}, before, s.state("after "+planID), res)
}

// checkAcknowledged checks an ok:true answer and the state read right after
// it, and records its generation as the last acknowledged one.
func (s *diskFullSweep) checkAcknowledged(label string, k diskFullKind, before, mem State, res ApplyResult) {
	t := s.t
	t.Helper()
	if res.Mode != k.mode || res.AppliedPlanID != res.PlanID || res.AppliedPlanProof == "" {
		t.Errorf("%s: acknowledged as mode %s applied %q %q, want mode %s and its own plan", label, res.Mode,
			res.AppliedPlanID, res.AppliedPlanProof, k.mode)
	}
	if mem.Generation != before.Generation+1 || mem.AppliedPlanID != res.PlanID || mem.AppliedPlanProof != res.AppliedPlanProof {
		t.Errorf("%s: acknowledged, but the state reads %q %s generation %d (before: generation %d)",
			label, mem.AppliedPlanID, mem.AppliedPlanProof, mem.Generation, before.Generation)
	}
	s.lastAckGen = mem.Generation
}

// checkRefusedAnswer checks a refusal and the state read right after it:
// the refused plan is not applied and the generation did not move.
func (s *diskFullSweep) checkRefusedAnswer(label, id string, code int, body []byte, before, mem State, res ApplyResult) {
	t := s.t
	t.Helper()
	switch {
	case code == http.StatusConflict:
		// The manifest was composed against the state just read: a fence
		// means the sweep tested nothing about the disk.
		t.Errorf("%s: fenced: %s", label, body)
	case code == http.StatusOK && res.Error == nil:
		t.Errorf("%s: ok:false without an error: %s", label, body)
	case code != http.StatusOK && code < 400:
		t.Errorf("%s: answered %d: %s", label, code, body)
	}
	if code == http.StatusOK && res.AppliedPlanID == id {
		t.Errorf("%s: the refusal names the refused plan as applied: %s", label, body)
	}
	if mem.Generation != before.Generation || mem.AppliedPlanID == id {
		t.Errorf("%s: refused, but the state reads %q generation %d (before: generation %d)",
			label, mem.AppliedPlanID, mem.Generation, before.Generation)
	}
}

// landBase lands the first set as planID on a disk with room, as a reload
// (which needs no proof of the previous plan, so it lands whatever an
// earlier refusal left), and expects it acknowledged.
func (s *diskFullSweep) landBase(planID string, base fileSet) {
	t := s.t
	t.Helper()
	before := s.state("before landing " + planID)
	m := s.e.c.manifestFrom(before, planID, base)
	m.Mode = ModeReload
	code, res, body := s.post(before, m, base)
	if code != http.StatusOK || !res.OK {
		t.Fatalf("landing the first set as %s with %d free pages: %d %s", planID, s.freePages(), code, body)
	}
	mem := s.state("after landing " + planID)
	if mem.Generation != before.Generation+1 || mem.AppliedPlanID != planID {
		t.Errorf("landing %s: the state reads %q generation %d (before: %d)", planID, mem.AppliedPlanID, mem.Generation, before.Generation)
	}
	s.lastAckGen = mem.Generation
}

// post sends m with the parts a controller would send against st (the
// files whose proof the agent does not hold) and decodes the answer.
func (s *diskFullSweep) post(st State, m *Manifest, fs fileSet) (int, ApplyResult, []byte) {
	t := s.t
	t.Helper()
	omit := map[string]bool{}
	for p := range fs {
		omit[p] = true
	}
	for _, p := range partsNeeded(st, m) {
		delete(omit, p)
	}
	code, body := s.e.c.post(applyRequest{manifest: m, files: fs, omit: omit})
	var res ApplyResult
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &res); err != nil {
			t.Fatalf("apply %s: %v: %s", m.PlanID, err, body)
		}
		s.sawPairs("the answer to "+m.PlanID, res.AppliedPlanID, res.AppliedPlanProof, res.RunningPlanID, res.RunningPlanProof,
			res.WorkerOpsPlanID, res.WorkerOpsPlanProof, res.LKGPlanID, res.LKGPlanProof)
	}
	return code, res, body
}

// state reads the state and checks what it reports against everything
// reported before: the generation never goes backwards and no proof
// changes plans.
func (s *diskFullSweep) state(label string) State {
	s.t.Helper()
	st := s.e.c.state("?plan=0")
	if st.Generation < s.lastGen {
		s.t.Errorf("%s: generation %d, after %d was reported", label, st.Generation, s.lastGen)
	}
	s.lastGen = max(s.lastGen, st.Generation)
	s.sawPairs(label, st.AppliedPlanID, st.AppliedPlanProof, st.RunningPlanID, st.RunningPlanProof,
		st.WorkerOpsPlanID, st.WorkerOpsPlanProof, st.LKGPlanID, st.LKGPlanProof)
	return st
}

// sawPairs records (plan id, proof) pairs as reported; a proof reported
// for two different plans was issued twice.
func (s *diskFullSweep) sawPairs(label string, pairs ...string) {
	s.t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		id, proof := pairs[i], pairs[i+1]
		if proof == "" || id == "" {
			continue
		}
		if prev, ok := s.proofs[proof]; ok && prev != id {
			s.t.Errorf("%s: proof %s reported for %q, and earlier for %q", label, proof, id, prev)
			continue
		}
		s.proofs[proof] = id
	}
}

// restart stops the agent and starts a new one on the same directory,
// which must become ready however full the disk is.
func (s *diskFullSweep) restart(label string) {
	t := s.t
	t.Helper()
	e := s.e
	e.stop()
	seq := e.c.seq
	a, stop := launchTestAgent(t, e.cfg, false)
	deadline := time.Now().Add(diskFullStartTimeout)
	for !a.Ready() {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("%s: the agent did not become ready within %s with %d free pages", label, diskFullStartTimeout, s.freePages())
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.a, e.stop = a, stop
	e.c = newAgentClient(t, a)
	e.c.seq = seq
}

// logBytes is the size of the agent's log.
func (s *diskFullSweep) logBytes() int64 {
	fi, err := os.Stat(filepath.Join(s.dir, logFileName))
	if err != nil {
		return -1
	}
	return fi.Size()
}

// freePages is the tmpfs's free space in pages, as statfs reports it.
func (s *diskFullSweep) freePages() uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		s.t.Fatalf("statfs %s: %v", s.dir, err)
	}
	return st.Bavail
}

// fill writes the filler so that n pages stay free, and returns the free
// pages statfs reports then. tmpfs hands out whole pages, so a filler of
// whole pages leaves exactly n.
func (s *diskFullSweep) fill(n uint64) uint64 {
	t := s.t
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", s.dir, err)
	}
	if st.Bavail < n {
		t.Fatalf("only %d pages are free, fewer than the %d the sweep asks for", st.Bavail, n)
	}
	size := int64(st.Bavail-n) * st.Bsize
	f, err := os.OpenFile(s.filler, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for written := int64(0); written < size; {
		b := chunk[:min(int64(len(chunk)), size-written)]
		k, err := f.Write(b)
		written += int64(k)
		if err != nil {
			t.Fatalf("writing the filler: %v after %d of %d bytes", err, written, size)
		}
	}
	return s.freePages()
}

// unfill removes the filler.
func (s *diskFullSweep) unfill() {
	if err := os.Remove(s.filler); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.t.Fatal(err)
	}
}

// answerSummary is one line about an apply's answer.
func answerSummary(code int, res ApplyResult, body []byte) string {
	switch {
	case code != http.StatusOK:
		return fmt.Sprintf("%d %s", code, strings.TrimSpace(string(body)))
	case res.OK:
		return fmt.Sprintf("ok:true %s %s", res.Mode, res.AppliedPlanProof)
	case res.Error != nil:
		return fmt.Sprintf("ok:false at %s: %s", res.Error.Stage, res.Error.Message)
	}
	return "ok:false"
}

// describeSetDiff names the paths where two sets differ.
func describeSetDiff(got, want fileSet) string {
	var b strings.Builder
	for p, c := range want {
		if g, ok := got[p]; !ok {
			fmt.Fprintf(&b, "  %s: missing\n", p)
		} else if g != c {
			fmt.Fprintf(&b, "  %s: %d bytes, want %d bytes\n", p, len(g), len(c))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			fmt.Fprintf(&b, "  %s: not in the set\n", p)
		}
	}
	return b.String()
}

// logCounter is a slog handler that counts the records by message before
// passing them on.
type logCounter struct {
	slog.Handler
	mu     *sync.Mutex
	counts map[string]int
}

func newLogCounter(h slog.Handler) logCounter {
	return logCounter{Handler: h, mu: &sync.Mutex{}, counts: map[string]int{}}
}

func (h logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h logCounter) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.counts[r.Message]++
	h.mu.Unlock()
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return logCounter{Handler: h.Handler.WithAttrs(as), mu: h.mu, counts: h.counts}
}

func (h logCounter) WithGroup(name string) slog.Handler {
	return logCounter{Handler: h.Handler.WithGroup(name), mu: h.mu, counts: h.counts}
}

func (h logCounter) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[msg]
}
