// This file owns FakeHAProxy: an in-process HAProxy of one master and one
// worker, served over two unix sockets with HAProxy's own wire framing and
// reply texts (runtime.md §8). It is the oracle of every runtime, agent and
// fault test, and `haptic demo` runs on it, so it is exported and built to
// ship, like net/http/httptest. Real HAProxy is its authority: every text
// and every framing rule below was read off HAProxy 3.0 and 2.6, and
// TestFakeMatchesRealHAProxy holds the fake to them.
//
// It must never import testing, read a configuration file, dial anything,
// or sleep in place of HAProxy (a `wait` answers at once). It models state,
// not timing: the only delay it has is the 2.6 dialect's reload effect.
package haptic

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FakeModel is the state of the fake HAProxy: what its master and its
// current worker hold. Tests seed and inspect it through
// (*FakeHAProxy).With, which runs under the fake's lock; the fake's own
// bookkeeping (map versions, open transactions, crt-list line numbers)
// stays unexported.
type FakeModel struct {
	Version             string // as started; read-only
	MasterPID           int    // default 999
	Pid                 int    // worker pid, default 1000
	StartTimeUnixMicros int64  // worker start time, default 1_700_000_000_000_000
	Reloads             int    // master row of show proc: reloads
	FailedReloads       int    // master row of show proc: [failed: N]
	WorkerReloads       int    // worker row of show proc: reloads survived

	Backends  map[string]*FakeBackend
	Maps      map[string][]MapEntry
	Certs     map[string]string   // path → PEM; "" is a store created by new ssl cert, never committed
	CAFiles   map[string]string   // path → PEM
	CRLFiles  map[string]string   // path → PEM
	CRTLists  map[string][]string // list → entry lines, as show ssl crt-list prints them
	Frontends map[string]uint64   // conn_tot by frontend; default {"status": 0, "http-tcp": 0}
	Commands  []string            // worker commands received, in order (what Sent returns)

	// Reject, when set, is asked about every recorded worker command before
	// it runs; reject true refuses it with "[3]: <message>". It is called
	// without the lock held, so it may block to model a slow command.
	Reject func(command string) (message string, reject bool)
	// BlockedServers marks "<backend>/<server>" as still holding
	// connections: wait srv-removable expires and del server is refused
	// until shutdown sessions server clears the mark.
	BlockedServers map[string]bool
	ReloadFails    bool          // the next reloads fail (Success=0, or the failed count rises on 2.6)
	ReloadLog      string        // replaces the default startup log of a reload reply
	ReloadHangs    bool          // reload never answers (3.0/3.4) and never produces a worker
	ReloadDelay    time.Duration // 2.6 dialect: delay before a reload takes effect, default 50 ms
	// ReloadTakes, on 3.0/3.4, makes a reload as slow as one that parses a
	// huge map: its Success= reply and its new worker come this late, and
	// a reload asked for meanwhile is answered "Another reload is still in
	// progress." A client that gives up earlier still gets the new worker.
	ReloadTakes time.Duration
	// OnReload runs under the lock after each successful reload: it sets
	// what the new worker "loaded", since the fake reads no configuration.
	OnReload func(m *FakeModel)
	// CutReply, when set, is asked about every worker line after its
	// commands ran; cut true writes only the first keep bytes of the reply
	// and closes the connection. It is called without the lock held.
	CutReply func(line string) (keep int, cut bool)

	mapVersions  map[string]*fakeMapVersions
	certTx       *fakeTransaction
	caTx         *fakeTransaction
	crtListLines map[string][]int // line number of each CRTLists entry
	crtListLast  map[string]int   // last line number a list assigned
}

// FakeBackend is one backend of the fake worker.
type FakeBackend struct {
	Profile, Mode, GUID string
	Published           bool
	Servers             []*FakeServer
}

// FakeServer is one server of a fake backend.
type FakeServer struct {
	Name, Address string
	Port          int
	Keywords      []string // the words after the address
	Weight        int      // default 1
	State         string   // "ready", "maint" or "drain"
	Enabled       bool
	Check, Health bool // Check: "check" among the keywords; Health: checks running
}

// FakeHAProxy serves a FakeModel on <dir>/haproxy-worker.sock (the worker's
// stats socket) and <dir>/haproxy-master.sock (the master CLI).
type FakeHAProxy struct {
	dir, version string
	dialect      fakeDialect
	initState    bool // add server accepts init-state (3.1 and later)
	workerPath   string
	masterPath   string

	mu    sync.Mutex // guards model
	model FakeModel

	connMu     sync.Mutex // guards the fields below
	closed     bool
	workerLn   net.Listener
	masterLn   net.Listener
	conns      map[net.Conn]bool // open connections → is a master connection
	masterDown bool
	timers     []*time.Timer
	// reloadBusyUntil is when a slow reload (ReloadTakes) ends.
	reloadBusyUntil time.Time
	wg              sync.WaitGroup
}

// fakeDialect is the HAProxy release line the fake answers as (§8.2).
type fakeDialect int

const (
	fakeDialect26 fakeDialect = iota // before 3.0
	fakeDialect30                    // 3.0 to 3.3
	fakeDialect34                    // 3.4 and later
)

const (
	fakeDefaultVersion = "3.4.3-1deb11u1"
	// fakeCommandLimit is HAProxy's per-command limit: tune.bufsize (16384)
	// less the byte kept for the terminating NUL. It counts a command from
	// its first byte through the ';' or '\n' that ends it, and a payload
	// command through its terminator line.
	fakeCommandLimit = 16383
	// fakeMaxLineBytes bounds one worker or master line; a longer line
	// closes the connection rather than growing memory without end.
	fakeMaxLineBytes = 1 << 20
	// fakeMaxLinesPerConnection bounds the lines one connection may send
	// (a prompt-mode session or a master connection); then it is closed.
	fakeMaxLinesPerConnection = 1 << 20
	// fakeMaxArgs is HAProxy's MAX_CLI_ARGS: words after it are ignored.
	fakeMaxArgs = 64
	// fakeMaxPayloadPattern is the longest custom payload terminator.
	fakeMaxPayloadPattern = 7
	// fakeBufferedGrace is how long a 2.6 or 3.x connection looks for lines
	// the client already sent, after the first: HAProxy handles what is in
	// its buffer, and a client that sent one write has it all there.
	fakeBufferedGrace = 5 * time.Millisecond
	// fakeSystemCACount is the count shown for @system-ca.
	fakeSystemCACount = 150
	fakeUptime        = "0d00h00m01s"
)

// fakeTooBig is HAProxy's refusal of a command over fakeCommandLimit. It
// ends with a single '\n', unlike every other response.
const fakeTooBig = "The command is too big for the buffer size. Please change tune.bufsize in the configuration to use a bigger command."

// fakeServersStateHeader is the column header of show servers state.
const fakeServersStateHeader = "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port"

// StartFakeHAProxy serves <dir>/haproxy-worker.sock and
// <dir>/haproxy-master.sock. version "" means "3.4.3-1deb11u1". The dialect
// (§8.2) follows the version's major.minor: below 3.0 answers as 2.6, 3.0
// to 3.3 as 3.0, 3.4 and later as 3.4. The caller owns dir; Close removes
// only the sockets.
func StartFakeHAProxy(dir string, version string) (*FakeHAProxy, error) {
	if version == "" {
		version = fakeDefaultVersion
	}
	// The version is read by CapsFor's rule (deployplan.md §2.4): it must
	// start with a major number.
	if _, ok := leadingNumber(strings.TrimPrefix(strings.TrimSpace(version), "v")); !ok {
		return nil, fmt.Errorf("fake haproxy: unreadable version %q", version)
	}
	caps := CapsFor(version, nil)
	f := &FakeHAProxy{
		dir:        dir,
		version:    version,
		dialect:    fakeDialectOf(caps),
		initState:  caps.ServerInitState,
		workerPath: filepath.Join(dir, "haproxy-worker.sock"),
		masterPath: filepath.Join(dir, "haproxy-master.sock"),
		conns:      make(map[net.Conn]bool),
	}
	// A unix socket path holds at most 107 bytes plus its NUL; saying so
	// beats the kernel's "invalid argument".
	for _, p := range []string{f.workerPath, f.masterPath} {
		if len(p) > 107 {
			return nil, fmt.Errorf("fake haproxy: socket path %q is longer than 107 bytes", p)
		}
	}
	f.model = FakeModel{
		Version:             version,
		MasterPID:           999,
		Pid:                 1000,
		StartTimeUnixMicros: 1_700_000_000_000_000,
		Backends:            map[string]*FakeBackend{},
		Maps:                map[string][]MapEntry{},
		Certs:               map[string]string{},
		CAFiles:             map[string]string{},
		CRLFiles:            map[string]string{},
		CRTLists:            map[string][]string{},
		Frontends:           map[string]uint64{"status": 0, "http-tcp": 0},
		BlockedServers:      map[string]bool{},
		ReloadDelay:         50 * time.Millisecond,
	}
	var err error
	if f.workerLn, err = fakeListen(f.workerPath); err != nil {
		return nil, err
	}
	if f.masterLn, err = fakeListen(f.masterPath); err != nil {
		f.workerLn.Close()
		return nil, err
	}
	f.wg.Add(2)
	go f.accept(f.workerLn, false)
	go f.accept(f.masterLn, true)
	return f, nil
}

// fakeListen listens on a unix socket, replacing a stale socket file left
// by an earlier run (as HAProxy does) but nothing else.
func fakeListen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fake haproxy: %w", err)
	}
	return ln, nil
}

// fakeDialectOf picks the dialect from the capabilities the version
// gives: no dynamic servers is 2.6, dynamic backends is 3.4.
func fakeDialectOf(caps Caps) fakeDialect {
	switch {
	case !caps.DynamicServers:
		return fakeDialect26
	case !caps.DynamicBackends:
		return fakeDialect30
	default:
		return fakeDialect34
	}
}

// Close stops both listeners, closes every open connection, cancels a
// pending 2.6 reload effect, waits for the connection goroutines (a
// blocking Reject or CutReply hook delays it) and removes the sockets. It
// is idempotent.
func (f *FakeHAProxy) Close() error {
	f.connMu.Lock()
	if f.closed {
		f.connMu.Unlock()
		return nil
	}
	f.closed = true
	f.workerLn.Close()
	f.masterLn.Close()
	for c := range f.conns {
		c.Close()
	}
	for _, t := range f.timers {
		t.Stop()
	}
	f.connMu.Unlock()
	f.wg.Wait()
	for _, p := range []string{f.workerPath, f.masterPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("fake haproxy: %w", err)
		}
	}
	return nil
}

// StopMaster closes and removes the master socket, as when the master
// process is gone: show proc and reload then fail at transport. The worker
// keeps serving.
func (f *FakeHAProxy) StopMaster() {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.masterDown {
		return
	}
	f.masterDown = true
	f.masterLn.Close()
	for c, master := range f.conns {
		if master {
			c.Close()
		}
	}
	os.Remove(f.masterPath)
}

// WorkerSocket is the path of the worker's stats socket.
func (f *FakeHAProxy) WorkerSocket() string { return f.workerPath }

// MasterSocket is the path of the master CLI socket.
func (f *FakeHAProxy) MasterSocket() string { return f.masterPath }

// Version is the version the fake answers with.
func (f *FakeHAProxy) Version() string { return f.version }

// Worker is the current worker's identity, as show info reports it.
func (f *FakeHAProxy) Worker() HAProxyInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return HAProxyInfo{
		Version:                   f.version,
		FullVersion:               f.version,
		WorkerPID:                 f.model.Pid,
		WorkerStartTimeUnixMicros: f.model.StartTimeUnixMicros,
	}
}

// With runs fn under the model lock: to seed state, inspect it, or set
// fault hooks. fn must not call the fake's other methods.
func (f *FakeHAProxy) With(fn func(m *FakeModel)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.model)
}

// Sent returns a copy of the worker commands received, in order: every
// command except the empty one, prompt, quit, set severity-output and
// experimental-mode; a payload command appears without its "<<" word.
func (f *FakeHAProxy) Sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneSlice(f.model.Commands)
}

// Maps returns the map paths the worker holds, sorted.
func (f *FakeHAProxy) Maps() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fakeSortedKeys(f.model.Maps)
}

// MapEntries returns a copy of a map's current entries, nil if the map is
// unknown.
func (f *FakeHAProxy) MapEntries(path string) []MapEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	entries, ok := f.model.Maps[path]
	if !ok {
		return nil
	}
	return append([]MapEntry{}, entries...)
}

// Backends returns the backend names, sorted.
func (f *FakeHAProxy) Backends() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fakeSortedKeys(f.model.Backends)
}

// HasBackend reports whether the worker has the backend.
func (f *FakeHAProxy) HasBackend(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.model.Backends[name] != nil
}

// ServerNames returns a backend's server names in backend order, nil if no
// such backend.
func (f *FakeHAProxy) ServerNames(backend string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	be := f.model.Backends[backend]
	if be == nil {
		return nil
	}
	names := make([]string, 0, len(be.Servers))
	for _, s := range be.Servers {
		if s != nil {
			names = append(names, s.Name)
		}
	}
	return names
}

// Server returns a copy of one server.
func (f *FakeHAProxy) Server(backend, name string) (FakeServer, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.model.server(backend, name)
	if s == nil {
		return FakeServer{}, false
	}
	c := *s
	c.Keywords = cloneSlice(s.Keywords)
	return c, true
}

// Cert returns a certificate's committed PEM.
func (f *FakeHAProxy) Cert(path string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pem, ok := f.model.Certs[path]
	return pem, ok
}

// CAFile returns a CA file's committed PEM.
func (f *FakeHAProxy) CAFile(path string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pem, ok := f.model.CAFiles[path]
	return pem, ok
}

// CRTList returns a copy of a crt-list's entry lines, nil if unknown.
func (f *FakeHAProxy) CRTList(path string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneSlice(f.model.CRTLists[path])
}

func fakeSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---------------------------------------------------------------------------
// Connections.

func (f *FakeHAProxy) accept(ln net.Listener, master bool) {
	defer f.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		f.connMu.Lock()
		if f.closed || (master && f.masterDown) {
			f.connMu.Unlock()
			conn.Close()
			return
		}
		f.conns[conn] = master
		f.wg.Add(1)
		f.connMu.Unlock()
		go func() {
			defer f.wg.Done()
			defer f.forget(conn)
			if master {
				f.serveMaster(conn)
			} else {
				f.serveWorker(conn)
			}
		}()
	}
}

func (f *FakeHAProxy) forget(conn net.Conn) {
	conn.Close()
	f.connMu.Lock()
	delete(f.conns, conn)
	f.connMu.Unlock()
}

// fakeReadLine reads one line without its '\n'. A last line without '\n'
// before EOF is still a line; a line over fakeMaxLineBytes is an error.
func fakeReadLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(b)+len(chunk) > fakeMaxLineBytes {
			return "", errors.New("line too long")
		}
		b = append(b, chunk...)
		switch {
		case err == nil:
			return string(b[:len(b)-1]), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case len(b) > 0 && errors.Is(err, io.EOF):
			return string(b), nil
		default:
			return "", err
		}
	}
}

// fakeSentAlready reports whether the client already sent more bytes: the
// lines HAProxy would find in its buffer after the first.
func fakeSentAlready(conn net.Conn, r *bufio.Reader) bool {
	if r.Buffered() > 0 {
		return true
	}
	conn.SetReadDeadline(time.Now().Add(fakeBufferedGrace))
	_, err := r.Peek(1)
	conn.SetReadDeadline(time.Time{})
	return err == nil
}

// fakeSession is the per-connection CLI state of a worker connection.
type fakeSession struct {
	severity  string // "", "number" or "string"
	prompt    bool
	expert    bool // experimental-mode on
	close     bool // quit, an oversize command or a cut payload ends the connection
	extraLine bool // 3.x: a "<<" pattern too long to be a terminator lets one more line run
}

// serveWorker is §8.3: snapshot the worker identity, then read lines,
// handle each, write its responses.
func (f *FakeHAProxy) serveWorker(conn net.Conn) {
	f.mu.Lock()
	pid, start := f.model.Pid, f.model.StartTimeUnixMicros
	f.mu.Unlock()
	// The 64 KiB buffer is allocated once the client sends its first byte:
	// a connection that closes without a command (a liveness probe, once a
	// second per agent) must not cost it, or an in-process fleet of fakes
	// spends its time collecting garbage.
	var first [1]byte
	n, err := conn.Read(first[:])
	if n == 0 || err != nil && !errors.Is(err, io.EOF) {
		return
	}
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(first[:n]), conn), 64<<10)
	s := &fakeSession{}
	for n := 0; n < fakeMaxLinesPerConnection; n++ {
		if n > 0 && !s.prompt {
			// Non-interactive: 2.6 runs every line already received; 3.x
			// answers one line and discards the rest, except one further
			// line after a "<<" pattern that was not a terminator.
			more := f.dialect == fakeDialect26 || (n == 1 && s.extraLine)
			if !more || !fakeSentAlready(conn, r) {
				return
			}
		}
		line, err := fakeReadLine(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		gone := f.model.Pid != pid || f.model.StartTimeUnixMicros != start
		f.mu.Unlock()
		if gone {
			return // the worker this connection reached has exited
		}
		var out bytes.Buffer
		f.handleLine(&out, r, s, line)
		if s.prompt && !s.close {
			out.WriteString("> ")
		}
		f.mu.Lock()
		cutReply := f.model.CutReply
		f.mu.Unlock()
		reply := out.Bytes()
		if cutReply != nil {
			if keep, cut := cutReply(line); cut {
				reply = reply[:max(0, min(keep, len(reply)))]
				s.close = true
			}
		}
		if _, err := conn.Write(reply); err != nil || s.close {
			return
		}
	}
}

// handleLine runs one line's commands in order (§8.3 steps 4–6), writing
// each response to out. A payload command reads its payload from r.
func (f *FakeHAProxy) handleLine(out *bytes.Buffer, r *bufio.Reader, s *fakeSession, line string) {
	cmds := fakeSplitCommands(line)
	for i, text := range cmds {
		size := len(text) + 1 // through the ';' or '\n' that ends it
		var payload *string
		if i == len(cmds)-1 {
			cmdText, term, isPayload, tooLong := f.payloadIntroducer(text)
			if tooLong {
				s.extraLine = true
			}
			if isPayload {
				text = cmdText
				body, n, complete := fakeReadPayload(r, term, fakeCommandLimit-size)
				size += n
				if !complete && size <= fakeCommandLimit {
					s.close = true // EOF before the terminator: the command never runs
					return
				}
				payload = &body
			}
		}
		if size > fakeCommandLimit {
			// 3.x refuses with one line and a single '\n'; 2.6 drops the
			// command and the rest of the line silently. Both close.
			if f.dialect != fakeDialect26 {
				out.WriteString(s.tag(3) + fakeTooBig + "\n")
			}
			s.close = true
			return
		}
		f.runCommand(out, s, text, payload)
		if s.close {
			return
		}
	}
}

// payloadIntroducer looks at the last word of a line's last command
// (§8.3 step 4). "<<" alone introduces a payload ended by an empty line;
// on 3.x, "<<" and 1 to 7 more characters introduce one ended by that
// exact line. A longer pattern is an ordinary word (tooLong). On 2.6 only
// a command ending in "<<" takes a payload.
func (f *FakeHAProxy) payloadIntroducer(text string) (cmd, term string, isPayload, tooLong bool) {
	if f.dialect == fakeDialect26 {
		if strings.HasSuffix(text, "<<") {
			return text[:len(text)-2], "", true, false
		}
		return text, "", false, false
	}
	cut := strings.LastIndexAny(text, " \t") + 1
	word := text[cut:]
	if !strings.HasPrefix(word, "<<") {
		return text, "", false, false
	}
	if len(word)-2 > fakeMaxPayloadPattern {
		return text, "", false, true
	}
	return text[:cut], word[2:], true, false
}

// fakeReadPayload reads payload lines up to the line equal to term. It
// stops early, incomplete, once more than room bytes arrived (the command
// is too big) or at EOF. n counts every byte read, terminator line
// included.
func fakeReadPayload(r *bufio.Reader, term string, room int) (body string, n int, complete bool) {
	var b strings.Builder
	for n <= room {
		chunk, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			n += len(chunk)
			b.Write(chunk)
			continue
		}
		if err != nil {
			return b.String(), n + len(chunk), false
		}
		n += len(chunk)
		if string(chunk[:len(chunk)-1]) == term && n <= room {
			return b.String(), n, true
		}
		b.Write(chunk)
	}
	return b.String(), n, false
}

// fakeSplitCommands splits a line on ';' as HAProxy does: a backslash
// escapes the next byte, so "\;" does not split.
func fakeSplitCommands(line string) []string {
	var cmds []string
	start := 0
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case '\\':
			i++
		case ';':
			cmds = append(cmds, line[start:i])
			start = i + 1
		}
	}
	return append(cmds, line[start:])
}

// fakeFields splits a command into words on spaces and tabs, removing
// backslash escapes, at most fakeMaxArgs words.
func fakeFields(cmd string) []string {
	var words []string
	var w strings.Builder
	in := false
	for i := 0; i < len(cmd) && len(words) < fakeMaxArgs; i++ {
		c := cmd[i]
		switch {
		case c == ' ' || c == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
			continue
		case c == '\\' && i+1 < len(cmd):
			i++
			c = cmd[i]
		}
		w.WriteByte(c)
		in = true
	}
	if in && len(words) < fakeMaxArgs {
		words = append(words, w.String())
	}
	return words
}

// ---------------------------------------------------------------------------
// Responses (§8.4).

// fakeOut is one command's response: silent (empty text), a message at a
// severity level, or an untagged dump.
type fakeOut struct {
	level int // 0..7; fakeDump for a listing
	text  string
	short bool // ends with one '\n' instead of a blank line (2.6's server commands)
}

const fakeDump = -1

func fakeSilent() fakeOut             { return fakeOut{} }
func fakeMsg(l int, t string) fakeOut { return fakeOut{level: l, text: t} }
func fakeErr(t string) fakeOut        { return fakeOut{level: 3, text: t} }
func fakeList(t string) fakeOut       { return fakeOut{level: fakeDump, text: t} }

var fakeLevelNames = [8]string{"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"}

// tag is the severity prefix of a message under the session's
// severity-output setting.
func (s *fakeSession) tag(level int) string {
	switch s.severity {
	case "number":
		return "[" + strconv.Itoa(level) + "]: "
	case "string":
		return "[" + fakeLevelNames[level] + "]: "
	}
	return ""
}

func (s *fakeSession) render(out *bytes.Buffer, o fakeOut) {
	switch {
	case o.text == "":
		out.WriteString("\n")
	case o.level == fakeDump:
		out.WriteString(o.text + "\n\n")
	case o.short:
		out.WriteString(s.tag(o.level) + o.text + "\n")
	default:
		out.WriteString(s.tag(o.level) + o.text + "\n\n")
	}
}

// ---------------------------------------------------------------------------
// Worker commands (§8.5).

// runCommand handles one command: the session commands silently, every
// other one recorded, offered to Reject (outside the lock), then
// dispatched under the lock.
func (f *FakeHAProxy) runCommand(out *bytes.Buffer, s *fakeSession, text string, payload *string) {
	args := fakeFields(text)
	if len(args) == 0 {
		if f.dialect == fakeDialect26 {
			// 2.6 answers an empty command, even an empty line, with its
			// whole help; 3.x is silent.
			s.render(out, fakeMsg(6, "Unknown command. Please enter one of the following commands only:\n"+fakeHelpTail))
			return
		}
		s.render(out, fakeSilent())
		return
	}
	switch {
	case args[0] == "quit":
		s.close = true
		return
	case args[0] == "prompt":
		s.prompt = !s.prompt
		s.render(out, fakeSilent())
		return
	case len(args) == 3 && args[0] == "set" && args[1] == "severity-output" &&
		(args[2] == "number" || args[2] == "none" || args[2] == "string"):
		s.severity = args[2]
		if s.severity == "none" {
			s.severity = ""
		}
		s.render(out, fakeSilent())
		return
	case len(args) == 2 && args[0] == "experimental-mode" && (args[1] == "on" || args[1] == "off"):
		s.expert = args[1] == "on"
		s.render(out, fakeSilent())
		return
	}
	f.mu.Lock()
	f.model.Commands = append(f.model.Commands, strings.TrimSpace(text))
	reject := f.model.Reject
	f.mu.Unlock()
	if reject != nil {
		if msg, refused := reject(strings.TrimSpace(text)); refused {
			s.render(out, fakeErr(msg))
			return
		}
	}
	f.mu.Lock()
	o := f.dispatch(s, args, payload)
	f.mu.Unlock()
	s.render(out, o)
}

// fakeCommand is one verb of the worker CLI.
type fakeCommand struct {
	words   []string
	from    fakeDialect // the first dialect that has it
	expert  bool        // needs experimental-mode on
	handler func(f *FakeHAProxy, args []string, payload *string) fakeOut
}

// fakeCommands is the worker's command table; the longest match wins
// because longer verbs come first where two share a prefix.
var fakeCommands = []fakeCommand{
	{words: []string{"show", "info"}, handler: (*FakeHAProxy).showInfo},
	{words: []string{"show", "stat"}, handler: (*FakeHAProxy).showStat},
	{words: []string{"show", "map"}, handler: (*FakeHAProxy).showMap},
	{words: []string{"add", "map"}, handler: (*FakeHAProxy).addMap},
	{words: []string{"set", "map"}, handler: (*FakeHAProxy).setMap},
	{words: []string{"del", "map"}, handler: (*FakeHAProxy).delMap},
	{words: []string{"prepare", "map"}, handler: (*FakeHAProxy).prepareMap},
	{words: []string{"commit", "map"}, handler: (*FakeHAProxy).commitMap},
	{words: []string{"clear", "map"}, handler: (*FakeHAProxy).clearMap},
	{words: []string{"show", "ssl", "cert"}, handler: (*FakeHAProxy).showCerts},
	{words: []string{"new", "ssl", "cert"}, handler: fakeStoreCommand((*FakeHAProxy).certStore, fakeStore.create)},
	{words: []string{"set", "ssl", "cert"}, handler: fakeStoreCommand((*FakeHAProxy).certStore, fakeStore.set)},
	{words: []string{"commit", "ssl", "cert"}, handler: fakeStoreCommand((*FakeHAProxy).certStore, fakeStore.commit)},
	{words: []string{"abort", "ssl", "cert"}, handler: fakeStoreCommand((*FakeHAProxy).certStore, fakeStore.abort)},
	{words: []string{"show", "ssl", "ca-file"}, handler: (*FakeHAProxy).showCAFiles},
	{words: []string{"new", "ssl", "ca-file"}, handler: fakeStoreCommand((*FakeHAProxy).caStore, fakeStore.create)},
	{words: []string{"set", "ssl", "ca-file"}, handler: fakeStoreCommand((*FakeHAProxy).caStore, fakeStore.set)},
	{words: []string{"commit", "ssl", "ca-file"}, handler: fakeStoreCommand((*FakeHAProxy).caStore, fakeStore.commit)},
	{words: []string{"abort", "ssl", "ca-file"}, handler: fakeStoreCommand((*FakeHAProxy).caStore, fakeStore.abort)},
	{words: []string{"show", "ssl", "crl-file"}, handler: (*FakeHAProxy).showCRLFiles},
	{words: []string{"show", "ssl", "crt-list"}, handler: (*FakeHAProxy).showCRTList},
	{words: []string{"add", "ssl", "crt-list"}, handler: (*FakeHAProxy).addCRTList},
	{words: []string{"del", "ssl", "crt-list"}, handler: (*FakeHAProxy).delCRTList},
	{words: []string{"show", "servers", "state"}, handler: (*FakeHAProxy).showServersState},
	{words: []string{"add", "server"}, handler: (*FakeHAProxy).addServer},
	{words: []string{"enable", "server"}, handler: fakeServerCommand(fakeEnableServer)},
	{words: []string{"disable", "server"}, handler: fakeServerCommand(fakeDisableServer)},
	{words: []string{"enable", "health"}, handler: fakeServerCommand(fakeEnableHealth)},
	{words: []string{"disable", "health"}, handler: fakeServerCommand(fakeDisableHealth)},
	{words: []string{"set", "server"}, handler: fakeServerCommand(fakeSetServer)},
	{words: []string{"shutdown", "sessions", "server"}, handler: fakeServerCommand(fakeShutdownSessions)},
	{words: []string{"del", "server"}, handler: (*FakeHAProxy).delServer},
	{words: []string{"wait"}, from: fakeDialect30, handler: (*FakeHAProxy).wait},
	{words: []string{"add", "backend"}, from: fakeDialect34, expert: true, handler: (*FakeHAProxy).addBackend},
	{words: []string{"publish", "backend"}, from: fakeDialect34, expert: true, handler: fakeBackendCommand(fakePublishBackend)},
	{words: []string{"unpublish", "backend"}, from: fakeDialect34, handler: fakeBackendCommand(fakeUnpublishBackend)},
	{words: []string{"del", "backend"}, from: fakeDialect34, expert: true, handler: fakeBackendCommand(fakeDelBackend)},
}

// dispatch finds the command and runs it; the lock is held.
func (f *FakeHAProxy) dispatch(s *fakeSession, args []string, payload *string) fakeOut {
	f.model.repair()
	for _, c := range fakeCommands {
		if c.from > f.dialect || len(args) < len(c.words) || !fakeHasPrefix(args, c.words) {
			continue
		}
		if c.expert && !s.expert {
			return fakeErr("This command is restricted to experimental mode only.")
		}
		return c.handler(f, args[len(c.words):], payload)
	}
	return f.unknownCommand(args[0])
}

func fakeHasPrefix(args, words []string) bool {
	for i, w := range words {
		if args[i] != w {
			return false
		}
	}
	return true
}

// unknownCommand is HAProxy's answer to a verb it lacks: a first line per
// dialect, then help lines (their choice varies with the verb; tests
// compare the first line only).
func (f *FakeHAProxy) unknownCommand(verb string) fakeOut {
	return fakeMsg(6, f.unknownFirstLine(verb)+"\n"+fakeHelpTail)
}

// fakeHelpTail is the end of every help listing.
const fakeHelpTail = "  help [<command>]                        : list matching or all commands\n" +
	"  prompt [timed]                          : toggle interactive mode with prompt\n" +
	"  quit                                    : disconnect"

func (f *FakeHAProxy) unknownFirstLine(verb string) string {
	if f.dialect == fakeDialect26 {
		return "Unknown command, but maybe one of the following ones is a better match:"
	}
	return "Unknown command: '" + verb + "', but maybe one of the following ones is a better match:"
}

// --- identity and statistics

func (f *FakeHAProxy) showInfo(args []string, _ *string) fakeOut {
	m := &f.model
	start := strconv.FormatInt(m.StartTimeUnixMicros/1_000_000, 10)
	if len(args) > 0 && args[0] == "float" {
		// HAProxy prints floats with six decimals, then trims trailing
		// zeros and a bare decimal point.
		if frac := strings.TrimRight(fmt.Sprintf("%06d", m.StartTimeUnixMicros%1_000_000), "0"); frac != "" {
			start += "." + frac
		}
	}
	return fakeList(fmt.Sprintf("Name: HAProxy\nVersion: %s\nPid: %d\nUptime_sec: 1\nStart_time_sec: %s",
		f.version, m.Pid, start))
}

func (f *FakeHAProxy) showStat(_ []string, _ *string) fakeOut {
	var b strings.Builder
	b.WriteString("# pxname,svname,status,conn_tot,")
	for _, fe := range fakeSortedKeys(f.model.Frontends) {
		fmt.Fprintf(&b, "\n%s,FRONTEND,OPEN,%d,", fe, f.model.Frontends[fe])
	}
	return fakeList(b.String())
}

// --- maps

// fakeMapVersions is one map's version bookkeeping: the live entries are
// FakeModel.Maps[path] at version curr; prepared versions up to next hold
// their own entries until committed.
type fakeMapVersions struct {
	curr, next uint64
	pending    map[uint64][]MapEntry
}

const fakeUnknownMap = "Unknown map identifier. Please use #<id> or <file>."

func (m *FakeModel) versions(path string) *fakeMapVersions {
	if m.mapVersions == nil {
		m.mapVersions = map[string]*fakeMapVersions{}
	}
	v := m.mapVersions[path]
	if v == nil {
		v = &fakeMapVersions{pending: map[uint64][]MapEntry{}}
		m.mapVersions[path] = v
	}
	return v
}

// fakeParseVersion reads "@<n>".
func fakeParseVersion(arg string) (uint64, bool) {
	if !strings.HasPrefix(arg, "@") {
		return 0, false
	}
	v, err := strconv.ParseUint(arg[1:], 10, 64)
	return v, err == nil
}

func (f *FakeHAProxy) showMap(args []string, _ *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) == 0 {
		var b strings.Builder
		b.WriteString("# id (file) description")
		for i, p := range fakeSortedKeys(m.Maps) {
			v := m.versions(p)
			count := len(m.Maps[p])
			for _, e := range v.pending {
				count += len(e)
			}
			fmt.Fprintf(&b, "\n%d (%s) pattern loaded from file '%s' used by map at file '%s' line %d. curr_ver=%d next_ver=%d entry_cnt=%d",
				i, p, p, filepath.Join(f.dir, "haproxy.cfg"), i+1, v.curr, v.next, count)
		}
		return fakeList(b.String())
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	if v := m.versions(args[0]); versioned && ver != v.curr {
		entries = v.pending[ver] // a prepared version, or nothing
	}
	rows := make([]string, 0, len(entries))
	for i, e := range entries {
		rows = append(rows, fmt.Sprintf("0x7f%010x %s %s", 0x1f041280+0x80*i, e.Key, e.Value))
	}
	if len(rows) == 0 {
		return fakeSilent() // an empty map dumps nothing: a lone '\n'
	}
	return fakeList(strings.Join(rows, "\n"))
}

// addMap is "add map [@<ver>] <map> <key> <value>" and its payload form.
func (f *FakeHAProxy) addMap(args []string, payload *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) == 0 || (payload == nil && len(args) < 3) {
		return fakeErr("'add map' expects three parameters (map identifier, key and value) or one parameter (map identifier) and a payload")
	}
	path := args[0]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if !versioned {
		ver = v.curr
	}
	// Unsigned distances, as HAProxy compares them: a version below the
	// current one is "in the future" too.
	if ver-v.curr > v.next-v.curr {
		return fakeErr("Version number in the future, please use 'prepare map' before.")
	}
	add := func(e MapEntry) {
		if ver == v.curr {
			m.Maps[path] = append(m.Maps[path], e)
		} else {
			v.pending[ver] = append(v.pending[ver], e)
		}
	}
	if payload == nil {
		add(MapEntry{Key: args[1], Value: args[2]})
		return fakeSilent()
	}
	entries, missing, ok := fakeParseMapPayload(*payload)
	for _, e := range entries {
		add(e) // entries before a refusal stay, as in HAProxy
	}
	if !ok {
		return fakeErr("Missing value for key '" + missing + "'.")
	}
	return fakeSilent()
}

// fakeParseMapPayload reads a map payload as HAProxy does (§8.5): the
// final '\n' is dropped; a key runs to the first space or tab, newlines
// included; one separator and then any spaces and tabs are skipped; the
// value runs to the next '\n'. A key with nothing after it refuses the
// rest, keeping the entries already read.
func fakeParseMapPayload(payload string) (entries []MapEntry, missingKey string, ok bool) {
	p := strings.TrimSuffix(payload, "\n")
	for p != "" {
		k := strings.IndexAny(p, " \t")
		if k < 0 {
			return entries, p, false
		}
		key := p[:k]
		p = strings.TrimLeft(p[k+1:], " \t")
		value := p
		if nl := strings.IndexByte(p, '\n'); nl >= 0 {
			value, p = p[:nl], p[nl+1:]
		} else {
			p = ""
		}
		entries = append(entries, MapEntry{Key: key, Value: value})
	}
	return entries, "", true
}

func (f *FakeHAProxy) setMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 3 {
		return fakeErr("'set map' expects three parameters: map identifier, key and value.")
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	found := false
	for i := range entries {
		if entries[i].Key == args[1] {
			entries[i].Value = args[2]
			found = true
		}
	}
	if !found {
		return fakeErr("entry not found.")
	}
	return fakeSilent()
}

// delMap removes the first matching entry on 3.4 and every matching entry
// on 3.0 and 2.6.
func (f *FakeHAProxy) delMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 {
		return fakeErr("This command expects two parameters: map identifier and key.")
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	kept := make([]MapEntry, 0, len(entries))
	removed := 0
	for _, e := range entries {
		if e.Key == args[1] && (removed == 0 || f.dialect != fakeDialect34) {
			removed++
			continue
		}
		kept = append(kept, e)
	}
	if removed == 0 {
		return fakeErr("Key not found.")
	}
	m.Maps[args[0]] = kept
	return fakeSilent()
}

func (f *FakeHAProxy) prepareMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 1 {
		return fakeErr(fakeUnknownMap)
	}
	if _, ok := m.Maps[args[0]]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(args[0])
	v.next++
	v.pending[v.next] = nil
	return fakeMsg(6, fmt.Sprintf("New version created: %d", v.next))
}

// commitMap installs a prepared version: its entries replace the map and
// every older version is purged.
func (f *FakeHAProxy) commitMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 || !strings.HasPrefix(args[0], "@") {
		return fakeErr("Missing version number.")
	}
	ver, _ := fakeParseVersion(args[0])
	path := args[1]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if ver-v.curr > v.next-v.curr {
		return fakeErr("Version number out of range.")
	}
	if ver != v.curr {
		m.Maps[path] = append([]MapEntry{}, v.pending[ver]...)
		for old := range v.pending {
			if old <= ver {
				delete(v.pending, old)
			}
		}
		v.curr = ver
	}
	return fakeSilent()
}

// clearMap empties a version on 3.0 and 2.6; on 3.4 "clear map @<v>" is a
// silent no-op (so a later commit would still install the version).
func (f *FakeHAProxy) clearMap(args []string, _ *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) < 1 {
		return fakeErr(fakeUnknownMap)
	}
	path := args[0]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if !versioned {
		ver = v.curr
	}
	switch {
	case versioned && f.dialect == fakeDialect34:
	case ver == v.curr:
		m.Maps[path] = []MapEntry{}
	case ver-v.curr <= v.next-v.curr:
		v.pending[ver] = nil
	}
	return fakeSilent()
}

// --- certificates and CA files

// fakeTransaction is an open certificate or CA-file transaction: a worker
// holds at most one of each.
type fakeTransaction struct {
	path, content string
}

// fakeStore is what certificates and CA files share: the committed files,
// the open transaction and the words HAProxy uses for each.
type fakeStore struct {
	files         map[string]string
	tx            **fakeTransaction
	notReferenced string // "a certificate" or "a CA file"
	exists        string // refusal of new, %s = name
	newStore      string // success text of new, %s = name
	created       string // success text of set, %s = name
	updated       string
	validate      func(name, payload string) string // refusal or ""
	commitCheck   func(content string) string
	// joinOpenTx is 2.6's certificate behaviour: a set while another
	// certificate's transaction is open updates that transaction.
	joinOpenTx bool
}

func (f *FakeHAProxy) certStore() fakeStore {
	return fakeStore{
		files:         f.model.Certs,
		tx:            &f.model.certTx,
		notReferenced: "a certificate",
		exists:        "Certificate '%s' already exists!",
		newStore:      "New empty certificate store '%s'!",
		created:       "Transaction created for certificate %s!",
		updated:       "Transaction updated for certificate %s!",
		validate: func(name, payload string) string {
			switch {
			case strings.Contains(payload, "-----BEGIN CERTIFICATE-----"):
				return ""
			case f.dialect == fakeDialect26:
				return "unable to load certificate from file '" + name + "'.\nCan't load the payload"
			}
			return "unable to load certificate from file '" + name + "': no start line.\nCan't load the payload"
		},
		joinOpenTx: f.dialect == fakeDialect26,
		commitCheck: func(content string) string {
			if !strings.Contains(content, "PRIVATE KEY-----") {
				return "The transaction must contain at least a certificate and a private key!"
			}
			return ""
		},
	}
}

func (f *FakeHAProxy) caStore() fakeStore {
	return fakeStore{
		files:         f.model.CAFiles,
		tx:            &f.model.caTx,
		notReferenced: "a CA file",
		exists:        "CA file '%s' already exists!",
		newStore:      "New CA file created '%s'!",
		created:       "transaction created for CA %s!",
		updated:       "transaction updated for CA %s!",
		validate: func(_, payload string) string {
			if !strings.Contains(payload, "-----BEGIN CERTIFICATE-----") {
				return "Invalid payload"
			}
			return ""
		},
		commitCheck: func(string) string { return "" },
	}
}

// fakeStoreCommand adapts a store operation to the command table.
func fakeStoreCommand(store func(*FakeHAProxy) fakeStore, op func(fakeStore, string, *string) fakeOut) func(*FakeHAProxy, []string, *string) fakeOut {
	return func(f *FakeHAProxy, args []string, payload *string) fakeOut {
		return op(store(f), fakeFirstArg(args), payload)
	}
}

// create is new ssl cert / new ssl ca-file: an empty store, "" until a
// transaction is committed into it.
func (st fakeStore) create(name string, _ *string) fakeOut {
	if _, ok := st.files[name]; ok {
		return fakeErr(fmt.Sprintf(st.exists, name))
	}
	st.files[name] = ""
	return fakeMsg(5, fmt.Sprintf(st.newStore, name))
}

func (st fakeStore) set(name string, payload *string) fakeOut {
	if tx := *st.tx; tx != nil && tx.path != name && st.joinOpenTx {
		name = tx.path
	}
	if tx := *st.tx; tx != nil && tx.path != name {
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to set '" + name + "'\nCan't update " + name + "!")
	}
	if _, ok := st.files[name]; !ok {
		return fakeErr("Can't replace " + st.notReferenced + " which is not referenced by the configuration!\nCan't update " + name + "!")
	}
	body := ""
	if payload != nil {
		body = *payload
	}
	if msg := st.validate(name, body); msg != "" {
		return fakeErr(msg + "\nCan't update " + name + "!")
	}
	if *st.tx != nil {
		(*st.tx).content = body
		return fakeMsg(5, fmt.Sprintf(st.updated, name))
	}
	*st.tx = &fakeTransaction{path: name, content: body}
	return fakeMsg(5, fmt.Sprintf(st.created, name))
}

// commit prints no dots: real HAProxy prints one per certificate instance
// it rebuilt, which the fake does not model.
func (st fakeStore) commit(name string, _ *string) fakeOut {
	tx := *st.tx
	switch {
	case tx == nil:
		return fakeErr("No ongoing transaction! !\nCan't commit " + name + "!")
	case tx.path != name:
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to set '" + name + "'\nCan't commit " + name + "!")
	}
	if msg := st.commitCheck(tx.content); msg != "" {
		return fakeErr(msg + "\nCan't commit " + name + "!") // the transaction stays open
	}
	st.files[name] = tx.content
	*st.tx = nil
	return fakeList("Committing " + name + "\nSuccess!")
}

func (st fakeStore) abort(name string, _ *string) fakeOut {
	tx := *st.tx
	switch {
	case tx == nil:
		return fakeErr("No ongoing transaction!")
	case tx.path != name:
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to abort a transaction for '" + name + "'")
	}
	*st.tx = nil
	return fakeMsg(5, "Transaction aborted for certificate '"+name+"'!")
}

func fakeFirstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

func (f *FakeHAProxy) showCerts(args []string, _ *string) fakeOut {
	if len(args) > 0 {
		return f.unknownCommand("show") // the detail view is not modelled
	}
	var b strings.Builder
	if tx := f.model.certTx; tx != nil {
		b.WriteString("# transaction\n*" + tx.path + "\n")
	}
	b.WriteString("# filename")
	for _, name := range fakeSortedKeys(f.model.Certs) {
		b.WriteString("\n" + name)
	}
	return fakeList(b.String())
}

func fakeCertCount(pem string) int {
	return strings.Count(pem, "-----BEGIN CERTIFICATE-----")
}

func (f *FakeHAProxy) showCAFiles(args []string, _ *string) fakeOut {
	if len(args) > 0 {
		return f.unknownCommand("show")
	}
	var b strings.Builder
	if tx := f.model.caTx; tx != nil {
		fmt.Fprintf(&b, "# transaction\n*%s - %d certificate(s)\n", tx.path, fakeCertCount(tx.content))
	}
	b.WriteString("# filename")
	rows := map[string]int{"@system-ca": fakeSystemCACount}
	for name, pem := range f.model.CAFiles {
		rows[name] = fakeCertCount(pem)
	}
	for _, name := range fakeSortedKeys(rows) {
		fmt.Fprintf(&b, "\n%s - %d certificate(s)", name, rows[name])
	}
	return fakeList(b.String())
}

func (f *FakeHAProxy) showCRLFiles(_ []string, _ *string) fakeOut {
	var b strings.Builder
	b.WriteString("# filename")
	for _, name := range fakeSortedKeys(f.model.CRLFiles) {
		b.WriteString("\n" + name)
	}
	return fakeList(b.String())
}

// --- crt-lists

// crtListNumbers returns a list's line numbers, numbering seeded entries
// from 1 when the bookkeeping does not match the list (a test seeded or
// replaced it through With).
func (m *FakeModel) crtListNumbers(list string) []int {
	if m.crtListLines == nil {
		m.crtListLines = map[string][]int{}
		m.crtListLast = map[string]int{}
	}
	entries := m.CRTLists[list]
	if len(m.crtListLines[list]) != len(entries) {
		lines := make([]int, len(entries))
		for i := range lines {
			lines[i] = i + 1
		}
		m.crtListLines[list] = lines
		m.crtListLast[list] = len(entries)
	}
	return m.crtListLines[list]
}

// fakeCRTListEntry renders one crt-list line as HAProxy prints it: the
// certificate, the options in one bracket pair, the SNI filters, single
// spaces.
func fakeCRTListEntry(words []string) (cert, rest string) {
	if len(words) == 0 {
		return "", ""
	}
	cert = words[0]
	var parts []string
	i := 1
	if i < len(words) && strings.HasPrefix(words[i], "[") {
		var opts []string
		for ; i < len(words); i++ {
			w := words[i]
			done := strings.HasSuffix(w, "]")
			w = strings.TrimSuffix(strings.TrimPrefix(w, "["), "]")
			if w != "" {
				opts = append(opts, w)
			}
			if done {
				i++
				break
			}
		}
		if len(opts) > 0 {
			parts = append(parts, "["+strings.Join(opts, " ")+"]")
		}
	}
	parts = append(parts, words[i:]...)
	return cert, strings.Join(parts, " ")
}

func fakeEntryCert(entry string) string {
	cert, _, _ := strings.Cut(entry, " ")
	return cert
}

func (f *FakeHAProxy) showCRTList(args []string, _ *string) fakeOut {
	m := &f.model
	numbered := len(args) > 0 && args[0] == "-n"
	if numbered {
		args = args[1:]
		if len(args) == 0 {
			return fakeErr("'show ssl crt-list -n' expects a filename or a directory")
		}
	}
	if len(args) == 0 {
		return fakeList(strings.Join(fakeSortedKeys(m.CRTLists), "\n"))
	}
	list := args[0]
	entries, ok := m.CRTLists[list]
	if !ok {
		return fakeErr("didn't find the specified filename")
	}
	lines := m.crtListNumbers(list)
	var b strings.Builder
	b.WriteString("# " + list)
	for i, e := range entries {
		if !numbered {
			b.WriteString("\n" + e)
			continue
		}
		cert, rest, _ := strings.Cut(e, " ")
		fmt.Fprintf(&b, "\n%s:%d", cert, lines[i])
		if rest != "" {
			b.WriteString(" " + rest)
		}
	}
	return fakeList(b.String())
}

// addCRTList adds one entry. The payload form carries options and SNI
// filters; the line form keeps only the certificate, as HAProxy's does.
func (f *FakeHAProxy) addCRTList(args []string, payload *string) fakeOut {
	m := &f.model
	if len(args) == 0 {
		return fakeErr("'add ssl crt-list' expects a filename and a certificate name")
	}
	list := args[0]
	if _, ok := m.CRTLists[list]; !ok {
		return fakeErr("Can't edit the crt-list: crt-list '" + list + "' does not exist!")
	}
	var words []string
	if payload != nil {
		firstLine, _, _ := strings.Cut(*payload, "\n")
		words = fakeFields(firstLine)
	} else if len(args) > 1 {
		words = args[1:2]
	}
	cert, rest := fakeCRTListEntry(words)
	if cert == "" {
		return fakeErr("'add ssl crt-list' expects a filename and a certificate name")
	}
	pem, ok := m.Certs[cert]
	if !ok {
		return fakeErr("Can't edit the crt-list: certificate '" + cert + "' does not exist!")
	}
	if pem == "" {
		return fakeErr("Can't edit the crt-list: certificate '" + cert + "' is empty!")
	}
	lines := m.crtListNumbers(list)
	entry := cert
	if rest != "" {
		entry += " " + rest
	}
	m.crtListLast[list]++
	m.CRTLists[list] = append(m.CRTLists[list], entry)
	m.crtListLines[list] = append(lines, m.crtListLast[list])
	return fakeList("Inserting certificate '" + cert + "' in crt-list '" + list + "'.\nSuccess!")
}

// delCRTList deletes "<cert>" or "<cert>:<line>" from a list. The fake
// knows no bind lines, so unlike HAProxy it never refuses to delete a
// bind line's default certificate.
func (f *FakeHAProxy) delCRTList(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 {
		return fakeErr("'del ssl crt-list' expects a filename and a certificate name")
	}
	list, cert := args[0], args[1]
	line := 0
	if i := strings.LastIndexByte(cert, ':'); i >= 0 {
		if n, err := strconv.Atoi(cert[i+1:]); err == nil && n > 0 {
			cert, line = cert[:i], n
		}
	}
	entries, ok := m.CRTLists[list]
	if !ok {
		return fakeErr("Can't delete the entry: crt-list '" + list + "' does not exist!")
	}
	if _, ok := m.Certs[cert]; !ok {
		return fakeErr("Can't delete the entry: certificate '" + cert + "' does not exist!")
	}
	lines := m.crtListNumbers(list)
	var found []int
	for i, e := range entries {
		if fakeEntryCert(e) == cert && (line == 0 || lines[i] == line) {
			found = append(found, i)
		}
	}
	switch {
	case len(found) == 0:
		return fakeErr("Can't delete the entry: certificate '" + cert + "' can't be found in crt-list '" + list + "'!")
	case len(found) > 1:
		nums := make([]string, len(found))
		for j, i := range found {
			nums[j] = strconv.Itoa(lines[i])
		}
		return fakeErr("Can't delete the entry: found the certificate '" + cert + "' in several entries, please specify a line number preceded by colons (" + strings.Join(nums, ", ") + ")!")
	}
	i := found[0]
	m.CRTLists[list] = append(entries[:i:i], entries[i+1:]...)
	m.crtListLines[list] = append(lines[:i:i], lines[i+1:]...)
	return fakeMsg(5, "Entry '"+cert+"' deleted in crtlist '"+list+"'!")
}

// --- servers

// repair makes a model seeded through With safe to serve: nil
// collections become empty and nil backends or servers are dropped, so a
// careless seed gets HAProxy's refusals instead of a panic.
func (m *FakeModel) repair() {
	if m.Backends == nil {
		m.Backends = map[string]*FakeBackend{}
	}
	for name, be := range m.Backends {
		if be == nil {
			delete(m.Backends, name)
			continue
		}
		servers := be.Servers[:0]
		for _, s := range be.Servers {
			if s != nil {
				servers = append(servers, s)
			}
		}
		be.Servers = servers
	}
	for _, p := range []*map[string]string{&m.Certs, &m.CAFiles, &m.CRLFiles} {
		if *p == nil {
			*p = map[string]string{}
		}
	}
	if m.Maps == nil {
		m.Maps = map[string][]MapEntry{}
	}
	if m.CRTLists == nil {
		m.CRTLists = map[string][]string{}
	}
	if m.Frontends == nil {
		m.Frontends = map[string]uint64{}
	}
	if m.BlockedServers == nil {
		m.BlockedServers = map[string]bool{}
	}
}

func (m *FakeModel) server(backend, name string) *FakeServer {
	be := m.Backends[backend]
	if be == nil {
		return nil
	}
	for _, s := range be.Servers {
		if s != nil && s.Name == name {
			return s
		}
	}
	return nil
}

// lookupServer resolves "<backend>/<server>" with HAProxy's refusals.
func (f *FakeHAProxy) lookupServer(ref string) (*FakeBackend, *FakeServer, fakeOut) {
	bname, sname, ok := strings.Cut(ref, "/")
	if !ok {
		return nil, nil, fakeErr("Require 'backend/server'.")
	}
	be := f.model.Backends[bname]
	if be == nil {
		return nil, nil, fakeErr("No such backend.")
	}
	s := f.model.server(bname, sname)
	if s == nil {
		return be, nil, fakeErr("No such server.")
	}
	return be, s, fakeOut{}
}

// fakeServerOp is a command on one "<backend>/<server>": ref is the
// reference as given, args the words after it.
type fakeServerOp func(f *FakeHAProxy, ref string, be *FakeBackend, s *FakeServer, args []string) fakeOut

// fakeServerCommand resolves the reference with HAProxy's refusals, then
// runs op.
func fakeServerCommand(op fakeServerOp) func(*FakeHAProxy, []string, *string) fakeOut {
	return func(f *FakeHAProxy, args []string, _ *string) fakeOut {
		ref := fakeFirstArg(args)
		be, s, refused := f.lookupServer(ref)
		if s == nil {
			return refused
		}
		return op(f, ref, be, s, args[1:])
	}
}

func (f *FakeHAProxy) showServersState(args []string, _ *string) fakeOut {
	m := &f.model
	names := fakeSortedKeys(m.Backends)
	if len(args) > 0 {
		if m.Backends[args[0]] == nil {
			return fakeErr("Can't find backend.")
		}
		names = []string{args[0]}
	}
	var b strings.Builder
	b.WriteString("1\n" + fakeServersStateHeader)
	for _, name := range names {
		beID := 1 + sort.SearchStrings(fakeSortedKeys(m.Backends), name)
		for i, s := range m.Backends[name].Servers {
			addr, fqdn := fakeServerAddr(s.Address)
			opState, adminState := 0, 1
			if s.Enabled {
				opState, adminState = 2, 0
				if s.State == "drain" {
					adminState = 8
				}
			}
			fmt.Fprintf(&b, "\n%d %s %d %s %s %d %d %d %d 0 1 0 0 0 0 0 0 %s %d - 0 0 - - 0",
				beID, name, i+1, s.Name, addr, opState, adminState, s.Weight, s.Weight, fqdn, s.Port)
		}
	}
	return fakeList(b.String())
}

// fakeServerAddr is the srv_addr and srv_fqdn columns: an IP literal shows
// itself, a unix path "-", a host name "-" and itself as the FQDN.
func fakeServerAddr(address string) (addr, fqdn string) {
	switch {
	case net.ParseIP(address) != nil:
		return address, "-"
	case strings.HasPrefix(address, "/") || strings.Contains(address, "@"):
		return "-", "-"
	default:
		return "-", address
	}
}

// fakeServerKeywords is the arity of every server keyword the fake
// accepts on add server; any other word is HAProxy's "unknown keyword".
var fakeServerKeywords = map[string]int{
	"agent-check": 0, "allow-0rtt": 0, "backup": 0, "check": 0, "check-send-proxy": 0,
	"check-ssl": 0, "check-via-socks4": 0, "disabled": 0, "enabled": 0, "force-sslv3": 0,
	"force-tlsv10": 0, "force-tlsv11": 0, "force-tlsv12": 0, "force-tlsv13": 0,
	"no-agent-check": 0, "no-backup": 0, "no-check": 0, "no-check-ssl": 0,
	"no-send-proxy": 0, "no-send-proxy-v2": 0, "no-ssl": 0, "no-sslv3": 0,
	"no-tls-tickets": 0, "no-tlsv10": 0, "no-tlsv11": 0, "no-tlsv12": 0, "no-tlsv13": 0,
	"no-verifyhost": 0, "non-stick": 0, "send-proxy": 0, "send-proxy-v2": 0,
	"send-proxy-v2-ssl": 0, "send-proxy-v2-ssl-cn": 0, "ssl": 0, "ssl-reuse": 0,
	"stick": 0, "tfo": 0, "tls-tickets": 0,
	"addr": 1, "agent-addr": 1, "agent-inter": 1, "agent-port": 1, "agent-send": 1,
	"alpn": 1, "ca-file": 1, "check-alpn": 1, "check-proto": 1, "check-sni": 1,
	"ciphers": 1, "ciphersuites": 1, "cookie": 1, "crl-file": 1, "crt": 1,
	"curves": 1, "downinter": 1, "error-limit": 1, "fall": 1, "fastinter": 1,
	"guid": 1, "hash-key": 1, "id": 1, "inter": 1, "log-proto": 1, "max-reuse": 1,
	"maxconn": 1, "maxqueue": 1, "minconn": 1, "namespace": 1, "npn": 1, "observe": 1,
	"on-error": 1, "on-marked-down": 1, "on-marked-up": 1, "pool-conn-name": 1,
	"pool-low-conn": 1, "pool-max-conn": 1, "pool-purge-delay": 1, "port": 1,
	"proto": 1, "proxy-v2-options": 1, "redir": 1, "resolve-net": 1,
	"resolve-opts": 1, "resolve-prefer": 1, "resolvers": 1, "rise": 1, "shard": 1,
	"sigalgs": 1, "slowstart": 1, "sni": 1, "socks4": 1, "source": 1,
	"ssl-max-ver": 1, "ssl-min-ver": 1, "tcp-ut": 1, "track": 1, "verify": 1,
	"verifyhost": 1, "weight": 1, "ws": 1,
	"init-state": 1, // 3.1 and later only
}

// fakeVerifyRefusal is HAProxy's refusal of an ssl server with the default
// "verify required" and no CA file.
const fakeVerifyRefusal = "verify is enabled by default but no CA file specified. If you're running on a LAN where you're certain to trust the server's certificate, please set an explicit 'verify none' statement on the 'server' line, or use 'ssl-server-verify none' in the global section to disable server-side verifications by default."

// addServer is "add server <ref> <addr>[:<port>] [<kw>...]". The server
// starts in maintenance (disabled), with its health checks off, as a
// dynamic server does. As in HAProxy, "ca-file" and (with "ssl") "crt"
// take their file from the worker's store only: a file never loaded, or a
// store created by new ssl cert / new ssl ca-file and never committed, is
// refused; and an ssl server verifying by default needs a CA file.
func (f *FakeHAProxy) addServer(args []string, _ *string) fakeOut {
	m := &f.model
	ref := fakeFirstArg(args)
	bname, sname, ok := strings.Cut(ref, "/")
	if !ok {
		return f.short(fakeErr("Require 'backend/server'."))
	}
	be := m.Backends[bname]
	if be == nil {
		return f.short(fakeErr("No such backend."))
	}
	if len(args) < 2 {
		return fakeErr("'server' expects <name> and <addr>[:<port>] as arguments.")
	}
	address, port, msg := fakeParseServerAddress(args[1])
	if msg != "" {
		return fakeErr(msg)
	}
	s := &FakeServer{Name: sname, Address: address, Port: port, Weight: 1, State: "maint",
		Keywords: cloneSlice(args[2:])}
	ssl, verifyNone, caFile, crt := false, false, "", ""
	for i := 2; i < len(args); i++ {
		kw := args[i]
		arity, known := fakeServerKeywords[kw]
		if !known || (kw == "init-state" && !f.initState) {
			return fakeErr("unknown keyword '" + kw + "'.")
		}
		if i+arity >= len(args) && arity > 0 {
			return fakeErr("'" + kw + "' expects an argument.")
		}
		switch kw {
		case "ssl", "no-ssl":
			ssl = kw == "ssl"
		case "verify":
			verifyNone = args[i+1] == "none"
		case "crt":
			crt = args[i+1]
		case "ca-file":
			if caFile = args[i+1]; m.CAFiles[caFile] == "" {
				return fakeErr("'ca-file' : unable to load " + caFile + ".")
			}
		case "check":
			s.Check = true
		case "weight":
			w, err := strconv.Atoi(args[i+1])
			if err != nil || w < 0 || w > 256 {
				return fakeErr("weight of server " + sname + " is not within 0 and 256 (" + args[i+1] + ")..")
			}
			s.Weight = w
		}
		i += arity
	}
	var initErrors []string // HAProxy reports every failure of the server's TLS setup
	if ssl && crt != "" && m.Certs[crt] == "" {
		initErrors = append(initErrors, "unable to stat SSL certificate '"+crt+"'.")
	}
	if ssl && !verifyNone && caFile == "" {
		initErrors = append(initErrors, fakeVerifyRefusal)
	}
	if len(initErrors) > 0 {
		return fakeErr(strings.Join(initErrors, "\n"))
	}
	if m.server(bname, sname) != nil {
		return fakeErr("Already exists a server with the same name in backend.")
	}
	be.Servers = append(be.Servers, s)
	return fakeMsg(6, "New server registered.")
}

// fakeParseServerAddress splits "<addr>[:<port>]". A unix path (or an
// address family prefix such as unix@) has no port.
func fakeParseServerAddress(arg string) (addr string, port int, msg string) {
	if strings.HasPrefix(arg, "/") || strings.Contains(arg, "@") {
		return arg, 0, ""
	}
	host, p := arg, ""
	if i := strings.LastIndexByte(arg, ':'); i >= 0 && strings.Count(arg, ":") == 1 {
		host, p = arg[:i], arg[i+1:]
	} else if strings.HasPrefix(arg, "[") {
		if h, pp, err := net.SplitHostPort(arg); err == nil {
			host, p = h, pp
		}
	}
	if p == "" {
		return host, 0, ""
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return "", 0, fmt.Sprintf("invalid character '%c' in port number '%s' in '%s'", p[i], p, arg)
		}
	}
	n, _ := strconv.Atoi(p)
	return host, n & 0xffff, ""
}

func fakeEnableServer(_ *FakeHAProxy, _ string, _ *FakeBackend, s *FakeServer, _ []string) fakeOut {
	s.Enabled, s.State = true, "ready"
	return fakeSilent()
}

func fakeDisableServer(_ *FakeHAProxy, _ string, _ *FakeBackend, s *FakeServer, _ []string) fakeOut {
	s.Enabled, s.State = false, "maint"
	return fakeSilent()
}

func fakeEnableHealth(_ *FakeHAProxy, _ string, _ *FakeBackend, s *FakeServer, _ []string) fakeOut {
	if !s.Check {
		return fakeErr("Health check was not configured on this server, cannot enable.")
	}
	s.Health = true
	return fakeSilent()
}

func fakeDisableHealth(_ *FakeHAProxy, _ string, _ *FakeBackend, s *FakeServer, _ []string) fakeOut {
	s.Health = false
	return fakeSilent()
}

const fakeSetServerUsage = "usage: set server <backend>/<server> addr | agent | agent-addr | agent-port | agent-send | check-addr | check-port | fqdn | health | ssl | state | weight"

// setServer is "set server <ref> addr|weight|state ...". The addr answers
// are at WARNING level, success and refusal alike; the words decide.
func fakeSetServer(f *FakeHAProxy, _ string, _ *FakeBackend, s *FakeServer, args []string) fakeOut {
	if len(args) < 1 {
		return fakeErr(fakeSetServerUsage)
	}
	switch args[0] {
	case "addr":
		if f.dialect == fakeDialect26 {
			return fakeSetServerAddr26(s, args[1:])
		}
		return fakeSetServerAddr(s, args[1:])
	case "weight":
		if len(args) < 2 {
			return fakeErr("Require <weight> or <weight%>.")
		}
		w, err := strconv.Atoi(strings.TrimSuffix(args[1], "%"))
		switch {
		case err != nil || w < 0:
			return fakeErr("Empty weight string empty or preceded by garbage")
		case strings.HasSuffix(args[1], "%"):
			w = s.Weight * w / 100 // relative to the current weight, a simplification
		case w > 256:
			return fakeErr("Absolute weight can only be between 0 and 256 inclusive.")
		}
		s.Weight = w
		return fakeSilent()
	case "state":
		if len(args) < 2 {
			return fakeErr("'set server <srv> state' expects 'ready', 'drain' and 'maint'.")
		}
		switch args[1] {
		case "ready", "drain":
			s.Enabled, s.State = true, args[1]
		case "maint":
			s.Enabled, s.State = false, "maint"
		default:
			return fakeErr("'set server <srv> state' expects 'ready', 'drain' and 'maint'.")
		}
		return fakeSilent()
	}
	return fakeErr(fakeSetServerUsage)
}

func fakeSetServerAddr(s *FakeServer, args []string) fakeOut {
	if len(args) == 0 {
		return fakeErr("set server <b>/<s> addr requires an address and optionally a port.")
	}
	if net.ParseIP(args[0]) == nil {
		return fakeMsg(4, "Invalid addr '"+args[0]+"'")
	}
	port := s.Port
	if len(args) >= 3 && args[1] == "port" {
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return fakeMsg(4, "problem converting port '"+args[2]+"' to an int")
		}
		port = n & 0xffff // HAProxy wraps, it does not refuse
	}
	var changes []string
	if args[0] != s.Address {
		changes = append(changes, "IP changed from '"+s.Address+"' to '"+args[0]+"'")
	}
	if port != s.Port {
		changes = append(changes, fmt.Sprintf("port changed from '%d' to '%d'", s.Port, port))
	}
	if len(changes) == 0 {
		return fakeMsg(4, "nothing changed")
	}
	s.Address, s.Port = args[0], port
	return fakeMsg(4, strings.Join(changes, ", ")+" by 'stats socket command'")
}

// fakeSetServerAddr26 is 2.6's wording: every part is reported, "no need to
// change" included, and every answer ends with the updater; the IP change
// stands even when the port is refused.
func fakeSetServerAddr26(s *FakeServer, args []string) fakeOut {
	if len(args) == 0 {
		return fakeErr("set server <b>/<s> addr requires an address and optionally a port.")
	}
	const by = " by 'stats socket command'"
	if net.ParseIP(args[0]) == nil {
		return fakeMsg(4, "Invalid addr '"+args[0]+"'"+by)
	}
	var parts []string
	if args[0] != s.Address {
		parts = append(parts, "IP changed from '"+s.Address+"' to '"+args[0]+"'")
		s.Address = args[0]
	} else {
		parts = append(parts, "no need to change the addr")
	}
	if len(args) >= 3 && args[1] == "port" {
		n, err := strconv.Atoi(args[2])
		switch {
		case err != nil:
			parts = append(parts, "problem converting port '"+args[2]+"' to an int")
		case n&0xffff != s.Port:
			parts = append(parts, fmt.Sprintf("port changed from '%d' to '%d'", s.Port, n&0xffff))
			s.Port = n & 0xffff
		default:
			parts = append(parts, "no need to change the port")
		}
	}
	return fakeMsg(4, strings.Join(parts, ", ")+by)
}

func fakeShutdownSessions(f *FakeHAProxy, ref string, _ *FakeBackend, _ *FakeServer, _ []string) fakeOut {
	delete(f.model.BlockedServers, ref)
	return fakeSilent()
}

// short marks a response that 2.6 ends with a single '\n': its add
// server and del server messages lack their own newline. Such a reply
// counts as incomplete (runtime.md §2.3), which is what a 2.6 worker gives.
func (f *FakeHAProxy) short(o fakeOut) fakeOut {
	o.short = f.dialect == fakeDialect26
	return o
}

func (f *FakeHAProxy) delServer(args []string, payload *string) fakeOut {
	return f.short(fakeServerCommand(fakeDelServer)(f, args, payload))
}

func fakeDelServer(f *FakeHAProxy, ref string, be *FakeBackend, s *FakeServer, _ []string) fakeOut {
	if s.Enabled {
		return fakeErr("Only servers in maintenance mode can be deleted.")
	}
	if f.model.BlockedServers[ref] {
		return fakeErr("Server still has connections attached to it, cannot remove it.")
	}
	for i, x := range be.Servers {
		if x == s {
			be.Servers = append(be.Servers[:i:i], be.Servers[i+1:]...)
			break
		}
	}
	return fakeMsg(6, "Server deleted.")
}

// --- wait

// fakeWaitUsage is the 3.0 usage text of wait; 3.4 adds be-removable.
func (f *FakeHAProxy) waitUsage(level int) fakeOut {
	text := "Usage: wait {-h|<duration>} [condition [args...]]\n" +
		"  - '-h' displays this help\n" +
		"  - <duration> is the maximum wait time, optionally suffixed by the unit among\n" +
		"    'us', 'ms', 's', 'm', 'h', and 'd'. ; the default unit is milliseconds.\n" +
		"  - <condition> indicates what to wait for, no longer than the specified\n" +
		"    duration. Supported conditions are:\n" +
		"    - <none> : by default, just sleep for the specified duration.\n" +
		"    - srv-removable <px>/<sv> : wait for this server to become removable."
	if f.dialect >= fakeDialect34 {
		text += "\n    - be-removable <px> : wait for this backend to become removable."
	}
	return fakeMsg(level, text)
}

// wait answers at once: the fake models whether the condition holds, not
// the time it takes. A blocked server or a busy backend "expires".
func (f *FakeHAProxy) wait(args []string, _ *string) fakeOut {
	if len(args) == 0 {
		return fakeErr("Expects a duration in milliseconds.")
	}
	if args[0] == "-h" {
		return f.waitUsage(6)
	}
	if !fakeValidDuration(args[0]) {
		return fakeErr("Invalid duration.")
	}
	if len(args) == 1 {
		return fakeMsg(6, "Done.")
	}
	switch {
	case args[1] == "srv-removable":
		ref := fakeFirstArg(args[2:])
		bname, sname, ok := strings.Cut(ref, "/")
		if !ok {
			return fakeErr("Require 'backend/server'.")
		}
		s := f.model.server(bname, sname)
		switch {
		case s == nil || s.Enabled:
			return fakeErr("Failed.")
		case f.model.BlockedServers[ref]:
			return fakeErr("Wait delay expired.")
		}
		return fakeMsg(6, "Done.")
	case args[1] == "be-removable" && f.dialect >= fakeDialect34:
		be := f.model.Backends[fakeFirstArg(args[2:])]
		switch {
		case be == nil:
			return fakeErr("Failed. No such backend.")
		case be.Published || len(be.Servers) > 0:
			return fakeErr("Wait delay expired.")
		}
		return fakeMsg(6, "Done.")
	}
	return f.waitUsage(3)
}

// fakeValidDuration accepts HAProxy's "<n>[us|ms|s|m|h|d]".
func fakeValidDuration(d string) bool {
	n := 0
	for n < len(d) && d[n] >= '0' && d[n] <= '9' {
		n++
	}
	switch d[n:] {
	case "", "us", "ms", "s", "m", "h", "d":
		return n > 0
	}
	return false
}

// --- backends (3.4)

// addBackend is "add backend <name> from <defaults> [mode <m>] [guid <g>]".
// The fake knows no defaults sections, so any profile name is accepted.
func (f *FakeHAProxy) addBackend(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 3 || args[1] != "from" {
		return fakeErr("'add backend' expects a name and a defaults section.")
	}
	be := &FakeBackend{Profile: args[2], Mode: "http"}
	for i := 3; i < len(args); i += 2 {
		if i+1 >= len(args) {
			return fakeErr("'add backend' expects a name and a defaults section.")
		}
		switch args[i] {
		case "mode":
			if args[i+1] != "http" && args[i+1] != "tcp" {
				return fakeErr("'add backend' expects a name and a defaults section.")
			}
			be.Mode = args[i+1]
		case "guid":
			be.GUID = args[i+1]
		default:
			return fakeErr("'add backend' expects a name and a defaults section.")
		}
	}
	name := args[0]
	if _, fe := m.Frontends[name]; m.Backends[name] != nil || fe {
		return fakeErr("backend '" + name + "' name is already used by other proxy.")
	}
	m.Backends[name] = be
	return fakeMsg(6, "New backend registered.")
}

// fakeBackendCommand resolves a backend name, refusing an unknown one,
// then runs op.
func fakeBackendCommand(op func(f *FakeHAProxy, name string, be *FakeBackend) fakeOut) func(*FakeHAProxy, []string, *string) fakeOut {
	return func(f *FakeHAProxy, args []string, _ *string) fakeOut {
		name := fakeFirstArg(args)
		be := f.model.Backends[name]
		if be == nil {
			return fakeErr("No such backend.")
		}
		return op(f, name, be)
	}
}

func fakePublishBackend(_ *FakeHAProxy, _ string, be *FakeBackend) fakeOut {
	be.Published = true
	return fakeMsg(6, "Backend published.")
}

func fakeUnpublishBackend(_ *FakeHAProxy, _ string, be *FakeBackend) fakeOut {
	be.Published = false
	return fakeSilent()
}

func fakeDelBackend(f *FakeHAProxy, name string, be *FakeBackend) fakeOut {
	if be.Published || len(be.Servers) > 0 {
		return fakeErr("This backend cannot be removed at runtime.")
	}
	delete(f.model.Backends, name)
	return fakeMsg(6, "Backend deleted.")
}

// ---------------------------------------------------------------------------
// Master socket (§8.6).

// serveMaster reads lines and answers each command; the connection stays
// open until a line holds quit or reload, as a real master's does.
func (f *FakeHAProxy) serveMaster(conn net.Conn) {
	r := bufio.NewReader(conn)
	for n := 0; n < fakeMaxLinesPerConnection; n++ {
		line, err := fakeReadLine(r)
		if err != nil {
			return
		}
		var out bytes.Buffer
		done := false
		for _, cmd := range fakeSplitCommands(line) {
			args := fakeFields(cmd)
			switch {
			case len(args) == 0:
			case args[0] == "quit":
				done = true
			case len(args) == 2 && args[0] == "show" && args[1] == "proc":
				out.WriteString(f.showProc())
			case args[0] == "reload":
				done = true
				reply, hang := f.reload()
				out.WriteString(reply)
				if hang {
					conn.Write(out.Bytes())
					io.Copy(io.Discard, r) // no answer until the client gives up
					return
				}
			default:
				out.WriteString(f.unknownFirstLine(args[0]) + "\n" +
					"  reload                                  : achieve a soft-reload (-sf) of haproxy\n" +
					"  quit                                    : disconnect\n\n")
			}
			if done {
				break
			}
		}
		if _, err := conn.Write(out.Bytes()); err != nil || done {
			return
		}
	}
}

// showProc renders the table of runtime.md §6.1 with HAProxy's widths.
func (f *FakeHAProxy) showProc() string {
	f.mu.Lock()
	m := f.model
	f.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "#%-14s %-15s %-15s %-15s %-15s\n", "<PID>", "<type>", "<reloads>", "<uptime>", "<version>")
	fmt.Fprintf(&b, "%-15d %-15s %-15s %-15s %-15s\n", m.MasterPID, "master",
		fmt.Sprintf("%d [failed: %d]", m.Reloads, m.FailedReloads), fakeUptime, f.version)
	b.WriteString("# workers\n")
	fmt.Fprintf(&b, "%-15d %-15s %-15d %-15s %-15s\n", m.Pid, "worker", m.WorkerReloads, fakeUptime, f.version)
	if f.dialect != fakeDialect34 {
		b.WriteString("# programs\n")
	}
	b.WriteString("\n")
	return b.String()
}

// reload is the master's reload: on 3.0/3.4 the effect and a Success=
// reply at once; on 2.6 an empty reply and the effect after ReloadDelay.
func (f *FakeHAProxy) reload() (reply string, hang bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &f.model
	if f.dialect == fakeDialect26 {
		if m.ReloadHangs {
			return "", false
		}
		fails := m.ReloadFails
		f.connMu.Lock()
		if !f.closed {
			f.timers = append(f.timers, time.AfterFunc(m.ReloadDelay, func() {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.applyReload(!fails)
			}))
		}
		f.connMu.Unlock()
		return "", false
	}
	if m.ReloadHangs {
		return "", true
	}
	if m.ReloadTakes > 0 {
		if time.Now().Before(f.reloadBusyUntil) {
			return "Success=0\n--\nAnother reload is still in progress.\n\n", false
		}
		takes := m.ReloadTakes
		f.reloadBusyUntil = time.Now().Add(takes)
		f.mu.Unlock()
		time.Sleep(takes)
		f.mu.Lock()
	}
	ok := !m.ReloadFails
	f.applyReload(ok)
	log := m.ReloadLog
	status := "Success=1"
	switch {
	case !ok && log == "":
		status = "Success=0"
		log = fmt.Sprintf("[ALERT]    (%d) : config : Fatal errors found in configuration.\n[WARNING]  (%d) : Loading failure!", m.MasterPID, m.MasterPID)
	case !ok:
		status = "Success=0"
	case log == "":
		log = fmt.Sprintf("[NOTICE]   (%d) : New worker (%d) forked\n[NOTICE]   (%d) : Loading success.", m.MasterPID, m.Pid, m.MasterPID)
	}
	return status + "\n--\n" + log + "\n\n", false
}

// applyReload changes the model as a reload does; the lock is held. A
// failed reload keeps the worker, which survives one more reload; a
// successful one starts a new worker, ends the old one's open
// transactions and resets the failed count.
func (f *FakeHAProxy) applyReload(ok bool) {
	m := &f.model
	m.Reloads++
	if !ok {
		m.FailedReloads++
		m.WorkerReloads++
		return
	}
	m.FailedReloads = 0
	m.Pid++
	m.StartTimeUnixMicros += 1_000_000
	m.WorkerReloads = 0
	m.certTx, m.caTx = nil, nil
	if m.OnReload != nil {
		m.OnReload(m)
	}
}
