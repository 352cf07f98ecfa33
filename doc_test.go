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
