// This file owns the agent's HAProxy runtime layer (runtime.md) and the
// deferred-delete queue that drives it off the apply path (agent.md §11). It
// reads in the order a command flows: an Op is compiled into a program of
// HAProxy commands, the commands are packed into lines under the line budget,
// each line travels on a connection of its own, and the reply is counted,
// cut into segments and judged. Then come the reads (worker identity, the
// master's show proc and reload, the inventory and read-backs), the
// interactive worker session, and the queue that uses it.
//
// It must never retry a line that may have landed, never read a cut reply as
// silence (silence is success in HAProxy's CLI), never send a word that did
// not pass the token grammar, and never hold the queue's lock across HAProxy
// I/O. It talks to HAProxy with the standard library only.
package haptic

import (
	"bytes"
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
	"sync"
	"sync/atomic"
	"time"
	"unicode"
)

// Layer constants (runtime.md §1). The timeouts are the production values;
// runtimeConfig overrides them so tests can shrink them.
const (
	lineReserve        = 64                                                 // bytes kept free in every line for the prefix
	lineBudget         = MaxCommandLineBytes - lineReserve                  // 12224
	linePrefix         = "set severity-output number;experimental-mode on;" // apply path and listings
	readPrefix         = "set severity-output number;"                      // show info and show stat
	payloadTerminator  = "HAPTIC"                                           // custom payload terminator (HAProxy >= 3.0)
	versionPlaceholder = "\x01ver\x01"                                      // a captured map version in command text
	expectDone         = "Done"                                             // success text of wait

	runtimeIOTimeout     = 30 * time.Second
	connectRetryPause    = 100 * time.Millisecond
	maxRuntimeReplyBytes = 64 << 20
	workerSessionTimeout = 30 * time.Second
	maxSessionReplyBytes = 65536
	workerPrompt         = "\n> "
	reloadPollInterval   = 100 * time.Millisecond
	systemCA             = "@system-ca"

	// maxFramedPayloadCommand bounds one payload command with its framing:
	// HAProxy refuses (3.0) or silently drops (2.6) a command over 16383
	// bytes, and 2.6.12 hangs on exactly 16384, so stay far below both.
	maxFramedPayloadCommand = MaxCommandLineBytes + 1024
)

// The layer's typed errors; the agent tells failures apart with errors.Is.
var (
	errNameCollision      = errors.New("backend name already in use")
	errWaitExpired        = errors.New("wait delay expired")
	errRejected           = errors.New("haproxy rejected the command")
	errUnreadableResponse = errors.New("unreadable runtime response")
	errUnsafeToken        = errors.New("unsafe runtime token")
	errUnknownOp          = errors.New("unknown op kind")
	errReloadRejected     = errors.New("failed to reload configuration")
	errReloadTimeout      = errors.New("no new worker within the reload timeout")
	errReloadBusy         = errors.New("another reload is still in progress")
	errTooManyEntries     = errors.New("runtime listing exceeds the entry limit")
	errWorkerGone         = errors.New("the deferred delete's HAProxy worker has changed")
	errWorkerMoved        = errors.New("the commands reached another HAProxy worker than expected")
	errDeferralOverflow   = errors.New("deferred delete queue is full")
)

// runtimeError is an error with its own text that still matches the errors it
// stands for under errors.Is, so that a message can follow the spec's wording
// ("reload: no new worker within 1m0s") without repeating the sentinel's.
type runtimeError struct {
	msg  string
	kind []error
}

func (e *runtimeError) Error() string   { return e.msg }
func (e *runtimeError) Unwrap() []error { return e.kind }

// ---------------------------------------------------------------------------
// Construction (runtime.md §2.1).

// runtimeConfig configures the layer. Zero durations mean the production
// defaults of runtime.md §1. SessionTimeout, ConnectRetryPause and
// ReloadPollInterval are additions beyond the pinned four fields: they exist
// so tests can shrink every wait the layer has.
type runtimeConfig struct {
	WorkerSocket, MasterSocket string
	Logger                     *slog.Logger
	IOTimeout, ReloadTimeout   time.Duration // zero = 30s / 60s

	SessionTimeout     time.Duration // zero = 30s (interactive worker session)
	ConnectRetryPause  time.Duration // zero = 100ms (pause before the one dial retry)
	ReloadPollInterval time.Duration // zero = 100ms (show proc polling without Success=)
}

// haproxyRuntime is the agent's only way to HAProxy. It holds no connection:
// every line and every read dials its own, so it needs no lock around
// exchanges; the agent's apply lock keeps a single apply-path writer.
type haproxyRuntime struct {
	workerSocket, masterSocket string
	logger                     *slog.Logger

	ioTimeout, reloadTimeout, sessionTimeout time.Duration
	retryPause, pollInterval                 time.Duration

	// dial opens one unix connection; tests replace it to count dials.
	dial func(ctx context.Context, path string, deadline time.Time) (net.Conn, error)

	version atomic.Pointer[string] // Version of the last successful info
}

// newHAProxyRuntime builds the layer. It dials nothing: the agent starts
// before HAProxy answers, and readiness is probed later (probe).
func newHAProxyRuntime(cfg runtimeConfig) *haproxyRuntime {
	r := &haproxyRuntime{
		workerSocket:   cfg.WorkerSocket,
		masterSocket:   cfg.MasterSocket,
		logger:         cfg.Logger,
		ioTimeout:      orDefault(cfg.IOTimeout, runtimeIOTimeout),
		reloadTimeout:  orDefault(cfg.ReloadTimeout, MaxReloadMs*time.Millisecond),
		sessionTimeout: orDefault(cfg.SessionTimeout, workerSessionTimeout),
		retryPause:     orDefault(cfg.ConnectRetryPause, connectRetryPause),
		pollInterval:   orDefault(cfg.ReloadPollInterval, reloadPollInterval),
		dial:           dialUnix,
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	return r
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func dialUnix(ctx context.Context, path string, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{Deadline: deadline}
	return d.DialContext(ctx, "unix", path)
}

// ---------------------------------------------------------------------------
// Programs (runtime.md §3.1): what an op becomes.

// command is one HAProxy runtime command with the text that judges it.
type command struct {
	Text     string // the command; never contains '\n'
	Payload  string // body of a "<<" command; such a command is always last on its line
	Expect   string // case-insensitive success text ("anchor"); "" = quiet
	Capture  bool   // reply carries the map version to substitute (prepare map only)
	Repeat   bool   // run until HAProxy refuses it (del map only)
	Optional bool   // the prefix entry whose chatter is version-dependent
}

// program is the compiled form of one op.
type program struct {
	Kind     string    // Op kind
	Commands []command // in order
	Abort    []command // sent after a failure of this program (cert/CA only)

	// Terminator is the payload terminator the payloads were validated
	// against at compile time; lines are framed with this one, never with a
	// terminator derived later, so a payload can never end itself early.
	Terminator string
}

// prefixEntry stands for both prefix commands of every line when a reply is
// matched: callers of matchBatch put it first.
var prefixEntry = command{Text: strings.TrimSuffix(linePrefix, ";"), Optional: true}

// terminatorFor chooses the payload terminator for a worker version.
// HAProxy 2.6 has no custom terminators: it would take "<<HAPTIC" as a plain
// argument and then run every payload line as a command. Custom terminators
// arrived in 3.0 together with dynamic servers, so CapsFor's version rule
// (deployplan.md §2.4) decides; an older or unreadable version gets
// HAProxy's default empty-line terminator.
func terminatorFor(version string) string {
	if CapsFor(version, nil).DynamicServers {
		return payloadTerminator
	}
	return ""
}

// terminator is the payload terminator for the worker the last info read.
func (r *haproxyRuntime) terminator() string {
	if v := r.version.Load(); v != nil {
		return terminatorFor(*v)
	}
	return terminatorFor("")
}

// ---------------------------------------------------------------------------
// Compiling (runtime.md §3.2–§3.7).

// compileOp turns one op into its program. Every word is checked against
// the token grammar first; a failing field is refused, never sanitised.
// content returns the held bytes of a file (map_replace, cert_*, ca_*); term
// is the worker's payload terminator (terminatorFor).
func compileOp(op *Op, content func(path string) ([]byte, error), term string) (program, error) {
	p := program{Kind: op.Kind, Terminator: term}
	var err error
	switch op.Kind {
	case OpBackendAdd:
		err = firstError(checkToken("backend", op.Backend), checkToken("profile", op.Profile),
			checkEnum("mode", op.Mode, "http", "tcp"), checkOptionalToken("guid", op.GUID))
		text := "add backend " + op.Backend + " from " + op.Profile + " mode " + op.Mode
		if op.GUID != "" {
			text += " guid " + op.GUID
		}
		p.Commands = []command{{Text: text, Expect: "New backend registered"}}
	case OpBackendPublish:
		err = checkToken("backend", op.Backend)
		p.Commands = []command{{Text: "publish backend " + op.Backend, Expect: "Backend published"}}
	case OpBackendUnpublish:
		err = checkToken("backend", op.Backend)
		p.Commands = []command{{Text: "unpublish backend " + op.Backend}}
	case OpBackendDel:
		err = checkToken("backend", op.Backend)
		p.Commands = []command{{Text: "del backend " + op.Backend, Expect: "Backend deleted"}}
	case OpBackendWaitRemovable:
		err = firstError(checkToken("backend", op.Backend), checkWaitTimeout(op.TimeoutMs))
		p.Commands = []command{{Text: "wait " + strconv.Itoa(op.TimeoutMs) + " be-removable " + op.Backend, Expect: expectDone}}
	case OpServerAdd:
		err = firstError(checkRef(op), checkToken("address", op.Address), checkPort(op.Port), checkKeywords("keyword", op.Keywords))
		text := "add server " + serverRefText(op) + " " + op.Address
		if op.Port > 0 {
			text += ":" + strconv.Itoa(op.Port)
		}
		p.Commands = []command{{Text: text + keywordWords(op.Keywords), Expect: "New server registered"}}
	case OpServerEnable:
		err = checkRef(op)
		if op.Health {
			p.Commands = append(p.Commands, command{Text: "enable health " + serverRefText(op)})
		}
		p.Commands = append(p.Commands, command{Text: "enable server " + serverRefText(op)})
	case OpServerDisable:
		err = checkRef(op)
		p.Commands = []command{{Text: "disable server " + serverRefText(op)}}
	case OpServerSetAddr:
		err = firstError(checkRef(op), checkToken("address", op.Address), checkPort(op.Port))
		text := "set server " + serverRefText(op) + " addr " + op.Address
		if op.Port > 0 {
			text += " port " + strconv.Itoa(op.Port)
		}
		// HAProxy answers at WARNING for success and refusal alike; the
		// words decide ("IP changed", "port changed", "nothing changed").
		p.Commands = []command{{Text: text, Expect: "chang"}}
	case OpServerSetWeight:
		err = firstError(checkRef(op), checkWeight(op.Weight))
		if err == nil {
			p.Commands = []command{{Text: "set server " + serverRefText(op) + " weight " + strconv.Itoa(*op.Weight)}}
		}
	case OpServerSetState:
		err = firstError(checkRef(op), checkEnum("state", op.State, ServerStateReady, ServerStateMaint, ServerStateDrain))
		p.Commands = []command{{Text: "set server " + serverRefText(op) + " state " + op.State}}
	case OpServerWaitRemovable:
		err = firstError(checkRef(op), checkWaitTimeout(op.TimeoutMs))
		p.Commands = []command{{Text: "wait " + strconv.Itoa(op.TimeoutMs) + " srv-removable " + serverRefText(op), Expect: expectDone}}
	case OpShutdownSessions:
		err = checkRef(op)
		p.Commands = []command{{Text: "shutdown sessions server " + serverRefText(op)}}
	case OpServerDel:
		err = checkRef(op)
		p.Commands = []command{{Text: "del server " + serverRefText(op), Expect: "Server deleted"}}
	case OpMapAdd:
		// The payload form carries a value with spaces, which the line form
		// would cut at the first space.
		err = firstError(checkToken("path", op.Path), checkToken("key", op.Key), checkPayloadValue("value", op.Value))
		p.Commands = []command{{Text: "add map " + op.Path, Payload: op.Key + " " + op.Value + "\n"}}
	case OpMapSet:
		err = firstError(checkToken("path", op.Path), checkToken("key", op.Key), checkToken("value", op.Value))
		p.Commands = []command{{Text: "set map " + op.Path + " " + op.Key + " " + op.Value}}
	case OpMapDel:
		err = firstError(checkToken("path", op.Path), checkToken("key", op.Key))
		p.Commands = []command{{Text: "del map " + op.Path + " " + op.Key, Repeat: true}}
	case OpMapReplace:
		p.Commands, err = compileMapReplace(op.Path, content)
	case OpCertSet, OpCertNew:
		p.Commands, p.Abort, err = compileTransaction(op, content, "cert", "New empty certificate store")
	case OpCASet, OpCANew:
		p.Commands, p.Abort, err = compileTransaction(op, content, "ca-file", "New CA file created")
	case OpCRTListAdd:
		// Always the payload form: the line form silently drops options
		// and SNI filters.
		err = firstError(checkToken("path", op.Path), checkToken("cert", op.Cert),
			checkKeywords("option", op.Options), checkTokens("sni filter", op.SNIFilters), checkCRTListWords(op))
		p.Commands = []command{{Text: "add ssl crt-list " + op.Path, Payload: crtListLine(op), Expect: "Success"}}
	case OpCRTListDel:
		err = firstError(checkToken("path", op.Path), checkToken("cert", op.Cert))
		p.Commands = []command{{Text: "del ssl crt-list " + op.Path + " " + op.Cert}}
	default:
		return program{}, fmt.Errorf("%w: %q", errUnknownOp, op.Kind)
	}
	if err != nil {
		return program{}, err
	}
	for _, c := range slices.Concat(p.Commands, p.Abort) {
		if err := checkCommand(c, term); err != nil {
			return program{}, err
		}
	}
	return p, nil
}

// compileMapReplace builds the versioned replace of a whole map: prepare a
// new version, fill it in chunks, commit it. The payload is the parsed
// entries, not the file: HAProxy's payload parser has no comment syntax and
// reads a key up to the first space or tab, newlines included, so a '#'
// line would become an entry and a bare "key\n" would glue onto the next
// line; an empty value is therefore rendered "key \n".
//
// There is no abort: "clear map @<ver>" clears the version on 3.0 but is a
// no-op on 3.4 (a later commit would install it), so a failed chunk leaves
// an uncommitted version behind, which is harmless.
func compileMapReplace(path string, content func(string) ([]byte, error)) ([]command, error) {
	if err := checkToken("path", path); err != nil {
		return nil, err
	}
	data, err := readContent(content, path)
	if err != nil {
		return nil, err
	}
	var body strings.Builder
	// At most the file plus one space per line ("key \n" for an empty value).
	body.Grow(len(data) + bytes.Count(data, []byte{'\n'}) + 1)
	for _, e := range ParseMapEntries(string(data)) {
		if !SafePayloadValue(e.Key) || !SafePayloadValue(e.Value) {
			return nil, fmt.Errorf("%w: map entry %q", errUnsafeToken, e.Key)
		}
		body.WriteString(e.Key)
		body.WriteByte(' ')
		body.WriteString(e.Value)
		body.WriteByte('\n')
	}
	chunks, err := chunkLines(body.String(), MaxPayloadBytes)
	if err != nil {
		return nil, err
	}
	version := "@" + versionPlaceholder + " " + path
	cmds := []command{{Text: "prepare map " + path, Capture: true, Expect: "version created"}}
	for _, chunk := range chunks {
		cmds = append(cmds, command{Text: "add map " + version, Payload: chunk})
	}
	// commit is silent on success on 3.0 and 3.4, so any output refuses it.
	return append(cmds, command{Text: "commit map " + version}), nil
}

// chunkLines cuts a payload after a '\n', never inside a line, into chunks
// of at most max bytes: HAProxy applies zero entries of a payload over its
// buffer. A line longer than max cannot travel at all.
func chunkLines(payload string, max int) ([]string, error) {
	var chunks []string
	for payload != "" {
		if len(payload) <= max {
			return append(chunks, payload), nil
		}
		cut := strings.LastIndexByte(payload[:max], '\n') + 1
		if cut == 0 {
			line, _, _ := strings.Cut(payload, "\n")
			return nil, fmt.Errorf("%w: map line of %d bytes exceeds the %d-byte payload limit", errUnsafeToken, len(line)+1, max)
		}
		chunks = append(chunks, payload[:cut])
		payload = payload[cut:]
	}
	return chunks, nil
}

// compileTransaction builds a certificate or CA-file update: optionally
// create the entry, open a transaction with the PEM, commit it. A worker
// holds one open transaction per store and refuses any other object's
// until it ends, so the program carries the abort that closes it on failure.
func compileTransaction(op *Op, content func(string) ([]byte, error), store, newExpect string) (cmds, abort []command, err error) {
	if err := checkToken("path", op.Path); err != nil {
		return nil, nil, err
	}
	pem, err := readContent(content, op.Path)
	if err != nil {
		return nil, nil, err
	}
	if len(pem) == 0 {
		return nil, nil, fmt.Errorf("%w: payload is empty", errUnsafeToken)
	}
	if op.Kind == OpCertNew || op.Kind == OpCANew {
		cmds = append(cmds, command{Text: "new ssl " + store + " " + op.Path, Expect: newExpect})
	}
	cmds = append(cmds,
		command{Text: "set ssl " + store + " " + op.Path, Payload: string(pem), Expect: "transaction"},
		command{Text: "commit ssl " + store + " " + op.Path, Expect: "Success!"})
	return cmds, []command{{Text: "abort ssl " + store + " " + op.Path}}, nil
}

func readContent(content func(string) ([]byte, error), path string) ([]byte, error) {
	if content == nil {
		return nil, fmt.Errorf("reading %s: no file reader", path)
	}
	data, err := content(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}

// crtListLine renders one crt-list entry: the certificate, the options in
// one bracket pair, then the SNI filters.
func crtListLine(op *Op) string {
	var b strings.Builder
	b.WriteString(op.Cert)
	if len(op.Options) > 0 {
		b.WriteString(" [")
		for i, o := range op.Options {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(o.Name)
			for _, a := range o.Args {
				b.WriteByte(' ')
				b.WriteString(a)
			}
		}
		b.WriteByte(']')
	}
	for _, f := range op.SNIFilters {
		b.WriteByte(' ')
		b.WriteString(f)
	}
	b.WriteByte('\n')
	return b.String()
}

func serverRefText(op *Op) string { return op.Backend + "/" + op.Server }

func keywordWords(kws []KeywordArg) string {
	var b strings.Builder
	for _, kw := range kws {
		b.WriteByte(' ')
		b.WriteString(kw.Name)
		for _, a := range kw.Args {
			b.WriteByte(' ')
			b.WriteString(a)
		}
	}
	return b.String()
}

// Token checks (runtime.md §3.3). Each refusal wraps errUnsafeToken.

func checkToken(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", errUnsafeToken, field)
	}
	if !SafeToken(s) {
		return fmt.Errorf("%w: %s %q", errUnsafeToken, field, s)
	}
	return nil
}

func checkOptionalToken(field, s string) error {
	if s == "" {
		return nil
	}
	return checkToken(field, s)
}

func checkTokens(field string, words []string) error {
	for _, w := range words {
		if err := checkToken(field, w); err != nil {
			return err
		}
	}
	return nil
}

func checkKeywords(field string, kws []KeywordArg) error {
	for _, kw := range kws {
		if err := firstError(checkToken(field, kw.Name), checkTokens(field+" argument", kw.Args)); err != nil {
			return err
		}
	}
	return nil
}

// checkCRTListWords refuses brackets in the words of a crt-list entry:
// SafeToken allows them, but inside the entry's one bracket pair a ']'
// would end the options early and turn the rest into SNI filters.
func checkCRTListWords(op *Op) error {
	words := append([]string{op.Cert}, op.SNIFilters...)
	for _, o := range op.Options {
		words = append(append(words, o.Name), o.Args...)
	}
	for _, w := range words {
		if strings.ContainsAny(w, "[]") {
			return fmt.Errorf("%w: crt-list word %q", errUnsafeToken, w)
		}
	}
	return nil
}

func checkPayloadValue(field, s string) error {
	if !SafePayloadValue(s) {
		return fmt.Errorf("%w: %s %q", errUnsafeToken, field, s)
	}
	return nil
}

func checkRef(op *Op) error {
	return firstError(checkToken("backend", op.Backend), checkToken("server", op.Server))
}

func checkEnum(field, s string, allowed ...string) error {
	if !slices.Contains(allowed, s) {
		return fmt.Errorf("%w: %s %q", errUnsafeToken, field, s)
	}
	return nil
}

func checkWaitTimeout(ms int) error {
	if ms < 1 || ms > MaxWaitBudgetMs {
		return fmt.Errorf("%w: timeout_ms %d outside 1..%d", errUnsafeToken, ms, MaxWaitBudgetMs)
	}
	return nil
}

// checkPort refuses what HAProxy would wrap: "port 70000" sets port 4464.
func checkPort(port int) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("%w: port %d outside 0..65535", errUnsafeToken, port)
	}
	return nil
}

func checkWeight(w *int) error {
	if w == nil {
		return fmt.Errorf("%w: weight is unset", errUnsafeToken)
	}
	if *w < 0 || *w > 256 {
		return fmt.Errorf("%w: weight %d outside 0..256", errUnsafeToken, *w)
	}
	return nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkCommand enforces the size limits and payload framing rules on one
// built command (runtime.md §3.1, §3.4).
func checkCommand(c command, term string) error {
	if len(c.Text) > lineBudget {
		return fmt.Errorf("command of %d bytes exceeds the %d-byte line limit", len(c.Text), lineBudget)
	}
	if len(c.Payload) > MaxPayloadBytes {
		return fmt.Errorf("payload of %d bytes exceeds the %d-byte payload limit", len(c.Payload), MaxPayloadBytes)
	}
	if c.Payload == "" {
		return nil
	}
	if n := framedLen(c.Text, c.Payload, term); n > maxFramedPayloadCommand {
		return fmt.Errorf("payload command of %d bytes exceeds the %d-byte framed limit", n, maxFramedPayloadCommand)
	}
	if strings.IndexByte(c.Payload, 0) >= 0 {
		return fmt.Errorf("%w: payload contains a NUL byte", errUnsafeToken)
	}
	// HAProxy matches the terminator against whole lines; with the default
	// (empty) terminator this refuses any blank line, so a PEM with a blank
	// line goes by reload on an HAProxy without custom terminators.
	body := strings.TrimSuffix(c.Payload, "\n")
	for line := range strings.SplitSeq(body, "\n") {
		if strings.TrimSuffix(line, "\r") == term {
			return fmt.Errorf("%w: payload contains the terminator line", errUnsafeToken)
		}
	}
	return nil
}

// frameCommand renders a payload command: "<text> <<TERM\n<payload>TERM\n",
// with HAProxy's default empty-line terminator when term is "".
func frameCommand(text, payload, term string) string {
	var b strings.Builder
	b.Grow(framedLen(text, payload, term))
	writeFramed(&b, text, payload, term)
	return b.String()
}

func writeFramed(b *strings.Builder, text, payload, term string) {
	b.WriteString(text)
	b.WriteString(" <<")
	b.WriteString(term)
	b.WriteByte('\n')
	b.WriteString(payload)
	if !strings.HasSuffix(payload, "\n") {
		b.WriteByte('\n')
	}
	b.WriteString(term)
	b.WriteByte('\n')
}

// framedLen is len(frameCommand(text, payload, term)) without building it.
func framedLen(text, payload, term string) int {
	n := len(text) + len(" <<") + 2*(len(term)+1) + len(payload)
	if !strings.HasSuffix(payload, "\n") {
		n++
	}
	return n
}

// ---------------------------------------------------------------------------
// Line building (runtime.md §4.2).

// lineCommand is a command placed on a line, with the program it belongs to.
type lineCommand struct {
	command
	prog int
}

// lineBuilder packs commands into lines. Every line, prefix and final '\n'
// included, stays within MaxCommandLineBytes before its payload framing;
// payload and capture commands travel alone; one line's wait budget stays
// within MaxWaitBudgetMs, so one exchange is bounded by IOTimeout + 30s.
type lineBuilder struct {
	pending []lineCommand
	length  int // Σ len(Text)+1 over pending
	waitMs  int // Σ wait timeouts over pending
}

// add queues c and returns the lines that are complete and must be sent
// now, in order (none, one or two).
func (b *lineBuilder) add(c lineCommand) [][]lineCommand {
	var ready [][]lineCommand
	solo := c.Payload != "" || c.Capture
	wait := waitMsOf(c.Text)
	if len(b.pending) > 0 && (solo || b.length+len(c.Text) >= lineBudget || b.waitMs+wait > MaxWaitBudgetMs) {
		ready = append(ready, b.take())
	}
	b.pending = append(b.pending, c)
	b.length += len(c.Text) + 1
	b.waitMs += wait
	if solo {
		ready = append(ready, b.take())
	}
	return ready
}

// take returns the pending line (nil when empty) and starts a new one.
func (b *lineBuilder) take() []lineCommand {
	line := b.pending
	*b = lineBuilder{}
	return line
}

// waitMsOf is the time HAProxy may spend on a "wait <ms> …" command, read
// from the command itself (compileOp bounded it); zero for any other.
func waitMsOf(text string) int {
	rest, ok := strings.CutPrefix(text, "wait ")
	if !ok {
		return 0
	}
	ms, _ := leadingNumber(rest)
	return ms
}

// renderLine renders one line with the apply-path prefix; a payload
// command, always last, is framed with its program's terminator.
func renderLine(line []lineCommand, term string) string {
	size := len(linePrefix) + 1
	for _, c := range line {
		size += framedLen(c.Text, c.Payload, term)
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(linePrefix)
	for i, c := range line {
		if i > 0 {
			b.WriteByte(';')
		}
		if c.Payload != "" {
			writeFramed(&b, c.Text, c.Payload, term)
			return b.String()
		}
		b.WriteString(c.Text)
	}
	b.WriteByte('\n')
	return b.String()
}

func lineWaitBudget(line []lineCommand) time.Duration {
	ms := 0
	for _, c := range line {
		ms += waitMsOf(c.Text)
	}
	return time.Duration(ms) * time.Millisecond
}

// ---------------------------------------------------------------------------
// Transport (runtime.md §2.2, §2.5).

// roundTrip is one exchange: dial (one retry when the dial fails, since
// nothing was written), one Write of the whole line, read to EOF, close.
// delivered reports whether the write completed: after it, an error means
// the command may have landed and is never retried.
func (r *haproxyRuntime) roundTrip(ctx context.Context, path, line string, deadline time.Time) (raw []byte, delivered bool, err error) {
	if ctxDeadline, ok := ctx.Deadline(); ok && ctxDeadline.Before(deadline) {
		deadline = ctxDeadline
	}
	conn, err := r.dial(ctx, path, deadline)
	if err != nil && ctx.Err() == nil {
		pause := time.NewTimer(r.retryPause)
		select {
		case <-ctx.Done():
		case <-pause.C:
		}
		pause.Stop()
		if ctx.Err() == nil {
			conn, err = r.dial(ctx, path, deadline)
		}
	}
	if err != nil {
		return nil, false, transportError(ctx, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, false, transportError(ctx, err)
	}
	if _, err := io.WriteString(conn, line); err != nil {
		return nil, false, transportError(ctx, err)
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(io.LimitReader(conn, maxRuntimeReplyBytes+1))
	if buf.Len() > maxRuntimeReplyBytes {
		return nil, true, fmt.Errorf("runtime socket: reply exceeds %d bytes", maxRuntimeReplyBytes)
	}
	if err != nil {
		return buf.Bytes(), true, transportError(ctx, err)
	}
	return buf.Bytes(), true, nil
}

// transportError reports a socket failure; a cancelled context is reported
// as such rather than as the closed connection it caused.
func transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = ctx.Err()
	}
	return fmt.Errorf("runtime socket: %w", err)
}

// exchange sends one line to the worker under the deadline
// now + IOTimeout + the line's wait budget.
func (r *haproxyRuntime) exchange(ctx context.Context, line string, waitBudget time.Duration) ([]byte, error) {
	raw, _, err := r.roundTrip(ctx, r.workerSocket, line, time.Now().Add(r.ioTimeout+waitBudget))
	return raw, err
}

// masterExchange sends one master command. The master CLI keeps a
// connection open after a command unless told to quit, so every command
// ends with ";quit"; without it show proc would hang until the deadline.
func (r *haproxyRuntime) masterExchange(ctx context.Context, cmd string) (string, error) {
	raw, _, err := r.roundTrip(ctx, r.masterSocket, cmd+";quit\n", time.Now().Add(r.ioTimeout))
	if err != nil {
		return "", err
	}
	return trimReply(string(raw)), nil
}

// ---------------------------------------------------------------------------
// Reply framing (runtime.md §2.3).

// countResponses counts the responses in a raw reply: a silent command
// writes a lone '\n', any other one or more lines then an empty line.
// partial reports a tail that is not a whole response (a connection closed
// mid-reply, or HAProxy's "command is too big" error, which ends in one
// '\n').
func countResponses(raw []byte) (n int, partial bool) {
	for pos := 0; pos < len(raw); n++ {
		end, complete := nextResponse(raw, pos)
		if !complete {
			return n, true
		}
		pos = end
	}
	return n, false
}

// nextResponse returns where the response starting at pos ends.
func nextResponse(raw []byte, pos int) (end int, complete bool) {
	if raw[pos] == '\n' {
		return pos + 1, true
	}
	i := bytes.Index(raw[pos:], []byte("\n\n"))
	if i < 0 {
		return len(raw), false
	}
	return pos + i + 2, true
}

// trimReply post-processes a reply before segmentation: one trailing
// prompt, one trailing '\n', then trailing whitespace.
func trimReply(s string) string {
	s = strings.TrimSuffix(s, workerPrompt)
	s = strings.TrimSuffix(s, "\n")
	return strings.TrimRightFunc(s, unicode.IsSpace)
}

// lastResponse takes a read's own response, the last of a reply that must
// be complete: k responses, no partial tail. A short reply is an error,
// never a short listing.
func lastResponse(raw []byte, k int) (string, error) {
	n, start := 0, 0
	for pos := 0; pos < len(raw); n++ {
		end, complete := nextResponse(raw, pos)
		if !complete {
			return "", incompleteReply(n, k)
		}
		start, pos = pos, end
	}
	if n != k {
		return "", incompleteReply(n, k)
	}
	return trimReply(string(raw[start:])), nil
}

func incompleteReply(n, k int) error {
	return &runtimeError{
		msg:  fmt.Sprintf("runtime socket: incomplete reply (%d of %d responses)", n, k),
		kind: []error{errUnreadableResponse},
	}
}

// ---------------------------------------------------------------------------
// Judging (runtime.md §4.3).

// splitSegments cuts a post-processed reply into the non-empty responses.
// A silent command yields no segment.
func splitSegments(text string) []string {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	var segs []string
	for piece := range strings.SplitSeq(text, "\n\n") {
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
	case strings.Contains(text, "unknown command"):
		// HAProxy answers an unknown verb at [6] ("Unknown command: 'add',
		// but maybe…"), so the level alone would call it a success.
		return errRejected
	case level >= 0 && level <= 3:
		return errRejected
	case level >= 5:
		return nil
	}
	for _, phrase := range rejectionPhrases {
		if strings.Contains(text, phrase) {
			return errRejected
		}
	}
	return nil
}

// matchBatch judges the commands of one line against its segments;
// cmds[0] is the optional prefix entry.
func matchBatch(segments []string, cmds []command) []error {
	errs, _ := matchSegments(segments, cmds)
	return errs
}

// matchSegments walks the commands with a segment cursor and also returns
// the segment each command consumed (HAProxy's words for the op result).
func matchSegments(segments []string, cmds []command) (errs []error, outputs []string) {
	errs = make([]error, len(cmds))
	outputs = make([]string, len(cmds))
	cursor, failed := 0, false
	for i, c := range cmds {
		if failed {
			errs[i] = errUnreadableResponse
			continue
		}
		next := nextAnchor(cmds[i+1:])
		left := cursor < len(segments)
		switch {
		case c.Optional:
			if left && classify(segments[cursor]) == nil && !containsFold(segments[cursor], next) {
				outputs[i] = segments[cursor]
				cursor++
			}
			continue
		case c.Expect == "":
			if !left || containsFold(segments[cursor], next) {
				continue
			}
			outputs[i] = segments[cursor]
			errs[i] = classify(segments[cursor])
			cursor++
		default:
			if !left {
				errs[i] = errUnreadableResponse
				break
			}
			outputs[i] = segments[cursor]
			cursor++
			if err := classify(outputs[i]); err != nil {
				errs[i] = err
			} else if !containsFold(outputs[i], c.Expect) {
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
	k := 2 + len(cmds)
	n, partial := countResponses(raw)
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
	case n > k:
		unknown, first = fmt.Errorf("%w: more responses than commands", errUnreadableResponse), 0
	case n < k || partial:
		unknown, first = fmt.Errorf("%w: incomplete reply", errUnreadableResponse), max(n-2, 0)
	}
	for i := first; i < len(cmds); i++ {
		if v.Errs[i] == nil {
			v.Errs[i] = unknown
		}
	}
	return v
}

// mapVersion reads the version of "[6]: New version created: 3": the text
// after the last ':', which must be a uint64.
func mapVersion(segment string) (string, bool) {
	i := strings.LastIndexByte(segment, ':')
	if i < 0 {
		return "", false
	}
	v := strings.TrimSpace(segment[i+1:])
	if _, err := strconv.ParseUint(v, 10, 64); err != nil {
		return "", false
	}
	return v, true
}

// ---------------------------------------------------------------------------
// Executing (runtime.md §4).

// execute runs compiled programs in order and returns one result per
// program and the verdict. It stops after the first line with a failure:
// programs never sent keep their preset OK, and the agent falls back to a
// reload. A line whose reply cannot be read is outcome unknown, never
// refused.
func (r *haproxyRuntime) execute(ctx context.Context, programs []program) ([]OpResult, error) {
	results, _, err := r.executeAs(ctx, programs, nil)
	return results, err
}

// executeAs is execute that also reads, on every line's own connection and
// before its commands, which worker answers (a connection to the worker
// socket reaches exactly one process). observed is the worker that ran the
// last line sent. When expected is set and a line reached another worker,
// the execution stops after that line with errWorkerMoved: checking the
// worker in the same exchange as the ops costs no round trip, and it names
// exactly the process the ops ran on.
func (r *haproxyRuntime) executeAs(ctx context.Context, programs []program, expected *HAProxyInfo) (results []OpResult, observed HAProxyInfo, err error) {
	results = make([]OpResult, len(programs))
	for i, p := range programs {
		results[i] = OpResult{Kind: p.Kind, OK: true}
	}
	if len(programs) > MaxOpsPerApply {
		return results, observed, fmt.Errorf("%d ops exceed the %d-op limit", len(programs), MaxOpsPerApply)
	}
	run := &execution{r: r, ctx: ctx, programs: programs, results: results, failedProg: -1, expect: expected}
	err = run.all()
	if errors.Is(err, errWorkerMoved) {
		return results, run.observed, err
	}
	if err != nil && run.failedProg >= 0 {
		failed := programs[run.failedProg]
		if failed.Kind == OpMapReplace {
			// No abort exists (compileMapReplace): the prepared version stays
			// behind, uncommitted and harmless.
			r.logger.Warn("map replace failed; an uncommitted map version is left behind", "error", err)
		}
		run.abort(failed)
	}
	return results, run.observed, err
}

// execution is the state of one execute call.
type execution struct {
	r          *haproxyRuntime
	ctx        context.Context
	programs   []program
	results    []OpResult
	version    string // the last captured map version
	failedProg int    // the first program that failed, -1 if none

	expect   *HAProxyInfo // the worker every line must reach; nil checks nothing
	observed HAProxyInfo  // the worker the last line reached
}

// identityCommand reads the worker's identity at the front of a line.
const identityCommand = "show info float"

// line sends one rendered line (which starts with linePrefix). With an
// expected worker, the line reads the worker's identity first, the reply to
// that read is cut out before the commands are judged, and a line that
// reached another worker fails with errWorkerMoved once its reply is
// judged.
func (e *execution) line(text string, budget time.Duration) ([]byte, error) {
	if e.expect == nil {
		return e.r.exchange(e.ctx, text, budget)
	}
	raw, err := e.r.exchange(e.ctx, linePrefix+identityCommand+";"+strings.TrimPrefix(text, linePrefix), budget)
	if err != nil {
		return nil, err
	}
	rest, info, err := cutIdentity(raw)
	if err != nil {
		return nil, err
	}
	e.observed = info
	e.r.version.Store(&info.Version)
	return rest, nil
}

// cutIdentity takes the third response of a reply (the identity read after
// the two prefix commands) out of it and parses it.
func cutIdentity(raw []byte) ([]byte, HAProxyInfo, error) {
	ends := make([]int, 0, 3)
	for pos := 0; len(ends) < 3 && pos < len(raw); {
		end, complete := nextResponse(raw, pos)
		if !complete {
			break
		}
		ends = append(ends, end)
		pos = end
	}
	if len(ends) < 3 {
		return nil, HAProxyInfo{}, incompleteReply(len(ends), 3)
	}
	info, err := parseWorkerInfo(trimReply(string(raw[ends[1]:ends[2]])))
	if err != nil {
		return nil, HAProxyInfo{}, err
	}
	rest := append(slices.Clone(raw[:ends[1]]), raw[ends[2]:]...)
	return rest, info, nil
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
			if c.Repeat {
				if err := e.send(b.take()); err != nil {
					return err
				}
				if err := e.repeat(pi, c); err != nil {
					return err
				}
				continue
			}
			for _, line := range b.add(lineCommand{command: c, prog: pi}) {
				if err := e.send(line); err != nil {
					return err
				}
			}
		}
	}
	return e.send(b.take())
}

// send runs one line and records its verdicts.
func (e *execution) send(line []lineCommand) error {
	if len(line) == 0 {
		return nil
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
		if v.Errs[i] == nil {
			continue
		}
		output := v.Outputs[i]
		if output == "" {
			output = v.Errs[i].Error()
		}
		e.fail(c.prog, output)
		if lineErr == nil {
			lineErr = fmt.Errorf("op %s: %w: %s", e.programs[c.prog].Kind, v.Errs[i], output)
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
	if e.failedProg < 0 {
		e.failedProg = prog
	}
	if e.results[prog].OK {
		e.results[prog].OK = false
		e.results[prog].Output = output
	}
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
		output := v.Outputs[0]
		if output == "" {
			output = v.Errs[0].Error()
		}
		e.fail(prog, output)
		return fmt.Errorf("op %s: %w: %s", e.programs[prog].Kind, v.Errs[0], output)
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
			e.r.logger.Warn("cleanup command failed", "command", c.Text, "error", err)
		}
	}
}

// ---------------------------------------------------------------------------
// Reads (runtime.md §2.4, §5, §7): each a complete reply, its own response
// taken by position.

// read sends one read command after prefix and returns its response. A
// response whose first line carries a severity tag [0]: to [3]: is a
// refusal (errRejected with HAProxy's words).
func (r *haproxyRuntime) read(ctx context.Context, prefix, cmd string) (string, error) {
	raw, err := r.exchange(ctx, prefix+cmd+"\n", 0)
	if err != nil {
		return "", err
	}
	// The reply holds one response per prefix command, then the read's own.
	text, err := lastResponse(raw, strings.Count(prefix, ";")+1)
	if err != nil {
		return "", err
	}
	if level, _ := severityTag(text); level >= 0 && level <= 3 {
		first, _, _ := strings.Cut(text, "\n")
		return "", fmt.Errorf("%w: %s", errRejected, first)
	}
	return text, nil
}

// readAll sends several read commands on one line after prefix and returns
// each one's response, in order, with a refusal per command; the line as a
// whole fails only when its reply is cut or the socket fails. One
// connection instead of one per listing keeps the reads after a reload off
// the apply's answer as far as HAProxy allows.
func (r *haproxyRuntime) readAll(ctx context.Context, prefix string, cmds []string) ([]string, []error, error) {
	raw, err := r.exchange(ctx, prefix+strings.Join(cmds, ";")+"\n", 0)
	if err != nil {
		return nil, nil, err
	}
	skip := strings.Count(prefix, ";")
	want := skip + len(cmds)
	var responses []string
	for pos := 0; pos < len(raw) && len(responses) < want; {
		end, complete := nextResponse(raw, pos)
		if !complete {
			break
		}
		responses = append(responses, string(raw[pos:end]))
		pos = end
	}
	if len(responses) != want {
		return nil, nil, incompleteReply(len(responses), want)
	}
	texts := make([]string, len(cmds))
	errs := make([]error, len(cmds))
	for i := range cmds {
		texts[i] = trimReply(responses[skip+i])
		if level, _ := severityTag(texts[i]); level >= 0 && level <= 3 {
			first, _, _ := strings.Cut(texts[i], "\n")
			texts[i], errs[i] = "", fmt.Errorf("%w: %s", errRejected, first)
		}
	}
	return texts, errs, nil
}

// info reads the worker's identity with "show info float" and records its
// version for payload framing.
func (r *haproxyRuntime) info(ctx context.Context) (HAProxyInfo, error) {
	text, err := r.read(ctx, readPrefix, "show info float")
	if err != nil {
		return HAProxyInfo{}, fmt.Errorf("show info: %w", err)
	}
	info, err := parseWorkerInfo(text)
	if err != nil {
		return HAProxyInfo{}, err
	}
	r.version.Store(&info.Version)
	return info, nil
}

// parseWorkerInfo reads Version, Pid and Start_time_sec from show info.
func parseWorkerInfo(text string) (HAProxyInfo, error) {
	var info HAProxyInfo
	var startText string
	haveStart := false
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
			startText, haveStart = value, true
		}
	}
	if haveStart {
		start, ok := parseStartMicros(startText)
		if !ok {
			return HAProxyInfo{}, fmt.Errorf("show info: invalid worker start time %q", startText)
		}
		info.WorkerStartTimeUnixMicros = start
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
	if err != nil {
		return 0, false
	}
	frac = (frac + "000000")[:6]
	micros, _ := strconv.ParseInt(frac, 10, 64)
	if secs > (math.MaxInt64-micros)/1_000_000 {
		return 0, false
	}
	total := secs*1_000_000 + micros
	return total, total > 0
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// ---------------------------------------------------------------------------
// Master socket (runtime.md §6).

// procList is the master's show proc table.
type procList struct {
	MasterPID, Reloads, FailedReloads int
	Workers, OldWorkers               []procRow
}

// procRow is one worker row.
type procRow struct {
	PID, Reloads int
	Version      string
}

// showProc reads the master's process table. It is the master-socket
// readiness gate and tells a refused reload from an unreachable master.
func (r *haproxyRuntime) showProc(ctx context.Context) (procList, error) {
	text, err := r.masterExchange(ctx, "show proc")
	if err != nil {
		return procList{}, fmt.Errorf("show proc: %w", err)
	}
	return parseShowProc(text)
}

// parseShowProc parses the table of runtime.md §6.1; program rows are
// ignored.
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
		reloads, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil {
			return procList{}, fmt.Errorf("show proc: unreadable row %q", line)
		}
		row := procRow{PID: pid, Reloads: reloads, Version: procVersion(fields)}
		switch {
		case section == "" && fields[1] == "master":
			failed, ok := failedCount(line)
			if !ok {
				return procList{}, fmt.Errorf("show proc: unreadable row %q", line)
			}
			list.MasterPID, list.Reloads, list.FailedReloads, haveMaster = pid, reloads, failed, true
		case section == "workers":
			list.Workers = append(list.Workers, row)
		case section == "old workers":
			list.OldWorkers = append(list.OldWorkers, row)
		}
	}
	if !haveMaster {
		return procList{}, errors.New("show proc: no master row")
	}
	return list, nil
}

// failedCount reads "[failed: N]" from the master row.
func failedCount(line string) (int, bool) {
	_, rest, ok := strings.Cut(line, "[failed: ")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

func procVersion(fields []string) string {
	if len(fields) > 4 {
		return fields[4]
	}
	return ""
}

// reload asks the master to reload and judges the outcome. On HAProxy
// >= 2.7 the reply's Success= line decides; before that (README decision 8)
// show proc does: a new worker PID is success, a risen failed counter is a
// rejection, neither within the reload timeout is a timeout.
//
// The reload timeout bounds all of it, the show proc baseline included: a
// master that stopped answering must cost the apply the configured reload
// timeout, not the socket's own I/O timeout.
func (r *haproxyRuntime) reload(ctx context.Context) (string, error) {
	deadline := time.Now().Add(r.reloadTimeout)
	bctx, cancel := context.WithDeadline(ctx, deadline)
	base, err := r.showProc(bctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && time.Now().After(deadline) {
			// The reload was never sent: a master that does not answer is
			// no verdict on anything, and nothing may still take effect.
			return "", fmt.Errorf("reload: the master did not answer show proc within %v", r.reloadTimeout)
		}
		return "", err
	}
	raw, delivered, err := r.roundTrip(ctx, r.masterSocket, "reload;quit\n", deadline)
	if err != nil {
		switch {
		case !delivered, ctx.Err() != nil:
			// Never delivered (the master is gone), or the caller gave up.
			return "", err
		case len(raw) == 0 && errors.Is(err, os.ErrDeadlineExceeded):
			// A reload that hangs: no verdict from HAProxy, not a rejection.
			return "", &runtimeError{msg: fmt.Sprintf("reload: no reply within %v", r.reloadTimeout), kind: []error{errReloadTimeout}}
		}
		// Any other read error after delivery: the master may be
		// re-executing; judge what arrived, else poll show proc.
	}
	text := trimReply(string(raw))
	status, _, _ := strings.Cut(text, "\n")
	if strings.HasPrefix(status, "Success=") {
		log := ""
		if full := text + "\n"; strings.Contains(full, "\n--\n") {
			_, log, _ = strings.Cut(full, "\n--\n")
			log = strings.TrimRight(log, "\n")
		}
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
	known := make(map[int]bool, len(base.Workers))
	for _, w := range base.Workers {
		known[w.PID] = true
	}
	tick := time.NewTicker(r.pollInterval)
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
			for _, w := range procs.Workers {
				if !known[w.PID] {
					return reply, nil
				}
			}
		}
		select {
		case <-pollCtx.Done():
			if ctx.Err() != nil {
				return reply, fmt.Errorf("reload: %w", ctx.Err())
			}
			return reply, &runtimeError{msg: fmt.Sprintf("reload: no new worker within %v", r.reloadTimeout), kind: []error{errReloadTimeout}}
		case <-tick.C:
		}
	}
}

// ---------------------------------------------------------------------------
// Readiness (runtime.md §2.7).

// probe is the readiness check: the worker answers with an identity, the
// master lists at least one current worker, and the inventory reads.
func (r *haproxyRuntime) probe(ctx context.Context) (HAProxyInfo, Inventory, error) {
	info, err := r.info(ctx)
	if err != nil {
		return HAProxyInfo{}, Inventory{}, err
	}
	procs, err := r.showProc(ctx)
	if err != nil {
		return HAProxyInfo{}, Inventory{}, err
	}
	if len(procs.Workers) == 0 {
		return HAProxyInfo{}, Inventory{}, errors.New("show proc: no current worker")
	}
	inv, err := r.inventory(ctx, 1)
	if err != nil {
		return HAProxyInfo{}, Inventory{}, err
	}
	return info, inv, nil
}

// ---------------------------------------------------------------------------
// Inventory and read-backs (runtime.md §7).

// list reads one listing with the apply-path prefix and returns its data
// lines (blank and '#' lines dropped), at most MaxInventoryEntries.
func (r *haproxyRuntime) list(ctx context.Context, cmd string) ([]string, error) {
	text, err := r.read(ctx, linePrefix, cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	lines := dataLines(text)
	if len(lines) > MaxInventoryEntries {
		return nil, fmt.Errorf("%s: %w (%d rows)", cmd, errTooManyEntries, len(lines))
	}
	return lines, nil
}

// dataLines drops blank lines and '#' lines.
func dataLines(text string) []string {
	var lines []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	return lines
}

// inventory lists what the worker has loaded: maps, certificates, CA files,
// CRL files and crt-lists, each sorted and deduplicated (a file with an open
// transaction is listed twice). The five listings travel on one line; a
// listing that fails is reported, and the others still count: their errors
// are joined.
func (r *haproxyRuntime) inventory(ctx context.Context, generation uint64) (Inventory, error) {
	inv := Inventory{Generation: generation}
	listings := []struct {
		cmd  string
		take func(line string) string
		into *[]string
	}{
		{"show map", func(line string) string {
			_, rest, ok := strings.Cut(line, "(")
			name, _, closed := strings.Cut(rest, ")")
			if !ok || !closed {
				return ""
			}
			return name
		}, &inv.Maps},
		{"show ssl cert", func(line string) string { return strings.TrimPrefix(firstField(line), "*") }, &inv.Certs},
		{"show ssl ca-file", func(line string) string {
			if name := strings.TrimPrefix(firstField(line), "*"); name != systemCA {
				return name
			}
			return ""
		}, &inv.CAFiles},
		{"show ssl crl-file", func(line string) string { return strings.TrimPrefix(firstField(line), "*") }, &inv.CRLFiles},
		{"show ssl crt-list", firstField, &inv.CRTLists},
	}
	cmds := make([]string, len(listings))
	for i, l := range listings {
		cmds[i] = l.cmd
	}
	texts, readErrs, err := r.readAll(ctx, linePrefix, cmds)
	if err != nil {
		var errs []error
		for _, l := range listings {
			errs = append(errs, fmt.Errorf("%s: %w", l.cmd, err))
		}
		return inv, errors.Join(errs...)
	}
	var errs []error
	for i, l := range listings {
		names := []string{}
		lines := dataLines(texts[i])
		switch {
		case readErrs[i] != nil:
			errs = append(errs, fmt.Errorf("%s: %w", l.cmd, readErrs[i]))
			lines = nil
		case len(lines) > MaxInventoryEntries:
			errs = append(errs, fmt.Errorf("%s: %w (%d rows)", l.cmd, errTooManyEntries, len(lines)))
			lines = nil
		}
		for _, line := range lines {
			if name := l.take(line); name != "" {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		*l.into = slices.Compact(names)
	}
	return inv, errors.Join(errs...)
}

func firstField(line string) string {
	if f := strings.Fields(line); len(f) > 0 {
		return f[0]
	}
	return ""
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
		fields := strings.SplitN(row, " ", 3)
		if len(fields) < 2 {
			continue
		}
		value := ""
		if len(fields) == 3 {
			value = fields[2]
		}
		entries[fields[1]] = append(entries[fields[1]], value)
	}
	return entries, nil
}

// serverNames lists the servers of one backend from show servers state.
func (r *haproxyRuntime) serverNames(ctx context.Context, backend string) (map[string]struct{}, error) {
	if err := checkToken("backend", backend); err != nil {
		return nil, err
	}
	lines, err := r.list(ctx, "show servers state "+backend)
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
	rows := dataLines(body)
	if len(rows) > MaxInventoryEntries {
		return 0, fmt.Errorf("show stat: %w (%d rows)", errTooManyEntries, len(rows))
	}
	var sum uint64
	for _, row := range rows {
		cells := strings.Split(row, ",")
		if len(cells) < 2 || cells[1] != "FRONTEND" || ignore[cells[0]] {
			continue
		}
		cell := ""
		if column < len(cells) {
			cell = cells[column]
		}
		if cell == "" {
			continue
		}
		n, err := strconv.ParseUint(cell, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("show stat: conn_tot of %s is not a number: %q", cells[0], cell)
		}
		sum += n
	}
	return sum, nil
}

// ---------------------------------------------------------------------------
// Interactive worker session (runtime.md §2.6).

// workerSession is one prompt-mode connection to one worker, so that
// show info, wait, shutdown sessions and del run on the same worker. It
// never reconnects: a new connection could reach a new worker.
type workerSession struct {
	ctx     context.Context
	conn    net.Conn
	stop    func() bool
	timeout time.Duration
	buf     []byte
}

// openWorker opens a session bound to the expected worker: after the setup
// commands its show info must name the same pid and start time, else
// errWorkerGone.
func (r *haproxyRuntime) openWorker(ctx context.Context, expected HAProxyInfo) (*workerSession, error) {
	if !expected.HasWorkerIdentity() {
		return nil, fmt.Errorf("%w: no worker identity to bind the session to", errWorkerGone)
	}
	conn, err := r.dial(ctx, r.workerSocket, time.Now().Add(r.sessionTimeout))
	if err != nil {
		return nil, transportError(ctx, err)
	}
	s := &workerSession{ctx: ctx, conn: conn, timeout: r.sessionTimeout}
	s.stop = context.AfterFunc(ctx, func() { conn.Close() })
	for _, cmd := range []string{"prompt", "set severity-output number", "experimental-mode on"} {
		reply, err := s.execute(cmd)
		if err == nil {
			err = sessionVerdict(reply, command{Text: cmd})
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("worker session setup: %w", err)
		}
	}
	reply, err := s.execute("show info float")
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("worker session setup: %w", err)
	}
	got, err := parseWorkerInfo(reply)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("worker session setup: %w", err)
	}
	if !expected.SameWorker(got) {
		s.Close()
		return nil, fmt.Errorf("%w: expected pid %d (start %d), found pid %d (start %d)", errWorkerGone,
			expected.WorkerPID, expected.WorkerStartTimeUnixMicros, got.WorkerPID, got.WorkerStartTimeUnixMicros)
	}
	return s, nil
}

// execute sends one command and returns the text before the prompt,
// trimmed. A reply is complete only when it ends with the prompt: EOF or a
// read error first is an incomplete reply, never silence.
func (s *workerSession) execute(cmd string) (string, error) {
	if err := s.ctx.Err(); err != nil {
		return "", fmt.Errorf("incomplete worker reply: %w", err)
	}
	if err := s.conn.SetDeadline(time.Now().Add(s.timeout)); err != nil {
		return "", fmt.Errorf("incomplete worker reply: %w", s.cause(err))
	}
	if _, err := io.WriteString(s.conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("incomplete worker reply: %w", s.cause(err))
	}
	s.buf = s.buf[:0]
	var chunk [4096]byte
	for !bytes.HasSuffix(s.buf, []byte(workerPrompt)) {
		if len(s.buf) > maxSessionReplyBytes {
			return "", fmt.Errorf("worker reply exceeds %d bytes", maxSessionReplyBytes)
		}
		n, err := s.conn.Read(chunk[:])
		s.buf = append(s.buf, chunk[:n]...)
		if err != nil && !bytes.HasSuffix(s.buf, []byte(workerPrompt)) {
			return "", fmt.Errorf("incomplete worker reply: %w", s.cause(err))
		}
	}
	if len(s.buf) > maxSessionReplyBytes+len(workerPrompt) {
		return "", fmt.Errorf("worker reply exceeds %d bytes", maxSessionReplyBytes)
	}
	return strings.TrimSpace(string(s.buf[:len(s.buf)-len(workerPrompt)])), nil
}

// cause reports a cancelled context rather than the closed connection it
// caused.
func (s *workerSession) cause(err error) error {
	if ctxErr := s.ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}

// Close ends the session.
func (s *workerSession) Close() error {
	s.stop()
	return s.conn.Close()
}

// sessionVerdict judges one session reply as a line of one command: the
// prefix entry first, as matchBatch always expects, although the session
// sent its prefix commands at setup.
func sessionVerdict(reply string, c command) error {
	errs, outputs := matchSegments(splitSegments(reply), []command{prefixEntry, c})
	if errs[1] == nil {
		return nil
	}
	if outputs[1] != "" {
		return fmt.Errorf("%w: %s", errs[1], outputs[1])
	}
	return errs[1]
}

// ---------------------------------------------------------------------------
// The deferred-delete queue (agent.md §11).

// serverRef names one server.
type serverRef struct{ Backend, Server string }

func (s serverRef) String() string { return s.Backend + "/" + s.Server }

// splitDeletes divides an apply's ops: server_del and backend_del are
// deferred, the waits and shutdown_sessions are dropped (the queue issues
// its own, after the inline half stopped the traffic), the rest stays
// inline in order.
func splitDeletes(ops []Op) (inline []Op, servers []serverRef, backends []string) {
	for _, op := range ops {
		switch op.Kind {
		case OpServerDel:
			servers = append(servers, serverRef{Backend: op.Backend, Server: op.Server})
		case OpBackendDel:
			backends = append(backends, op.Backend)
		case OpServerWaitRemovable, OpBackendWaitRemovable, OpShutdownSessions:
		default:
			inline = append(inline, op)
		}
	}
	return inline, servers, backends
}

// Queue timing. The per-item waits are HAProxy-side ("wait 2000 …"), each
// inside the session's 30 s command deadline.
const (
	deferredWaitMs      = 2000            // wait budget of one srv-removable / be-removable check
	deferredQueueTick   = 2 * time.Second // the loop's ticker, besides wake-ups
	backendAlreadyGone  = "[3]: Failed. No such backend."
	deferredKindServer  = "server"
	deferredKindBackend = "backend"
)

// deleteItem is one queued delete, stamped with the worker it was meant for.
type deleteItem struct {
	server     serverRef // for a server delete
	backend    string    // for a backend delete
	worker     HAProxyInfo
	generation uint64
	tries      int
}

func (it *deleteItem) kind() string {
	if it.backend != "" {
		return deferredKindBackend
	}
	return deferredKindServer
}

func (it *deleteItem) name() string {
	if it.backend != "" {
		return it.backend
	}
	return it.server.String()
}

// deleteQueue runs deferred deletes one at a time, each on its own worker
// session bound to the worker recorded at enqueue. Its mutex is a leaf
// lock: it is never held across HAProxy I/O or while calling count, so
// setWorker, enqueue, check and pending never wait for a session command.
type deleteQueue struct {
	rt     *haproxyRuntime
	logger *slog.Logger
	count  func(kind, outcome string)
	wakeup chan struct{}
	tick   time.Duration

	mu         sync.Mutex
	worker     HAProxyInfo
	generation uint64
	servers    []*deleteItem
	backends   []*deleteItem
	inFlight   *deleteItem
}

// newDeleteQueue builds the queue; count (never blocking) is told every
// outcome: "done", "deferred", "abandoned" or "superseded".
func newDeleteQueue(rt *haproxyRuntime, logger *slog.Logger, count func(kind, outcome string)) *deleteQueue {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if count == nil {
		count = func(string, string) {}
	}
	return &deleteQueue{rt: rt, logger: logger, count: count, wakeup: make(chan struct{}, 1), tick: deferredQueueTick}
}

// check accepts deletes before anything executes: every name passes the
// token grammar and the queue stays within its caps, counting the item in
// flight. A refusal is a compile error (the apply reloads).
func (q *deleteQueue) check(servers []serverRef, backends []string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, _, err := q.admit(servers, backends)
	return err
}

// enqueue queues deletes after the inline half succeeded. The worker must
// be the queue's current worker: deletes meant for an outgoing worker
// would run against objects the reloaded configuration no longer has.
func (q *deleteQueue) enqueue(worker HAProxyInfo, servers []serverRef, backends []string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	newServers, newBackends, err := q.admit(servers, backends)
	if err != nil {
		return err
	}
	if !q.worker.SameWorker(worker) {
		return fmt.Errorf("%w: queue worker pid %d (start %d), enqueue for pid %d (start %d)", errWorkerGone,
			q.worker.WorkerPID, q.worker.WorkerStartTimeUnixMicros, worker.WorkerPID, worker.WorkerStartTimeUnixMicros)
	}
	for _, s := range newServers {
		q.servers = append(q.servers, &deleteItem{server: s, worker: worker, generation: q.generation})
	}
	for _, b := range newBackends {
		q.backends = append(q.backends, &deleteItem{backend: b, worker: worker, generation: q.generation})
	}
	return nil
}

// admit validates names and capacity (under q.mu) and returns the deletes
// not already pending, each once.
func (q *deleteQueue) admit(servers []serverRef, backends []string) ([]serverRef, []string, error) {
	for _, s := range servers {
		if err := firstError(checkToken("backend", s.Backend), checkToken("server", s.Server)); err != nil {
			return nil, nil, err
		}
	}
	for _, b := range backends {
		if err := checkToken("backend", b); err != nil {
			return nil, nil, err
		}
	}
	pendingServers, pendingBackends := q.pendingLocked()
	seen := make(map[string]bool, len(pendingServers)+len(pendingBackends))
	for _, name := range pendingServers {
		seen["s:"+name] = true
	}
	for _, name := range pendingBackends {
		seen["b:"+name] = true
	}
	var newServers []serverRef
	for _, s := range servers {
		if key := "s:" + s.String(); !seen[key] {
			seen[key] = true
			newServers = append(newServers, s)
		}
	}
	var newBackends []string
	for _, b := range backends {
		if key := "b:" + b; !seen[key] {
			seen[key] = true
			newBackends = append(newBackends, b)
		}
	}
	if len(pendingServers)+len(newServers) > MaxPendingServerDeletes {
		return nil, nil, fmt.Errorf("%w: %d pending and %d new server deletes exceed %d",
			errDeferralOverflow, len(pendingServers), len(newServers), MaxPendingServerDeletes)
	}
	if len(pendingBackends)+len(newBackends) > MaxPendingBackendDeletes {
		return nil, nil, fmt.Errorf("%w: %d pending and %d new backend deletes exceed %d",
			errDeferralOverflow, len(pendingBackends), len(newBackends), MaxPendingBackendDeletes)
	}
	return newServers, newBackends, nil
}

// wake makes the loop drain now rather than at its next tick.
func (q *deleteQueue) wake() {
	select {
	case q.wakeup <- struct{}{}:
	default:
	}
}

// setWorker adopts the running worker. For the same worker (pid and start
// time) nothing changes; a new worker retires everything queued for the
// old one (counted superseded): the reloaded configuration no longer has
// those objects. An item in flight finishes on its old connection and is
// never requeued.
func (q *deleteQueue) setWorker(info HAProxyInfo) {
	q.mu.Lock()
	if q.worker.SameWorker(info) {
		q.mu.Unlock()
		return
	}
	q.worker = info
	q.generation++
	dropped := slices.Concat(q.servers, q.backends)
	q.servers, q.backends = nil, nil
	q.mu.Unlock()
	for _, it := range dropped {
		q.logger.Info("deferred delete superseded by a new worker", "kind", it.kind(), "name", it.name())
		q.count(it.kind(), "superseded")
	}
}

// pending lists the item in flight (when it belongs to the current worker)
// and the queued ones; never nil slices.
func (q *deleteQueue) pending() PendingDeletes {
	q.mu.Lock()
	defer q.mu.Unlock()
	servers, backends := q.pendingLocked()
	return PendingDeletes{Servers: servers, Backends: backends}
}

func (q *deleteQueue) pendingLocked() (servers, backends []string) {
	servers, backends = make([]string, 0, len(q.servers)+1), make([]string, 0, len(q.backends)+1)
	if it := q.inFlight; it != nil && it.generation == q.generation {
		if it.backend != "" {
			backends = append(backends, it.backend)
		} else {
			servers = append(servers, it.server.String())
		}
	}
	for _, it := range q.servers {
		servers = append(servers, it.server.String())
	}
	for _, it := range q.backends {
		backends = append(backends, it.backend)
	}
	return servers, backends
}

// start drains the queue on every wake-up and every tick until ctx ends.
func (q *deleteQueue) start(ctx context.Context) {
	tick := time.NewTicker(q.tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wakeup:
		case <-tick.C:
		}
		q.drain(ctx)
	}
}

// drain processes, one at a time in FIFO order, as many servers and then
// backends as were queued when it began; requeued items wait for the next
// round.
func (q *deleteQueue) drain(ctx context.Context) {
	q.mu.Lock()
	servers, backends := len(q.servers), len(q.backends)
	q.mu.Unlock()
	for range servers {
		if ctx.Err() != nil || !q.runNext(ctx, &q.servers) {
			return
		}
	}
	for range backends {
		if ctx.Err() != nil || !q.runNext(ctx, &q.backends) {
			return
		}
	}
}

// runNext takes the head of one list, runs it without the lock, and records
// the outcome. It reports false when the list was empty.
func (q *deleteQueue) runNext(ctx context.Context, list *[]*deleteItem) bool {
	q.mu.Lock()
	if len(*list) == 0 {
		q.mu.Unlock()
		return false
	}
	it := (*list)[0]
	*list = (*list)[1:]
	q.inFlight = it
	q.mu.Unlock()

	err := q.run(ctx, it)

	q.mu.Lock()
	q.inFlight = nil
	outcome := ""
	switch {
	case err == nil:
		outcome = "done"
	case ctx.Err() != nil && it.generation == q.generation:
		// The agent is stopping: not a failure of the item. It goes back
		// to the head, untried, and is never counted done.
		*list = slices.Insert(*list, 0, it)
	case it.generation != q.generation || errors.Is(err, errWorkerGone):
		outcome = "superseded"
	default:
		it.tries++
		if it.tries >= MaxDeferredAttempts {
			outcome = "abandoned"
		} else {
			outcome = "deferred"
			*list = append(*list, it)
		}
	}
	q.mu.Unlock()

	switch outcome {
	case "done":
		q.logger.Info("deferred delete done", "kind", it.kind(), "name", it.name())
	case "abandoned":
		q.logger.Warn("deferred delete abandoned", "kind", it.kind(), "name", it.name(), "attempts", it.tries, "error", err)
	case "":
		return true
	default:
		q.logger.Info("deferred delete "+outcome, "kind", it.kind(), "name", it.name(), "attempts", it.tries, "error", err)
	}
	q.count(it.kind(), outcome)
	return true
}

// run performs one item's commands on a session of its own.
func (q *deleteQueue) run(ctx context.Context, it *deleteItem) error {
	s, err := q.rt.openWorker(ctx, it.worker)
	if err != nil {
		return err
	}
	defer s.Close()
	if it.backend != "" {
		return q.deleteBackend(s, it)
	}
	return q.deleteServer(s, it)
}

// send runs one session command for an item, refusing once the item's
// worker has been superseded.
func (q *deleteQueue) send(s *workerSession, it *deleteItem, cmd string) (string, error) {
	q.mu.Lock()
	stale := it.generation != q.generation
	q.mu.Unlock()
	if stale {
		return "", fmt.Errorf("%w: superseded before %q", errWorkerGone, cmd)
	}
	return s.execute(cmd)
}

// sendJudged runs a command and judges its reply by the single-command rules.
func (q *deleteQueue) sendJudged(s *workerSession, it *deleteItem, c command) error {
	reply, err := q.send(s, it, c.Text)
	if err != nil {
		return err
	}
	return sessionVerdict(reply, c)
}

// deleteServer: wait until removable (shutting the sessions down when the
// wait expires), then delete.
func (q *deleteQueue) deleteServer(s *workerSession, it *deleteItem) error {
	ref := it.server.String()
	wait := command{Text: "wait " + strconv.Itoa(deferredWaitMs) + " srv-removable " + ref, Expect: expectDone}
	err := q.sendJudged(s, it, wait)
	if errors.Is(err, errWaitExpired) {
		if err := q.sendJudged(s, it, command{Text: "shutdown sessions server " + ref}); err != nil {
			return err
		}
		err = q.sendJudged(s, it, wait)
	}
	if err != nil {
		return err
	}
	return q.sendJudged(s, it, command{Text: "del server " + ref, Expect: "Server deleted"})
}

// deleteBackend: a backend's deletion counts only when confirmed by its
// absence, because the reply to "del backend" alone is not trusted.
func (q *deleteQueue) deleteBackend(s *workerSession, it *deleteItem) error {
	be := it.backend
	reply, err := q.send(s, it, "wait "+strconv.Itoa(deferredWaitMs)+" be-removable "+be)
	if err != nil {
		return err
	}
	if reply == backendAlreadyGone {
		return nil
	}
	if err := sessionVerdict(reply, command{Text: "wait", Expect: expectDone}); err != nil {
		return err
	}
	reply, err = q.send(s, it, "del backend "+be)
	if err != nil {
		return err
	}
	for _, seg := range splitSegments(reply) {
		if err := classify(seg); err != nil {
			return fmt.Errorf("%w: %s", err, seg)
		}
	}
	reply, err = q.send(s, it, "wait 1 be-removable "+be)
	if err != nil {
		return err
	}
	if reply != backendAlreadyGone {
		return fmt.Errorf("%w: backend %s still present after del backend: %q", errUnreadableResponse, be, reply)
	}
	return nil
}
