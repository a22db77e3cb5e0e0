package participantd_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestErrorCodes_OneList keeps the three lists of error codes one list:
// participant.Code (what the service decides), wire.Code (what the server
// sends; server/dispatch.go converts one to the other by value) and the
// table of docs/PROTOCOL.md's "Errors" section. Every constant of either
// package's Code type must have its twin, of the same name and value, in
// the other, and every value must be a row of the table, and every row a
// value.
func TestErrorCodes_OneList(t *testing.T) {
	part := codeConsts(t, "participant")
	wire := codeConsts(t, "wire")
	if len(part) == 0 || len(wire) == 0 {
		t.Fatalf("found %d participant and %d wire codes; the parser no longer finds the constants", len(part), len(wire))
	}
	if diff := cmp.Diff(wire, part); diff != "" {
		t.Errorf("participant.Code and wire.Code constants differ (-wire +participant):\n%s", diff)
	}
	values := make(map[string]bool)
	for _, v := range wire {
		values[v] = true
	}
	if diff := cmp.Diff(values, protocolCodes(t)); diff != "" {
		t.Errorf("wire.Code values and docs/PROTOCOL.md's error table differ (-wire +doc):\n%s", diff)
	}
}

// codeConsts returns, by name, the string value of every constant of type
// Code declared in the non-test files of the package in dir.
func codeConsts(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	consts := make(map[string]string)
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatalf("parsing %s: %v", file, err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Code" {
					continue
				}
				for i, name := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: %s is not a string literal", fset.Position(name.Pos()), name.Name)
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
					}
					consts[name.Name] = v
				}
			}
		}
	}
	return consts
}

// protocolCodes returns the codes of the table in docs/PROTOCOL.md's
// "Errors" section: the first cell of each row, where "`a` / `b`" names two.
func protocolCodes(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open("docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	codes := make(map[string]bool)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Errors"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.Split(line, "|")[1]
		for _, c := range strings.Split(cell, "/") {
			codes[strings.Trim(strings.TrimSpace(c), "`")] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(codes) == 0 {
		t.Fatalf("docs/PROTOCOL.md has no error table under \"## Errors\"")
	}
	return codes
}
