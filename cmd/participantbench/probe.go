package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// fsyncProbe measures, in dir, the raw rate of one goroutine writing 200
// bytes and fsyncing, for d. This is the physical reference every report
// carries: with no group commit, a two-barrier operation costs about four of
// these (two bbolt commits of two fsyncs each).
// dir is created if missing, as the embedded server creates its data
// directory: the probe runs first.
func fsyncProbe(dir string, d time.Duration) (perSec float64, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("fsync probe: %w", err)
	}
	f, err := os.CreateTemp(dir, "fsync-probe-*")
	if err != nil {
		return 0, fmt.Errorf("fsync probe: %w", err)
	}
	name := f.Name()
	defer os.Remove(name)
	defer f.Close()
	buf := make([]byte, 200)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		// Append, as a log does, so that each fsync has new data to write.
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("fsync probe: write %s: %w", filepath.Base(name), err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("fsync probe: fsync %s: %w", filepath.Base(name), err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
