package wal

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testdata/format1.wal is the golden log written by the code before
// format 2 (main at 8373dd3), goldenBatches appended to a new log of
// goldenSegmentSize; testdata/format2.wal is this code's.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/format2.wal from this code (format1.wal is what an earlier binary wrote: never rewritten)")

// goldenBatches are the records of the golden segments: both record body
// versions, a record of several sectors, and one that starts too near a
// sector's end for a fragment.
func goldenBatches() []*Batch {
	var bs []*Batch
	for i := range 5 {
		bs = append(bs, testBatch(i))
	}
	bs = append(bs, &Batch{Appends: []StreamAppend{{Stream: "s/big", First: 3, Payloads: [][]byte{bytes.Repeat([]byte("golden "), 170)}}}})
	off := int64(segmentHeaderLen)
	for _, b := range bs {
		body, _ := appendBody(nil, b)
		off += framedLen(off, len(body))
	}
	// A record that ends 8 bytes before a sector's end: the next starts
	// at the next sector.
	for n := 0; ; n++ {
		pad := &Batch{Values: []ValueWrite{{Key: "pad", Value: 1}}, Appends: []StreamAppend{{Stream: "s/pad", Payloads: [][]byte{make([]byte, n)}}}}
		body, _ := appendBody(nil, pad)
		if end := off + framedLen(off, len(body)); end%sectorSize == sectorSize-8 {
			bs = append(bs, pad)
			break
		}
	}
	return append(bs, testBatch(5), testBatch(6))
}

const goldenSegmentSize = 4096

// Format 2 is what this code writes, byte for byte: a change to the
// layout shows here, and needs a new format version, not an edit of this
// file.
func TestGolden_Format2IsWhatThisCodeWrites(t *testing.T) {
	dir := t.TempDir()
	writeGolden(t, dir)
	path, offs := recordOffsets(t, dir)
	got := readFile(t, path)
	if len(offs) != len(goldenBatches())+1 {
		t.Fatalf("%d records, want %d", len(offs)-1, len(goldenBatches()))
	}
	padded := false
	for _, off := range offs[1 : len(offs)-1] {
		padded = padded || recordStart(off) != off
	}
	if !padded {
		t.Fatalf("no record of the golden log starts at the next sector (offsets %v)", offs)
	}
	golden := filepath.Join("testdata", "format2.wal")
	if *updateGolden {
		if err := os.WriteFile(golden, got, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the segment written differs from %s", golden)
	}
}

func writeGolden(t *testing.T, dir string) {
	t.Helper()
	l, _, err := Open(dir, 0, Options{SegmentSize: goldenSegmentSize}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range goldenBatches() {
		if _, err := l.Append(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// A log of either format, as the binary that wrote it left it, opens and
// replays; the next record goes to a new segment of format 2, and the
// log of both formats reopens whole.
func TestGolden_EachFormatOpensAndReplays(t *testing.T) {
	for _, name := range []string{"format1.wal", "format2.wal"} {
		raw, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), raw, 0o600); err != nil {
			t.Fatal(err)
		}
		want := goldenBatches()
		for i, b := range want {
			b.LSN = LSN(i + 1)
		}
		got, info, err := replayAll(t, dir, 0)
		if err != nil || info.Torn {
			t.Fatalf("%s: Replay = %+v, %v", name, info, err)
		}
		if diff := cmp.Diff(want, got, cmpBatches); diff != "" {
			t.Fatalf("%s: Replay (-want +got):\n%s", name, diff)
		}
		var n int
		l, _, err := Open(dir, 0, Options{SegmentSize: goldenSegmentSize}, func(*Batch) error { n++; return nil })
		if err != nil || n != len(want) {
			t.Fatalf("%s: Open = %d records, %v", name, n, err)
		}
		next := testBatch(9)
		if _, err := l.Append(next); err != nil {
			t.Fatal(err)
		}
		l.Close()
		got, _, err = replayAll(t, dir, 0)
		if err != nil {
			t.Fatalf("%s: Replay after an append: %v", name, err)
		}
		if diff := cmp.Diff(append(want, next), got, cmpBatches); diff != "" {
			t.Fatalf("%s: Replay after an append (-want +got):\n%s", name, diff)
		}
		segs, err := listSegments(osFS(), dir)
		if err != nil || len(segs) != 2 {
			t.Fatalf("%s: segments %v, %v; want the golden one and a new one", name, segs, err)
		}
		if h := readFile(t, join(dir, segs[1])); h[7] != segmentFormat2 {
			t.Fatalf("%s: the new segment is of format %d", name, h[7])
		}
		if h := readFile(t, join(dir, segs[0])); h[7] != raw[7] {
			t.Fatalf("%s: the golden segment's format changed to %d", name, h[7])
		}
	}
}
