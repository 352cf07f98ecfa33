// This file owns the op compiler: an Op becomes a program of HAProxy
// runtime commands (compileOp), every word checked against the token
// grammar, every payload framed for the worker's terminator, and the
// commands are packed into ';'-joined lines under the line budget, each
// rendered behind the line prefix.
//
// It is pure functions over data and must never do I/O: the file bytes
// arrive through a content function and the terminator as an argument, so
// a compile can be tested, fuzzed and repeated without a socket. It must
// never sanitise a word (a failing field is refused) and never build a
// line that could exceed HAProxy's per-command limit.

package haptic

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Line constants. HAProxy refuses (3.0) or silently drops (2.6) a command
// over 16383 bytes, and 3.4 refuses a whole line over it, so every line
// stays within MaxCommandLineBytes (12288) with lineReserve of it kept for
// the prefix: a 4 KiB margin below the limit. The prefix has HAProxy tag
// every response with its severity level, which judging reads, and turns
// on experimental mode, which the line format carries for the backend
// verbs (3.4.0 runs them without); both last only for the connection.
const (
	lineReserve        = 64                                                 // bytes kept free in every line for the prefix
	lineBudget         = MaxCommandLineBytes - lineReserve                  // 12224
	linePrefix         = "set severity-output number;experimental-mode on;" // apply path and listings
	payloadTerminator  = "HAPTIC"                                           // custom payload terminator (HAProxy >= 3.0)
	versionPlaceholder = "\x01ver\x01"                                      // a captured map version in command text
	expectDone         = "Done"                                             // success text of wait

	// maxFramedPayloadCommand bounds one payload command with its framing,
	// alone behind the prefix: 2.6 and 3.0 count it against their 16383
	// bytes, and near them 2.6.12 hangs (16384) and 3.4.0 leaves a payload
	// line unanswered (16384 to 16390), so stay far below.
	maxFramedPayloadCommand = MaxCommandLineBytes + 1024
)

// The compiler's refusals; the agent tells them apart with errors.Is.
// errVersionLimit marks what the worker's version cannot take at runtime
// (before 3.0, a payload with an empty line): a reload carries it.
var (
	errUnsafeToken  = errors.New("unsafe runtime token")
	errUnknownOp    = errors.New("unknown op kind")
	errVersionLimit = errors.New("beyond what this HAProxy version takes at runtime")
)

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

// terminatorFor chooses the payload terminator for a worker version.
// HAProxy 2.6 would take "<<HAPTIC" as a plain argument and run every
// payload line as a command. Custom terminators arrived in 3.0 with dynamic
// servers, so CapsFor's version rule decides; an older or unreadable
// version gets HAProxy's default empty-line terminator.
func terminatorFor(version string) string {
	if CapsFor(version, nil).DynamicServers {
		return payloadTerminator
	}
	return ""
}

// compileOp turns one op into its program, every word checked against the
// token grammar first. content returns the held bytes of a file
// (map_replace, cert_*, ca_*); term is the worker's payload terminator.
func compileOp(op *Op, content func(path string) ([]byte, error), term string) (program, error) {
	p := program{Kind: op.Kind, Terminator: term}
	ref := op.Backend + "/" + op.Server // what the server commands name
	var err error
	switch op.Kind {
	case OpBackendAdd:
		err = cmp.Or(checkToken("backend", op.Backend), checkToken("profile", op.Profile), checkEnum("mode", op.Mode, "http", "tcp"))
		text := "add backend " + op.Backend + " from " + op.Profile + " mode " + op.Mode
		if op.GUID != "" {
			err, text = cmp.Or(err, checkToken("guid", op.GUID)), text+" guid "+op.GUID
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
		err = cmp.Or(checkToken("backend", op.Backend), checkRange("timeout_ms", op.TimeoutMs, 1, MaxWaitBudgetMs))
		p.Commands = []command{{Text: "wait " + strconv.Itoa(op.TimeoutMs) + " be-removable " + op.Backend, Expect: expectDone}}
	case OpServerAdd:
		err = cmp.Or(checkRef(op), checkToken("address", op.Address), checkRange("port", op.Port, 0, 65535), checkKeywords("keyword", op.Keywords))
		text := "add server " + ref + " " + op.Address
		if op.Port > 0 {
			text += ":" + strconv.Itoa(op.Port)
		}
		p.Commands = []command{{Text: strings.Join(slices.Concat([]string{text}, flatWords(op.Keywords)), " "), Expect: "New server registered"}}
	case OpServerEnable:
		err = checkRef(op)
		if op.Health {
			p.Commands = append(p.Commands, command{Text: "enable health " + ref})
		}
		p.Commands = append(p.Commands, command{Text: "enable server " + ref})
	case OpServerDisable:
		err = checkRef(op)
		p.Commands = []command{{Text: "disable server " + ref}}
	case OpServerSetAddr:
		err = cmp.Or(checkRef(op), checkToken("address", op.Address), checkRange("port", op.Port, 0, 65535))
		text := "set server " + ref + " addr " + op.Address
		if op.Port > 0 {
			text += " port " + strconv.Itoa(op.Port)
		}
		// HAProxy answers at WARNING for success and refusal alike; the
		// words decide ("IP changed", "port changed", "nothing changed").
		p.Commands = []command{{Text: text, Expect: "chang"}}
	case OpServerSetWeight:
		err = cmp.Or(checkRef(op), checkWeight(op.Weight))
		if err == nil {
			p.Commands = []command{{Text: "set server " + ref + " weight " + strconv.Itoa(*op.Weight)}}
		}
	case OpServerSetState:
		err = cmp.Or(checkRef(op), checkEnum("state", op.State, ServerStateReady, ServerStateMaint, ServerStateDrain))
		p.Commands = []command{{Text: "set server " + ref + " state " + op.State}}
	case OpServerWaitRemovable:
		err = cmp.Or(checkRef(op), checkRange("timeout_ms", op.TimeoutMs, 1, MaxWaitBudgetMs))
		p.Commands = []command{{Text: "wait " + strconv.Itoa(op.TimeoutMs) + " srv-removable " + ref, Expect: expectDone}}
	case OpShutdownSessions:
		err = checkRef(op)
		p.Commands = []command{{Text: "shutdown sessions server " + ref}}
	case OpServerDel:
		err = checkRef(op)
		p.Commands = []command{{Text: "del server " + ref, Expect: "Server deleted"}}
	case OpMapAdd:
		// The payload form carries a value with spaces, which the line form
		// would cut at the first space.
		err = cmp.Or(checkToken("path", op.Path), checkToken("key", op.Key), checkWord(SafePayloadValue(op.Value), "value", op.Value))
		p.Commands = []command{{Text: "add map " + op.Path, Payload: op.Key + " " + op.Value + "\n"}}
	case OpMapSet:
		err = cmp.Or(checkToken("path", op.Path), checkToken("key", op.Key), checkToken("value", op.Value))
		p.Commands = []command{{Text: "set map " + op.Path + " " + op.Key + " " + op.Value}}
	case OpMapDel:
		err = cmp.Or(checkToken("path", op.Path), checkToken("key", op.Key))
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
		err = cmp.Or(checkToken("path", op.Path), checkToken("cert", op.Cert),
			checkKeywords("option", op.Options), checkTokens("sni filter", op.SNIFilters), checkCRTListWords(op))
		p.Commands = []command{{Text: "add ssl crt-list " + op.Path, Payload: crtListLine(op), Expect: "Success"}}
	case OpCRTListDel:
		err = cmp.Or(checkToken("path", op.Path), checkToken("cert", op.Cert))
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
	data, err := readContent(content, path)
	if err != nil {
		return nil, err
	}
	body, err := mapPayload(data)
	if err != nil {
		return nil, err
	}
	chunks, err := chunkLines(body, MaxPayloadBytes)
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

// mapPayload renders a map file's entries as one payload, "key value\n"
// each. A file whose every line already reads that way (canonicalMapFile)
// is its own payload: a rendered map of 10,000 entries then costs one scan
// instead of ten thousand parsed entries, which on this path is most of
// the agent's own time in a map replace. Any other file is parsed entry by
// entry; both ways give the same payload.
func mapPayload(data []byte) (string, error) {
	if canonicalMapFile(data) {
		return string(data), nil
	}
	var body strings.Builder
	// At most the file plus one space per line ("key \n" for an empty value).
	body.Grow(len(data) + bytes.Count(data, []byte{'\n'}) + 1)
	for _, e := range ParseMapEntries(string(data)) {
		if !SafePayloadValue(e.Key) || !SafePayloadValue(e.Value) {
			return "", fmt.Errorf("%w: map entry %q", errUnsafeToken, e.Key)
		}
		body.WriteString(e.Key)
		body.WriteByte(' ')
		body.WriteString(e.Value)
		body.WriteByte('\n')
	}
	return body.String(), nil
}

// canonicalMapFile reports whether ParseMapEntries would render data back
// byte for byte: every line ends in '\n' and is a key, one space, a value
// that neither starts nor ends with a space, all of it printable ASCII. No
// byte is then whitespace to trim, a tab or a control character, and the
// line is no comment.
func canonicalMapFile(data []byte) bool {
	for line := range bytes.Lines(data) {
		line, ok := bytes.CutSuffix(line, []byte{'\n'})
		sep := bytes.IndexByte(line, ' ')
		if !ok || sep <= 0 || line[0] == '#' || sep+1 == len(line) || line[sep+1] == ' ' || line[len(line)-1] == ' ' {
			return false
		}
		for _, c := range line {
			if c < ' ' || c > '~' {
				return false
			}
		}
	}
	return true
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
		chunks, payload = append(chunks, payload[:cut]), payload[cut:]
	}
	return chunks, nil
}

// compileTransaction builds a certificate or CA-file update: optionally
// create the entry, open a transaction with the PEM, commit it. A worker
// holds one open transaction per store and refuses any other object's
// until it ends, so the program carries the abort that closes it on failure.
func compileTransaction(op *Op, content func(string) ([]byte, error), store, newExpect string) (cmds, abort []command, err error) {
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

// readContent checks path against the token grammar, then reads its held bytes.
func readContent(content func(string) ([]byte, error), path string) ([]byte, error) {
	if err := checkToken("path", path); err != nil {
		return nil, err
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
	words := []string{op.Cert}
	if len(op.Options) > 0 {
		words = append(words, "["+strings.Join(flatWords(op.Options), " ")+"]")
	}
	return strings.Join(append(words, op.SNIFilters...), " ") + "\n"
}

// flatWords lists keywords, each followed by its arguments.
func flatWords(kws []KeywordArg) []string {
	var words []string
	for _, kw := range kws {
		words = append(append(words, kw.Name), kw.Args...)
	}
	return words
}

// Token checks. A word HAProxy would read differently from what the op
// means is refused, never repaired: ';' splits commands, "<<" opens a
// payload, a line end ends the command, a backslash is consumed as an
// escape and whitespace splits words (SafeToken). Each refusal wraps
// errUnsafeToken.

func checkToken(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", errUnsafeToken, field)
	}
	return checkWord(SafeToken(s), field, s)
}

// checkWord refuses the word s of field unless ok.
func checkWord(ok bool, field, s string) error {
	if !ok {
		return fmt.Errorf("%w: %s %q", errUnsafeToken, field, s)
	}
	return nil
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
		if err := cmp.Or(checkToken(field, kw.Name), checkTokens(field+" argument", kw.Args)); err != nil {
			return err
		}
	}
	return nil
}

// checkCRTListWords refuses brackets in the words of a crt-list entry:
// SafeToken allows them, but inside the entry's one bracket pair a ']'
// would end the options early and turn the rest into SNI filters.
func checkCRTListWords(op *Op) error {
	for _, w := range slices.Concat([]string{op.Cert}, op.SNIFilters, flatWords(op.Options)) {
		if strings.ContainsAny(w, "[]") {
			return fmt.Errorf("%w: crt-list word %q", errUnsafeToken, w)
		}
	}
	return nil
}

func checkRef(op *Op) error {
	return cmp.Or(checkToken("backend", op.Backend), checkToken("server", op.Server))
}

func checkEnum(field, s string, allowed ...string) error {
	return checkWord(slices.Contains(allowed, s), field, s)
}

// checkRange refuses a number outside what HAProxy takes as meant: it
// would wrap "port 70000" to port 4464.
func checkRange(field string, n, lo, hi int) error {
	if n < lo || n > hi {
		return fmt.Errorf("%w: %s %d outside %d..%d", errUnsafeToken, field, n, lo, hi)
	}
	return nil
}

func checkWeight(w *int) error {
	if w == nil {
		return fmt.Errorf("%w: weight is unset", errUnsafeToken)
	}
	return checkRange("weight", *w, 0, 256)
}

// checkCommand enforces one built command's limits: its text fits a line
// with the prefix, its payload HAProxy's buffer (see chunkLines) and, framed,
// maxFramedPayloadCommand; and no payload line can end the payload early.
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
	if n := len(frameCommand(c.Text, c.Payload, term)); n > maxFramedPayloadCommand {
		return fmt.Errorf("payload command of %d bytes exceeds the %d-byte framed limit", n, maxFramedPayloadCommand)
	}
	if strings.IndexByte(c.Payload, 0) >= 0 {
		return fmt.Errorf("%w: payload contains a NUL byte", errUnsafeToken)
	}
	// HAProxy matches the terminator against whole lines; with the default
	// (empty) terminator this refuses any blank line, so a PEM with a blank
	// line goes by reload on an HAProxy without custom terminators.
	for line := range strings.SplitSeq(strings.TrimSuffix(c.Payload, "\n"), "\n") {
		switch {
		case strings.TrimSuffix(line, "\r") != term:
		case term == "":
			return &runtimeError{msg: "unsafe runtime token: payload contains the terminator line (an empty line, the only terminator before HAProxy 3.0)",
				kind: []error{errUnsafeToken, errVersionLimit}}
		default:
			return fmt.Errorf("%w: payload contains the terminator line", errUnsafeToken)
		}
	}
	return nil
}

// frameCommand renders a payload command: "<text> <<TERM\n<payload>TERM\n",
// with HAProxy's default empty-line terminator when term is "".
func frameCommand(text, payload, term string) string {
	if !strings.HasSuffix(payload, "\n") {
		payload += "\n"
	}
	return text + " <<" + term + "\n" + payload + term + "\n"
}

// Line building: the commands of consecutive programs share a line until
// the budget is reached, since every line costs a connection.

// lineCommand is a command placed on a line, with the program it belongs to.
type lineCommand struct {
	command
	prog int
}

// lineBuilder packs commands into lines. Every line, prefix and final '\n'
// included, stays within MaxCommandLineBytes before its payload framing;
// payload, capture and repeated commands travel alone; one line's wait
// budget stays within MaxWaitBudgetMs, so one exchange is bounded by
// IOTimeout + 30s.
type lineBuilder struct {
	pending []lineCommand
	length  int // Σ len(Text)+1 over pending
	waitMs  int // Σ wait timeouts over pending
}

// add queues c and returns the lines that are complete and must be sent
// now, in order (none, one or two).
func (b *lineBuilder) add(c lineCommand) [][]lineCommand {
	var ready [][]lineCommand
	solo := c.Payload != "" || c.Capture || c.Repeat
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
	var b strings.Builder
	b.WriteString(linePrefix)
	for i, c := range line {
		if i > 0 {
			b.WriteByte(';')
		}
		if c.Payload != "" {
			return b.String() + frameCommand(c.Text, c.Payload, term)
		}
		b.WriteString(c.Text)
	}
	return b.String() + "\n"
}

func lineWaitBudget(line []lineCommand) time.Duration {
	ms := 0
	for _, c := range line {
		ms += waitMsOf(c.Text)
	}
	return time.Duration(ms) * time.Millisecond
}
