// This file owns the fake worker's servers and backends: resolving
// "<backend>/<server>", show servers state, add, set, enable, disable and
// del server, enable and disable health, shutdown sessions server, wait
// srv-removable and be-removable, and the 3.4 backend commands (add,
// publish, unpublish and del backend). Its handlers run under the model
// lock that dispatch holds.
//
// It must never sleep or start a timer: wait answers at once from the
// model, BlockedServers standing for the connections a server still
// holds, so no test pays real time for it. Nor may it take the lock or
// write to the connection; fakehaproxy.go frames every reply.

package haptic

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
)

// --- servers

// server finds a server by backend and name, nil if either is unknown. It
// takes no lock: its callers hold the model lock.
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

// fakeServersStateHeader is the column header of show servers state.
const fakeServersStateHeader = "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port"

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

// fakeSetServer is "set server <ref> addr|weight|state ...". The addr
// answers are at WARNING level, success and refusal alike, as in HAProxy:
// only the words tell them apart, so a client that trusted the level would
// take a refused address for a changed one.
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
// server and del server messages lack their own newline. A client that
// counts responses by their blank lines then finds the reply incomplete,
// which is what a real 2.6 worker gives it.
func (f *FakeHAProxy) short(o fakeOut) fakeOut {
	o.short = f.dialect == fakeDialect26
	return o
}

func (f *FakeHAProxy) delServer(args []string, payload *string) fakeOut {
	return f.short(fakeServerCommand(fakeDelServer)(f, args, payload))
}

func fakeDelServer(f *FakeHAProxy, ref string, be *FakeBackend, s *FakeServer, _ []string) fakeOut {
	if why, _ := f.serverNotRemovable(ref, s); why != "" {
		return fakeErr(why)
	}
	for i, x := range be.Servers {
		if x == s {
			be.Servers = append(be.Servers[:i:i], be.Servers[i+1:]...)
			break
		}
	}
	return fakeMsg(6, "Server deleted.")
}

// serverNotRemovable is HAProxy's reason a server cannot be deleted yet,
// "" when it can; transient reasons may clear while a wait runs.
func (f *FakeHAProxy) serverNotRemovable(ref string, s *FakeServer) (why string, transient bool) {
	switch {
	case s.Enabled:
		return "Only servers in maintenance mode can be deleted.", false
	case f.model.BlockedServers[ref]:
		return "Server still has connections attached to it, cannot remove it.", true
	}
	return "", false
}

// fakeBackendNotRemovable is 3.4's reason a backend cannot be deleted, in the
// order HAProxy checks, "" when it can. The fake models no streams
// attached to a backend, so none of its reasons clears while a wait runs.
func fakeBackendNotRemovable(be *FakeBackend) string {
	switch {
	case be.Referenced:
		return "This proxy cannot be removed at runtime due to other configuration elements pointing to it."
	case be.Published:
		return "Backend must be unpublished prior to its deletion."
	case len(be.Servers) > 0:
		return "Only a backend without server can be deleted."
	}
	return ""
}

// --- wait

// waitUsage is the 3.0 usage text of wait; 3.4 adds be-removable.
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
// the time it takes, so a condition that could still change "expires".
// 3.4 says why a wait failed or expired; 3.0 does not.
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
	verdict := func(head, why string) fakeOut {
		if f.dialect >= fakeDialect34 {
			head += " " + why
		}
		return fakeErr(head)
	}
	switch {
	case len(args) == 1:
	case args[1] == "srv-removable":
		ref := fakeFirstArg(args[2:])
		bname, sname, _ := strings.Cut(ref, "/")
		switch {
		case ref == "":
			return fakeErr("Missing server name (<backend>/<server>).")
		case sname == "":
			return fakeErr("Require 'backend/server'.")
		case f.model.Backends[bname] == nil:
			return verdict("Failed.", "No such backend.")
		case f.model.server(bname, sname) == nil:
			return verdict("Failed.", "No such server.")
		}
		why, transient := f.serverNotRemovable(ref, f.model.server(bname, sname))
		switch {
		case transient:
			return verdict("Wait delay expired.", why)
		case why != "":
			return verdict("Failed.", why)
		}
	case args[1] == "be-removable" && f.dialect >= fakeDialect34:
		be := f.model.Backends[fakeFirstArg(args[2:])]
		switch {
		case len(args) < 3:
			return fakeErr("Missing backend name.")
		case be == nil:
			return verdict("Failed.", "No such backend.")
		case fakeBackendNotRemovable(be) != "":
			return verdict("Failed.", fakeBackendNotRemovable(be))
		}
	default:
		return f.waitUsage(3)
	}
	return fakeMsg(6, "Done.")
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

// addBackend is "add backend <name> from <defaults> [mode <m>] [guid <g>]",
// refused in HAProxy's order: the name, the usage, the mode, then a name
// (a backend's or a frontend's) or a GUID another proxy holds. The fake
// knows no defaults sections, so any profile name is accepted, and of the
// modes only http and tcp.
func (f *FakeHAProxy) addBackend(args []string, _ *string) fakeOut {
	m := &f.model
	switch {
	case len(args) == 0:
		return fakeErr("Require backend name.")
	case len(args) < 3 || args[1] != "from":
		return fakeErr("Usage: add backend <name> from <defproxy>.")
	}
	name, be := args[0], &FakeBackend{Profile: args[2], Mode: "http"}
	seen := map[string]bool{}
	for i := 3; i < len(args); i += 2 {
		if i+1 >= len(args) || seen[args[i]] || args[i] != "mode" && args[i] != "guid" {
			return fakeErr("Usage: add backend <name> from <defproxy> [mode <px_mode>] [guid <val>].")
		}
		seen[args[i]] = true
		if args[i] == "guid" {
			be.GUID = args[i+1]
		} else if be.Mode = args[i+1]; be.Mode != "http" && be.Mode != "tcp" {
			return fakeErr("Unknown proxy mode.")
		}
	}
	const failed = "Error during backend creation : "
	if _, fe := m.Frontends[name]; fe || m.Backends[name] != nil {
		kind := "backend"
		if fe {
			kind = "frontend"
		}
		return fakeErr(failed + "name is already used by other proxy '" + kind + " " + name + "'.")
	}
	for _, other := range fakeSortedKeys(m.Backends) {
		if be.GUID != "" && m.Backends[other].GUID == be.GUID {
			return fakeErr(failed + "GUID insertion : duplicate entry with backend " + other + ".")
		}
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
	return fakeMsg(6, "Backend unpublished.")
}

func (f *FakeHAProxy) delBackend(args []string, payload *string) fakeOut {
	if len(args) > 1 {
		return fakeErr("Usage: del backend <name>.")
	}
	return fakeBackendCommand(func(f *FakeHAProxy, name string, be *FakeBackend) fakeOut {
		if why := fakeBackendNotRemovable(be); why != "" {
			return fakeErr(why)
		}
		delete(f.model.Backends, name)
		return fakeMsg(6, "Backend deleted.")
	})(f, args, payload)
}
