// This file owns the mounts of the agent's tree: which directories below
// the base directory are volumes of their own, read from the kernel's mount
// table once at start, and which of them holds a path. Upstream HAPTIC's
// pods keep general/, maps/ and ssl/ on volumes of their own inside the
// base directory, and a link or a rename cannot cross a mount: two bind
// mounts of one filesystem share a device number, yet link(2) and rename(2)
// between them fail with EXDEV. So mount points count, not devices, and
// every mount gets its own staging and link directories: a file is staged,
// linked aside and renamed within the mount that holds it.
//
// It never reads the mount table again after start: a mount that appears
// later is found by the EXDEV it causes, which fails that apply cleanly
// and keeps the agent not ready until a restart sees it (crossedMount).

package haptic

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Where the mount table is, and how much of it is read: a pod has a few
// dozen mounts, a busy node a few thousand.
const (
	defaultMountInfo  = "/proc/self/mountinfo"
	maxMountInfoLines = 65536
)

// mount is one filesystem mount the tree spans.
type mount struct {
	root  string // absolute and resolved: the base directory, or a mount point below it
	mntID uint64 // the kernel's id of the mount root is reached through; 0 where the system cannot tell
}

// mounts are the tree's mounts, the deepest root first and the base last,
// so that the first whose root holds a path is the mount it lives on.
type mounts []mount

// probeMounts reads the mount table (field 5 of mountinfo is the mount
// point, octal escapes decoded) and returns the mounts at or below base. A
// system without the table has the base alone. A mount point below the base
// that is not a directory (a single file bind-mounted, as a Kubernetes
// subPath mounts one) is refused: a file mounted on its own cannot be
// replaced by a rename, so the agent could never install it atomically.
func probeMounts(mountInfo, base string, d disk) (mounts, error) {
	out := mounts{{root: base}}
	f, err := os.Open(mountInfo)
	if err != nil {
		return out, nil
	}
	defer f.Close()
	prefix := strings.TrimSuffix(base, "/") + "/"
	points := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 0; n < maxMountInfoLines && sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if p := unescapeMountField(fields[4]); strings.HasPrefix(p, prefix) && len(p) > len(prefix) {
			points[strings.TrimSuffix(p, "/")] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", mountInfo, err)
	}
	for root := range points {
		fi, err := d.Lstat(root)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // hidden by a mount on top of a parent: nothing can reach it
		case err != nil:
			return nil, err
		case !fi.IsDir():
			return nil, fmt.Errorf("%s is a single file mounted inside %s: a file mounted on its own cannot be replaced atomically (a rename onto it fails), so the agent cannot own it; mount the directory that holds it instead", root, base)
		}
		out = append(out, mount{root: root})
	}
	slices.SortFunc(out, func(a, b mount) int { return cmp.Compare(len(b.root), len(a.root)) })
	for i := range out {
		out[i].mntID, _ = d.MountID(out[i].root)
	}
	return out, nil
}

// unescapeMountField decodes the octal escapes the kernel writes into a
// mount point, the only four it writes (a backslash in a name is itself
// escaped); anything else stays as written.
var unescapeMountField = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace

// of returns the mount that holds abs: the deepest whose root is abs or a
// parent of it.
func (ms mounts) of(abs string) mount {
	for _, m := range ms {
		if abs == m.root || strings.HasPrefix(abs, m.root+"/") {
			return m
		}
	}
	return ms[len(ms)-1]
}

// onItsMount refuses a path a mount the start did not see now holds: the
// file would be renamed there from its mount's temp directory, across that
// mount. The kernel's mount id tells (the nearest existing parent of a new
// path is where it would be created); where the system cannot tell, the
// rename's own EXDEV does.
func (s *fileStore) onItsMount(rel string) error {
	abs := filepath.Join(s.base, filepath.FromSlash(rel))
	m := s.mounts.of(abs)
	for p, n := abs, 0; m.mntID != 0 && n <= maxPathDepth; p, n = filepath.Dir(p), n+1 {
		id, err := s.disk.MountID(p)
		switch {
		case errors.Is(err, fs.ErrNotExist) && p != m.root:
			continue
		case err == nil && id != m.mntID:
			return s.crossedMount(rel, syscall.EXDEV)
		}
		break
	}
	return nil
}

// crossedMount explains an EXDEV: rel lives on a mount the start did not
// see, so a link or rename between it and its mount's store directories
// crosses into another filesystem. An operator who adds a volume made
// neither a bug nor a change behind the agent's back: it is logged once,
// and reported by /readyz and the haptic_agent_late_mount gauge, not as an
// invariant.
func (s *fileStore) crossedMount(rel string, err error) error {
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	point := s.mountPointOf(filepath.Join(s.base, filepath.FromSlash(rel)))
	late := fmt.Errorf("%q is on a mount the agent did not see at its start (%s; %w): restart the agent so that it finds the mount", rel, point, err)
	s.mu.Lock()
	first := s.late == nil
	s.late = late
	s.mu.Unlock()
	if first {
		s.logger.Warn("a mount appeared under the tree after the agent started; pushes that touch it are refused, and the agent is not ready, until it restarts",
			"path", rel, "mount", point)
	}
	return late
}

// lateMount is the last push a mount made after the start refused, or nil.
func (s *fileStore) lateMount() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.late
}

// mountPointOf names the mount point of the volume that holds abs now (or
// its nearest existing parent), as the kernel's mount ids tell.
func (s *fileStore) mountPointOf(abs string) string {
	p := abs
	id, err := s.disk.MountID(p)
	for n := 0; errors.Is(err, fs.ErrNotExist) && p != s.base && n <= maxPathDepth; n++ {
		p = filepath.Dir(p)
		id, err = s.disk.MountID(p)
	}
	if err != nil || id == 0 {
		return "the system does not say where it is mounted"
	}
	for n := 0; p != s.base && n <= maxPathDepth; n++ {
		if up, err := s.disk.MountID(filepath.Dir(p)); err != nil || up != id {
			break
		}
		p = filepath.Dir(p)
	}
	return "mounted at " + p
}
