// Tests of the YAML subset reader: what it reads, and what it refuses
// rather than misread.

package yamlsubset

import (
	"reflect"
	"testing"
)

func TestReadsTheSubset(t *testing.T) {
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
"200":
  description: 'it''s quoted'
'$ref': "#/a/b"
pattern: '^[^\x00;]+$'
after: done
---
kind: Second
`
	docs, err := ParseDocuments(src)
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
			"text":    "line 1\n  indented\n\nline 4\n",
			"200":     map[string]any{"description": "it's quoted"},
			"$ref":    "#/a/b",
			"pattern": `^[^\x00;]+$`,
			"after":   "done",
		},
		map[string]any{"kind": "Second"},
	}
	if !reflect.DeepEqual(docs, want) {
		t.Errorf("read\n%v\nwant\n%v", docs, want)
	}
	if _, err := Parse(src); err == nil {
		t.Error("Parse took two documents")
	}
}

func TestRefusesWhatItWouldMisread(t *testing.T) {
	for _, bad := range []string{
		"a: &anchor x\n", "a: *alias\n", "a: {b: c}\n", "a: >\n  folded\n", "a:\n\tb: c\n",
		"a: b\n  c: d\n", "a: 1\na: 2\n", "just text\n", `a: "open` + "\n",
		"a: b: c\n", "a: @x\n", `a: "x" y` + "\n", `"200" : x` + "\n", `a: "\q"` + "\n",
	} {
		if _, err := ParseDocuments(bad); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
}
