package logfirst_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/participantd/participantd/store/logfirst"
)

// gatedWriter is a backup's destination that takes the first write, then
// blocks every later one until open is closed: a slow reader.
type gatedWriter struct {
	started chan struct{}
	open    chan struct{}
	n       int
	buf     bytes.Buffer
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	if w.n == 0 {
		close(w.started)
	} else {
		<-w.open
	}
	w.n++
	return w.buf.Write(p)
}

// While an online backup streams to a reader that does not read, writes
// go on: checkpoints that grow the bbolt file far past its size when the
// backup began do not wait for the backup's read transaction (bbolt
// remaps a file it grows, and a remap waits for every reader), so Flush
// never stalls behind the reader once the uncheckpointed log is at its
// bound. The workload must finish while the backup is still blocked; a
// stall is a deadlock, reported at the test's deadline.
func TestBackup_ASlowReaderDoesNotStallFlushes(t *testing.T) {
	dir := t.TempDir()
	opts := logfirst.Options{CheckpointInterval: time.Millisecond, CheckpointBytes: 64 << 10, MaxUncheckpointed: 256 << 10, SegmentSize: 1 << 20}
	s := open(t, dir, opts)
	fill(t, s, 5)
	w := &gatedWriter{started: make(chan struct{}), open: make(chan struct{})}
	backupDone := make(chan error, 1)
	go func() {
		_, err := s.Backup(w, nil)
		backupDone <- err
	}()
	<-w.started

	// 8 MiB through checkpoints, far past the file's mapped size, while
	// the backup's read transaction is open.
	workDone := make(chan error, 1)
	go func() {
		payload := bytes.Repeat([]byte{'x'}, 64<<10)
		for i := range uint64(128) {
			if _, err := s.Append("big", payload, i); err != nil {
				workDone <- err
				return
			}
			if err := s.Flush(); err != nil {
				workDone <- err
				return
			}
		}
		workDone <- logfirst.CheckpointNow(s)
	}()
	var deadline <-chan time.Time
	if d, ok := t.Deadline(); ok {
		// Not a timing assertion: a hang detector, so that a stall fails
		// with its cause rather than at the binary's timeout.
		deadline = time.After(time.Until(d) - 30*time.Second)
	}
	select {
	case err := <-workDone:
		if err != nil {
			t.Fatalf("writes during the backup: %v", err)
		}
	case <-deadline:
		close(w.open) // so that the store can close
		t.Fatal("the writes stalled behind the backup's blocked reader")
	}
	close(w.open)
	if err := <-backupDone; err != nil {
		t.Fatalf("Backup: %v", err)
	}
	if n, err := s.Len("big"); err != nil || n != 128 {
		t.Fatalf("Len(big) = %d, %v; want 128", n, err)
	}
	// The copy is a whole store at the checkpoint the backup took.
	restored := t.TempDir()
	if err := os.WriteFile(filepath.Join(restored, logfirst.DBFile), w.buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r := open(t, restored, noCheckpoint)
	if entries, v := readAll(t, r); len(entries) != 5 || v != 5 {
		t.Fatalf("the backup holds %d entries and value %d, want 5 and 5", len(entries), v)
	}
}
