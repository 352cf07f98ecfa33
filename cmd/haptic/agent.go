// agent.go owns `haptic agent`: flags and environment into an AgentConfig,
// the JSON logger, the Go memory limit, and the process lifetime around
// (*Agent).Run. It checks nothing NewAgent checks, so the command and a
// program embedding the agent refuse the same configurations with the same
// words. Its defaults are the upstream agent's, so that a manifest written
// for one runs the other: haptic.DefaultAgentConfig's, plus the constants
// below.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/haptic-agent/haptic"
)

// Defaults of `haptic agent` where AgentConfig's zero value is off or
// required, in one place; `agent state`, `agent health` and `agent drain`
// find the agent's sockets by them. AgentConfig keeps "empty = off" for the
// listeners and sockets, so that agents embedded in a program (tests run
// many in one process) bind only what they ask for; the command turns them
// on: reloads paced 5 s apart (a burst of renders cannot turn into a reload
// storm), metrics on :9101, the admin socket and the drain socket that
// preStop hooks call. The agent reserves the two socket names in every
// base directory, whatever it binds.
const (
	defaultBaseDir           = "/etc/haproxy"
	defaultReloadIntervalMin = 5 * time.Second
	defaultMetricsListen     = ":9101"
	defaultAdminSocket       = "haptic-agent.sock"
	defaultDrainSocket       = "haptic-drain.sock"
)

// fileModeWant is what --file-mode accepts; NewAgent refuses a mode
// outside the range in its own words.
const fileModeWant = "want an octal mode in 0400..0777, such as 0640"

// errUsage is returned by a parser that has already printed the error and
// the usage.
var errUsage = errors.New("usage error")

func runAgent(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("agent", "haptic agent [flags]\n"+
		"Subcommands, each with its own -h:\n"+
		"  haptic agent state    print the agent's state\n"+
		"  haptic agent health   exit 0 when the agent answers on its admin socket\n"+
		"  haptic agent drain    wait until HAProxy is quiet (a preStop hook)\n"+
		"Environment: DATAPLANE_USERNAME and DATAPLANE_PASSWORD (HTTP Basic), AGENT_TLS_DIR and AGENT_TLS_CLIENT_NAME\n"+
		"(--tls-dir and --tls-client-name when those are not given), LOG_LEVEL (debug, info, warn, error), GOMEMLIMIT.", s)
	cfg, err := parseAgentFlags(fs, args, s)
	if err != nil {
		return usageStatus(err)
	}
	agent, err := haptic.NewAgent(cfg)
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent: %v\n", err)
		return exitFailure
	}
	cfg.Logger.Info("agent started", "version", cfg.AgentVersion, "listen", agent.Addr(), "base_dir", cfg.BaseDir)
	setMemoryLimitFromCgroup(cfg.Logger, s.getenv, cgroupRoot, procSelfCgroup, debug.SetMemoryLimit)
	if err := agent.Run(ctx); err != nil {
		cfg.Logger.Error("agent stopped", "err", err)
		fmt.Fprintf(s.err, "haptic agent: %v\n", err)
		return exitFailure
	}
	cfg.Logger.Info("agent stopped")
	return exitOK
}

// parseAgentFlags maps the flags and the environment to an AgentConfig.
// The socket and state-file paths are resolved against --base-dir by the
// agent's own rule (ResolvePaths, which NewAgent applies again to no
// effect), so that the configuration the command holds names the files the
// agent uses. An empty --admin-socket or --drain-socket stays empty: that
// socket is off.
func parseAgentFlags(fs *flag.FlagSet, args []string, s stdio) (haptic.AgentConfig, error) {
	def := haptic.DefaultAgentConfig()
	var cfg haptic.AgentConfig
	fs.StringVar(&cfg.BaseDir, "base-dir", defaultBaseDir, "root of the owned file tree")
	fs.StringVar(&cfg.ConfigFile, "config", def.ConfigFile, "manifest path of the HAProxy config file")
	fs.StringVar(&cfg.MasterSocket, "master-socket", def.MasterSocket, "HAProxy master CLI socket (show proc, reload)")
	fs.StringVar(&cfg.WorkerSocket, "worker-socket", def.WorkerSocket, "HAProxy worker stats socket (runtime ops, inventory)")
	fs.StringVar(&cfg.Listen, "listen", def.Listen, "TCP address of the API (HTTPS with --tls-dir)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", defaultMetricsListen, `TCP address serving GET /metrics, /healthz and /readyz without auth; "" is off`)
	fs.StringVar(&cfg.TLSDir, "tls-dir", "", "directory of tls.crt, tls.key and ca.crt (and previous-ca.crt, previous-ca-until during a CA rotation); turns on mutual TLS (default $AGENT_TLS_DIR)")
	fs.StringVar(&cfg.TLSClientName, "tls-client-name", "", "DNS SAN a client certificate must carry, required with --tls-dir (default $AGENT_TLS_CLIENT_NAME)")
	fs.StringVar(&cfg.StateFile, "state-file", def.StateFile, "the agent's state file")
	fs.DurationVar(&cfg.ReloadIntervalMin, "reload-interval-min", defaultReloadIntervalMin, "minimum time between two reloads, 0s..60s")
	fs.DurationVar(&cfg.ReloadTimeout, "reload-timeout", def.ReloadTimeout, "how long a reload may take; 0 means the default")
	fs.StringVar(&cfg.AdminSocket, "admin-socket", defaultAdminSocket, `unix socket serving GET /healthz and GET /v1/state without auth; "" is off`)
	fs.StringVar(&cfg.DrainSocket, "drain-socket", defaultDrainSocket, `unix socket serving GET /drain for preStop hooks; "" is off`)
	fs.DurationVar(&cfg.DrainQuietPeriod, "drain-quiet-period", def.DrainQuietPeriod, "a drain ends once no new connection arrived for this long")
	fs.DurationVar(&cfg.DrainMaxWait, "drain-max-wait", def.DrainMaxWait, "upper bound of one drain, at most 5m")
	fs.Func("drain-ignore-frontend", "frontend left out of the drain's connection count; repeatable, comma-separated lists allowed",
		func(v string) error {
			for name := range strings.SplitSeq(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					cfg.DrainIgnoreFrontends = append(cfg.DrainIgnoreFrontends, name)
				}
			}
			return nil
		})
	fs.Func("file-mode", "octal mode of every file written into the tree, 0400..0777; directories get x where r is (default 0640: HAProxy's group reads, others nothing)",
		func(v string) error {
			mode, err := strconv.ParseUint(v, 8, 32)
			if err != nil {
				return errors.New(fileModeWant)
			}
			cfg.FileMode = os.FileMode(mode)
			return nil
		})
	fs.BoolVar(&cfg.InsecureNoAuth, "insecure-no-auth", false, "allow starting with no authentication at all")

	positional, err := parseArgs(fs, args)
	if err != nil {
		return cfg, err
	}
	if len(positional) > 0 {
		usageError(fs, "unexpected argument %q", positional[0])
		return cfg, errUsage
	}
	logger, err := newLogger(s.err, s.getenv("LOG_LEVEL"), slog.LevelInfo)
	if err == nil {
		cfg, err = cfg.ResolvePaths()
	}
	if err != nil {
		usageError(fs, "%v", err)
		return cfg, errUsage
	}
	// The environment names the TLS directory and client name only where
	// the flags do not: an explicit --tls-dir "" still means no TLS.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["tls-dir"] {
		cfg.TLSDir = s.getenv("AGENT_TLS_DIR")
	}
	if !given["tls-client-name"] {
		cfg.TLSClientName = s.getenv("AGENT_TLS_CLIENT_NAME")
	}
	cfg.Username = s.getenv("DATAPLANE_USERNAME")
	cfg.Password = s.getenv("DATAPLANE_PASSWORD")
	cfg.AgentVersion = agentVersion()
	cfg.Logger = logger
	return cfg, nil
}
