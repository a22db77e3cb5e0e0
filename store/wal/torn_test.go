package wal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store/vfs"
)

// framePayload is a client payload that holds valid records of the LSNs
// the record carrying it gets (lsn) and the next, in both formats, at
// every alignment within a sector, so that some copy starts in each
// sector of the record; the format-2 copies are laid out for offsets
// all over a sector, so that some of their fragments' headers fall on
// the record's own fragment boundaries.
func framePayload(t *testing.T, lsn LSN) []byte {
	t.Helper()
	var p []byte
	for i := range 30 {
		fake := testBatch(i)
		fake.LSN = lsn + LSN(i%2)
		frame, err := appendFrame(nil, fake)
		if err != nil {
			t.Fatal(err)
		}
		p = append(p, bytes.Repeat([]byte{0xee}, 37*i%61)...)
		p = append(p, frame...)
		body, err := appendBody(nil, fake)
		if err != nil {
			t.Fatal(err)
		}
		p = appendRecord(p, int64(53*i%sectorSize), fake.LSN, body)
	}
	return p
}

// writeTornCase writes two records, then a third whose payload holds
// frames, and returns the records, the segment's path and content, and
// where the third record starts and ends, in segment format format.
func writeTornCase(t *testing.T, format byte) (want []*Batch, path string, orig []byte, start, end int64) {
	t.Helper()
	src := t.TempDir()
	l, _, err := Open(src, 0, Options{SegmentSize: 8192}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	want = []*Batch{testBatch(0), testBatch(1), {Appends: []StreamAppend{{Stream: "s/0", First: 9, Payloads: [][]byte{framePayload(t, 3)}}}}}
	for _, b := range want {
		if _, err := l.Append(b); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if format == segmentFormat1 {
		toFormat1(t, src)
	}
	path, offs := recordOffsets(t, src)
	if orig, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	return want, path, orig, offs[2], offs[3]
}

// checkTorn writes torn as the only segment of a new log and checks that
// Replay keeps the two records before the torn one, and with open that
// Open (which scans as Replay does) cuts it.
func checkTorn(t *testing.T, what string, want []*Batch, path string, orig, torn []byte, open bool) {
	t.Helper()
	ffs := faultfs.New()
	dir := "/log"
	err := ffs.MkdirAll(dir)
	var f vfs.File
	if err == nil {
		f, err = ffs.Create(filepath.Join(dir, filepath.Base(path)))
	}
	if err == nil {
		_, err = f.WriteAt(torn, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{SegmentSize: 8192, FS: ffs}
	n := 2
	if bytes.Equal(torn, orig) {
		n = 3 // every byte the tear lost was a zero: the record is whole
	}
	var got []*Batch
	_, err = Replay(dir, 0, opts, func(b *Batch) error {
		got = append(got, b)
		return nil
	})
	if err != nil {
		t.Fatalf("%s: Replay: %v", what, err)
	}
	if diff := cmp.Diff(want[:n], got, cmpBatches); diff != "" {
		t.Fatalf("%s: Replay (-want +got):\n%s", what, diff)
	}
	if !open {
		return
	}
	l, _, err := Open(dir, 0, opts, func(*Batch) error { return nil })
	if err != nil {
		t.Fatalf("%s: Open: %v", what, err)
	}
	l.Close()
}

// A record whose payload holds frames of its own LSN and the next, torn
// by a crash while it was written (never acknowledged), is a torn tail:
// the log cuts it and opens, whatever byte the write stopped at.
func TestOpen_CutsATornRecordWhosePayloadHoldsFramesAtEveryByte(t *testing.T) {
	for _, format := range []byte{segmentFormat1, segmentFormat2} {
		t.Run(fmt.Sprintf("format%d", format), func(t *testing.T) { testCutsATornRecordAtEveryByte(t, format) })
	}
}

func testCutsATornRecordAtEveryByte(t *testing.T, format byte) {
	want, path, orig, start, end := writeTornCase(t, format)
	if end-start < 3*sectorSize {
		t.Fatalf("the record spans %d bytes; want several sectors", end-start)
	}
	for cut := start; cut < end; cut++ {
		torn := append([]byte(nil), orig...)
		clear(torn[cut:end])
		checkTorn(t, "cut at "+itoa(cut), want, path, orig, torn, cut%64 == 0)
	}
}

// The same record, torn as a disk that writes sectors out of order tears
// it: every subset of its sectors kept, the others left zero.
func TestOpen_CutsATornRecordWhosePayloadHoldsFramesAnySectors(t *testing.T) {
	for _, format := range []byte{segmentFormat1, segmentFormat2} {
		t.Run(fmt.Sprintf("format%d", format), func(t *testing.T) { testCutsATornRecordAnySectors(t, format) })
	}
}

func testCutsATornRecordAnySectors(t *testing.T, format byte) {
	want, path, orig, start, end := writeTornCase(t, format)
	first, last := start/sectorSize, (end-1)/sectorSize
	n := int(last - first + 1)
	if n > 14 {
		t.Fatalf("the record spans %d sectors; keep the case small", n)
	}
	for kept := range 1 << n {
		torn := append([]byte(nil), orig...)
		for i := range n {
			if kept&(1<<i) != 0 {
				continue
			}
			lo, hi := max(start, (first+int64(i))*sectorSize), min(end, (first+int64(i)+1)*sectorSize)
			clear(torn[lo:hi])
		}
		checkTorn(t, "sectors kept "+itoa(int64(kept)), want, path, orig, torn, true)
	}
}

func itoa(v int64) string { return LSN(v).String() }
