package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/faultfs"
)

// flipCase is a segment of records that end in the one under test, its
// records and where that one starts and ends.
type flipCase struct {
	name       string
	seg        segment
	raw        []byte
	want       []*Batch
	start, end int64
}

// flipCases writes the logs the flip tests damage: the record under test
// spans several sectors and starts inside the sector the record before it
// ends in; it is the log's last, or the one before a last record of one
// fragment, which is damaged in turn.
func flipCases(t *testing.T, format byte) []flipCase {
	t.Helper()
	big := &Batch{Appends: []StreamAppend{{Stream: "s/big", First: 1, Payloads: [][]byte{bytes.Repeat([]byte("tell "), 250), {}}}}}
	var cases []flipCase
	for _, c := range []struct {
		name  string
		batch []*Batch
		under int
	}{
		{"last record, several sectors", []*Batch{testBatch(0), testBatch(1), big}, 2},
		{"middle record, several sectors", []*Batch{testBatch(0), testBatch(1), big, testBatch(3)}, 2},
		{"last record, one fragment", []*Batch{testBatch(0), testBatch(1), big, testBatch(3)}, 3},
	} {
		dir := t.TempDir()
		l, _, err := Open(dir, 0, Options{SegmentSize: 8192}, func(*Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range c.batch {
			if _, err := l.Append(b); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
		if format == segmentFormat1 {
			toFormat1(t, dir)
		}
		path, offs := recordOffsets(t, dir)
		raw := readFile(t, path)
		if len(offs) != len(c.batch)+1 {
			t.Fatalf("%s: %d records found, want %d", c.name, len(offs)-1, len(c.batch))
		}
		start, end := offs[c.under], offs[c.under+1]
		if c.under == 2 && (start%sectorSize == 0 || end-start < 2*sectorSize) {
			t.Fatalf("%s: the record spans [%d, %d): want it to share its first sector and span several", c.name, start, end)
		}
		cases = append(cases, flipCase{c.name, segment{name: filepath.Base(path), first: 1}, raw, c.batch, start, end})
	}
	return cases
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := osFS().Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, err := b.Size()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	if _, err := b.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return buf
}

// Every bit of every byte of a record, the last of the log or one in the
// middle, flipped in turn: the scan refuses the segment with a
// *CorruptionError naming it and the record's offset, and gives apply
// nothing of the record or after it. A flipped bit is never taken for a
// torn write and cut, in the last record as anywhere else: every
// fragment of a record that was written whole carries its stamp, kind
// and end byte, which one flip cannot turn into what a tear leaves.
// Failed in format 1, which cuts most flips of a last record as torn
// (TestSectors_Format1CutsSomeFlipsOfTheLastRecord).
func TestSectors_AFlippedBitInEveryByteOfARecordIsRefused(t *testing.T) {
	for _, c := range flipCases(t, segmentFormat2) {
		for pos := c.start; pos < c.end; pos++ {
			for bit := range 8 {
				if testing.Short() && bit != int(pos%8) {
					continue // one bit a byte
				}
				bad := bytes.Clone(c.raw)
				bad[pos] ^= 1 << bit
				var got []*Batch
				_, err := scanSegment(c.seg, bufReader(bad, int64(len(bad))), 1, 0, func(b *Batch) error {
					got = append(got, b)
					return nil
				})
				var ce *CorruptionError
				if !errors.As(err, &ce) || ce.Segment != c.seg.name || ce.Offset != c.start {
					t.Fatalf("%s: byte %d ^ %#02x: scan = %v, want a CorruptionError at %s offset %d", c.name, pos, 1<<bit, err, c.seg.name, c.start)
				}
				for _, b := range got {
					if int(b.LSN) > len(c.want) || !cmp.Equal(b.Appends, c.want[b.LSN-1].Appends, cmpBatches) {
						t.Fatalf("%s: byte %d ^ %#02x: applied %+v", c.name, pos, 1<<bit, b)
					}
				}
			}
		}
	}
}

// Open refuses a log whose last record has a flipped bit, in every byte,
// and leaves the segment as it found it: never cut, never served.
func TestSectors_OpenNeverCutsAFlippedLastRecord(t *testing.T) {
	for _, c := range flipCases(t, segmentFormat2) {
		step := int64(1)
		if testing.Short() {
			step = 7
		}
		for pos := c.start; pos < c.end; pos += step {
			bad := bytes.Clone(c.raw)
			bad[pos] ^= 1 << (pos % 8)
			ffs := faultfs.New()
			dir := "/log"
			path := filepath.Join(dir, c.seg.name)
			if err := ffs.MkdirAll(dir); err != nil {
				t.Fatal(err)
			}
			f, err := ffs.Create(path)
			if err == nil {
				_, err = f.WriteAt(bad, 0)
			}
			if err == nil {
				err = f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			served := 0
			l, _, err := Open(dir, 0, Options{SegmentSize: 8192, FS: ffs}, func(b *Batch) error { served++; return nil })
			if !errors.Is(err, ErrCorrupt) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("%s: byte %d: Open = %v after serving %d records, want ErrCorrupt", c.name, pos, err, served)
			}
			g, err := ffs.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			after := make([]byte, len(bad))
			if _, err := g.ReadAt(after, 0); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			n, _ := g.Size()
			g.Close()
			if !bytes.Equal(after, bad) || n != int64(len(bad)) {
				t.Fatalf("%s: byte %d: a refused Open changed the segment", c.name, pos)
			}
			if names, _ := ffs.List(dir); len(names) != 1 {
				t.Fatalf("%s: byte %d: a refused Open left %v", c.name, pos, names)
			}
		}
	}
}

// The flip test's cases in format 1, to show what format 2 changes: a
// flipped bit in the last record is cut there as a torn write.
func TestSectors_Format1CutsSomeFlipsOfTheLastRecord(t *testing.T) {
	cut, flips := 0, 0
	for _, c := range flipCases(t, segmentFormat1) {
		if c.name == "middle record, several sectors" {
			continue
		}
		for pos := c.start; pos < c.end; pos++ {
			flips++
			bad := bytes.Clone(c.raw)
			bad[pos] ^= 0x10
			sc, err := scanSegment(c.seg, bufReader(bad, int64(len(bad))), 1, 0, func(*Batch) error { return nil })
			if err == nil && sc.torn {
				cut++
			}
		}
	}
	if cut == 0 {
		t.Fatal("format 1 refused every flip of a last record; the format-2 test shows nothing")
	}
	t.Logf("format 1 cut %d of %d flips of a last record as torn", cut, flips)
}

// FuzzTornOrDamaged writes a log whose last record has any body, tears
// its write as faultfs does (a prefix, or a subset of its sectors), and
// checks the scan cuts it; and flips one bit of the whole record and
// checks the scan refuses it.
func FuzzTornOrDamaged(f *testing.F) {
	f.Add([]byte("tell"), uint16(3), uint64(5), uint16(0))
	f.Add(bytes.Repeat([]byte{0}, 1500), uint16(700), uint64(0xffff), uint16(1111))
	f.Add(bytes.Repeat([]byte{0x5a, 0xa4}, 900), uint16(1), uint64(1), uint16(7))
	f.Fuzz(func(t *testing.T, payload []byte, cut uint16, kept uint64, flip uint16) {
		if len(payload) > 4000 {
			return
		}
		prev := &Batch{LSN: 1, Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{payload[:len(payload)/3]}}}}
		last := &Batch{LSN: 2, Appends: []StreamAppend{{Stream: "s", First: 1, Payloads: [][]byte{payload}}}}
		raw := formatHeader(1, segmentFormat2)
		for _, b := range []*Batch{prev, last} {
			body, err := appendBody(nil, b)
			if err != nil {
				t.Fatal(err)
			}
			raw = appendRecord(raw, int64(len(raw)), b.LSN, body)
		}
		start := segmentRecords(raw)[1]
		raw = append(raw, make([]byte, 2*sectorSize)...)
		end := int64(len(raw) - 2*sectorSize)
		seg := segment{name: segmentName(1), first: 1}
		scan := func(buf []byte) (int, segmentScan, error) {
			n := 0
			sc, err := scanSegment(seg, bufReader(buf, int64(len(buf))), 1, 0, func(*Batch) error { n++; return nil })
			return n, sc, err
		}
		torn := func(what string, buf []byte) {
			n, sc, err := scan(buf)
			switch {
			case err != nil:
				t.Fatalf("%s: scan = %v, want the record cut", what, err)
			case bytes.Equal(buf, raw):
				if n != 2 {
					t.Fatalf("%s: %d records, want 2", what, n)
				}
			case n != 1 || sc.end != start:
				t.Fatalf("%s: %d records, %+v; want 1 and the tail cut at %d", what, n, sc, start)
			}
		}
		// A prefix.
		at := start + int64(cut)%(end-start)
		buf := bytes.Clone(raw)
		clear(buf[at:end])
		torn(fmt.Sprintf("cut at %d", at), buf)
		// A subset of sectors, the one shared with the record before
		// included, each kept or lost whole.
		buf = bytes.Clone(raw)
		for i, lo := 0, start; lo < end; i++ {
			hi := min(end, sectorEnd(lo))
			if kept&(1<<(i%64)) == 0 {
				clear(buf[lo:hi])
			}
			lo = hi
		}
		torn(fmt.Sprintf("sectors kept %b", kept), buf)
		// One flipped bit of the record, acknowledged whole.
		pos := start + int64(flip/8)%(end-start)
		buf = bytes.Clone(raw)
		buf[pos] ^= 1 << (flip % 8)
		if _, _, err := scan(buf); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d ^ %#02x: scan = %v, want ErrCorrupt", pos, 1<<(flip%8), err)
		}
	})
}

// TestFrameInPlace_IsAppendRecord frames bodies of many lengths at offsets
// all over a sector (those that leave too little room for a fragment
// included) in place, and requires the bytes appendRecord writes: the
// in-place cut never overwrites body bytes it has yet to move.
func TestFrameInPlace_IsAppendRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	lengths := []int{1, 2, 9, 100, 495, 496, 497, 511, 512, 513, 991, 992, 993, 4096, 70_000}
	for range 20 {
		lengths = append(lengths, 1+rng.IntN(200_000))
	}
	for _, n := range lengths {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(rng.Uint32())
		}
		for _, off := range []int64{segmentHeaderLen, 511, 512, 513, 1000, 1024 - fragMin, 1024 - fragMin + 1, 1023, 4096 + 17} {
			want := appendRecord(nil, off, LSN(n), body)
			for _, spare := range []int{0, 64, 1 << 20} {
				buf := append(make([]byte, 0, n+spare), body...)
				if got := frameInPlace(buf, off, LSN(n)); !bytes.Equal(got, want) {
					t.Fatalf("body of %d bytes at offset %d (spare capacity %d): the record framed in place differs from appendRecord's", n, off, spare)
				}
			}
		}
	}
}
