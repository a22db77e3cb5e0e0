package wal

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
)

// powerCutWorkload opens the log in dir on ffs and appends n records
// whose payloads hold valid frames of the record's own LSN and the next,
// as a client's payload may. It returns the records acknowledged (Append
// returned nil): none when the cut failed Open itself.
func powerCutWorkload(t *testing.T, ffs *faultfs.FS, dir string, n int) []*Batch {
	t.Helper()
	l, _, err := Open(dir, 0, Options{SegmentSize: 16 << 10, FS: ffs}, func(*Batch) error { return nil })
	if err != nil {
		if _, cut := ffs.CutOp(); !cut {
			t.Fatalf("Open without a power cut: %v", err)
		}
		return nil
	}
	defer l.Close()
	var acked []*Batch
	for i := range n {
		b := &Batch{Appends: []StreamAppend{{Stream: "s", First: uint64(i), Payloads: [][]byte{framePayload(t, l.Next())}}}}
		if _, err := l.Append(b); err != nil {
			if _, cut := ffs.CutOp(); !cut {
				t.Fatalf("Append without a power cut: %v", err)
			}
			break
		}
		acked = append(acked, b)
	}
	return acked
}

// TestPowerCut_PayloadsHoldingFrames cuts the power at every file-system
// call of a log whose records carry payloads holding valid frames of
// their own LSN and the next, several times over, with faultfs's strict
// model (a new directory durable only once its parent is synced; unsynced
// writes torn at a byte or kept and lost per sector, seeded), every other
// round journaled (unsynced creates and removes kept in order, any
// prefix). After each
// cut the log must open, and hold every acknowledged record in order:
// a torn record whose payload looks like a later record is a torn tail,
// not corruption, and a log directory is never lost.
func TestPowerCut_PayloadsHoldingFrames(t *testing.T) {
	const n, dir = 6, "/data/wal"
	clean := faultfs.New()
	powerCutWorkload(t, clean, dir, n)
	total := clean.Ops()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 15))
	for round := range 25 {
		for at := range total + 2 {
			ffs := faultfs.New()
			// Every other round, creates and removes may reach the disk
			// without a directory sync, in order (a journaling file system).
			ffs.SetJournaled(round%2 == 1)
			ffs.SetRule(faultfs.CutAt(at))
			acked := powerCutWorkload(t, ffs, dir, n)
			op, _ := ffs.CutOp()
			if err := ffs.Crash(rng); err != nil {
				t.Fatal(err)
			}
			var got []*Batch
			l, _, err := Open(dir, 0, Options{SegmentSize: 16 << 10, FS: ffs}, func(b *Batch) error {
				got = append(got, b)
				return nil
			})
			if err != nil {
				t.Fatalf("seed %d round %d, cut at %v: Open after the power cut: %v", seed, round, op, err)
			}
			l.Close()
			if len(got) < len(acked) || len(got) > len(acked)+1 {
				t.Fatalf("seed %d round %d, cut at %v: %d records after the power cut, %d acknowledged", seed, round, op, len(got), len(acked))
			}
			for i, b := range acked {
				if r := got[i]; r.LSN != LSN(i+1) || len(r.Appends) != 1 || !bytes.Equal(r.Appends[0].Payloads[0], b.Appends[0].Payloads[0]) {
					t.Fatalf("seed %d round %d, cut at %v: record %d replayed as LSN %v, not as acknowledged", seed, round, op, i+1, r.LSN)
				}
			}
		}
	}
}

// dirSyncWorkload is a log's life over ffs, as the log-first store leads
// it: n records of a few sectors each in segments of two, a checkpoint
// (kept in *ck, as bbolt would keep it) after every third, and the
// segments it covers removed. It stops at the first failed Append, as a
// store fails; a RemoveBelow whose directory sync failed fails the log,
// and the next Append stops it. It returns the payloads acknowledged after *ck, in order,
// keyed by LSN.
func dirSyncWorkload(ffs *faultfs.FS, dir string, ck *LSN, n int, acked map[LSN]byte) error {
	opts := Options{SegmentSize: 8 << 10, FS: ffs}
	l, _, err := Open(dir, *ck, opts, func(b *Batch) error {
		acked[b.LSN] = b.Appends[0].Payloads[0][0]
		return nil
	})
	if err != nil {
		return err
	}
	defer l.Close()
	// The replay went into bbolt: the checkpoint is the last record.
	*ck = l.Next() - 1
	for lsn := range acked {
		if lsn <= *ck {
			delete(acked, lsn)
		}
	}
	_ = l.RemoveBelow(*ck)
	for i := range n {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 3000)
		lsn, err := l.Append(&Batch{Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{p}}}})
		if err != nil {
			return err
		}
		acked[lsn] = p[0]
		if i%3 == 2 {
			*ck = lsn
			for x := range acked {
				if x <= *ck {
					delete(acked, x)
				}
			}
			_ = l.RemoveBelow(*ck)
		}
	}
	return nil
}

// TestPowerCut_FailedDirSync fails, the Linux way, every sync of the
// log's directory in a log's life in turn (faultfs.FailSync: the
// directory's creates and removes marked clean unwritten, later syncs
// succeeding without them until the directory changes again): a
// segment's creation, a removal, a start's. The process goes on or stops as the log-first store does;
// then a restart without a reboot replays from the page cache and
// acknowledges more; then the power is cut. The log must open and hold
// every record acknowledged after the checkpoint, before the failure and
// after the restart.
func TestPowerCut_FailedDirSync(t *testing.T) {
	const dir, n = "/data/wal", 10
	clean := faultfs.New()
	var ck LSN
	if err := dirSyncWorkload(clean, dir, &ck, n, map[LSN]byte{}); err != nil {
		t.Fatal(err)
	}
	total := clean.Ops()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 16))
	failed := 0
	for at := range total {
		ffs := faultfs.New()
		ffs.SetJournaled(at%2 == 1)
		var failedOp faultfs.Op
		done := false
		// The data directory is the store's, which syncs it (see package
		// logfirst): the log's own directory's syncs fail here.
		ffs.SetRule(func(op faultfs.Op) faultfs.Action {
			if done || op.Index < at || op.Kind != faultfs.OpSyncDir || op.Path != dir {
				return faultfs.None
			}
			done, failedOp = true, op
			return faultfs.FailSync
		})
		var ck LSN
		acked := map[LSN]byte{}
		err := dirSyncWorkload(ffs, dir, &ck, n, acked)
		if !done {
			break // past the last directory sync
		}
		failed++
		if err != nil && !errors.Is(err, faultfs.ErrInjected) {
			t.Fatalf("seed %d, failed %v: %v", seed, failedOp, err)
		}
		ffs.SetRule(nil)
		// The restart without a reboot, one record acknowledged in the
		// segment it starts (no later change to the directory), then
		// the power cut.
		if err := dirSyncWorkload(ffs, dir, &ck, 1, acked); err != nil {
			t.Fatalf("seed %d, failed %v: restart: %v", seed, failedOp, err)
		}
		if err := ffs.Crash(rng); err != nil {
			t.Fatal(err)
		}
		got := map[LSN]byte{}
		l, _, err := Open(dir, ck, Options{SegmentSize: 8 << 10, FS: ffs}, func(b *Batch) error {
			got[b.LSN] = b.Appends[0].Payloads[0][0]
			return nil
		})
		if err != nil {
			t.Fatalf("seed %d, failed %v: Open after the power cut: %v", seed, failedOp, err)
		}
		l.Close()
		for lsn, p := range acked {
			if got[lsn] != p {
				t.Fatalf("seed %d, failed %v: record %v acknowledged after checkpoint %v is %q after the power cut, want %q (%d replayed)",
					seed, failedOp, lsn, ck, got[lsn], p, len(got))
			}
		}
	}
	if failed < 5 {
		t.Fatalf("%d runs met a failed directory sync; want more", failed)
	}
	t.Logf("seed %d: a failed directory sync at each of %d", seed, failed)
}
