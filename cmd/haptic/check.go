// check.go owns `haptic check`: what a Data Plane API user gets before a
// commit, for a directory of rendered files before a push. HAProxy's own
// check of the render (haproxy -c) where a binary is at hand, and the
// socket check the agent makes before it reloads (haptic.CheckWorkerSocket).
// It never talks to an agent and never changes the render: HAProxy checks a
// copy whose haproxy.cfg names the copy where it named the base directory
// (intoCopy), chosen over mounting the render on the base directory in a
// private mount namespace, which needs root or user namespaces, and over
// -C alone, which default-path origin <base dir> (the documented render's
// line) overrides.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/haptic-agent/haptic"
)

const checkSynopsis = `haptic check [--haproxy PATH] [--base-dir DIR] [--worker-socket PATH] RENDER
RENDER is a directory of rendered files, as haptic push takes it. Two checks:
  haproxy -c    HAProxy's own check, with --haproxy or the haproxy on PATH; said and
                skipped when there is none. A render names its files at the pod's base
                directory (default-path origin /etc/haproxy, /etc/haproxy/maps/x.map)
                while RENDER is elsewhere, so HAProxy checks a temporary copy of RENDER
                whose haproxy.cfg has every path under --base-dir moved into the copy,
                run from the copy: the files it reads are the render's, and it needs
                no privilege (mounting RENDER over the base directory in a private
                namespace would). Paths outside the base directory (error pages, the
                system CAs) and paths written in other files (a crt-list's
                certificates) are read on this machine.
  stats socket  a global "stats socket" line of haproxy.cfg must declare the agent's
                --worker-socket, or the agent cannot reach the new worker (the agent
                refuses such a render, or rolls it back). A line it cannot judge (none,
                a relative path, a quoted word) is said, not failed.
Exit status: 0 when both pass, 1 when one fails (each failure is printed), 2 for usage.`

// checkTimeout bounds haproxy -c, which loads every map and certificate.
const checkTimeout = 2 * time.Minute

func runCheck(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("check", checkSynopsis, s)
	bin := fs.String("haproxy", "", "HAProxy binary for haproxy -c (default: haproxy on PATH)")
	cfg := haptic.AgentConfig{}
	fs.StringVar(&cfg.BaseDir, "base-dir", defaultBaseDir, "the agent's --base-dir: where the pod holds the render")
	fs.StringVar(&cfg.WorkerSocket, "worker-socket", haptic.DefaultAgentConfig().WorkerSocket,
		"the agent's --worker-socket, relative to --base-dir unless absolute")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) != 1 {
		return usageError(fs, "want one directory, got %s", countOf(len(positional), "argument"))
	}
	base, err := filepath.Abs(cfg.BaseDir)
	if err == nil {
		cfg, err = cfg.ResolvePaths()
	}
	if err != nil {
		return usageError(fs, "%v", err)
	}
	render := positional[0]
	config, err := os.ReadFile(filepath.Join(render, haptic.ConfigFilePath))
	if err != nil {
		fmt.Fprintf(s.err, "haptic check: %v\n", err)
		return exitFailure
	}
	failed := false
	say := func(verdict, format string, args ...any) {
		fmt.Fprintf(s.out, "%-8s"+format+"\n", append([]any{verdict}, args...)...)
		failed = failed || verdict == "FAILED"
	}

	switch path, err := haproxyBinary(*bin, s.getenv("PATH")); {
	case err != nil && *bin == "":
		say("skipped", "haproxy -c: no haproxy on PATH (give --haproxy PATH to run HAProxy's own check)")
	case err != nil:
		say("FAILED", "haproxy -c: %v", err)
	default:
		if out, err := haproxyCheck(ctx, path, render, base); err != nil {
			say("FAILED", "haproxy -c (%s): %v\n%s", path, err, out)
		} else {
			say("ok", "haproxy -c (%s)", path)
		}
	}

	switch err := haptic.CheckWorkerSocket(bytes.NewReader(config), cfg.WorkerSocket); {
	case errors.Is(err, haptic.ErrSocketUnknown):
		say("unknown", "stats socket: %v; the agent finds out at the reload", err)
	case err != nil:
		say("FAILED", "stats socket: %v", err)
	default:
		say("ok", "stats socket: haproxy.cfg declares the agent's worker socket %s", cfg.WorkerSocket)
	}
	if failed {
		return exitFailure
	}
	return exitOK
}

// haproxyBinary is the binary --haproxy names, else the first executable
// haproxy in the directories of path (the PATH the command was handed).
func haproxyBinary(flagged, path string) (string, error) {
	if flagged != "" {
		_, err := os.Stat(flagged)
		return flagged, err
	}
	for _, dir := range filepath.SplitList(path) {
		bin := filepath.Join(dir, "haproxy")
		if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return bin, nil
		}
	}
	return "", errors.New("no haproxy on PATH")
}

// haproxyCheck runs bin -c on a copy of render whose haproxy.cfg names the
// copy where it named the base directory, from the copy, and returns what
// HAProxy printed with the copy's name put back to render's.
func haproxyCheck(ctx context.Context, bin, render, base string) (string, error) {
	tmp, err := os.MkdirTemp("", "haptic-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	copyDir := filepath.Join(tmp, "render")
	if err := os.CopyFS(copyDir, os.DirFS(render)); err != nil {
		return "", fmt.Errorf("copying the render: %w", err)
	}
	cfg := filepath.Join(copyDir, haptic.ConfigFilePath)
	config, err := os.ReadFile(cfg)
	if err == nil {
		err = os.WriteFile(cfg, intoCopy(config, base, copyDir), 0o600)
	}
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-c", "-f", cfg)
	cmd.Dir = copyDir
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(strings.ReplaceAll(string(out), copyDir, render)), err
}

// intoCopy points a configuration's paths under base at copyDir: base
// itself, or a name under it, where the path ends at a '/', a blank, a
// quote, a ',', a ')' or the line's end ("/etc/haproxy2" is not under
// "/etc/haproxy").
func intoCopy(config []byte, base, copyDir string) []byte {
	under := regexp.MustCompile(`(?m)` + regexp.QuoteMeta(base) + `([/\s"',)]|$)`)
	return under.ReplaceAllFunc(config, func(m []byte) []byte { return append([]byte(copyDir), m[len(base):]...) })
}
