//go:build unix

package logfirst_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// A bbolt file damaged under an open store (here cut short, so that
// bbolt's reads of the mapping fault) fails reads with store.ErrCorrupt
// naming the file, instead of crashing the process.
func TestRead_DamagedFileIsErrCorruptNotACrash(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	for i := range uint64(2000) {
		if _, err := s.Append("pad", make([]byte, 200), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutBytes([]store.Bytes{{Key: "b", Value: make([]byte, 100)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, logfirst.DBFile)
	if err := os.Truncate(path, 2*4096); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadFrom("pad", 0, 0); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadFrom of a cut file = %v, want ErrCorrupt naming %s", err, path)
	}
	if _, err := s.ReadPage("pad", 1000, 0, 1<<20); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("ReadPage of a cut file = %v, want ErrCorrupt", err)
	}
	logfirst.Abandon(s)
}

// Open and OpenReadOnly check the bbolt file as boltstore.Open does: missing
// or empty is ErrNoData where it must exist, damaged is ErrCorrupt.
func TestOpen_ChecksTheFileAsStoreOpenDoes(t *testing.T) {
	served := func(t *testing.T) string {
		dir := t.TempDir()
		s := open(t, dir, noCheckpoint)
		fill(t, s, 3)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		want   error
	}{
		{"missing", os.Remove, store.ErrNoData},
		{"empty", func(path string) error { return os.Truncate(path, 0) }, store.ErrNoData},
		{"truncated", func(path string) error { return os.Truncate(path, 4096+100) }, store.ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := served(t)
			if err := tc.damage(filepath.Join(dir, logfirst.DBFile)); err != nil {
				t.Fatal(err)
			}
			if s, err := logfirst.Open(dir, logfirst.Options{MustExist: true}); !errors.Is(err, tc.want) {
				if err == nil {
					s.Close()
				}
				t.Errorf("Open(MustExist) = %v, want %v", err, tc.want)
			}
			if s, err := logfirst.OpenReadOnly(dir, logfirst.Options{}); !errors.Is(err, tc.want) {
				if err == nil {
					s.Close()
				}
				t.Errorf("OpenReadOnly = %v, want %v", err, tc.want)
			}
		})
	}
}
