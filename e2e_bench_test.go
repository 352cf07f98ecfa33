// This file owns the end-to-end benchmarks against a real HAProxy
// (HAPTIC_HAPROXY; 3.0 is the reference): each one measures an agent apply
// and the bare HAProxy operation it stands for, interleaved in one run on
// one HAProxy, and reports both medians and their ratio, so the machine's
// noise hits both sides alike. BENCHMARKS.md records the results and the
// commands. Nothing here asserts a time.

package haptic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// benchSamples collects the per-iteration durations of the two sides and
// the agent's own account of where its time went.
type benchSamples struct {
	agent, raw []time.Duration
	timing     []ApplyTiming
	datasync   []time.Duration // the disk's own cost of one durable record, when measured
	httpFloor  []time.Duration // a bare POST of the same body, when measured
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// report publishes the medians in milliseconds and the agent/raw ratio;
// ns/op is the agent's median, so benchstat compares the agent side.
func (s *benchSamples) report(b *testing.B) {
	a, r := median(s.agent), median(s.raw)
	b.ReportMetric(float64(a.Nanoseconds()), "ns/op")
	b.ReportMetric(float64(a.Microseconds())/1000, "agent-ms")
	b.ReportMetric(float64(r.Microseconds())/1000, "raw-ms")
	if r > 0 {
		b.ReportMetric(float64(a)/float64(r), "ratio")
	}
	if len(s.datasync) > 0 {
		// The budget of a durable one-entry change: the raw round trip,
		// the one durable record before the first rename, and half a
		// millisecond for the rest.
		d := median(s.datasync)
		budget := r + d + 500*time.Microsecond
		b.ReportMetric(float64(d.Microseconds())/1000, "fdatasync-ms")
		b.ReportMetric(float64(budget.Microseconds())/1000, "budget-ms")
		b.ReportMetric(float64(a)/float64(budget), "of-budget")
	}
	if len(s.httpFloor) > 0 {
		// What no apply can go below on this machine: the HTTP exchange
		// alone plus the raw round trip, against the 3× raw goal.
		f := median(s.httpFloor)
		b.ReportMetric(float64(f.Microseconds())/1000, "http-floor-ms")
		b.ReportMetric(float64(f+r)/float64(r), "floor-ratio")
	}
	if len(s.timing) > 0 {
		part := func(f func(ApplyTiming) int64) float64 {
			v := make([]int64, len(s.timing))
			for i, t := range s.timing {
				v[i] = f(t)
			}
			slices.Sort(v)
			return float64(v[len(v)/2])
		}
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.TotalMs }), "total-ms")
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.StageMs }), "stage-ms")
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.AdmitMs }), "admit-ms")
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.WriteMs }), "write-ms")
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.OpsMs }), "ops-ms")
		b.ReportMetric(part(func(t ApplyTiming) int64 { return t.FinishMs }), "finish-ms")
	}
}

// benchApply composes what a controller sends for plan after reading st:
// the plan's files with their proofs, ops in mode, and a part for every
// file the agent does not hold with the same digest and proof.
func benchApply(st *State, plan *Plan, ops []Op, mode string) (*Manifest, map[string]io.Reader) {
	m := &Manifest{IdentityVersion: ExactIdentityVersion, PlanID: plan.ID, PlanSchemaVersion: PlanSchemaVersion,
		Token:              Token{LeaderEpoch: 1, RenderSeq: st.AppliedToken.RenderSeq + 1},
		ExpectedPrevPlanID: st.AppliedPlanID, ExpectedPrevPlanProof: st.AppliedPlanProof, ExpectedPrevToken: st.AppliedToken,
		ExpectedWorkerOpsPlanID: st.WorkerOpsPlanID, ExpectedWorkerOpsPlanProof: st.WorkerOpsPlanProof,
		Files: ManifestFiles(plan), Ops: ops, Mode: mode}
	parts := map[string]io.Reader{}
	for _, f := range plan.Files {
		if held, ok := st.Files[f.Path]; !ok || held.Digest != f.Digest || held.Proof != f.Digest {
			parts[f.Path] = strings.NewReader(f.Content)
		}
	}
	return m, parts
}

// benchEnv is the end-to-end environment after its first deploy.
func benchEnv(b *testing.B) (*e2eEnv, e2eRender) {
	e := startE2E(b, nil)
	r := e.firstRender(b)
	if res := e.deploy(b, e.plan(r)); !res.OK {
		b.Fatalf("first deploy: %+v", res.Error)
	}
	return e, r
}

// applyTimed sends one apply and returns how long the answer took and the
// agent's timing of it.
func (e *e2eEnv) applyTimed(b *testing.B, plan *Plan, ops []Op, mode, want string) (time.Duration, ApplyTiming) {
	st := e.state(b)
	m, parts := benchApply(st, plan, ops, mode)
	start := time.Now()
	res, err := e.c.Apply(context.Background(), m, parts, nil)
	took := time.Since(start)
	if err != nil || !res.OK || res.Mode != want {
		b.Fatalf("apply %s: want %s, got %+v %v", plan.ID, want, res, err)
	}
	e.awaitReadBacks() // outside the timed part: the answer does not wait for it
	return took, res.Timing
}

// add records one agent sample.
func (s *benchSamples) add(took time.Duration, timing ApplyTiming) {
	s.agent = append(s.agent, took)
	s.timing = append(s.timing, timing)
}

// rawLine sends one line on its own worker connection, reads to EOF, and
// returns the reply and the time it took.
func rawLine(b *testing.B, socket, line string) (string, time.Duration) {
	start := time.Now()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, line); err != nil {
		b.Fatal(err)
	}
	reply, err := io.ReadAll(conn)
	if err != nil {
		b.Fatal(err)
	}
	return string(reply), time.Since(start)
}

// BenchmarkRealMapEntryApply: a runtime apply adding one map entry (the
// POST /v1/apply a controller sends, read-back excluded) against the raw
// round trip of the same `add map` line on the worker socket, a bare
// fdatasync of the bytes the apply adds to the log, written in place as
// the log writes them (datasyncProbe), and the bare HTTP exchange of its
// body, all in the same iterations. Each iteration also removes the entry again on
// both sides, untimed.
//
// It is also the phase table: the median wall time of each stage the
// answer waits for, between the points testHookPhase is told of. The sync
// runs beside the op's round trip and the install's writes, so "sync"
// overlaps "op" and "prepare", and "sync-wait" is what the answer waits
// for the sync after them; every other stage follows the one before it,
// and together they make agent-ms.
func BenchmarkRealMapEntryApply(b *testing.B) {
	e, r := benchEnv(b)
	without := e.plan(r)
	with := e.plan(r.with(func(r *e2eRender) { r.hostMap += "bench.test be-b\n" }))
	addOp := Op{Kind: OpMapAdd, Path: e2eHostMap, Key: "bench.test", Value: "be-b"}
	delOp := Op{Kind: OpMapDel, Path: e2eHostMap, Key: "bench.test"}
	log := openDatasyncProbe(b, e)
	floor := startHTTPFloor(b, with, addOp)
	var clock phaseClock
	testHookPhase = clock.pass
	b.Cleanup(func() { testHookPhase = nil })
	var s benchSamples
	took := map[string][]time.Duration{}
	for b.Loop() {
		m, parts := benchApply(e.state(b), with, []Op{addOp}, ModeAuto)
		clock.start()
		var sent, received time.Time
		var res *ApplyResult
		var err error
		log.measure(e, func() {
			sent = time.Now()
			res, err = e.c.Apply(context.Background(), m, parts, nil)
			received = time.Now()
		})
		at := clock.stop()
		if err != nil || !res.OK || res.Mode != ResultRuntime {
			b.Fatalf("apply: %+v %v", res, err)
		}
		at["sent"], at["received"] = sent, received
		for _, st := range phaseStages {
			if at[st.from].IsZero() || at[st.to].IsZero() {
				b.Fatalf("the apply passed no point %q or %q: %v", st.from, st.to, at)
			}
			took[st.name] = append(took[st.name], at[st.to].Sub(at[st.from]))
		}
		s.add(received.Sub(sent), res.Timing)
		e.awaitReadBacks()
		e.applyTimed(b, without, []Op{delOp}, ModeAuto, ResultRuntime)
		s.httpFloor = append(s.httpFloor, floor.post(b))
		s.addRawMapEntry(b, e, log)
	}
	s.report(b)
	for _, st := range phaseStages {
		b.ReportMetric(float64(median(took[st.name]).Nanoseconds())/1000, st.name+"-us")
	}
}

// phaseStages are the stages of BenchmarkRealMapEntryApply, each between
// two points: the client's (sent, received) or testHookPhase's.
var phaseStages = []struct{ name, from, to string }{
	{"to-handler", "sent", "handler"},        // the client's encoding, the request's headers
	{"read-decode", "handler", "manifest"},   // the manifest read, decoded and validated
	{"stage", "manifest", "staged"},          // the fence, the map's part read and verified
	{"admit", "staged", "admitted"},          // the apply lock, the plan's checks, the steps
	{"link", "admitted", "linked"},           // the changes listed, paths linked aside
	{"record-write", "linked", "recorded"},   // the record built, encoded and written
	{"prepare", "recorded", "prepared"},      // the install's bytes written, beside the sync
	{"op", "prepared", "ops"},                // the op compiled and its round trip, beside the sync
	{"sync", "recorded", "synced"},           // the record's fdatasync
	{"sync-wait", "ops", "awaited"},          // what is left of the sync after them
	{"install", "awaited", "installed"},      // the op's reply judged, the map renamed
	{"end-record", "installed", "ended"},     // the end record, the answer filled
	{"answer", "ended", "answering"},         // the answer checked and logged
	{"from-answer", "answering", "received"}, // the answer encoded, sent, read and decoded
}

// phaseClock keeps when the one timed apply passed each point.
type phaseClock struct {
	mu sync.Mutex
	at map[string]time.Time // nil outside the timed apply
}

func (c *phaseClock) pass(point string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at != nil {
		c.at[point] = now
	}
}

func (c *phaseClock) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = map[string]time.Time{}
}

func (c *phaseClock) stop() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.at
	c.at = nil
	return at
}

// addRawMapEntry is the raw side of a one-entry map benchmark: the timed
// round trip of `add map` bench-raw.test on the worker socket, the untimed
// `del map` that undoes it, and the disk's cost of one durable record.
func (s *benchSamples) addRawMapEntry(b *testing.B, e *e2eEnv, log *datasyncProbe) {
	rawAdd := linePrefix + frameCommand("add map "+e2eHostMap, "bench-raw.test be-b\n", terminatorFor(e.h.Version()))
	reply, took := rawLine(b, e.h.WorkerSocket(), rawAdd)
	if strings.Contains(reply, "]: ") && !strings.Contains(reply, "[6]") {
		b.Fatalf("raw add map: %q", reply)
	}
	s.raw = append(s.raw, took)
	rawLine(b, e.h.WorkerSocket(), linePrefix+"del map "+e2eHostMap+" bench-raw.test\n")
	s.datasync = append(s.datasync, log.sample(b))
}

// httpFloor is a loopback HTTP server whose handler only reads a
// multipart body and answers an apply-sized JSON, and the one-entry
// apply's body for it: one POST costs what the HTTP exchange of an apply
// costs before the agent does anything.
type httpFloor struct {
	url, contentType string
	body             []byte
	c                *http.Client
}

func startHTTPFloor(b *testing.B, plan *Plan, op Op) *httpFloor {
	answer := bytes.Repeat([]byte("a"), 777)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mr, err := r.MultipartReader()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for p, err := mr.NextPart(); err == nil; p, err = mr.NextPart() {
			io.Copy(io.Discard, p)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	m, _ := benchApply(&State{}, plan, []Op{op}, ModeAuto)
	manifest, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField(PartManifest, string(manifest))
	fw, _ := mw.CreateFormFile("file", e2eHostMap)
	for _, f := range plan.Files {
		if f.Path == e2eHostMap {
			io.WriteString(fw, f.Content)
		}
	}
	mw.Close()
	return &httpFloor{url: srv.URL + PathApply, contentType: mw.FormDataContentType(), body: body.Bytes(), c: srv.Client()}
}

func (f *httpFloor) post(b *testing.B) time.Duration {
	start := time.Now()
	resp, err := f.c.Post(f.url, f.contentType, bytes.NewReader(f.body))
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start)
}

// datasyncProbe is a file beside the agent's state, written as the agent's
// log is: zeros synced ahead, and once per iteration the bytes the timed
// apply added to the log (its record and its end record, which the next
// apply's sync carries) written over them and fdatasync'ed. It is the
// disk's own cost of one durable record, measured in the same run as the
// agent.
type datasyncProbe struct {
	f    *os.File
	at   int64
	size int64 // the bytes the last timed apply added to the log
}

const datasyncProbeBytes = 8 << 20

func openDatasyncProbe(b *testing.B, e *e2eEnv) *datasyncProbe {
	f, err := os.OpenFile(filepath.Join(e.a.cfg.BaseDir, ".bench-datasync"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		_, err = f.Write(make([]byte, datasyncProbeBytes))
	}
	if err == nil {
		err = datasync(f)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	return &datasyncProbe{f: f, size: 512}
}

// measure notes what the apply that run made the log grow by; a
// compaction after it empties the log, and leaves the last size.
func (p *datasyncProbe) measure(e *e2eEnv, run func()) {
	before := logEnd(e.a)
	run()
	if grew := logEnd(e.a) - before; grew > 0 {
		p.size = grew
	}
}

// logEnd is where a's log puts its next record.
func logEnd(a *Agent) int64 {
	a.led.mu.Lock()
	defer a.led.mu.Unlock()
	return a.led.log.bytes
}

func (p *datasyncProbe) sample(b *testing.B) time.Duration {
	if p.at+p.size > datasyncProbeBytes {
		p.at = 0
	}
	record := bytes.Repeat([]byte("r"), int(p.size))
	start := time.Now()
	if _, err := p.f.WriteAt(record, p.at); err != nil {
		b.Fatal(err)
	}
	if err := datasync(p.f); err != nil {
		b.Fatal(err)
	}
	p.at += p.size
	return time.Since(start)
}

// BenchmarkRealReloadApply: a reload apply (a changed frontend section)
// against the raw master `reload` until the new worker answers `show
// info`, polled every millisecond.
func BenchmarkRealReloadApply(b *testing.B) {
	e, r := benchEnv(b)
	plans := []*Plan{
		e.plan(r.with(func(r *e2eRender) { r.label = "bench-a" })),
		e.plan(r.with(func(r *e2eRender) { r.label = "bench-b" })),
	}
	var s benchSamples
	for i := 0; b.Loop(); i++ {
		s.add(e.applyTimed(b, plans[i%2], nil, ModeReload, ResultReload))
		s.raw = append(s.raw, rawReload(b, e))
		// Let the agent adopt the worker the raw reload started, so its
		// next reload waits for a worker of its own.
		if _, err := e.c.State(context.Background(), StateRead{Verify: true}); err != nil {
			b.Fatal(err)
		}
	}
	s.report(b)
}

var showInfoPid = regexp.MustCompile(`(?m)^Pid: (\d+)$`)

// rawReload reloads through the master socket and polls the worker socket
// until a worker with a new PID answers.
func rawReload(b *testing.B, e *e2eEnv) time.Duration {
	before := e.workerPID(b)
	start := time.Now()
	reply, _ := rawLine(b, e.h.MasterSocket(), "reload;quit\n")
	if strings.HasPrefix(reply, "Success=0") {
		b.Fatalf("raw reload: %s", reply)
	}
	for deadline := start.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		conn, err := net.Dial("unix", e.h.WorkerSocket())
		if err != nil {
			continue
		}
		io.WriteString(conn, "show info\n")
		out, _ := io.ReadAll(conn)
		conn.Close()
		if m := showInfoPid.FindSubmatch(out); m != nil {
			if pid, _ := strconv.Atoi(string(m[1])); pid != before {
				return time.Since(start)
			}
		}
	}
	b.Fatal("no new worker within 30s of a raw reload")
	return 0
}

// benchMap10k is a 10,000-entry host map pointing every host at backend.
func benchMap10k(backend string) string {
	var m strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&m, "host-%05d.example.com %s\n", i, backend)
	}
	return m.String()
}

// BenchmarkRealMapReplace10k: a runtime apply replacing a 10,000-entry map
// (one map_replace, the file as its part, read-back excluded) against the
// raw prepare / add @<ver> chunks / commit sequence of the same entries.
func BenchmarkRealMapReplace10k(b *testing.B) {
	e, r := benchEnv(b)
	plans := []*Plan{
		e.plan(r.with(func(r *e2eRender) { r.hostMap = benchMap10k("be-a") })),
		e.plan(r.with(func(r *e2eRender) { r.hostMap = benchMap10k("be-b") })),
	}
	op := Op{Kind: OpMapReplace, Path: e2eHostMap}
	term := terminatorFor(e.h.Version())
	var s benchSamples
	for i := 0; b.Loop(); i++ {
		s.add(e.applyTimed(b, plans[i%2], []Op{op}, ModeAuto, ResultRuntime))
		s.raw = append(s.raw, rawMapReplace(b, e.h.WorkerSocket(), benchMap10k([]string{"be-b", "be-a"}[i%2]), term))
	}
	s.report(b)
}

// rawMapReplace swaps a map by hand: prepare a version, add the entries to
// it in payload chunks of at most MaxPayloadBytes, commit it.
func rawMapReplace(b *testing.B, socket, entries, term string) time.Duration {
	chunks, err := chunkLines(entries, MaxPayloadBytes)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	reply, _ := rawLine(b, socket, linePrefix+"prepare map "+e2eHostMap+"\n")
	version, ok := mapVersion(strings.TrimSpace(reply))
	if !ok {
		b.Fatalf("prepare map: %q", reply)
	}
	for _, chunk := range chunks {
		rawLine(b, socket, linePrefix+frameCommand("add map @"+version+" "+e2eHostMap, chunk, term))
	}
	if reply, _ := rawLine(b, socket, linePrefix+"commit map @"+version+" "+e2eHostMap+"\n"); strings.TrimSpace(reply) != "" {
		b.Fatalf("commit map: %q", reply)
	}
	return time.Since(start)
}

// procStatusKiB reads one "<field>: <n> kB" line of /proc/<pid>/status.
func procStatusKiB(b testing.TB, pid int, field string) uint64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// BenchmarkAgentPeakRSS64MiB runs the agent as a child process (on the
// real HAProxy when HAPTIC_HAPROXY names one, else on a fake the parent
// serves) and sends it file-only applies of a 64 MiB body: one general
// file filling the body limit. It reports the child's peak RSS above its
// idle RSS; the peak is reset before each apply (clear_refs 5). Run it
// without -race, which multiplies every allocation.
func BenchmarkAgentPeakRSS64MiB(b *testing.B) {
	var base, master, worker, config string
	if os.Getenv("HAPTIC_HAPROXY") != "" {
		h := startRealHAProxy(b)
		base, master, worker = h.Dir, h.MasterSocket(), h.WorkerSocket()
		raw, err := os.ReadFile(filepath.Join(h.Dir, ConfigFilePath))
		if err != nil {
			b.Fatal(err)
		}
		config = string(raw)
		b.Logf("on HAProxy %s", h.Version())
	} else {
		fake := startTestFake(b, "")
		base, master, worker = b.TempDir(), fake.MasterSocket(), fake.WorkerSocket()
		config = "global\n  maxconn 100\n"
		b.Log("on the fake HAProxy (set HAPTIC_HAPROXY for a real one)")
	}
	child := startAgentChild(b, agentChildConfig{BaseDir: base, MasterSocket: master, WorkerSocket: worker,
		AddrFile: filepath.Join(b.TempDir(), "addr")})
	// The first apply after a start reloads; it lands the config.
	child.land(b, "rss-seed", fileSet{ConfigFilePath: config})

	// A body of at most MaxApplyBodyBytes: the file, the manifest and the
	// multipart framing.
	big := make([]byte, MaxApplyBodyBytes-64<<10)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	var peaks, idles []float64
	for i := 0; b.Loop(); i++ {
		big[0] = byte('0' + i%10) // a new file every time
		fs := fileSet{ConfigFilePath: config, "blob/big.bin": string(big)}
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", child.pid()), []byte("5"), 0); err != nil {
			b.Fatalf("resetting the peak RSS: %v", err)
		}
		idle := procStatusKiB(b, child.pid(), "VmRSS")
		res := child.land(b, fmt.Sprintf("rss-%d", i), fs)
		if res.Mode != ResultFileOnly {
			b.Fatalf("want a file_only apply, got %s", res.Mode)
		}
		peak := procStatusKiB(b, child.pid(), "VmHWM")
		peaks = append(peaks, float64(peak-min(peak, idle))/1024)
		idles = append(idles, float64(idle)/1024)
	}
	slices.Sort(peaks)
	slices.Sort(idles)
	b.ReportMetric(idles[len(idles)/2], "idle-MiB")
	b.ReportMetric(peaks[len(peaks)/2], "MiB-above-idle")
	b.ReportMetric(peaks[len(peaks)-1], "max-MiB-above-idle")
}
