// This file owns the load test: two controllers with different leader
// epochs and several state readers hammering one agent on the fake HAProxy,
// judged by what must hold under contention — fencing (no apply of the
// stale epoch lands after the newer leader's first), nothing lost (every
// OK apply is one link of the applied-token chain and one generation), and
// bounded memory. It runs 3 s by default and 30 s with HAPTIC_LOAD=1, and
// reports throughput in the test log; it never times an assertion.

package haptic

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	loadReaders   = 4
	loadConfig    = "global\n  maxconn 100\n\nfrontend http-in\n  bind :80\n  use_backend %[req.hdr(host),map(maps/host.map)]\n"
	loadMapPath   = "maps/host.map"
	loadKey       = "load.test"
	loadHeapSlack = 32 << 20 // heap growth allowed over the run, after GC
)

// loadApply is one apply a controller sent and what became of it.
type loadApply struct {
	epoch    uint64
	value    string
	started  time.Time // before its state read
	answered time.Time
	result   *ApplyResult // nil unless 200
	reason   string       // the conflict reason of a 409
	err      error        // anything else
}

// loadObservation is one state read.
type loadObservation struct {
	generation uint64
	token      Token
}

// loadMapFile is the map a controller renders for value.
func loadMapFile(value string) string { return loadKey + " " + value + "\n" }

// loadManifest composes what a controller of epoch sends after reading st:
// the config (held, so no part) and the map with one map_set.
func loadManifest(st *State, epoch uint64, value string) *Manifest {
	m := loadMapFile(value)
	return &Manifest{
		IdentityVersion: ExactIdentityVersion, PlanID: "load-" + value, PlanSchemaVersion: PlanSchemaVersion,
		Token:              Token{LeaderEpoch: epoch, RenderSeq: st.AppliedToken.RenderSeq + 1},
		ExpectedPrevPlanID: st.AppliedPlanID, ExpectedPrevPlanProof: st.AppliedPlanProof, ExpectedPrevToken: st.AppliedToken,
		ExpectedWorkerOpsPlanID: st.WorkerOpsPlanID, ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files: []ManifestFile{
			{Path: ConfigFilePath, Digest: DigestString(loadConfig), Proof: testProof(loadConfig), Size: int64(len(loadConfig)),
				Kind: FileKindConfig, ReloadOnChange: true},
			{Path: loadMapPath, Digest: DigestString(m), Proof: testProof(m), Size: int64(len(m)), Kind: FileKindMap},
		},
		Ops:  []Op{{Kind: OpMapSet, Path: loadMapPath, Key: loadKey, Value: value}},
		Mode: ModeAuto,
	}
}

// runLoadController reads state and applies, as fast as the agent answers,
// until ctx ends. Every attempt is recorded. An apply is never cut by the
// end of the run: one cut after the agent took it would land unrecorded.
func runLoadController(ctx context.Context, c *Client, epoch uint64, record func(loadApply)) {
	for n := 0; ctx.Err() == nil; n++ {
		started := time.Now()
		st, err := c.State(context.Background(), StateRead{})
		if err != nil {
			record(loadApply{epoch: epoch, started: started, err: err})
			return
		}
		value := fmt.Sprintf("e%d-n%d-s%d", epoch, n, st.AppliedToken.RenderSeq+1)
		a := loadApply{epoch: epoch, value: value, started: started}
		parts := map[string]io.Reader{loadMapPath: strings.NewReader(loadMapFile(value))}
		res, err := c.Apply(context.Background(), loadManifest(st, epoch, value), parts, nil)
		var ce *ConflictError
		switch {
		case err == nil:
			a.result = res
		case errors.As(err, &ce):
			a.reason = ce.Reason
		default:
			a.err = err
		}
		a.answered = time.Now()
		record(a)
	}
}

// rssBytes reads the resident set size of this process.
func rssBytes() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapAfterGC is the live heap once the garbage collector has run.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestLoadTwoLeadersAndReaders: leader epoch 1 applies from the start,
// leader epoch 2 joins after a third of the run, and four readers read
// state (every fourth read verified) throughout.
func TestLoadTwoLeadersAndReaders(t *testing.T) {
	duration := 3 * time.Second
	if os.Getenv("HAPTIC_LOAD") == "1" {
		duration = 30 * time.Second
	}
	e := newTestEnv(t, nil, nil)
	newClient := func() *Client {
		c, err := NewClient(&ClientConfig{BaseURL: "http://" + e.a.Addr(), Username: "haptic", Password: "s3cret"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The seed: a reload that makes the worker load the map.
	e.land(t, "seed", fileSet{ConfigFilePath: loadConfig, loadMapPath: loadMapFile("seed")})

	var (
		mu       sync.Mutex
		applies  []loadApply
		reads    [loadReaders][]loadObservation
		readErrs atomic.Int64
		peakRSS  atomic.Uint64
	)
	record := func(a loadApply) {
		mu.Lock()
		applies = append(applies, a)
		mu.Unlock()
	}
	heapBefore := heapAfterGC()

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { runLoadController(ctx, newClient(), 1, record) })
	wg.Go(func() {
		select {
		case <-time.After(duration / 3):
			runLoadController(ctx, newClient(), 2, record)
		case <-ctx.Done():
		}
	})
	for i := range loadReaders {
		c := newClient()
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				st, err := c.State(ctx, StateRead{Verify: n%4 == 3})
				if err != nil {
					if ctx.Err() == nil {
						readErrs.Add(1)
					}
					return
				}
				reads[i] = append(reads[i], loadObservation{st.Generation, st.AppliedToken})
			}
		})
	}
	wg.Go(func() {
		for tick := time.NewTicker(100 * time.Millisecond); ctx.Err() == nil; <-tick.C {
			if rss := rssBytes(); rss > peakRSS.Load() {
				peakRSS.Store(rss)
			}
		}
	})
	wg.Wait()
	awaitReadBacks(e.a)
	heapAfter := heapAfterGC()

	// Every attempt got an answer a controller racing another must be ready
	// for: no transport error and no refusal, only an OK result or a
	// conflict whose reason is prev_mismatch, stale_epoch or
	// worker_ops_mismatch (each tells the loser to re-read the state).
	okApplies, reasons := 0, map[string]int{}
	var chain []loadApply
	var newerLanded time.Time // when the first epoch-2 ACK was answered
	for _, a := range applies {
		switch {
		case a.err != nil:
			t.Fatalf("epoch %d apply %s: %v", a.epoch, a.value, a.err)
		case a.result != nil && !a.result.OK:
			t.Fatalf("epoch %d apply %s was refused: %+v", a.epoch, a.value, a.result.Error)
		case a.result != nil:
			okApplies++
			chain = append(chain, a)
			if a.epoch == 2 && (newerLanded.IsZero() || a.answered.Before(newerLanded)) {
				newerLanded = a.answered
			}
		default:
			reasons[a.reason]++
		}
	}
	if n := readErrs.Load(); n > 0 {
		t.Fatalf("%d state reads failed", n)
	}
	for reason := range reasons {
		if reason != ReasonPrevMismatch && reason != ReasonStaleEpoch && reason != ReasonWorkerOpsMismatch {
			t.Fatalf("conflict reason %q under load: %v", reason, reasons)
		}
	}
	if okApplies == 0 || newerLanded.IsZero() {
		t.Fatalf("no progress: %d OK applies, newer leader landed: %v", okApplies, !newerLanded.IsZero())
	}

	// Fencing: the chain of applied tokens (each OK apply names the one
	// before it) never goes back to epoch 1 once it reached epoch 2, and
	// every epoch-1 apply begun after the newer leader's first ACK is
	// refused as stale.
	slices.SortFunc(chain, func(x, y loadApply) int {
		return cmp.Compare(x.result.AppliedToken.RenderSeq, y.result.AppliedToken.RenderSeq)
	})
	for i, a := range chain {
		tok := a.result.AppliedToken
		if tok.LeaderEpoch != a.epoch || tok.RenderSeq != uint64(i)+2 {
			t.Fatalf("chain link %d: applied token %+v for an epoch-%d apply; want render_seq %d (the seed is 1)", i, tok, a.epoch, i+2)
		}
		if i > 0 && tok.LeaderEpoch < chain[i-1].result.AppliedToken.LeaderEpoch {
			t.Fatalf("epoch-1 apply %s landed after epoch 2's %s", a.value, chain[i-1].value)
		}
	}
	staleRefused := 0
	for _, a := range applies {
		if a.epoch != 1 || !a.started.After(newerLanded) {
			continue
		}
		if a.reason != ReasonStaleEpoch {
			t.Fatalf("epoch-1 apply %s begun after the newer leader landed: reason %q, result %+v", a.value, a.reason, a.result)
		}
		staleRefused++
	}
	if staleRefused == 0 {
		t.Fatal("the stale leader was never fenced with stale_epoch")
	}

	// Nothing lost: the generation counts the OK applies, and the last
	// link is what the agent holds, on disk and in the worker.
	st := e.c.state("?plan=0")
	last := chain[len(chain)-1]
	if st.Generation != uint64(okApplies)+1 {
		t.Fatalf("generation %d, want %d OK applies + the seed", st.Generation, okApplies)
	}
	if st.AppliedToken != last.result.AppliedToken || st.AppliedPlanID != "load-"+last.value {
		t.Fatalf("state holds %s %+v, the last OK apply was %s %+v", st.AppliedPlanID, st.AppliedToken, last.value, last.result.AppliedToken)
	}
	if got := e.disk(t)[loadMapPath]; got != loadMapFile(last.value) {
		t.Fatalf("disk map %q, want the last OK apply's %q", got, loadMapFile(last.value))
	}
	if got := e.fake.MapEntries(loadMapPath); len(got) != 1 || got[0].Value != last.value {
		t.Fatalf("worker map %v, want %s", got, last.value)
	}
	if st.InvariantViolation != "" || metricValue(e.a, "map_divergence_total") != 0 {
		t.Fatalf("invariant %q, divergences %d", st.InvariantViolation, metricValue(e.a, "map_divergence_total"))
	}

	// Readers never saw the agent go back in time.
	nReads := 0
	for i, obs := range reads {
		nReads += len(obs)
		for j := 1; j < len(obs); j++ {
			p, c := obs[j-1], obs[j]
			if c.generation < p.generation || c.token.LeaderEpoch < p.token.LeaderEpoch ||
				(c.generation > p.generation) != (c.token.RenderSeq > p.token.RenderSeq) {
				t.Fatalf("reader %d saw generation %d token %+v after generation %d token %+v", i, c.generation, c.token, p.generation, p.token)
			}
		}
	}

	// Memory stays bounded: the live heap after GC grew by less than the
	// slack, whatever the number of applies.
	if heapAfter > heapBefore+loadHeapSlack {
		t.Fatalf("live heap grew from %d to %d bytes over %d applies", heapBefore, heapAfter, len(applies))
	}
	totals := make([]int64, len(chain))
	for i, a := range chain {
		totals[i] = a.result.Timing.TotalMs
	}
	slices.Sort(totals)
	secs := duration.Seconds()
	t.Logf("%v: %d OK applies (%.0f/s, median total_ms %d), %d applies sent (%.0f/s), conflicts %v, %d state reads (%.0f/s); heap %d → %d KiB after GC (the test's own records included), peak RSS %d MiB",
		duration, okApplies, float64(okApplies)/secs, totals[len(totals)/2], len(applies), float64(len(applies))/secs, reasons,
		nReads, float64(nReads)/secs, heapBefore>>10, heapAfter>>10, peakRSS.Load()>>20)
}
