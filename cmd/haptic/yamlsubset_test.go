// A reader for the subset of YAML that deploy/kubernetes is written in, so
// that the deployment test can check the manifests without a YAML
// dependency: documents split by "---", block mappings and sequences by
// indentation, plain and quoted scalars, flow sequences of scalars, "{}",
// literal blocks ("|"), and comments. Anything else (anchors, tags, flow
// mappings with content, folded blocks, tabs) is an error, so a manifest
// that leaves the subset fails the test instead of being misread.

package main

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

type yamlLine struct {
	num    int // 1-based, for errors
	indent int
	text   string // without the indentation
}

type yamlReader struct {
	lines []yamlLine
	pos   int
}

// parseYAMLDocuments reads every document of src. A node is a string, a
// []any or a map[string]any.
func parseYAMLDocuments(src string) ([]any, error) {
	var docs []any
	var cur []yamlLine
	flush := func() error {
		r := &yamlReader{lines: cur}
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
		cur = append(cur, yamlLine{num: i + 1, indent: len(raw) - len(text), text: strings.TrimRight(text, " ")})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

func isYAMLBlank(l yamlLine) bool { return l.text == "" || strings.HasPrefix(l.text, "#") }

// skip moves past blank and comment lines.
func (r *yamlReader) skip() {
	for r.pos < len(r.lines) && isYAMLBlank(r.lines[r.pos]) {
		r.pos++
	}
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// node reads the block node whose lines start at indent.
func (r *yamlReader) node(indent int) (any, error) {
	r.skip()
	if r.pos == len(r.lines) {
		return nil, nil
	}
	if isSeqItem(r.lines[r.pos].text) {
		return r.sequence(indent)
	}
	return r.mapping(indent)
}

func (r *yamlReader) sequence(indent int) ([]any, error) {
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
		switch {
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
		case yamlKeyOf(rest) != "":
			// "- key: value": a mapping whose keys sit where rest starts.
			r.lines[r.pos] = yamlLine{num: l.num, indent: l.indent + (len(l.text) - len(rest)), text: rest}
			item, err := r.mapping(r.lines[r.pos].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, item)
		default:
			v, err := yamlScalar(rest, l.num)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			r.pos++
		}
	}
	return out, nil
}

// yamlKeyOf returns the key of a "key: value" or "key:" line, "" when text
// is not one. Keys are plain: no quotes, no ": " inside.
func yamlKeyOf(text string) string {
	if strings.HasPrefix(text, `"`) || strings.HasPrefix(text, "'") || strings.HasPrefix(text, "[") || strings.HasPrefix(text, "{") {
		return ""
	}
	if i := strings.Index(text, ": "); i > 0 {
		return text[:i]
	}
	if strings.HasSuffix(text, ":") && !strings.Contains(text, " ") {
		return strings.TrimSuffix(text, ":")
	}
	return ""
}

func (r *yamlReader) mapping(indent int) (map[string]any, error) {
	out := map[string]any{}
	for r.skip(); r.pos < len(r.lines); r.skip() {
		l := r.lines[r.pos]
		if l.indent < indent || (l.indent == indent && isSeqItem(l.text)) {
			break
		}
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.num)
		}
		key := yamlKeyOf(l.text)
		if key == "" {
			return nil, fmt.Errorf("line %d: %q is not a key", l.num, l.text)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("line %d: key %q repeated", l.num, key)
		}
		value := strings.TrimSpace(strings.TrimPrefix(l.text, key+":"))
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
			v, err := yamlScalar(value, l.num)
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
func (r *yamlReader) literal(indent int) string {
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

// yamlScalar reads a scalar, a flow sequence of scalars or "{}".
func yamlScalar(text string, num int) (any, error) {
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
			v, err := yamlPlainOrQuoted(item, num)
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
	return yamlPlainOrQuoted(text, num)
}

// yamlPlainOrQuoted reads one plain or quoted scalar, dropping a trailing comment.
func yamlPlainOrQuoted(text string, num int) (string, error) {
	text = strings.TrimSpace(text)
	switch {
	case strings.HasPrefix(text, `"`):
		end := closingQuote(text)
		if end < 0 {
			return "", fmt.Errorf("line %d: an unterminated string", num)
		}
		return strconv.Unquote(text[:end+1])
	case strings.HasPrefix(text, "'"):
		end := strings.Index(text[1:], "'")
		if end < 0 {
			return "", fmt.Errorf("line %d: an unterminated string", num)
		}
		return text[1 : end+1], nil
	}
	if i := strings.Index(text, " #"); i >= 0 {
		text = strings.TrimSpace(text[:i])
	}
	return text, nil
}

// closingQuote is the index of the quote that ends the double-quoted string
// at the start of s, -1 when there is none.
func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
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

func TestYAMLSubsetReader(t *testing.T) {
	src := `# a comment
kind: Thing   # trailing
meta:
  name: x
  labels:
    a: "quoted: yes"
list:
- one
- 'two'
items:
  - name: first
    cmd: ["sh", "-c", "a, b"]
    empty: {}
  - name: second
    nested:
      - deep
text: |
  line 1
    indented

  line 4
after: done
---
kind: Second
`
	docs, err := parseYAMLDocuments(src)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		map[string]any{
			"kind": "Thing",
			"meta": map[string]any{"name": "x", "labels": map[string]any{"a": "quoted: yes"}},
			"list": []any{"one", "two"},
			"items": []any{
				map[string]any{"name": "first", "cmd": []any{"sh", "-c", "a, b"}, "empty": map[string]any{}},
				map[string]any{"name": "second", "nested": []any{"deep"}},
			},
			"text":  "line 1\n  indented\n\nline 4\n",
			"after": "done",
		},
		map[string]any{"kind": "Second"},
	}
	if !reflect.DeepEqual(docs, want) {
		t.Errorf("read\n%v\nwant\n%v", docs, want)
	}
	for _, bad := range []string{
		"a: &anchor x\n", "a: *alias\n", "a: {b: c}\n", "a: >\n  folded\n", "a:\n\tb: c\n",
		"a: b\n  c: d\n", "a: 1\na: 2\n", "just text\n", `a: "open` + "\n",
	} {
		if _, err := parseYAMLDocuments(bad); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
}
