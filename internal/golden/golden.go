// Package golden keeps the golden files of the stored formats: the bytes
// each version encodes a fixed value to, so that a test fails when an
// encoding changes, and so that every version ever written is decoded by
// every later build.
//
// A golden file is text, one encoding a line:
//
//	# comment
//	<name>: <hex of the bytes>
//
// `go test -update` rewrites the files from what the tests encode; run it
// only for a new version, never to silence a changed one.
package golden

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ from the values the tests encode")

// Value is one named encoding.
type Value struct {
	Name  string
	Bytes []byte
}

// Check compares want, the encodings of a package's fixed values, with
// the golden file at path, by name and in order, and fails t on any
// difference. Under -update it first writes want to path. It returns the
// bytes the file holds, by name, for the caller to decode.
func Check(t testing.TB, path string, want []Value) map[string][]byte {
	t.Helper()
	if *update {
		var b strings.Builder
		fmt.Fprintf(&b, "# Written by go test -update (internal/golden); a changed line is a changed stored format.\n")
		for _, v := range want {
			fmt.Fprintf(&b, "%s: %x\n", v.Name, v.Bytes)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stored, names := read(t, path)
	if len(names) != len(want) {
		t.Errorf("%s holds %v, want %d encodings", path, names, len(want))
	}
	for i, v := range want {
		b, ok := stored[v.Name]
		switch {
		case !ok:
			t.Errorf("%s holds no %q (go test -update writes it)", path, v.Name)
		case i < len(names) && names[i] != v.Name:
			t.Errorf("%s line %d is %q, want %q", path, i+1, names[i], v.Name)
		case !bytes.Equal(b, v.Bytes):
			t.Errorf("%s encodes to\n\t%x\nthe golden file holds\n\t%x\nthe stored format changed: a new format needs a new version", v.Name, v.Bytes, b)
		}
	}
	return stored
}

// read parses the golden file at path.
func read(t testing.TB, path string) (map[string][]byte, []string) {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file: %v (go test -update writes it)", err)
	}
	stored := map[string][]byte{}
	var names []string
	for i, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hx, ok := strings.Cut(line, ": ")
		b, err := hex.DecodeString(hx)
		if !ok || err != nil {
			t.Fatalf("%s line %d is not <name>: <hex>", path, i+1)
		}
		stored[name] = b
		names = append(names, name)
	}
	return stored, names
}
