// This file owns the runtime ops of one apply: compiled whole before any
// line is sent, run on the worker the agent expects and judged there, the
// removal half of the deletes handed to the queue, and the in-place ops a
// worker that keeps serving until a scheduled reload takes.
//
// It never decides between ops and a reload (runApply does) and never
// touches the tree.

package haptic

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"
)

// opsOutcome is how the runtime ops ended, and how long they took.
type opsOutcome struct {
	compileErr error
	c          *compiledOps
	worker     HAProxyInfo
	results    []OpResult
	err        error
	ran        bool // a line reached the worker
	took       time.Duration
}

// runtimeOps compiles the manifest's runtime ops from the content the apply
// puts in place and runs them on the worker the agent expects.
func (d *applyDeps) runtimeOps(in *applyInput, ch changeSet) opsOutcome {
	start := d.now()
	var out opsOutcome
	out.c, out.compileErr = d.compile(in.m.RuntimeOps(), d.stagedContent(in, ch.dels))
	if out.compileErr == nil && !out.c.empty() {
		out.worker, out.results, out.ran, out.err = d.execute(in, out.c.programs)
	}
	out.took = d.now().Sub(start)
	return out
}

// stagedContent is what the apply puts at rel, before its renames: the
// staged part, else the held file. A path the apply deletes has no
// content, as it has none once the apply is installed.
func (d *applyDeps) stagedContent(in *applyInput, dels []string) func(rel string) ([]byte, error) {
	return func(rel string) ([]byte, error) {
		i, ok := slices.BinarySearchFunc(in.staged, rel, func(f *stagedFile, rel string) int { return cmp.Compare(f.Rel, rel) })
		if ok && !in.staged[i].unchanged {
			f := in.staged[i]
			if f.tmp != "" {
				return readAllLimited(d.files.disk, f.tmp, MaxApplyBodyBytes)
			}
			var b bytes.Buffer
			err := d.files.writeStaged(f, &b)
			return b.Bytes(), err
		}
		if slices.Contains(dels, rel) {
			return nil, fmt.Errorf("%q: %w (the apply deletes it)", rel, fs.ErrNotExist)
		}
		return d.files.readHeld(rel)
	}
}

// runInPlace runs the in-place ops in a single execution against the
// worker they were composed for. Any failure invalidates the baseline; the
// apply stays OK and never triggers a second reload.
func (d *applyDeps) runInPlace(in *applyInput) ([]OpResult, *ApplyError) {
	m := in.m
	fail := func(err error) *ApplyError {
		d.led.invalidate()
		d.logger.Warn("in-place ops failed; the baseline is invalidated", "plan_id", m.PlanID, "err", err)
		return &ApplyError{Stage: StageInPlace, Message: err.Error()}
	}
	if st := d.led.state(); !samePlanRef(planRef{m.ExpectedWorkerOpsPlanID, m.ExpectedWorkerOpsPlanProof}, st.WorkerOps) {
		return nil, fail(errors.New(msgInPlaceStale))
	}
	c, err := d.compile(m.InPlaceOps, d.files.readHeld)
	if err != nil {
		d.invariant(errors.Is(err, errVersionLimit), invOpsExecutable)
		return nil, fail(err)
	}
	worker, results, _, err := d.execute(in, c.programs)
	if err == nil {
		err = d.enqueueDeletes(worker, c)
	}
	if err != nil {
		return results, fail(err)
	}
	d.led.foldCreated(c.certs, c.caFiles)
	return results, nil
}

// compiledOps is a batch ready to run, with the notes the read-back and
// the inventory need.
type compiledOps struct {
	programs []program
	servers  []serverRef
	backends []string

	maps, backendsTouched, certs, caFiles []string
}

func (c *compiledOps) empty() bool {
	return len(c.programs) == 0 && len(c.servers) == 0 && len(c.backends) == 0
}

// compile splits the deletes off, has the queue check them, and compiles
// every inline op before anything is sent: a batch whose last op cannot be
// compiled sends nothing.
func (d *applyDeps) compile(ops []Op, content func(string) ([]byte, error)) (*compiledOps, error) {
	inline, servers, backends := splitDeletes(ops)
	if err := d.queue.check(servers, backends); err != nil {
		return nil, err
	}
	c := &compiledOps{servers: servers, backends: backends}
	term := d.rt.terminator()
	for i := range inline {
		p, err := compileOp(&inline[i], content, term)
		if err != nil {
			return nil, err
		}
		c.programs = append(c.programs, p)
	}
	for _, op := range ops {
		switch op.Kind {
		case OpMapAdd, OpMapSet, OpMapDel, OpMapReplace:
			c.maps = appendUnique(c.maps, op.Path)
		case OpCertNew:
			c.certs = appendUnique(c.certs, op.Path)
		case OpCANew:
			c.caFiles = appendUnique(c.caFiles, op.Path)
		case OpServerAdd, OpServerEnable, OpServerDisable, OpServerSetAddr, OpServerSetWeight,
			OpServerSetState, OpServerWaitRemovable, OpShutdownSessions, OpServerDel:
			c.backendsTouched = appendUnique(c.backendsTouched, op.Backend)
		}
	}
	return c, nil
}

func appendUnique(s []string, v string) []string {
	if v == "" || slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// execute runs the programs MaxOpsPerApply at a time on the expected
// worker, stopping at the first failing chunk (counted by its first failed
// op's kind), and returns the worker they ran on and whether any line
// reached it. A batch of deletes alone sends no line, so the worker is
// checked on its own. A worker other than the expected one is adopted
// (which invalidates the baseline) and reported as errWorkerMoved, and so
// is a worker a concurrent verified read adopted while the ops ran.
func (d *applyDeps) execute(in *applyInput, programs []program) (HAProxyInfo, []OpResult, bool, error) {
	expected := d.led.state().Worker
	if len(programs) == 0 {
		observed, err := d.checkWorker(in.ctx)
		if err != nil {
			err = fmt.Errorf("%w: %w", errWorkerMoved, err)
		}
		return observed, nil, false, err
	}
	var results []OpResult
	for start := 0; start < len(programs); start += MaxOpsPerApply {
		chunk := programs[start:min(start+MaxOpsPerApply, len(programs))]
		res, observed, err := d.rt.executeAs(in.ctx, chunk, &expected)
		if errors.Is(err, errWorkerMoved) {
			d.adoptWorker(in.ctx, observed)
			return observed, results, true, err
		}
		results = append(results, res...)
		if err != nil {
			d.metrics.opErrors.inc(firstFailedKind(results))
			return observed, results, true, err
		}
	}
	if now := d.led.state().Worker; !now.SameWorker(expected) {
		return now, results, true, fmt.Errorf("%w: %w", errWorkerMoved, workerChangedError(expected, now))
	}
	return expected, results, true, nil
}

// firstFailedKind attributes a failed batch to its first failed op.
func firstFailedKind(results []OpResult) string {
	for _, r := range results {
		if !r.OK {
			return r.Kind
		}
	}
	return "unknown"
}

// enqueueDeletes hands the removal half of the deletes to the queue, only
// after the inline half succeeded and the worker was re-checked.
func (d *applyDeps) enqueueDeletes(worker HAProxyInfo, c *compiledOps) error {
	if len(c.servers) == 0 && len(c.backends) == 0 {
		return nil
	}
	if err := d.queue.enqueue(worker, c.servers, c.backends); err != nil {
		return err
	}
	d.queue.wake()
	return nil
}
