// This file owns the agent's process shape: its configuration and the
// validation NewAgent runs, the listeners, Run and its error group, startup,
// and the HTTP handlers except the apply pipeline (agent_apply.go).
// Authentication is in agent_auth.go, the persistent state in
// agent_ledger.go, the file store in agent_files.go, and whether HAProxy is
// reachable after startup in agent_haproxy_watch.go.
//
// It must never make an HAProxy decision (the controller does, through Diff)
// and never panic: a broken invariant is counted, logged and reported.

package haptic

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// AgentConfig configures one agent. BaseDir is required. Empty file and
// socket names of HAProxy and the state file, the listen address and zero
// durations get the defaults DefaultAgentConfig lists. AdminSocket,
// DrainSocket, MetricsListen and TLSDir stay off when empty, and
// ReloadIntervalMin 0 paces nothing, although `haptic agent` turns the
// first three on by default (with ReloadIntervalMin 5s and BaseDir
// /etc/haproxy): a program that embeds agents (tests run many in one
// process) binds only the listeners it asks for, and no two of them fight
// over :9101.
//
// NewAgent resolves the local paths as ResolvePaths says.
type AgentConfig struct {
	BaseDir              string        // --base-dir
	ConfigFile           string        // --config; manifest path of the HAProxy config
	MasterSocket         string        // --master-socket
	WorkerSocket         string        // --worker-socket
	StateFile            string        // --state-file
	Listen               string        // --listen: the API's TCP address
	MetricsListen        string        // --metrics-listen; "" serves no metrics
	TLSDir               string        // --tls-dir; "" means no TLS
	TLSClientName        string        // --tls-client-name: the DNS SAN a client certificate must carry
	Username, Password   string        // DATAPLANE_USERNAME, DATAPLANE_PASSWORD
	InsecureNoAuth       bool          // --insecure-no-auth: start with no authentication; no effect beside TLS or credentials
	ReloadIntervalMin    time.Duration // --reload-interval-min: the pacing window, at most 60s; 0 paces nothing
	ReloadTimeout        time.Duration // --reload-timeout: one whole reload; 0 means 60s, also the most
	AdminSocket          string        // --admin-socket; "" means none
	DrainSocket          string        // --drain-socket; "" means none
	DrainQuietPeriod     time.Duration // --drain-quiet-period; 0 means 2s
	DrainMaxWait         time.Duration // --drain-max-wait; 0 means 10s
	DrainIgnoreFrontends []string      // --drain-ignore-frontend: frontends the drain's counter leaves out
	FileMode             os.FileMode   // --file-mode: the mode of every file written into the tree; 0 means 0640 (no access for others)
	AgentVersion         string        // reported as agent_version; "" means "dev"
	Logger               *slog.Logger  // nil means slog.Default()
}

// Fixed values of the agent's process shape.
const (
	defaultStateFile     = ".haptic-agent.json"
	maxDrainMaxWait      = 5 * time.Minute
	maxUnixSocketPath    = 107
	probeInterval        = 200 * time.Millisecond
	serverGrace          = 15 * time.Second
	stateIdentityTimeout = time.Second // a worker that does not answer a state read's question within it is not vouched for
	msgAgentInitialising = "agent is initialising"
)

// localSocketMode is the mode of the admin and drain sockets, which never
// authenticate: only the agent's own user may connect, which their callers
// (`haptic agent state`, `health` and `drain`, the preStop hooks of both
// containers) are: the pod's shared uid, or root beside a systemd-managed
// HAProxy. A drain socket open to every local user let any of them hold its
// connection cap, and a preStop drain then took 11.3 s instead of 2 s.
const localSocketMode = 0o600

// agentPaths are the resolved local paths of one agent.
type agentPaths struct {
	config, state, master, worker, admin, drain, planBlob, log string
}

// Agent is one running HAPTIC agent. Build it with NewAgent and run it once
// with Run.
type Agent struct {
	cfg      AgentConfig
	logger   *slog.Logger
	paths    agentPaths
	files    *fileStore
	rt       *haproxyRuntime
	queue    *deleteQueue
	metrics  *agentMetrics
	tls      *tlsMaterial // nil without --tls-dir
	led      *ledger
	deps     *applyDeps
	reads    *readBacks
	loaded   *loadedLog                // what the log said at startup, until initialise has recovered it
	treeLock *os.File                  // the tree's lock (lockTree), held until Run returns
	authFail *authFailures             // failed authentication: counted, logged, budgeted per address
	limits   map[string]listenerLimits // per listener name; tests shorten them before Run

	apiLn, metricsLn, adminLn, drainLn net.Listener

	ran         atomic.Bool
	memory      *memoryBudget // the request bytes held in memory, and the decodes
	initialized chan struct{}
	drainStop   chan struct{}
	haproxy     haproxyWatch  // reaching HAProxy now (agent_haproxy_watch.go)
	paceWindow  time.Duration // paceWindow; tests shorten it
	rehashedAt  time.Time     // when the last verified read's re-hash that did not fail started; under the apply lock

	// clockOffset moves the agent's clock in tests (the known-bad cache's
	// 60 seconds); production never sets it.
	clockOffset atomic.Int64
}

// agentOptions are what internal tests may replace before an agent is
// built (the disk, the mount table); production uses the zero value.
type agentOptions struct {
	disk      disk
	mountInfo string
	// logZeroAhead: 0 is the package's; the power-loss simulation keeps
	// fewer zeros, as every disk image it forks copies them.
	logZeroAhead int64
}

func (a *Agent) now() time.Time {
	return time.Now().Add(time.Duration(a.clockOffset.Load()))
}

// NewAgent validates cfg, builds the file store, loads the state and binds
// the listeners. It does not contact HAProxy: the agent must start before
// HAProxy answers.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	return newAgent(cfg, agentOptions{})
}

func newAgent(cfg AgentConfig, opts agentOptions) (*Agent, error) {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	fillAgentDefaults(&cfg)
	if err := validateAgentConfig(&cfg); err != nil {
		return nil, err
	}
	opts.disk = cmp.Or[disk](opts.disk, osDisk{})
	a := &Agent{
		cfg:         cfg,
		logger:      cfg.Logger,
		initialized: make(chan struct{}),
		memory:      newMemoryBudget(),
		limits:      defaultListenerLimits(cfg.DrainMaxWait),
		drainStop:   make(chan struct{}),
		metrics:     newAgentMetrics(cfg.AgentVersion),
		paceWindow:  paceWindow,
	}
	a.authFail = newAuthFailures(cfg.Logger, func(scheme string) { a.metrics.authFailures.inc(scheme) })
	var err error
	if cfg.TLSDir != "" {
		if a.tls, err = loadTLSMaterial(cfg.TLSDir, cfg.Logger, a.now); err != nil {
			return nil, fmt.Errorf("--tls-dir: %w", err)
		}
	}
	a.warnAboutAuth()
	if a.paths, err = resolveAgentPaths(&cfg); err != nil {
		return nil, err
	}
	paths := a.paths
	a.files, err = newFileStore(fileStoreConfig{Base: cfg.BaseDir, Config: cfg.ConfigFile, FileMode: cfg.FileMode,
		Logger: cfg.Logger, Disk: opts.disk, MountInfo: opts.mountInfo,
		// The admin and drain socket names `haptic agent` binds by default
		// are reserved too, even on an agent that binds other paths or
		// none: a file there would refuse its socket to the next agent
		// started with the defaults.
		Reserved: []string{paths.master, paths.worker, paths.admin, paths.drain, paths.state, paths.log, paths.planBlob,
			filepath.Join(cfg.BaseDir, "haptic-agent.sock"), filepath.Join(cfg.BaseDir, "haptic-drain.sock")}})
	if err != nil {
		return nil, fmt.Errorf("--base-dir: %w", err)
	}
	for _, p := range []string{paths.state, paths.planBlob, paths.log} {
		if err := checkOwnedPath(opts.disk, p, false); err != nil {
			return nil, fmt.Errorf("--state-file: %w", err)
		}
	}
	a.rt = newHAProxyRuntime(runtimeConfig{WorkerSocket: paths.worker, MasterSocket: paths.master, Logger: cfg.Logger,
		ReloadTimeout: cfg.ReloadTimeout})
	a.queue = newDeleteQueue(a.rt, func(kind, outcome string) { a.metrics.deferredDeletes.inc(kind, outcome) })
	if a.treeLock, err = lockTree(a.files.base); err != nil {
		return nil, err
	}
	if a.led, a.loaded, err = newLedger(opts.disk, paths.state, paths.planBlob, cmp.Or(opts.logZeroAhead, logZeroAhead), cfg.Logger); err != nil {
		a.treeLock.Close()
		return nil, err
	}
	a.deps = &applyDeps{led: a.led, files: a.files, rt: a.rt, queue: a.queue,
		metrics: a.metrics, logger: cfg.Logger, now: a.now,
		reloadIntervalMin: cfg.ReloadIntervalMin, ctx: context.Background(), wake: make(chan struct{}, 1)}
	a.reads = &readBacks{deps: a.deps}
	if err := a.bindListeners(); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// DefaultAgentConfig returns the values NewAgent gives the fields left
// empty or zero, which are also the flag defaults of `haptic agent`. The
// other fields have none here (AgentConfig says why).
func DefaultAgentConfig() AgentConfig {
	return AgentConfig{
		ConfigFile:       ConfigFilePath,        // the manifest path of the HAProxy config
		MasterSocket:     "haproxy-master.sock", // HAProxy's master CLI
		WorkerSocket:     "haproxy-worker.sock", // its worker stats socket
		StateFile:        defaultStateFile,      // the plan blob and the log live beside it
		Listen:           ":5555",
		ReloadTimeout:    MaxReloadMs * time.Millisecond, // the longest a reload may take
		DrainQuietPeriod: 2 * time.Second,
		DrainMaxWait:     10 * time.Second,
		AgentVersion:     "dev",
	}
}

// fillAgentDefaults fills from DefaultAgentConfig all but the drain's
// window, which validateDrain fills where it checks it.
func fillAgentDefaults(cfg *AgentConfig) {
	def := DefaultAgentConfig()
	cfg.ConfigFile = cmp.Or(cfg.ConfigFile, def.ConfigFile)
	cfg.MasterSocket = cmp.Or(cfg.MasterSocket, def.MasterSocket)
	cfg.WorkerSocket = cmp.Or(cfg.WorkerSocket, def.WorkerSocket)
	cfg.StateFile = cmp.Or(cfg.StateFile, def.StateFile)
	cfg.Listen = cmp.Or(cfg.Listen, def.Listen)
	cfg.AgentVersion = cmp.Or(cfg.AgentVersion, def.AgentVersion)
	cfg.ReloadTimeout = cmp.Or(cfg.ReloadTimeout, def.ReloadTimeout)
}

// validateAgentConfig checks a filled configuration before anything on
// disk is touched, so that a misconfigured agent fails at start instead of
// at its first apply.
func validateAgentConfig(cfg *AgentConfig) error {
	pathErr := validatePath(cfg.ConfigFile)
	maxTimeout := MaxReloadMs * time.Millisecond
	quiet, maxWait, drainErr := validateDrain(cfg.DrainQuietPeriod, cfg.DrainMaxWait)
	switch {
	case cfg.BaseDir == "":
		return errors.New("--base-dir is required")
	case pathErr != nil:
		return fmt.Errorf("--config: %w", pathErr)
	case cfg.ReloadIntervalMin < 0 || cfg.ReloadIntervalMin > MaxReloadIntervalMs*time.Millisecond:
		return fmt.Errorf("--reload-interval-min %s is outside 0..60s", cfg.ReloadIntervalMin)
	case cfg.ReloadTimeout < 0 || cfg.ReloadTimeout > maxTimeout:
		return fmt.Errorf("--reload-timeout must be between 0 and %s, got %s", maxTimeout, cfg.ReloadTimeout)
	case drainErr != nil:
		return drainErr
	case cfg.FileMode != 0 && (cfg.FileMode&^0o777 != 0 || cfg.FileMode&0o400 == 0):
		// The agent re-reads every file it wrote: its owner must read it.
		return fmt.Errorf("--file-mode %#o is outside 0400..0777 or not readable by its owner", uint32(cfg.FileMode))
	case cfg.TLSDir != "" && cfg.TLSClientName == "":
		return errors.New("--tls-client-name is required with --tls-dir")
	case cfg.TLSDir != "":
	case (cfg.Username == "") != (cfg.Password == ""):
		return errors.New("DATAPLANE_USERNAME and DATAPLANE_PASSWORD must be set together")
	case cfg.Username == "" && !cfg.InsecureNoAuth:
		return errors.New("no authentication configured: use --tls-dir, or set DATAPLANE_USERNAME and DATAPLANE_PASSWORD, or pass --insecure-no-auth")
	}
	cfg.DrainQuietPeriod, cfg.DrainMaxWait = quiet, maxWait
	return nil
}

// validateDrain fills the drain window's defaults and checks it.
func validateDrain(quiet, maxWait time.Duration) (time.Duration, time.Duration, error) {
	def := DefaultAgentConfig()
	quiet, maxWait = cmp.Or(quiet, def.DrainQuietPeriod), cmp.Or(maxWait, def.DrainMaxWait)
	switch {
	case quiet < 0:
		return 0, 0, fmt.Errorf("--drain-quiet-period must not be negative, got %s", quiet)
	case maxWait < 0:
		return 0, 0, fmt.Errorf("--drain-max-wait must not be negative, got %s", maxWait)
	case maxWait > maxDrainMaxWait:
		return 0, 0, fmt.Errorf("--drain-max-wait must be at most %s, got %s", maxDrainMaxWait, maxWait)
	case quiet > maxWait:
		return 0, 0, fmt.Errorf("--drain-quiet-period %s exceeds --drain-max-wait %s", quiet, maxWait)
	}
	return quiet, maxWait, nil
}

// warnAboutAuth logs the configurations that work but are probably not
// what the operator meant.
func (a *Agent) warnAboutAuth() {
	cfg := &a.cfg
	basic := cfg.Username != "" || cfg.Password != ""
	if cfg.TLSDir != "" && basic {
		a.logger.Warn("DATAPLANE_USERNAME/DATAPLANE_PASSWORD are ignored: --tls-dir turns on mutual TLS")
	}
	switch {
	case cfg.InsecureNoAuth && (cfg.TLSDir != "" || basic):
		a.logger.Warn("--insecure-no-auth has no effect: authentication is configured")
	case cfg.InsecureNoAuth:
		a.logger.Warn("the API accepts every request: --insecure-no-auth is set and no authentication is configured")
	}
	// Basic credentials travel in every request: without TLS, anyone on
	// the network path reads the password. On loopback nobody else does.
	if basic && cfg.TLSDir == "" && !loopbackAddr(cfg.Listen) {
		a.logger.Warn("the API takes HTTP Basic credentials without TLS on a non-loopback address, so they cross the network in clear text: "+
			"use --tls-dir, or --listen on 127.0.0.1 or [::1]", "listen", cfg.Listen)
	}
}

// loopbackAddr reports whether a listen address is on loopback only: a
// loopback IP, or localhost. An empty host is every interface.
func loopbackAddr(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	return err == nil && (host == "localhost" || net.ParseIP(host).IsLoopback()) // nil, not an IP, is no loopback
}

// pathFlags lists c's file and socket paths with their flags, in the order
// NewAgent refuses two that coincide: the config file's manifest path
// first, then the local paths.
func (c *AgentConfig) pathFlags() []pathFlag {
	return []pathFlag{
		{"config", &c.ConfigFile}, {"state-file", &c.StateFile}, {"master-socket", &c.MasterSocket},
		{"worker-socket", &c.WorkerSocket}, {"drain-socket", &c.DrainSocket}, {"admin-socket", &c.AdminSocket},
	}
}

type pathFlag struct {
	flag string
	path *string
}

// ResolvePaths returns c with its local paths (MasterSocket, WorkerSocket,
// StateFile, AdminSocket, DrainSocket) resolved as NewAgent resolves them:
// relative to BaseDir unless absolute, and absolute, a relative BaseDir
// being read against the working directory. An empty path stays empty (a
// socket left off, a name NewAgent fills with its default); BaseDir and
// ConfigFile, a manifest path, are left as given. Resolving twice changes
// nothing, so a caller may resolve before NewAgent (to log or check where
// the agent will put its sockets) without moving them to base/base.
func (c AgentConfig) ResolvePaths() (AgentConfig, error) {
	r, err := c.resolved()
	r.ConfigFile = c.ConfigFile
	return r, err
}

// resolved is c with every path of pathFlags resolved by ResolvePaths'
// rule, the config file's too: a manifest path, always under the base.
func (c AgentConfig) resolved() (AgentConfig, error) {
	base, err := filepath.Abs(c.BaseDir)
	if err != nil {
		return c, fmt.Errorf("--base-dir: %w", err)
	}
	for _, f := range c.pathFlags() {
		switch {
		case *f.path == "":
		case filepath.IsAbs(*f.path):
			*f.path = filepath.Clean(*f.path)
		default:
			*f.path = filepath.Join(base, *f.path)
		}
	}
	return c, nil
}

// resolveAgentPaths resolves every path and refuses two that coincide: the
// agent would bind a socket over its own state, or two listeners on one
// file.
func resolveAgentPaths(cfg *AgentConfig) (agentPaths, error) {
	r, err := cfg.resolved()
	if err != nil {
		return agentPaths{}, err
	}
	fields := r.pathFlags()
	for i, b := range fields {
		for _, e := range fields[:i] {
			if *b.path != "" && *e.path == *b.path {
				return agentPaths{}, fmt.Errorf("--%s and --%s share %s; choose distinct file and socket paths", e.flag, b.flag, *b.path)
			}
		}
	}
	for _, f := range []struct{ flag, path string }{{"admin-socket", r.AdminSocket}, {"drain-socket", r.DrainSocket}} {
		if len(f.path) > maxUnixSocketPath {
			return agentPaths{}, fmt.Errorf("--%s: %s exceeds the %d-byte unix socket path limit", f.flag, f.path, maxUnixSocketPath)
		}
	}
	return agentPaths{config: r.ConfigFile, state: r.StateFile, master: r.MasterSocket, worker: r.WorkerSocket,
		admin: r.AdminSocket, drain: r.DrainSocket,
		planBlob: filepath.Join(filepath.Dir(r.StateFile), planBlobFile), log: logPathFor(r.StateFile)}, nil
}

// bindListeners binds, in order, the API, metrics, admin and drain
// listeners. When a later one fails, newAgent's close releases those
// already bound.
func (a *Agent) bindListeners() (err error) {
	if a.apiLn, err = net.Listen("tcp", a.cfg.Listen); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if a.cfg.MetricsListen != "" {
		if a.metricsLn, err = net.Listen("tcp", a.cfg.MetricsListen); err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	if a.paths.admin != "" {
		if a.adminLn, err = listenUnix("admin-socket", a.paths.admin); err != nil {
			return err
		}
	}
	if a.paths.drain != "" {
		a.drainLn, err = listenUnix("drain-socket", a.paths.drain)
	}
	return err
}

// close releases what NewAgent took: the listeners (those a server
// already closed are closed again, harmlessly), the state and the tree lock.
func (a *Agent) close() {
	for _, ln := range []net.Listener{a.apiLn, a.metricsLn, a.adminLn, a.drainLn} {
		if ln != nil {
			ln.Close()
		}
	}
	a.led.close()
	a.treeLock.Close()
}

// listenUnix binds a local agent socket with localSocketMode, replacing a
// stale socket file but never a file of another kind. Closing the listener
// (Run's shutdown, close) removes the socket file.
func listenUnix(flag, path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("--%s: %w", flag, err)
	case fi.Mode()&os.ModeSocket == 0:
		return nil, fmt.Errorf("local agent socket %s is occupied by a non-socket file; choose another path", path)
	default:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--%s: %w", flag, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	if err := os.Chmod(path, localSocketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return ln, nil
}

// Addr returns the TCP address the API listener is bound to.
func (a *Agent) Addr() string { return a.apiLn.Addr().String() }

// Ready reports whether initialisation has finished. Once true it stays true.
func (a *Agent) Ready() bool {
	select {
	case <-a.initialized:
		return true
	default:
		return false
	}
}

// Run serves until ctx ends, then shuts every server down with its grace,
// waits for background read-backs and returns. A cancelled Run returns nil;
// an error from initialisation ends Run with that error.
func (a *Agent) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("haptic: an Agent runs only once")
	}
	// The first error ends the run: it cancels every goroutine's context.
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.deps.ctx = gctx
	var wg sync.WaitGroup
	var once sync.Once
	var err error
	fail := func(e error) {
		if e != nil {
			once.Do(func() {
				err = e
				cancel()
			})
		}
	}

	wg.Go(func() { a.queue.start(gctx) })
	wg.Go(func() { every(gctx, pacerInterval, a.deps.wake, func() { a.fireScheduled(gctx) }) })
	wg.Go(func() { fail(a.initialise(gctx)) })
	wg.Go(func() { a.watchHAProxy(gctx) })
	a.serve(gctx, &wg, fail)
	wg.Wait()

	a.reads.stop()
	// The apply lock waits for an apply still in flight (its server was
	// shut down with a grace), so the state is closed between two runs;
	// after a clean stop the state file alone holds it.
	a.deps.applyMu.Lock()
	if a.Ready() {
		a.deps.compact()
	}
	a.close()
	a.deps.applyMu.Unlock()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// serve starts, on wg, a server on each bound listener with its own limits
// and connection cap (agent_listeners.go); once gctx ends, each shuts down
// with its own grace, after which a drain still running answers cancelled.
// A server that fails fails the run.
func (a *Agent) serve(gctx context.Context, wg *sync.WaitGroup, fail func(error)) {
	ignore := drainIgnoreSet(a.cfg.DrainIgnoreFrontends)
	d := newDrainer(func(ctx context.Context) (uint64, error) { return a.rt.frontendConnections(ctx, ignore) },
		a.cfg.DrainQuietPeriod, a.cfg.DrainMaxWait, a.drainStop)
	for _, s := range []struct {
		name  string
		ln    net.Listener
		mux   *http.ServeMux
		grace time.Duration
	}{
		{listenerAPI, a.apiLn, a.apiMux(), serverGrace},
		// The probes too: with mutual TLS the API port completes no
		// handshake without a client certificate, which a kubelet's probe
		// cannot present.
		{listenerMetrics, a.metricsLn, muxOf(map[string]http.HandlerFunc{"GET /metrics": a.handleMetrics,
			"GET " + PathHealthz: a.handleHealthz, "GET " + PathReadyz: a.handleReadyz}), serverGrace},
		{listenerAdmin, a.adminLn, muxOf(map[string]http.HandlerFunc{"GET " + PathHealthz: a.handleHealthz,
			"GET " + PathState: a.handleState}), serverGrace},
		{listenerDrain, a.drainLn, muxOf(map[string]http.HandlerFunc{"GET " + PathDrain: func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, d.drain(r.Context()))
		}}), a.cfg.DrainMaxWait + serverGrace},
	} {
		if s.ln == nil {
			continue
		}
		base := gctx
		if s.name == listenerDrain {
			// Not the group's context: an in-flight drain finishes within
			// its grace instead of ending the moment the agent stops.
			base = context.WithoutCancel(gctx)
		}
		s.ln = a.capped(s.name, s.ln)
		if s.name == listenerAPI && a.tls != nil {
			s.ln = tls.NewListener(s.ln, a.tls.serverConfig()) // under the cap, so that a handshake holds a slot too
		}
		srv := a.newServer(s.name, s.mux, func(net.Listener) context.Context { return base })
		wg.Go(func() {
			if err := srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fail(fmt.Errorf("%s server: %w", s.name, err))
			}
		})
		wg.Go(func() {
			<-gctx.Done()
			ctx, cancel := context.WithTimeout(context.Background(), s.grace)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				a.logger.Warn("server did not stop within its grace", "server", s.name, "err", err)
				srv.Close()
			}
			if s.name == listenerDrain {
				close(a.drainStop)
			}
		})
	}
}

// initialise brings the agent to readiness: recover the disk (recoverDisk),
// probe HAProxy until it answers and keep what the worker still proves,
// reload when the worker may hold what no record explains, and start a
// fresh snapshot.
func (a *Agent) initialise(ctx context.Context) error {
	st, hashed, reload, owed, err := recoverDisk(a.files, a.led, a.loaded, a.logger, a.now())
	a.loaded = nil
	if err != nil {
		return err
	}
	sweepStateTemps(a.files.disk, a.paths.state, a.logger)
	info, inv, err := a.probeUntilReady(ctx)
	if err != nil {
		return err
	}
	a.led.restart(workerAtStart(st, info), hashed, inv)
	a.queue.setWorker(info)
	a.deps.applyMu.Lock()
	switch {
	case owed != nil:
		// HAProxy loads the tree once recovery could put all of it back.
		owed.reload = reload
		a.deps.owe(owed)
	case reload:
		a.deps.reloadRecovered(ctx)
	}
	if err := a.deps.compact(); err != nil {
		a.logger.Warn(msgStartupCompactFailed, "err", err) // not ready until a retry can
		a.deps.retryOwed()
	}
	a.deps.applyMu.Unlock()
	close(a.initialized)
	a.memory.handBackWhenIdle() // the start decoded the stored plan
	a.logger.Info("agent ready", "worker_pid", info.WorkerPID, "haproxy", info.Version)
	return nil
}

// recoverDisk is the part of the start that needs only the disk. It puts
// every path a record since the snapshot touched back as the replayed log
// says it must be: a counted apply's files, an undone or unclosed one's
// earlier bytes. With a damaged log it keeps the tree as it stands and
// forgets the baseline instead. Then it hashes the tree and keeps what
// it still proves. reload: the worker may hold an unclosed apply's ops or
// files, or (HAProxy may boot before the agent after a power loss) the tree
// it loaded is not the one recovery left. owed: what recovery could not put
// back (a full disk, say): the recorded tree stands, answered applies
// included, and the agent retries it.
func recoverDisk(files *fileStore, led *ledger, loaded *loadedLog, logger *slog.Logger, now time.Time) (st agentState, tree map[string]FileAt, reload bool, owed *owedTree, err error) {
	st, recorded := led.view()
	switch {
	case loaded.damage != "":
		logger.Error("the agent's history cannot be acted on; it is set aside, the tree is kept as it stands and the baseline is forgotten, so the next push reloads",
			"damaged", loaded.damage)
		st = damagedAtStart(st)
	case len(loaded.touched) > 0:
		t := restoreSet{wants: make([]want, len(loaded.touched)), sources: loaded.sources}
		for i, p := range loaded.touched {
			t.wants[i] = want{Path: p}
			if at, ok := recorded[p]; ok {
				t.wants[i].At = &at
			}
			if abs, err := files.abs(p); err == nil {
				files.noteDirty(abs, filepath.Dir(abs)) // the start's snapshot drops the records that could redo it
			}
		}
		// First the journal's backups, while the tree may still hold the
		// bytes the backups lost.
		if err := files.repairBackups(append(slices.Clone(st.Journal), st.PendingUndo...), loaded.sources); err != nil {
			logger.Error("recovery could not make every journal backup whole; a revert to the last-known-good set would fail for those paths", "err", err)
		}
		changed, err := files.putBack(t)
		if err != nil {
			logger.Error("recovery could not put every file back", "err", err)
			// Where every copy is still there, the disk only failed to
			// write it (full, failing).
			if files.restorable(t) {
				owed = &owedTree{restoreSet: t, err: err}
			}
		}
		if changed {
			logger.Warn("files a crash left behind were put back as the log says; HAProxy reloads them")
			st.TreeChangedAt = now
		}
		reload = changed
	}
	if loaded.reload && loaded.damage == "" {
		logger.Warn("an apply was interrupted; HAProxy reloads the tree")
		reload = true
	}
	if loaded.torn > 0 && loaded.damage == "" {
		logger.Warn(msgLogEndedTorn, "last_record", loaded.seq, "bytes_cut", loaded.torn)
	}
	if !loaded.fresh {
		st.ProofGeneration += min(proofsALostTailMayHold, math.MaxUint64-st.ProofGeneration)
	}
	if owed != nil {
		return st, recorded, reload, owed, nil
	}
	hashed, err := files.hashTree(ownedPaths(recorded, loaded.touched))
	if err != nil {
		return st, nil, false, nil, err
	}
	return treeAtStart(st, recorded, hashed), hashed, reload, nil, nil
}

// The start's warnings: it cannot write a new snapshot of its state, and its
// log's last record was cut off (normal after a crash in the middle of a
// write, and the only trace of a disk that lost a synced one).
const (
	msgStartupCompactFailed = "could not compact the agent's state at startup"
	msgLogEndedTorn         = "the agent's log ended torn: the bytes after its last whole record are cut off; a change written there was never answered, or, on a disk that lost a synced write, was answered and is lost"
)

// sweepStateTemps removes the temp files a crash in the middle of writing
// the state snapshot or the plan blob left beside them.
func sweepStateTemps(d disk, statePath string, logger *slog.Logger) {
	dir := filepath.Dir(statePath)
	entries, err := d.ReadDir(dir, MaxFiles)
	if err != nil {
		return
	}
	for _, e := range entries {
		if matched, _ := filepath.Match(stateTempPattern, e.Name()); matched {
			if err := d.Remove(filepath.Join(dir, e.Name())); err != nil {
				logger.Warn("could not remove a leftover state temp file", "path", filepath.Join(dir, e.Name()), "err", err)
			}
		}
	}
}

// probeUntilReady asks HAProxy every 200 ms until the worker, the master and
// the inventory all answer in one round. There is no deadline.
func (a *Agent) probeUntilReady(ctx context.Context) (HAProxyInfo, Inventory, error) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	var lastErr string
	for {
		info, inv, err := a.rt.probe(ctx)
		if err == nil && !info.HasWorkerIdentity() {
			err = errors.New("show info: the worker reports no identity")
		}
		a.setWaiting(err)
		if err == nil {
			return info, inv, nil
		}
		if err.Error() != lastErr {
			lastErr = err.Error()
			a.logger.Info("waiting for HAProxy", "err", err)
		}
		select {
		case <-ctx.Done():
			return HAProxyInfo{}, Inventory{}, ctx.Err()
		case <-t.C:
		}
	}
}

// apiMux routes the network API; serve routes the other listeners.
func (a *Agent) apiMux() *http.ServeMux {
	return muxOf(map[string]http.HandlerFunc{
		"GET " + PathHealthz: a.handleHealthz,
		"GET " + PathReadyz:  a.handleReadyz,
		"GET " + PathState:   a.authenticated(a.handleState),
		"POST " + PathApply:  a.authenticated(a.handleApply),
		"PUT " + PathPlan:    a.authenticated(a.handlePutPlan),
	})
}

func muxOf(routes map[string]http.HandlerFunc) *http.ServeMux {
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.HandleFunc(pattern, h)
	}
	return mux
}

// writeText answers a text body with one trailing newline.
func writeText(w http.ResponseWriter, code int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	io.WriteString(w, s+"\n")
}

// writeJSON answers a JSON body with one trailing newline. Its length is
// announced, so that a client has the whole answer as soon as it is
// flushed, even while the handler goes on (an apply installs its files
// after it answered).
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeText(w, http.StatusInternalServerError, "the agent could not encode its answer")
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	w.Write(b)
}

func writeError(w http.ResponseWriter, code int, stage, message string) {
	writeJSON(w, code, ApplyError{Stage: stage, Message: message})
}

func (a *Agent) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (a *Agent) handleMetrics(w http.ResponseWriter, r *http.Request) {
	broken, behind, _ := a.led.faults()
	a.metrics.stateLogBroken.set(uint64(boolInt(broken != nil)))
	a.metrics.diskBehind.set(uint64(boolInt(behind != nil)))
	a.metrics.lateMount.set(uint64(boolInt(a.files.lateMount() != nil)))
	a.metrics.generation.set(a.led.state().Generation)
	w.Header().Set("Content-Type", metricsContentType)
	if err := a.metrics.writeText(w); err != nil {
		a.logger.Warn("writing metrics failed", "err", err)
	}
}

// handleState answers GET /v1/state: after initialisation, optionally after
// re-hashing the tree and re-checking the worker (verify=1). Before
// initialisation it answers 503 with what the agent waits for
// (awaitInitialised), so that an operator learns at once that HAProxy is
// not there. A verified read that cannot reach HAProxy answers 503: it
// must not vouch for a worker that is gone.
func (a *Agent) handleState(w http.ResponseWriter, r *http.Request) {
	if message, ok := a.awaitInitialised(r.Context()); !ok {
		return
	} else if message != "" {
		writeError(w, http.StatusServiceUnavailable, StageStartup, message)
		return
	}
	q := r.URL.Query()
	if q.Get("verify") == "1" {
		if err := a.refreshTree(); err != nil {
			writeError(w, http.StatusInternalServerError, StageState, err.Error())
			return
		}
		if err := a.probeSockets(r.Context()); err != nil {
			writeError(w, http.StatusServiceUnavailable, StageState, "cannot verify: "+err.Error())
			return
		}
		if info, err := a.deps.checkWorker(r.Context()); err != nil {
			a.logger.Warn("verified state read: worker check", "err", err)
			if !info.HasWorkerIdentity() {
				// A foreign worker is adopted and reported; a worker that
				// does not answer cannot be.
				writeError(w, http.StatusServiceUnavailable, StageState, "cannot verify the HAProxy worker: "+err.Error())
				return
			}
		}
	}
	st := a.led.stateAnswer(a.cfg.AgentVersion, q.Get("plan") != "0", a.queue.pending())
	// Every read asks the worker who it is (a tenth of a millisecond): the
	// answer vouches for the running and worker-ops plans only while the
	// worker answering is the one they were recorded for. A plain read
	// never adopts (a reload may be changing the worker right now); it only
	// withholds what it cannot vouch for.
	ctx, cancel := context.WithTimeout(r.Context(), stateIdentityTimeout)
	info, err := a.rt.info(ctx)
	cancel()
	if err != nil || !st.HAProxy.SameWorker(info) {
		st.HAProxy, st.RunningPlanID, st.RunningPlanProof, st.WorkerOpsPlanID, st.WorkerOpsPlanProof = info, "", "", "", ""
	}
	a.writeState(w, r, st)
}

// writeState answers json.Marshal(st) and a newline, but the stored plan's
// blob is base64-encoded from the ledger's own copy as it goes out, at the
// reader's pace; only the rest is marshalled, held in the memory budget.
// 200 readers that read nothing held 2 GB when each answer was marshalled.
func (a *Agent) writeState(w http.ResponseWriter, r *http.Request, st State) {
	blob := st.AppliedPlan
	st.AppliedPlan = nil
	rest, _ := json.Marshal(st) // strings, numbers and maps of them: it cannot fail
	rest = append(rest, '\n')
	at := len(rest)
	if len(blob) > 0 { // encoding/json writes the blob as a base64 string just before this field
		at = bytes.Index(rest, []byte(`"applied_plan_stored":`)) + len(`"applied_plan":"`)
		rest = slices.Insert(rest, at-len(`"applied_plan":"`), []byte(`"applied_plan":"",`)...)
	}
	held := a.hold(w, r, true)
	defer held.release()
	if err := held.take(len(rest) + chunkBytes); err != nil {
		writeError(w, clientFaultStatus(err), StageState, err.Error())
		return
	}
	size := len(rest) + base64.StdEncoding.EncodedLen(len(blob))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(held, chunkBytes) // its ReadFrom, unlike Write, hands held a chunk at a time
	out.ReadFrom(bytes.NewReader(rest[:at]))
	enc := base64.NewEncoder(base64.StdEncoding, out)
	enc.Write(blob)
	enc.Close()
	out.ReadFrom(bytes.NewReader(rest[at:]))
	if out.Flush(); size >= bigWorkBytes {
		a.memory.handBackWhenIdle()
	}
}

// refreshTree re-hashes the ownership set and adopts the observation,
// keeping the proof of every entry whose digest and size did not change. It
// holds the apply lock: an apply installs its files after its answer, and
// an observation taken before they are in place would forget them. A read
// that finds a re-hash started since it arrived is served by that one: 200
// looping verified readers, each re-hashing, made a big push 3x slower.
func (a *Agent) refreshTree() error {
	arrived := time.Now()
	a.deps.applyMu.Lock()
	defer a.deps.applyMu.Unlock()
	defer a.deps.compactIfDue() // the observation may write a record
	if a.rehashedAt.After(arrived) {
		return nil
	}
	started := time.Now()
	paths, version := a.led.observed()
	fresh, err := a.files.hashTree(paths)
	if err != nil {
		return err
	}
	a.rehashedAt = started
	a.led.refreshed(fresh, version)
	return nil
}

// checkPlanBlob admits a plan blob only when it decodes within the plan
// limits and holds the plan planID: the id it carries is planID, and so is
// the digest of its content. The agent hands a stored blob to every
// controller that reads its state as the baseline of its next diff, so a
// blob that does not decode (garbage, a zstd bomb that inflates past
// MaxPlanJSONBytes) or holds another plan would make each of them reload
// for want of a baseline, or diff against a plan the pod does not run. It
// returns the plan's canonical JSON, which the agent keeps as the base of
// the next plan patch.
func checkPlanBlob(blob []byte, planID string) ([]byte, error) {
	p, err := DecodePlanBlob(blob)
	if err != nil {
		return nil, errors.New("plan blob does not decode: " + strings.TrimPrefix(err.Error(), "haptic: plan blob: "))
	}
	js := p.Canonical()
	if id := Digest(js); p.ID != planID || id != planID {
		return nil, fmt.Errorf("plan blob holds plan %q (its content hashes to %q), not plan %q", p.ID, id, planID)
	}
	return js, nil
}

// readPlan reads a plan part or body of at most MaxPlanBlobBytes, checks it
// in a decode slot, and holds its JSON in the request's share of the memory
// budget, taken in the slot: only one decode at a time holds bytes the
// budget does not count yet. An empty one is no plan: nil, nil.
func (a *Agent) readPlan(held *heldBytes, r io.Reader, contentType, planID string) (up *planUpload, err error) {
	b, err := io.ReadAll(io.LimitReader(held.reader(r), MaxPlanBlobBytes+1))
	switch {
	case err != nil || len(b) == 0:
		return nil, err
	case len(b) > MaxPlanBlobBytes:
		return nil, fmt.Errorf("plan blob exceeds the %d-byte limit", MaxPlanBlobBytes)
	}
	err = held.decode(func() error {
		if up, err = a.led.takePlan(b, contentType, planID); err == nil {
			err = held.take(len(up.json))
		}
		return err
	})
	return up, err
}

// handlePutPlan stores the plan of the applied pair: its blob, or a
// PlanPatch of the plan the agent holds. The plan is checked outside the
// apply lock (decoding a big plan takes a while), and stored under it: a
// plan recorded while an apply runs would record the state from before
// that apply after its record, and a crash before its end would replay
// that older state over the apply's files. So an upload waits for the
// apply in flight, and then finds the plan moved (409) when that apply
// landed another; a patch whose base is no longer held by then is asked
// for whole (409 Missing "plan"). Like an apply, it is refused (503, or
// 507 on a full disk) while the disk owes files or the log cannot be
// compacted (applyMu says why).
func (a *Agent) handlePutPlan(w http.ResponseWriter, r *http.Request) {
	if !a.Ready() {
		writeError(w, http.StatusServiceUnavailable, StageStartup, msgAgentInitialising)
		return
	}
	q := r.URL.Query()
	ref := planRef{ID: q.Get("plan_id"), Proof: q.Get("proof")}
	if ref.ID == "" || ref.Proof == "" {
		writeError(w, http.StatusBadRequest, StageRequest, "plan_id and proof are required")
		return
	}
	if st := a.led.state(); !samePlanRef(st.Applied, ref) { // refused anyway: not worth its body
		writeJSON(w, http.StatusConflict, PlanMoved{AppliedPlanID: st.Applied.ID, AppliedPlanProof: st.Applied.Proof})
		return
	}
	held := a.hold(w, r, false)
	defer held.release()
	up, err := a.readPlan(held, r.Body, r.Header.Get("Content-Type"), ref.ID)
	if err == nil && up == nil {
		err = errors.New("plan blob is empty")
	}
	if errors.Is(err, errPlanBaseGone) {
		writeJSON(w, http.StatusConflict, Missing{Missing: []string{PartPlan}})
		return
	}
	if err != nil {
		writeError(w, clientFaultStatus(err), StagePlan, err.Error())
		return
	}
	a.deps.applyMu.Lock()
	owed := a.deps.payOwed(a.deps.ctx)
	var moved PlanMoved
	if owed == nil {
		moved, err = a.led.storePlan(ref, up)
	}
	a.deps.compactIfDue()
	a.deps.applyMu.Unlock()
	switch {
	case owed != nil:
		writeError(w, owedStatus(owed), StagePlan, owed.Error())
	case errors.Is(err, errPlanMoved):
		writeJSON(w, http.StatusConflict, moved)
	case errors.Is(err, errPlanBaseGone):
		writeJSON(w, http.StatusConflict, Missing{Missing: []string{PartPlan}})
	case err != nil:
		writeError(w, http.StatusInternalServerError, StagePlan, err.Error())
	default:
		writeJSON(w, http.StatusOK, PlanStored{PlanID: ref.ID, Proof: ref.Proof})
	}
}

// every calls f every interval, and at once on each wake (a nil wake
// never fires), until ctx ends: the loop of the pacer, the delete queue,
// the HAProxy watch and the retry of what the disk owes.
func every(ctx context.Context, interval time.Duration, wake <-chan struct{}, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		f()
	}
}
