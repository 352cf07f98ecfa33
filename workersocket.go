// This file owns the one rule for a worker's stats sockets: whether the
// addresses a haproxy.cfg's global section declares, or a running worker's
// show cli sockets lists, include the agent's worker socket. The agent
// applies it before a reload and after one, and `haptic check` before a
// push. It reads a configuration's stats socket lines and nothing else of
// it (HAProxy's own check judges the rest), and never touches a socket.

package haptic

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// ErrSocketUnknown marks stats socket lines that cannot tell whether the
// worker listens on the agent's worker socket: none at all (another file
// HAProxy loads may declare it), a relative path (HAProxy resolves it
// against its working directory), a socket HAProxy inherits (fd@,
// sockpair@), a quoted or escaped word (HAProxy expands environment
// variables inside quotes), or a line too long to read.
var ErrSocketUnknown = errors.New("cannot tell whether the worker listens on the agent's worker socket")

// maxConfigLineBytes bounds one configuration line the socket check reads;
// a longer one ends the check with ErrSocketUnknown.
const maxConfigLineBytes = 64 << 10

// CheckWorkerSocket reads a haproxy.cfg and reports whether the worker it
// starts listens on socket, the agent's worker socket (an absolute path,
// --worker-socket resolved against --base-dir as the agent resolves it):
// nil when a global "stats socket" line declares it, an error wrapping
// ErrSocketUnknown when the lines cannot tell, and otherwise an error naming
// the sockets declared: the new worker would not answer the agent.
//
// Paths compare cleaned, or by name within directories that resolve to one
// (/var/run is often a link to /run). The agent must see the socket at the
// path HAProxy binds: where its container mounts the base directory
// elsewhere than HAProxy's, --worker-socket names another path, and the
// check says so.
func CheckWorkerSocket(config io.Reader, socket string) error {
	var addrs []string
	global := false
	sc := bufio.NewScanner(config)
	sc.Buffer(nil, maxConfigLineBytes)
	for sc.Scan() {
		if header := sectionHeader(sc.Text()); header != "" {
			global = header == "global"
			continue
		}
		line, _, _ := strings.Cut(sc.Text(), "#")
		if w := strings.Fields(line); global && len(w) >= 3 && w[0] == "stats" && w[1] == "socket" {
			addrs = append(addrs, w[2])
		}
	}
	declared, unknown := judgeSockets(addrs, socket)
	switch {
	case sc.Err() != nil:
		return fmt.Errorf("%w: %v", ErrSocketUnknown, sc.Err())
	case declared:
		return nil
	case unknown != nil:
		return unknown
	case len(addrs) == 0:
		return fmt.Errorf("%w: the configuration declares no stats socket", ErrSocketUnknown)
	}
	return fmt.Errorf("the configuration declares stats socket %s, not the agent's worker socket %s: the new worker would not answer the agent",
		strings.Join(addrs, ", "), socket)
}

// judgeSockets judges stats socket addresses, as a configuration declares
// them or show cli sockets lists them: declared when one binds socket;
// otherwise unknown says why they cannot tell, or is nil when none is it.
// An address binds a file when it is a path or unix@ / uxst@ (after an
// optional stream+); every other family (ipv4@, abns@, host:port, ...)
// binds none.
func judgeSockets(addrs []string, socket string) (declared bool, unknown error) {
	for _, addr := range addrs {
		path, isPath := socketPath(addr)
		trimmed := strings.TrimPrefix(addr, "stream+")
		switch {
		case strings.ContainsAny(addr, `"'\$`):
			unknown = fmt.Errorf("%w: stats socket %s is quoted or escaped", ErrSocketUnknown, addr)
		case strings.HasPrefix(trimmed, "fd@") || strings.HasPrefix(trimmed, "sockpair@"):
			unknown = fmt.Errorf("%w: stats socket %s is inherited", ErrSocketUnknown, addr)
		case !isPath:
		case !filepath.IsAbs(path):
			unknown = fmt.Errorf("%w: stats socket %s is relative to HAProxy's working directory", ErrSocketUnknown, addr)
		case sameSocket(path, socket):
			return true, nil
		}
	}
	return false, unknown
}

// socketPath is the file a stats socket address binds, if it binds one.
func socketPath(addr string) (string, bool) {
	addr = strings.TrimPrefix(addr, "stream+")
	for _, family := range []string{"unix@", "uxst@"} {
		if path, ok := strings.CutPrefix(addr, family); ok {
			return path, true
		}
	}
	return addr, strings.HasPrefix(addr, "/")
}

// sameSocket reports whether two absolute paths name one socket file.
func sameSocket(a, b string) bool {
	a, b = filepath.Clean(a), filepath.Clean(b)
	if a == b {
		return true
	}
	dirA, errA := filepath.EvalSymlinks(filepath.Dir(a))
	dirB, errB := filepath.EvalSymlinks(filepath.Dir(b))
	return errA == nil && errB == nil && dirA == dirB && filepath.Base(a) == filepath.Base(b)
}

// losesWorkerSocket is the agent's refusal before a reload: staged, the
// configuration a render installs, declares only sockets other than the
// agent's, where live, the one it replaces, declares the agent's. The
// second condition is what makes the first a proof: this deployment names
// the agent's socket in this file at the path the agent dials, not in
// another file HAProxy loads, nor at a path only HAProxy's own mount of
// the base directory resolves (the agent's container may mount it
// elsewhere). Whatever cannot be told is left to the reload, which fails
// fast on a worker off the agent's socket (socketsElsewhere).
func losesWorkerSocket(live, staged io.Reader, socket string) error {
	if CheckWorkerSocket(live, socket) != nil {
		return nil
	}
	if err := CheckWorkerSocket(staged, socket); !errors.Is(err, ErrSocketUnknown) {
		return err
	}
	return nil
}

// socketsElsewhere judges a new worker's show cli sockets reply: a "#
// socket lvl processes" header, then a row per CLI listener, its address
// first (the sockpair@ row is the master's own link to the worker, not a
// stats socket). Only a listing that proves the agent's socket is not
// among them is a verdict: the files the worker bound, and an
// errNoNewWorker naming both sides. Any other reply, or a socket it cannot
// judge, is none.
func socketsElsewhere(reply, socket string) (bound []string, err error) {
	header, rows, _ := strings.Cut(reply, "\n")
	var addrs []string
	for row := range strings.SplitSeq(rows, "\n") {
		if w := strings.Fields(row); len(w) > 0 && !strings.HasPrefix(w[0], "sockpair@") {
			addrs = append(addrs, w[0])
			if path, ok := socketPath(w[0]); ok {
				bound = append(bound, path)
			}
		}
	}
	if declared, unknown := judgeSockets(addrs, socket); !strings.HasPrefix(header, "# socket") || declared || unknown != nil {
		return nil, nil
	}
	return bound, fmt.Errorf("%w: it does not listen on the agent's worker socket %s; its stats sockets: %s",
		errNoNewWorker, socket, cmp.Or(strings.Join(addrs, ", "), "none"))
}
