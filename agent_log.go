// This file owns how the ledger's state reaches the disk: a snapshot (the
// state file, written whole only when the log is compacted) and an
// append-only log beside it whose records name what changed since. A
// record is framed by its length and a CRC-32C of its payload, so that a
// record torn by a crash is recognised and everything from it on is cut
// off at the next start.
//
// It must never decide what a change means (the ledger does) and never
// sync unless asked: syncing is what makes an apply slow, so the ledger
// asks only at the points where a promise is made.

package haptic

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Log limits. A record carries at most a few files' bytes (each no larger
// than maxInlineBytes) and the state's small fields; the log is compacted
// into a new snapshot once it passes maxLogBytes or maxLogRecords, so that
// a restart replays little.
const (
	logFileName      = ".haptic-agent.log"
	logHeaderBytes   = 8
	maxRecordBytes   = 2*maxInlinePerApply + MaxPlanBlobBytes + 16<<20 // far above any real record; a bound for a corrupt length
	maxLogBytes      = 8 << 20
	maxLogReadBytes  = maxLogBytes + 4*maxRecordBytes // what a restart reads: a full log and the records past the threshold
	maxLogRecords    = 4096
	stateTempPattern = ".haptic-agent-state-*"
)

// Record kinds. An intent opens a change of the tree; the commit or the
// rollback that follows closes it. A rollback that is not followed by an
// abort record is finished at the next start.
const (
	recordState    = "state"
	recordIntent   = "intent"
	recordCommit   = "commit"
	recordRollback = "rollback"
	recordAbort    = "abort"
)

// logRecord is one change of the persisted state.
type logRecord struct {
	Seq  uint64                     `json:"seq"`
	Kind string                     `json:"kind"`
	Set  map[string]json.RawMessage `json:"set,omitempty"`     // state fields and their new values
	Tree map[string]*FileAt         `json:"tree,omitempty"`    // tree entries; null removes one
	Undo []undoEntry                `json:"undo,omitempty"`    // intent: how every touched path looked before
	Redo []redoEntry                `json:"redo,omitempty"`    // commit: bytes installed without a sync
	Gone []string                   `json:"gone,omitempty"`    // commit: paths the apply deleted
	Back *backupJournal             `json:"journal,omitempty"` // rollback: the journal being restored
}

// redoEntry is the content of one file the commit installed without a
// sync: recovery rewrites the file from it if a power loss took the bytes
// or the rename.
type redoEntry struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// encodeRecord frames a record: length, CRC-32C, JSON payload.
func encodeRecord(r *logRecord) ([]byte, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	out := make([]byte, logHeaderBytes, logHeaderBytes+len(payload))
	binary.LittleEndian.PutUint32(out[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(out[4:8], crc32.Checksum(payload, crcTable))
	return append(out, payload...), nil
}

// decodeRecords reads records from the start of b up to the first one that
// is torn, fails its checksum or does not parse. It returns the records and
// the length of the good prefix: everything after it is cut off.
func decodeRecords(b []byte) ([]logRecord, int) {
	var out []logRecord
	pos := 0
	for len(out) < maxLogRecords*2 && len(b)-pos >= logHeaderBytes {
		n := int(binary.LittleEndian.Uint32(b[pos : pos+4]))
		sum := binary.LittleEndian.Uint32(b[pos+4 : pos+8])
		if n == 0 || n > maxRecordBytes || len(b)-pos-logHeaderBytes < n {
			break
		}
		payload := b[pos+logHeaderBytes : pos+logHeaderBytes+n]
		if crc32.Checksum(payload, crcTable) != sum {
			break
		}
		var r logRecord
		if err := json.Unmarshal(payload, &r); err != nil {
			break
		}
		out = append(out, r)
		pos += logHeaderBytes + n
	}
	return out, pos
}

// ---------------------------------------------------------------------------
// State fields by JSON name. A record carries only the fields that changed;
// replay sets them on the snapshot. The tree travels separately (it is
// large and changes a few entries at a time), and so do the fields only a
// snapshot holds.

// stateField is one field of agentState a record may carry.
type stateField struct {
	name  string
	index int
}

var stateFields = sync.OnceValue(func() []stateField {
	snapshotOnly := map[string]bool{"files": true, "log_seq": true, "pending_deletes": true,
		"phase": true, "in_flight_plan_id": true, "nack": true}
	t := reflect.TypeFor[agentState]()
	var out []stateField
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" || snapshotOnly[name] {
			continue
		}
		out = append(out, stateField{name: name, index: i})
	}
	return out
})

// changedFields encodes the fields of next that differ from prev.
func changedFields(prev, next *agentState) (map[string]json.RawMessage, error) {
	pv, nv := reflect.ValueOf(prev).Elem(), reflect.ValueOf(next).Elem()
	var set map[string]json.RawMessage
	for _, f := range stateFields() {
		a, b := pv.Field(f.index), nv.Field(f.index)
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			continue
		}
		raw, err := json.Marshal(b.Interface())
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", f.name, err)
		}
		if set == nil {
			set = map[string]json.RawMessage{}
		}
		set[f.name] = raw
	}
	return set, nil
}

// applyFields sets the named fields of st; a name this version does not
// know is ignored, as a snapshot's unknown fields are.
func applyFields(st *agentState, set map[string]json.RawMessage) error {
	v := reflect.ValueOf(st).Elem()
	for _, f := range stateFields() {
		raw, ok := set[f.name]
		if !ok {
			continue
		}
		field := v.Field(f.index)
		fresh := reflect.New(field.Type())
		if err := json.Unmarshal(raw, fresh.Interface()); err != nil {
			return fmt.Errorf("field %s: %w", f.name, err)
		}
		field.Set(fresh.Elem())
	}
	return nil
}

// cloneState copies st deeply enough that a later change of one does not
// show in the other.
func cloneState(st agentState) agentState {
	st.ManifestPaths = slices.Clone(st.ManifestPaths)
	st.Journal = st.Journal.clone()
	st.Files = nil
	if st.LastApply != nil {
		la := cloneResult(*st.LastApply)
		st.LastApply = &la
	}
	return st
}

// ---------------------------------------------------------------------------
// Loading.

// loadedLog is what the snapshot and the log say, replayed.
type loadedLog struct {
	st     agentState
	tree   map[string]FileAt // nil when the snapshot predates persisted trees
	seq    uint64            // the last record's sequence number
	bytes  int64             // the good prefix of the log
	count  int               // records after the snapshot
	intent *logRecord        // an intent no commit, rollback or abort closed
	back   *backupJournal    // a rollback no abort finished
	redo   map[string][]byte // the latest committed bytes of each path, since the snapshot
	gone   map[string]bool   // paths committed as deleted since the snapshot
}

// loadLog reads the snapshot at statePath and replays the log beside it. A
// missing snapshot is the empty state. A snapshot that cannot be read or
// parsed is fatal, because guessing would risk deleting files the agent
// does not own; a torn log tail is cut off, which is what a crash in the
// middle of an append leaves.
func loadLog(d disk, statePath string) (*loadedLog, error) {
	out := &loadedLog{redo: map[string][]byte{}, gone: map[string]bool{}}
	b, err := readAllLimited(d, statePath, maxRecordBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", statePath, err)
	default:
		if err := json.Unmarshal(b, &out.st); err != nil {
			return nil, fmt.Errorf("parse %s: %w", statePath, err)
		}
	}
	out.tree, out.st.Files = out.st.Files, nil
	if out.st.Phase == phaseCommitted {
		out.st.Phase = phaseIdle
	}
	slices.Sort(out.st.ManifestPaths)
	out.st.ManifestPaths = slices.Compact(out.st.ManifestPaths)
	out.seq = out.st.LogSeq

	logPath := logPathFor(statePath)
	raw, err := readAllLimited(d, logPath, maxLogReadBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", logPath, err)
	}
	records, good := decodeRecords(raw)
	out.bytes = int64(good)
	for i := range records {
		r := &records[i]
		if r.Seq <= out.st.LogSeq {
			continue // already in the snapshot: compaction stopped before cutting the log
		}
		if err := out.replay(r); err != nil {
			return nil, fmt.Errorf("replay %s record %d: %w", logPath, r.Seq, err)
		}
		out.seq = r.Seq
		out.count++
	}
	return out, nil
}

func (l *loadedLog) replay(r *logRecord) error {
	if err := applyFields(&l.st, r.Set); err != nil {
		return err
	}
	if len(r.Tree) > 0 && l.tree == nil {
		l.tree = map[string]FileAt{}
	}
	for p, at := range r.Tree {
		if at == nil {
			delete(l.tree, p)
		} else {
			l.tree[p] = *at
		}
	}
	switch r.Kind {
	case recordIntent:
		l.intent, l.back = r, nil
	case recordRollback:
		l.intent, l.back = nil, r.Back
	case recordCommit:
		l.intent, l.back = nil, nil
		for _, e := range r.Redo {
			l.redo[e.Path] = e.Data
			delete(l.gone, e.Path)
		}
		for _, p := range r.Gone {
			delete(l.redo, p)
			l.gone[p] = true
		}
	case recordAbort:
		l.intent, l.back = nil, nil
	}
	return nil
}

func logPathFor(statePath string) string {
	return filepath.Join(filepath.Dir(statePath), logFileName)
}

// ---------------------------------------------------------------------------
// Writing.

// stateLog appends records and writes snapshots.
type stateLog struct {
	disk      disk
	statePath string
	logPath   string
	f         diskFile // opened at the first append
	bytes     int64
	count     int
}

// openStateLog prepares appends after the good prefix of the log: a torn
// tail is cut off first, so that a later record never follows garbage.
func openStateLog(d disk, statePath string, good int64, count int) (*stateLog, error) {
	w := &stateLog{disk: d, statePath: statePath, logPath: logPathFor(statePath), bytes: good, count: count}
	_, statErr := d.Lstat(w.logPath)
	f, err := d.OpenFile(w.logPath, os.O_RDWR|os.O_CREATE, privateFileMode)
	if err != nil {
		return nil, err
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		// A record synced into a log whose own name is not durable could
		// vanish with it.
		if err := d.SyncDir(filepath.Dir(w.logPath)); err != nil {
			f.Close()
			return nil, err
		}
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() != good {
		err = f.Truncate(good)
	}
	if err == nil {
		_, err = f.Seek(good, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	w.f = f
	return w, nil
}

// append writes one record, and syncs it when asked. A failed append cuts
// the log back to where it was, so that the next record does not follow a
// partial one.
func (w *stateLog) append(r *logRecord, sync bool) error {
	b, err := encodeRecord(r)
	if err != nil {
		return err
	}
	if len(b)-logHeaderBytes > maxRecordBytes {
		return fmt.Errorf("log record of %d bytes exceeds the %d-byte limit", len(b), maxRecordBytes)
	}
	if _, err := w.f.Write(b); err != nil {
		w.cutBack()
		return err
	}
	if sync {
		if err := w.f.Sync(); err != nil {
			w.cutBack()
			return err
		}
	}
	w.bytes += int64(len(b))
	w.count++
	return nil
}

func (w *stateLog) cutBack() {
	w.f.Truncate(w.bytes)
	w.f.Seek(w.bytes, io.SeekStart)
}

// full reports whether the log should be compacted.
func (w *stateLog) full() bool { return w.bytes >= maxLogBytes || w.count >= maxLogRecords }

// sync makes every record written so far durable.
func (w *stateLog) sync() error { return w.f.Sync() }

// compact writes snap as the new snapshot, durably, and then empties the
// log. A crash between the two leaves a log whose records the snapshot
// already holds; their sequence numbers tell replay to skip them.
func (w *stateLog) compact(snap *agentState) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if err := replaceFile(w.disk, w.statePath, stateTempPattern, privateFileMode, bytes.NewReader(b)); err != nil {
		return err
	}
	if err := w.disk.SyncDir(filepath.Dir(w.statePath)); err != nil {
		return err
	}
	if err := w.f.Truncate(0); err != nil {
		return err
	}
	if _, err := w.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	w.bytes, w.count = 0, 0
	return w.f.Sync()
}

func (w *stateLog) close() error {
	if w.f == nil {
		return nil
	}
	return w.f.Close()
}
