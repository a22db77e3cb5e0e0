//go:build unix

package boltfmt

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/participantd/participantd/store"
)

// TestContain_PanicAndFaultAreErrCorrupt checks the boundary every bbolt
// call runs behind: a panic, and a read of a mapping past the end of its
// file (SIGBUS, as bbolt would do on a truncated file), become errors.
func TestContain_PanicAndFaultAreErrCorrupt(t *testing.T) {
	if err := Contain("f", func() error { panic("invalid page type") }); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Contain(panic) = %v, want store.ErrCorrupt", err)
	}
	path := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps := os.Getpagesize()
	m, err := syscall.Mmap(int(f.Fd()), 0, 4*ps, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	var sink byte
	err = Contain(path, func() error {
		sink = m[2*ps] // past the end of the file
		return nil
	})
	if !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Contain(read past the file) = %v (read %d), want store.ErrCorrupt", err, sink)
	}
}
