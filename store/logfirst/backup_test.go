package logfirst_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// A backup taken while writers flush holds every write acknowledged
// before it began, whether checkpointed or only logged, and the file
// alone opens as the whole store.
func TestBackup_HoldsEveryAcknowledgedWriteWhileWritesContinue(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts logfirst.Options
	}{
		{"NoCheckpoint", noCheckpoint},
		{"EagerCheckpoint", logfirst.Options{CheckpointInterval: time.Millisecond, CheckpointBytes: 1, SegmentSize: 4096}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, t.TempDir(), tt.opts)
			// A trimmed stream and byte values go in the backup too.
			fill(t, s, 5)
			if err := s.Trim("s", 3); err != nil {
				t.Fatal(err)
			}
			if err := s.PutBytes([]store.Bytes{{Key: "a", Value: []byte("kept")}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}

			const writers, perWriter = 4, 200
			// acked[w] is how many of writer w's appends a Flush answered.
			var acked [writers]atomic.Uint64
			var wg sync.WaitGroup
			// quarter is closed once writer 0 has a quarter of its writes
			// acknowledged: the backup runs while all of them write.
			quarter := make(chan struct{})
			errc := make(chan error, writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					name := fmt.Sprintf("w%d", w)
					for i := range uint64(perWriter) {
						if _, err := s.Append(name, []byte(fmt.Sprintf("%s/%d", name, i)), i); err != nil {
							errc <- err
							return
						}
						if err := s.Flush(); err != nil {
							errc <- err
							return
						}
						acked[w].Store(i + 1)
						if w == 0 && i+1 == perWriter/4 {
							close(quarter)
						}
					}
				}()
			}
			// Back up in the middle of the writes.
			select {
			case <-quarter:
			case err := <-errc:
				t.Fatalf("writer: %v", err)
			}
			var before [writers]uint64
			for w := range writers {
				before[w] = acked[w].Load()
			}
			var buf bytes.Buffer
			var size int64 = -1
			n, err := s.Backup(&buf, func(sz int64) { size = sz })
			if err != nil {
				t.Fatalf("Backup: %v", err)
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatalf("writer: %v", err)
			}
			if n != int64(buf.Len()) || size != n {
				t.Fatalf("Backup = %d bytes, begin told %d, wrote %d", n, size, buf.Len())
			}

			restored := t.TempDir()
			if err := os.WriteFile(filepath.Join(restored, logfirst.DBFile), buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			r := open(t, restored, logfirst.Options{MustExist: true})
			for w := range writers {
				name := fmt.Sprintf("w%d", w)
				got, err := r.ReadFrom(name, 0, 0)
				if err != nil {
					t.Fatalf("ReadFrom(%s): %v", name, err)
				}
				if uint64(len(got)) < before[w] {
					t.Fatalf("%s: backup holds %d entries, %d were acknowledged before it began", name, len(got), before[w])
				}
				for i, e := range got {
					if want := fmt.Sprintf("%s/%d", name, i); e.Seq != uint64(i) || string(e.Payload) != want {
						t.Fatalf("%s: entry %d = %d %q, want %q", name, i, e.Seq, e.Payload, want)
					}
				}
			}
			if first, err := r.First("s"); err != nil || first != 3 {
				t.Fatalf("First(s) in the backup = %d, %v; want 3", first, err)
			}
			if _, err := r.ReadFrom("s", 0, 0); !errors.Is(err, store.ErrCompacted) {
				t.Fatalf("ReadFrom(s, 0) in the backup = %v, want ErrCompacted", err)
			}
			if v, err := r.GetBytes("a"); err != nil || string(v) != "kept" {
				t.Fatalf("GetBytes(a) in the backup = %q, %v", v, err)
			}
			if v, err := r.ReadValue("k"); err != nil || v != 5 {
				t.Fatalf("ReadValue(k) in the backup = %d, %v; want 5", v, err)
			}
			// The restored store takes new writes after the backup's LSN.
			if _, err := r.Append("s", []byte("new"), 5); err != nil {
				t.Fatal(err)
			}
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBackup_RefusedOnAReadOnlyOrClosedStore(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Backup(&bytes.Buffer{}, nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Backup after Close = %v, want ErrClosed", err)
	}
	ro, err := logfirst.OpenReadOnly(dir, noCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.Backup(&bytes.Buffer{}, nil); !errors.Is(err, logfirst.ErrReadOnly) {
		t.Fatalf("Backup of a read-only store = %v, want ErrReadOnly", err)
	}
}

// A Backup racing Close either completes or is refused with ErrClosed; it
// never runs a checkpoint on closed files, which would leave a sticky
// error for Close to return.
func TestBackup_RacingCloseNeverFailsTheStore(t *testing.T) {
	for i := range 20 {
		s, err := logfirst.Open(t.TempDir(), noCheckpoint)
		if err != nil {
			t.Fatal(err)
		}
		fill(t, s, 3)
		errc := make(chan error, 1)
		go func() {
			_, err := s.Backup(io.Discard, nil)
			errc <- err
		}()
		if err := s.Close(); err != nil {
			t.Fatalf("run %d: Close = %v", i, err)
		}
		if err := <-errc; err != nil && !errors.Is(err, store.ErrClosed) {
			t.Fatalf("run %d: Backup = %v, want nil or ErrClosed", i, err)
		}
	}
}
