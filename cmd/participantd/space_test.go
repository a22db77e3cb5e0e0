package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A start whose disk has less free space than a log segment and the bbolt
// file's growth exits 1 before it writes a segment, saying what it needs,
// what it has and which setting lowers the need.
func TestRun_RefusesADiskWithoutRoomForALogSegment(t *testing.T) {
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	code := make(chan int, 1)
	go func() {
		// A 1 PiB segment: no test machine has that free.
		code <- run([]string{"--data", dir, "--wal-segment-size", "1125899906842624",
			"--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"}, nil, io.Discard, logf)
	}()
	var c int
	select {
	case c = <-code:
	case <-time.After(30 * time.Second):
		t.Fatal("participantd did not refuse to start")
	}
	out, err := os.ReadFile(logf.Name())
	if err != nil {
		t.Fatal(err)
	}
	if c != 1 {
		t.Errorf("participantd exit = %d, want 1; logged %s", c, out)
	}
	for _, want := range []string{"bytes available", "start-up needs 1125899906", "--wal-segment-size"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("participantd logged %s, want %q in it", out, want)
		}
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal")); len(segs) != 0 {
		t.Errorf("the refused start left segments %v", segs)
	}
}
