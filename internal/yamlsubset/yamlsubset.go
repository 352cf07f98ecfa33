// Package yamlsubset reads the subset of YAML that the repository's own
// YAML files are written in (deploy/, api/openapi.yaml), so that tests can
// hold them to the code without a YAML dependency: documents split by
// "---", block mappings and sequences by indentation, plain and quoted
// scalars and keys, flow sequences of scalars, "{}", literal blocks ("|"),
// and comments. Anything else (anchors, tags, flow mappings with content,
// folded blocks, tabs, a plain scalar that YAML would read otherwise) is an
// error, so that a file that leaves the subset fails its test instead of
// being misread.
//
// Every scalar is read as a string: the reader does not guess types, and
// its callers know which keys hold numbers. It is used by tests only; it
// lives here, and not in a _test.go file, because tests of two packages
// read YAML and a test file cannot be imported.
package yamlsubset

import (
	"fmt"
	"strconv"
	"strings"
)

type line struct {
	num    int // 1-based, for errors
	indent int
	text   string // without the indentation
}

type reader struct {
	lines []line
	pos   int
}

// ParseDocuments reads every document of src. A node is a string, a []any
// or a map[string]any.
func ParseDocuments(src string) ([]any, error) {
	var docs []any
	var cur []line
	flush := func() error {
		r := &reader{lines: cur}
		r.skip()
		if r.pos == len(r.lines) {
			cur = nil
			return nil
		}
		node, err := r.node(r.lines[r.pos].indent)
		if err != nil {
			return err
		}
		if r.skip(); r.pos < len(r.lines) {
			l := r.lines[r.pos]
			return fmt.Errorf("line %d: unexpected %q", l.num, l.text)
		}
		docs = append(docs, node)
		cur = nil
		return nil
	}
	for i, raw := range strings.Split(src, "\n") {
		if strings.TrimRight(raw, " ") == "---" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		if strings.Contains(raw, "\t") {
			return nil, fmt.Errorf("line %d: a tab", i+1)
		}
		text := strings.TrimLeft(raw, " ")
		cur = append(cur, line{num: i + 1, indent: len(raw) - len(text), text: strings.TrimRight(text, " ")})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

// Parse reads src, which must hold exactly one document.
func Parse(src string) (any, error) {
	docs, err := ParseDocuments(src)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("%d documents, want one", len(docs))
	}
	return docs[0], nil
}

func isBlank(l line) bool { return l.text == "" || strings.HasPrefix(l.text, "#") }

// skip moves past blank and comment lines.
func (r *reader) skip() {
	for r.pos < len(r.lines) && isBlank(r.lines[r.pos]) {
		r.pos++
	}
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// node reads the block node whose lines start at indent.
func (r *reader) node(indent int) (any, error) {
	r.skip()
	if r.pos == len(r.lines) {
		return nil, nil
	}
	if isSeqItem(r.lines[r.pos].text) {
		return r.sequence(indent)
	}
	return r.mapping(indent)
}

func (r *reader) sequence(indent int) ([]any, error) {
	out := []any{}
	for r.skip(); r.pos < len(r.lines); r.skip() {
		l := r.lines[r.pos]
		if l.indent != indent || !isSeqItem(l.text) {
			if l.indent > indent {
				return nil, fmt.Errorf("line %d: unexpected indentation", l.num)
			}
			break
		}
		rest := strings.TrimSpace(strings.TrimPrefix(l.text, "-"))
		switch _, _, isKey, err := keyOf(rest, l.num); {
		case err != nil:
			return nil, err
		case rest == "":
			r.pos++
			r.skip()
			if r.pos == len(r.lines) || r.lines[r.pos].indent <= indent {
				return nil, fmt.Errorf("line %d: an empty sequence item", l.num)
			}
			item, err := r.node(r.lines[r.pos].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, item)
		case isKey:
			// "- key: value": a mapping whose keys sit where rest starts.
			r.lines[r.pos] = line{num: l.num, indent: l.indent + (len(l.text) - len(rest)), text: rest}
			item, err := r.mapping(r.lines[r.pos].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, item)
		default:
			v, err := scalar(rest, l.num)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			r.pos++
		}
	}
	return out, nil
}

// keyOf splits a "key: value" or "key:" line into its key and what follows
// the colon. A key is plain (no ": " inside) or quoted, as the keys of
// status codes must be ("200":); ok is false when text is no key.
func keyOf(text string, num int) (key, rest string, ok bool, err error) {
	if strings.HasPrefix(text, `"`) || strings.HasPrefix(text, "'") {
		end := closingQuote(text)
		if end < 0 {
			// A quoted scalar that runs on: not a key, and scalar reports it.
			return "", "", false, nil
		}
		after := text[end+1:]
		if after != ":" && !strings.HasPrefix(after, ": ") {
			return "", "", false, nil
		}
		key, err := unquote(text[:end+1], num)
		return key, strings.TrimPrefix(after, ":"), err == nil, err
	}
	if strings.HasPrefix(text, "[") || strings.HasPrefix(text, "{") {
		return "", "", false, nil
	}
	if i := strings.Index(text, ": "); i > 0 {
		return text[:i], text[i+1:], true, nil
	}
	if strings.HasSuffix(text, ":") && !strings.Contains(text, " ") {
		return strings.TrimSuffix(text, ":"), "", true, nil
	}
	return "", "", false, nil
}

func (r *reader) mapping(indent int) (map[string]any, error) {
	out := map[string]any{}
	for r.skip(); r.pos < len(r.lines); r.skip() {
		l := r.lines[r.pos]
		if l.indent < indent || (l.indent == indent && isSeqItem(l.text)) {
			break
		}
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.num)
		}
		key, rest, ok, err := keyOf(l.text, l.num)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not a key", l.num, l.text)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("line %d: key %q repeated", l.num, key)
		}
		value := strings.TrimSpace(rest)
		r.pos++
		switch {
		case value == "" || strings.HasPrefix(value, "#"):
			r.skip()
			switch {
			case r.pos < len(r.lines) && r.lines[r.pos].indent > indent:
				child, err := r.node(r.lines[r.pos].indent)
				if err != nil {
					return nil, err
				}
				out[key] = child
			case r.pos < len(r.lines) && r.lines[r.pos].indent == indent && isSeqItem(r.lines[r.pos].text):
				child, err := r.sequence(indent)
				if err != nil {
					return nil, err
				}
				out[key] = child
			default:
				out[key] = ""
			}
		case value == "|":
			out[key] = r.literal(indent)
		default:
			v, err := scalar(value, l.num)
			if err != nil {
				return nil, err
			}
			out[key] = v
		}
	}
	return out, nil
}

// literal reads a "|" block: the lines indented deeper than the key, with
// the first line's indentation removed and one final newline.
func (r *reader) literal(indent int) string {
	var lines []string
	block := -1
	for ; r.pos < len(r.lines); r.pos++ {
		l := r.lines[r.pos]
		if l.text == "" {
			lines = append(lines, "")
			continue
		}
		if l.indent <= indent {
			break
		}
		if block < 0 {
			block = l.indent
		}
		lines = append(lines, strings.Repeat(" ", max(l.indent-block, 0))+l.text)
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return strings.Join(lines, "\n") + "\n"
}

// scalar reads a scalar, a flow sequence of scalars or "{}".
func scalar(text string, num int) (any, error) {
	switch {
	case strings.HasPrefix(text, "["):
		end := strings.LastIndex(text, "]")
		if end < 0 || strings.TrimSpace(text[end+1:]) != "" && !strings.HasPrefix(strings.TrimSpace(text[end+1:]), "#") {
			return nil, fmt.Errorf("line %d: an unterminated flow sequence", num)
		}
		items, err := splitFlow(text[1:end], num)
		if err != nil {
			return nil, err
		}
		out := []any{}
		for _, item := range items {
			v, err := plainOrQuoted(item, num)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case text == "{}":
		return map[string]any{}, nil
	case strings.HasPrefix(text, "{"), strings.HasPrefix(text, "&"), strings.HasPrefix(text, "*"),
		strings.HasPrefix(text, "!"), strings.HasPrefix(text, ">"), strings.HasPrefix(text, "|"):
		return nil, fmt.Errorf("line %d: %q is outside the YAML subset", num, text)
	}
	return plainOrQuoted(text, num)
}

// plainOrQuoted reads one plain or quoted scalar, dropping a trailing
// comment. A plain scalar holding ": " or starting with a reserved
// character is refused: YAML would read the first as a mapping and refuse
// the second, so a file this reader accepted would not mean the same to
// the tools that read it for real.
func plainOrQuoted(text string, num int) (string, error) {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, `"`) || strings.HasPrefix(text, "'") {
		end := closingQuote(text)
		if end < 0 {
			return "", fmt.Errorf("line %d: an unterminated string", num)
		}
		if rest := strings.TrimSpace(text[end+1:]); rest != "" && !strings.HasPrefix(rest, "#") {
			return "", fmt.Errorf("line %d: %q follows a quoted string", num, rest)
		}
		return unquote(text[:end+1], num)
	}
	if i := strings.Index(text, " #"); i >= 0 {
		text = strings.TrimSpace(text[:i])
	}
	if strings.Contains(text, ": ") || strings.HasSuffix(text, ":") || strings.HasPrefix(text, "@") || strings.HasPrefix(text, "`") {
		return "", fmt.Errorf("line %d: the plain scalar %q must be quoted", num, text)
	}
	return text, nil
}

// unquote reads a whole quoted scalar: a double-quoted one with Go's
// escapes (YAML's common ones), a single-quoted one with a doubled quote
// for a quote.
func unquote(quoted string, num int) (string, error) {
	if quoted[0] == '\'' {
		return strings.ReplaceAll(quoted[1:len(quoted)-1], "''", "'"), nil
	}
	s, err := strconv.Unquote(quoted)
	if err != nil {
		return "", fmt.Errorf("line %d: %s: %v", num, quoted, err)
	}
	return s, nil
}

// closingQuote is the index of the quote that ends the quoted string at the
// start of s, -1 when there is none. In a single-quoted string a doubled
// quote is a quote, not its end; in a double-quoted one a backslash escapes.
func closingQuote(s string) int {
	q := s[0]
	for i := 1; i < len(s); i++ {
		switch {
		case q == '"' && s[i] == '\\':
			i++
		case s[i] == q && q == '\'' && i+1 < len(s) && s[i+1] == '\'':
			i++
		case s[i] == q:
			return i
		}
	}
	return -1
}

// splitFlow splits the inside of a flow sequence at the commas outside
// quotes.
func splitFlow(s string, num int) ([]string, error) {
	var out []string
	start, inQuote := 0, byte(0)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote == '"' && c == '\\':
			i++
		case inQuote != 0 && c == inQuote:
			inQuote = 0
		case inQuote == 0 && (c == '"' || c == '\''):
			inQuote = c
		case inQuote == 0 && c == ',':
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if inQuote != 0 {
		return nil, fmt.Errorf("line %d: an unterminated string", num)
	}
	if last := strings.TrimSpace(s[start:]); last != "" || len(out) > 0 {
		out = append(out, s[start:])
	}
	return out, nil
}
