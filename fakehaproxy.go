// This file owns FakeHAProxy's frame: the exported model and handle, the
// two unix sockets, the worker connection (line reading, payload framing,
// HAProxy's per-command size limit), the command table that hands each
// worker command to the file named for its concern (maps, certificates,
// servers and backends), show info and show stat, and the rendering of
// every reply. The master socket is in fakehaproxy_master.go.
//
// FakeHAProxy is an in-process HAProxy of one master and one worker, served
// over two unix sockets with HAProxy's own wire framing and reply texts. It
// is the oracle of every runtime, agent and fault test, and `haptic demo`
// runs on it, so it is exported and built to ship, like net/http/httptest.
// Real HAProxy is its authority: every text and every framing rule was
// read off HAProxy 3.0.11, 3.4.0 and 2.6.12, and TestFakeMatchesRealHAProxy
// holds the fake to each.
//
// No file of the fake may import testing, read a configuration file, dial
// anything, or sleep in place of HAProxy (a `wait` answers at once). It
// models state, not timing: its only delays are the reload ones a test
// asks for (ReloadDelay on 2.6, ReloadTakes on 3.0 and later).

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

	Backends          map[string]*FakeBackend
	Maps              map[string][]MapEntry
	Certs             map[string]string   // path → PEM; "" is a store created by new ssl cert, never committed
	CAFiles           map[string]string   // path → PEM
	CRLFiles          map[string]string   // path → PEM
	CRTLists          map[string][]string // list → entry lines, as show ssl crt-list prints them
	Frontends         map[string]uint64   // conn_tot by frontend; default {"status": 0, "http-tcp": 0}
	Commands          []string            // worker commands received, in order (what Sent returns)
	WorkerConnections int                 // worker-socket connections accepted

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
	// StatsSockets is what the worker's stats socket lines declare, as
	// show cli sockets prints them ("unix@/path", "ipv4@127.0.0.1:9999");
	// nil is the worker socket alone. The fake accepts on each unix path.
	// A reload (OnReload sets it for the new worker) that drops one leaves
	// its file with nobody accepting on it, connect refused, as HAProxy
	// leaves a former worker's socket; one it adds is bound afresh.
	StatsSockets []string
	// CutReply, when set, is asked about every worker line after its
	// commands ran; cut true writes only the first keep bytes of the reply
	// and closes the connection. It is called without the lock held.
	CutReply func(line string) (keep int, cut bool)

	mapVersions  map[string]*fakeMapVersions
	loadFailed   bool // 3.4: the last reload failed, so show proc lists the worker as old
	certTx       *fakeTransaction
	caTx         *fakeTransaction
	crtListLines map[string][]int // line number of each CRTLists entry
	crtListLast  map[string]int   // last line number a list assigned
}

// FakeBackend is one backend of the fake worker.
type FakeBackend struct {
	Profile, Mode, GUID string
	Published           bool
	// Referenced marks a backend the configuration points at (a
	// default_backend, a use_backend rule): HAProxy 3.4 never deletes one
	// at runtime.
	Referenced bool
	Servers    []*FakeServer
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
	statsLns   map[string]net.Listener // by path: the worker's unix stats sockets
	masterLn   net.Listener
	conns      map[net.Conn]bool // open connections → is a master connection
	masterDown bool
	timers     []*time.Timer
	// reloadBusyUntil is when a slow reload (ReloadTakes) ends.
	reloadBusyUntil time.Time
	wg              sync.WaitGroup
}

// fakeDialect is the HAProxy release line the fake answers as. Releases
// differ in their verbs, payload framing, refusal texts and reload
// replies, and the agent must cope with each, so the fake speaks each.
type fakeDialect int

const (
	fakeDialect26 fakeDialect = iota // before 3.0
	fakeDialect30                    // 3.0 to 3.3
	fakeDialect34                    // 3.4 and later
)

const (
	fakeDefaultVersion = "3.4.3-1deb11u1"
	// fakeCommandLimit is tune.bufsize (16384) less the byte kept for the
	// terminating NUL. Before 3.4 it bounds each command, from its first
	// byte through the ';' or '\n' that ends it (a payload command through
	// its terminator line); 3.4 gathers a whole line in one buffer before
	// running any of it, so there it bounds the line without its payload.
	fakeCommandLimit = 16383
	// fakeMaxPayload is 3.4's tune.cli.max-payload-size: a payload grows
	// out of the line's buffer up to it.
	fakeMaxPayload = 128 << 10
	// fakeMaxLineBytes bounds one worker or master line; a longer line
	// closes the connection rather than growing memory without end.
	fakeMaxLineBytes = 1 << 20
	// fakeMaxLinesPerConnection bounds the lines one connection may send
	// (a prompt-mode session or a master connection); then it is closed.
	fakeMaxLinesPerConnection = 1 << 20
	// fakeMaxArgs is HAProxy's MAX_CLI_ARGS: words after it are ignored.
	fakeMaxArgs = 64
	// fakeMaxPayloadPattern is the longest custom payload terminator
	// before 3.4; 3.4 takes up to fakeMaxPayloadPattern34.
	fakeMaxPayloadPattern   = 7
	fakeMaxPayloadPattern34 = 64
	// fakeBufferedGrace is how long a 2.6 or 3.x connection looks for lines
	// the client already sent, after the first: HAProxy handles what is in
	// its buffer, and a client that sent one write has it all there.
	fakeBufferedGrace = 5 * time.Millisecond
)

// HAProxy's refusals of a command, a line (3.4) or a payload (3.4) over
// its limit. Each ends with a single '\n', unlike every other response.
const (
	fakeTooBig        = "The command is too big for the buffer size. Please change tune.bufsize in the configuration to use a bigger command."
	fakeLineTooBig    = "The command line is too big for the buffer size. Please change 'tune.bufsize' in the configuration to use a bigger command."
	fakePayloadTooBig = "The payload is too big. Please change 'tune.cli.max-payload-size' in the configuration to use a bigger payload."
)

// StartFakeHAProxy serves <dir>/haproxy-worker.sock and
// <dir>/haproxy-master.sock. version "" means "3.4.3-1deb11u1". The dialect
// follows the version's major.minor: below 3.0 answers as 2.6, 3.0 to 3.3
// as 3.0, 3.4 and later as 3.4. The caller owns dir; Close removes only
// the sockets.
func StartFakeHAProxy(dir string, version string) (*FakeHAProxy, error) {
	if version == "" {
		version = fakeDefaultVersion
	}
	// The version is read as CapsFor reads it (an optional leading "v",
	// then the major's digits), so the fake's dialect and the planner's
	// capabilities agree; a version with no major number has neither.
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
	workerLn, err := fakeListen(f.workerPath)
	if err != nil {
		return nil, err
	}
	if f.masterLn, err = fakeListen(f.masterPath); err != nil {
		workerLn.Close()
		return nil, err
	}
	f.statsLns = map[string]net.Listener{f.workerPath: workerLn}
	f.wg.Add(2)
	go f.accept(workerLn, false)
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

// Close stops every listener, closes every open connection, cancels a
// pending 2.6 reload effect, waits for the connection goroutines (a
// blocking Reject or CutReply hook delays it) and removes the sockets it
// listened on. It is idempotent.
func (f *FakeHAProxy) Close() error {
	f.connMu.Lock()
	if f.closed {
		f.connMu.Unlock()
		return nil
	}
	f.closed = true
	paths := []string{f.masterPath}
	for path, ln := range f.statsLns {
		ln.Close()
		paths = append(paths, path)
	}
	f.masterLn.Close()
	for c := range f.conns {
		c.Close()
	}
	for _, t := range f.timers {
		t.Stop()
	}
	f.connMu.Unlock()
	f.wg.Wait()
	for _, p := range paths {
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
		if !master {
			f.With(func(m *FakeModel) { m.WorkerConnections++ })
		}
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
	close     bool // quit, an oversize command or a cut payload ends the connection
	extraLine bool // 3.0: a "<<" pattern too long to be a terminator lets one more line run
}

// serveWorker snapshots the worker identity at accept, then reads lines,
// handles each and writes its responses. A line that arrives after the
// identity changed closes the connection instead: the worker it reached
// has exited, and a client must see that rather than talk to its
// successor unawares.
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
			// answers one line and discards the rest, except that 3.0 runs
			// one further line after a "<<" pattern that was not a
			// terminator.
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

// handleLine runs one line's commands in order, writing each response to
// out; only the last command of a line may take a payload, which it reads
// from r. Before 3.4 HAProxy runs a line command by command and the limit
// applies to each: an oversize command runs nothing, the commands before
// it stand, those after it never run, and the connection closes. 3.4
// gathers the whole line and its payload before running any of it, so it
// refuses an oversize line or payload whole, and untagged when the line
// itself asked for severity output.
func (f *FakeHAProxy) handleLine(out *bytes.Buffer, r *bufio.Reader, s *fakeSession, line string) {
	refuse := func(text string) {
		if f.dialect != fakeDialect26 { // 2.6 drops the rest of the line silently
			out.WriteString(s.tag(3) + text + "\n")
		}
		s.close = true
	}
	cmds := fakeSplitCommands(line)
	last := len(cmds) - 1
	var payload *string
	ok := true
	if f.dialect == fakeDialect34 {
		if len(line)+1 > fakeCommandLimit {
			refuse(fakeLineTooBig)
			return
		}
		if payload, ok = f.takePayload(r, s, &cmds[last], 0, refuse); !ok {
			return
		}
	}
	for i, text := range cmds {
		size := len(text) + 1 // through the ';' or '\n' that ends it
		if i == last && f.dialect != fakeDialect34 {
			if payload, ok = f.takePayload(r, s, &text, size, refuse); !ok {
				return
			}
		}
		if size > fakeCommandLimit {
			refuse(fakeTooBig)
			return
		}
		if i < last {
			f.runCommand(out, s, text, nil)
		} else {
			f.runCommand(out, s, text, payload)
		}
		if s.close {
			return
		}
	}
}

// takePayload cuts the payload introducer off *cmd and reads the payload
// it introduces, nil when there is none. size is what the command already
// counts against the per-command limit. ok is false when the line must
// stop: the payload was refused, or EOF came before its terminator (the
// command then never runs).
func (f *FakeHAProxy) takePayload(r *bufio.Reader, s *fakeSession, cmd *string, size int, refuse func(string)) (payload *string, ok bool) {
	text, term, isPayload, tooLong := f.payloadIntroducer(*cmd)
	s.extraLine = tooLong && f.dialect == fakeDialect30
	if !isPayload {
		return nil, true
	}
	*cmd = text
	room, tooBig := fakeCommandLimit-size, fakeTooBig
	if f.dialect == fakeDialect34 {
		room, tooBig = fakeMaxPayload, fakePayloadTooBig
	}
	body, n, complete := fakeReadPayload(r, term, room)
	switch {
	case n > room:
		refuse(tooBig)
		return nil, false
	case !complete:
		s.close = true
		return nil, false
	}
	return &body, true
}

// payloadIntroducer looks at the last word of a line's last command.
// "<<" alone introduces a payload ended by an empty line; on 3.x, "<<" and
// 1 to 7 more characters (64 on 3.4) introduce one ended by that exact
// line. A longer pattern is an ordinary word (tooLong). On 2.6 only a
// command ending in "<<" takes a payload, so there a custom terminator's
// payload lines run as commands, as they do on a real 2.6.
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
	limit := fakeMaxPayloadPattern
	if f.dialect == fakeDialect34 {
		limit = fakeMaxPayloadPattern34
	}
	if len(word)-2 > limit {
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
// Worker commands. Their texts are HAProxy's, read off real releases: the
// agent judges a reply by its words, so a paraphrase would hide a bug.

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
	o := f.dispatch(args, payload)
	f.mu.Unlock()
	s.render(out, o)
}

// fakeCommand is one verb of the worker CLI.
type fakeCommand struct {
	words   []string
	from    fakeDialect // the first dialect that has it
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
	{words: []string{"show", "cli", "sockets"}, handler: (*FakeHAProxy).showCLISockets},
	{words: []string{"add", "server"}, handler: (*FakeHAProxy).addServer},
	{words: []string{"enable", "server"}, handler: fakeServerCommand(fakeEnableServer)},
	{words: []string{"disable", "server"}, handler: fakeServerCommand(fakeDisableServer)},
	{words: []string{"enable", "health"}, handler: fakeServerCommand(fakeEnableHealth)},
	{words: []string{"disable", "health"}, handler: fakeServerCommand(fakeDisableHealth)},
	{words: []string{"set", "server"}, handler: fakeServerCommand(fakeSetServer)},
	{words: []string{"shutdown", "sessions", "server"}, handler: fakeServerCommand(fakeShutdownSessions)},
	{words: []string{"del", "server"}, handler: (*FakeHAProxy).delServer},
	{words: []string{"wait"}, from: fakeDialect30, handler: (*FakeHAProxy).wait},
	{words: []string{"add", "backend"}, from: fakeDialect34, handler: (*FakeHAProxy).addBackend},
	{words: []string{"publish", "backend"}, from: fakeDialect34, handler: fakeBackendCommand(fakePublishBackend)},
	{words: []string{"unpublish", "backend"}, from: fakeDialect34, handler: fakeBackendCommand(fakeUnpublishBackend)},
	{words: []string{"del", "backend"}, from: fakeDialect34, handler: (*FakeHAProxy).delBackend},
}

// dispatch finds the command and runs it; the lock is held.
func (f *FakeHAProxy) dispatch(args []string, payload *string) fakeOut {
	f.model.repair()
	for _, c := range fakeCommands {
		if c.from > f.dialect || len(args) < len(c.words) || !fakeHasPrefix(args, c.words) {
			continue
		}
		return c.handler(f, args[len(c.words):], payload)
	}
	return f.unknownCommand(args[0])
}

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

func fakeHasPrefix(args, words []string) bool {
	for i, w := range words {
		if args[i] != w {
			return false
		}
	}
	return true
}

// fakeFirstArg is the word a command acts on, "" when there is none, so
// that a handler answers a missing name with HAProxy's refusal rather
// than an index panic.
func fakeFirstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
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

// statsSockets is the model's StatsSockets, nil being the worker socket.
func (f *FakeHAProxy) statsSockets() []string {
	if f.model.StatsSockets == nil {
		return []string{"unix@" + f.workerPath}
	}
	return f.model.StatsSockets
}

// showCLISockets lists the worker's CLI listeners: its stats sockets, and
// the socket pair the master reaches it by, which 3.4 lists first.
func (f *FakeHAProxy) showCLISockets(_ []string, _ *string) fakeOut {
	rows := []string{}
	for _, addr := range f.statsSockets() {
		rows = append(rows, addr+" admin all")
	}
	if f.dialect == fakeDialect34 {
		rows = append([]string{"sockpair@5 admin all"}, rows...)
	} else {
		rows = append(rows, "sockpair@5 admin all")
	}
	return fakeList("# socket lvl processes\n" + strings.Join(rows, "\n"))
}

// bindStatsSockets makes the fake accept on the unix paths of the model's
// stats sockets and on no other, as a new worker does; the lock is held.
// A path dropped keeps its file, as HAProxy leaves it.
func (f *FakeHAProxy) bindStatsSockets() {
	want := map[string]bool{}
	for _, addr := range f.statsSockets() {
		if path, ok := strings.CutPrefix(addr, "unix@"); ok {
			want[path] = true
		}
	}
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.closed {
		return
	}
	for path, ln := range f.statsLns {
		if !want[path] {
			ln.(*net.UnixListener).SetUnlinkOnClose(false)
			ln.Close()
			delete(f.statsLns, path)
		}
	}
	for path := range want {
		if f.statsLns[path] != nil {
			continue
		}
		if ln, err := fakeListen(path); err == nil {
			f.statsLns[path] = ln
			f.wg.Add(1)
			go f.accept(ln, false)
		}
	}
}

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

// ---------------------------------------------------------------------------
// Responses. HAProxy ends a silent command's response with a lone '\n' and
// any other with a blank line, which is how a client counts responses and
// tells a complete reply from a cut one; a dump is never tagged with a
// severity, even with severity-output on.

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
