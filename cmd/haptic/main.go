// This file owns the dispatch and what every subcommand shares: exit
// statuses, flag parsing, local path resolution and the logger. Each
// subcommand lives in its own file; none of them calls os.Exit or reads the
// process environment directly, so that tests run them in-process.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// Exit statuses. A usage error is 2 everywhere, like the flag package's;
// `haptic diff` also answers 1 for a reload verdict, and `haptic push` 3
// for a plan every agent took with an error in some ACK (exitAckError).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// stdio is what a subcommand may touch of its process: two writers, the
// environment and the name resolver.
type stdio struct {
	out, err io.Writer
	getenv   func(string) string
	terminal bool       // out is a terminal: a command may redraw a progress line in place
	lookup   lookupFunc // resolves --agents-dns; nil is the system's resolver
}

func main() {
	// SIGINT and SIGTERM cancel the context: the agent shuts down cleanly
	// and the demo removes what it started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{out: os.Stdout, err: os.Stderr, getenv: os.Getenv, terminal: isTerminal(os.Stdout)})
	stop()
	os.Exit(code)
}

const usageText = `Usage:
  haptic agent [flags]                  run the agent beside HAProxy
  haptic agent state [flags]            print the agent's state
  haptic agent health [flags]           exit 0 when the agent answers on its admin socket
  haptic agent drain [flags]            wait until HAProxy is quiet (a preStop hook)
  haptic plan DIR                       print the plan of a directory as JSON
  haptic diff [flags] OLD NEW           what the change from OLD to NEW does to a pod
  haptic diff --agent URL [flags] DIR   what pushing DIR does to a live agent
  haptic push --agent URL [flags] DIR   push DIR to one or many agents
  haptic push --agents-dns URL [flags] DIR
                                        push DIR to every agent a DNS name lists (--canary N: N first)
  haptic check [flags] DIR              check DIR before a push: haproxy -c and the stats socket
  haptic demo [--haproxy PATH]          run the example against a fake or real HAProxy
  haptic install DIR                    copy this binary into DIR, for another container's hooks
  haptic certs [flags] DIR              write a development CA and mutual-TLS certificates into DIR
  haptic version                        print the version of this binary

Run "haptic <command> -h" for a command's flags.
`

// run dispatches to the subcommand and returns the process's exit status.
func run(ctx context.Context, args []string, s stdio) int {
	if len(args) == 0 {
		fmt.Fprint(s.err, usageText)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "agent":
		if len(rest) > 0 {
			switch rest[0] {
			case "state":
				return runAgentState(ctx, rest[1:], s)
			case "health":
				return runAgentHealth(ctx, rest[1:], s)
			case "drain":
				return runAgentDrain(ctx, rest[1:], s)
			}
		}
		return runAgent(ctx, rest, s)
	case "plan":
		return runPlan(rest, s)
	case "diff":
		return runDiff(ctx, rest, s)
	case "push":
		return runPush(ctx, rest, s)
	case "check":
		return runCheck(ctx, rest, s)
	case "demo":
		return runDemo(ctx, rest, s)
	case "install":
		return runInstall(rest, s)
	case "certs":
		return runCerts(rest, s)
	case "version", "--version":
		return runVersion(rest, s)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(s.out, usageText)
		return exitOK
	}
	fmt.Fprintf(s.err, "haptic: unknown command %q\n%s", cmd, usageText)
	return exitUsage
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newFlagSet returns a flag set that reports to stderr and never exits the
// process. synopsis is the usage line printed above the flags, for -h.
func newFlagSet(name, synopsis string, s stdio) *flag.FlagSet {
	fs := flag.NewFlagSet("haptic "+name, flag.ContinueOnError)
	fs.SetOutput(s.err)
	fs.Usage = func() {
		fmt.Fprintf(s.err, "Usage: %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags wherever they appear among the arguments, so that
// `haptic diff OLD NEW --haproxy-version 3.0` works as operators type it,
// and returns the positional arguments. Everything after "--" is
// positional.
//
// -h prints the usage with every flag. A bad flag prints its error and one
// line pointing at -h, never the whole flag list, which would bury the one
// line that matters: the flag package's own report (the error, then the
// usage) is held back and replaced.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	positional, err := parseInterleaved(fs, args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
	case err != nil:
		usageError(fs, "%v", err)
	}
	return positional, err
}

// parseInterleaved parses flags up to the next positional argument, takes
// it, and goes on. Each round consumes at least one argument, so the loop
// ends.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		consumed := len(args) - fs.NArg()
		rest := fs.Args()
		if consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageStatus is the exit status of a flag parsing error: 0 for -h (the
// usage was asked for), 2 otherwise (parseArgs already printed the error).
func usageStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// usageError prints a usage error of a command, and the line that points
// at its -h, and returns exitUsage.
func usageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(fs.Output(), "%s: %s\nRun \"%s -h\" for usage.\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return exitUsage
}

// localPath locates one of the agent's sockets for a client command
// (agent state, agent health, agent drain) by the rule the agent resolves
// them with: relative to the base directory unless absolute; "" stays ""
// (the socket is off).
func localPath(baseDir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(baseDir, p)
}

// newLogger builds the agent's JSON log/slog logger at the LOG_LEVEL given;
// "" means def. A level it does not know is an error, never a silent
// default, so a typo cannot hide debug logs an operator asked for.
func newLogger(w io.Writer, levelText string, def slog.Level) (*slog.Logger, error) {
	levels := map[string]slog.Level{"": def, "debug": slog.LevelDebug, "info": slog.LevelInfo,
		"warn": slog.LevelWarn, "error": slog.LevelError}
	level, ok := levels[levelText]
	if !ok {
		return nil, fmt.Errorf("LOG_LEVEL %q is not one of debug, info, warn, error", levelText)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})), nil
}
