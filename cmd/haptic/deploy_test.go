// Tests that keep the deployment files true: deploy/kubernetes, the systemd
// unit and its HAProxy drop-in, and the Dockerfile. Each file is read and
// held to the command it runs: every flag it passes exists in `haptic
// agent` (or `haptic agent drain`, or `haptic push` for the push Job),
// every path agrees with what the agent's defaults resolve to, the probes
// and the drain point at endpoints the agent serves, the push Job names the
// headless Service, a pod is ready only once HAProxy serves a pushed
// configuration (HAProxy's probe asks what the example render answers and
// the boot configuration does not), and, when HAPTIC_HAPROXY names a
// binary, the boot haproxy.cfg passes `haproxy -c` and a real HAProxy
// answers the probe as it must.

package main

import (
	"bufio"
	"bytes"
	"flag"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haptic-agent/haptic"
	"github.com/haptic-agent/haptic/internal/yamlsubset"
)

const deployDir = "../../deploy"

// ---------------------------------------------------------------------------
// Navigating the manifests.

// yamlAt follows keys (string) and indices (int) from node; nil when the
// path does not exist.
func yamlAt(node any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, ok := node.(map[string]any)
			if !ok {
				return nil
			}
			node = m[k]
		case int:
			l, ok := node.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			node = l[k]
		}
	}
	return node
}

func yamlString(t *testing.T, node any, keys ...any) string {
	t.Helper()
	s, ok := yamlAt(node, keys...).(string)
	if !ok {
		t.Fatalf("%v: not a string", keys)
	}
	return s
}

func yamlStrings(t *testing.T, node any, keys ...any) []string {
	t.Helper()
	l, _ := yamlAt(node, keys...).([]any)
	var out []string
	for _, v := range l {
		s, ok := v.(string)
		if !ok {
			t.Fatalf("%v: %v is not a string", keys, v)
		}
		out = append(out, s)
	}
	return out
}

// named returns the element of the list at keys whose "name" is name.
func named(t *testing.T, node any, name string, keys ...any) map[string]any {
	t.Helper()
	l, _ := yamlAt(node, keys...).([]any)
	for _, v := range l {
		if m, ok := v.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("%v: nothing named %q", keys, name)
	return nil
}

// k8sObjects reads every manifest of deploy/kubernetes, keyed "Kind/name"
// (or "Kind/generateName" for an object created anew each time), and
// checks that kustomization.yaml lists exactly the other files but the
// Jobs, which are created once per run rather than applied.
func k8sObjects(t *testing.T) map[string]map[string]any {
	t.Helper()
	dir := filepath.Join(deployDir, "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	objects := map[string]map[string]any{}
	var resources, others []string
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := yamlsubset.ParseDocuments(string(src))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			resources = yamlStrings(t, docs[0], "resources")
			continue
		}
		jobs := true
		for _, d := range docs {
			m, _ := d.(map[string]any)
			name, _ := yamlAt(m, "metadata", "name").(string)
			if name == "" {
				name = yamlString(t, m, "metadata", "generateName")
			}
			objects[yamlString(t, m, "kind")+"/"+name] = m
			jobs = jobs && m["kind"] == "Job"
		}
		if !jobs {
			others = append(others, filepath.Base(f))
		}
	}
	slices.Sort(resources)
	if !slices.Equal(resources, others) {
		t.Errorf("kustomization.yaml lists %v, the directory holds %v", resources, others)
	}
	return objects
}

// objectOf is the object of objects at key ("Kind/name"), or fails.
func objectOf(t *testing.T, objects map[string]map[string]any, key string) map[string]any {
	t.Helper()
	o := objects[key]
	if o == nil {
		t.Fatalf("no %s among %v", key, slices.Sorted(maps.Keys(objects)))
	}
	return o
}

// volumesOf is a pod spec's volumes by name.
func volumesOf(pod any) map[string]map[string]any {
	volumes := map[string]map[string]any{}
	l, _ := yamlAt(pod, "volumes").([]any)
	for _, v := range l {
		if m, ok := v.(map[string]any); ok {
			name, _ := m["name"].(string)
			volumes[name] = m
		}
	}
	return volumes
}

// mountOf is where container mounts the volume named volume, "" if it does
// not.
func mountOf(container map[string]any, volume string) string {
	l, _ := container["volumeMounts"].([]any)
	for _, v := range l {
		if m, ok := v.(map[string]any); ok && m["name"] == volume {
			s, _ := m["mountPath"].(string)
			return s
		}
	}
	return ""
}

// volumeAt is the name of the volume container mounts at path.
func volumeAt(t *testing.T, container map[string]any, mountPath string) string {
	t.Helper()
	l, _ := container["volumeMounts"].([]any)
	for _, v := range l {
		if m, ok := v.(map[string]any); ok && m["mountPath"] == mountPath {
			return m["name"].(string)
		}
	}
	t.Fatalf("container %v mounts nothing at %s", container["name"], mountPath)
	return ""
}

// portNamed is the containerPort of the named port.
func portNamed(t *testing.T, container map[string]any, name string) string {
	t.Helper()
	return yamlString(t, named(t, container, name, "ports"), "containerPort")
}

// listenPort is the port of a listen address such as ":9101".
func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return port
}

// agentConfigOf parses a command line of `haptic agent` (args after
// "agent") with an environment, as the command does. An unknown flag or a
// malformed value fails the test.
func agentConfigOf(t *testing.T, args []string, env map[string]string) haptic.AgentConfig {
	t.Helper()
	var errOut strings.Builder
	s := stdio{out: io.Discard, err: &errOut, getenv: func(k string) string { return env[k] }}
	cfg, err := parseAgentFlags(newFlagSet("agent", "haptic agent [flags]", s), args, s)
	if err != nil {
		t.Fatalf("haptic agent %q: %v\n%s", args, err, errOut.String())
	}
	return cfg
}

// drainSocketOf parses a preStop command `<bin> agent drain [flags]` and
// returns the binary and the drain socket it calls.
func drainSocketOf(t *testing.T, command []string) (bin, socket string) {
	t.Helper()
	if len(command) < 3 || command[1] != "agent" || command[2] != "drain" {
		t.Fatalf("preStop %q is not `haptic agent drain`", command)
	}
	var errOut strings.Builder
	s := stdio{out: io.Discard, err: &errOut, getenv: func(string) string { return "" }}
	fs := newFlagSet("agent drain", "haptic agent drain", s)
	var f drainFlags
	f.register(fs)
	positional, err := parseArgs(fs, command[3:])
	if err != nil || len(positional) > 0 {
		t.Fatalf("preStop %q: %v %q\n%s", command, err, positional, errOut.String())
	}
	return command[0], localPath(f.baseDir, f.socket)
}

// ---------------------------------------------------------------------------
// The Dockerfile.

// dockerImage is what the Dockerfile promises the manifests.
type dockerImage struct {
	binary string // the path ENTRYPOINT runs
}

func readDockerfile(t *testing.T) dockerImage {
	t.Helper()
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Instructions, with continuation lines joined and comments dropped.
	var instructions []string
	var cur strings.Builder
	for line := range strings.SplitSeq(string(src), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cur.Len() == 0 {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		instructions = append(instructions, cur.String())
		cur.Reset()
	}
	var stages [][]string // instructions per stage
	for _, in := range instructions {
		if strings.HasPrefix(in, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %q before any FROM", in)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stage(s), want a build stage and a runtime stage", len(stages))
	}

	// The build stage: the Go of go.mod, a static binary of ./cmd/haptic.
	goMod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for line := range strings.SplitSeq(string(goMod), "\n") {
		if v, ok := strings.CutPrefix(line, "go "); ok {
			goVersion = strings.TrimSpace(v)
		}
	}
	build := stages[0]
	fields := strings.Fields(build[0])
	if len(fields) != 4 || fields[1] != "golang:"+goVersion || fields[2] != "AS" {
		t.Errorf("Dockerfile builds with %q, want FROM golang:%s AS <name> (go.mod's Go)", build[0], goVersion)
	}
	buildName := fields[len(fields)-1]
	var builtTo string
	for _, in := range build {
		if strings.HasPrefix(in, "RUN ") && strings.Contains(in, "go build") {
			args := strings.Fields(in)
			if !strings.Contains(in, "CGO_ENABLED=0") || args[len(args)-1] != "./cmd/haptic" {
				t.Errorf("Dockerfile: %q is not a static build of ./cmd/haptic", in)
			}
			if i := slices.Index(args, "-o"); i > 0 {
				builtTo = args[i+1]
			}
			// The context has no .git: only the link flag names the build.
			if !strings.Contains(in, "-X main.version=${VERSION}") {
				t.Errorf("Dockerfile: %q does not set main.version from the VERSION build argument: the image would report dev", in)
			}
		}
	}

	// The runtime stage: only the binary, a non-root user, the entrypoint.
	runtime := stages[len(stages)-1]
	var img dockerImage
	var user string
	for _, in := range runtime[1:] {
		verb, rest, _ := strings.Cut(in, " ")
		switch verb {
		case "COPY":
			f := strings.Fields(rest)
			if len(f) != 3 || f[0] != "--from="+buildName || f[1] != builtTo {
				t.Errorf("Dockerfile runtime stage: %q copies something else than the built binary %s", in, builtTo)
			}
		case "USER":
			user = rest
		case "ENTRYPOINT":
			if !strings.HasPrefix(rest, `["`) {
				t.Errorf("ENTRYPOINT %s is not in exec form", rest)
			}
			img.binary = strings.Trim(rest, `[]"`)
		case "RUN":
			t.Errorf("Dockerfile runtime stage runs %q: it must hold the binary alone", in)
		}
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("Dockerfile runtime user %q, want a non-root uid", user)
	}
	if img.binary == "" {
		t.Fatal("Dockerfile has no ENTRYPOINT")
	}
	return img
}

func TestDockerfile(t *testing.T) {
	readDockerfile(t)
}

// ---------------------------------------------------------------------------
// Kubernetes.

func TestKubernetesManifestsAgreeWithTheAgent(t *testing.T) {
	img := readDockerfile(t)
	objects := k8sObjects(t)
	deploy := objectOf(t, objects, "Deployment/haproxy")
	pod := yamlAt(deploy, "spec", "template", "spec")
	haproxy := named(t, pod, "haproxy", "containers")
	agent := named(t, pod, "agent", "containers")
	volumes := volumesOf(pod)

	// The agent's command line, in the image's entrypoint.
	if c := yamlStrings(t, agent, "command"); c != nil && !slices.Equal(c, []string{img.binary}) {
		t.Errorf("agent command %q, want the image's entrypoint %s", c, img.binary)
	}
	args := yamlStrings(t, agent, "args")
	if len(args) == 0 || args[0] != "agent" {
		t.Fatalf("agent args %q, want `agent [flags]`", args)
	}
	env := map[string]string{}
	for _, e := range yamlAt(agent, "env").([]any) {
		env[yamlString(t, e, "name")] = yamlString(t, e, "value")
	}
	cfg := agentConfigOf(t, args[1:], env)
	if cfg.BaseDir != defaultBaseDir {
		t.Errorf("agent base directory %s, want the default %s", cfg.BaseDir, defaultBaseDir)
	}

	// One emptyDir at the base directory, in both containers.
	base := volumeAt(t, agent, cfg.BaseDir)
	if yamlAt(volumes[base], "emptyDir") == nil {
		t.Errorf("the base directory volume %q is not an emptyDir", base)
	}
	if got := mountOf(haproxy, base); got != cfg.BaseDir {
		t.Errorf("HAProxy mounts the base directory at %q, the agent at %q", got, cfg.BaseDir)
	}
	// general/ on an emptyDir of its own inside the base directory, as
	// upstream's pods keep it. Every volume inside the base is a directory
	// (no subPath: the agent refuses a single file mounted on its own) and
	// HAProxy mounts it where the agent does.
	if v := volumeAt(t, agent, path.Join(cfg.BaseDir, "general")); yamlAt(volumes[v], "emptyDir") == nil {
		t.Errorf("general/ is on volume %q, not an emptyDir", v)
	}
	inside := 0
	for _, vm := range yamlAt(agent, "volumeMounts").([]any) {
		at := yamlString(t, vm, "mountPath")
		if !strings.HasPrefix(at, cfg.BaseDir+"/") {
			continue
		}
		inside++
		name := yamlString(t, vm, "name")
		if sub, _ := yamlAt(vm, "subPath").(string); sub != "" {
			t.Errorf("volume %q is mounted inside the base directory with subPath %q: the agent refuses a file mounted on its own", name, sub)
		}
		if got := mountOf(haproxy, name); got != at {
			t.Errorf("HAProxy mounts volume %q at %q, the agent at %q", name, got, at)
		}
	}
	if inside == 0 {
		t.Errorf("no volume inside the base directory: upstream's layout keeps general/ on one")
	}

	// HAProxy: master-worker, its master CLI and configuration where the
	// agent looks for them.
	cmd := yamlStrings(t, haproxy, "command")
	configPath := filepath.Join(cfg.BaseDir, cfg.ConfigFile)
	if !slices.Contains(cmd, "-W") {
		t.Errorf("HAProxy %q does not run in master-worker mode (-W)", cmd)
	}
	if i := slices.Index(cmd, "-S"); i < 0 || i+1 >= len(cmd) {
		t.Errorf("HAProxy %q has no master CLI (-S)", cmd)
	} else if sock, opts, _ := strings.Cut(cmd[i+1], ","); sock != cfg.MasterSocket || !strings.Contains(opts, "level,admin") {
		t.Errorf("HAProxy master CLI %q, want %s at level admin", cmd[i+1], cfg.MasterSocket)
	}
	if i := slices.Index(cmd, "-f"); i < 0 || i+1 >= len(cmd) || cmd[i+1] != configPath {
		t.Errorf("HAProxy %q does not read %s", cmd, configPath)
	}

	// The boot configuration: copied from the ConfigMap to the config path,
	// and declaring the worker socket and default-path the agent needs.
	boot := named(t, pod, "boot-config", "initContainers")
	bootVolume := volumes[volumeAt(t, boot, mountOf(boot, "boot-config"))]
	cm := objects["ConfigMap/"+yamlString(t, bootVolume, "configMap", "name")]
	if cm == nil {
		t.Fatalf("the boot-config volume names no ConfigMap of the directory")
	}
	copyCmd := "cp " + path.Join(mountOf(boot, "boot-config"), "haproxy.cfg") + " " + configPath
	if script := strings.Join(yamlStrings(t, boot, "command"), " "); !strings.Contains(script, copyCmd) {
		t.Errorf("boot-config runs %q, want it to %q", script, copyCmd)
	}
	if got := mountOf(boot, base); got != cfg.BaseDir {
		t.Errorf("boot-config mounts the base directory at %q, want %s", got, cfg.BaseDir)
	}
	checkAgentLines(t, "the boot configuration", yamlString(t, cm, "data", "haproxy.cfg"), cfg)

	// The drain: both preStop hooks call the agent's drain socket.
	for _, c := range []map[string]any{haproxy, agent} {
		bin, socket := drainSocketOf(t, yamlStrings(t, c, "lifecycle", "preStop", "exec", "command"))
		if socket != cfg.DrainSocket || cfg.DrainSocket == "" {
			t.Errorf("%s preStop drains %q, the agent serves %q", c["name"], socket, cfg.DrainSocket)
		}
		switch c["name"] {
		case "agent":
			if bin != img.binary {
				t.Errorf("agent preStop runs %s, the image holds %s", bin, img.binary)
			}
		case "haproxy":
			// HAProxy's image has no haptic: an init container installs it.
			install := named(t, pod, "haptic-bin", "initContainers")
			dir := mountOf(install, "haptic-bin")
			if got := yamlStrings(t, install, "command"); !slices.Equal(got, []string{img.binary, "install", dir}) {
				t.Errorf("haptic-bin runs %q, want %q", got, []string{img.binary, "install", dir})
			}
			if want := path.Join(mountOf(haproxy, "haptic-bin"), "haptic"); bin != want {
				t.Errorf("HAProxy preStop runs %s, the installed binary is %s", bin, want)
			}
			if yamlAt(volumes["haptic-bin"], "emptyDir") == nil {
				t.Error("haptic-bin is not an emptyDir")
			}
		}
	}

	// Probes on the metrics listener, which serves them without TLS.
	metricsPort := listenPort(t, cfg.MetricsListen)
	for _, p := range []struct{ probe, path string }{{"livenessProbe", haptic.PathHealthz}, {"readinessProbe", haptic.PathReadyz}} {
		get := yamlAt(agent, p.probe, "httpGet")
		if got := yamlString(t, get, "path"); got != p.path {
			t.Errorf("%s path %s, want %s", p.probe, got, p.path)
		}
		if port := portNamed(t, agent, yamlString(t, get, "port")); port != metricsPort {
			t.Errorf("%s port %s, the agent serves probes on %s", p.probe, port, metricsPort)
		}
	}
	if got := portNamed(t, agent, "metrics"); got != metricsPort {
		t.Errorf("port metrics is %s, the agent listens on %s", got, metricsPort)
	}
	if got := yamlAt(deploy, "spec", "template", "metadata", "annotations", "prometheus.io/port"); got != metricsPort {
		t.Errorf("prometheus.io/port %v, want %s", got, metricsPort)
	}
	if got := portNamed(t, agent, "api"); got != listenPort(t, cfg.Listen) {
		t.Errorf("port api is %s, the agent listens on %s", got, cfg.Listen)
	}

	// Mutual TLS from the Secret, mounted as the TLS directory.
	if cfg.TLSDir == "" || cfg.TLSClientName == "" {
		t.Fatalf("the agent runs without mutual TLS (dir %q, client name %q)", cfg.TLSDir, cfg.TLSClientName)
	}
	tlsVolume := volumeAt(t, agent, cfg.TLSDir)
	if yamlAt(volumes[tlsVolume], "secret", "secretName") == nil {
		t.Errorf("the TLS directory %s is not a Secret volume", cfg.TLSDir)
	}

	// Memory limits, and no root anywhere.
	for _, c := range []map[string]any{haproxy, agent} {
		if yamlAt(c, "resources", "limits", "memory") == nil {
			t.Errorf("container %s has no memory limit", c["name"])
		}
		if u := yamlAt(c, "securityContext", "runAsUser"); u != nil {
			// The agent's sockets are 0600: HAProxy's preStop hook reaches
			// the drain socket only as the agent's uid.
			t.Errorf("container %s sets its own uid %v: both must share the pod's", c["name"], u)
		}
	}
	sc := yamlAt(pod, "securityContext")
	if yamlAt(sc, "runAsNonRoot") != "true" || yamlAt(sc, "runAsUser") == "0" || yamlAt(sc, "runAsUser") == nil || yamlAt(sc, "fsGroup") == nil {
		t.Errorf("pod securityContext %v: want runAsNonRoot, a non-zero runAsUser and an fsGroup", sc)
	}

	// The Services point at named ports of the right containers.
	labels := yamlAt(deploy, "spec", "template", "metadata", "labels").(map[string]any)
	for key, container := range map[string]map[string]any{"Service/haproxy": haproxy, "Service/haptic-agent": agent} {
		svc := objects[key]
		if svc == nil {
			t.Errorf("no %s", key)
			continue
		}
		for k, v := range yamlAt(svc, "spec", "selector").(map[string]any) {
			if labels[k] != v {
				t.Errorf("%s selects %s=%v, the pods carry %v", key, k, v, labels[k])
			}
		}
		for _, p := range yamlAt(svc, "spec", "ports").([]any) {
			portNamed(t, container, yamlString(t, p, "targetPort"))
		}
	}
}

// The push Job reaches every pod through the headless Service, by the
// name its serving certificates carry, pushes to one pod first, and finds
// its render and its TLS files where its volumes put them.
func TestKubernetesPushJobReachesEveryAgent(t *testing.T) {
	img := readDockerfile(t)
	objects := k8sObjects(t)
	job := objectOf(t, objects, "Job/haptic-push-")
	pod := yamlAt(job, "spec", "template", "spec")
	push := named(t, pod, "push", "containers")
	agent := named(t, yamlAt(objectOf(t, objects, "Deployment/haproxy"), "spec", "template", "spec"), "agent", "containers")
	if push["image"] != agent["image"] || push["command"] != nil {
		t.Errorf("the push runs image %v command %v, want the agent's image %v and its entrypoint %s", push["image"], push["command"], agent["image"], img.binary)
	}
	if yamlAt(pod, "restartPolicy") != "Never" || yamlAt(job, "spec", "backoffLimit") != "0" {
		t.Errorf("restartPolicy %v backoffLimit %v: a failed push must not run again by itself", yamlAt(pod, "restartPolicy"), yamlAt(job, "spec", "backoffLimit"))
	}

	args := yamlStrings(t, push, "args")
	if len(args) == 0 || args[0] != "push" {
		t.Fatalf("push args %q, want `push [flags] DIR`", args)
	}
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f pushFlags
	f.register(fs)
	positional, err := parseArgs(fs, args[1:])
	if err == nil {
		err = f.validate(positional)
	}
	if err != nil {
		t.Fatalf("push args %q: %v", args, err)
	}
	if f.o.canary < 1 {
		t.Errorf("--canary %d: a bad render would reach every pod at once", f.o.canary)
	}

	// The fleet: the headless Service's name and API port, every pod in it.
	u, err := url.Parse(f.dnsURL)
	if err != nil || u.Scheme != "https" {
		t.Fatalf("--agents-dns %q, want an https URL", f.dnsURL)
	}
	svc := objects["Service/"+u.Hostname()]
	if svc == nil || yamlAt(svc, "spec", "clusterIP") != "None" || yamlAt(svc, "spec", "publishNotReadyAddresses") != "true" {
		t.Fatalf("--agents-dns names %q: want a headless Service (clusterIP None) that lists pods not ready yet", u.Hostname())
	}
	if p := named(t, svc, "api", "spec", "ports"); yamlAt(p, "port") != u.Port() {
		t.Errorf("--agents-dns port %s, the Service's api port is %v", u.Port(), yamlAt(p, "port"))
	}
	if f.agents.tlsServerName != "" {
		t.Errorf("--tls-server-name %s: the certificates name the Service, which the URL names already", f.agents.tlsServerName)
	}

	// The render and the controller's TLS files, from their volumes.
	volumes := volumesOf(pod)
	render := volumes[volumeAt(t, push, positional[0])]
	if yamlAt(render, "configMap", "name") == nil || mountOf(push, render["name"].(string)) != positional[0] {
		t.Errorf("the render %s is not a ConfigMap volume mounted there", positional[0])
	}
	var paths []string
	for _, item := range yamlAt(render, "configMap", "items").([]any) {
		paths = append(paths, yamlString(t, item, "path"))
	}
	if !slices.Contains(paths, haptic.ConfigFilePath) {
		t.Errorf("the render's items %q lack %s", paths, haptic.ConfigFilePath)
	}
	for _, file := range []string{f.agents.tlsCert, f.agents.tlsKey, f.agents.tlsCA} {
		v := volumes[volumeAt(t, push, path.Dir(file))]
		if yamlAt(v, "secret", "secretName") == nil {
			t.Errorf("%s is not in a Secret volume", file)
		}
	}
}

// checkAgentLines holds a haproxy.cfg (the boot one, or a render) to what
// the agent needs: the worker's stats socket at admin level and
// default-path origin at the base directory, both in the global section.
func checkAgentLines(t *testing.T, name, text string, cfg haptic.AgentConfig) {
	t.Helper()
	var socket, origin string
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if line[0] != ' ' {
			section = f[0]
			continue
		}
		if section != "global" {
			continue
		}
		switch {
		case len(f) >= 3 && f[0] == "stats" && f[1] == "socket":
			if !strings.Contains(line, "level admin") {
				t.Errorf("%s: stats socket %q is not at level admin", name, line)
			}
			socket = f[2]
		case len(f) == 3 && f[0] == "default-path" && f[1] == "origin":
			origin = f[2]
		}
	}
	if socket != cfg.WorkerSocket {
		t.Errorf("%s: stats socket %q, the agent uses %q", name, socket, cfg.WorkerSocket)
	}
	if origin != cfg.BaseDir {
		t.Errorf("%s: default-path origin %q, want the base directory %q", name, origin, cfg.BaseDir)
	}
}

func TestKubernetesBootConfigRealHAProxy(t *testing.T) {
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set: no HAProxy binary to check the boot configuration with")
	}
	cm := k8sObjects(t)["ConfigMap/haproxy-boot"]
	file := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(file, []byte(yamlString(t, cm, "data", "haproxy.cfg")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-c", "-f", file).CombinedOutput()
	if err != nil {
		t.Fatalf("%s -c refuses the boot configuration: %v\n%s", bin, err, out)
	}
	// The check is a real one: a broken copy is refused.
	if err := os.WriteFile(file, []byte(yamlString(t, cm, "data", "haproxy.cfg")+"    no-such-keyword\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", file).CombinedOutput(); err == nil {
		t.Fatalf("%s -c accepts a broken configuration:\n%s", bin, out)
	}
}

// ---------------------------------------------------------------------------
// Readiness: a pod takes traffic only once HAProxy serves a pushed
// configuration.

// renderDir is the example render push-job.yaml pushes.
var renderDir = filepath.Join(deployDir, "kubernetes", "render")

// haproxyReadiness is the path and the port the HAProxy container's
// readiness probe asks.
func haproxyReadiness(t *testing.T, objects map[string]map[string]any) (path, port string) {
	t.Helper()
	haproxy := named(t, yamlAt(objectOf(t, objects, "Deployment/haproxy"), "spec", "template", "spec"), "haproxy", "containers")
	get := yamlAt(haproxy, "readinessProbe", "httpGet")
	if get == nil {
		t.Fatal("the HAProxy container has no HTTP readiness probe: a new pod takes traffic while it serves the boot configuration")
	}
	return yamlString(t, get, "path"), portNamed(t, haproxy, yamlString(t, get, "port"))
}

// readRender reads the example render: each file's contents by its path
// in the directory.
func readRender(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(renderDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(renderDir, p)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// monitorsAt reports whether a haproxy.cfg has a frontend that binds port
// on every address and answers uri itself (monitor-uri).
func monitorsAt(text, port, uri string) bool {
	binds, monitors := map[string]bool{}, map[string]bool{}
	section := ""
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case line[0] != ' ' && line[0] != '\t':
			section = strings.Join(f, " ")
		case !strings.HasPrefix(section, "frontend "):
		case f[0] == "bind" && len(f) > 1 && (f[1] == ":"+port || f[1] == "*:"+port):
			binds[section] = true
		case f[0] == "monitor-uri" && len(f) == 2 && f[1] == uri:
			monitors[section] = true
		}
	}
	for fe := range binds {
		if monitors[fe] {
			return true
		}
	}
	return false
}

// A pod takes traffic only once HAProxy serves a pushed configuration: the
// HAProxy container probes an endpoint every render defines (the example
// render does) and the boot configuration does not, the Service traffic
// takes lists only ready pods, and the headless Service the push takes
// lists every pod, or no pod would ever become ready.
func TestKubernetesPodTakesTrafficOnlyOnceConfigured(t *testing.T) {
	objects := k8sObjects(t)
	path, port := haproxyReadiness(t, objects)
	boot := yamlString(t, objectOf(t, objects, "ConfigMap/haproxy-boot"), "data", "haproxy.cfg")
	if monitorsAt(boot, port, path) {
		t.Errorf("the boot configuration answers the readiness probe (GET %s on :%s): a pod would take traffic before any push", path, port)
	}
	render := readRender(t)
	if !monitorsAt(render[haptic.ConfigFilePath], port, path) {
		t.Errorf("the example render has no frontend binding :%s with monitor-uri %s: its pods would never take traffic", port, path)
	}
	checkAgentLines(t, "the example render", render[haptic.ConfigFilePath], agentConfigOf(t, nil, nil))

	// The push Job carries the render whole: the README's kubectl create
	// configmap names its files, and the Job maps each key to its path.
	job := yamlAt(objectOf(t, objects, "Job/haptic-push-"), "spec", "template", "spec")
	var items []string
	for _, item := range yamlAt(volumesOf(job)["render"], "configMap", "items").([]any) {
		items = append(items, yamlString(t, item, "path"))
	}
	if slices.Sort(items); !slices.Equal(items, slices.Sorted(maps.Keys(render))) {
		t.Errorf("push-job.yaml maps %q, the example render holds %q", items, slices.Sorted(maps.Keys(render)))
	}

	if v := yamlAt(objectOf(t, objects, "Service/haproxy"), "spec", "publishNotReadyAddresses"); v == "true" {
		t.Error("the traffic Service haproxy publishes pods that are not ready: it would send traffic to the boot configuration's 503")
	}
	if v := yamlAt(objectOf(t, objects, "Service/haptic-agent"), "spec", "publishNotReadyAddresses"); v != "true" {
		t.Error("the headless Service haptic-agent lists only ready pods: no push would reach a new pod, which stays not ready")
	}
}

// The readiness probe against a real HAProxy: the boot configuration
// answers it with a failure, the example render with 200. Each runs in a
// directory of its own, /etc/haproxy and the ports it binds moved there
// and to free loopback ports.
func TestKubernetesReadinessProbeRealHAProxy(t *testing.T) {
	bin := os.Getenv("HAPTIC_HAPROXY")
	if bin == "" {
		t.Skip("HAPTIC_HAPROXY is not set: no HAProxy binary to probe the configurations with")
	}
	objects := k8sObjects(t)
	path, port := haproxyReadiness(t, objects)
	boot := map[string]string{haptic.ConfigFilePath: yamlString(t, objectOf(t, objects, "ConfigMap/haproxy-boot"), "data", "haproxy.cfg")}
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int
	}{{"the boot configuration", boot, 503}, {"the example render", readRender(t), 200}} {
		t.Run(c.name, func(t *testing.T) {
			if got := probeRealHAProxy(t, bin, c.files, port, path); got != c.want {
				t.Errorf("%s answers the readiness probe GET %s with %d, want %d", c.name, path, got, c.want)
			}
		})
	}
}

// probeRealHAProxy runs HAProxy on files in a directory of its own and
// answers the status of GET path on what the configuration binds as port.
func probeRealHAProxy(t *testing.T, bin string, files map[string]string, port, path string) int {
	t.Helper()
	base, err := os.MkdirTemp("", "probe") // short: the socket path must fit in HAProxy's 97 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	ports := map[string]string{}
	bind := regexp.MustCompile(`(?m)^(\s*bind\s+)\*?:([0-9]+)`)
	for name, text := range files {
		text = strings.ReplaceAll(text, defaultBaseDir, base)
		text = bind.ReplaceAllStringFunc(text, func(m string) string {
			sub := bind.FindStringSubmatch(m)
			if ports[sub[2]] == "" {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				ports[sub[2]] = l.Addr().String()
				l.Close()
			}
			return sub[1] + ports[sub[2]]
		})
		if err := os.MkdirAll(filepath.Dir(filepath.Join(base, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if ports[port] == "" {
		t.Fatalf("the configuration binds nothing on :%s", port)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "-db", "-f", filepath.Join(base, haptic.ConfigFilePath))
	cmd.Dir, cmd.Stdout, cmd.Stderr = base, &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("HAProxy exited:\n%s", out.String())
		default:
		}
		if resp, err := client.Get("http://" + ports[port] + path); err == nil {
			resp.Body.Close()
			return resp.StatusCode
		}
	}
	t.Fatalf("HAProxy did not answer on %s within 10 s", ports[port])
	return 0
}

// ---------------------------------------------------------------------------
// systemd.

// systemdUnit is a unit file: section → key → values in order. Lines
// continued with a backslash are joined; comments dropped.
type systemdUnit map[string]map[string][]string

func readSystemdUnit(t *testing.T, file string) systemdUnit {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	u := systemdUnit{}
	section := ""
	var pending string
	for line := range strings.SplitSeq(string(src), "\n") {
		line = strings.TrimSpace(line)
		if pending == "" && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			pending += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s: %q is not a setting of a section", file, line)
		}
		u[section][strings.TrimSpace(key)] = append(u[section][strings.TrimSpace(key)], strings.TrimSpace(value))
	}
	return u
}

// systemdWords splits a command line or an Environment= value into words,
// honouring double quotes, as systemd does for the simple cases used here.
func systemdWords(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote, inWord = !inQuote, true
		case r == ' ' && !inQuote:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

func TestSystemdUnitAgreesWithTheAgent(t *testing.T) {
	img := readDockerfile(t)
	unit := readSystemdUnit(t, filepath.Join(deployDir, "systemd", "haptic-agent.service"))
	svc := unit["Service"]
	if len(svc["ExecStart"]) != 1 {
		t.Fatalf("ExecStart %q, want one", svc["ExecStart"])
	}
	words := systemdWords(svc["ExecStart"][0])
	if len(words) < 2 || words[0] != img.binary || words[1] != "agent" {
		t.Fatalf("ExecStart %q, want %s agent [flags]", words, img.binary)
	}
	cfg := agentConfigOf(t, words[2:], nil)
	if cfg.BaseDir != defaultBaseDir {
		t.Errorf("the unit's base directory %s, want the default %s", cfg.BaseDir, defaultBaseDir)
	}
	if rw := strings.Fields(strings.Join(svc["ReadWritePaths"], " ")); svc["ProtectSystem"] != nil && !slices.Contains(rw, cfg.BaseDir) {
		t.Errorf("ReadWritePaths %q leaves the base directory %s read-only", rw, cfg.BaseDir)
	}
	if !slices.Contains(strings.Fields(strings.Join(unit["Unit"]["After"], " ")), "haproxy.service") {
		t.Errorf("After %q does not order the agent after haproxy.service", unit["Unit"]["After"])
	}
	if svc["MemoryMax"] == nil {
		t.Error("no MemoryMax: the agent's memory limit follows the unit's cgroup")
	}

	// The drop-in gives HAProxy its master CLI where the agent looks.
	dropIn := readSystemdUnit(t, filepath.Join(deployDir, "systemd", "haproxy.service.d", "haptic.conf"))
	var master string
	for _, env := range dropIn["Service"]["Environment"] {
		for _, w := range systemdWords(env) {
			if opts, ok := strings.CutPrefix(w, "EXTRAOPTS="); ok {
				f := strings.Fields(opts)
				if i := slices.Index(f, "-S"); i >= 0 && i+1 < len(f) {
					master = f[i+1]
				}
			}
		}
	}
	if sock, opts, _ := strings.Cut(master, ","); sock != cfg.MasterSocket || !strings.Contains(opts, "level,admin") {
		t.Errorf("the drop-in's master CLI %q, want %s at level admin", master, cfg.MasterSocket)
	}
	// HAProxy 2.6 opens a map named in a sample expression relative to its
	// working directory, not to default-path origin: it must start in the
	// base directory.
	if wd := dropIn["Service"]["WorkingDirectory"]; !slices.Equal(wd, []string{cfg.BaseDir}) {
		t.Errorf("the drop-in's WorkingDirectory %q, want %s", wd, cfg.BaseDir)
	}
}
