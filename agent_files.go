// This file owns the agent's file store (agent.md §5.3, §6): the path rules,
// mount probing, staging and digest verification of parts, patches, the
// write transaction with its backup journal, restore, tree hashing and the
// startup sweep. It never decides anything about HAProxy and never touches a
// path outside the base directory: every disk path it builds is the base
// directory joined with a validated manifest path, or one of its own
// dot-prefixed directories, which no manifest path can name.
package haptic

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
)

// Errors of the file store. Their texts are contract (agent.md §6); callers
// and tests match them with errors.Is.
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
	storeFileMode     = 0o644
	storeDirMode      = 0o755
	defaultMountInfo  = "/proc/self/mountinfo"
	// maxMountInfoLines bounds the lines read from mountinfo; a pod has a
	// few dozen mounts, a busy node a few thousand.
	maxMountInfoLines = 65536
)

// Journal entry kinds (agent.md §5.1).
const (
	journalCreated  = "created"
	journalModified = "modified"
	journalDeleted  = "deleted"
)

// ---------------------------------------------------------------------------
// Path rules.

// validatePath applies the manifest path rules of agent.md §6.1. The dot
// rule keeps the state file, the store's own directories, restore staging
// files and the default admin socket out of any manifest's reach. The
// character rules (valid UTF-8, no control or bidirectional control
// character) are shared with the client (pathCharProblem).
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
	Rename    func(oldpath, newpath string) error // nil means os.Rename
}

// fileStore is the agent's view of its base directory.
type fileStore struct {
	base     string   // resolved, absolute
	mounts   []string // mount roots, deepest first; the base is one of them
	reserved map[string]bool
	config   string
	logger   *slog.Logger
	rename   func(oldpath, newpath string) error

	// crossDevice counts installs that fell back to a copy because rename
	// said EXDEV: a mount the probe missed. It must stay zero (invariant
	// mount_probe_found_every_mount).
	crossDevice atomic.Uint64
}

// newFileStore resolves the base directory, probes its mounts and creates
// every mount's .haptic-tmp and .haptic-lkg (agent.md §6.2).
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
	fi, err := os.Stat(base)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", base)
	}
	s := &fileStore{
		base:     base,
		reserved: make(map[string]bool, len(cfg.Reserved)),
		config:   cfg.Config,
		logger:   logger,
		rename:   cfg.Rename,
	}
	if s.rename == nil {
		s.rename = os.Rename
	}
	for _, r := range cfg.Reserved {
		if r != "" { // an optional socket that is off
			s.reserved[canonicalPath(r)] = true
		}
	}
	s.mounts = s.probeMounts(cfg.MountInfo)
	for _, m := range s.mounts {
		for _, d := range []string{storeTempDir, storeBackupDir} {
			if err := ensureStoreDir(filepath.Join(m, d)); err != nil {
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
func ensureStoreDir(p string) error {
	if err := os.Mkdir(p, storeDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := checkOwnedPath(p, true); err != nil {
		return err
	}
	// Mkdir leaves an existing directory's mode alone and the umask
	// narrows a new one; the mode is part of the contract.
	return os.Chmod(p, storeDirMode)
}

// checkOwnedPath refuses a path the agent keeps for itself (its store's
// directories, its state file, its plan blob) when it is a symbolic link,
// is not a directory (wantDir) or a regular file (!wantDir), or is not
// owned by the agent's effective uid: the agent reads, replaces, deletes
// and chmods these paths, and must do so only on files that are its own.
// A path that does not exist passes: the agent creates it itself.
func checkOwnedPath(p string, wantDir bool) error {
	fi, err := os.Lstat(p)
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

// Abs validates rel and returns its absolute path, refusing a path that
// resolves to one of the agent's sockets or its state file.
func (s *fileStore) Abs(rel string) (string, error) {
	if err := validatePath(rel); err != nil {
		return "", err
	}
	abs := filepath.Join(s.base, filepath.FromSlash(rel))
	if s.reserved[abs] || s.reserved[canonicalPath(abs)] {
		return "", fmt.Errorf("%w: %q is a reserved path", errInvalidPath, rel)
	}
	if err := s.refuseSymlinkedDirs(rel); err != nil {
		return "", err
	}
	return abs, nil
}

// refuseSymlinkedDirs refuses a path whose existing parent directories
// include a symbolic link. The base itself is resolved once at startup, but
// a link inside the tree (base/link -> ../elsewhere) would carry a write,
// a read or a delete of link/x outside the base directory. A directory that
// does not exist yet is created as a real one by Write, so the walk stops at
// the first missing component. (Someone who can create links in the tree
// between this check and the rename can still race it; the tree belongs to
// the agent.)
func (s *fileStore) refuseSymlinkedDirs(rel string) error {
	dir := s.base
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
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

// stagedFile is one verified part waiting in its mount's .haptic-tmp.
type stagedFile struct {
	Rel       string
	abs       string
	tmp       string
	Digest    string
	Size      int64
	installed bool
}

// discard removes the temp file unless it was installed.
func (f *stagedFile) discard() {
	if f != nil && !f.installed && f.tmp != "" {
		os.Remove(f.tmp)
	}
}

// Stage copies a whole part into the target's mount and verifies it against
// the manifest's size and digest.
func (s *fileStore) Stage(rel string, r io.Reader, digest string, size int64) (*stagedFile, error) {
	abs, err := s.Abs(rel)
	if err != nil {
		return nil, err
	}
	return s.stageWith(rel, abs, digest, size, func(w io.Writer) (int64, error) {
		return copyAtMostOneMore(w, r, size)
	})
}

// copyAtMostOneMore copies at most want+1 bytes of r into w and returns the
// count (agent.md §6.3 step 2, §6.4 step 3): one byte past want proves the
// part too long, so a longer part reports want+1 bytes, in Stage and
// StagePatch alike, and neither the disk nor the reader is asked for more.
// The limit saturates at MaxInt64 and a negative want copies nothing.
func copyAtMostOneMore(w io.Writer, r io.Reader, want int64) (int64, error) {
	limit := max(want, -1)
	if limit < math.MaxInt64 {
		limit++
	}
	n, err := io.CopyN(w, r, limit)
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// stageWith creates the temp file in abs's mount, fills it with fill (which
// reports the byte count), verifies size and digest and leaves the file at
// mode 0644. On any error the temp file is gone.
func (s *fileStore) stageWith(rel, abs, digest string, size int64, fill func(io.Writer) (int64, error)) (_ *stagedFile, err error) {
	dir := filepath.Join(s.mountFor(abs), storeTempDir)
	f, err := os.CreateTemp(dir, storePartPattern)
	if err != nil {
		return nil, diskFault(rel, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := newDigestHasher()
	n, err := fill(io.MultiWriter(faultWriter{rel, f}, h))
	if err != nil {
		return nil, err
	}
	if n != size {
		return nil, fmt.Errorf("%w: %q is %d bytes, manifest says %d", errDigestMismatch, rel, n, size)
	}
	if got := FormatDigest(h.Sum64()); got != digest {
		return nil, fmt.Errorf("%w: %q hashes to %s, manifest says %s", errDigestMismatch, rel, got, digest)
	}
	if err = f.Chmod(storeFileMode); err != nil {
		return nil, diskFault(rel, err)
	}
	// The rename that installs this file is only as durable as its bytes.
	if err = f.Sync(); err != nil {
		return nil, diskFault(rel, err)
	}
	if err = f.Close(); err != nil {
		return nil, diskFault(rel, err)
	}
	return &stagedFile{Rel: rel, abs: abs, tmp: tmp, Digest: digest, Size: size}, nil
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

// StagePatch builds the new file from the held base and the replacement
// bytes in r (agent.md §6.4, wire.md §6.4). A base the agent does not hold
// is errPatchBaseMissing: the path goes into the 409 Missing answer.
func (s *fileStore) StagePatch(rel string, r io.Reader, p *FilePatch, digest string, size int64) (*stagedFile, error) {
	abs, err := s.Abs(rel)
	if err != nil {
		return nil, err
	}
	base, err := s.openBase(abs, p)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	// The fit rule of wire.md §6.4, written so that no sum can overflow:
	// offset + length > base_size with offset 1 and length MaxInt64 wraps
	// negative and would pass. openBase has made base_size the held file's
	// real size, so it is >= 0, and base_size - length (the base bytes that
	// survive) is within [0, base_size] once offset and length fit; the
	// replacement length is computed only then.
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
		head, err := io.CopyN(w, base, p.Offset)
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
		tail, err := io.Copy(w, base)
		if err != nil {
			return 0, diskFault(rel, err)
		}
		return head + mid + tail, nil
	})
}

// openBase opens the held file a patch applies to, if it is exactly the
// base the patch names.
func (s *fileStore) openBase(abs string, p *FilePatch) (*os.File, error) {
	fi, err := os.Lstat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != p.BaseSize {
		return nil, errPatchBaseMissing
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, errPatchBaseMissing
	}
	h := newDigestHasher()
	n, err := io.Copy(h, f)
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

// fileTxn holds the installs and deletions of one apply.
type fileTxn struct {
	store    *fileStore
	installs []*stagedFile // sorted by path
	deletes  []string      // sorted
}

// begin opens the transaction of one apply: every staged file is an
// install, every path of dels a delete. Directories are never removed.
func (s *fileStore) begin(staged []*stagedFile, dels []string) *fileTxn {
	t := &fileTxn{store: s, installs: slices.Clone(staged), deletes: slices.Clone(dels)}
	slices.SortFunc(t.installs, func(a, b *stagedFile) int { return strings.Compare(a.Rel, b.Rel) })
	slices.Sort(t.deletes)
	return t
}

// Changes counts installs and deletes. Any part sent counts, even with
// identical content.
func (t *fileTxn) Changes() int { return len(t.installs) + len(t.deletes) }

// ---------------------------------------------------------------------------
// The backup journal.

// journalEntry records how one path looked while the LKG plan was current.
type journalEntry struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"`
	Backup string `json:"backup,omitempty"`
}

// backupJournal is persisted in the state file as {"entries": [...]}.
type backupJournal struct {
	Entries []journalEntry `json:"entries,omitempty"`
}

// clone copies the journal, so that a saved snapshot never aliases the live one.
func (j backupJournal) clone() backupJournal {
	return backupJournal{Entries: slices.Clone(j.Entries)}
}

// Backup records, for every path the transaction touches, how it looked
// before: the first entry for a path wins, so the LKG version is kept across
// several applies that precede the next reload.
func (t *fileTxn) Backup(j *backupJournal) error {
	if n := t.Changes(); n > MaxFiles {
		return fmt.Errorf("%d changes exceed the %d-file limit", n, MaxFiles)
	}
	seen := make(map[string]bool, len(j.Entries))
	for _, e := range j.Entries {
		seen[e.Path] = true
	}
	for _, f := range t.installs {
		if err := t.store.backupPath(j, seen, f.Rel, f.abs, true); err != nil {
			return err
		}
	}
	for _, rel := range t.deletes {
		abs, err := t.store.Abs(rel)
		if err != nil {
			return err
		}
		if err := t.store.backupPath(j, seen, rel, abs, false); err != nil {
			return err
		}
	}
	return nil
}

// backupPath journals one path: a tombstone when an install creates it, a
// hard link aside when it exists. A path already journalled is skipped, and
// so is an absent path that is being deleted.
func (s *fileStore) backupPath(j *backupJournal, seen map[string]bool, rel, abs string, install bool) error {
	if seen[rel] {
		return nil
	}
	fi, err := os.Lstat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if install {
			j.Entries = append(j.Entries, journalEntry{Path: rel, Kind: journalCreated})
			seen[rel] = true
		}
		return nil
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		// Nothing of ours to keep: Write refuses to replace or unlink a
		// non-regular file, and the apply aborts there.
		return nil
	}
	bak := filepath.Join(s.mountFor(abs), storeBackupDir, fmt.Sprintf("%d-%s.bak", len(j.Entries), DigestString(rel)))
	if err := os.Remove(bak); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Link(abs, bak); err != nil {
		return err
	}
	kind := journalModified
	if !install {
		kind = journalDeleted
	}
	j.Entries = append(j.Entries, journalEntry{Path: rel, Kind: kind, Backup: bak})
	seen[rel] = true
	return nil
}

// dropBackups deletes the journal's backup links (the journal itself is the
// caller's to clear).
func (s *fileStore) dropBackups(j backupJournal) {
	for _, e := range j.Entries {
		if e.Backup == "" {
			continue
		}
		if err := os.Remove(e.Backup); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Warn("could not remove a journal backup", "path", e.Backup, "err", err)
		}
	}
}

// ---------------------------------------------------------------------------
// Write.

// Write installs every staged file, the config last, then unlinks the
// deletions. The config goes last because HAProxy re-reads it on reload and
// every file it names must already be in place.
func (t *fileTxn) Write() error {
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
		f.discard()
	}
}

func (s *fileStore) refuseNonRegular(rel, abs string) error {
	fi, err := os.Lstat(abs)
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
	if err := os.MkdirAll(filepath.Dir(f.abs), storeDirMode); err != nil {
		return err
	}
	err := s.rename(f.tmp, f.abs)
	if errors.Is(err, syscall.EXDEV) {
		s.crossDevice.Add(1)
		s.logger.Warn("rename crossed a mount the probe did not find; copying instead", "path", f.Rel)
		err = s.copyInto(f.tmp, f.abs)
		if err == nil {
			os.Remove(f.tmp)
		}
	}
	if err != nil {
		return err
	}
	f.installed = true
	return nil
}

// copyInto copies src to a sibling of dst and renames it into place, so
// that dst is replaced atomically even when src lives on another mount.
func (s *fileStore) copyInto(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return replaceFile(dst, storeCopyPattern, storeFileMode, in)
}

// replaceFile writes r to a temp file beside dst (pattern names it), sets
// its mode, syncs it and renames it over dst, so that dst is either the old
// file or the whole new one. On any failure the temp file is removed.
func replaceFile(dst, pattern string, mode os.FileMode, r io.Reader) (err error) {
	f, err := os.CreateTemp(filepath.Dir(dst), pattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if _, err = io.Copy(f, r); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func (s *fileStore) unlink(rel string) error {
	abs, err := s.Abs(rel)
	if err != nil {
		return err
	}
	if err := s.refuseNonRegular(rel, abs); err != nil {
		return err
	}
	if err := os.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// ---------------------------------------------------------------------------
// Restore.

// Restore puts every journalled path back as it was while the LKG plan was
// current, the config last: created files are removed, modified and deleted
// ones are linked back from their backups. A path that cannot be restored
// keeps its current content; the errors are joined.
func (s *fileStore) Restore(j backupJournal) error {
	var errs []error
	var config *journalEntry
	for i := range j.Entries {
		if j.Entries[i].Path == s.config {
			config = &j.Entries[i]
			continue
		}
		errs = append(errs, s.restoreEntry(j.Entries[i]))
	}
	if config != nil {
		errs = append(errs, s.restoreEntry(*config))
	}
	return errors.Join(errs...)
}

func (s *fileStore) restoreEntry(e journalEntry) error {
	abs, err := s.Abs(e.Path)
	if err != nil {
		return err
	}
	switch e.Kind {
	case journalCreated:
		fi, err := os.Lstat(abs)
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
		if err := os.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("restore %q: %w", e.Path, err)
		}
		return nil
	case journalModified, journalDeleted:
		if err := os.MkdirAll(filepath.Dir(abs), storeDirMode); err != nil {
			return fmt.Errorf("restore %q: %w", e.Path, err)
		}
		staging := filepath.Join(filepath.Dir(abs), storeRestorePrefx+filepath.Base(abs))
		if err := os.Remove(staging); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("restore %q: %w", e.Path, err)
		}
		if err := os.Link(e.Backup, staging); err != nil {
			return fmt.Errorf("restore %q: %w", e.Path, err)
		}
		if err := s.rename(staging, abs); err != nil {
			os.Remove(staging)
			return fmt.Errorf("restore %q: %w", e.Path, err)
		}
		return nil
	default:
		return fmt.Errorf("restore %q: unknown journal entry kind %q", e.Path, e.Kind)
	}
}

// ---------------------------------------------------------------------------
// Tree hashing.

// Digest observes one held file: its streaming XXH64 and size, no proof.
// Anything but a regular file is errInvalidPath.
func (s *fileStore) Digest(rel string) (FileAt, error) {
	abs, err := s.Abs(rel)
	if err != nil {
		return FileAt{}, err
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		return FileAt{}, err
	}
	if !fi.Mode().IsRegular() {
		return FileAt{}, notRegular(rel)
	}
	f, err := os.Open(abs)
	if err != nil {
		return FileAt{}, err
	}
	defer f.Close()
	h := newDigestHasher()
	n, err := io.Copy(h, f)
	if err != nil {
		return FileAt{}, err
	}
	return FileAt{Digest: FormatDigest(h.Sum64()), Size: n}, nil
}

// HashTree observes the given paths. A path that does not exist, is invalid
// or is not a regular file is left out; any other error is fatal.
func (s *fileStore) HashTree(paths []string) (map[string]FileAt, error) {
	if len(paths) > MaxFiles {
		return nil, fmt.Errorf("%d paths exceed the %d-file limit", len(paths), MaxFiles)
	}
	tree := make(map[string]FileAt, len(paths))
	for _, rel := range paths {
		at, err := s.Digest(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, errInvalidPath), errors.Is(err, syscall.ENOTDIR):
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

// SweepTemp empties every mount's .haptic-tmp and removes the .haptic-lkg
// entries the persisted journal does not reference, at most MaxFiles
// entries of each directory per call. It runs at startup, before any apply.
func (s *fileStore) SweepTemp(j backupJournal) error {
	keep := make(map[string]bool, len(j.Entries))
	for _, e := range j.Entries {
		if e.Backup != "" {
			keep[e.Backup] = true
		}
	}
	var errs []error
	for _, m := range s.mounts {
		errs = append(errs,
			sweepDir(filepath.Join(m, storeTempDir), nil),
			sweepDir(filepath.Join(m, storeBackupDir), keep))
	}
	return errors.Join(errs...)
}

// sweepDir removes up to MaxFiles entries of dir that keep does not name. A
// dir that is no longer the agent's own (a link planted since startup) is
// not swept.
func sweepDir(dir string, keep map[string]bool) error {
	if err := checkOwnedPath(dir, true); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := d.ReadDir(MaxFiles)
	d.Close()
	if err != nil && err != io.EOF {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if keep[p] {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
