// The check that keeps the contract readable in go doc: users read the
// exported types as the specification, so an exported field without a
// comment is a hole in it. The fake HAProxy is a test double, not contract,
// and is left out.

package haptic

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestExportedFieldsAreDocumented(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, "fakehaproxy") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls { // package level only: go doc shows no local type
			if gen, ok := decl.(*ast.GenDecl); ok && gen.Tok == token.TYPE {
				for _, s := range gen.Specs {
					if spec := s.(*ast.TypeSpec); spec.Name.IsExported() {
						checked += checkFieldComments(t, fset, spec)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no exported field to check: the test reads the wrong directory")
	}
}

// checkFieldComments reports every exported field of spec, inline struct
// types included, that has neither a doc nor a trailing comment, and
// returns how many it checked. An embedded field is documented by its
// type's own doc.
func checkFieldComments(t *testing.T, fset *token.FileSet, spec *ast.TypeSpec) int {
	checked := 0
	ast.Inspect(spec.Type, func(n ast.Node) bool {
		if st, ok := n.(*ast.StructType); ok {
			for _, f := range st.Fields.List {
				if len(f.Names) == 0 || !f.Names[0].IsExported() {
					continue
				}
				checked++
				if f.Doc == nil && f.Comment == nil {
					t.Errorf("%s: field %s.%s has no comment", fset.Position(f.Pos()), spec.Name.Name, f.Names[0].Name)
				}
			}
		}
		return true
	})
	return checked
}

// TestTheFileTableNamesEveryFile: the package documentation's table of
// files is the one map of the code, so it names every non-test Go file of
// the package (a glob such as agent_disk*.go counts for the files it
// matches) and nothing that is gone.
func TestTheFileTableNamesEveryFile(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(doc)) {
		if f := strings.Fields(strings.TrimPrefix(line, "//\t")); strings.HasPrefix(line, "//\t") && len(f) > 1 &&
			strings.HasSuffix(strings.TrimSuffix(f[0], ","), ".go") {
			names = append(names, f[0])
		}
	}
	for _, n := range names {
		if m, _ := filepath.Glob(n); len(m) == 0 {
			t.Errorf("doc.go's file table names %s, which does not exist", n)
		}
	}
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "doc.go" {
			continue
		}
		if !slices.ContainsFunc(names, func(n string) bool { ok, _ := filepath.Match(n, f); return ok }) {
			t.Errorf("doc.go's file table does not name %s", f)
		}
	}
}
