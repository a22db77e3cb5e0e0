// Package logfirsttest holds what the tests of the log-first store and of
// the tools built on it (package offline) share: the damage they inflict
// on a data directory.
package logfirsttest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store/logfirst"
)

// The ways LoseLog loses a log.
const (
	// Directory loses logfirst.WALDir and everything in it, as a crash
	// loses a directory whose entry was never synced.
	Directory = "directory"
	// Segments loses every segment in logfirst.WALDir and keeps the
	// directory, as a crash loses files whose entries were never synced.
	Segments = "segments"
)

// Losses are the ways LoseLog loses a log, for a test to try each.
var Losses = []string{Directory, Segments}

// LoseLog loses the log of the data directory dir in the way how, one of
// Losses, and leaves the rest of dir as it is.
func LoseLog(t testing.TB, dir, how string) {
	t.Helper()
	walDir := filepath.Join(dir, logfirst.WALDir)
	switch how {
	case Directory:
		if err := os.RemoveAll(walDir); err != nil {
			t.Fatal(err)
		}
	case Segments:
		segs, err := filepath.Glob(filepath.Join(walDir, "*.wal"))
		if err != nil {
			t.Fatal(err)
		}
		for _, seg := range segs {
			if err := os.Remove(seg); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("LoseLog(%q): want one of %q", how, Losses)
	}
}
