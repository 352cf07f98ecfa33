// This file owns the fake master socket: show proc, reload in each
// dialect (a Success= reply on 3.0 and later; on 2.6 none, and the effect
// after ReloadDelay), what a reload does to the model, and the one command
// it forwards to the worker, show cli sockets (after @1 or @!<pid>).
//
// It must never run or record other worker commands: Sent reports only
// what reached the worker socket, and tests count on that, so any other
// command after an @ prefix is answered as an unknown one (HAProxy would
// forward it). A reload must never read a configuration either; OnReload
// stands for what the new worker loaded.

package haptic

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

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
			case strings.HasPrefix(args[0], "@"):
				reply, found := f.forward(args)
				out.WriteString(reply)
				if !found && f.dialect != fakeDialect26 {
					conn.Write(out.Bytes())
					io.Copy(io.Discard, r) // 3.x answers, then neither quits nor closes
					return
				}
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

// forward answers a command after an @ prefix: @1 (the current worker) or
// @!<its pid> reach the worker, any other target is not found.
func (f *FakeHAProxy) forward(args []string) (reply string, found bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if args[0] != "@1" && args[0] != "@!"+strconv.Itoa(f.model.Pid) {
		return "Can't find the target PID matching the prefix '" + args[0] + "'\n", false
	}
	var out bytes.Buffer
	s := &fakeSession{}
	if len(args) == 4 && args[1] == "show" && args[2] == "cli" && args[3] == "sockets" {
		s.render(&out, f.showCLISockets(nil, nil))
	} else {
		s.render(&out, f.unknownCommand(args[min(1, len(args)-1)]))
	}
	return out.String(), true
}

// fakeUptime is the uptime show proc prints for every process: the fake
// models no clock, and clients read the column for its format only.
const fakeUptime = "0d00h00m01s"

// showProc renders the process table with HAProxy's column widths and
// sections, because clients parse it by them: the master row carries the
// reload and [failed: N] counts a reload is judged by, and the serving
// worker sits under "# workers", except that 3.4 lists it under "# old
// workers" once a reload failed, until one succeeds. "# programs" is
// printed before 3.4 only, as real releases do.
func (f *FakeHAProxy) showProc() string {
	f.mu.Lock()
	m := f.model
	f.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "#%-14s %-15s %-15s %-15s %-15s\n", "<PID>", "<type>", "<reloads>", "<uptime>", "<version>")
	fmt.Fprintf(&b, "%-15d %-15s %-15s %-15s %-15s\n", m.MasterPID, "master",
		fmt.Sprintf("%d [failed: %d]", m.Reloads, m.FailedReloads), fakeUptime, f.version)
	b.WriteString("# workers\n")
	if m.loadFailed {
		b.WriteString("# old workers\n")
	}
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
	case !ok && log == "" && f.dialect == fakeDialect34:
		// 3.4's master relays the log of the new worker, which exits.
		status = "Success=0"
		log = fmt.Sprintf("[NOTICE]   (%d) : Initializing new worker (%d)\n[ALERT]    (%d) : config : Fatal errors found in configuration.\n[WARNING]  (%d) : Failed to load worker (%d) exited with code 1 (Exit)",
			m.MasterPID, m.Pid+1, m.Pid+1, m.MasterPID, m.Pid+1)
	case !ok && log == "":
		status = "Success=0"
		log = fmt.Sprintf("[ALERT]    (%d) : config : Fatal errors found in configuration.\n[WARNING]  (%d) : Loading failure!", m.MasterPID, m.MasterPID)
	case !ok:
		status = "Success=0"
	case log == "" && f.dialect == fakeDialect34:
		log = fmt.Sprintf("[NOTICE]   (%d) : Initializing new worker (%d)\n[NOTICE]   (%d) : Loading success.", m.MasterPID, m.Pid, m.MasterPID)
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
	m.loadFailed = !ok && f.dialect == fakeDialect34
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
	f.bindStatsSockets()
}
