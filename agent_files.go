// This file owns the agent's file tree on disk: where a manifest path may
// lead, staging parts, what an apply changes, installing, putting bytes
// back, making the tree durable, hashing it, and sweeping.
//
// It never decides anything about HAProxy or the agent's state, and never
// touches a path outside the base directory: every disk path it builds is
// the base joined with a validated manifest path, or one of its own
// dot-prefixed directories (a pair in each mount: agent_mounts.go), which
// no manifest path can name.

package haptic

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Errors of the file store. Their texts reach the controller in answers and
// are part of the contract; callers and tests match them with errors.Is.
var (
	errInvalidPath      = errors.New("invalid manifest path")
	errDigestMismatch   = errors.New("part does not match its manifest digest")
	errPatchBaseMissing = errors.New("the patch base is not held")
	errTooLarge         = errors.New("file exceeds the size the agent reads whole")
)

// Names and modes the store keeps for itself.
const (
	storeTempDir    = ".haptic-tmp" // staged parts and restore copies
	storeLinkDir    = ".haptic-lkg" // links to bytes an undo or the journal needs
	defaultFileMode = 0o640         // private keys and userlist passwords must not be world-readable
	privateFileMode = 0o600         // the agent's own state
)

// maxInlineBytes is the size up to which a file's new bytes ride in the
// apply's record, which is synced anyway, instead of costing a file and a
// directory sync; a typical map or certificate is well below it.
// maxInlinePerApply bounds one record's share: past it, an apply's
// remaining files are staged synced, like large ones.
const (
	maxInlineBytes    = 64 << 10
	maxInlinePerApply = 4 << 20
)

// maxTempNameTries bounds the search for a free temp file name, as
// os.CreateTemp bounds its own.
const maxTempNameTries = 10000

// ---------------------------------------------------------------------------
// The store and where a path may lead.

type fileStoreConfig struct {
	Base      string      // the base directory, as configured
	Reserved  []string    // absolute paths no manifest path may resolve to
	Config    string      // manifest path of the HAProxy config (installed and restored last)
	FileMode  fs.FileMode // mode of every file the store writes into the tree; 0 means defaultFileMode
	Logger    *slog.Logger
	MountInfo string // "" means /proc/self/mountinfo; tests describe mounts with it
	Disk      disk   // nil means the operating system's
}

// fileStore is the agent's view of its base directory.
type fileStore struct {
	base     string // resolved, absolute
	mounts   mounts // the base and the mounts below it, each with its own store directories
	reserved map[string]bool
	config   string
	fileMode fs.FileMode
	dirMode  fs.FileMode
	logger   *slog.Logger
	disk     disk
	// umaskNarrows: the umask takes bits off fileMode, so a file created with that mode must be given it again
	umaskNarrows bool

	// dirty are the files installed or restored without a sync, and the
	// directories whose entries changed without one: flush makes them
	// durable before a compaction drops the records that can redo them.
	mu        sync.Mutex
	dirty     map[string]bool
	dirtyDirs map[string]bool
	linkSeq   uint64
	tempSeq   uint64
	linked    int64 // bytes linked aside since the last sweep: a link keeps an old version's blocks allocated
	late      error // a mount the start did not see refused a push (crossedMount)
	// spare is, by temp directory, a temp file that holds a version an
	// install displaced and nothing else links: the next install in that
	// directory overwrites it instead of creating a file. On ext4 a new
	// inode costs a small apply more than the rest of its install, and its
	// metadata burdens the next record's sync; the price is one old version
	// kept until then.
	spare map[string]string
}

func (s *fileStore) linkedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.linked
}

// maxLinkedBytes bounds the old versions links keep allocated: past it,
// the next apply compacts, which lets the sweep remove them. A 5 MB map
// changed at every apply is compacted every fiftieth.
const maxLinkedBytes = 256 << 20

// newFileStore resolves the base directory, finds the mounts below it, and
// creates the store's directories in each.
func newFileStore(cfg fileStoreConfig) (*fileStore, error) {
	base, err := filepath.EvalSymlinks(cfg.Base)
	if err == nil {
		base, err = filepath.Abs(base)
	}
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(base); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", base)
	}
	s := &fileStore{base: base, reserved: map[string]bool{}, config: cfg.Config,
		fileMode: cmp.Or(cfg.FileMode, defaultFileMode), logger: cmp.Or(cfg.Logger, slog.Default()),
		disk: cmp.Or[disk](cfg.Disk, osDisk{}), dirty: map[string]bool{}, dirtyDirs: map[string]bool{}, spare: map[string]string{}}
	s.dirMode = s.fileMode | (s.fileMode&0o444)>>2 // whoever may read the files may enter the directories
	s.umaskNarrows = s.fileMode&^processUmask() != s.fileMode
	for _, r := range cfg.Reserved {
		if r != "" { // an optional socket that is off
			s.reserved[canonicalPath(r)] = true
		}
	}
	if s.mounts, err = probeMounts(cmp.Or(cfg.MountInfo, defaultMountInfo), base, s.disk); err != nil {
		return nil, err
	}
	// The agent deletes and links entries in its store's directories, so a
	// link planted in the place of one would carry those deletes and links to
	// wherever it points: such a directory is refused, never followed.
	for _, m := range s.mounts {
		for _, name := range []string{storeTempDir, storeLinkDir} {
			p := filepath.Join(m.root, name)
			err := s.disk.Mkdir(p, 0o700)
			if err == nil || errors.Is(err, fs.ErrExist) {
				err = checkOwnedPath(s.disk, p, true)
			}
			if err == nil {
				err = s.disk.Chmod(p, 0o700)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// checkOwnedPath refuses a path the agent keeps for itself (its store's
// directories, its state file, its log, its plan blob) unless it is absent
// (the agent creates it) or a real directory (wantDir) or regular file that
// the agent's effective uid owns: the agent reads, replaces and deletes
// these paths, and must do so only on files that are its own.
func checkOwnedPath(d disk, p string, wantDir bool) error {
	fi, err := d.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link; the agent's own files and directories must be real ones, so that it never writes, deletes or changes modes elsewhere", p)
	case wantDir && !fi.IsDir():
		return fmt.Errorf("%s is not a directory", p)
	case !wantDir && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", p)
	}
	if uid, _, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the agent's uid %d", p, uid, os.Geteuid())
	}
	return nil
}

// validatePath applies the manifest path rules (manifestPathProblem).
func validatePath(rel string) error {
	if why := manifestPathProblem(rel, false); why != "" {
		return fmt.Errorf("%w: %q %s", errInvalidPath, rel, why)
	}
	return nil
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

// abs validates rel and returns its absolute path. It refuses a path that
// resolves to one of the agent's sockets or state files, and one whose
// existing parent directories include a symbolic link: base/link/x would
// carry a write, a read or a delete outside the base directory. (Someone who
// can create links in the tree between this check and the rename can still
// race it; the tree belongs to the agent.)
func (s *fileStore) abs(rel string) (string, error) {
	if err := validatePath(rel); err != nil {
		return "", err
	}
	abs := filepath.Join(s.base, filepath.FromSlash(rel))
	reserved := s.reserved[abs]
	dir := s.base
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, part)
		if fi, err := s.disk.Lstat(dir); err != nil {
			break // absent (created as a real directory by install) or unreadable (fails later)
		} else if fi.Mode()&fs.ModeSymlink != 0 {
			// The base is resolved, so only a path through a link can name
			// a reserved path under another name.
			if reserved = s.reserved[canonicalPath(abs)]; !reserved {
				return "", fmt.Errorf("%w: %q passes through a symbolic link", errInvalidPath, rel)
			}
			break
		}
	}
	if reserved {
		return "", fmt.Errorf("%w: %q is a reserved path", errInvalidPath, rel)
	}
	return abs, nil
}

func notRegular(rel string) error {
	return fmt.Errorf("%w: %q is not a regular file", errInvalidPath, rel)
}

// ---------------------------------------------------------------------------
// Staging.

// stagedFile is one verified part waiting for its install, where stage left
// it: in memory, or in a temp file of its path's mount.
type stagedFile struct {
	Rel    string
	abs    string
	Digest string
	Size   int64
	// held is the agent's record of the path when the part was read, outside
	// the apply lock: an apply that landed meanwhile may have moved it.
	held   FileAt
	inline []byte // a small part's bytes
	repl   []byte // with patch: the file is its base (the live file) with repl spliced in
	patch  *FilePatch
	tmp    string // a large part's synced temp file
	// built is an unsynced temp file of bytes the record carries: a patch
	// spliced while verified (one pass over a large base, not two), or a
	// small part's bytes, written by prepare while the record syncs.
	built     string
	unchanged bool // the live file already holds these bytes: neither installed nor journalled
	installed bool
}

// discard removes the temp file unless it was installed: a staged file has
// one at most (tmp, of a part staged whole, or built, of one that is not).
func (f *stagedFile) discard(d disk) {
	if f != nil && !f.installed {
		for _, tmp := range []string{f.tmp, f.built} {
			if tmp != "" {
				d.Remove(tmp)
			}
		}
	}
}

// stage reads a part and verifies it against the manifest's size and
// digest; on any error no temp file is left. A whole part is stageWhole's.
// With p, r holds a patch's replacement bytes: the held base with them
// spliced in must hash to the digest. A base the agent does not hold (held,
// its record of the file, is another, or the file is not that size) is
// errPatchBaseMissing: the path goes into the 409 Missing answer. A
// replacement that fits the inline budget rides in the record and the file
// it makes waits unsynced (built), so that a change of a few bytes to a
// large map syncs nothing but the record; otherwise the result is staged
// whole like a part. The base is not hashed up front: the result's digest
// checks it too, and only a mismatch is told apart as a base that changed
// behind the agent's back (Missing) or a wrong replacement.
func (s *fileStore) stage(rel string, r io.Reader, p *FilePatch, digest string, size int64, held FileAt, budget *int) (*stagedFile, error) {
	abs, err := s.abs(rel)
	if err != nil {
		return nil, err
	}
	sf := &stagedFile{Rel: rel, abs: abs, Digest: digest, Size: size, held: held}
	if p == nil {
		return sf, s.stageWhole(sf, budget, func(w io.Writer) (int64, error) { return copyAtMostOneMore(w, r, size) })
	}
	fi, err := s.disk.Lstat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != p.BaseSize || held.Digest != p.BaseDigest || held.Size != p.BaseSize {
		return nil, errPatchBaseMissing
	}
	base, err := s.disk.Open(abs)
	if err != nil {
		return nil, errPatchBaseMissing
	}
	defer base.Close()
	// The fit rule has no sum that can overflow (offset + length wraps
	// negative for a length near MaxInt64, and would pass): once offset and
	// length fit, base_size - length is within [0, base_size], and only then
	// is the replacement's length computed.
	if p.Offset < 0 || p.Length < 0 || p.Offset > p.BaseSize || p.Length > p.BaseSize-p.Offset ||
		size < p.BaseSize-p.Length {
		return nil, fmt.Errorf("patch for %q does not fit its base: offset %d, length %d, base %d bytes", rel, p.Offset, p.Length, p.BaseSize)
	}
	n := size - (p.BaseSize - p.Length)
	splice := func(repl io.Reader) func(io.Writer) (int64, error) {
		return func(w io.Writer) (int64, error) { return spliceOnto(w, base, p, repl, n, rel) }
	}
	if !fitsInline(size, *budget) && fitsInline(n, *budget) {
		var repl bytes.Buffer
		if _, err = copyAtMostOneMore(&repl, r, n); err != nil {
			return nil, err
		}
		sf.built, err = s.writeTemp(rel, abs, func(w io.Writer) error { return sf.verify(w, splice(bytes.NewReader(repl.Bytes()))) }, false)
		sf.repl, sf.patch = repl.Bytes(), p
		*budget -= int(n)
	} else {
		err = s.stageWhole(sf, budget, splice(r))
	}
	if errors.Is(err, errDigestMismatch) {
		if at, herr := s.digestAbs(abs); herr != nil || at.Digest != p.BaseDigest {
			return nil, errPatchBaseMissing
		}
	}
	return sf, err
}

// stageWhole builds sf's bytes with fill and verifies them. A part that fits
// the apply's inline budget stays in memory (and a live file that already
// holds it needs nothing); a larger one is streamed into a synced temp file,
// since recovery may have to rename it into place.
func (s *fileStore) stageWhole(sf *stagedFile, budget *int, fill func(io.Writer) (int64, error)) (err error) {
	if !fitsInline(sf.Size, *budget) {
		sf.tmp, err = s.writeTemp(sf.Rel, sf.abs, func(w io.Writer) error { return sf.verify(w, fill) }, true)
		return err
	}
	var buf bytes.Buffer
	if err = sf.verify(&buf, fill); err == nil {
		sf.inline = buf.Bytes()
		if sf.unchanged = s.holds(sf.abs, sf.Digest, sf.Size); !sf.unchanged {
			*budget -= int(sf.Size)
		}
	}
	return err
}

func fitsInline(size int64, budget int) bool {
	return size >= 0 && size <= maxInlineBytes && int(size) <= budget
}

// verify writes sf's bytes into w with fill and checks them against the manifest.
func (sf *stagedFile) verify(w io.Writer, fill func(io.Writer) (int64, error)) error {
	h := newDigestHasher()
	n, err := fill(io.MultiWriter(w, h))
	switch {
	case err != nil:
		return err
	case n != sf.Size:
		return fmt.Errorf("%w: %q is %d bytes, manifest says %d", errDigestMismatch, sf.Rel, n, sf.Size)
	case FormatDigest(h.Sum64()) != sf.Digest:
		return fmt.Errorf("%w: %q hashes to %s, manifest says %s", errDigestMismatch, sf.Rel, FormatDigest(h.Sum64()), sf.Digest)
	}
	return nil
}

// copyAtMostOneMore copies at most want+1 bytes of r into w and returns the
// count: one byte past want proves the part too long, and neither the disk
// nor the reader is asked for more.
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

// writeTemp fills a temp file of abs's mount (rel's path), with the tree's
// file mode, and syncs it when asked; on any error the file is gone. The
// errors of the agent's own disk are staging faults of rel; fill's own (the
// client's body) are returned as they are.
func (s *fileStore) writeTemp(rel, abs string, fill func(io.Writer) error, sync bool) (_ string, err error) {
	var f diskFile
	tmp, reused := "", false
	if !sync { // a synced temp file is a record's source: always a file of its own
		dir := filepath.Join(s.mounts.of(abs).root, storeTempDir)
		s.mu.Lock()
		tmp, reused = s.spare[dir]
		delete(s.spare, dir)
		s.mu.Unlock()
	}
	if reused {
		if f, err = s.disk.OpenFile(tmp, os.O_WRONLY, 0); err != nil {
			s.disk.Remove(tmp)
			reused = false
		}
	}
	if !reused {
		tmp, err = s.newTemp(abs, func(name string) (err error) {
			f, err = s.disk.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, s.fileMode)
			return err
		})
	}
	if err != nil {
		return "", diskFault(rel, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			s.disk.Remove(tmp)
		}
	}()
	w := &countingWriter{w: faultWriter{rel, f}, limit: math.MaxInt64}
	if err = fill(w); err != nil {
		return "", err
	}
	if reused {
		err = f.Truncate(w.n)
	}
	if err == nil && s.umaskNarrows {
		err = f.Chmod(s.fileMode)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		return "", diskFault(rel, err)
	}
	return tmp, nil
}

// newTemp makes a fresh name in the temp directory of abs's mount with mk
// (a file created with the tree's file mode, so that the install renames it
// into the tree as it is, or a link), trying another name while one exists.
func (s *fileStore) newTemp(abs string, mk func(name string) error) (string, error) {
	var err error
	for range maxTempNameTries {
		s.mu.Lock()
		s.tempSeq++
		name := filepath.Join(s.mounts.of(abs).root, storeTempDir, fmt.Sprintf("part-%d-%d", s.tempSeq, rand.Uint32()))
		s.mu.Unlock()
		if err = mk(name); err == nil {
			return name, nil
		} else if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	return "", err
}

// holds reports whether the live file at abs is a regular file with exactly
// this size and digest. Disk is the authority: the file is hashed, so a file
// edited behind the agent's back is rewritten.
func (s *fileStore) holds(abs, digest string, size int64) bool {
	fi, err := s.disk.Lstat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return false
	}
	at, err := s.digestAbs(abs)
	return err == nil && at.Digest == digest
}

// stagingFault is a failure of the agent's own disk while it stages a part:
// the part may well be fine, the agent could not keep it. It is answered as
// the agent's fault, so that a controller retries later instead of treating
// its render as broken.
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

// spliceOnto writes base[:offset], then at most n+1 bytes of repl, then
// base[offset+length:] into w, and returns the count. Only repl comes from
// the client; every other error is the base's, on the agent's own disk.
func spliceOnto(w io.Writer, base io.ReadSeeker, p *FilePatch, repl io.Reader, n int64, rel string) (int64, error) {
	var head, mid, tail int64
	_, err := base.Seek(0, io.SeekStart)
	if err == nil {
		head, err = copyAtMost(w, base, p.Offset)
	}
	if err == nil {
		if mid, err = copyAtMostOneMore(w, repl, n); err != nil {
			return 0, err
		}
		_, err = base.Seek(p.Offset+p.Length, io.SeekStart)
	}
	if err == nil {
		tail, err = copyBytes(w, base)
	}
	return head + mid + tail, diskFault(rel, err)
}

// ---------------------------------------------------------------------------
// One apply's changes.

// deletions returns the owned paths the manifest no longer lists, sorted:
// absence means delete, but only for paths the agent owns.
func deletions(owned map[string]FileAt, files []ManifestFile) []string {
	gone := maps.Clone(owned)
	for _, f := range files {
		delete(gone, f.Path)
	}
	return slices.Sorted(maps.Keys(gone))
}

// journalEntry is how one path looked when the last-known-good plan became
// current: absent (At nil), or the bytes Backup links to.
type journalEntry struct {
	Path   string  `json:"path"`
	At     *FileAt `json:"at,omitempty"`
	Backup string  `json:"backup,omitempty"`
}

// linkUndo records how each path the changes touch looks now (Old), and
// links aside the regular files among them that link picks and that have
// no link yet: the link is the apply's undo, and the journal's backup on
// the path's first change since the last-known-good plan. A link needs no
// sync: metadata reaches the disk in the order it was made (a journalling
// filesystem commits its journal in order), so a rename that survives a
// power loss brings the link made before it, and a link costs a few
// microseconds where a sync costs milliseconds. before says what the agent
// knows each path held; a path it does not own is hashed.
func (s *fileStore) linkUndo(changes []fileChange, before map[string]FileAt, link func(*fileChange) bool) error {
	for i := range changes {
		c := &changes[i]
		abs, err := s.abs(c.Path)
		if err != nil {
			return err
		}
		fi, err := s.disk.Lstat(abs)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err == nil && !fi.Mode().IsRegular(), errors.Is(err, syscall.ENOTDIR):
			// Something in the way (a directory, a link, a file where a
			// directory must be) would fail the install: refused now,
			// before anything is written.
			return notRegular(c.Path)
		case err != nil:
			return err
		}
		old, ok := before[c.Path]
		if !ok {
			// A file the agent may not read is linked all the same, so that
			// an apply can still replace it; only its digest stays unknown.
			old, _ = s.digestAbs(abs)
			old.Size = fi.Size()
		}
		c.Old = &FileAt{Digest: old.Digest, Size: old.Size}
		if c.Undo != "" || !link(c) {
			continue
		}
		if c.Undo, err = s.linkAside(abs); err != nil {
			return s.crossedMount(c.Path, err)
		}
		s.mu.Lock()
		s.linked += old.Size
		s.mu.Unlock()
	}
	return nil
}

// linkAside hard-links abs into the link directory of its mount under a
// fresh name. A file installed without a sync stays unsynced behind its
// link once the path holds another: the link is then what flush syncs. The
// name carries a random part because the sequence starts again at every
// start, while links of the last run (the journal's backups) are kept: a
// name made of the sequence alone replaced the backup of the same path.
func (s *fileStore) linkAside(abs string) (string, error) {
	s.mu.Lock()
	s.linkSeq++
	link := filepath.Join(s.mounts.of(abs).root, storeLinkDir, fmt.Sprintf("%d-%d-%s", s.linkSeq, rand.Uint32(), DigestString(abs)))
	if s.dirty[abs] {
		s.dirty[link] = true
	}
	s.dirtyDirs[filepath.Dir(link)] = true
	s.mu.Unlock()
	if err := s.disk.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return link, s.disk.Link(abs, link)
}

// prepare writes, unsynced, the temp file of each staged part that has none
// yet (a small part, or a patch, whose bytes the record carries), so that
// the install that follows is renames alone. It takes no token: a temp file
// changes no path, and an apply runs it while its record syncs.
func (s *fileStore) prepare(staged []*stagedFile) error {
	for _, f := range staged {
		if f.unchanged || f.installed || f.tmp != "" || f.built != "" {
			continue
		}
		var err error
		if f.built, err = s.writeTemp(f.Rel, f.abs, func(w io.Writer) error { return s.writeStaged(f, w) }, false); err != nil {
			return err
		}
	}
	return nil
}

// install puts every staged file onto its path, the config last (HAProxy
// reads it on reload, and every file it names must already be in place),
// then unlinks the deleted paths; directories are created as needed and
// never removed. Nothing is synced: recovery redoes it from the record,
// which is on the disk (synced). A file a failed install already put in
// place is skipped when tried again. The apply wrote the temp files
// (prepare) while its record synced; one that has none here is written
// now, so that no path is ever put from nothing, which would delete it.
func (s *fileStore) install(_ synced, staged []*stagedFile, dels []string) error {
	if err := s.prepare(staged); err != nil {
		return err
	}
	configLast := func(a, b *stagedFile) int { return boolInt(a.Rel == s.config) - boolInt(b.Rel == s.config) }
	for _, f := range slices.SortedStableFunc(slices.Values(staged), configLast) {
		if f.unchanged || f.installed {
			continue
		}
		if err := s.put(f.Rel, cmp.Or(f.tmp, f.built)); err != nil {
			if f.built != "" {
				s.disk.Remove(f.built)
				f.built = ""
			}
			return err
		}
		f.installed = true
	}
	var errs []error
	for _, rel := range dels {
		errs = append(errs, s.put(rel, ""))
	}
	return errors.Join(errs...)
}

// writeStaged writes the bytes of a staged file the record carries into w:
// its own, or its base (the live file) with the replacement spliced in.
func (s *fileStore) writeStaged(f *stagedFile, w io.Writer) error {
	if f.patch == nil {
		_, err := w.Write(f.inline)
		return err
	}
	base, err := s.disk.Open(f.abs)
	if err != nil {
		return err
	}
	defer base.Close()
	_, err = spliceOnto(w, base, f.patch, bytes.NewReader(f.repl), int64(len(f.repl)), f.Rel)
	return err
}

// put makes rel hold the file at from (renamed there), or removes it when
// from is "". The path must be a regular file or absent. The change is not
// synced: flush does that later.
func (s *fileStore) put(rel, from string) error {
	abs, err := s.abs(rel)
	if err != nil {
		return err
	}
	if fi, err := s.disk.Lstat(abs); err == nil && !fi.Mode().IsRegular() {
		return notRegular(rel)
	}
	if from == "" {
		if err := s.disk.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		s.noteDirty("", filepath.Dir(abs))
		return nil
	}
	created, err := mkdirAll(s.disk, filepath.Dir(abs), s.dirMode)
	for _, d := range created {
		s.noteDirty("", filepath.Dir(d))
	}
	if err == nil {
		err = s.crossedMount(rel, s.replace(from, abs))
	}
	if err == nil {
		s.noteDirty(abs, filepath.Dir(abs))
	}
	return err
}

// replace puts tmp at abs atomically. Over an existing file it swaps the
// two names: a rename over an existing file makes ext4 flush the new file's
// data at once, which costs more than the rest of the apply, and the agent's
// durability comes from its log anyway. tmp then holds the old version: it
// is kept as its directory's spare when nothing else links it, and removed
// otherwise (an undo or the journal keeps that version through its link).
func (s *fileStore) replace(tmp, abs string) error {
	if fi, err := s.disk.Lstat(abs); err != nil || !fi.Mode().IsRegular() {
		return s.disk.Rename(tmp, abs)
	}
	switch err := s.disk.Exchange(tmp, abs); {
	case errors.Is(err, syscall.ENOSYS), errors.Is(err, syscall.EINVAL):
		return s.disk.Rename(tmp, abs)
	case err != nil:
		return err
	}
	links := uint64(0) // where the system does not say, as if something else linked it
	if fi, err := s.disk.Lstat(tmp); err == nil {
		_, links, _ = fileOwner(fi)
	}
	if links != 1 {
		return s.disk.Remove(tmp)
	}
	s.mu.Lock()
	old := s.spare[filepath.Dir(tmp)]
	s.spare[filepath.Dir(tmp)] = tmp
	s.mu.Unlock()
	if old != "" {
		return s.disk.Remove(old)
	}
	return nil
}

// noteDirty records a file and directories for flush to make durable.
func (s *fileStore) noteDirty(file string, dirs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if file != "" {
		s.dirty[file] = true
	}
	for _, d := range dirs {
		s.dirtyDirs[d] = true
	}
}

// ---------------------------------------------------------------------------
// Putting bytes back.

// want is what one path must hold: At's bytes, or nothing when At is nil.
type want struct {
	Path string
	At   *FileAt
}

// restoreSet is a tree to put back: what each of its paths must hold, and
// every place those bytes may still be found (links aside, a record's
// inline bytes, synced temp files, a patch's base). A refused apply's
// undo, the journal's last-known-good set, a pending reload's undo, the
// files the disk owes and a start's recovery are each one, and putBack is
// how each goes back.
type restoreSet struct {
	wants   []want
	sources map[FileAt][]source
}

// changesSet is the tree an apply's changes make, or with old the tree
// they found.
func changesSet(changes []fileChange, old bool) restoreSet {
	t := restoreSet{wants: make([]want, len(changes)), sources: map[FileAt][]source{}}
	for i, c := range changes {
		t.wants[i] = want{Path: c.Path, At: c.New}
		if old {
			t.wants[i].At = c.Old
		}
	}
	addChangeSources(t.sources, changes)
	return t
}

// journalSet is the tree a journal keeps: each path as the journal found
// it, from the link it made.
func journalSet(j []journalEntry) restoreSet {
	t := restoreSet{wants: make([]want, len(j)), sources: map[FileAt][]source{}}
	for i, e := range j {
		t.wants[i] = want{Path: e.Path, At: e.At}
		addSource(t.sources, e.At, source{path: e.Backup})
	}
	return t
}

// putBack makes every path of t hold its bytes, the config last, taking
// them from the first source that holds them (linkedCopy, contentOf). A
// path that already holds them is left alone. It reports whether it
// changed anything, and joins the errors of the paths it could not put
// back: those keep their current content.
func (s *fileStore) putBack(t restoreSet) (changed bool, err error) {
	var errs []error
	configLast := func(a, b want) int { return boolInt(a.Path == s.config) - boolInt(b.Path == s.config) }
	for _, w := range slices.SortedStableFunc(slices.Values(t.wants), configLast) {
		c, err := s.restoreOne(w, t.sources)
		changed = changed || c
		errs = append(errs, err)
	}
	return changed, errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *fileStore) restoreOne(w want, sources map[FileAt][]source) (bool, error) {
	abs, err := s.abs(w.Path)
	if err != nil {
		return false, err
	}
	fi, err := s.disk.Lstat(abs)
	switch {
	case w.At == nil && (errors.Is(err, fs.ErrNotExist) || err == nil && fi.IsDir()), w.At != nil && s.holds(abs, w.At.Digest, w.At.Size):
		return false, nil // a directory is never removed: it is not a file the apply created
	case err == nil && !fi.Mode().IsRegular():
		return false, notRegular(w.Path)
	case w.At == nil:
		return true, s.put(w.Path, "")
	}
	tmp, err := s.linkedCopy(abs, *w.At, sources)
	if tmp == "" && err == nil {
		b, ok := s.contentOf(abs, *w.At, sources, maxPatchChain)
		if !ok {
			return false, fmt.Errorf("restore %q: no copy of its bytes (%s) is left", w.Path, w.At.Digest)
		}
		tmp, err = s.writeTemp(w.Path, abs, func(wr io.Writer) error { _, err := wr.Write(b); return err }, false)
	}
	if err == nil {
		if err = s.put(w.Path, tmp); err != nil {
			s.disk.Remove(tmp)
		}
	}
	if err != nil {
		err = fmt.Errorf("restore %q: %w", w.Path, err)
	}
	return true, err
}

// linkedCopy links a copy of at's bytes kept as a file (an undo or journal
// link, a synced temp file), verified by its digest, to a fresh temp name
// in abs's mount, ready to be renamed into place: no byte moves, so an
// undo needs no room on a full disk. It returns "" when no such copy is
// kept on abs's mount (one on a mount made since the record is copied by
// the caller).
func (s *fileStore) linkedCopy(abs string, at FileAt, sources map[FileAt][]source) (string, error) {
	key := FileAt{Digest: at.Digest, Size: at.Size}
	for _, src := range sources[key] {
		if src.path == "" || src.patch != nil {
			continue
		}
		if got, err := s.digestAbs(src.path); err != nil || got != key {
			continue
		}
		tmp, err := s.newTemp(abs, func(name string) error { return s.disk.Link(src.path, name) })
		if !errors.Is(err, syscall.EXDEV) {
			return tmp, err
		}
	}
	return "", nil
}

// repairBackups makes every journal backup hold its bytes again. The
// journal links a tree's files as they are when the last-known-good plan
// changes, installed perhaps without a sync: a power loss may tear such a
// link, and the log (which a compaction only empties once the tree is
// synced) still holds the bytes, in a record or a file it names.
func (s *fileStore) repairBackups(journal []journalEntry, sources map[FileAt][]source) error {
	var errs []error
	for _, e := range journal {
		if e.At == nil || e.Backup == "" {
			continue
		}
		if at, err := s.digestAbs(e.Backup); err == nil && at.Digest == e.At.Digest && at.Size == e.At.Size {
			continue
		}
		abs, err := s.abs(e.Path)
		if err == nil {
			b, ok := s.contentOf(abs, *e.At, sources, maxPatchChain)
			if !ok {
				err = fmt.Errorf("no copy of its bytes (%s) is left", e.At.Digest)
			} else if tmp, werr := s.writeTemp(e.Path, abs, func(w io.Writer) error { _, err := w.Write(b); return err }, false); werr != nil {
				err = werr
			} else if err = s.disk.Rename(tmp, e.Backup); err != nil {
				s.disk.Remove(tmp)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the backup of %q: %w", e.Path, err))
			continue
		}
		s.noteDirty(e.Backup, filepath.Dir(e.Backup))
	}
	return errors.Join(errs...)
}

// restorable reports whether every path of t that does not hold its bytes
// could still be given them: some source (or the live file) holds them, or
// the path must go. What putBack could not do then was the disk's failure
// to write, worth trying again.
func (s *fileStore) restorable(t restoreSet) bool {
	for _, w := range t.wants {
		abs, err := s.abs(w.Path)
		if err != nil {
			return false
		}
		if w.At == nil || s.holds(abs, w.At.Digest, w.At.Size) {
			continue
		}
		if _, ok := s.contentOf(abs, *w.At, t.sources, maxPatchChain); !ok {
			return false
		}
	}
	return true
}

// maxPatchChain bounds how many patches deep contentOf looks for a base:
// the patches of one file since the last compaction, which makes every
// file durable.
const maxPatchChain = maxLogRecords

// contentOf finds the bytes of at among the live file at abs and the
// sources, each verified by its digest: a link to bytes a power loss tore
// is passed over, and a patch is rebuilt on its base, found the same way.
func (s *fileStore) contentOf(abs string, at FileAt, sources map[FileAt][]source, depth int) ([]byte, bool) {
	key := FileAt{Digest: at.Digest, Size: at.Size}
	candidates := append([]source{{path: abs}}, sources[key]...)
	for _, src := range candidates {
		b := src.data
		switch {
		case src.patch != nil:
			p := src.patch
			base, ok := []byte(nil), false
			if depth > 0 {
				base, ok = s.contentOf(abs, FileAt{Digest: p.BaseDigest, Size: p.BaseSize}, sources, depth-1)
			}
			if !ok || p.Offset+p.Length > int64(len(base)) {
				continue
			}
			b = slices.Concat(base[:p.Offset], src.data, base[p.Offset+p.Length:])
		case src.path != "":
			var err error
			if b, err = readAllLimited(s.disk, src.path, MaxApplyBodyBytes); err != nil {
				continue
			}
		}
		if int64(len(b)) == at.Size && DigestString(string(b)) == at.Digest {
			return b, true
		}
	}
	return nil, false
}

// ---------------------------------------------------------------------------
// Durability, reading, hashing and sweeping.

// flush makes every change the store made so far durable: the bytes of the
// files installed or restored without a sync, then the changed directories
// (a directory that is gone needs no sync: its parent's does).
func (s *fileStore) flush() error {
	s.mu.Lock()
	files, dirs := s.dirty, s.dirtyDirs
	s.dirty, s.dirtyDirs = map[string]bool{}, map[string]bool{}
	s.mu.Unlock()
	var errs []error
	for name := range files {
		f, err := s.disk.OpenFile(name, os.O_RDONLY, 0)
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			s.noteDirty(name)
		}
	}
	for d := range dirs {
		for ; d != s.base && len(d) > len(s.base); d = filepath.Dir(d) {
			if _, err := s.disk.Lstat(d); err == nil {
				break
			}
		}
		if err := s.disk.SyncDir(d); err != nil {
			errs = append(errs, err)
			s.noteDirty("", d)
		}
	}
	return errors.Join(errs...)
}

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

// hashTree observes the given paths: the recorded tree (MaxFiles at most)
// and, at a start, the paths the replayed records touched, which the bounds
// of the log's read limit. A path that does not exist, is invalid or is not
// a regular file is left out, and so, with a warning, is a file the agent
// may not read: the tree then differs from the one recorded, the baseline
// is forgotten, and an apply that must read the file fails on its own; the
// agent still starts and serves.
func (s *fileStore) hashTree(paths []string) (map[string]FileAt, error) {
	tree := make(map[string]FileAt, len(paths))
	for _, rel := range paths {
		abs, err := s.abs(rel)
		if err != nil {
			continue
		}
		fi, err := s.disk.Lstat(abs)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		switch at, err := s.digestAbs(abs); {
		case err == nil:
			tree[rel] = at
		case errors.Is(err, fs.ErrPermission):
			s.logger.Warn("a file of the tree cannot be read; it is left out of the tree", "path", rel, "err", err)
		default:
			return nil, fmt.Errorf("hash %q: %w", rel, err)
		}
	}
	return tree, nil
}

// sweep empties every mount's .haptic-tmp and removes the links no record
// needs any more (all but keep), at most MaxFiles entries of each directory
// per call. It runs at start, after recovery and after each compaction, so
// that nothing it removes can be needed to redo or undo an apply.
func (s *fileStore) sweep(keep map[string]bool) error {
	s.mu.Lock()
	s.linked, s.spare = 0, map[string]string{}
	s.mu.Unlock()
	var errs []error
	for _, m := range s.mounts {
		for _, dir := range []string{storeTempDir, storeLinkDir} {
			dir = filepath.Join(m.root, dir)
			if err := checkOwnedPath(s.disk, dir, true); err != nil {
				return err
			}
			entries, err := s.disk.ReadDir(dir, MaxFiles)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if p := filepath.Join(dir, e.Name()); !keep[p] {
					if err := s.disk.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}
