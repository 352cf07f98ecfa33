// This file owns the fake worker's map commands: show, add, set, del,
// prepare, commit and clear map, the per-map versions that prepare and
// commit work on, and the parsing of an add map payload. Its handlers run
// under the model lock that dispatch holds.
//
// It must never take the lock or write to the connection: fakehaproxy.go
// frames and tags every reply, so a map reply is counted like any other.

package haptic

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// fakeMapVersions is one map's version bookkeeping: the live entries are
// FakeModel.Maps[path] at version curr; prepared versions up to next hold
// their own entries until committed.
type fakeMapVersions struct {
	curr, next uint64
	pending    map[uint64][]MapEntry
}

const fakeUnknownMap = "Unknown map identifier. Please use #<id> or <file>."

func (m *FakeModel) versions(path string) *fakeMapVersions {
	if m.mapVersions == nil {
		m.mapVersions = map[string]*fakeMapVersions{}
	}
	v := m.mapVersions[path]
	if v == nil {
		v = &fakeMapVersions{pending: map[uint64][]MapEntry{}}
		m.mapVersions[path] = v
	}
	return v
}

// fakeParseVersion reads "@<n>".
func fakeParseVersion(arg string) (uint64, bool) {
	if !strings.HasPrefix(arg, "@") {
		return 0, false
	}
	v, err := strconv.ParseUint(arg[1:], 10, 64)
	return v, err == nil
}

func (f *FakeHAProxy) showMap(args []string, _ *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) == 0 {
		var b strings.Builder
		b.WriteString("# id (file) description")
		for i, p := range fakeSortedKeys(m.Maps) {
			v := m.versions(p)
			count := len(m.Maps[p])
			for _, e := range v.pending {
				count += len(e)
			}
			fmt.Fprintf(&b, "\n%d (%s) pattern loaded from file '%s' used by map at file '%s' line %d. curr_ver=%d next_ver=%d entry_cnt=%d",
				i, p, p, filepath.Join(f.dir, "haproxy.cfg"), i+1, v.curr, v.next, count)
		}
		return fakeList(b.String())
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	if v := m.versions(args[0]); versioned && ver != v.curr {
		entries = v.pending[ver] // a prepared version, or nothing
	}
	rows := make([]string, 0, len(entries))
	for i, e := range entries {
		rows = append(rows, fmt.Sprintf("0x7f%010x %s %s", 0x1f041280+0x80*i, e.Key, e.Value))
	}
	if len(rows) == 0 {
		return fakeSilent() // an empty map dumps nothing: a lone '\n'
	}
	return fakeList(strings.Join(rows, "\n"))
}

// addMap is "add map [@<ver>] <map> <key> <value>" and its payload form.
func (f *FakeHAProxy) addMap(args []string, payload *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) == 0 || (payload == nil && len(args) < 3) {
		return fakeErr("'add map' expects three parameters (map identifier, key and value) or one parameter (map identifier) and a payload")
	}
	path := args[0]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if !versioned {
		ver = v.curr
	}
	// Unsigned distances, as HAProxy compares them: a version below the
	// current one is "in the future" too.
	if ver-v.curr > v.next-v.curr {
		return fakeErr("Version number in the future, please use 'prepare map' before.")
	}
	add := func(e MapEntry) {
		if ver == v.curr {
			m.Maps[path] = append(m.Maps[path], e)
		} else {
			v.pending[ver] = append(v.pending[ver], e)
		}
	}
	if payload == nil {
		add(MapEntry{Key: args[1], Value: args[2]})
		return fakeSilent()
	}
	entries, missing, ok := fakeParseMapPayload(*payload)
	for _, e := range entries {
		add(e) // entries before a refusal stay, as in HAProxy
	}
	if !ok {
		return fakeErr("Missing value for key '" + missing + "'.")
	}
	return fakeSilent()
}

// fakeParseMapPayload reads a map payload as HAProxy does: the final '\n'
// is dropped; a key runs to the first space or tab, newlines included; one
// separator and then any spaces and tabs are skipped; the value runs to
// the next '\n'. A key with nothing after it refuses the rest, keeping the
// entries already read. So a line without a value glues onto the next
// one, which is why a client must send an empty value as "key \n" and
// never a blank line; parsing any kinder would hide that mistake.
func fakeParseMapPayload(payload string) (entries []MapEntry, missingKey string, ok bool) {
	p := strings.TrimSuffix(payload, "\n")
	for p != "" {
		k := strings.IndexAny(p, " \t")
		if k < 0 {
			return entries, p, false
		}
		key := p[:k]
		p = strings.TrimLeft(p[k+1:], " \t")
		value := p
		if nl := strings.IndexByte(p, '\n'); nl >= 0 {
			value, p = p[:nl], p[nl+1:]
		} else {
			p = ""
		}
		entries = append(entries, MapEntry{Key: key, Value: value})
	}
	return entries, "", true
}

func (f *FakeHAProxy) setMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 3 {
		return fakeErr("'set map' expects three parameters: map identifier, key and value.")
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	found := false
	for i := range entries {
		if entries[i].Key == args[1] {
			entries[i].Value = args[2]
			found = true
		}
	}
	if !found {
		return fakeErr("entry not found.")
	}
	return fakeSilent()
}

// delMap removes the first matching entry on 3.4 and every matching entry
// on 3.0 and 2.6.
func (f *FakeHAProxy) delMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 {
		return fakeErr("This command expects two parameters: map identifier and key.")
	}
	entries, ok := m.Maps[args[0]]
	if !ok {
		return fakeErr(fakeUnknownMap)
	}
	kept := make([]MapEntry, 0, len(entries))
	removed := 0
	for _, e := range entries {
		if e.Key == args[1] && (removed == 0 || f.dialect != fakeDialect34) {
			removed++
			continue
		}
		kept = append(kept, e)
	}
	if removed == 0 {
		return fakeErr("Key not found.")
	}
	m.Maps[args[0]] = kept
	return fakeSilent()
}

func (f *FakeHAProxy) prepareMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 1 {
		return fakeErr(fakeUnknownMap)
	}
	if _, ok := m.Maps[args[0]]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(args[0])
	v.next++
	v.pending[v.next] = nil
	return fakeMsg(6, fmt.Sprintf("New version created: %d", v.next))
}

// commitMap installs a prepared version: its entries replace the map and
// every older version is purged.
func (f *FakeHAProxy) commitMap(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 || !strings.HasPrefix(args[0], "@") {
		return fakeErr("Missing version number.")
	}
	ver, _ := fakeParseVersion(args[0])
	path := args[1]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if ver-v.curr > v.next-v.curr {
		return fakeErr("Version number out of range.")
	}
	if ver != v.curr {
		m.Maps[path] = append([]MapEntry{}, v.pending[ver]...)
		for old := range v.pending {
			if old <= ver {
				delete(v.pending, old)
			}
		}
		v.curr = ver
	}
	return fakeSilent()
}

// clearMap empties a version on 3.0 and 2.6; on 3.4 "clear map @<v>" is a
// silent no-op (so a later commit would still install the version).
func (f *FakeHAProxy) clearMap(args []string, _ *string) fakeOut {
	m := &f.model
	var ver uint64
	versioned := false
	if len(args) > 0 && strings.HasPrefix(args[0], "@") {
		ver, versioned = fakeParseVersion(args[0])
		args = args[1:]
	}
	if len(args) < 1 {
		return fakeErr(fakeUnknownMap)
	}
	path := args[0]
	if _, ok := m.Maps[path]; !ok {
		return fakeErr(fakeUnknownMap)
	}
	v := m.versions(path)
	if !versioned {
		ver = v.curr
	}
	switch {
	case versioned && f.dialect == fakeDialect34:
	case ver == v.curr:
		m.Maps[path] = []MapEntry{}
	case ver-v.curr <= v.next-v.curr:
		v.pending[ver] = nil
	}
	return fakeSilent()
}
