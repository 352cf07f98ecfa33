// This file owns the agent's file store: the path rules, mount probing,
// staging and digest verification of parts, patches, the write transaction
// with its backup journal and its undo, restore, tree hashing and the startup
// sweep. It never decides anything about HAProxy and never touches a path
// outside the base directory: every disk path it builds is the base directory
// joined with a validated manifest path, or one of its own dot-prefixed
// directories, which no manifest path can name.
//
// Durability is the ledger's to decide; the store says what a change needs
// to be durable (which directories to sync, which bytes a record must
// carry) and does the syncs it is asked for, nothing more.

package haptic

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Errors of the file store. Their texts reach the controller in answers and
// are part of the contract; callers and tests match them with errors.Is.
var (
	errInvalidPath      = errors.New("invalid manifest path")
	errDigestMismatch   = errors.New("part does not match its manifest digest")
	errPatchBaseMissing = errors.New("the patch base is not held")
)

// Directory and file names the store keeps for itself. Every one starts with
// a dot, so the path rules keep manifests away from them.
const (
	storeTempDir      = ".haptic-tmp"
	storeBackupDir    = ".haptic-lkg"
	storeRestorePrefx = ".haptic-restore-"
	storeCopyPattern  = ".copy-*"
	storePartPattern  = "part-*"
	storeUndoPrefix   = "u"
	storeFileMode     = 0o644
	storeDirMode      = 0o755
	defaultMountInfo  = "/proc/self/mountinfo"
	// maxMountInfoLines bounds the lines read from mountinfo; a pod has a
	// few dozen mounts, a busy node a few thousand.
	maxMountInfoLines = 65536
)

// Journal entry kinds: what undoing an entry does to its path (remove a
// created file, put back a modified or deleted one).
const (
	journalCreated  = "created"
	journalModified = "modified"
	journalDeleted  = "deleted"
)

// ---------------------------------------------------------------------------
// Path rules.

// validatePath applies the manifest path rules: relative, clean, at most
// MaxPathBytes, no dot-prefixed element. The dot rule keeps the state file,
// the store's own directories, restore staging files and the default admin
// socket out of any manifest's reach. The character rules (valid UTF-8, no
// control or bidirectional control character) are shared with the client
// (pathCharProblem).
func validatePath(rel string) error {
	why := ""
	chars := pathCharProblem(rel)
	switch {
	case rel == "":
		why = "is empty"
	case len(rel) > MaxPathBytes:
		why = fmt.Sprintf("exceeds %d bytes", MaxPathBytes)
	case path.IsAbs(rel):
		why = "is absolute"
	case rel != path.Clean(rel):
		why = "is not canonical"
	case strings.IndexByte(rel, 0) >= 0:
		why = "contains NUL"
	case chars != "":
		why = chars
	case hasDotComponent(rel):
		why = "has a component starting with a dot"
	default:
		return nil
	}
	return fmt.Errorf("%w: %q %s", errInvalidPath, rel, why)
}

func hasDotComponent(rel string) bool {
	for _, c := range strings.Split(rel, "/") {
		if strings.HasPrefix(c, ".") {
			return true
		}
	}
	return false
}

// canonicalPath makes p absolute and resolves symlinks on its parent
// directory only, so that a reserved socket that does not exist yet still
// compares equal to the path a manifest would reach it by.
func canonicalPath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		abs = filepath.Clean(p)
	}
	dir, base := filepath.Split(abs)
	if resolved, err := filepath.EvalSymlinks(dir); err == nil {
		dir = resolved
	}
	return filepath.Join(dir, base)
}

// ---------------------------------------------------------------------------
// The store and its mounts.

// fileStoreConfig configures newFileStore. MountInfo and Rename exist so
// that tests can describe mounts and inject EXDEV without privileges.
type fileStoreConfig struct {
	Base      string   // the base directory, as configured
	Reserved  []string // absolute paths no manifest path may resolve to
	Config    string   // manifest path of the HAProxy config (renamed and restored last)
	Logger    *slog.Logger
	MountInfo string                              // "" means /proc/self/mountinfo
	Rename    func(oldpath, newpath string) error // nil means the disk's Rename
	Disk      disk                                // nil means the operating system's
}

// fileStore is the agent's view of its base directory.
type fileStore struct {
	base     string   // resolved, absolute
	mounts   []string // mount roots, deepest first; the base is one of them
	reserved map[string]bool
	config   string
	logger   *slog.Logger
	disk     disk
	rename   func(oldpath, newpath string) error
	exchange func(oldpath, newpath string) error // nil: every install renames

	// What a power loss could still undo: files whose bytes were installed
	// without a sync (their content rides in a ledger record instead) and
	// directories whose entries changed without a sync. flush makes both
	// durable; a backup link to an unsynced file syncs that file first, so
	// that every link a record names leads to durable bytes.
	mu           sync.Mutex
	unsynced     map[string]bool
	unsyncedDirs map[string]bool

	undoSeq atomic.Uint64 // names undo links uniquely within a process

	// crossDevice counts installs that fell back to a copy because rename
	// said EXDEV: a mount the probe missed. It must stay zero (invariant
	// mount_probe_found_every_mount).
	crossDevice atomic.Uint64
}

// newFileStore resolves the base directory, probes its mounts and creates
// every mount's .haptic-tmp and .haptic-lkg: one pair per mount, so that
// every install and backup is a rename within one filesystem.
func newFileStore(cfg fileStoreConfig) (*fileStore, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	base, err := filepath.EvalSymlinks(cfg.Base)
	if err != nil {
		return nil, err
	}
	if base, err = filepath.Abs(base); err != nil {
		return nil, err
	}
	d := cfg.Disk
	if d == nil {
		d = osDisk{}
	}
	fi, err := os.Stat(base)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", base)
	}
	s := &fileStore{
		base:         base,
		reserved:     make(map[string]bool, len(cfg.Reserved)),
		config:       cfg.Config,
		logger:       logger,
		disk:         d,
		rename:       cfg.Rename,
		unsynced:     map[string]bool{},
		unsyncedDirs: map[string]bool{},
	}
	if s.rename == nil {
		s.rename = d.Rename
		s.exchange = d.Exchange
	}
	for _, r := range cfg.Reserved {
		if r != "" { // an optional socket that is off
			s.reserved[canonicalPath(r)] = true
		}
	}
	s.mounts = s.probeMounts(cfg.MountInfo)
	for _, m := range s.mounts {
		for _, name := range []string{storeTempDir, storeBackupDir} {
			if err := ensureStoreDir(s.disk, filepath.Join(m, name)); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// ensureStoreDir creates one of the store's own directories, or checks the
// one already there, and sets its mode. The agent deletes every entry of
// .haptic-tmp, links backups into .haptic-lkg and chmods both, so a link
// planted in their place would carry those deletes, links and chmods to
// wherever it points: such a directory is refused, never followed.
func ensureStoreDir(d disk, p string) error {
	if err := d.Mkdir(p, storeDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := checkOwnedPath(d, p, true); err != nil {
		return err
	}
	// Mkdir leaves an existing directory's mode alone and the umask
	// narrows a new one; the mode is part of the contract.
	return d.Chmod(p, storeDirMode)
}

// checkOwnedPath refuses a path the agent keeps for itself (its store's
// directories, its state file, its plan blob) when it is a symbolic link,
// is not a directory (wantDir) or a regular file (!wantDir), or is not
// owned by the agent's effective uid: the agent reads, replaces, deletes
// and chmods these paths, and must do so only on files that are its own.
// A path that does not exist passes: the agent creates it itself.
func checkOwnedPath(d disk, p string, wantDir bool) error {
	fi, err := d.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link; the agent's own files and directories must be real ones, so that it never writes, deletes or changes modes elsewhere", p)
	case wantDir && !fi.IsDir():
		return fmt.Errorf("%s is not a directory", p)
	case !wantDir && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", p)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the agent's uid %d", p, st.Uid, os.Geteuid())
	}
	return nil
}

// probeMounts lists the mount roots at or below the base, deepest first.
// Hard links cannot cross mounts, and two bind mounts of one filesystem
// share st_dev yet still refuse link(2), so mount points are what counts,
// not devices.
func (s *fileStore) probeMounts(mountInfo string) []string {
	if mountInfo == "" {
		mountInfo = defaultMountInfo
	}
	roots := []string{s.base}
	f, err := os.Open(mountInfo)
	if err != nil {
		s.logger.Debug("mount table unreadable; the base directory is the only mount", "path", mountInfo, "err", err)
		return roots
	}
	defer f.Close()
	points, err := parseMountInfo(f, s.base)
	if err != nil {
		s.logger.Warn("mount table read failed; using the mounts read so far", "path", mountInfo, "err", err)
	}
	for _, p := range points {
		if slices.Contains(roots, p) {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() {
			// A bind-mounted single file cannot be replaced atomically; a
			// write to it fails, which is the honest outcome.
			s.logger.Warn("mount point below the base directory is not a directory; skipped", "path", p)
			continue
		}
		roots = append(roots, p)
	}
	sortMountRoots(roots)
	return roots
}

// sortMountRoots orders roots longest first, so the deepest mount wins.
func sortMountRoots(roots []string) {
	slices.SortFunc(roots, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
}

// parseMountInfo returns the mount points (field 5 of /proc/self/mountinfo,
// octal escapes decoded) strictly below root.
func parseMountInfo(r io.Reader, root string) ([]string, error) {
	prefix := strings.TrimSuffix(root, "/") + "/"
	var points []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 0; n < maxMountInfoLines && sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountField(fields[4])
		if strings.HasPrefix(p, prefix) && len(p) > len(prefix) {
			points = append(points, filepath.Clean(p))
		}
	}
	return points, sc.Err()
}

// unescapeMountField decodes the kernel's octal escapes (\040 space, \011
// tab, \012 newline, \134 backslash); anything else stays as written.
func unescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// mountFor returns the root of the mount holding abs: the first (deepest)
// root equal to abs or a prefix of it followed by "/"; the base otherwise.
func (s *fileStore) mountFor(abs string) string {
	for _, m := range s.mounts {
		if abs == m || strings.HasPrefix(abs, m+"/") {
			return m
		}
	}
	return s.base
}

// abs validates rel and returns its absolute path, refusing a path that
// resolves to one of the agent's sockets or its state file.
func (s *fileStore) abs(rel string) (string, error) {
	if err := validatePath(rel); err != nil {
		return "", err
	}
	abs := filepath.Join(s.base, filepath.FromSlash(rel))
	reserved := func() error { return fmt.Errorf("%w: %q is a reserved path", errInvalidPath, rel) }
	if s.reserved[abs] {
		return "", reserved()
	}
	// The base is resolved, so a path through no link is its own canonical
	// form; only a path through a link is resolved, to tell a reserved path
	// reached by a link from any other link.
	if err := s.refuseSymlinkedDirs(rel); err != nil {
		if s.reserved[canonicalPath(abs)] {
			return "", reserved()
		}
		return "", err
	}
	return abs, nil
}

// refuseSymlinkedDirs refuses a path whose existing parent directories
// include a symbolic link. The base itself is resolved once at startup, but
// a link inside the tree (base/link -> ../elsewhere) would carry a write,
// a read or a delete of link/x outside the base directory. A directory that
// does not exist yet is created as a real one by write, so the walk stops at
// the first missing component. (Someone who can create links in the tree
// between this check and the rename can still race it; the tree belongs to
// the agent.)
func (s *fileStore) refuseSymlinkedDirs(rel string) error {
	dir := s.base
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, part)
		fi, err := s.disk.Lstat(dir)
		if err != nil {
			return nil // absent (created by Write) or unreadable (fails later)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %q passes through a symbolic link", errInvalidPath, rel)
		}
	}
	return nil
}

// notRegular is the error for a path that exists but is not a regular file.
func notRegular(rel string) error {
	return fmt.Errorf("%w: %q is not a regular file", errInvalidPath, rel)
}

// ---------------------------------------------------------------------------
// Staging.

// maxInlineBytes is the size up to which a file's bytes ride inside the
// ledger's records (the new bytes in the commit, the old ones in the
// intent) instead of being synced to disk on the apply's path: writing a
// few kilobytes into a record that is synced anyway is far cheaper than a
// file sync and a directory sync, and a typical map or certificate is well
// below it. A larger file is synced before its rename and its directory
// before the commit.
const maxInlineBytes = 64 << 10

// maxInlinePerApply bounds the bytes one commit record carries: past it, an
// apply's remaining small files are synced like large ones, so that no
// record grows beyond what a restart reads back in one go.
const maxInlinePerApply = 4 << 20

// stagedFile is one verified part waiting in its mount's .haptic-tmp.
type stagedFile struct {
	Rel       string
	abs       string
	tmp       string
	Digest    string
	Size      int64
	installed bool

	// unchanged: the live file already holds exactly these bytes, so the
	// part is neither renamed nor journalled. The temp file is gone.
	unchanged bool
	// inline holds the bytes of a file no larger than maxInlineBytes; such
	// a file is not synced when staged, since its bytes go into the commit
	// record.
	inline []byte
	// createdDirs are the directories its install created.
	createdDirs []string
}

// discard removes the temp file unless it was installed.
func (f *stagedFile) discard(d disk) {
	if f != nil && !f.installed && f.tmp != "" {
		d.Remove(f.tmp)
	}
}

// stage copies a whole part into the target's mount and verifies it against
// the manifest's size and digest.
func (s *fileStore) stage(rel string, r io.Reader, digest string, size int64) (*stagedFile, error) {
	abs, err := s.abs(rel)
	if err != nil {
		return nil, err
	}
	return s.stageWith(rel, abs, digest, size, func(w io.Writer) (int64, error) {
		return copyAtMostOneMore(w, r, size)
	})
}

// copyAtMostOneMore copies at most want+1 bytes of r into w and returns the
// count: one byte past want proves the part too long, so a longer part
// reports want+1 bytes, in stage and stagePatch alike, and neither the disk
// nor the reader is asked for more. The limit saturates at MaxInt64 and a
// negative want copies nothing.
func copyAtMostOneMore(w io.Writer, r io.Reader, want int64) (int64, error) {
	limit := max(want, -1)
	if limit < math.MaxInt64 {
		limit++
	}
	n, err := copyAtMost(w, r, limit)
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// stageWith fills a part with fill (which reports the byte count),
// verifies size and digest, and leaves it in a temp file of abs's mount at
// mode 0644. A part small enough to ride in the commit record is built in
// memory first: when the live file already holds its bytes it needs no temp
// file at all, and when it does not, its temp file is not synced. On any
// error no temp file is left.
func (s *fileStore) stageWith(rel, abs, digest string, size int64, fill func(io.Writer) (int64, error)) (*stagedFile, error) {
	if size < 0 || size > maxInlineBytes {
		return s.stageStream(rel, abs, digest, size, fill)
	}
	var buf bytes.Buffer
	buf.Grow(int(size))
	h := newDigestHasher()
	n, err := fill(io.MultiWriter(&buf, h))
	if err != nil {
		return nil, err
	}
	if err := verifyPart(rel, n, size, FormatDigest(h.Sum64()), digest); err != nil {
		return nil, err
	}
	sf := &stagedFile{Rel: rel, abs: abs, Digest: digest, Size: size, inline: buf.Bytes()}
	if s.holds(abs, digest, size) {
		sf.unchanged = true
		return sf, nil
	}
	tmp, err := s.writeTemp(rel, abs, func(w io.Writer) error {
		_, err := w.Write(sf.inline)
		return err
	}, false)
	if err != nil {
		return nil, err
	}
	sf.tmp = tmp
	return sf, nil
}

// stageStream stages a large part straight into its temp file, synced: its
// rename is only as durable as its bytes.
func (s *fileStore) stageStream(rel, abs, digest string, size int64, fill func(io.Writer) (int64, error)) (*stagedFile, error) {
	var n int64
	h := newDigestHasher()
	tmp, err := s.writeTemp(rel, abs, func(w io.Writer) error {
		var err error
		n, err = fill(io.MultiWriter(w, h))
		if err != nil {
			return err
		}
		return verifyPart(rel, n, size, FormatDigest(h.Sum64()), digest)
	}, true)
	if err != nil {
		return nil, err
	}
	return &stagedFile{Rel: rel, abs: abs, tmp: tmp, Digest: digest, Size: size}, nil
}

// verifyPart checks a part's byte count and digest against the manifest's.
func verifyPart(rel string, n, size int64, got, digest string) error {
	if n != size {
		return fmt.Errorf("%w: %q is %d bytes, manifest says %d", errDigestMismatch, rel, n, size)
	}
	if got != digest {
		return fmt.Errorf("%w: %q hashes to %s, manifest says %s", errDigestMismatch, rel, got, digest)
	}
	return nil
}

// writeTemp creates a temp file in abs's mount, fills it, sets mode 0644,
// syncs it when asked and closes it. On any error the file is gone. The
// errors of the agent's own disk are staging faults of rel; fill's own
// (the client's body) are returned as they are.
func (s *fileStore) writeTemp(rel, abs string, fill func(io.Writer) error, sync bool) (_ string, err error) {
	f, err := s.disk.CreateTemp(filepath.Join(s.mountFor(abs), storeTempDir), storePartPattern)
	if err != nil {
		return "", diskFault(rel, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			s.disk.Remove(tmp)
		}
	}()
	if err = fill(faultWriter{rel, f}); err != nil {
		return "", err
	}
	if err = f.Chmod(storeFileMode); err != nil {
		return "", diskFault(rel, err)
	}
	if sync {
		if err = f.Sync(); err != nil {
			return "", diskFault(rel, err)
		}
	}
	if err = f.Close(); err != nil {
		return "", diskFault(rel, err)
	}
	return tmp, nil
}

// markUnchanged drops from the transaction's installs every part whose
// bytes the live file already holds: it is neither renamed nor journalled,
// and its temp file goes. It runs under the apply lock, since an apply that
// landed while this one's parts streamed in may have changed the file.
func (s *fileStore) markUnchanged(t *fileTxn) error {
	kept := t.installs[:0]
	for _, f := range t.installs {
		if f.unchanged || s.holds(f.abs, f.Digest, f.Size) {
			f.discard(s.disk)
			f.tmp, f.unchanged = "", true
			continue
		}
		kept = append(kept, f)
	}
	t.installs = kept
	return nil
}

// holds reports whether the live file at abs is a regular file with exactly
// this size and digest. Disk is the authority: the file is hashed, not
// looked up in the agent's tree, so a file edited behind the agent's back
// is rewritten.
func (s *fileStore) holds(abs, digest string, size int64) bool {
	fi, err := s.disk.Lstat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return false
	}
	at, err := s.digestAbs(abs)
	return err == nil && at.Digest == digest && at.Size == size
}

// stagingFault is a failure of the agent's own disk while it stages a part
// (creating, writing, syncing the temp file, or reading a patch's held
// base): the part may well be fine, the agent could not keep it. The apply
// handler answers it as the agent's fault, so that a controller retries
// later instead of treating its render as broken.
type stagingFault struct {
	rel string
	err error
}

func (e *stagingFault) Error() string {
	what := "the agent's disk failed"
	if isNoSpace(e.err) {
		what = "the agent's disk is full"
	}
	return fmt.Sprintf("cannot stage %q: %s: %v", e.rel, what, e.err)
}

func (e *stagingFault) Unwrap() error { return e.err }

// isNoSpace reports a full filesystem or an exhausted quota.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// diskFault marks err as a staging fault of rel, unless it already is one.
func diskFault(rel string, err error) error {
	var fault *stagingFault
	if err == nil || errors.As(err, &fault) {
		return err
	}
	return &stagingFault{rel: rel, err: err}
}

// faultWriter marks the write errors of a staging temp file as staging
// faults, so that they are told apart from the errors of the part's reader
// (the client's body) that the same copy returns.
type faultWriter struct {
	rel string
	w   io.Writer
}

func (w faultWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	return n, diskFault(w.rel, err)
}

// stagePatch builds the new file from the held base and the replacement
// bytes in r. A base the agent does not hold is errPatchBaseMissing: the
// path goes into the 409 Missing answer.
func (s *fileStore) stagePatch(rel string, r io.Reader, p *FilePatch, digest string, size int64) (*stagedFile, error) {
	abs, err := s.abs(rel)
	if err != nil {
		return nil, err
	}
	base, err := s.openBase(abs, p)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	// The fit rule, written so that no sum can overflow: offset + length >
	// base_size with offset 1 and length MaxInt64 wraps negative and would
	// pass. openBase has made base_size the held file's real size, so it is
	// >= 0, and base_size - length (the base bytes that survive) is within
	// [0, base_size] once offset and length fit; the replacement length is
	// computed only then.
	if p.Offset < 0 || p.Length < 0 || p.Offset > p.BaseSize || p.Length > p.BaseSize-p.Offset ||
		size < p.BaseSize-p.Length {
		return nil, fmt.Errorf("patch for %q does not fit its base: offset %d, length %d, base %d bytes", rel, p.Offset, p.Length, p.BaseSize)
	}
	repl := size - (p.BaseSize - p.Length)
	return s.stageWith(rel, abs, digest, size, func(w io.Writer) (int64, error) {
		// Only the replacement bytes come from the client; every other
		// error here is the held base's, on the agent's own disk.
		if _, err := base.Seek(0, io.SeekStart); err != nil {
			return 0, diskFault(rel, err)
		}
		head, err := copyAtMost(w, base, p.Offset)
		if err != nil {
			return 0, diskFault(rel, err)
		}
		mid, err := copyAtMostOneMore(w, r, repl)
		if err != nil {
			return 0, err
		}
		if _, err := base.Seek(p.Offset+p.Length, io.SeekStart); err != nil {
			return 0, diskFault(rel, err)
		}
		tail, err := copyBytes(w, base)
		if err != nil {
			return 0, diskFault(rel, err)
		}
		return head + mid + tail, nil
	})
}

// openBase opens the held file a patch applies to, if it is exactly the
// base the patch names.
func (s *fileStore) openBase(abs string, p *FilePatch) (diskFile, error) {
	fi, err := s.disk.Lstat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != p.BaseSize {
		return nil, errPatchBaseMissing
	}
	f, err := s.disk.Open(abs)
	if err != nil {
		return nil, errPatchBaseMissing
	}
	h := newDigestHasher()
	n, err := copyBytes(h, f)
	if err != nil || n != p.BaseSize || FormatDigest(h.Sum64()) != p.BaseDigest {
		f.Close()
		return nil, errPatchBaseMissing
	}
	return f, nil
}

// ---------------------------------------------------------------------------
// The transaction.

// deletions returns the owned paths the manifest no longer lists, sorted:
// absence means delete, but only for paths the agent owns. An owned path the
// current path rules refuse (written by an older agent with laxer rules) is
// left on disk and drops out of the ownership set: deleting it would fail
// the path check and abort every apply that omits it, while no manifest may
// name it any more.
func deletions(owned []string, files []ManifestFile) []string {
	want := make(map[string]bool, len(files))
	for _, f := range files {
		want[f.Path] = true
	}
	var out []string
	for _, p := range owned {
		if !want[p] && validatePath(p) == nil {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// fileTxn holds the installs and deletions of one apply, and what backup
// learnt about how to undo them.
type fileTxn struct {
	store    *fileStore
	sent     int           // parts sent, unchanged ones included
	installs []*stagedFile // sorted by path; unchanged parts left out
	deletes  []string      // sorted

	// undo puts every path this transaction touches back as it was before
	// it, config last; it is what a crash in the middle of the apply is
	// recovered with. linkDirs are the backup directories that received a
	// link, whose entries must be durable before the first rename.
	undo     []undoEntry
	linkDirs []string
}

// begin opens the transaction of one apply: every changed staged file is an
// install, every path of dels a delete. Directories are never removed.
func (s *fileStore) begin(staged []*stagedFile, dels []string) *fileTxn {
	t := &fileTxn{store: s, sent: len(staged), deletes: slices.Clone(dels)}
	for _, f := range staged {
		if !f.unchanged {
			t.installs = append(t.installs, f)
		}
	}
	slices.SortFunc(t.installs, func(a, b *stagedFile) int { return strings.Compare(a.Rel, b.Rel) })
	slices.Sort(t.deletes)
	return t
}

// changes counts the parts sent and the deletes. Any part sent counts, even
// with identical content: that decides file_only against noop.
func (t *fileTxn) changes() int { return t.sent + len(t.deletes) }

// touches reports whether the transaction renames or unlinks anything.
func (t *fileTxn) touches() bool { return len(t.installs)+len(t.deletes) > 0 }

// ---------------------------------------------------------------------------
// The backup journal and the undo.

// journalEntry records how one path looked while the LKG plan was current.
type journalEntry struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"`
	Backup string `json:"backup,omitempty"`
}

// backupJournal is persisted as {"entries": [...]}.
type backupJournal struct {
	Entries []journalEntry `json:"entries,omitempty"`
}

// clone copies the journal, so that a saved snapshot never aliases the live one.
func (j backupJournal) clone() backupJournal {
	return backupJournal{Entries: slices.Clone(j.Entries)}
}

// backups lists the backup links the journal references.
func (j backupJournal) backups() []string {
	var out []string
	for _, e := range j.Entries {
		if e.Backup != "" {
			out = append(out, e.Backup)
		}
	}
	return out
}

// undoEntry says how one path looked just before an apply: absent, held in
// a link (a journal backup or a link of its own), or these bytes.
type undoEntry struct {
	Path   string `json:"path"`
	Absent bool   `json:"absent,omitempty"`
	Link   string `json:"link,omitempty"`
	Data   []byte `json:"data,omitempty"`
}

// backup records, for every path the transaction touches, how it looked
// before: in the journal, the first entry for a path wins, so the LKG
// version is kept across several applies that precede the next reload; in
// the undo, how it looked just before this apply. The journal's new backup
// links serve both; a path the journal already holds gets its own undo (its
// bytes when small, a link otherwise).
func (t *fileTxn) backup(j *backupJournal) error {
	if n := len(t.installs) + len(t.deletes); n > MaxFiles {
		return fmt.Errorf("%d changes exceed the %d-file limit", n, MaxFiles)
	}
	seen := make(map[string]bool, len(j.Entries))
	for _, e := range j.Entries {
		seen[e.Path] = true
	}
	for _, f := range t.installs {
		if err := t.backupPath(j, seen, f.Rel, f.abs, true); err != nil {
			return err
		}
	}
	for _, rel := range t.deletes {
		abs, err := t.store.abs(rel)
		if err != nil {
			return err
		}
		if err := t.backupPath(j, seen, rel, abs, false); err != nil {
			return err
		}
	}
	slices.Sort(t.linkDirs)
	t.linkDirs = slices.Compact(t.linkDirs)
	return nil
}

// backupPath journals and undoes one path: a tombstone when an install
// creates it, a hard link aside when it exists. An absent path that is
// being deleted needs neither, and neither does anything but a regular
// file: write refuses to replace or unlink it, and the apply aborts there.
func (t *fileTxn) backupPath(j *backupJournal, seen map[string]bool, rel, abs string, install bool) error {
	s := t.store
	fi, err := s.disk.Lstat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if install {
			t.undo = append(t.undo, undoEntry{Path: rel, Absent: true})
			if !seen[rel] {
				j.Entries = append(j.Entries, journalEntry{Path: rel, Kind: journalCreated})
				seen[rel] = true
			}
		}
		return nil
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return nil
	}
	if seen[rel] {
		return t.undoOwn(rel, abs, fi.Size())
	}
	bak := filepath.Join(s.mountFor(abs), storeBackupDir, fmt.Sprintf("%d-%s.bak", len(j.Entries), DigestString(rel)))
	if err := s.linkAside(abs, bak); err != nil {
		return err
	}
	kind := journalModified
	if !install {
		kind = journalDeleted
	}
	j.Entries = append(j.Entries, journalEntry{Path: rel, Kind: kind, Backup: bak})
	seen[rel] = true
	t.undo = append(t.undo, undoEntry{Path: rel, Link: bak})
	t.linkDirs = append(t.linkDirs, filepath.Dir(bak))
	return nil
}

// undoOwn keeps the current bytes of a path the journal already holds (the
// journal keeps an older version): inline when small, as a link otherwise.
func (t *fileTxn) undoOwn(rel, abs string, size int64) error {
	s := t.store
	if size <= maxInlineBytes {
		b, err := readAllLimited(s.disk, abs, maxInlineBytes)
		if err != nil {
			return err
		}
		t.undo = append(t.undo, undoEntry{Path: rel, Data: b})
		return nil
	}
	link := filepath.Join(s.mountFor(abs), storeBackupDir,
		fmt.Sprintf("%s%d-%s.bak", storeUndoPrefix, s.undoSeq.Add(1), DigestString(rel)))
	if err := s.linkAside(abs, link); err != nil {
		return err
	}
	t.undo = append(t.undo, undoEntry{Path: rel, Link: link})
	t.linkDirs = append(t.linkDirs, filepath.Dir(link))
	return nil
}

// linkAside hard-links abs to bak, replacing a stale link at that name. A
// link to bytes a power loss could still take is only as good as those
// bytes, so an unsynced file is synced first.
func (s *fileStore) linkAside(abs, bak string) error {
	if err := s.disk.Remove(bak); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := s.syncFileIfUnsynced(abs); err != nil {
		return err
	}
	return s.disk.Link(abs, bak)
}

// undoLinks lists the links an undo made of its own (not journal backups).
func undoLinks(undo []undoEntry) []string {
	var out []string
	for _, u := range undo {
		if u.Link != "" && strings.HasPrefix(filepath.Base(u.Link), storeUndoPrefix) {
			out = append(out, u.Link)
		}
	}
	return out
}

// dropLinks deletes backup or undo links no record references any more.
func (s *fileStore) dropLinks(links []string) {
	for _, l := range links {
		if err := s.disk.Remove(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Warn("could not remove a backup link", "path", l, "err", err)
		}
	}
}

// dropBackups deletes the journal's backup links (the journal itself is the
// caller's to clear).
func (s *fileStore) dropBackups(j backupJournal) { s.dropLinks(j.backups()) }

// ---------------------------------------------------------------------------
// Installing the staged set.

// write installs every changed staged file, the config last, then unlinks
// the deletions. The config goes last because HAProxy re-reads it on
// reload and every file it names must already be in place.
func (t *fileTxn) write() error {
	s := t.store
	var config *stagedFile
	for _, f := range t.installs {
		if f.Rel == s.config {
			config = f
			continue
		}
		if err := s.install(f); err != nil {
			return err
		}
	}
	if config != nil {
		if err := s.install(config); err != nil {
			return err
		}
	}
	var errs []error
	for _, rel := range t.deletes {
		errs = append(errs, s.unlink(rel))
	}
	return errors.Join(errs...)
}

// discardStaged removes the temp files of staged parts that were not installed.
func (t *fileTxn) discardStaged() {
	for _, f := range t.installs {
		f.discard(t.store.disk)
	}
}

// syncInstalled makes installed files durable without a record: their
// bytes (a large file's were synced when it was staged), then the entries
// of their directories.
func (s *fileStore) syncInstalled(files []*stagedFile) error {
	var dirs []string
	for _, f := range files {
		if f.inline != nil {
			if err := s.syncFile(f.abs); err != nil {
				return err
			}
		}
		s.mu.Lock()
		delete(s.unsynced, f.abs)
		s.mu.Unlock()
		dirs = append(dirs, filepath.Dir(f.abs))
		for _, d := range f.createdDirs {
			dirs = append(dirs, filepath.Dir(d))
		}
	}
	slices.Sort(dirs)
	return s.syncDirs(slices.Compact(dirs))
}

func (s *fileStore) refuseNonRegular(rel, abs string) error {
	fi, err := s.disk.Lstat(abs)
	if err == nil && !fi.Mode().IsRegular() {
		return notRegular(rel)
	}
	return nil
}

// install renames one staged file onto its target, falling back to a copy
// when the rename crosses a mount the probe did not see.
func (s *fileStore) install(f *stagedFile) error {
	if err := s.refuseNonRegular(f.Rel, f.abs); err != nil {
		return err
	}
	created, err := mkdirAll(s.disk, filepath.Dir(f.abs), storeDirMode)
	s.noteDirs(created)
	f.createdDirs = created
	if err != nil {
		return err
	}
	err = s.replaceLive(f.tmp, f.abs)
	if errors.Is(err, syscall.EXDEV) {
		s.crossDevice.Add(1)
		s.logger.Warn("rename crossed a mount the probe did not find; copying instead", "path", f.Rel)
		err = s.copyInto(f.tmp, f.abs)
		if err == nil {
			s.disk.Remove(f.tmp)
		}
	}
	if err != nil {
		return err
	}
	f.installed = true
	s.mu.Lock()
	if f.inline != nil {
		s.unsynced[f.abs] = true
	}
	s.unsyncedDirs[filepath.Dir(f.abs)] = true
	s.mu.Unlock()
	return nil
}

// replaceLive puts tmp at abs atomically. Over an existing file it swaps the
// two names and removes the temp name, which now holds the old file: a
// rename over an existing file makes ext4 flush the new file's data first
// (its protection for programs that never sync), which costs more than the
// apply's own syncs, and the agent's durability comes from its log anyway.
func (s *fileStore) replaceLive(tmp, abs string) error {
	if s.exchange != nil {
		if fi, err := s.disk.Lstat(abs); err == nil && fi.Mode().IsRegular() {
			err := s.exchange(tmp, abs)
			if err == nil {
				if err := s.disk.Remove(tmp); err != nil {
					s.logger.Warn("could not remove a replaced file's temp name", "path", tmp, "err", err)
				}
				return nil
			}
			if !errors.Is(err, syscall.ENOSYS) && !errors.Is(err, syscall.EINVAL) {
				return err
			}
		}
	}
	return s.rename(tmp, abs)
}

// noteDirs records directories mkdirAll created: their parents' entries are
// not durable yet.
func (s *fileStore) noteDirs(created []string) {
	if len(created) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range created {
		s.unsyncedDirs[filepath.Dir(d)] = true
	}
}

// copyInto copies src to a sibling of dst and renames it into place, so
// that dst is replaced atomically even when src lives on another mount.
func (s *fileStore) copyInto(src, dst string) error {
	in, err := s.disk.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return replaceFile(s.disk, dst, storeCopyPattern, storeFileMode, in)
}

// replaceFile writes r to a temp file beside dst (pattern names it), sets
// its mode, syncs it and renames it over dst, so that dst is either the old
// file or the whole new one. On any failure the temp file is removed. The
// rename itself is durable only once the directory is synced, which is the
// caller's to decide.
func replaceFile(d disk, dst, pattern string, mode fs.FileMode, r io.Reader) (err error) {
	f, err := d.CreateTemp(filepath.Dir(dst), pattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			d.Remove(tmp)
		}
	}()
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if _, err = copyBytes(f, r); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return d.Rename(tmp, dst)
}

func (s *fileStore) unlink(rel string) error {
	abs, err := s.abs(rel)
	if err != nil {
		return err
	}
	if err := s.refuseNonRegular(rel, abs); err != nil {
		return err
	}
	if err := s.disk.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.mu.Lock()
	delete(s.unsynced, abs)
	s.unsyncedDirs[filepath.Dir(abs)] = true
	s.mu.Unlock()
	return nil
}

// ---------------------------------------------------------------------------
// Durability.

// syncDirs makes the entries of the given directories durable.
func (s *fileStore) syncDirs(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		errs = append(errs, s.disk.SyncDir(d))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.mu.Lock()
	for _, d := range dirs {
		delete(s.unsyncedDirs, d)
	}
	s.mu.Unlock()
	return nil
}

// syncFileIfUnsynced syncs the bytes of a file installed without a sync.
func (s *fileStore) syncFileIfUnsynced(abs string) error {
	s.mu.Lock()
	unsynced := s.unsynced[abs]
	s.mu.Unlock()
	if !unsynced {
		return nil
	}
	if err := s.syncFile(abs); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.unsynced, abs)
	s.mu.Unlock()
	return nil
}

func (s *fileStore) syncFile(abs string) error {
	f, err := s.disk.OpenFile(abs, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// flush makes every change the store made so far durable: the bytes of
// every file installed without a sync, then every changed directory. After
// it, the ledger may drop the records that carried those bytes.
func (s *fileStore) flush() error {
	s.mu.Lock()
	files := slices.Sorted(maps.Keys(s.unsynced))
	dirs := slices.Sorted(maps.Keys(s.unsyncedDirs))
	s.mu.Unlock()
	var errs []error
	for _, f := range files {
		err := s.syncFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			err = nil // replaced or removed since; its directory is synced below
		}
		if err == nil {
			s.mu.Lock()
			delete(s.unsynced, f)
			s.mu.Unlock()
		}
		errs = append(errs, err)
	}
	// A directory that is gone needs no sync; its parent's does.
	var live []string
	for _, d := range dirs {
		if _, err := s.disk.Lstat(d); err == nil {
			live = append(live, d)
		} else {
			s.mu.Lock()
			delete(s.unsyncedDirs, d)
			s.unsyncedDirs[filepath.Dir(d)] = true
			s.mu.Unlock()
			live = append(live, filepath.Dir(d))
		}
	}
	slices.Sort(live)
	errs = append(errs, s.syncDirs(slices.Compact(live)))
	return errors.Join(errs...)
}

// ---------------------------------------------------------------------------
// Restoring a journal.

// restore puts every journalled path back as it was while the LKG plan was
// current, the config last: created files are removed, modified and deleted
// ones are linked back from their backups. A path that cannot be restored
// keeps its current content; the errors are joined.
func (s *fileStore) restore(j backupJournal) error {
	undo := make([]undoEntry, len(j.Entries))
	for i, e := range j.Entries {
		switch e.Kind {
		case journalCreated:
			undo[i] = undoEntry{Path: e.Path, Absent: true}
		case journalModified, journalDeleted:
			undo[i] = undoEntry{Path: e.Path, Link: e.Backup}
		default:
			return fmt.Errorf("restore %q: unknown journal entry kind %q", e.Path, e.Kind)
		}
	}
	return s.applyUndo(undo)
}

// applyUndo puts each path back as its entry says, the config last.
func (s *fileStore) applyUndo(undo []undoEntry) error {
	var errs []error
	var config *undoEntry
	for i := range undo {
		if undo[i].Path == s.config {
			config = &undo[i]
			continue
		}
		errs = append(errs, s.undoPath(undo[i]))
	}
	if config != nil {
		errs = append(errs, s.undoPath(*config))
	}
	return errors.Join(errs...)
}

func (s *fileStore) undoPath(u undoEntry) error {
	abs, err := s.abs(u.Path)
	if err != nil {
		return err
	}
	switch {
	case u.Absent:
		fi, err := s.disk.Lstat(abs)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.IsDir() {
			// Directories are never removed: this one is not a file the
			// apply created.
			return nil
		}
		if err := s.disk.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("restore %q: %w", u.Path, err)
		}
	case u.Link != "":
		if err := s.relink(u.Path, abs, u.Link); err != nil {
			return err
		}
	default:
		if _, err := s.rewrite(u.Path, abs, u.Data); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.unsyncedDirs[filepath.Dir(abs)] = true
	s.mu.Unlock()
	return nil
}

// relink puts a backup's bytes back at abs: the backup is hard-linked to a
// sibling .haptic-restore-<base>, which is renamed onto the path. If the
// path already is that backup (two links to one inode, where rename does
// nothing), the staging link is removed.
func (s *fileStore) relink(rel, abs, backup string) error {
	// A path still holding its backup's very file (the apply never got to
	// replace it) needs nothing: a rollback of a tree left intact must
	// succeed even where the directory refuses new entries.
	if cur, err := s.disk.Lstat(abs); err == nil {
		if bak, err := s.disk.Lstat(backup); err == nil && os.SameFile(cur, bak) {
			return nil
		}
	}
	created, err := mkdirAll(s.disk, filepath.Dir(abs), storeDirMode)
	s.noteDirs(created)
	if err != nil {
		return fmt.Errorf("restore %q: %w", rel, err)
	}
	staging := filepath.Join(filepath.Dir(abs), storeRestorePrefx+filepath.Base(abs))
	if err := s.disk.Remove(staging); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restore %q: %w", rel, err)
	}
	if err := s.disk.Link(backup, staging); err != nil {
		return fmt.Errorf("restore %q: %w", rel, err)
	}
	if err := s.rename(staging, abs); err != nil {
		s.disk.Remove(staging)
		return fmt.Errorf("restore %q: %w", rel, err)
	}
	if _, err := s.disk.Lstat(staging); err == nil {
		s.disk.Remove(staging)
	}
	s.mu.Lock()
	delete(s.unsynced, abs) // a backup's bytes are durable
	s.mu.Unlock()
	return nil
}

// rewrite puts the given bytes at abs through a synced temp file in the
// path's mount, and reports whether the file did not already hold them. A
// file that does may hold them only in the page cache (a process crash
// after an install whose bytes rode in a record), so it is marked for the
// next flush rather than trusted.
func (s *fileStore) rewrite(rel, abs string, data []byte) (changed bool, err error) {
	created, err := mkdirAll(s.disk, filepath.Dir(abs), storeDirMode)
	s.noteDirs(created)
	if err != nil {
		return len(created) > 0, fmt.Errorf("restore %q: %w", rel, err)
	}
	if s.holds(abs, DigestString(string(data)), int64(len(data))) {
		s.mu.Lock()
		s.unsynced[abs] = true
		s.unsyncedDirs[filepath.Dir(abs)] = true
		s.mu.Unlock()
		return false, nil
	}
	tmp, err := s.writeTemp(rel, abs, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, true)
	if err != nil {
		return false, fmt.Errorf("restore %q: %w", rel, err)
	}
	if err := s.rename(tmp, abs); err != nil {
		s.disk.Remove(tmp)
		return false, fmt.Errorf("restore %q: %w", rel, err)
	}
	s.mu.Lock()
	delete(s.unsynced, abs)
	s.unsyncedDirs[filepath.Dir(abs)] = true
	s.mu.Unlock()
	return true, nil
}

// ---------------------------------------------------------------------------
// Tree hashing and reading.

// errTooLarge is a held file larger than the agent reads into memory.
var errTooLarge = errors.New("file exceeds the size the agent reads whole")

// readHeld reads a written file by its manifest path, for the ops that
// carry a file's content (map_replace, cert_*, ca_*) and the read-back.
func (s *fileStore) readHeld(rel string) ([]byte, error) {
	abs, err := s.abs(rel)
	if err != nil {
		return nil, err
	}
	b, err := readAllLimited(s.disk, abs, MaxApplyBodyBytes)
	if errors.Is(err, errTooLarge) {
		return nil, fmt.Errorf("%q exceeds %d bytes", rel, MaxApplyBodyBytes)
	}
	return b, err
}

// digest observes one held file: its streaming XXH64 and size, no proof.
// Anything but a regular file is errInvalidPath.
func (s *fileStore) digest(rel string) (FileAt, error) {
	abs, err := s.abs(rel)
	if err != nil {
		return FileAt{}, err
	}
	fi, err := s.disk.Lstat(abs)
	if err != nil {
		return FileAt{}, err
	}
	if !fi.Mode().IsRegular() {
		return FileAt{}, notRegular(rel)
	}
	return s.digestAbs(abs)
}

func (s *fileStore) digestAbs(abs string) (FileAt, error) {
	f, err := s.disk.Open(abs)
	if err != nil {
		return FileAt{}, err
	}
	defer f.Close()
	h := newDigestHasher()
	n, err := copyBytes(h, f)
	if err != nil {
		return FileAt{}, err
	}
	return FileAt{Digest: FormatDigest(h.Sum64()), Size: n}, nil
}

// hashTree observes the given paths. A path that does not exist, is invalid
// or is not a regular file is left out. So is a file the agent may not
// read, with a warning: the tree then differs from what the state recorded,
// the baseline is forgotten, and an apply that must read the file fails on
// its own; the agent still starts and serves.
func (s *fileStore) hashTree(paths []string) (map[string]FileAt, error) {
	if len(paths) > MaxFiles {
		return nil, fmt.Errorf("%d paths exceed the %d-file limit", len(paths), MaxFiles)
	}
	tree := make(map[string]FileAt, len(paths))
	for _, rel := range paths {
		at, err := s.digest(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, errInvalidPath), errors.Is(err, syscall.ENOTDIR):
			continue
		case errors.Is(err, fs.ErrPermission):
			s.logger.Warn("a file of the tree cannot be read; it is left out of the tree", "path", rel, "err", err)
			continue
		case err != nil:
			return nil, fmt.Errorf("hash %q: %w", rel, err)
		}
		tree[rel] = at
	}
	return tree, nil
}

// treeDigest folds a tree into one digest: DigestString of the sorted
// "<path> <digest>\n" lines. The empty tree folds to DigestString("").
func treeDigest(tree map[string]FileAt) string {
	paths := make([]string, 0, len(tree))
	for p := range tree {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var b strings.Builder
	for _, p := range paths {
		b.WriteString(p)
		b.WriteByte(' ')
		b.WriteString(tree[p].Digest)
		b.WriteByte('\n')
	}
	return DigestString(b.String())
}

// ---------------------------------------------------------------------------
// Sweep.

// sweepTemp empties every mount's .haptic-tmp and removes the .haptic-lkg
// entries the persisted journal does not reference, at most MaxFiles
// entries of each directory per call. It runs at startup, before any apply
// and after any recovery, so no undo needs what it removes.
func (s *fileStore) sweepTemp(j backupJournal) error {
	keep := make(map[string]bool, len(j.Entries))
	for _, b := range j.backups() {
		keep[b] = true
	}
	var errs []error
	for _, m := range s.mounts {
		errs = append(errs,
			s.sweepDir(filepath.Join(m, storeTempDir), "", nil),
			s.sweepDir(filepath.Join(m, storeBackupDir), "", keep))
	}
	return errors.Join(errs...)
}

// sweepRestoreStaging removes the .haptic-restore-* links a restore
// interrupted by a crash left in the directories of the given paths.
func (s *fileStore) sweepRestoreStaging(paths []string) error {
	dirs := map[string]bool{}
	for _, rel := range paths {
		if abs, err := s.abs(rel); err == nil {
			dirs[filepath.Dir(abs)] = true
		}
	}
	var errs []error
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		errs = append(errs, s.sweepDir(d, storeRestorePrefx, nil))
	}
	return errors.Join(errs...)
}

// sweepDir removes up to MaxFiles entries of dir whose names start with
// prefix and that keep does not name. A dir that is no longer the agent's
// own (a link planted since startup) is not swept.
func (s *fileStore) sweepDir(dir, prefix string, keep map[string]bool) error {
	if err := checkOwnedPath(s.disk, dir, true); err != nil {
		return err
	}
	entries, err := s.disk.ReadDir(dir, MaxFiles)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if keep[p] || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if err := s.disk.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
