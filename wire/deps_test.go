package wire

import (
	"go/build"
	"strings"
	"testing"
)

// TestDeps keeps wire a leaf: its non-test code imports only the standard
// library (docs/DESIGN.md: wire imports nothing of the project).
func TestDeps(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		first, _, _ := strings.Cut(imp, "/")
		if strings.Contains(first, ".") {
			t.Errorf("wire imports %q; it must import only the standard library", imp)
		}
	}
}
