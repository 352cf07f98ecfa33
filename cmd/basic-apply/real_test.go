// This file owns the proof that the example program does what its doc says
// against an agent beside a real HAProxy (HAPTIC_HAPROXY), on the pod its
// doc describes: base directory /etc/haproxy, the frontend on *:80. So
// that neither touches the host, the test runs itself again in private
// mount and network namespaces (unshare), where /etc/haproxy is an empty
// tmpfs and port 80 is the namespace's own; it skips where they cannot be
// made.
//
// It must never write the host's /etc/haproxy nor bind its ports.

package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
)

// inNamespaceEnv marks the run inside the namespaces.
const inNamespaceEnv = "HAPTIC_BASIC_APPLY_IN_NAMESPACE"

const podDir = "/etc/haproxy"

// podBootConfig is the boot configuration of the README's steps: the
// sockets the agent expects and default-path origin, nothing to route.
const podBootConfig = `global
    stats socket /etc/haproxy/haproxy-worker.sock mode 600 level admin
    default-path origin /etc/haproxy

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend boot
    bind 127.0.0.1:8080
    http-request return status 200
`

func TestBasicApplyRealHAProxy(t *testing.T) {
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set; real-HAProxy tests skipped")
	}
	if os.Getenv(inNamespaceEnv) == "" {
		runInPodNamespace(t)
		return
	}
	if err := os.WriteFile(filepath.Join(podDir, haptic.ConfigFilePath), []byte(podBootConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// Started in the base directory, as the README says: HAProxy 2.6 opens
	// the example's map, named in a use_backend expression, relative to it.
	var output bytes.Buffer
	h := exec.Command(bin, "-W", "-db", "-S", filepath.Join(podDir, "haproxy-master.sock")+",level,admin",
		"-f", filepath.Join(podDir, haptic.ConfigFilePath))
	h.Dir, h.Stdout, h.Stderr = podDir, &output, &output
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { h.Wait(); close(exited) }()
	t.Cleanup(func() { // after the agent's, which stops first
		h.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			h.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("HAProxy output:\n%s", output.String())
		}
	})

	agent := startExampleAgent(t, haptic.AgentConfig{BaseDir: podDir,
		MasterSocket: filepath.Join(podDir, "haproxy-master.sock"), WorkerSocket: filepath.Join(podDir, "haproxy-worker.sock")})
	checkExampleOutput(t, runExample(t, agent), strings.TrimPrefix(lineWith(workerAnswer(t, "show info"), "Version: "), "Version: "))
	// The second render's entry reached the worker that loaded the first.
	if m := workerAnswer(t, "show map maps/host.map"); !strings.Contains(m, " blog.example.com web-servers\n") {
		t.Errorf("the worker's map:\n%s", m)
	}
}

// runInPodNamespace runs this test again in new mount and network
// namespaces, with the loopback up and a tmpfs on /etc/haproxy, and fails
// with its output when it fails there.
func runInPodNamespace(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if fi, statErr := os.Stat(podDir); err != nil || statErr != nil || !fi.IsDir() {
		t.Skipf("needs unshare and a %s directory to mount over: %v %v", podDir, err, statErr)
	}
	setup := "ip link set lo up && mount -t tmpfs tmpfs " + podDir
	if out, err := exec.Command(unshare, "--mount", "--net", "sh", "-c", setup).CombinedOutput(); err != nil {
		t.Skipf("cannot make the pod's namespaces here: %v\n%s", err, out)
	}
	cmd := exec.Command(unshare, "--mount", "--net", "sh", "-c", setup+` && exec "$@"`, "sh",
		os.Args[0], "-test.run=^TestBasicApplyRealHAProxy$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), inNamespaceEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestBasicApplyRealHAProxy")) {
		t.Fatalf("in the pod's namespaces: %v\n%s", err, out)
	}
}

// workerAnswer is the worker's answer to one command on its stats socket.
func workerAnswer(t *testing.T, cmd string) string {
	t.Helper()
	conn, err := net.DialTimeout("unix", filepath.Join(podDir, "haproxy-worker.sock"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "%s\n", cmd)
	var b bytes.Buffer
	b.ReadFrom(conn)
	return b.String()
}

// lineWith is the first line of text that starts with prefix.
func lineWith(text, prefix string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}
