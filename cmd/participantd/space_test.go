package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// A start whose disk has less free space than a log segment and the bbolt
// file's growth exits 1 before it writes a segment, saying what it needs,
// what it has and which setting lowers the need.
func TestRun_RefusesADiskWithoutRoomForALogSegment(t *testing.T) {
	dir := t.TempDir()
	// A 1 PiB segment: no test machine has that free.
	c, out := runRefused(t, "--data", dir, "--wal-segment-size", "1125899906842624")
	if c != 1 {
		t.Errorf("participantd exit = %d, want 1; logged %s", c, out)
	}
	for _, want := range []string{"bytes available", "start-up needs 1125899906", "--wal-segment-size"} {
		if !strings.Contains(out, want) {
			t.Errorf("participantd logged %s, want %q in it", out, want)
		}
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal")); len(segs) != 0 {
		t.Errorf("the refused start left segments %v", segs)
	}
}
