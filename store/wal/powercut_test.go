package wal

import (
	"bytes"
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
