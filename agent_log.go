// This file owns how the agent's state reaches its disk: a snapshot (the
// state file, rewritten whole only at compaction) and an append-only log
// beside it, and how the two are read back at start. Both are made of
// frames: a magic number, the payload's length, its CRC-32C and the payload,
// one JSON record. A break in the log is a torn tail, cut off, unless a
// valid frame after it says the record at the break had been synced: that,
// or a snapshot that fails its checksum, is damage, and a damaged history
// is never acted on (loadLog reports it; the ledger forgets what it cannot
// trust).
//
// It never decides what a record means beyond replaying it, and never syncs
// unless asked, or to keep zeros ahead of the log's end where no apply
// waits: syncing is what makes an apply slow.

package haptic

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Log limits. A record carries at most maxInlinePerApply bytes of files
// and the state's small fields; the log is compacted into a new snapshot
// once it passes maxLogBytes or maxLogRecords, so that a restart replays
// little. A start reads maxLogReadRecords records and maxLogReadBytes
// bytes, and the log never takes a record past either (errLogFull): while
// a compaction cannot run, the agent stops writing rather than write a log
// its next start would refuse or set aside.
const (
	logFileName       = ".haptic-agent.log"
	frameMagic        = 0x54504148 // "HAPT" in the file
	frameHeaderBytes  = 12
	maxRecordBytes    = 2*maxInlinePerApply + MaxPlanBlobBytes + 16<<20 // far above any real record; the bound of a corrupt length
	maxLogBytes       = 8 << 20
	maxLogRecords     = 4096
	maxLogReadRecords = 2 * maxLogRecords
	maxLogReadBytes   = maxLogBytes + 4*maxRecordBytes // a full log and the records written past the threshold
	// proofsALostTailMayHold bounds the proofs that records after the last
	// one a start reads may have reserved: a log holds at most
	// maxLogReadRecords records past its snapshot, and an apply reserves
	// at most two. A disk that loses a synced record (one that lies about a
	// sync, or loses a page) takes its apply back, which no agent can
	// prevent; but a start that resumed the counter from the records it can
	// read would hand the lost apply's proofs out again for other content,
	// and a controller holding one would pass the fence against bytes it
	// never saw. So every start with a history resumes this far past the
	// highest counter it reads, whether or not it can tell that anything
	// was lost. (The generation does not jump: it counts the ACKs the
	// history holds, and nothing fences on it.)
	proofsALostTailMayHold = 2 * maxLogReadRecords
	stateTempPattern       = ".haptic-agent-state-*"
	damagedSuffix          = ".damaged"
)

const (
	recordSnapshot = "snapshot" // the state file: the whole state, tree and journal
	recordApply    = "apply"    // one apply: the state it lands, its files and their undo
	recordEnd      = "end"      // closes an apply: landed (ok) or undone
	recordState    = "state"    // any other change of the state
	// numbers opens the log a compaction emptied: the generation, token and
	// proofs the snapshot holds, so that a damaged snapshot never lets them
	// be handed out again.
	recordNumbers = "numbers"
)

// logRecord is one frame's payload.
type logRecord struct {
	Seq   uint64             `json:"seq"`
	Kind  string             `json:"kind"`
	State *agentState        `json:"state,omitempty"`
	Tree  map[string]*FileAt `json:"tree,omitempty"` // entries that changed (null removes one); a snapshot's whole tree

	// An apply's files, how they looked before it, and the journal entries
	// it added. An open apply counts only once an end record with ok
	// closes it; any other counts unless an end record without ok does.
	// The end record of an undone apply names the links it made after its
	// record.
	Files   []fileChange   `json:"files,omitempty"`
	Journal []journalEntry `json:"journal,omitempty"` // a snapshot's whole journal
	Open    bool           `json:"open,omitempty"`

	// Blob is the plan blob an apply carried or PUT /v1/plan stored, until
	// a snapshot writes it to its own file; PlanPatch, the patch of the
	// stored plan one carried instead.
	Blob      []byte     `json:"blob,omitempty"`
	PlanPatch *PlanPatch `json:"plan_patch,omitempty"`

	End uint64 `json:"end,omitempty"` // the apply an end record closes
	// Durable is the last record whose sync had completed when this one was
	// written: replay tells a torn tail from damage by it.
	Durable uint64 `json:"durable,omitempty"`
	OK      bool   `json:"ok,omitempty"`
	// ResetJournal: the journal is empty from this record on (a new
	// last-known-good plan), whether or not the record counts.
	ResetJournal bool `json:"reset_journal,omitempty"`
}

// fileChange is one path an apply changes: what it holds after the apply
// (nil: deleted) and where those bytes are, and what it held before (nil:
// absent) and where those are. Recovery finds bytes by their digest, so a
// source is only a place to look, and is verified before use.
type fileChange struct {
	Path string  `json:"path"`
	New  *FileAt `json:"new,omitempty"`
	Data []byte  `json:"data,omitempty"` // the new bytes, for a small file; with Patch, its replacement bytes
	Temp string  `json:"temp,omitempty"` // a synced temp file holding the new bytes
	// Patch: the new bytes are the old ones (Old, kept by Undo) spliced with
	// Data, so that a large file changed by a few bytes costs the record
	// only those bytes.
	Patch *FilePatch `json:"patch,omitempty"`
	Old   *FileAt    `json:"old,omitempty"`
	Undo  string     `json:"undo,omitempty"` // a link to the old bytes
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func encodeFrame(r *logRecord) ([]byte, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(payload) > maxRecordBytes {
		return nil, fmt.Errorf("a state record of %d bytes exceeds the %d-byte limit", len(payload), maxRecordBytes)
	}
	out := binary.LittleEndian.AppendUint32(make([]byte, 0, frameHeaderBytes+len(payload)), frameMagic)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(payload, crcTable))
	return append(out, payload...), nil
}

// frameAt decodes the frame at pos, or reports that none is there.
func frameAt(b []byte, pos int) (r logRecord, next int, ok bool) {
	if len(b)-pos < frameHeaderBytes || binary.LittleEndian.Uint32(b[pos:]) != frameMagic {
		return r, 0, false
	}
	n := int(binary.LittleEndian.Uint32(b[pos+4:]))
	end := pos + frameHeaderBytes + n
	if n == 0 || n > maxRecordBytes || end > len(b) {
		return r, 0, false
	}
	payload := b[pos+frameHeaderBytes : end]
	if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(b[pos+8:]) || json.Unmarshal(payload, &r) != nil {
		return logRecord{}, 0, false
	}
	return r, end, true
}

// decodeFrames reads frames from the start of b up to the first that is
// not whole and valid; good is the length of that prefix. After a crash,
// only records written since the last completed sync may be torn, lost or
// (their blocks written out of order) followed by whole ones: so a break
// is damage, not a torn tail, only when a valid frame after it says the
// record at the break had been synced. damaged is then the break's offset
// (else -1), and tail the valid frames after it, read only for what a
// damaged history can still tell. A frame at or below the sequence the
// prefix (or the snapshot, after) reached is an older generation's
// leftover: the log is emptied in place at compaction.
func decodeFrames(b []byte, after uint64) (records, tail []logRecord, good, damaged int) {
	read := func(pos int) (out []logRecord, end int) {
		for end = pos; len(out) < maxLogReadRecords; {
			r, next, ok := frameAt(b, end)
			if !ok {
				break
			}
			out, end = append(out, r), next
		}
		return out, end
	}
	records, good = read(0)
	last := after
	if len(records) > 0 {
		last = max(last, records[len(records)-1].Seq)
	}
	damaged = -1
	magic := binary.LittleEndian.AppendUint32(nil, frameMagic)
	for pos := good + 1; pos+frameHeaderBytes <= len(b) && len(tail) < maxLogReadRecords; pos++ {
		// Only where a frame's magic is can one start: the zeros kept past
		// the log's end are skipped at the speed of a search, not decoded.
		at := bytes.Index(b[pos:], magic)
		if at < 0 {
			break
		}
		pos += at
		r, _, ok := frameAt(b, pos)
		if !ok || r.Seq <= last {
			continue
		}
		more, end := read(pos)
		if damaged < 0 && slices.ContainsFunc(more, func(m logRecord) bool { return m.Durable > last }) {
			damaged = good
		}
		tail, pos = append(tail, more...), end-1
	}
	if damaged < 0 {
		tail = nil
	}
	return records, tail, good, damaged
}

// ---------------------------------------------------------------------------
// Loading.

// loadedLog is what the snapshot and the log say, replayed.
type loadedLog struct {
	st      agentState
	tree    map[string]FileAt
	seq     uint64 // the last record's sequence number
	good    int64  // the log's good prefix, where appends resume
	zeroed  int64  // the log's length when only zeros follow good, else good
	count   int    // records since the snapshot
	touched []string
	sources map[FileAt][]source
	blob    []byte       // the latest blob a counted record carried
	patches []*PlanPatch // the plan patches counted records carried since, in order
	// reload: the worker may hold changes no closed record explains: an
	// apply that may have changed it was never closed, or an undo's reload
	// was owed.
	reload bool
	// damage names the damaged file and offset; the rest of loadedLog is
	// then only what could be read, for the ledger to keep what is safe.
	damage string
	torn   int64 // the bytes a crash left after the good prefix: a record cut short, or lost
	fresh  bool  // neither a snapshot nor a log: nothing was ever handed out
}

// source is one place that may hold the bytes of a digest: inline bytes
// of a record, a file (a synced temp file, an undo or journal link), or a
// patch of other bytes with data.
type source struct {
	data  []byte
	path  string
	patch *FilePatch
}

// loadLog reads the snapshot at statePath and replays the log beside it. A
// missing snapshot is the empty state. A file that cannot be read is an
// error (guessing could delete files the agent does not own); a damaged one
// is reported in damage, with what could still be read.
func loadLog(d disk, statePath string) (*loadedLog, error) {
	out := &loadedLog{tree: map[string]FileAt{}, sources: map[FileAt][]source{}}
	var records, tail []logRecord
	b, err := readAllLimited(d, statePath, maxRecordBytes+frameHeaderBytes)
	noSnapshot := errors.Is(err, fs.ErrNotExist)
	switch {
	case noSnapshot:
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", statePath, err)
	default:
		snap, _, ok := frameAt(b, 0)
		if !ok || snap.Kind != recordSnapshot || snap.State == nil {
			out.damage = statePath + " at offset 0"
		} else {
			out.st, out.seq = *snap.State, snap.Seq
			out.st.Journal = snap.Journal
			applyTreeDelta(out.tree, snap.Tree)
			out.index(snap)
		}
	}
	logPath := logPathFor(statePath)
	raw, err := readAllLimited(d, logPath, maxLogReadBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		out.fresh = noSnapshot
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", logPath, err)
	default:
		var good, damaged int
		records, tail, good, damaged = decodeFrames(raw, out.seq)
		// Zeros past the last record are kept there (logZeroAhead), not torn.
		out.good, out.torn = int64(good), int64(len(bytes.TrimRight(raw[good:], "\x00")))
		out.zeroed = out.good
		if out.torn == 0 {
			out.zeroed = int64(len(raw))
		}
		if damaged >= 0 && out.damage == "" {
			out.damage = fmt.Sprintf("%s at offset %d", logPath, damaged)
		}
	}
	records = slices.DeleteFunc(records, func(r logRecord) bool { return r.Seq <= out.seq })
	out.replay(records)
	// Past damage, records are read only for the paths they name and the
	// numbers they may have handed out.
	for _, r := range tail {
		out.index(r)
		out.st.raiseNumbers(stateOf(r))
		out.touched = slices.AppendSeq(out.touched, maps.Keys(r.Tree))
	}
	return out, nil
}

// replay applies the records after the snapshot. It settles first which
// applies count: one that was undone, or an open one never closed with ok,
// contributes nothing but the proofs it reserved and the places of its
// bytes. The last record that carries a state is the state.
func (l *loadedLog) replay(records []logRecord) {
	counts := map[uint64]bool{}
	closed := map[uint64]bool{}
	for _, r := range records {
		switch r.Kind {
		case recordApply:
			counts[r.Seq] = !r.Open
		case recordEnd:
			counts[r.End], closed[r.End] = r.OK, true
		}
	}
	for _, r := range records {
		l.seq, l.count = r.Seq, l.count+1
		if r.ResetJournal {
			// A promotion rides the next record, whatever becomes of it.
			l.st.Journal = nil
		}
		switch {
		case r.Kind == recordNumbers:
			l.st.raiseNumbers(stateOf(r))
			continue
		case r.Kind == recordEnd:
			l.index(r)
		case r.Kind == recordApply:
			l.index(r)
			l.reload = l.reload || !closed[r.Seq] && r.Open
			if !counts[r.Seq] {
				l.st.ProofGeneration = max(l.st.ProofGeneration, r.State.ProofGeneration)
				continue
			}
			for _, f := range r.Files {
				applyTreeDelta(l.tree, map[string]*FileAt{f.Path: f.New})
			}
		case r.Kind == recordState && r.State != nil && r.State.Generation < l.st.Generation:
			// Older than the state replay holds: written beside an apply
			// still in flight, it describes the tree from before that
			// apply, and must neither replace the state the apply landed
			// nor bind its blob to the apply's files.
			l.st.raiseNumbers(*r.State)
			continue
		}
		if r.Blob != nil {
			l.blob, l.patches = r.Blob, nil
		}
		if r.PlanPatch != nil {
			l.patches = append(l.patches, r.PlanPatch)
		}
		if r.State != nil {
			journal, proofs := l.st.Journal, l.st.ProofGeneration
			l.st = *r.State
			l.st.Journal, l.st.ProofGeneration = journal, max(proofs, r.State.ProofGeneration)
		}
		l.st.Journal = append(l.st.Journal, r.Journal...)
		applyTreeDelta(l.tree, r.Tree)
	}
	l.reload = l.reload || l.st.ReloadOwed
	slices.Sort(l.touched)
	l.touched = slices.Compact(l.touched)
}

// index notes the paths an apply touched and every place it names bytes in.
func (l *loadedLog) index(r logRecord) {
	for _, f := range r.Files {
		l.touched = append(l.touched, f.Path)
	}
	addChangeSources(l.sources, r.Files)
	for _, e := range slices.Concat(r.Journal, stateOf(r).PendingUndo) {
		addSource(l.sources, e.At, source{path: e.Backup})
	}
}

// addChangeSources notes every place the changes name bytes in, new and old.
func addChangeSources(sources map[FileAt][]source, changes []fileChange) {
	for _, f := range changes {
		addSource(sources, f.New, source{data: f.Data, path: f.Temp, patch: f.Patch})
		addSource(sources, f.Old, source{path: f.Undo})
	}
}

// addSource notes that s may hold the bytes of at.
func addSource(sources map[FileAt][]source, at *FileAt, s source) {
	if at != nil && (s.data != nil || s.path != "" || s.patch != nil) {
		key := FileAt{Digest: at.Digest, Size: at.Size}
		sources[key] = append(sources[key], s)
	}
}

// raiseNumbers raises the numbers st has handed out to those of s, so that
// none is handed out twice.
func (st *agentState) raiseNumbers(s agentState) {
	if s.Generation >= st.Generation {
		st.Generation, st.Token = s.Generation, s.Token
	}
	st.ProofGeneration = max(st.ProofGeneration, s.ProofGeneration)
}

func stateOf(r logRecord) agentState {
	if r.State == nil {
		return agentState{}
	}
	return *r.State
}

func logPathFor(statePath string) string {
	return filepath.Join(filepath.Dir(statePath), logFileName)
}

// setAside renames a damaged file out of the way for inspection, under a
// name that tells what it is, so that the agent can start afresh beside it.
func setAside(d disk, path string) error {
	if err := d.Rename(path, path+damagedSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return d.SyncDir(filepath.Dir(path))
}

// ---------------------------------------------------------------------------
// Writing.

// logZeroAhead is how much of the file past the log's last record is kept
// written with zeros and synced. A record then lands on blocks the file
// already has, and its fdatasync only writes them and flushes the disk's
// cache; a record that grows the file also waits for the filesystem to
// commit the new size (on ext4 a journal commit: one more trip to the disk,
// and a wake-up of the journal's thread that busy cores delay). Replay reads
// the zeros as the log's end. They are written where no apply waits: when
// the log opens, and after an answer (keepAhead).
const logZeroAhead = 256 << 10

// stateLog appends records and writes snapshots.
type stateLog struct {
	disk      disk
	statePath string
	f         diskFile
	bytes     int64 // where the next record goes
	zeroed    int64 // the file's length: zeros from bytes up to it
	ahead     int64 // the zeros kept past bytes (logZeroAhead)
	count     int
	synced    uint64 // the last record whose sync completed
}

// openStateLog prepares appends after the good prefix of the log: a torn
// tail is cut off first, so that a later record never follows garbage,
// while zeros after it (up to zeroed) are kept, as the room they hold.
func openStateLog(d disk, statePath string, good, zeroed, ahead int64, count int) (*stateLog, error) {
	logPath := logPathFor(statePath)
	_, statErr := d.Lstat(logPath)
	f, err := d.OpenFile(logPath, os.O_RDWR|os.O_CREATE, privateFileMode)
	if err != nil {
		return nil, err
	}
	w := &stateLog{disk: d, statePath: statePath, f: f, count: count, ahead: ahead}
	if errors.Is(statErr, fs.ErrNotExist) {
		// A record synced into a log whose own name is not durable could
		// vanish with it.
		err = d.SyncDir(filepath.Dir(logPath))
	}
	switch {
	case err != nil:
	case zeroed > good:
		w.bytes, w.zeroed = good, zeroed
		_, err = f.Seek(good, io.SeekStart)
	default:
		err = w.cutBack(good)
	}
	if err == nil {
		err = w.keepAhead()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// errLogFull refuses a record the next start would not read.
var errLogFull = errors.New("the log holds as much as a start reads, and must be compacted first")

// append writes one record, and syncs it when asked. A failed write cuts
// the log back to where it was, so that the next record does not follow a
// partial one.
func (w *stateLog) append(r *logRecord, sync bool) error {
	b, err := encodeFrame(r)
	if err != nil {
		return err
	}
	if w.count >= maxLogReadRecords || w.bytes+int64(len(b)) > maxLogReadBytes {
		return errLogFull
	}
	if _, err := w.f.Write(b); err != nil {
		w.cutBack(w.bytes)
		return err
	}
	w.bytes += int64(len(b))
	w.zeroed = max(w.zeroed, w.bytes)
	w.count++
	if sync {
		if err := w.f.Sync(); err != nil {
			return err
		}
		w.synced = r.Seq
	}
	return nil
}

// cutBack cuts the log back to size bytes, where the next append goes. It
// fails where the disk refuses the truncation (read-only, say): what was
// written past size then stays.
func (w *stateLog) cutBack(size int64) error {
	err := w.f.Truncate(size)
	_, seekErr := w.f.Seek(size, io.SeekStart)
	w.bytes, w.zeroed = size, size
	return cmp.Or(err, seekErr)
}

// keepAhead writes zeros up to w.ahead past the log's end once less than
// half of that is left, and syncs them. A log past maxLogBytes grows
// as it is: its compaction is due. Zeros that cannot be written (a full
// disk) are cut off again, giving the room back: records then grow the
// file, slower and as durable. A failed sync is returned, as it may have
// lost records written before it, and so is a cut that failed.
func (w *stateLog) keepAhead() error {
	if w.zeroed-w.bytes >= w.ahead/2 || w.bytes >= maxLogBytes {
		return nil
	}
	end := w.bytes + w.ahead
	_, err := w.f.Seek(w.zeroed, io.SeekStart)
	if err == nil {
		_, err = w.f.Write(make([]byte, end-w.zeroed))
	}
	if err != nil {
		return w.cutBack(w.bytes)
	}
	w.zeroed = end
	err = w.f.Sync()
	_, seekErr := w.f.Seek(w.bytes, io.SeekStart)
	return cmp.Or(err, seekErr)
}

// full reports whether the log should be compacted.
func (w *stateLog) full() bool { return w.bytes >= maxLogBytes || w.count >= maxLogRecords }

// overdue reports a log half way from full to what a start reads: written
// past a compaction that was due by writers outside the apply lock (a
// verified state read adopting a worker), it must be compacted before the
// next apply or upload writes, not after.
func (w *stateLog) overdue() bool {
	return w.bytes >= (maxLogBytes+maxLogReadBytes)/2 || w.count >= (maxLogRecords+maxLogReadRecords)/2
}

// compact writes snap as the new snapshot, makes its rename durable, and
// only then empties the log: a crash between the two leaves records the
// snapshot already holds, which replay skips by their sequence numbers,
// never an emptied log beside an older snapshot. The emptied log starts
// with the snapshot's numbers, which replay skips the same way unless the
// snapshot is damaged.
func (w *stateLog) compact(snap *logRecord) error {
	b, err := encodeFrame(snap)
	if err != nil {
		return err
	}
	if err := w.replace(w.statePath, b); err != nil {
		return err
	}
	// Not cutBack: a truncation that fails must leave the offset and the
	// count at the log's end, so that the next record follows the old ones
	// (the snapshot holds them, and replay skips them by sequence).
	if err := w.f.Truncate(0); err != nil {
		return err
	}
	if _, err := w.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	w.bytes, w.count, w.zeroed = 0, 0, 0
	st := snap.State
	if err := w.append(&logRecord{Seq: snap.Seq, Kind: recordNumbers,
		State: &agentState{Generation: st.Generation, Token: st.Token, ProofGeneration: st.ProofGeneration}}, true); err != nil {
		return err
	}
	return w.keepAhead()
}

// replace writes b over path, its rename made durable.
func (w *stateLog) replace(path string, b []byte) error {
	if err := replaceFile(w.disk, path, stateTempPattern, privateFileMode, bytes.NewReader(b)); err != nil {
		return err
	}
	return w.disk.SyncDir(filepath.Dir(path))
}
