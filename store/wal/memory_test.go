package wal

import (
	"bytes"
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/participantd/participantd/store/vfs"
)

// readSizes is a file system that records the size of every read.
type readSizes struct {
	vfs.FS
	mu    sync.Mutex
	sizes []int
}

type readSizesFile struct {
	vfs.File
	fs *readSizes
}

func (r *readSizes) Open(name string) (vfs.File, error) {
	f, err := r.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return readSizesFile{f, r}, nil
}

func (r *readSizes) OpenRW(name string) (vfs.File, error) {
	f, err := r.FS.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return readSizesFile{f, r}, nil
}

func (f readSizesFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	f.fs.sizes = append(f.fs.sizes, len(p))
	f.fs.mu.Unlock()
	return f.File.ReadAt(p, off)
}

// take returns the sizes recorded since the last call.
func (r *readSizes) take() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sizes
	r.sizes = nil
	return s
}

// A replay reads a segment of the default 64 MiB through a window of
// readChunk bytes, growing it for one record larger than that to that
// record's frame only, and allocates a fraction of the segment: a start's
// memory does not grow with the segment size or the preallocated zeros,
// whose check (lastNonZero) reads them a window at a time too. The last
// record is torn, so the torn-tail path is read the same way.
func TestReplay_ReadsASegmentThroughABoundedWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 64 MiB segment")
	}
	dir := t.TempDir()
	l, _, err := Open(dir, 0, Options{}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	big := &Batch{Appends: []StreamAppend{{Stream: "big", Payloads: [][]byte{bytes.Repeat([]byte{7}, 3*readChunk)}}}}
	var bigFrame, lastOff int
	off := segmentHeaderLen
	for i := range 40 {
		b := testBatch(i)
		if i == 20 {
			b = big
		}
		if _, err := l.Append(b); err != nil {
			t.Fatal(err)
		}
		body, err := appendBody(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		n := int(framedLen(int64(off), len(body)))
		if b == big {
			bigFrame = n
		}
		lastOff = off
		off += n
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := listSegments(osFS(), dir)
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments = %v, %v; want 1", segs, err)
	}
	path := join(dir, segs[0])
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != DefaultSegmentSize {
		t.Fatalf("segment size = %v, %v; want %d", fi, err, DefaultSegmentSize)
	}
	// Tear the last record: its second half never reached the disk.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	mid := (lastOff + off) / 2
	if _, err := f.WriteAt(make([]byte, off-mid), int64(mid)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	fsys := &readSizes{FS: vfs.OS}
	for _, open := range []bool{false, true} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		records := 0
		apply := func(*Batch) error { records++; return nil }
		var info Info
		if open {
			var l *Log
			l, info, err = Open(dir, 0, Options{FS: fsys}, apply)
			if err == nil {
				err = l.Close()
			}
		} else {
			info, err = Replay(dir, 0, Options{FS: fsys}, apply)
		}
		runtime.ReadMemStats(&after)
		if err != nil || records != 39 || !info.Torn {
			t.Fatalf("open=%v: %d records, %+v, %v; want 39 and the last torn", open, records, info, err)
		}
		var beyond []int
		for _, n := range fsys.take() {
			if n > readChunk {
				beyond = append(beyond, n)
			}
		}
		if len(beyond) != 1 || beyond[0] != bigFrame {
			t.Errorf("open=%v: reads larger than the %d-byte window: %v; want one, of the big record's %d-byte frame",
				open, readChunk, beyond, bigFrame)
		}
		// The window, the big record, the batches and what Open adds: a
		// fraction of the segment, which the whole-file read allocated.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > DefaultSegmentSize/4 {
			t.Errorf("open=%v: the replay of a %d-byte segment allocated %d bytes, want at most %d",
				open, DefaultSegmentSize, alloc, DefaultSegmentSize/4)
		}
	}
}

// BenchmarkOpen_AFullSegment opens a log of one 64 MiB segment full of
// 64 KiB records, copied afresh (and synced) for each iteration:
// "replayed" gives every record to apply, so Open writes it back and the
// sync writes it to the disk again (a start after a crash with that much
// uncheckpointed); "checkpointed" opens after the last record, so the
// same segment is read and only cut and synced. The difference is the
// rewrite's cost at start-up.
func BenchmarkOpen_AFullSegment(b *testing.B) {
	src := b.TempDir()
	l, _, err := Open(src, 0, Options{}, func(*Batch) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte{5}, 64<<10)
	var last LSN
	for {
		lsn, err := l.Append(&Batch{Appends: []StreamAppend{{Stream: "s", First: uint64(last), Payloads: [][]byte{payload}}}})
		if err != nil {
			b.Fatal(err)
		}
		last = lsn
		if l.Segments() > 1 {
			break
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	segs, err := listSegments(osFS(), src)
	if err != nil {
		b.Fatal(err)
	}
	seg := segs[0]
	raw, err := os.ReadFile(join(src, seg))
	if err != nil {
		b.Fatal(err)
	}
	// The copy holds records 1 to last-1; last began the next segment.
	for _, c := range []struct {
		name  string
		after LSN
	}{{"replayed", 0}, {"checkpointed", last - 1}} {
		after := c.after
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				f, err := os.Create(join(dir, seg))
				if err == nil {
					_, err = f.Write(raw)
				}
				if err == nil {
					err = f.Sync()
				}
				if err == nil {
					err = f.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				l, _, err := Open(dir, after, Options{}, func(*Batch) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				l.Close()
				os.RemoveAll(dir)
				b.StartTimer()
			}
		})
	}
}
