// prestop.go owns the two commands a pod's preStop hooks need:
// `haptic agent drain`, which waits on the agent's drain socket until
// HAProxy's worker has seen no new connection for the quiet period, and
// `haptic install DIR`, which copies this static binary into a shared
// volume so that a container built without it (HAProxy's own image) can run
// the drain from its preStop hook too.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/haptic-agent/haptic"
)

// drainClientTimeout bounds one drain call: the agent answers within
// --drain-max-wait (at most 5m), so this only catches an agent that hangs.
// The kubelet's termination grace bounds the hook anyway.
const drainClientTimeout = 6 * time.Minute

// drainFlags are the flags of `haptic agent drain`; the deployment test
// parses the preStop hooks with them.
type drainFlags struct {
	baseDir, socket string
	timeout         time.Duration
}

func (f *drainFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.baseDir, "base-dir", defaultBaseDir, "the agent's base directory; locates the drain socket")
	fs.StringVar(&f.socket, "drain-socket", defaultDrainSocket, "the agent's drain socket, relative to --base-dir unless absolute")
	fs.DurationVar(&f.timeout, "timeout", drainClientTimeout, "deadline of the call")
}

// runAgentDrain calls GET /drain on the drain socket and prints the
// result: one line, exit 0 whatever the reason (an unavailable counter or a
// drain cut short still lets the pod stop); exit 1 when the agent could not
// be asked at all.
func runAgentDrain(ctx context.Context, args []string, s stdio) int {
	fs := newFlagSet("agent drain", "haptic agent drain [--base-dir DIR] [--drain-socket PATH] [--timeout D]", s)
	var f drainFlags
	f.register(fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	switch {
	case len(positional) > 0:
		return usageError(fs, "unexpected argument %q", positional[0])
	case f.timeout <= 0:
		return usageError(fs, "--timeout must be positive, got %s", f.timeout)
	}
	res, err := callDrain(ctx, localPath(f.baseDir, f.socket), f.timeout)
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent drain: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(s.out, "drain: %s after %s, %d connection(s)\n", res.Reason, res.Waited, res.Connections)
	return exitOK
}

func callDrain(ctx context.Context, socket string, timeout time.Duration) (haptic.DrainResult, error) {
	var res haptic.DrainResult
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+haptic.PathDrain, nil) // a fixed, valid URL
	resp, err := hc.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return res, err
	}
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("%s answered %s", socket, resp.Status)
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return res, fmt.Errorf("%s answered no drain result: %w", socket, err)
	}
	return res, nil
}

// runInstall copies the running binary to DIR/haptic, executable, through
// a temporary file and a rename, so that a container starting meanwhile
// never runs half a binary.
func runInstall(args []string, s stdio) int {
	fs := newFlagSet("install", "haptic install DIR", s)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(positional) != 1 {
		return usageError(fs, "want exactly one directory, got %d argument(s)", len(positional))
	}
	self, err := os.Executable()
	if err == nil {
		err = installBinary(self, positional[0])
	}
	if err != nil {
		fmt.Fprintf(s.err, "haptic install: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func installBinary(src, dir string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, ".haptic-install-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	_, err = io.Copy(tmp, in)
	if err = errors.Join(err, tmp.Chmod(0o755), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, "haptic"))
}
