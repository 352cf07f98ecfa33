// This file owns the agent's way to HAProxy: the worker and master
// sockets. A compiled line travels on a connection of its own, its reply is
// counted, cut into segments and judged, one result per program; then come
// the reads, the master's show proc and reload, and the worker session the
// deferred-delete queue runs on. What an op becomes is
// agent_runtime_compile.go's.
//
// It must never retry a line that may have landed, never read a cut reply
// as silence (silence is success in HAProxy's CLI), never send a word that
// did not pass the token grammar, and never let a session reconnect (a new
// connection could reach another worker). It talks to HAProxy with the
// standard library only.

package haptic

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
)

// Socket constants; runtimeConfig overrides the timeouts in tests.
const (
	readPrefix      = "set severity-output number;" // show info and show stat: they need no experimental mode
	identityCommand = "show info float"             // the worker's identity: parseWorkerInfo reads it

	runtimeIOTimeout     = 30 * time.Second
	connectRetryPause    = 100 * time.Millisecond
	maxRuntimeReplyBytes = 64 << 20
	workerSessionTimeout = 30 * time.Second
	maxSessionReplyBytes = 65536
	workerPrompt         = "\n> "
	reloadPollInterval   = 100 * time.Millisecond
	systemCA             = "@system-ca"
)

// The layer's typed errors; the agent tells failures apart with errors.Is.
var (
	errNameCollision      = errors.New("backend name already in use")
	errWaitExpired        = errors.New("wait delay expired")
	errRejected           = errors.New("haproxy rejected the command")
	errUnreadableResponse = errors.New("unreadable runtime response")
	errReloadRejected     = errors.New("failed to reload configuration")
	errReloadTimeout      = errors.New("no new worker within the reload timeout")
	errReloadBusy         = errors.New("another reload is still in progress")
	errTooManyEntries     = errors.New("runtime listing exceeds the entry limit")
	errWorkerGone         = errors.New("the deferred delete's HAProxy worker has changed")
	errWorkerMoved        = errors.New("the commands reached another HAProxy worker than expected")
	errNoIdentity         = errors.New("no worker identity")
)

// runtimeError has its own text yet matches the errors it stands for under
// errors.Is, so that a message can say what happened in the operator's terms
// ("reload: no new worker within 1m0s") without repeating the sentinel's.
type runtimeError struct {
	msg  string
	kind []error
}

func (e *runtimeError) Error() string   { return e.msg }
func (e *runtimeError) Unwrap() []error { return e.kind }

// runtimeConfig configures the layer; a zero duration is the default.
type runtimeConfig struct {
	WorkerSocket, MasterSocket string
	Logger                     *slog.Logger
	IOTimeout, ReloadTimeout   time.Duration // zero = 30s / 60s
	SessionTimeout             time.Duration // zero = 30s (interactive worker session)
	ConnectRetryPause          time.Duration // zero = 100ms (pause before the one dial retry)
}

// haproxyRuntime is the agent's only way to HAProxy. It holds no connection:
// every line and every read dials its own, so it needs no lock around
// exchanges; the agent's apply lock keeps a single apply-path writer.
type haproxyRuntime struct {
	runtimeConfig // every default filled in

	// dial opens one unix connection; tests replace it to count dials.
	dial func(ctx context.Context, path string, deadline time.Time) (net.Conn, error)

	term atomic.Value // the payload terminator for the worker the last info named
}

// newHAProxyRuntime builds the layer. It dials nothing: the agent starts
// before HAProxy answers, and readiness is probed later (probe).
func newHAProxyRuntime(cfg runtimeConfig) *haproxyRuntime {
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.IOTimeout = cmp.Or(cfg.IOTimeout, runtimeIOTimeout)
	cfg.ReloadTimeout = cmp.Or(cfg.ReloadTimeout, MaxReloadMs*time.Millisecond)
	cfg.SessionTimeout = cmp.Or(cfg.SessionTimeout, workerSessionTimeout)
	cfg.ConnectRetryPause = cmp.Or(cfg.ConnectRetryPause, connectRetryPause)
	return &haproxyRuntime{
		runtimeConfig: cfg,
		dial: func(ctx context.Context, path string, deadline time.Time) (net.Conn, error) {
			return (&net.Dialer{Deadline: deadline}).DialContext(ctx, "unix", path)
		},
	}
}

// roundTrip is one exchange, one line on a connection of its own: HAProxy
// answers a non-interactive worker connection's line and closes it, and 3.0
// discards any further line already sent on it. It dials (once more when the
// dial fails: nothing was written), writes the whole line and reads to EOF.
// delivered reports whether the write completed: after it, an error means
// the command may have landed and is never retried.
func (r *haproxyRuntime) roundTrip(ctx context.Context, path, line string, deadline time.Time) (raw []byte, delivered bool, err error) {
	if ctxDeadline, ok := ctx.Deadline(); ok && ctxDeadline.Before(deadline) {
		deadline = ctxDeadline
	}
	conn, err := r.dial(ctx, path, deadline)
	if err != nil && pause(ctx, r.ConnectRetryPause) {
		conn, err = r.dial(ctx, path, deadline)
	}
	if err != nil {
		return nil, false, transportError(ctx, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err = conn.SetDeadline(deadline); err == nil {
		_, err = io.WriteString(conn, line)
	}
	if err != nil {
		return nil, false, transportError(ctx, err)
	}
	raw, err = io.ReadAll(io.LimitReader(conn, maxRuntimeReplyBytes+1))
	if len(raw) > maxRuntimeReplyBytes {
		return nil, true, fmt.Errorf("runtime socket: reply exceeds %d bytes", maxRuntimeReplyBytes)
	}
	if err != nil {
		err = transportError(ctx, err)
	}
	return raw, true, err
}

// pause waits d unless ctx ends first, and reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return ctx.Err() == nil
}

// transportError reports a socket failure; a cancelled context is reported
// as such rather than as the closed connection it caused.
func transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = ctx.Err()
	}
	return fmt.Errorf("runtime socket: %w", err)
}

// exchange sends one line to the worker, allowing IOTimeout + its wait budget.
func (r *haproxyRuntime) exchange(ctx context.Context, line string, waitBudget time.Duration) ([]byte, error) {
	raw, _, err := r.roundTrip(ctx, r.WorkerSocket, line, time.Now().Add(r.IOTimeout+waitBudget))
	return raw, err
}

// responseEnds returns where each whole response of a raw reply ends.
// HAProxy answers every command of a line, in order, with one response (a
// lone '\n' for a silent command, else lines then an empty line), so a
// complete reply to k commands is exactly k responses: counting them tells a
// cut reply from silence. partial reports a tail that is not a whole
// response (a connection closed mid-reply, or HAProxy's "command is too big"
// error, which ends in one '\n').
func responseEnds(raw []byte) (ends []int, partial bool) {
	for pos := 0; pos < len(raw); ends = append(ends, pos) {
		if raw[pos] == '\n' {
			pos++
		} else if i := bytes.Index(raw[pos:], []byte("\n\n")); i >= 0 {
			pos += i + 2
		} else {
			return ends, true
		}
	}
	return ends, false
}

// trimReply strips one trailing prompt, one trailing '\n', then whitespace.
func trimReply(s string) string {
	s = strings.TrimSuffix(s, workerPrompt)
	s = strings.TrimSuffix(s, "\n")
	return strings.TrimRightFunc(s, unicode.IsSpace)
}

// responses cuts a reply that must be exactly k whole responses into them:
// a short reply is an error, never a short listing.
func responses(raw []byte, k int) ([]string, error) {
	ends, partial := responseEnds(raw)
	if partial || len(ends) != k {
		return nil, incompleteReply(len(ends), k)
	}
	out, start := make([]string, k), 0
	for i, end := range ends {
		out[i], start = string(raw[start:end]), end
	}
	return out, nil
}

func incompleteReply(n, k int) error {
	return &runtimeError{fmt.Sprintf("runtime socket: incomplete reply (%d of %d responses)", n, k), []error{errUnreadableResponse}}
}

// splitSegments cuts a post-processed reply into the non-empty responses.
// A silent command yields no segment.
func splitSegments(text string) []string {
	var segs []string
	for piece := range strings.SplitSeq(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		piece = strings.TrimRight(strings.TrimLeft(piece, "\n"), " \n")
		if piece != "" {
			segs = append(segs, piece)
		}
	}
	return segs
}

// rejectionPhrases refuse a WARNING-level or untagged response. HAProxy
// reports many refusals without a severity below WARNING (set server addr
// answers at [4] whether it worked or not), so the words decide.
var rejectionPhrases = []string{
	"unknown command", "no such", "not found", "doesn't exist", "does not exist",
	"already used by other proxy", "already exists", "permission denied", "unable to",
	"cannot", "can't", "invalid", "unsupported", "failed", "error", "problem converting",
	"through configuration file",
}

// severityTag reads the "[N]:" tag that "set severity-output number" puts
// before a message: the level and the text after it, or -1 when untagged.
func severityTag(segment string) (level int, rest string) {
	if len(segment) >= 4 && segment[0] == '[' && segment[1] >= '0' && segment[1] <= '7' && segment[2] == ']' && segment[3] == ':' {
		return int(segment[1] - '0'), segment[4:]
	}
	return -1, segment
}

// classify judges one response segment.
func classify(segment string) error {
	level, rest := severityTag(segment)
	text := strings.ToLower(rest)
	switch {
	case strings.Contains(text, "already used by other proxy"):
		return errNameCollision
	case strings.Contains(text, "wait delay expired"):
		return errWaitExpired
	case strings.Contains(text, "unknown command"), level >= 0 && level <= 3:
		// HAProxy answers an unknown verb at [6] ("Unknown command: 'add',
		// but maybe…"), so the level alone would call it a success.
		return errRejected
	case level < 5 && slices.ContainsFunc(rejectionPhrases, func(p string) bool { return strings.Contains(text, p) }):
		return errRejected
	}
	return nil
}

// prefixEntry stands for both prefix commands of every line when a reply is
// matched: callers of matchSegments put it first.
var prefixEntry = command{Text: strings.TrimSuffix(linePrefix, ";"), Optional: true}

// matchSegments walks the commands with a segment cursor and also returns
// the segment each command consumed (HAProxy's words for the op result).
func matchSegments(segments []string, cmds []command) (errs []error, outputs []string) {
	errs, outputs = make([]error, len(cmds)), make([]string, len(cmds))
	cursor, failed := 0, false
	for i, c := range cmds {
		next, seg, left := nextAnchor(cmds[i+1:]), "", cursor < len(segments)
		if left {
			seg = segments[cursor]
		}
		switch {
		case failed:
			errs[i] = errUnreadableResponse
		case c.Optional:
			if left && classify(seg) == nil && !containsFold(seg, next) {
				outputs[i], cursor = seg, cursor+1
			}
		case c.Expect == "":
			if left && !containsFold(seg, next) {
				outputs[i], errs[i], cursor = seg, classify(seg), cursor+1
			}
		case !left:
			errs[i] = errUnreadableResponse
		default:
			outputs[i], errs[i], cursor = seg, classify(seg), cursor+1
			if errs[i] == nil && !containsFold(seg, c.Expect) {
				errs[i] = errUnreadableResponse
			}
		}
		failed = errs[i] != nil
	}
	return errs, outputs
}

// nextAnchor is the success text of the first anchored command in cmds.
func nextAnchor(cmds []command) string {
	for _, c := range cmds {
		if c.Expect != "" {
			return c.Expect
		}
	}
	return ""
}

// containsFold reports whether s contains a non-empty sub, ignoring case.
func containsFold(s, sub string) bool {
	return sub != "" && strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// lineVerdict is the judgement of one line's reply.
type lineVerdict struct {
	Errs    []error  // per command of the line, without the prefix
	Outputs []string // the segment each command consumed
	Version string   // the map version a successful capture returned
}

// judgeLine judges the raw reply to a line of cmds (without the prefix).
// Completeness decides before the segments do: a cut reply is never read as
// silence, so commands past the last whole response are outcome unknown.
func judgeLine(raw []byte, cmds []command) lineVerdict {
	ends, partial := responseEnds(raw)
	k, n := 2+len(cmds), len(ends)
	errs, outputs := matchSegments(splitSegments(trimReply(string(raw))), slices.Concat([]command{prefixEntry}, cmds))
	v := lineVerdict{Errs: errs[1:], Outputs: outputs[1:]}
	for i, c := range cmds {
		if !c.Capture || v.Errs[i] != nil {
			continue
		}
		if version, ok := mapVersion(v.Outputs[i]); ok {
			v.Version = version
			continue
		}
		v.Errs[i] = fmt.Errorf("%w: no map version in the reply", errUnreadableResponse)
		for j := i + 1; j < len(cmds); j++ {
			if v.Errs[j] == nil {
				v.Errs[j] = errUnreadableResponse
			}
		}
	}
	var unknown error
	first := len(cmds)
	switch {
	case n > k, n == k && partial:
		// A tail past the last command's response, whole or cut off, is
		// no command's: the reply cannot be matched to the line.
		unknown, first = fmt.Errorf("%w: more responses than commands", errUnreadableResponse), 0
	case n < k || partial:
		unknown, first = fmt.Errorf("%w: incomplete reply", errUnreadableResponse), max(n-2, 0)
	}
	for i := first; i < len(cmds); i++ {
		v.Errs[i] = unknown // whatever a segment past the last whole response said
	}
	return v
}

// mapVersion reads the version of "[6]: New version created: 3": the text
// after the last ':', which must be a uint64.
func mapVersion(segment string) (string, bool) {
	i := strings.LastIndexByte(segment, ':')
	v := strings.TrimSpace(segment[i+1:])
	if _, err := strconv.ParseUint(v, 10, 64); i < 0 || err != nil {
		return "", false
	}
	return v, true
}

// executeAs runs compiled programs in order and returns one result per
// program and the verdict. It stops after the first line with a failure:
// programs never sent keep their preset OK, and the agent falls back to a
// reload. A line whose reply cannot be read is outcome unknown, never
// refused.
//
// With an expected worker, every line's own connection first reads which
// worker answers (a connection to the worker socket reaches exactly one
// process); observed is the worker that ran the last line sent, and a line
// that reached another worker stops the execution with errWorkerMoved.
// Checking in the same exchange as the ops costs no round trip and names
// exactly the process the ops ran on.
func (r *haproxyRuntime) executeAs(ctx context.Context, programs []program, expected *HAProxyInfo) (results []OpResult, observed HAProxyInfo, err error) {
	results = make([]OpResult, len(programs))
	for i, p := range programs {
		results[i] = OpResult{Kind: p.Kind, OK: true}
	}
	if len(programs) > MaxOpsPerApply {
		return results, observed, fmt.Errorf("%d ops exceed the %d-op limit", len(programs), MaxOpsPerApply)
	}
	run := &execution{r: r, ctx: ctx, programs: programs, results: results, expect: expected}
	err = run.all()
	// Lines run in program order and stop at the first failing one.
	failed := slices.IndexFunc(results, func(res OpResult) bool { return !res.OK })
	if err != nil && failed >= 0 && !errors.Is(err, errWorkerMoved) {
		if programs[failed].Kind == OpMapReplace {
			// No abort exists (compileMapReplace): the prepared version stays
			// behind, uncommitted and harmless.
			r.Logger.Warn("map replace failed; an uncommitted map version is left behind", "error", err)
		}
		run.abort(programs[failed])
	}
	return results, run.observed, err
}

// execution is the state of one execute call.
type execution struct {
	r        *haproxyRuntime
	ctx      context.Context
	programs []program
	results  []OpResult
	version  string // the last captured map version

	expect   *HAProxyInfo // the worker every line must reach; nil checks nothing
	observed HAProxyInfo  // the worker the last line reached
}

// line sends one rendered line (which starts with linePrefix). With an
// expected worker it reads the identity first and cuts that response out
// before the commands are judged.
func (e *execution) line(text string, budget time.Duration) ([]byte, error) {
	if e.expect == nil {
		return e.r.exchange(e.ctx, text, budget)
	}
	raw, err := e.r.exchange(e.ctx, linePrefix+identityCommand+";"+strings.TrimPrefix(text, linePrefix), budget)
	if err != nil {
		return nil, err
	}
	// The identity is the third response, after the two prefix commands'.
	ends, _ := responseEnds(raw)
	if len(ends) < 3 {
		return nil, incompleteReply(len(ends), 3)
	}
	info, err := e.r.identify(trimReply(string(raw[ends[1]:ends[2]])))
	if err != nil {
		return nil, err
	}
	e.observed = info
	return append(slices.Clone(raw[:ends[1]]), raw[ends[2]:]...), nil
}

// moved reports a line that reached another worker than expected.
func (e *execution) moved() error {
	if e.expect == nil || e.expect.SameWorker(e.observed) {
		return nil
	}
	return fmt.Errorf("%w: %w", errWorkerMoved, workerChangedError(*e.expect, e.observed))
}

func (e *execution) all() error {
	var b lineBuilder
	for pi, p := range e.programs {
		for _, c := range p.Commands {
			c.Text = strings.ReplaceAll(c.Text, versionPlaceholder, e.version)
			for _, line := range b.add(lineCommand{command: c, prog: pi}) {
				if err := e.send(line); err != nil {
					return err
				}
			}
		}
	}
	return e.send(b.take())
}

// send runs one line and records its verdicts; a repeated command, alone on
// its line, runs as often as repeat says.
func (e *execution) send(line []lineCommand) error {
	if len(line) == 0 {
		return nil
	}
	if c := line[0]; c.Repeat {
		return e.repeat(c.prog, c.command)
	}
	term := e.programs[line[len(line)-1].prog].Terminator
	raw, err := e.line(renderLine(line, term), lineWaitBudget(line))
	if err != nil {
		// The line may have landed: every command is outcome unknown.
		for _, c := range line {
			e.fail(c.prog, err.Error())
		}
		return &runtimeError{msg: err.Error(), kind: []error{err, errUnreadableResponse}}
	}
	cmds := make([]command, len(line))
	for i, c := range line {
		cmds[i] = c.command
	}
	v := judgeLine(raw, cmds)
	var lineErr error
	for i, c := range line {
		if v.Errs[i] != nil {
			lineErr = cmp.Or(lineErr, e.refuse(c.prog, v.Errs[i], v.Outputs[i]))
		}
	}
	if v.Version != "" {
		e.version = v.Version
	}
	if err := e.moved(); err != nil {
		return err
	}
	return lineErr
}

// fail marks a program failed, keeping the first output it got.
func (e *execution) fail(prog int, output string) {
	if e.results[prog].OK {
		e.results[prog].OK = false
		e.results[prog].Output = output
	}
}

// refuse fails a program on a command's verdict, HAProxy's words as its
// output when there are any, and returns the op's error.
func (e *execution) refuse(prog int, err error, output string) error {
	output = cmp.Or(output, err.Error())
	e.fail(prog, output)
	return fmt.Errorf("op %s: %w: %s", e.programs[prog].Kind, err, output)
}

// repeat runs "del map" alone on a line until HAProxy refuses it: HAProxy
// 3.4 deletes one duplicate per call, 3.0 and 2.6 all of them. Zero
// removals make the refusal the op's failure. A reply that cannot be read
// fails the op even after removals, since the key may still be there.
func (e *execution) repeat(prog int, c command) error {
	removals := 0
	for range MaxMapDelRepeat {
		raw, err := e.line(linePrefix+c.Text+"\n", 0)
		if err != nil {
			e.fail(prog, err.Error())
			return &runtimeError{msg: err.Error(), kind: []error{err, errUnreadableResponse}}
		}
		if err := e.moved(); err != nil {
			return err
		}
		v := judgeLine(raw, []command{c})
		if v.Errs[0] == nil {
			removals++
			continue
		}
		if removals > 0 && errors.Is(v.Errs[0], errRejected) {
			return nil
		}
		return e.refuse(prog, v.Errs[0], v.Outputs[0])
	}
	err := fmt.Errorf("%w: still not exhausted after %d calls", errUnreadableResponse, MaxMapDelRepeat)
	e.fail(prog, err.Error())
	return fmt.Errorf("op %s: %w", e.programs[prog].Kind, err)
}

// abort closes the transaction a failed certificate or CA program may have
// left open; each command alone on its line. Its failures are only logged:
// when another object's transaction is open the abort is refused too, and
// the fallback reload that follows ends it.
func (e *execution) abort(p program) {
	for _, c := range p.Abort {
		raw, err := e.r.exchange(e.ctx, linePrefix+c.Text+"\n", 0)
		if err == nil {
			err = judgeLine(raw, []command{c}).Errs[0]
		}
		if err != nil {
			e.r.Logger.Warn("cleanup command failed", "command", c.Text, "error", err)
		}
	}
}

// read sends one read command after prefix and returns its response.
func (r *haproxyRuntime) read(ctx context.Context, prefix, cmd string) (string, error) {
	texts, errs := r.readAll(ctx, prefix, []string{cmd})
	return texts[0], errs[0]
}

// readAll sends read commands on one line after prefix and returns each
// one's response, taken by position from a complete reply, or its refusal: a
// response tagged [0]: to [3]: is errRejected with HAProxy's words, never a
// listing. A reply that is cut or a socket that fails is every command's
// error. One connection instead of one per listing keeps the reads after a
// reload off the apply's answer as far as HAProxy allows.
func (r *haproxyRuntime) readAll(ctx context.Context, prefix string, cmds []string) ([]string, []error) {
	texts, errs := make([]string, len(cmds)), make([]error, len(cmds))
	// One response per prefix command, then the reads' own.
	skip := strings.Count(prefix, ";")
	raw, err := r.exchange(ctx, prefix+strings.Join(cmds, ";")+"\n", 0)
	var resp []string
	if err == nil {
		resp, err = responses(raw, skip+len(cmds))
	}
	for i := range cmds {
		if err != nil {
			errs[i] = err
			continue
		}
		texts[i] = trimReply(resp[skip+i])
		if level, _ := severityTag(texts[i]); level >= 0 && level <= 3 {
			first, _, _ := strings.Cut(texts[i], "\n")
			texts[i], errs[i] = "", fmt.Errorf("%w: %s", errRejected, first)
		}
	}
	return texts, errs
}

// info reads the worker's identity with "show info float" (identify).
func (r *haproxyRuntime) info(ctx context.Context) (HAProxyInfo, error) {
	text, err := r.read(ctx, readPrefix, identityCommand)
	if err != nil {
		return HAProxyInfo{}, fmt.Errorf("show info: %w", err)
	}
	return r.identify(text)
}

// identify parses a show info reply and keeps the version it names, which
// decides the payload framing of the lines that follow.
func (r *haproxyRuntime) identify(text string) (HAProxyInfo, error) {
	info, err := parseWorkerInfo(text)
	if err == nil {
		r.term.Store(terminatorFor(info.Version))
	}
	return info, err
}

func (r *haproxyRuntime) terminator() string {
	term, _ := r.term.Load().(string)
	return term
}

// parseWorkerInfo reads Version, Pid and Start_time_sec from show info.
func parseWorkerInfo(text string) (HAProxyInfo, error) {
	var info HAProxyInfo
	for line := range strings.SplitSeq(text, "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch key {
		case "Version":
			info.Version, info.FullVersion = value, value
		case "Pid":
			if pid, err := strconv.Atoi(value); err == nil {
				info.WorkerPID = pid
			}
		case "Start_time_sec":
			start, ok := parseStartMicros(value)
			if !ok {
				return HAProxyInfo{}, fmt.Errorf("show info: invalid worker start time %q", value)
			}
			info.WorkerStartTimeUnixMicros = start
		}
	}
	if !info.HasWorkerIdentity() {
		return HAProxyInfo{}, errors.New("show info: missing or invalid worker identity")
	}
	return info, nil
}

// parseStartMicros reads "<seconds>[.<fraction>]" (1796197563.683351) as
// microseconds without float arithmetic, which would round the last digit
// and make the same worker look new.
func parseStartMicros(v string) (int64, bool) {
	secText, frac, hasFrac := strings.Cut(v, ".")
	if !allDigits(secText) || hasFrac && (len(frac) > 9 || !allDigits(frac)) {
		return 0, false
	}
	secs, err := strconv.ParseInt(secText, 10, 64)
	micros, _ := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err != nil || secs > (math.MaxInt64-micros)/1_000_000 {
		return 0, false
	}
	total := secs*1_000_000 + micros
	return total, total > 0
}

func allDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// procList is what the agent reads of the master's show proc table.
type procList struct {
	FailedReloads       int
	Workers, OldWorkers []int
}

// showProc reads the master's process table. It is the master-socket
// readiness gate and tells a refused reload from an unreachable master.
// The master CLI keeps a connection open after a command unless told to
// quit: without ";quit" show proc would hang until the deadline.
func (r *haproxyRuntime) showProc(ctx context.Context) (procList, error) {
	raw, _, err := r.roundTrip(ctx, r.MasterSocket, "show proc;quit\n", time.Now().Add(r.IOTimeout))
	if err != nil {
		return procList{}, fmt.Errorf("show proc: %w", err)
	}
	return parseShowProc(trimReply(string(raw)))
}

// parseShowProc parses HAProxy's show proc table: a "#<PID>" header line,
// the master row (pid, "master", "<reloads> [failed: <n>]", uptime,
// version), then the rows under "# workers" (current), "# old workers"
// (still draining) and "# programs" / "# old programs", which are ignored.
// Rows split on whitespace; 3.0 and 2.6 always print "# programs", later
// versions only when a program exists, so neither is required.
func parseShowProc(text string) (procList, error) {
	var list procList
	lines := strings.Split(text, "\n")
	if !strings.HasPrefix(lines[0], "#<PID>") {
		return procList{}, fmt.Errorf("show proc: unexpected header %q", lines[0])
	}
	section, haveMaster := "", false
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, "#") {
			section = strings.TrimSpace(strings.TrimPrefix(line, "#"))
			continue
		}
		fields := strings.Fields(line)
		if len(fields) == 0 || section != "" && section != "workers" && section != "old workers" {
			continue // programs, whose rows are not ours to read
		}
		if len(fields) < 3 {
			return procList{}, fmt.Errorf("show proc: unreadable row %q", line)
		}
		pid, err1 := strconv.Atoi(fields[0])
		_, err2 := strconv.Atoi(fields[2])
		_, rest, _ := strings.Cut(line, "[failed: ")
		digits, _, closed := strings.Cut(rest, "]")
		failed, err3 := strconv.Atoi(digits)
		master := section == "" && fields[1] == "master"
		if err1 != nil || err2 != nil || master && (!closed || err3 != nil) {
			return procList{}, fmt.Errorf("show proc: unreadable row %q", line)
		}
		switch {
		case master:
			list.FailedReloads, haveMaster = failed, true
		case section == "workers":
			list.Workers = append(list.Workers, pid)
		case section == "old workers":
			list.OldWorkers = append(list.OldWorkers, pid)
		}
	}
	if !haveMaster {
		return procList{}, errors.New("show proc: no master row")
	}
	return list, nil
}

// reload asks the master to reload and judges the outcome. On HAProxy
// >= 2.7 the reply's Success= line decides; before that (2.6 answers a
// reload with an empty reply and closes) show proc does: a new worker PID
// is success, a risen failed counter is a rejection, neither within the
// reload timeout is a timeout.
//
// The reload timeout bounds all of it, the show proc baseline included: a
// master that stopped answering must cost the apply the configured reload
// timeout, not the socket's own I/O timeout.
func (r *haproxyRuntime) reload(ctx context.Context) (string, error) {
	deadline := time.Now().Add(r.ReloadTimeout)
	bctx, cancel := context.WithDeadline(ctx, deadline)
	base, err := r.showProc(bctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && time.Now().After(deadline) {
			// The reload was never sent: a master that does not answer is
			// no verdict on anything, and nothing may still take effect.
			return "", fmt.Errorf("reload: the master did not answer show proc within %v", r.ReloadTimeout)
		}
		return "", err
	}
	raw, delivered, err := r.roundTrip(ctx, r.MasterSocket, "reload;quit\n", deadline)
	if err != nil {
		switch {
		case !delivered, ctx.Err() != nil:
			// Never delivered (the master is gone), or the caller gave up.
			return "", err
		case len(raw) == 0 && errors.Is(err, os.ErrDeadlineExceeded):
			// A reload that hangs: no verdict from HAProxy, not a rejection.
			return "", &runtimeError{msg: fmt.Sprintf("reload: no reply within %v", r.ReloadTimeout), kind: []error{errReloadTimeout}}
		}
		// Any other read error after delivery: the master may be
		// re-executing; judge what arrived, else poll show proc.
	}
	text := trimReply(string(raw))
	status, _, _ := strings.Cut(text, "\n")
	if strings.HasPrefix(status, "Success=") {
		_, log, _ := strings.Cut(text+"\n", "\n--\n")
		log = strings.TrimRight(log, "\n")
		switch status {
		case "Success=1":
			return log, nil
		case "Success=0":
			if log == "Another reload is still in progress." {
				return log, errReloadBusy
			}
			return log, errReloadRejected
		default:
			return log, fmt.Errorf("reload: unknown status: %q", status)
		}
	}
	return r.awaitReload(ctx, base, text, deadline)
}

// awaitReload judges a reload without a Success= line by polling show proc
// until the reload deadline. Connection errors are tolerated: the master
// re-executes itself. The failed counter resets on every successful reload,
// so a rise above the baseline means this reload failed.
func (r *haproxyRuntime) awaitReload(ctx context.Context, base procList, reply string, deadline time.Time) (string, error) {
	pollCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tick := time.NewTicker(reloadPollInterval)
	defer tick.Stop()
	for {
		if procs, err := r.showProc(pollCtx); err == nil {
			if procs.FailedReloads > base.FailedReloads {
				log := fmt.Sprintf("reload failed: show proc failed count rose from %d to %d", base.FailedReloads, procs.FailedReloads)
				if reply != "" {
					log = reply + "\n" + log
				}
				return log, errReloadRejected
			}
			if slices.ContainsFunc(procs.Workers, func(w int) bool { return !slices.Contains(base.Workers, w) }) {
				return reply, nil
			}
		}
		select {
		case <-pollCtx.Done():
			if ctx.Err() != nil {
				return reply, fmt.Errorf("reload: %w", ctx.Err())
			}
			return reply, &runtimeError{msg: fmt.Sprintf("reload: no new worker within %v", r.ReloadTimeout), kind: []error{errReloadTimeout}}
		case <-tick.C:
		}
	}
}

// listensElsewhere asks the master which CLI sockets its current worker
// (@1: the new one, once a reload succeeded) listens on, for
// socketsElsewhere to judge. The grace bounds the question: a 3.x master
// that cannot reach the worker answers, then keeps the connection open.
func (r *haproxyRuntime) listensElsewhere(ctx context.Context) ([]string, error) {
	raw, _, err := r.roundTrip(ctx, r.MasterSocket, "@1 show cli sockets;quit\n", time.Now().Add(workerSocketGrace))
	if err != nil {
		return nil, nil
	}
	return socketsElsewhere(trimReply(string(raw)), r.WorkerSocket)
}

// probe is the readiness check: the worker answers with an identity, the
// master lists that worker, and the inventory reads. The worker may be
// listed as old: after a failed reload HAProxy 3.4 lists the worker that
// keeps serving under "# old workers", and "# workers" is empty.
func (r *haproxyRuntime) probe(ctx context.Context) (HAProxyInfo, Inventory, error) {
	info, err := r.info(ctx)
	if err != nil {
		return HAProxyInfo{}, Inventory{}, err
	}
	procs, err := r.showProc(ctx)
	if err != nil {
		return HAProxyInfo{}, Inventory{}, err
	}
	if !slices.Contains(slices.Concat(procs.Workers, procs.OldWorkers), info.WorkerPID) {
		return HAProxyInfo{}, Inventory{}, fmt.Errorf("show proc: the master does not list worker %d", info.WorkerPID)
	}
	_, inv, err := r.listWorker(ctx, 1, false)
	return info, inv, err
}

// dataLines returns a listing's data lines (blank and '#' lines dropped),
// at most MaxInventoryEntries; what names the listing in the error.
func dataLines(what, text string) ([]string, error) {
	var lines []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	if len(lines) > MaxInventoryEntries {
		return nil, fmt.Errorf("%s: %w (%d rows)", what, errTooManyEntries, len(lines))
	}
	return lines, nil
}

// listWorker lists what the worker has loaded: maps, certificates, CA
// files, CRL files and crt-lists, each sorted and deduplicated (a file with
// an open transaction is listed twice). The five listings travel on one
// line, after the worker's identity when withIdentity is set. An identity
// that cannot be read is an errNoIdentity error with no inventory; a
// listing that fails is reported, and the others still count.
func (r *haproxyRuntime) listWorker(ctx context.Context, generation uint64, withIdentity bool) (HAProxyInfo, Inventory, error) {
	inv := Inventory{Generation: generation}
	listings := []struct {
		cmd  string
		into *[]string
	}{{"show map", &inv.Maps}, {"show ssl cert", &inv.Certs}, {"show ssl ca-file", &inv.CAFiles},
		{"show ssl crl-file", &inv.CRLFiles}, {"show ssl crt-list", &inv.CRTLists}}
	cmds := []string{identityCommand}
	for _, l := range listings {
		cmds = append(cmds, l.cmd)
	}
	if !withIdentity {
		cmds = cmds[1:]
	}
	texts, readErrs := r.readAll(ctx, linePrefix, cmds)
	var info HAProxyInfo
	if withIdentity {
		err := readErrs[0]
		if err == nil {
			info, err = r.identify(texts[0])
		}
		if err != nil {
			return HAProxyInfo{}, inv, fmt.Errorf("%w: %w", errNoIdentity, err)
		}
		texts, readErrs = texts[1:], readErrs[1:]
	}
	var errs []error
	for i, l := range listings {
		lines, err := dataLines(l.cmd, texts[i])
		if readErrs[i] != nil {
			err = fmt.Errorf("%s: %w", l.cmd, readErrs[i])
		}
		names := []string{}
		for _, line := range lines {
			if name := listedName(l.cmd, line); name != "" {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		*l.into, errs = slices.Compact(names), append(errs, err)
	}
	return info, inv, errors.Join(errs...)
}

// listedName is the object one listing row names: the file in the
// parentheses of a show map row, else the first field, less the '*' that
// marks an object with an open transaction (a crt-list row has none). The
// system CA store is HAProxy's own, no file of ours. line is a data line, so
// it has a first field.
func listedName(cmd, line string) string {
	f := strings.Fields(line)
	switch {
	case cmd == "show map":
		_, rest, _ := strings.Cut(line, "(")
		if name, _, closed := strings.Cut(rest, ")"); closed {
			return name
		}
		return ""
	case cmd == "show ssl crt-list":
		return f[0]
	case cmd == "show ssl ca-file" && strings.TrimPrefix(f[0], "*") == systemCA:
		return ""
	}
	return strings.TrimPrefix(f[0], "*")
}

// mapEntries reads the running entries of one map: rows
// "<address> <key> <value>" with the value's inner spaces kept and
// duplicates in order.
func (r *haproxyRuntime) mapEntries(ctx context.Context, path string) (map[string][]string, error) {
	if err := checkToken("path", path); err != nil {
		return nil, err
	}
	cmd := "show map " + path
	text, err := r.read(ctx, linePrefix, cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	entries := make(map[string][]string)
	rows := 0
	for row := range strings.SplitSeq(text, "\n") {
		if row == "" {
			continue
		}
		if rows++; rows > MaxMapEntries {
			return nil, fmt.Errorf("%s: %w (more than %d rows)", cmd, errTooManyEntries, MaxMapEntries)
		}
		_, rest, ok := strings.Cut(row, " ")
		if !ok {
			continue
		}
		key, value, _ := strings.Cut(rest, " ")
		entries[key] = append(entries[key], value)
	}
	return entries, nil
}

// serverNames lists the servers of one backend from show servers state.
func (r *haproxyRuntime) serverNames(ctx context.Context, backend string) (map[string]struct{}, error) {
	if err := checkToken("backend", backend); err != nil {
		return nil, err
	}
	cmd := "show servers state " + backend
	text, err := r.read(ctx, linePrefix, cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	lines, err := dataLines(cmd, text)
	if err != nil {
		return nil, err
	}
	names := make(map[string]struct{}, len(lines))
	for _, line := range lines {
		// The format-version line ("1") has one field; rows have 25.
		if fields := strings.Fields(line); len(fields) >= 4 {
			names[fields[3]] = struct{}{}
		}
	}
	return names, nil
}

// frontendConnections sums conn_tot over the FRONTEND rows, leaving out the
// ignored proxies (the agent's own status frontend). The drain watches this
// sum stop moving.
func (r *haproxyRuntime) frontendConnections(ctx context.Context, ignore map[string]bool) (uint64, error) {
	text, err := r.read(ctx, readPrefix, "show stat -1 1 -1")
	if err != nil {
		return 0, fmt.Errorf("show stat: %w", err)
	}
	return parseFrontendConnections(text, ignore)
}

// parseFrontendConnections reads show stat CSV, finding conn_tot by name
// in the header: its position differs between versions.
func parseFrontendConnections(text string, ignore map[string]bool) (uint64, error) {
	header, body, _ := strings.Cut(text, "\n")
	if !strings.HasPrefix(header, "# ") {
		return 0, errors.New("show stat: missing CSV header")
	}
	column := slices.Index(strings.Split(strings.TrimPrefix(header, "# "), ","), "conn_tot")
	if column < 0 {
		return 0, errors.New("show stat: no conn_tot column")
	}
	rows, err := dataLines("show stat", body)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, row := range rows {
		cells := strings.Split(row, ",")
		if len(cells) < 2 || cells[1] != "FRONTEND" || ignore[cells[0]] || column >= len(cells) || cells[column] == "" {
			continue
		}
		n, err := strconv.ParseUint(cells[column], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("show stat: conn_tot of %s is not a number: %q", cells[0], cells[column])
		}
		sum += n
	}
	return sum, nil
}

// workerSession is one prompt-mode connection to one worker, so that
// show info, wait, shutdown sessions and del run on the same worker.
type workerSession struct {
	ctx     context.Context
	conn    net.Conn
	stop    func() bool
	timeout time.Duration
}

// openWorker opens a session bound to the expected worker: after the setup
// commands its show info must name the same pid and start time, else
// errWorkerGone.
func (r *haproxyRuntime) openWorker(ctx context.Context, expected HAProxyInfo) (*workerSession, error) {
	if !expected.HasWorkerIdentity() {
		return nil, fmt.Errorf("%w: no worker identity to bind the session to", errWorkerGone)
	}
	conn, err := r.dial(ctx, r.WorkerSocket, time.Now().Add(r.SessionTimeout))
	if err != nil {
		return nil, transportError(ctx, err)
	}
	s := &workerSession{ctx: ctx, conn: conn, timeout: r.SessionTimeout}
	s.stop = context.AfterFunc(ctx, func() { conn.Close() })
	var got HAProxyInfo
	for _, cmd := range []string{"prompt", "set severity-output number", "experimental-mode on", identityCommand} {
		reply, err := s.execute(cmd)
		switch {
		case err != nil:
		case cmd == identityCommand:
			got, err = parseWorkerInfo(reply)
		default:
			err = sessionVerdict(reply, command{Text: cmd})
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("worker session setup: %w", err)
		}
	}
	if !expected.SameWorker(got) {
		s.Close()
		return nil, fmt.Errorf("%w: expected pid %d (start %d), found pid %d (start %d)", errWorkerGone,
			expected.WorkerPID, expected.WorkerStartTimeUnixMicros, got.WorkerPID, got.WorkerStartTimeUnixMicros)
	}
	return s, nil
}

// execute sends one command and returns the text before the prompt,
// trimmed. Only the prompt ends a reply: EOF, a read error or a cancelled
// context (named rather than the closed connection it caused) before it is
// an incomplete reply, never silence.
func (s *workerSession) execute(cmd string) (string, error) {
	err := s.ctx.Err()
	if err == nil {
		err = s.conn.SetDeadline(time.Now().Add(s.timeout))
	}
	if err == nil {
		_, err = io.WriteString(s.conn, cmd+"\n")
	}
	var buf []byte
	var chunk [4096]byte
	for err == nil && !bytes.HasSuffix(buf, []byte(workerPrompt)) && len(buf) <= maxSessionReplyBytes {
		n, readErr := s.conn.Read(chunk[:])
		buf, err = append(buf, chunk[:n]...), readErr
	}
	reply, ok := bytes.CutSuffix(buf, []byte(workerPrompt))
	switch {
	case !ok && err != nil:
		return "", fmt.Errorf("incomplete worker reply: %w", cmp.Or(s.ctx.Err(), err))
	case !ok, len(reply) > maxSessionReplyBytes: // without a prompt, the loop stopped at the size
		return "", fmt.Errorf("worker reply exceeds %d bytes", maxSessionReplyBytes)
	}
	return strings.TrimSpace(string(reply)), nil
}

func (s *workerSession) Close() error {
	s.stop()
	return s.conn.Close()
}

// sessionVerdict judges one session reply as a line of one command behind
// the prefix entry, which the session sent at setup.
func sessionVerdict(reply string, c command) error {
	errs, outputs := matchSegments(splitSegments(reply), []command{prefixEntry, c})
	if errs[1] != nil && outputs[1] != "" {
		return fmt.Errorf("%w: %s", errs[1], outputs[1])
	}
	return errs[1]
}
