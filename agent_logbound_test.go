// This file owns the bound on the agent's log: whatever a controller sends
// (applies, plan uploads, the plan the agent holds over and over) and
// however the agent stops, the log stays within what a start reads, so
// that no start sets ACKed history aside or refuses to start.

package haptic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestTheLogTakesNoRecordAStartWouldNotRead appends records until the log
// refuses one by count and reads the log back: every record it took is
// read, none is damage. By bytes, the log refuses a record that would take
// it past the bytes a start reads, which is where the start stops reading.
func TestTheLogTakesNoRecordAStartWouldNotRead(t *testing.T) {
	statePath := filepath.Join(t.TempDir(), ".haptic-agent.json")
	w, err := openStateLog(osDisk{}, statePath, 0, 0, logZeroAhead, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.f.Close()
	took := 0
	for seq := uint64(1); ; seq++ {
		err := w.append(&logRecord{Seq: seq, Kind: recordState, State: &agentState{Generation: seq}}, false)
		if err == errLogFull {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if took++; took > maxLogReadRecords {
			t.Fatalf("the log took %d records", took)
		}
	}
	loaded, err := loadLog(osDisk{}, statePath)
	if err != nil || loaded.damage != "" || loaded.count != took || loaded.torn != 0 || took != maxLogReadRecords {
		t.Fatalf("a start read %d of the %d records the log took (damage %q, torn %d, err %v), want %d", loaded.count, took, loaded.damage, loaded.torn, err, maxLogReadRecords)
	}
	small := &logRecord{Seq: 1, Kind: recordState}
	frame, _ := encodeFrame(small)
	w.count, w.bytes = 0, maxLogReadBytes-int64(len(frame))
	if err := w.append(small, false); err != nil {
		t.Errorf("a record that ends the log exactly at the read bound: %v", err)
	}
	if err := w.append(small, false); err != errLogFull {
		t.Errorf("a record past the read bound: %v, want errLogFull", err)
	}
}

// planUploads is one agent whose applied plans are real ones, so that
// their blobs and patches can be uploaded.
type planUploads struct {
	e   *testEnv
	set fileSet
	ack []string // the map keys ACKed so far
}

// ackWithoutPlan lands one more map entry at runtime as a real plan,
// without its plan part, and returns the plan and its proof.
func (u *planUploads) ackWithoutPlan(t *testing.T) (*Plan, []byte, string) {
	t.Helper()
	key := fmt.Sprintf("k%d.example", len(u.ack))
	next, op := mapEntryChange(u.set, key, "be-a")
	p, blob := planOf(t, next)
	res := u.e.c.apply(u.e.c.manifest(p.ID, next, op), next)
	if !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("ack %s: %s", key, jsonOf(res))
	}
	u.set, u.ack = next, append(u.ack, key)
	return p, blob, res.AppliedPlanProof
}

// put uploads a plan body and expects a 200.
func (u *planUploads) put(t *testing.T, id, proof string, body []byte, contentType string) {
	t.Helper()
	code, _, b := u.e.c.do("PUT", PathPlan+"?plan_id="+id+"&proof="+proof, bytes.NewReader(body), contentType)
	if code != http.StatusOK {
		t.Fatalf("upload of %s: %d %s", id, code, b)
	}
}

func (u *planUploads) logSize(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(u.e.cfg.BaseDir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestTenThousandUploadsThenAKillKeepEveryACK uploads plans 10,000 times,
// the plan the agent holds again (as its blob and as a patch that changes
// nothing) and, every hundredth time, the plan of a runtime ACK just made
// without it, then kills the agent and starts it again. An upload of the
// plan it holds writes nothing; the log stays within its bound throughout;
// the start is ready, sets no history aside, and every ACK is on the disk
// and in the worker. Before the log was bounded for every writer, 8,300
// uploads of the plan held made a log the start set aside, ACKs with it.
func TestTenThousandUploadsThenAKillKeepEveryACK(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	u := &planUploads{e: e, set: seedFiles()}
	e.land(t, "plan-1", u.set)
	var p *Plan
	var blob []byte
	var proof string
	for i := range 10000 {
		if i%100 == 0 {
			p, blob, proof = u.ackWithoutPlan(t)
			u.put(t, p.ID, proof, blob, blobContentType)
			continue
		}
		size := u.logSize(t)
		if i%2 == 0 {
			u.put(t, p.ID, proof, blob, blobContentType)
		} else {
			identity, _ := json.Marshal(cutPlanPatch(string(p.Canonical()), string(p.Canonical()), p.ID))
			u.put(t, p.ID, proof, identity, patchContentType)
		}
		if after := u.logSize(t); after != size {
			t.Fatalf("upload %d of the plan the agent holds wrote %d bytes to the log", i, after-size)
		}
		if size > maxLogBytes+maxRecordBytes {
			t.Fatalf("after upload %d the log holds %d bytes", i, size)
		}
	}
	stopAsKilled(t, e.cfg.BaseDir, e.stop)
	e.a, e.stop = launchTestAgent(t, e.cfg, true)
	e.c = newAgentClient(t, e.a)
	for _, name := range []string{logFileName, ".haptic-agent.json"} {
		if _, err := os.Stat(filepath.Join(e.cfg.BaseDir, name+damagedSuffix)); err == nil {
			t.Errorf("the start set %s aside", name)
		}
	}
	if st := e.c.state("?plan=0"); st.AppliedPlanID != p.ID || st.AppliedPlanProof != proof || !st.AppliedPlanStored {
		t.Errorf("after the start the agent holds %s %s (stored %v), want %s %s stored", st.AppliedPlanID, st.AppliedPlanProof, st.AppliedPlanStored, p.ID, proof)
	}
	if !sameSet(e.disk(t), u.set) {
		t.Errorf("the tree after the start:\n%s", describeSetDiff(e.disk(t), u.set))
	}
	for _, key := range u.ack {
		if !hasMapKey(e.fake, "maps/host.map", key) {
			t.Errorf("the worker lost the ACKed %s", key)
		}
	}
}

// TestAnUploadCompactsTheLogItFills: a plan upload is a writer like an
// apply: once the log is due, the upload's own end compacts it.
func TestAnUploadCompactsTheLogItFills(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	u := &planUploads{e: e, set: seedFiles()}
	e.land(t, "plan-1", u.set)
	p, blob, proof := u.ackWithoutPlan(t)
	awaitReadBacks(e.a)
	e.a.deps.applyMu.Lock()
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogRecords
	e.a.deps.led.mu.Unlock()
	e.a.deps.applyMu.Unlock()
	u.put(t, p.ID, proof, blob, blobContentType)
	e.a.deps.led.mu.Lock()
	count := e.a.deps.led.log.count
	e.a.deps.led.mu.Unlock()
	if count != 1 {
		t.Errorf("after the upload that filled it, the log holds %d records, want the compaction's numbers record alone", count)
	}
}

// TestAnOverdueLogIsCompactedBeforeTheNextWrite: writers outside the apply
// lock (a verified state read adopting a worker) may take the log past a
// compaction that was due; the next apply compacts it first, so that it
// never meets the bound a start reads.
func TestAnOverdueLogIsCompactedBeforeTheNextWrite(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	set := seedFiles()
	e.land(t, "plan-1", set)
	awaitReadBacks(e.a)
	e.a.deps.led.mu.Lock()
	e.a.deps.led.log.count = maxLogReadRecords
	e.a.deps.led.mu.Unlock()
	next, op := mapEntryChange(set, "after.example", "be-a")
	if res := e.c.apply(e.c.manifest("plan-2", next, op), next); !res.OK || res.Mode != ResultRuntime {
		t.Fatalf("the apply after writers filled the log: %s", jsonOf(res))
	}
}
