package wal

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store/vfs"
)

// hookFS is a vfs.FS that calls afterCreate once a Create succeeded: the
// instant another goroutine of the process may run a whole call of its
// own, before the creator syncs the directory.
type hookFS struct {
	vfs.FS
	afterCreate func(name string)
}

func (h *hookFS) Create(name string) (vfs.File, error) {
	f, err := h.FS.Create(name)
	if err == nil && h.afterCreate != nil {
		h.afterCreate(name)
	}
	return f, err
}

// A checkpoint's RemoveBelow runs on its own goroutine while Append
// rotates: it can land between the creation of the new segment and the
// rotation's directory sync. When its directory sync fails the Linux way
// (the directory's creates and removes, the new segment's included,
// marked clean unwritten), the rotation's sync that follows succeeds
// without writing them. No record may be acknowledged in that segment: a
// power cut would lose it, with every record acknowledged in it.
func TestPowerCut_FailedDirSyncOfRemoveBelowDuringARotation(t *testing.T) {
	const dir = "/data/wal"
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 31))
	for round := range 20 {
		ffs := faultfs.New()
		ffs.SetJournaled(round%2 == 1)
		hfs := &hookFS{FS: ffs}
		// Two records of a few sectors per segment.
		opts := Options{SegmentSize: 8 << 10, FS: hfs}
		l, _, err := Open(dir, 0, opts, func(*Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		payload := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 3000) }
		acked := map[LSN]byte{}
		for i := range 4 {
			lsn, err := l.Append(&Batch{Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{payload(i)}}}})
			if err != nil {
				t.Fatal(err)
			}
			acked[lsn] = byte('a' + i)
		}
		if n := l.Segments(); n != 2 {
			t.Fatalf("%d segments after 4 records, want 2", n)
		}
		// A checkpoint at 2 covers the first segment; its removal runs
		// when the rotation for record 5 has created the third, and its
		// directory sync fails.
		const ck = 2
		var removeErr error
		hfs.afterCreate = func(name string) {
			hfs.afterCreate = nil
			if filepath.Dir(name) != dir {
				return
			}
			failed := false
			ffs.SetRule(func(op faultfs.Op) faultfs.Action {
				if !failed && op.Kind == faultfs.OpSyncDir && op.Path == dir {
					failed = true
					return faultfs.FailSync
				}
				return faultfs.None
			})
			removeErr = l.RemoveBelow(ck)
			ffs.SetRule(nil)
		}
		// Records 5 and 6 fill the new segment: a later rotation's sync,
		// after a change of the directory, would write the entry whole.
		var refused error
		for i := 4; i < 6; i++ {
			lsn, err := l.Append(&Batch{Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{payload(i)}}}})
			if err != nil {
				refused = err
				break
			}
			acked[lsn] = byte('a' + i)
		}
		if hfs.afterCreate != nil {
			t.Fatal("the appends never rotated")
		}
		l.Close()
		if err := ffs.Crash(rng); err != nil {
			t.Fatal(err)
		}
		got := map[LSN]byte{}
		l, _, err = Open(dir, ck, Options{SegmentSize: 8 << 10, FS: ffs}, func(b *Batch) error {
			got[b.LSN] = b.Appends[0].Payloads[0][0]
			return nil
		})
		if err != nil {
			t.Fatalf("seed %d round %d: Open after the power cut: %v", seed, round, err)
		}
		l.Close()
		for lsn, p := range acked {
			if lsn > ck && got[lsn] != p {
				t.Fatalf("seed %d round %d: record %v acknowledged after checkpoint %v is %q after the power cut, want %q (%d replayed)",
					seed, round, lsn, LSN(ck), got[lsn], p, len(got))
			}
		}
		if !errors.Is(removeErr, faultfs.ErrInjected) || !errors.Is(removeErr, ErrDirSync) {
			t.Fatalf("RemoveBelow whose directory sync fails = %v, want ErrDirSync and ErrInjected", removeErr)
		}
		// The log failed at the failed sync: the rotation acknowledged
		// nothing in the segment whose entry it may have lost.
		if !errors.Is(refused, ErrDirSync) || !errors.Is(refused, faultfs.ErrInjected) {
			t.Fatalf("Append after the failed directory sync = %v, want ErrDirSync wrapping the sync's error", refused)
		}
		if len(acked) != 4 {
			t.Fatalf("%d records acknowledged, want the 4 before the failed directory sync", len(acked))
		}
	}
}

// A RemoveBelow whose directory sync fails fails the log: Append and
// RemoveBelow return ErrDirSync from then on, though the active segment's
// entry was durable before, since the directory's state is unknown.
func TestRemoveBelow_AFailedDirSyncIsSticky(t *testing.T) {
	const dir = "/data/wal"
	ffs := faultfs.New()
	l, _, err := Open(dir, 0, Options{SegmentSize: 256, FS: ffs}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 10 {
		if _, err := l.Append(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		if op.Kind == faultfs.OpSyncDir {
			return faultfs.FailSync
		}
		return faultfs.None
	})
	if err := l.RemoveBelow(8); !errors.Is(err, ErrDirSync) {
		t.Fatalf("RemoveBelow whose directory sync fails = %v, want ErrDirSync", err)
	}
	ffs.SetRule(nil)
	if _, err := l.Append(testBatch(10)); !errors.Is(err, ErrDirSync) {
		t.Fatalf("Append after a failed directory sync = %v, want ErrDirSync", err)
	}
	before := ffs.Ops()
	if err := l.RemoveBelow(9); !errors.Is(err, ErrDirSync) {
		t.Fatalf("RemoveBelow after a failed directory sync = %v, want ErrDirSync", err)
	}
	if ffs.Ops() != before {
		t.Fatalf("the failed log made %d file-system calls after its directory sync failed", ffs.Ops()-before)
	}
}
