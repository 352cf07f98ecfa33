// This file holds what bounds a request's cost on the agent before and
// while it is admitted, beside the pipeline in agent_apply.go: the memory
// request bodies may hold and the decodes that may run at once, how a
// manifest is measured before it is decoded, and how a staging failure is
// answered (the agent's fault or the client's).

package haptic

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Request memory. The bytes of request bodies the agent holds in memory
// (a manifest, a plan body or part and the plan JSON it decodes to, a file
// part small enough to ride in the record, a state answer's marshalled
// part) come from one budget of maxHeldBodyBytes as they arrive, and go
// back when the request ends; a decoded manifest is held at
// decodedManifestFactor times its bytes, the most its elements can cost.
// Decoding (a manifest, a plan blob that may inflate to MaxPlanJSONBytes, a
// plan patch) runs maxDecodes at a time, with the whole body in. A request
// short of bytes may cut holders whose clients send nothing (take): eight
// uploads of 8 MiB then a byte every 10 s refused every leader push.
// Unbounded, 16 manifests of 8 MiB took 1.4 GB, and 24 zstd bombs 1.28 GB.
const (
	maxHeldBodyBytes      = 64 << 20
	maxDecodes            = 1
	decodedManifestFactor = 12
	budgetWait            = time.Second
	pressureStall         = 500 * time.Millisecond
)

var errMemoryBusy = fmt.Errorf("the agent holds as many request bytes as it may (%d MiB) for other requests; retry", maxHeldBodyBytes>>20)
var errCutForMemory = fmt.Errorf("the request was cut: others waited for the memory it held while its client moved nothing for %s; retry", pressureStall)

// Once requests that held bigWorkBytes or more are done, and nothing like
// them came for idleFreeAfter, the agent hands the memory it no longer
// holds back to the operating system: Go's collector keeps a heap that
// grew for a big plan's decode until the next collection, and its
// scavenger returns it slowly, so an idle agent holding a 13 MB plan sat
// at twice the memory it held.
const (
	bigWorkBytes  = 4 << 20
	idleFreeAfter = time.Second
)

// memoryBudget is the agent's budget of held request bytes, the requests
// holding some, and its decode slots.
type memoryBudget struct {
	decodes  chan struct{}
	mu       sync.Mutex
	free     int64
	holders  map[*heldBytes]bool
	released chan struct{} // closed, and replaced, when bytes come back
	idle     *time.Timer   // hands memory back once big work is idle
	handBack func()        // debug.FreeOSMemory; tests observe it
}

// handBackWhenIdle hands the memory big work left back once it is idle.
func (b *memoryBudget) handBackWhenIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.idle == nil {
		b.idle = time.AfterFunc(idleFreeAfter, func() { b.handBack() })
	}
	b.idle.Reset(idleFreeAfter)
}

func newMemoryBudget() *memoryBudget {
	return &memoryBudget{decodes: make(chan struct{}, maxDecodes), free: maxHeldBodyBytes,
		holders: map[*heldBytes]bool{}, released: make(chan struct{}), handBack: debug.FreeOSMemory}
}

// heldBytes is what one request holds of the budget, which release gives
// back when the request ends, and the pace its client is held to (hold):
// the body it reads (as r.Body) or the answer it writes.
type heldBytes struct {
	budget *memoryBudget
	ctx    context.Context
	n      int64

	io.ReadCloser                       // the body, or
	answer        http.ResponseWriter   // the answer
	deadline      func(time.Time) error // the connection's read or write deadline
	what          string
	window, whole time.Duration
	until         time.Time
	quota, owed   int           // bytes a window must move, and still needs
	spent         time.Duration // what the window waited on the client so far
	waiting       atomic.Int64  // since when (Unix ns) the client is waited on; 0 when it is not
	cut           atomic.Bool   // memory pressure cut it
}

// take takes n more bytes, waiting up to budgetWait for them and cutting
// each holder whose client has moved nothing for pressureStall (two of
// Linux's minimum retransmission timeouts), never one the agent is busy
// with; then it refuses, so requests waiting for each other's bytes never
// deadlock. A request may take more than is free only when it holds the
// rest, so that one larger than the whole budget runs alone.
func (h *heldBytes) take(n int) error {
	b := h.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	for giveUp := time.Now().Add(budgetWait); int64(n) > b.free && b.free+h.n < maxHeldBodyBytes; {
		now := time.Now()
		if !now.Before(giveUp) || h.ctx.Err() != nil {
			return errMemoryBusy
		}
		for o := range b.holders {
			if w := o.waiting.Load(); w != 0 && now.UnixNano()-w >= int64(pressureStall) && !o.cut.Swap(true) {
				o.deadline(now)
			}
		}
		released := b.released
		b.mu.Unlock()
		select { // a holder becomes cuttable: look again after a while
		case <-released:
		case <-time.After(min(giveUp.Sub(now), pressureStall/5)):
		case <-h.ctx.Done():
		}
		b.mu.Lock()
	}
	b.free -= int64(n)
	h.n += int64(n)
	b.holders[h] = true
	return nil
}

func (h *heldBytes) release() {
	h.budget.mu.Lock()
	h.budget.free += h.n
	big := h.n >= bigWorkBytes
	h.n = 0
	delete(h.budget.holders, h)
	close(h.budget.released)
	h.budget.released = make(chan struct{})
	h.budget.mu.Unlock()
	if big {
		h.budget.handBackWhenIdle()
	}
}

// reader takes every byte read through it from the budget.
func (h *heldBytes) reader(r io.Reader) io.Reader { return heldReader{r, h} }

type heldReader struct {
	r io.Reader
	h *heldBytes
}

func (r heldReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p[:min(len(p), chunkBytes)])
	if n > 0 {
		err = cmp.Or(r.h.take(n), err) // a refusal wins over the reader's own error
	}
	return n, err
}

// Client pace. A body must come, and an answer be taken, at minBodyRate:
// each paceWindow the agent waits on its client (its own time does not
// count) must move minBodyRate×paceWindow bytes, and a window restarts
// once they moved, so a trickle after a burst is cut a window after it.
// The first window is the grace (Kestrel's); 64 KiB/s is under an eighth
// of the 546 KiB/s the largest body needs within the 2-minute read limit,
// which still ends the request: no client that could finish is cut.
const (
	paceWindow  = 5 * time.Second
	minBodyRate = 64 << 10 // bytes a second
	chunkBytes  = 64 << 10 // the most a held read brings before the budget counts it, or an answer writes under one deadline
)

// hold starts r's share of the memory budget, pacing its body, or with
// answer its answer.
func (a *Agent) hold(w http.ResponseWriter, r *http.Request, answer bool) *heldBytes {
	rc := http.NewResponseController(w)
	srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	srv = cmp.Or(srv, &http.Server{}) // a handler called without a server sets no deadlines
	h := &heldBytes{budget: a.memory, ctx: r.Context(), what: "upload", deadline: rc.SetReadDeadline,
		whole: srv.ReadTimeout, window: a.paceWindow, quota: int(minBodyRate * a.paceWindow / time.Second)}
	if answer {
		h.answer, h.what, h.deadline, h.whole = w, "answer", rc.SetWriteDeadline, srv.WriteTimeout
	} else {
		h.ReadCloser = http.MaxBytesReader(w, r.Body, MaxApplyBodyBytes)
		r.Body = h
	}
	h.until, h.owed = time.Now().Add(h.whole), h.quota
	return h
}

func (h *heldBytes) Read(b []byte) (int, error) {
	return h.step(func() (int, error) { return h.ReadCloser.Read(b) })
}

// Write writes b under one deadline: writeState hands it chunkBytes at most.
func (h *heldBytes) Write(b []byte) (int, error) {
	return h.step(func() (int, error) { return h.answer.Write(b) })
}

// step moves bytes with move under the window's deadline. It marks the
// client waited on after it set the deadline, so that a cut's comes after.
func (h *heldBytes) step(move func() (int, error)) (n int, err error) {
	start := time.Now()
	h.deadline(start.Add(min(h.window-h.spent, h.until.Sub(start))))
	h.waiting.Store(start.UnixNano())
	if err = errCutForMemory; !h.cut.Load() {
		n, err = move()
	}
	h.waiting.Store(0)
	h.spent += time.Since(start)
	if h.owed -= n; h.owed <= 0 {
		h.owed, h.spent = h.quota, 0
	}
	switch {
	case !errors.Is(err, os.ErrDeadlineExceeded):
	case h.cut.Load():
		err = errCutForMemory
	case time.Now().Before(h.until):
		err = fmt.Errorf("the %s fell below %d KiB/s: fewer than %d bytes in %s", h.what, minBodyRate>>10, h.quota, h.window)
	default:
		err = fmt.Errorf("the %s took longer than the %s a request may", h.what, h.whole)
	}
	return n, err
}

// decode runs f in a decode slot.
func (h *heldBytes) decode(f func() error) error {
	select {
	case h.budget.decodes <- struct{}{}:
	case <-h.ctx.Done():
		return h.ctx.Err()
	}
	defer func() { <-h.budget.decodes }()
	return f()
}

// maxManifestListElements bounds the list elements (files, ops, op batches
// and everything nested in them) one manifest may hold. A decoded element
// costs up to a few hundred bytes where its JSON costs three ("{},"), so a
// manifest within its byte limit could otherwise decode to gigabytes. A
// real manifest holds a few thousand, well below the bound.
const maxManifestListElements = 1 << 18

var errPlanIDEmpty = errors.New("plan_id is empty")

func tooManyFiles(n int) error {
	return fmt.Errorf("%d files exceed the %d-file limit", n, MaxFiles)
}

// decodeManifest decodes a manifest in two passes. The first measures its
// lists (through the same encoding/json field matching as the second, so
// "FILES" or an escaped key is measured like "files") without building any
// of their elements, and refuses a manifest whose lists exceed what
// validation accepts, with the text validation would have used. The second
// is a plain json.Unmarshal into Manifest, so every manifest within the
// bounds decodes, and is refused, as if the first were not there. A small
// manifest skips the first pass, and one the first pass cannot read (bad
// syntax, not an object) decoded nothing large: the second reports it.
func decodeManifest(b []byte) (*Manifest, error) {
	var shape manifestShape
	if len(b) > smallManifestBytes && json.Unmarshal(b, &shape) == nil {
		if err := shape.refusal(); err != nil {
			return nil, err
		}
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("invalid manifest: %w", err)
	}
	return &m, nil
}

// smallManifestBytes is the size below which a manifest is decoded in one
// pass: it cannot build much, MaxFiles entries of even the shortest file
// object do not fit in it, and validation refuses its other lists with the
// same words.
const smallManifestBytes = 64 << 10

// manifestShape is the first pass's view of a manifest: its plan id and
// the measures of its lists. The JSON names are Manifest's.
type manifestShape struct {
	PlanID     json.RawMessage `json:"plan_id"`
	Files      listShape       `json:"files"`
	Ops        listShape       `json:"ops"`
	OpBatches  listShape       `json:"op_batches"`
	InPlaceOps listShape       `json:"in_place_ops"`
}

// refusal returns nil when every list is within the bounds decoding may
// build, and otherwise the first refusal validation would give, in its
// order: the op budget, an empty plan id, the file count, then the element
// bound, which validation has no rule for. A legacy manifest's ops are
// measured too: building them is the cost being bounded.
func (s *manifestShape) refusal() error {
	over := s.Files.top > MaxFiles ||
		s.Ops.top+s.InPlaceOps.top > MaxOpsPerApply ||
		s.OpBatches.top >= MaxOpBatches || slices.Max(s.OpBatches.inner[:]) > MaxOpsPerApply ||
		s.Files.all+s.Ops.all+s.OpBatches.all+s.InPlaceOps.all > maxManifestListElements
	if !over {
		return nil
	}
	if err := validateOpCounts(s.Ops.top+s.InPlaceOps.top, s.OpBatches.top,
		func(i int) int { return s.OpBatches.inner[i] }); err != nil {
		return err
	}
	var planID string
	if len(s.PlanID) == 0 || (json.Unmarshal(s.PlanID, &planID) == nil && planID == "") {
		return errPlanIDEmpty
	}
	if s.Files.top > MaxFiles {
		return tooManyFiles(s.Files.top)
	}
	return fmt.Errorf("the manifest's lists hold more than %d elements", maxManifestListElements)
}

// listShape measures one JSON list without decoding it. A key that appears
// twice is measured at its largest, and its elements are counted twice.
type listShape struct {
	top   int               // elements of the list
	all   int               // list elements at any depth within it, its own included
	inner [MaxOpBatches]int // elements of each of its first MaxOpBatches elements that is a list
}

// UnmarshalJSON measures data and never fails: a value that is not a list
// measures as empty, and the second pass reports its type.
func (l *listShape) UnmarshalJSON(data []byte) error {
	top, all, inner := countListElements(data)
	l.top = max(l.top, top)
	l.all += all
	for i := range inner {
		l.inner[i] = max(l.inner[i], inner[i])
	}
	return nil
}

// countListElements measures the JSON list data as listShape holds it; any
// other value measures as zero. data is valid JSON: encoding/json checks the
// whole document before it calls an Unmarshaler. The walk allocates nothing
// but its container stack, whose depth encoding/json bounds.
func countListElements(data []byte) (top, all int, inner [MaxOpBatches]int) {
	data = bytes.TrimLeft(data, jsonSpace)
	if len(data) == 0 || data[0] != '[' {
		return 0, 0, inner
	}
	var isList []bool // the open containers, outermost first: true for a list
	count := func() {
		all++
		switch len(isList) {
		case 1:
			top++
		case 2:
			if top-1 < MaxOpBatches {
				inner[top-1]++
			}
		}
	}
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			i = endOfJSONString(data, i)
		case '[':
			isList = append(isList, true)
			if bytes.TrimLeft(data[i+1:], jsonSpace)[0] != ']' { // its first element
				count()
			}
		case '{':
			isList = append(isList, false)
		case ']', '}':
			isList = isList[:len(isList)-1]
		case ',':
			if isList[len(isList)-1] {
				count()
			}
		}
	}
	return top, all, inner
}

const jsonSpace = " \t\n\r"

// endOfJSONString returns the index of the quote that closes the string
// opening at data[start].
func endOfJSONString(data []byte, start int) int {
	for i := start + 1; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(data)
}

// clientFaultStatus is 400 for a body the client got wrong, and 503 for
// one the memory budget could not hold now.
func clientFaultStatus(err error) int {
	if errors.Is(err, errMemoryBusy) || errors.Is(err, errCutForMemory) {
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// stagingStatus is the HTTP status of a failed staging: 400 for the
// client's fault (a part that does not match or is not listed, a body cut
// short), 503 for a part the memory budget could not hold now; for the
// agent's own disk 507 when it or the quota is full, 500 otherwise
// (read-only, immutable, I/O error). A 5xx tells the controller that its
// render is fine and may be retried.
func stagingStatus(err error) int {
	var fault *stagingFault
	switch {
	case !errors.As(err, &fault):
		return clientFaultStatus(err)
	case isNoSpace(fault.err):
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
