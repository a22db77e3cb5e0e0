package logfirst_test

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/wal"
)

// A start on a disk without room for a new segment and the bbolt file's
// next growth is refused before it writes, saying what it needs and what
// it has.
func TestOpen_RefusesADiskWithoutRoomSayingWhatItNeeds(t *testing.T) {
	ffs := faultfs.New()
	ffs.SetCapacity(100 << 10)
	dir := t.TempDir()
	opts := noCheckpoint
	opts.FS, opts.SegmentSize = ffs, 1<<20
	_, err := logfirst.Open(dir, opts)
	if !errors.Is(err, logfirst.ErrNoSpace) {
		t.Fatalf("Open on 100 KiB with 1 MiB segments = %v, want ErrNoSpace", err)
	}
	for _, want := range []string{"bytes available", "start-up needs", "segment size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open's refusal %q does not say %q", err, want)
		}
	}
	if has, err := wal.HasSegments(filepath.Join(dir, logfirst.WALDir), wal.Options{FS: ffs}); has || err != nil {
		t.Errorf("the refused start left a segment (%v, %v)", has, err)
	}
	opts.SegmentSize = 32 << 10
	s := open(t, dir, opts)
	fill(t, s, 3)
}

// A disk that fills while the store serves fails the store (ENOSPC when
// the log needs a new segment); after the power cut, a start on the
// still-full disk is refused ErrNoSpace, and once there is room every
// acknowledged batch is there.
func TestFullDisk_LosesNothingAcknowledged(t *testing.T) {
	ffs := faultfs.New()
	dir := t.TempDir()
	opts := noCheckpoint
	opts.FS, opts.SegmentSize = ffs, 64<<10
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	// Room for what the store holds now, and less than a second segment.
	ffs.SetCapacity(1 << 30)
	avail, err := ffs.Available(dir)
	if err != nil {
		t.Fatal(err)
	}
	ffs.SetCapacity(1<<30 - avail + 8<<10)
	payload := make([]byte, 1<<10)
	acked := 0
	for i := 0; ; i++ {
		if _, err := s.Append("s", payload, uint64(i)); err != nil {
			t.Fatalf("Append(%d): %v", i, err)
		}
		if err := s.Flush(); err != nil {
			if !errors.Is(err, store.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Flush on a full disk = %v, want store.ErrFailed wrapping ENOSPC", err)
			}
			break
		}
		acked++
		if i > 1000 {
			t.Fatal("the disk never filled")
		}
	}
	logfirst.Abandon(s)
	if err := ffs.Crash(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := logfirst.Open(dir, opts); !errors.Is(err, logfirst.ErrNoSpace) {
		t.Fatalf("Open on the full disk = %v, want ErrNoSpace", err)
	}
	ffs.SetCapacity(0)
	s = open(t, dir, opts)
	if n, err := s.Len("s"); err != nil || n != uint64(acked) {
		t.Fatalf("after room was made: %d entries, %v; want the %d acknowledged", n, err, acked)
	}
}
