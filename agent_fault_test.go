// The fault simulation: for seeds 1–6, 24 steps each, a fresh fake HAProxy
// and agent, random desired sets and exactly one fault per step, checked
// against a model of what the agent must hold after every step: the tree is
// exactly one whole set (never a mix), the generation counts the OK applies,
// and only the expected invariants fire. HAPTIC_SOAK=1 runs a 10,000-step
// variant. Also here: concurrent verified reads against applies.

package haptic

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The faults a step can draw, exactly one per step.
const (
	faultNone = iota
	faultReloadFails
	faultOpRejected
	faultUnknownOp
	faultCorruptPart
	faultStaleEpoch
	faultMissingPrev
	faultDirectory
	faultNewWorker
	faultRestart
	faultRevert
	faultCount
)

var faultNames = [faultCount]string{"none", "reload fails", "op rejected", "unknown op", "corrupted part",
	"stale epoch", "missing previous plan", "directory in the way", "new worker", "restart", "revert"}

// faultModel is what the agent must hold, predicted step by step.
type faultModel struct {
	gen            uint64
	applied        string  // applied plan id ("" after an invalidation)
	disk           fileSet // the owned tree
	lkg            string
	lkgSet         fileSet
	opsExecutable  uint64
	foreignPending bool // a new worker the agent has not observed yet
}

// faultSim drives one agent through steps.
type faultSim struct {
	t     testing.TB
	seed  int64
	rng   *rand.Rand
	e     *testEnv
	model faultModel
	step  int

	reverted    bool           // the step's revert landed
	nackApplied string         // the applied plan a NACK of this step reports
	faultOf     int            // the step's fault, for the outcome summary
	last        string         // the step's last outcome, for the step log
	outcomes    map[string]int // "<fault>: <status and mode>" → steps, logged at the end
}

func newFaultSim(t testing.TB, seed int64) *faultSim {
	e := newTestEnv(t, nil, nil)
	return &faultSim{t: t, seed: seed, rng: rand.New(rand.NewSource(seed)), e: e,
		model: faultModel{disk: fileSet{}, lkgSet: fileSet{}}, outcomes: map[string]int{}}
}

var faultMapPaths = []string{"maps/m0.map", "maps/m1.map", "maps/m2.map", "maps/m3.map"}
var faultGeneralPaths = []string{"notes/g0.txt", "notes/g1.txt", "etc/g2.conf", "etc/deep/g3.txt"}

func (s *faultSim) mapContent() string {
	var b strings.Builder
	for i := range 1 + s.rng.Intn(5) {
		fmt.Fprintf(&b, "k%d.example be-%d\n", i, s.rng.Intn(1000))
	}
	return b.String()
}

// desired draws the next desired set from the current tree: the config
// plus some maps and general files, some added, changed or dropped.
func (s *faultSim) desired() fileSet {
	cur := s.model.disk
	next := cur.clone()
	if _, ok := next[ConfigFilePath]; !ok || s.rng.Intn(8) == 0 {
		next[ConfigFilePath] = fmt.Sprintf("global\n  maxconn %d\n", s.rng.Intn(100000))
	}
	for _, p := range append(slices.Clone(faultMapPaths), faultGeneralPaths...) {
		_, present := next[p]
		switch r := s.rng.Intn(20); {
		case r < 3:
			if present {
				delete(next, p)
			} else if strings.HasSuffix(p, ".map") {
				next[p] = s.mapContent()
			} else {
				next[p] = fmt.Sprintf("general %d\n", s.rng.Intn(1000))
			}
		case r < 9 && present:
			if strings.HasSuffix(p, ".map") {
				next[p] = s.mapContent()
			} else {
				next[p] += "more\n"
			}
		}
	}
	if sameSet(next, cur) {
		next["notes/g0.txt"] = fmt.Sprintf("forced change %d\n", s.step)
	}
	return next
}

// run performs every step.
func (s *faultSim) run(steps int) {
	for s.step = 1; s.step <= steps; s.step++ {
		fault := s.rng.Intn(faultCount)
		s.reverted = false
		s.runStep(fault)
		s.t.Logf("seed %d step %d: %s: %s", s.seed, s.step, faultNames[fault], s.last)
		s.check(fault)
		if s.t.Failed() {
			s.t.Fatalf("seed %d failed at step %d (%s)", s.seed, s.step, faultNames[fault])
		}
	}
	keys := slices.Sorted(mapsKeys(s.outcomes))
	for _, k := range keys {
		s.t.Logf("seed %d: %4d × %s", s.seed, s.outcomes[k], k)
	}
}

// record counts the outcome of one step for the closing summary.
func (s *faultSim) record(fault int, mode string, code int, body []byte) {
	outcome := mode + " → " + fmt.Sprint(code)
	var res ApplyResult
	if code == 200 && json.Unmarshal(body, &res) == nil {
		outcome += " " + res.Mode
	} else {
		var c Conflict
		if code == 409 && json.Unmarshal(body, &c) == nil && c.Reason != "" {
			outcome += " " + c.Reason
		}
	}
	s.outcomes[faultNames[fault]+": "+outcome]++
	s.last = outcome
}

func (s *faultSim) runStep(fault int) {
	t, e, m := s.t, s.e, &s.model
	s.faultOf = fault
	s.nackApplied = ""
	switch fault {
	case faultRestart:
		e.restart(t)
		m.foreignPending = false
		m.opsExecutable = 0 // metrics belong to the process
	case faultNewWorker:
		newWorker(e.fake, s.rng.Intn(2) == 0)
		m.foreignPending = true
	}
	st := e.c.state("?plan=0")
	if fault == faultRevert {
		// Land this step's set first, so that there usually is a plan to
		// refuse, then revert it.
		defer func() { s.revert(e.c.state("?plan=0")) }()
		fault = faultNone
	}

	want := s.desired()
	planID := fmt.Sprintf("s%d-%d", s.seed, s.step)
	var blocked string
	if fault == faultDirectory {
		blocked = fmt.Sprintf("blocked/d%d.txt", s.step)
		want[blocked] = "never written\n"
		os.MkdirAll(filepath.Join(e.cfg.BaseDir, blocked), 0o755)
		defer os.RemoveAll(filepath.Join(e.cfg.BaseDir, "blocked"))
	}
	known := st.AppliedPlanProof != "" && st.WorkerOpsPlanProof != ""
	auto := known && want[ConfigFilePath] == m.disk[ConfigFilePath] && fault != faultReloadFails
	var ops []Op
	if auto {
		loaded := e.fake.Maps()
		for _, p := range faultMapPaths {
			if c, ok := want[p]; ok && c != m.disk[p] && m.disk[p] != "" && slices.Contains(loaded, p) {
				ops = append(ops, Op{Kind: OpMapReplace, Path: p})
			}
		}
		mid := len(ops) / 2
		switch fault {
		case faultUnknownOp:
			ops = slices.Insert(ops, mid, Op{Kind: "frobnicate", Path: "maps/m0.map"})
		case faultOpRejected:
			// set map of a key no worker map holds: HAProxy refuses it.
			ops = slices.Insert(ops, mid, Op{Kind: OpMapSet, Path: "maps/m0.map", Key: "missing.example", Value: "be-x"})
		}
	}
	man := e.c.manifestFrom(st, planID, want, ops...)
	if !auto {
		man.Mode = ModeReload
	}
	staleRefused := false
	switch fault {
	case faultStaleEpoch:
		if st.AppliedToken.LeaderEpoch > 0 {
			man.Token.LeaderEpoch = st.AppliedToken.LeaderEpoch - 1
			staleRefused = true
		}
	case faultMissingPrev:
		man.ExpectedPrevPlanID = "plan-that-no-longer-exists"
	case faultReloadFails:
		e.fake.With(func(fm *FakeModel) { fm.ReloadFails, fm.ReloadLog = true, failedReloadLog })
		defer e.fake.With(func(fm *FakeModel) { fm.ReloadFails, fm.ReloadLog = false, "" })
	}
	// Send the files the agent does not hold with the quoted proof.
	req := applyRequest{manifest: man, files: want, omit: map[string]bool{}, override: map[string]string{}}
	var sent []string
	for _, f := range man.Files {
		if held, ok := st.Files[f.Path]; ok && held.Proof == f.Proof && held.Digest == f.Digest {
			req.omit[f.Path] = true
		} else {
			sent = append(sent, f.Path)
		}
	}
	if fault == faultCorruptPart {
		if len(sent) == 0 {
			delete(req.omit, ConfigFilePath)
			sent = []string{ConfigFilePath}
		}
		req.override[sent[0]] = want[sent[0]] + "#"
	}
	code, body := e.c.post(req)
	s.record(s.faultOf, man.Mode, code, body)
	if code != 200 && code != 409 && code != 400 {
		t.Fatalf("status %d: %s", code, body)
	}

	switch {
	case staleRefused || fault == faultMissingPrev:
		s.expectRefusal(code, body, 409)
	case fault == faultCorruptPart:
		s.expectRefusal(code, body, 400)
	case fault == faultDirectory || fault == faultReloadFails:
		// A failed apply puts back exactly the tree it started from, and
		// the worker (HAProxy refused the reload, or the write failed before
		// it) serves on: the baseline the apply started from holds again.
		s.nackApplied = m.applied
		res := s.expectResult(code, body)
		stage := StageWrite
		if fault == faultReloadFails {
			stage = StageReload
		}
		if res.OK || res.Error == nil || res.Error.Stage != stage || res.Rollback == nil || !res.Rollback.Performed {
			t.Errorf("expected a NACK at %s: %+v %+v", stage, res, res.Error)
		}
		m.applied = s.nackApplied
	default:
		res := s.expectResult(code, body)
		if !res.OK {
			t.Errorf("expected an ACK: %+v %+v", res, res.Error)
			return
		}
		m.gen++
		m.disk = want
		m.applied = planID
		reloaded := !auto
		switch {
		case !auto:
		case fault == faultUnknownOp:
			m.opsExecutable++
			reloaded = true
		case len(ops) == 0:
		case m.foreignPending:
			m.applied = "" // the foreign worker invalidated this apply
			reloaded = true
		case fault == faultOpRejected:
			reloaded = true
		}
		wantMode := ResultRuntime
		switch {
		case reloaded:
			wantMode = ResultReload
			m.foreignPending = false
			m.lkg, m.lkgSet = planID, want.clone()
		case len(ops) == 0:
			wantMode = res.Mode // file_only or noop, depending on what was sent
		}
		if res.Mode != wantMode || (wantMode != ResultReload && wantMode != ResultRuntime && wantMode != ResultFileOnly && wantMode != ResultNoop) {
			t.Errorf("mode %s, want %s", res.Mode, wantMode)
		}
		if res.AppliedPlanID != m.applied {
			t.Errorf("ACK applied %q, want %q", res.AppliedPlanID, m.applied)
		}
		if res.Mode == ResultRuntime {
			awaitReadBacks(e.a)
		}
	}
}

// revert reverts the plan the agent would refuse: its applied pair, or its
// worker-ops pair, when that is not what the worker runs.
func (s *faultSim) revert(st State) {
	t, e, m := s.t, s.e, &s.model
	running := planRef{st.RunningPlanID, st.RunningPlanProof}
	var target planRef
	for _, p := range []planRef{{st.AppliedPlanID, st.AppliedPlanProof}, {st.WorkerOpsPlanID, st.WorkerOpsPlanProof}} {
		if p.Proof != "" && !samePlanRef(p, running) {
			target = p
			break
		}
	}
	if target.Proof == "" {
		// Nothing to refuse: a revert naming the running plan is fenced.
		target = running
		if target.Proof == "" {
			target = planRef{"plan-never-applied", "a:0"}
		}
		code, body := e.c.post(applyRequest{manifest: e.revertManifest(target.ID, target.Proof)})
		s.record(faultRevert, ModeRevertLKG, code, body)
		s.expectRefusal(code, body, 409)
		return
	}
	code, body := e.c.post(applyRequest{manifest: e.revertManifest(target.ID, target.Proof)})
	s.record(faultRevert, ModeRevertLKG, code, body)
	res := s.expectResult(code, body)
	if !res.OK || res.Mode != ResultReload || res.LKGPlanID != res.AppliedPlanID || res.AppliedPlanID != m.lkg {
		t.Errorf("revert: %+v %+v", res, res.Error)
	}
	m.gen++
	m.applied = m.lkg
	m.disk = m.lkgSet.clone()
	m.foreignPending = false
	s.reverted = true
}

func (s *faultSim) expectRefusal(code int, body []byte, want int) {
	if code != want {
		s.t.Errorf("status %d, want %d: %s", code, want, body)
	}
}

func (s *faultSim) expectResult(code int, body []byte) ApplyResult {
	var res ApplyResult
	if code != 200 {
		s.t.Errorf("status %d, want 200: %s", code, body)
		return res
	}
	if err := json.Unmarshal(body, &res); err != nil {
		s.t.Errorf("%v: %s", err, body)
	}
	if !res.OK && res.AppliedPlanID != s.nackApplied {
		s.t.Errorf("a NACK left applied %q, want %q", res.AppliedPlanID, s.nackApplied)
	}
	return res
}

// check compares the agent and the tree with the model after a step.
func (s *faultSim) check(fault int) {
	t, e, m := s.t, s.e, &s.model
	if got := e.disk(t); !sameSet(got, m.disk) {
		st := e.c.state("?plan=0")
		t.Errorf("tree %v\nwant %v\nrecorded %v", got.paths(), m.disk.paths(), st.Files)
		for p, c := range m.disk {
			if got[p] != c {
				t.Errorf("  %s = %q, want %q", p, got[p], c)
			}
		}
	}
	st := e.c.state("?plan=0")
	if st.Generation != m.gen {
		t.Errorf("generation %d, want %d", st.Generation, m.gen)
	}
	if st.AppliedPlanID != m.applied {
		t.Errorf("applied %q, want %q", st.AppliedPlanID, m.applied)
	}
	if st.LKGPlanID != m.lkg {
		t.Errorf("LKG %q, want %q", st.LKGPlanID, m.lkg)
	}
	for _, name := range []string{invGenerationMonotonic, invDiskIsTheDesiredSet, invRuntimeModeDoesNotReload,
		invReloadModeReloads, invNoopRunsNoOps, invJournalOnlyWhileDiverged,
		invOpsExecutable, invRecoveryReload} {
		want := uint64(0)
		if name == invOpsExecutable {
			want = m.opsExecutable
		}
		if got := e.a.metrics.invariantViolations.value(name); got != want {
			t.Errorf("invariant %s fired %d times, want %d", name, got, want)
		}
	}
	if s.reverted && st.LKGPlanID != st.AppliedPlanID {
		t.Errorf("after a revert LKG %q != applied %q", st.LKGPlanID, st.AppliedPlanID)
	}
}

func TestFaultSimulation(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			newFaultSim(t, seed).run(24)
		})
	}
}

// TestFaultSimulationSoak runs one agent through 10,000 steps when
// HAPTIC_SOAK=1.
func TestFaultSimulationSoak(t *testing.T) {
	if os.Getenv("HAPTIC_SOAK") != "1" {
		t.Skip("HAPTIC_SOAK is not 1; the 10,000-step soak is skipped")
	}
	newFaultSim(t, 20261202).run(10000)
}

// TestVerifiedReadsStayConsistentDuringApplies races verified state reads
// against applies: every read sees a generation that never goes back, an
// applied plan that matches its generation, and file digests of one of the
// sets applied so far.
func TestVerifiedReadsStayConsistentDuringApplies(t *testing.T) {
	e, fs := landedEnv(t, nil, nil)
	genOf := map[string]uint64{"plan-1": 1}
	contents := map[string]bool{DigestString(fs["maps/host.map"]): true}
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newAgentClient(t, e.a)
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				st := c.state("?verify=1&plan=0")
				mu.Lock()
				g, known := genOf[st.AppliedPlanID]
				digestKnown := contents[st.Files["maps/host.map"].Digest]
				mu.Unlock()
				if st.Generation < last || (known && g != st.Generation) || !digestKnown {
					t.Errorf("inconsistent read: generation %d after %d, applied %q (generation %d), map digest %s",
						st.Generation, last, st.AppliedPlanID, g, st.Files["maps/host.map"].Digest)
					return
				}
				last = st.Generation
			}
		}()
	}
	cur := fs
	for i := range 16 {
		next := cur.clone()
		key := fmt.Sprintf("c%d.example", i)
		next["maps/host.map"] += key + " be-c\n"
		planID := fmt.Sprintf("plan-c%d", i)
		mu.Lock()
		genOf[planID] = uint64(i + 2)
		contents[DigestString(next["maps/host.map"])] = true
		mu.Unlock()
		res := e.c.apply(e.c.manifest(planID, next, Op{Kind: OpMapAdd, Path: "maps/host.map", Key: key, Value: "be-c"}), next)
		if !res.OK || res.Mode != ResultRuntime {
			t.Errorf("apply %d: %+v", i, res)
		}
		cur = next
	}
	close(stop)
	wg.Wait()
	if st := e.c.state("?verify=1"); st.Generation != 17 || st.InvariantViolation != "" || st.AppliedPlanID != "plan-c15" {
		t.Errorf("final %+v", st)
	}
}
