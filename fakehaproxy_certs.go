// This file owns the fake worker's TLS stores: certificates and CA files
// (new, set, commit and abort ssl cert|ca-file, with the one open
// transaction of each kind a worker allows), the show ssl
// cert|ca-file|crl-file listings, and crt-lists (show, add and del ssl
// crt-list, numbered as HAProxy numbers their lines). Its handlers run
// under the model lock that dispatch holds.
//
// It must never read a file from disk: a worker knows only what its store
// holds, so a path never loaded, or created by new and never committed, is
// refused even when the file exists. Nor may it take the lock or write to
// the connection; fakehaproxy.go frames every reply.

package haptic

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// --- certificates and CA files

// fakeTransaction is an open certificate or CA-file transaction: a worker
// holds at most one of each.
type fakeTransaction struct {
	path, content string
}

// fakeStore is what certificates and CA files share: the committed files,
// the open transaction and the words HAProxy uses for each.
type fakeStore struct {
	files         map[string]string
	tx            **fakeTransaction
	notReferenced string // "a certificate" or "a CA file"
	exists        string // refusal of new, %s = name
	newStore      string // success text of new, %s = name
	created       string // success text of set, %s = name
	updated       string
	validate      func(name, payload string) string // refusal or ""
	// commitCheck refuses a commit in HAProxy's words ("" lets it
	// through); ends marks a commit that fails while rebuilding what uses
	// the file, which ends the transaction instead of keeping it open.
	commitCheck func(name, content string) (msg string, ends bool)
	// joinOpenTx is 2.6's certificate behaviour: a set while another
	// certificate's transaction is open updates that transaction.
	joinOpenTx bool
}

func (f *FakeHAProxy) certStore() fakeStore {
	return fakeStore{
		files:         f.model.Certs,
		tx:            &f.model.certTx,
		notReferenced: "a certificate",
		exists:        "Certificate '%s' already exists!",
		newStore:      "New empty certificate store '%s'!",
		created:       "Transaction created for certificate %s!",
		updated:       "Transaction updated for certificate %s!",
		validate: func(name, payload string) string {
			switch {
			case strings.Contains(payload, "-----BEGIN CERTIFICATE-----"):
				return ""
			case f.dialect == fakeDialect26:
				return "unable to load certificate from file '" + name + "'.\nCan't load the payload"
			}
			return "unable to load certificate from file '" + name + "': no start line.\nCan't load the payload"
		},
		joinOpenTx: f.dialect == fakeDialect26,
		// Before 3.4 a certificate without its key is refused. 3.4 takes
		// it, and fails only to rebuild the bind lines or servers that use
		// it, keeping the old certificate.
		commitCheck: func(name, content string) (string, bool) {
			switch {
			case strings.Contains(content, "PRIVATE KEY-----"):
				return "", false
			case f.dialect != fakeDialect34:
				return "The transaction must contain at least a certificate and a private key!", false
			case f.certInUse(name):
				return "unable to load SSL private key into SSL Context '" + name + "': passed a null parameter.", true
			}
			return "", false
		},
	}
}

func (f *FakeHAProxy) caStore() fakeStore {
	return fakeStore{
		files:         f.model.CAFiles,
		tx:            &f.model.caTx,
		notReferenced: "a CA file",
		exists:        "CA file '%s' already exists!",
		newStore:      "New CA file created '%s'!",
		created:       "transaction created for CA %s!",
		updated:       "transaction updated for CA %s!",
		validate: func(_, payload string) string {
			if !strings.Contains(payload, "-----BEGIN CERTIFICATE-----") {
				return "Invalid payload"
			}
			return ""
		},
		commitCheck: func(string, string) (string, bool) { return "", false },
	}
}

// fakeStoreCommand adapts a store operation to the command table.
func fakeStoreCommand(store func(*FakeHAProxy) fakeStore, op func(fakeStore, string, *string) fakeOut) func(*FakeHAProxy, []string, *string) fakeOut {
	return func(f *FakeHAProxy, args []string, payload *string) fakeOut {
		return op(store(f), fakeFirstArg(args), payload)
	}
}

// create is new ssl cert / new ssl ca-file: an empty store, "" until a
// transaction is committed into it.
func (st fakeStore) create(name string, _ *string) fakeOut {
	if _, ok := st.files[name]; ok {
		return fakeErr(fmt.Sprintf(st.exists, name))
	}
	st.files[name] = ""
	return fakeMsg(5, fmt.Sprintf(st.newStore, name))
}

func (st fakeStore) set(name string, payload *string) fakeOut {
	if tx := *st.tx; tx != nil && tx.path != name && st.joinOpenTx {
		name = tx.path
	}
	if tx := *st.tx; tx != nil && tx.path != name {
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to set '" + name + "'\nCan't update " + name + "!")
	}
	if _, ok := st.files[name]; !ok {
		return fakeErr("Can't replace " + st.notReferenced + " which is not referenced by the configuration!\nCan't update " + name + "!")
	}
	body := ""
	if payload != nil {
		body = *payload
	}
	if msg := st.validate(name, body); msg != "" {
		return fakeErr(msg + "\nCan't update " + name + "!")
	}
	if *st.tx != nil {
		(*st.tx).content = body
		return fakeMsg(5, fmt.Sprintf(st.updated, name))
	}
	*st.tx = &fakeTransaction{path: name, content: body}
	return fakeMsg(5, fmt.Sprintf(st.created, name))
}

// commit prints no dots: real HAProxy prints one per certificate instance
// it rebuilt, which the fake does not model.
func (st fakeStore) commit(name string, _ *string) fakeOut {
	tx := *st.tx
	switch {
	case tx == nil:
		return fakeErr("No ongoing transaction! !\nCan't commit " + name + "!")
	case tx.path != name:
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to set '" + name + "'\nCan't commit " + name + "!")
	}
	switch msg, ends := st.commitCheck(name, tx.content); {
	case ends:
		*st.tx = nil
		return fakeList("Committing " + name + "\n" + msg + "\nFailed!")
	case msg != "":
		return fakeErr(msg + "\nCan't commit " + name + "!") // the transaction stays open
	}
	st.files[name] = tx.content
	*st.tx = nil
	return fakeList("Committing " + name + "\nSuccess!")
}

func (st fakeStore) abort(name string, _ *string) fakeOut {
	tx := *st.tx
	switch {
	case tx == nil:
		return fakeErr("No ongoing transaction!")
	case tx.path != name:
		return fakeErr("The ongoing transaction is about '" + tx.path + "' but you are trying to abort a transaction for '" + name + "'")
	}
	*st.tx = nil
	return fakeMsg(5, "Transaction aborted for certificate '"+name+"'!")
}

func (f *FakeHAProxy) showCerts(args []string, _ *string) fakeOut {
	if len(args) > 0 {
		return f.unknownCommand("show") // the detail view is not modelled
	}
	var b strings.Builder
	if tx := f.model.certTx; tx != nil {
		b.WriteString("# transaction\n*" + tx.path + "\n")
	}
	b.WriteString("# filename")
	for _, name := range fakeSortedKeys(f.model.Certs) {
		b.WriteString("\n" + name)
	}
	return fakeList(b.String())
}

func fakeCertCount(pem string) int {
	return strings.Count(pem, "-----BEGIN CERTIFICATE-----")
}

// fakeSystemCACount is the count shown for @system-ca, the host's CA
// bundle every worker lists. Its real size varies from host to host, so
// nothing may depend on it (the parity test masks it).
const fakeSystemCACount = 150

func (f *FakeHAProxy) showCAFiles(args []string, _ *string) fakeOut {
	if len(args) > 0 {
		return f.unknownCommand("show")
	}
	var b strings.Builder
	if tx := f.model.caTx; tx != nil {
		fmt.Fprintf(&b, "# transaction\n*%s - %d certificate(s)\n", tx.path, fakeCertCount(tx.content))
	}
	b.WriteString("# filename")
	rows := map[string]int{"@system-ca": fakeSystemCACount}
	for name, pem := range f.model.CAFiles {
		rows[name] = fakeCertCount(pem)
	}
	for _, name := range fakeSortedKeys(rows) {
		fmt.Fprintf(&b, "\n%s - %d certificate(s)", name, rows[name])
	}
	return fakeList(b.String())
}

func (f *FakeHAProxy) showCRLFiles(_ []string, _ *string) fakeOut {
	var b strings.Builder
	b.WriteString("# filename")
	for _, name := range fakeSortedKeys(f.model.CRLFiles) {
		b.WriteString("\n" + name)
	}
	return fakeList(b.String())
}

// --- crt-lists

// crtListNumbers returns a list's line numbers, numbering seeded entries
// from 1 when the bookkeeping does not match the list (a test seeded or
// replaced it through With).
func (m *FakeModel) crtListNumbers(list string) []int {
	if m.crtListLines == nil {
		m.crtListLines = map[string][]int{}
		m.crtListLast = map[string]int{}
	}
	entries := m.CRTLists[list]
	if len(m.crtListLines[list]) != len(entries) {
		lines := make([]int, len(entries))
		for i := range lines {
			lines[i] = i + 1
		}
		m.crtListLines[list] = lines
		m.crtListLast[list] = len(entries)
	}
	return m.crtListLines[list]
}

// fakeCRTListEntry renders one crt-list line as HAProxy prints it: the
// certificate, the options in one bracket pair, the SNI filters, single
// spaces.
func fakeCRTListEntry(words []string) (cert, rest string) {
	if len(words) == 0 {
		return "", ""
	}
	cert = words[0]
	var parts []string
	i := 1
	if i < len(words) && strings.HasPrefix(words[i], "[") {
		var opts []string
		for ; i < len(words); i++ {
			w := words[i]
			done := strings.HasSuffix(w, "]")
			w = strings.TrimSuffix(strings.TrimPrefix(w, "["), "]")
			if w != "" {
				opts = append(opts, w)
			}
			if done {
				i++
				break
			}
		}
		if len(opts) > 0 {
			parts = append(parts, "["+strings.Join(opts, " ")+"]")
		}
	}
	parts = append(parts, words[i:]...)
	return cert, strings.Join(parts, " ")
}

func fakeEntryCert(entry string) string {
	cert, _, _ := strings.Cut(entry, " ")
	return cert
}

func (f *FakeHAProxy) showCRTList(args []string, _ *string) fakeOut {
	m := &f.model
	numbered := len(args) > 0 && args[0] == "-n"
	if numbered {
		args = args[1:]
		if len(args) == 0 {
			return fakeErr("'show ssl crt-list -n' expects a filename or a directory")
		}
	}
	if len(args) == 0 {
		return fakeList(strings.Join(fakeSortedKeys(m.CRTLists), "\n"))
	}
	list := args[0]
	entries, ok := m.CRTLists[list]
	if !ok {
		return fakeErr("didn't find the specified filename")
	}
	lines := m.crtListNumbers(list)
	var b strings.Builder
	b.WriteString("# " + list)
	for i, e := range entries {
		if !numbered {
			b.WriteString("\n" + e)
			continue
		}
		cert, rest, _ := strings.Cut(e, " ")
		fmt.Fprintf(&b, "\n%s:%d", cert, lines[i])
		if rest != "" {
			b.WriteString(" " + rest)
		}
	}
	return fakeList(b.String())
}

// addCRTList adds one entry. The payload form carries options and SNI
// filters; the line form keeps only the certificate, as HAProxy's does.
func (f *FakeHAProxy) addCRTList(args []string, payload *string) fakeOut {
	m := &f.model
	if len(args) == 0 {
		return fakeErr("'add ssl crt-list' expects a filename and a certificate name")
	}
	list := args[0]
	if _, ok := m.CRTLists[list]; !ok {
		return fakeErr("Can't edit the crt-list: crt-list '" + list + "' does not exist!")
	}
	var words []string
	if payload != nil {
		firstLine, _, _ := strings.Cut(*payload, "\n")
		words = fakeFields(firstLine)
	} else if len(args) > 1 {
		words = args[1:2]
	}
	cert, rest := fakeCRTListEntry(words)
	if cert == "" {
		return fakeErr("'add ssl crt-list' expects a filename and a certificate name")
	}
	pem, ok := m.Certs[cert]
	if !ok {
		return fakeErr("Can't edit the crt-list: certificate '" + cert + "' does not exist!")
	}
	if pem == "" {
		return fakeErr("Can't edit the crt-list: certificate '" + cert + "' is empty!")
	}
	lines := m.crtListNumbers(list)
	entry := cert
	if rest != "" {
		entry += " " + rest
	}
	m.crtListLast[list]++
	m.CRTLists[list] = append(m.CRTLists[list], entry)
	m.crtListLines[list] = append(lines, m.crtListLast[list])
	return fakeList("Inserting certificate '" + cert + "' in crt-list '" + list + "'.\nSuccess!")
}

// delCRTList deletes "<cert>" or "<cert>:<line>" from a list. The fake
// knows no bind lines, so unlike HAProxy it never refuses to delete a
// bind line's default certificate.
func (f *FakeHAProxy) delCRTList(args []string, _ *string) fakeOut {
	m := &f.model
	if len(args) < 2 {
		return fakeErr("'del ssl crt-list' expects a filename and a certificate name")
	}
	list, cert := args[0], args[1]
	line := 0
	if i := strings.LastIndexByte(cert, ':'); i >= 0 {
		if n, err := strconv.Atoi(cert[i+1:]); err == nil && n > 0 {
			cert, line = cert[:i], n
		}
	}
	entries, ok := m.CRTLists[list]
	if !ok {
		return fakeErr("Can't delete the entry: crt-list '" + list + "' does not exist!")
	}
	if _, ok := m.Certs[cert]; !ok {
		return fakeErr("Can't delete the entry: certificate '" + cert + "' does not exist!")
	}
	lines := m.crtListNumbers(list)
	var found []int
	for i, e := range entries {
		if fakeEntryCert(e) == cert && (line == 0 || lines[i] == line) {
			found = append(found, i)
		}
	}
	switch {
	case len(found) == 0:
		return fakeErr("Can't delete the entry: certificate '" + cert + "' can't be found in crt-list '" + list + "'!")
	case len(found) > 1:
		nums := make([]string, len(found))
		for j, i := range found {
			nums[j] = strconv.Itoa(lines[i])
		}
		return fakeErr("Can't delete the entry: found the certificate '" + cert + "' in several entries, please specify a line number preceded by colons (" + strings.Join(nums, ", ") + ")!")
	}
	i := found[0]
	m.CRTLists[list] = append(entries[:i:i], entries[i+1:]...)
	m.crtListLines[list] = append(lines[:i:i], lines[i+1:]...)
	return fakeMsg(5, "Entry '"+cert+"' deleted in crtlist '"+list+"'!")
}

// certInUse reports whether a crt-list entry or a server's crt keyword
// names the certificate: what a commit rebuilds.
func (f *FakeHAProxy) certInUse(name string) bool {
	for _, entries := range f.model.CRTLists {
		for _, e := range entries {
			if first, _, _ := strings.Cut(e, " "); first == name {
				return true
			}
		}
	}
	for _, be := range f.model.Backends {
		for _, s := range be.Servers {
			if i := slices.Index(s.Keywords, "crt"); i >= 0 && i+1 < len(s.Keywords) && s.Keywords[i+1] == name {
				return true
			}
		}
	}
	return false
}
