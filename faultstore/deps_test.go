package faultstore

import (
	"go/build"
	"strings"
	"testing"
)

// TestDeps keeps the package usable from any test helper: it imports no
// project package but store, and not testing, so that non-test code (a
// shared test harness, a fuzz driver) can link it.
func TestDeps(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const project = "github.com/participantd/participantd/"
	for _, imp := range pkg.Imports {
		switch {
		case imp == "testing":
			t.Errorf("faultstore imports %q outside its tests", imp)
		case strings.HasPrefix(imp, project) && imp != project+"store":
			t.Errorf("faultstore imports %q; only store is allowed", imp)
		}
	}
}
