// This file holds what bounds one apply request's cost on the agent before
// and while it is admitted, beside the pipeline in agent_apply.go: how many
// applies may be past authentication at once, how a manifest is measured
// before it is decoded, and how a staging failure is answered (the agent's
// fault or the client's).

package haptic

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// maxAppliesInFlight bounds the apply requests past authentication and
// readiness that are reading their manifest, waiting for the apply lock or
// running: one runs, one is decoded and waits to start as soon as the lock
// frees. Each holds a manifest of up to MaxPlanBlobBytes and its decoded
// form; unbounded, 16 queued manifests of 8 MiB took 1.4 GB. Further
// requests wait before they read any of their body.
const maxAppliesInFlight = 2

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
// bounds decodes, and is refused, as if the first were not there.
//
// A manifest of at most smallManifestBytes skips the first pass: it cannot
// build much or hold more files than validation accepts, and validation
// refuses its other lists with the same words. A first pass that fails
// (bad syntax, not an object) decoded nothing large; the second reports it.
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
// pass: MaxFiles entries of even the shortest file object do not fit in it.
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
		s.OpBatches.top >= MaxOpBatches ||
		s.Files.all+s.Ops.all+s.OpBatches.all+s.InPlaceOps.all > maxManifestListElements
	for i := range min(s.OpBatches.top, MaxOpBatches) {
		over = over || s.OpBatches.inner[i] > MaxOpsPerApply
	}
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
	i := 0
	for i < len(data) && isJSONSpace(data[i]) {
		i++
	}
	if i == len(data) || data[i] != '[' {
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
	firstPending := false // just after '[': the next value, if any, is an element
	for ; i < len(data); i++ {
		c := data[i]
		if isJSONSpace(c) {
			continue
		}
		if firstPending {
			firstPending = false
			if c != ']' {
				count()
			}
		}
		switch c {
		case '"':
			i = endOfJSONString(data, i)
		case '[':
			isList = append(isList, true)
			firstPending = true
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

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

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

// stagingStatus is the HTTP status of a failed staging: 400 for the
// client's fault (a part that does not match or is not listed, a body cut
// short); for the agent's own disk 507 when it or the quota is full, 500
// otherwise (read-only, immutable, I/O error). A 5xx tells the controller
// that its render is fine and may be retried once the pod is repaired.
func stagingStatus(err error) int {
	var fault *stagingFault
	switch {
	case !errors.As(err, &fault):
		return http.StatusBadRequest
	case isNoSpace(fault.err):
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
