package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/logfirst"
)

// diskSample is the size of the server's data directory at one moment of
// a --disk-sample run, and the operations counted by then.
type diskSample struct {
	Seconds float64 `json:"seconds"`
	// DataFile is participantd.db, LogBytes the log segments under wal/.
	DataFile int64  `json:"data_file_bytes"`
	LogBytes int64  `json:"log_bytes"`
	Ops      uint64 `json:"ops"`
}

// sampleDisk measures dir now; ops is what the run counted so far.
func sampleDisk(dir string, since time.Time, ops uint64) (diskSample, error) {
	s := diskSample{Seconds: time.Since(since).Seconds(), Ops: ops}
	fi, err := os.Stat(filepath.Join(dir, server.StoreFile))
	if err != nil {
		return s, fmt.Errorf("disk sample: %w", err)
	}
	s.DataFile = fi.Size()
	err = filepath.WalkDir(filepath.Join(dir, logfirst.WALDir), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		s.LogBytes += info.Size()
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		return s, fmt.Errorf("disk sample: %w", err)
	}
	return s, nil
}

// measure waits out the measured duration of r, taking a disk sample of
// f.dataDir every f.diskSample (and at both ends) when it is set, each
// also written to progress as it is taken, so that a long run shows its
// figures before it ends. A failed sample ends the sampling, not the run.
func measure(ctx context.Context, f *benchFlags, r *loadRun, t0 time.Time, rep *benchReport, progress io.Writer) {
	end := t0.Add(f.duration)
	if f.diskSample <= 0 {
		sleep(ctx, time.Until(end))
		return
	}
	take := func() bool {
		s, err := sampleDisk(f.dataDir, t0, r.counted())
		if err != nil {
			rep.DiskError = err.Error()
			return false
		}
		rep.Disk = append(rep.Disk, s)
		fmt.Fprintf(progress, "disk %6.0f s: data file %d B, log %d B, %d ops\n", s.Seconds, s.DataFile, s.LogBytes, s.Ops)
		return true
	}
	ok := take()
	for next := t0.Add(f.diskSample); ok && next.Before(end) && ctx.Err() == nil; next = next.Add(f.diskSample) {
		sleep(ctx, time.Until(next))
		ok = take()
	}
	sleep(ctx, time.Until(end))
	if ok && ctx.Err() == nil {
		take()
	}
}

// counted is how many answers the workers counted so far.
func (r *loadRun) counted() uint64 {
	var n uint64
	for _, w := range r.workers {
		n += w.count.Load()
	}
	return n
}

// printDisk writes the samples as a table, with the bytes each operation
// added to the data file and log since the previous sample.
func printDisk(w io.Writer, samples []diskSample) {
	if len(samples) == 0 {
		return
	}
	fmt.Fprintf(w, "  disk: %8s %12s %10s %12s %14s\n", "time", "data file", "log", "ops", "B/op since")
	var prev diskSample
	for i, s := range samples {
		perOp := "-"
		if d := s.Ops - prev.Ops; i > 0 && d > 0 {
			perOp = fmt.Sprintf("%.0f", float64((s.DataFile+s.LogBytes)-(prev.DataFile+prev.LogBytes))/float64(d))
		}
		fmt.Fprintf(w, "        %7.0fs %8.1f MiB %6.1f MiB %12d %14s\n", s.Seconds, mib(s.DataFile), mib(s.LogBytes), s.Ops, perOp)
		prev = s
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
