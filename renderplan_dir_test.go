// Tests of PlanFromDir (renderplan.go), which reads a rendered directory
// into a plan: the files it classifies and the hidden ones it skips, the
// configuration cut into sections only at section keywords, the refusals
// (no haproxy.cfg, an absent directory), reasons of a config edit that name
// only the section whose own lines changed, and a Kubernetes ConfigMap or
// Secret mount read through its links, with links that leave the directory
// or dangle refused.

package haptic

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// PlanFromDir.

func TestPlanFromDir(t *testing.T) {
	ca := newTestCA(t, "plan-ca")
	certPEM, keyPEM := ca.issue(t, testCertOptions{CommonName: "site", DNSNames: []string{"site.example.com"}})
	config := "# rendered by hand\n" +
		"global\n    log stdout format raw local0\n\n" +
		"defaults\n    mode http\n" +
		"defaults\n    timeout client 5s\n" +
		"frontend  http-in   # public\n    bind *:80\n" +
		"backend web\n    server web1 10.0.0.1:80\n"
	files := map[string]string{
		"haproxy.cfg":          config,
		"maps/host.map":        "# hosts\nshop.example.com web\nblog.example.com web\n",
		"certs/site.pem":       string(certPEM) + string(keyPEM),
		"certs/ca.pem":         string(ca.CertPEM),
		"certs/list.crt-list":  "certs/site.pem [alpn h2,http/1.1 no-ca-names ssl-min-ver TLSv1.2] site.example.com !old.example.com\ncerts/other.pem\n",
		"errors/503.http":      "HTTP/1.0 503 Service Unavailable\r\n\r\n",
		"a-b":                  "sorts before a/b as a path",
		"a/b":                  "x",
		".hidden/skipped.map":  "k v\n",
		"maps/.skipped.map":    "k v\n",
		"certs/.well-known/x":  "y",
		"errors/.editor-swap~": "z",
	}
	p := planOfFiles(t, files)
	type fileRow struct {
		path, kind string
		reload     bool
	}
	var got []fileRow
	for _, f := range p.Files {
		got = append(got, fileRow{f.Path, f.Kind, f.ReloadOnChange})
		if !f.ContentKnown || f.Content != files[f.Path] || f.Digest != DigestString(files[f.Path]) || f.Size != int64(len(files[f.Path])) {
			t.Errorf("file %s: content, digest or size not taken from disk", f.Path)
		}
	}
	want := []fileRow{
		{"a-b", FileKindGeneral, true},
		{"a/b", FileKindGeneral, true},
		{"certs/ca.pem", FileKindCA, false},
		{"certs/list.crt-list", FileKindCRTList, false},
		{"certs/site.pem", FileKindCert, false},
		{"errors/503.http", FileKindGeneral, true},
		{"haproxy.cfg", FileKindConfig, true},
		{"maps/host.map", FileKindMap, false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("files:\n got %v\nwant %v", got, want)
	}

	var names []string
	var joined strings.Builder
	for _, s := range p.Sections {
		names = append(names, s.Name)
		joined.WriteString(s.Text)
		if s.Kind != SectionKindCore || !s.TextKnown || s.TextDigest != DigestString(s.Text) || s.Length != len(s.Text) {
			t.Errorf("section %q is not a described core section", s.Name)
		}
	}
	if want := []string{"global", "defaults", "defaults#2", "frontend http-in", "backend web"}; !reflect.DeepEqual(names, want) {
		t.Errorf("sections %q, want %q", names, want)
	}
	// The comment before the first header and the blank line after
	// global's last line belong to no section.
	if want := strings.Replace(strings.TrimPrefix(config, "# rendered by hand\n"), "local0\n\n", "local0\n", 1); joined.String() != want {
		t.Errorf("sections joined:\n%q\nwant\n%q", joined.String(), want)
	}

	wantMaps := map[string]Map{"maps/host.map": {Path: "maps/host.map", Ordered: true,
		Entries: []MapEntry{{"shop.example.com", "web"}, {"blog.example.com", "web"}}}}
	if !reflect.DeepEqual(p.Maps, wantMaps) {
		t.Errorf("maps %+v", p.Maps)
	}
	wantLists := map[string]CRTList{"certs/list.crt-list": {Path: "certs/list.crt-list", Entries: []CRTListEntry{
		{Cert: "certs/site.pem",
			Options: []KeywordArg{{Name: "alpn", Args: []string{"h2,http/1.1"}}, {Name: "no-ca-names"},
				{Name: "ssl-min-ver", Args: []string{"TLSv1.2"}}},
			SNIFilters: []string{"site.example.com", "!old.example.com"}},
		{Cert: "certs/other.pem"},
	}}}
	if !reflect.DeepEqual(p.CRTLists, wantLists) {
		t.Errorf("crt-lists %+v", p.CRTLists)
	}
	if p.Backends != nil || p.Profiles != nil {
		t.Errorf("a directory declares no backend or profile record")
	}
	c := p.Clone()
	c.ComputeID()
	if p.ID == "" || c.ID != p.ID {
		t.Errorf("id %q is not the plan's computed id", p.ID)
	}
}

func TestPlanFromDirRefuses(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.map"), []byte("k v\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanFromDir(dir); err == nil || !strings.Contains(err.Error(), "no haproxy.cfg") {
		t.Errorf("a directory without haproxy.cfg: %v", err)
	}
	if _, err := PlanFromDir(filepath.Join(dir, "absent")); err == nil {
		t.Errorf("an absent directory gave no error")
	}
}

func TestConfigSectionsCutOnlyAtSectionKeywords(t *testing.T) {
	config := "global\nstats socket /x.sock level admin\n" +
		"defaults\nmode http\ntimeout client 5s\n" +
		"  backend web # indented header\nserver web1 127.0.0.1:80\n" +
		"peers mesh\npeer a 10.0.0.1:1024\n"
	var names []string
	for _, s := range configSections(config) {
		names = append(names, s.Name)
	}
	if want := []string{"global", "defaults", "backend web", "peers mesh"}; !reflect.DeepEqual(names, want) {
		t.Errorf("sections %q, want %q", names, want)
	}
}

func TestConfigSectionsOfAHeaderlessConfig(t *testing.T) {
	got := configSections("# preamble\n    maxconn 10\n\n")
	if len(got) != 1 || got[0].Name != ConfigFilePath || got[0].Text != "    maxconn 10\n" {
		t.Errorf("got %+v", got)
	}
	if got := configSections("    # only indented comments\n\n"); got != nil {
		t.Errorf("a config of comments gave sections %+v", got)
	}
	got = configSections("    maxconn 10\nglobal\n    nbthread 2\n")
	if len(got) != 1 || got[0].Name != "global" || got[0].Text != "    maxconn 10\nglobal\n    nbthread 2\n" {
		t.Errorf("content before the first header does not open it: %+v", got)
	}
	if got := configSections(""); got != nil {
		t.Errorf("an empty config gave sections %+v", got)
	}
}

// planOfFiles writes files into a fresh directory and returns its plan.
func planOfFiles(t *testing.T, files map[string]string) *Plan {
	t.Helper()
	dir := t.TempDir()
	for rel, content := range files {
		abs := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(abs, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := PlanFromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The reasons of a config edit name only the section whose own lines
// changed: not the neighbour of an appended section, not a section next to
// an added blank line or comment.
func TestPlanFromDirReasonsNameOnlyTheChangedSection(t *testing.T) {
	const base = "global\n    maxconn 100\n\n" +
		"frontend http-in\n    bind :80\n    default_backend web-servers\n\n" +
		"backend web-servers\n    server web1 10.0.0.1:80\n"
	old := planOfFiles(t, map[string]string{"haproxy.cfg": base})
	baseline := &Baseline{Applied: old, Running: old, WorkerOps: old, Inventory: InventoryOf(old), Caps: CapsFor("3.4", nil)}
	for _, c := range []struct {
		name, config string
		reasons      []string
	}{
		{"a backend appended after a blank line", base + "\nbackend api-servers\n    server api1 10.0.0.2:80\n",
			[]string{"core section backend api-servers added"}},
		{"a commented backend appended", base + "\n# the API\nbackend api-servers\n    server api1 10.0.0.2:80\n",
			[]string{"core section backend api-servers added"}},
		{"a newline appended", base + "\n",
			[]string{"config haproxy.cfg changed with no section explaining it"}},
		{"a comment between two sections", strings.Replace(base, "\nbackend", "\n# servers\n\nbackend", 1),
			[]string{"config haproxy.cfg changed with no section explaining it"}},
		{"a blank line removed", strings.Replace(base, "web-servers\n\n", "web-servers\n", 1),
			[]string{"config haproxy.cfg changed with no section explaining it"}},
		{"a line of the backend", strings.Replace(base, "10.0.0.1", "10.0.0.9", 1),
			[]string{"core section backend web-servers changed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Diff(planOfFiles(t, map[string]string{"haproxy.cfg": c.config}), baseline)
			if d.Verdict != VerdictReload || !reflect.DeepEqual(d.Reasons, c.reasons) {
				t.Errorf("verdict %s reasons %q, want reload %q", d.Verdict, d.Reasons, c.reasons)
			}
		})
	}
}

// A Kubernetes ConfigMap or Secret mount: every name is a link into
// "..data", itself a link to a timestamped directory; a path with a
// directory ("maps/host.map") gets a link to a directory.
func TestPlanFromDirReadsAKubernetesMount(t *testing.T) {
	files := map[string]string{
		"haproxy.cfg":   "global\n    maxconn 100\n",
		"maps/host.map": "shop.example.com web\n",
	}
	want := planOfFiles(t, files)

	dir := t.TempDir()
	stamp := filepath.Join(dir, "..2026_03_01_10_00_00.123456789")
	for rel, content := range files {
		abs := filepath.Join(stamp, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(abs, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"..data":      filepath.Base(stamp),
		"haproxy.cfg": "..data/haproxy.cfg",
		"maps":        "..data/maps",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := PlanFromDir(dir)
	if err != nil {
		t.Fatalf("PlanFromDir of a mount: %v", err)
	}
	if got.ID != want.ID || len(got.Files) != 2 {
		t.Errorf("the mount's plan %s has %d files, want %s (the plain directory's) with 2", got.ID, len(got.Files), want.ID)
	}

	// A link that leaves the directory is refused, not followed or skipped.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.map"), []byte("k v\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.map"), filepath.Join(stamp, "maps", "secret.map")); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanFromDir(dir); err == nil || !strings.Contains(err.Error(), "maps/secret.map is a symbolic link to") ||
		!strings.Contains(err.Error(), "outside the directory") {
		t.Errorf("a link leaving the directory: %v", err)
	}
	os.Remove(filepath.Join(stamp, "maps", "secret.map"))
	if err := os.Symlink("absent.map", filepath.Join(stamp, "maps", "dangling.map")); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanFromDir(dir); err == nil || !strings.Contains(err.Error(), "does not resolve") {
		t.Errorf("a dangling link: %v", err)
	}
}
