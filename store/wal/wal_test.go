package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/store/vfs"
)

func testBatch(i int) *Batch {
	b := &Batch{
		Appends: []StreamAppend{
			{Stream: fmt.Sprintf("s/%d", i%3), First: uint64(i), Payloads: [][]byte{[]byte(fmt.Sprintf("p%d", i)), {}}},
		},
	}
	if i%2 == 0 {
		b.Values = []ValueWrite{{Key: fmt.Sprintf("k%d", i), Value: uint64(i)}, {Key: "zero", Value: 0}}
	}
	if i%3 == 1 {
		// A version 2 record: trims and byte values, a deletion included.
		b.Trims = []StreamTrim{{Stream: fmt.Sprintf("s/%d", (i+1)%3), Below: uint64(i / 2)}}
		b.Bytes = []BytesWrite{{Key: fmt.Sprintf("b%d", i), Value: []byte(fmt.Sprintf("v%d", i))}, {Key: "gone"}}
	}
	return b
}

// writeLog appends n test batches to a new log in dir and closes it.
func writeLog(t *testing.T, dir string, n int, opts Options) []*Batch {
	t.Helper()
	l, _, err := Open(dir, 0, opts, func(*Batch) error { return nil })
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	var want []*Batch
	for i := range n {
		b := testBatch(i)
		lsn, err := l.Append(b)
		if err != nil {
			t.Fatalf("Append(%d): %v", i, err)
		}
		if lsn != LSN(i+1) {
			t.Fatalf("Append(%d) = LSN %v, want %v", i, lsn, i+1)
		}
		want = append(want, b)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return want
}

func replayAll(t *testing.T, dir string, after LSN) ([]*Batch, Info, error) {
	t.Helper()
	var got []*Batch
	info, err := Replay(dir, after, Options{}, func(b *Batch) error {
		got = append(got, b)
		return nil
	})
	return got, info, err
}

var cmpBatches = cmpopts.EquateEmpty()

func TestLog_ReplayReturnsEveryRecordAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	want := writeLog(t, dir, 50, Options{SegmentSize: 256})
	got, info, err := replayAll(t, dir, 0)
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if diff := cmp.Diff(want, got, cmpBatches); diff != "" {
		t.Fatalf("Replay (-want +got):\n%s", diff)
	}
	if info.Segments < 10 || info.Last != 50 || info.Torn {
		t.Fatalf("Replay info = %+v, want many segments, last 50, not torn", info)
	}
	// Replay after a checkpoint gives only the later records.
	got, _, err = replayAll(t, dir, 40)
	if err != nil || len(got) != 10 || got[0].LSN != 41 {
		t.Fatalf("Replay after 40 = %d records from %v, %v; want 10 from 41", len(got), got[0].LSN, err)
	}
}

func TestLog_ARecordLargerThanASegmentGetsItsOwn(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, 0, Options{SegmentSize: 64}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	big := &Batch{Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{make([]byte, 1000)}}}}
	for i := range 3 {
		if _, err := l.Append(big); err != nil {
			t.Fatalf("Append(%d): %v", i, err)
		}
	}
	l.Close()
	got, info, err := replayAll(t, dir, 0)
	if err != nil || len(got) != 3 || info.Segments != 3 {
		t.Fatalf("Replay = %d records in %d segments, %v; want 3 in 3", len(got), info.Segments, err)
	}
}

func TestLog_ReopenContinuesLSNs(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 3, Options{})
	var n int
	l, info, err := Open(dir, 0, Options{}, func(*Batch) error { n++; return nil })
	if err != nil || n != 3 || info.Last != 3 {
		t.Fatalf("Open = %d records, last %v, %v; want 3, 3", n, info.Last, err)
	}
	if lsn, err := l.Append(testBatch(9)); err != nil || lsn != 4 {
		t.Fatalf("Append = %v, %v; want 4", lsn, err)
	}
	l.Close()
	// A checkpoint ahead of the log moves the next LSN past it.
	l, _, err = Open(dir, 10, Options{}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatalf("Open after 10: %v", err)
	}
	if lsn, err := l.Append(testBatch(9)); err != nil || lsn != 11 {
		t.Fatalf("Append = %v, %v; want 11", lsn, err)
	}
	l.Close()
}

func TestLog_RemoveBelowKeepsWhatTheCheckpointDoesNotCover(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, 0, Options{SegmentSize: 128}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := l.Append(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := l.Segments()
	if err := l.RemoveBelow(10); err != nil {
		t.Fatalf("RemoveBelow: %v", err)
	}
	if l.Segments() >= before {
		t.Fatalf("RemoveBelow(10) kept %d of %d segments", l.Segments(), before)
	}
	l.Close()
	got, _, err := replayAll(t, dir, 10)
	if err != nil || len(got) != 10 {
		t.Fatalf("Replay after 10 = %d records, %v; want 10", len(got), err)
	}
	// Records above the checkpoint were not removed; without it, the log
	// starts after a gap.
	if _, _, err := replayAll(t, dir, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Replay after 0 of a trimmed log = %v, want ErrCorrupt (a gap)", err)
	}
}

// recordOffsets returns the path of the only segment of dir, the offsets
// of its records and the end of the last.
func recordOffsets(t *testing.T, dir string) (string, []int64) {
	t.Helper()
	segs, err := listSegments(osFS(), dir)
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments = %v, %v; want 1", segs, err)
	}
	path := join(dir, segs[0])
	buf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, segmentRecords(buf)
}

// writeLogFormat is writeLog, the log then rewritten in segment format
// 1 when format is 1.
func writeLogFormat(t *testing.T, dir string, n int, opts Options, format byte) []*Batch {
	t.Helper()
	want := writeLog(t, dir, n, opts)
	if format == segmentFormat1 {
		toFormat1(t, dir)
	}
	return want
}

// A record cut at any byte is a torn tail, in either format. Junk after
// the cut (no model of faultfs leaves it) is cut as torn in format 1,
// which cannot tell it from a sector of the record written out of order,
// and refused in format 2, whose torn writes leave zeros or the record's
// own fragments, stamped.
func TestOpen_CutsATornTailAtEveryByteOffset(t *testing.T) {
	for _, format := range []byte{segmentFormat1, segmentFormat2} {
		t.Run(fmt.Sprintf("format%d", format), func(t *testing.T) { testCutsATornTailAtEveryByteOffset(t, format) })
	}
}

func testCutsATornTailAtEveryByteOffset(t *testing.T, format byte) {
	src := t.TempDir()
	want := writeLogFormat(t, src, 3, Options{SegmentSize: 4096}, format)
	path, offs := recordOffsets(t, src)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start, end := offs[2], offs[3]
	for _, junk := range []byte{0, 0xa5} {
		for cut := start; cut < end; cut++ {
			dir := t.TempDir()
			torn := append([]byte(nil), orig...)
			// The record's first cut bytes made it; the rest are zeros (or
			// junk, as a sector written out of order).
			for i := cut; i < end; i++ {
				torn[i] = junk
			}
			if string(torn) == string(orig) {
				continue // the record's last bytes were the junk: not torn
			}
			seg := filepath.Join(dir, filepath.Base(path))
			if err := os.WriteFile(seg, torn, 0o600); err != nil {
				t.Fatal(err)
			}
			got, info, err := replayAll(t, dir, 0)
			if junk != 0 && format == segmentFormat2 {
				var ce *CorruptionError
				if !errors.As(err, &ce) || ce.Offset != start {
					t.Fatalf("cut at %d, junk %#x: Replay = %v, want a CorruptionError at %d", cut, junk, err, start)
				}
				if _, _, err := Open(dir, 0, Options{SegmentSize: 4096}, func(*Batch) error { return nil }); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("cut at %d, junk %#x: Open = %v, want ErrCorrupt", cut, junk, err)
				}
				if after, _ := os.ReadFile(seg); string(after) != string(torn) {
					t.Fatalf("cut at %d: a refused Open changed the segment", cut)
				}
				continue
			}
			if err != nil {
				t.Fatalf("cut at %d, junk %#x: Replay: %v", cut, junk, err)
			}
			if diff := cmp.Diff(want[:2], got, cmpBatches); diff != "" {
				t.Fatalf("cut at %d: Replay (-want +got):\n%s", cut, diff)
			}
			if wantTorn := cut > start || junk != 0; info.Torn != wantTorn || (wantTorn && info.TornOffset != start) {
				t.Fatalf("cut at %d, junk %#x: info = %+v, want torn=%v at %d", cut, junk, info, wantTorn, start)
			}
			if after, _ := os.ReadFile(seg); string(after) != string(torn) {
				t.Fatalf("cut at %d: Replay changed the segment", cut)
			}
			// Open cuts the tail off; the record's LSN is written anew and
			// the log reads back without complaint.
			l, _, err := Open(dir, 0, Options{SegmentSize: 4096}, func(*Batch) error { return nil })
			if err != nil {
				t.Fatalf("cut at %d: Open: %v", cut, err)
			}
			if lsn, err := l.Append(testBatch(7)); err != nil || lsn != 3 {
				t.Fatalf("cut at %d: Append = %v, %v; want LSN 3", cut, lsn, err)
			}
			l.Close()
			got, info, err = replayAll(t, dir, 0)
			if err != nil || len(got) != 3 || info.Torn {
				t.Fatalf("cut at %d: Replay after Open = %d records, %+v, %v; want 3, not torn", cut, len(got), info, err)
			}
		}
	}
}

func TestReplay_RefusesAFlippedBitInAMiddleRecord(t *testing.T) {
	for _, format := range []byte{segmentFormat1, segmentFormat2} {
		t.Run(fmt.Sprintf("format%d", format), func(t *testing.T) { testRefusesAFlippedBitInAMiddleRecord(t, format) })
	}
}

func testRefusesAFlippedBitInAMiddleRecord(t *testing.T, format byte) {
	src := t.TempDir()
	writeLogFormat(t, src, 3, Options{SegmentSize: 4096}, format)
	path, offs := recordOffsets(t, src)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for pos := offs[1]; pos < offs[2]; pos++ {
		for _, bit := range []byte{0x01, 0x80} {
			dir := t.TempDir()
			bad := append([]byte(nil), orig...)
			bad[pos] ^= bit
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), bad, 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := replayAll(t, dir, 0)
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Segment != filepath.Base(path) || ce.Offset != offs[1] {
				t.Fatalf("bit %#x at %d: Replay = %v, want a CorruptionError at %s offset %d", bit, pos, err, filepath.Base(path), offs[1])
			}
			if _, _, err := Open(dir, 0, Options{}, func(*Batch) error { return nil }); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("bit %#x at %d: Open = %v, want ErrCorrupt", bit, pos, err)
			}
		}
	}
}

func TestReplay_RefusesABadHeaderBeforeValidRecords(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 3, Options{SegmentSize: 4096})
	path, _ := recordOffsets(t, dir)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[2] ^= 0xff // the magic
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := replayAll(t, dir, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Replay of a last segment with a bad header and valid records = %v, want ErrCorrupt", err)
	}
	// A damaged header with nothing valid after it is still damage: a
	// torn write of a header leaves only a prefix of it, zeros after.
	if err := os.WriteFile(path, raw[:segmentHeaderLen], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := replayAll(t, dir, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Replay of a bare damaged header = %v, want ErrCorrupt", err)
	}
	// A prefix of the header, zeros after, is an unfinished creation.
	for _, n := range []int{0, 3, 7, 8} { // past 8 the header of LSN 1 is whole
		half := make([]byte, 64)
		copy(half, segmentHeader(1)[:n])
		if err := os.WriteFile(path, half, 0o600); err != nil {
			t.Fatal(err)
		}
		if got, info, err := replayAll(t, dir, 0); err != nil || len(got) != 0 || !info.Torn {
			t.Fatalf("Replay of a header torn after %d bytes = %d records, %+v, %v; want none, torn", n, len(got), info, err)
		}
	}
}

func TestReplay_RefusesAMissingSegment(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 30, Options{SegmentSize: 128})
	segs, err := listSegments(osFS(), dir)
	if err != nil || len(segs) < 3 {
		t.Fatalf("segments = %d, %v; want at least 3", len(segs), err)
	}
	if err := os.Remove(join(dir, segs[1])); err != nil {
		t.Fatal(err)
	}
	_, _, err = replayAll(t, dir, 0)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Segment != segs[2].name {
		t.Fatalf("Replay = %v, want a CorruptionError naming %s", err, segs[2].name)
	}
}

func TestAppendFrame_WritesVersion1UnlessTheBatchTrimsOrSetsBytes(t *testing.T) {
	for i, want := range []byte{recordVersion1, recordVersion2, recordVersion1} {
		frame, err := appendFrame(nil, testBatch(i))
		if err != nil {
			t.Fatal(err)
		}
		if got := frame[frameHeaderLen]; got != want {
			t.Errorf("batch %d: version %d, want %d", i, got, want)
		}
		b, err := decodeBody(frame[frameHeaderLen:])
		if err != nil {
			t.Fatalf("batch %d: decode: %v", i, err)
		}
		if diff := cmp.Diff(testBatch(i), b, cmpBatches); diff != "" {
			t.Errorf("batch %d: round trip (-want +got):\n%s", i, diff)
		}
	}
	body := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if _, err := decodeBody(body); err == nil {
		t.Error("decodeBody accepted an unknown version")
	}
}

func FuzzDecodeBody(f *testing.F) {
	for i := range 4 {
		frame, err := appendFrame(nil, testBatch(i))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame[frameHeaderLen:])
	}
	f.Add([]byte{recordVersion1})
	f.Add([]byte{recordVersion2})
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := decodeBody(body)
		if err != nil {
			return
		}
		frame, err := appendFrame(nil, b)
		if err != nil {
			t.Fatalf("re-encoding a decoded body: %v", err)
		}
		again, err := decodeBody(frame[frameHeaderLen:])
		if err != nil {
			t.Fatalf("decoding a re-encoded body: %v", err)
		}
		if diff := cmp.Diff(b, again, cmpBatches); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

// failingFS fails every file Sync once fail is set.
type failingFS struct {
	vfs.FS
	fail *bool
}

type failingFile struct {
	vfs.File
	fail *bool
}

func (f failingFS) Create(name string) (vfs.File, error) {
	file, err := f.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return failingFile{file, f.fail}, nil
}

var errInjected = errors.New("injected")

func (f failingFile) Sync() error {
	if *f.fail {
		return errInjected
	}
	return f.File.Sync()
}

func TestLog_AFailedSyncIsSticky(t *testing.T) {
	fail := false
	opts := Options{FS: failingFS{vfs.OS, &fail}}
	l, _, err := Open(t.TempDir(), 0, opts, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Append(testBatch(0)); err != nil {
		t.Fatalf("Append: %v", err)
	}
	fail = true
	if _, err := l.Append(testBatch(1)); !errors.Is(err, errInjected) {
		t.Fatalf("Append with a failing sync = %v, want the injected error", err)
	}
	fail = false
	if _, err := l.Append(testBatch(2)); !errors.Is(err, errInjected) {
		t.Fatalf("Append after a failed sync = %v, want the sticky injected error", err)
	}
}

// FuzzScanSegment feeds arbitrary bytes after a valid header of either
// format: the scan never panics, and whatever it accepts is a run of
// valid records.
func FuzzScanSegment(f *testing.F) {
	var seed1, seed2 []byte
	off := int64(segmentHeaderLen)
	for i := range 3 {
		b := testBatch(i)
		b.LSN = LSN(i + 1)
		frame, err := appendFrame(nil, b)
		if err != nil {
			f.Fatal(err)
		}
		seed1 = append(seed1, frame...)
		body, err := appendBody(nil, b)
		if err != nil {
			f.Fatal(err)
		}
		n := len(seed2)
		seed2 = appendRecord(seed2, off, b.LSN, body)
		off += int64(len(seed2) - n)
	}
	for _, seed := range []struct {
		format1 bool
		body    []byte
	}{{true, seed1}, {false, seed2}} {
		f.Add(seed.format1, seed.body)
		f.Add(seed.format1, seed.body[:len(seed.body)-3])
		f.Add(seed.format1, append(append([]byte(nil), seed.body...), make([]byte, 64)...))
	}
	f.Fuzz(func(t *testing.T, format1 bool, body []byte) {
		seg := segment{name: segmentName(1), first: 1}
		format := byte(segmentFormat2)
		if format1 {
			format = segmentFormat1
		}
		buf := append(formatHeader(1, format), body...)
		var got []*Batch
		sc, err := scanSegment(seg, bufReader(buf, readChunk), 1, 0, func(b *Batch) error {
			got = append(got, b)
			return nil
		})
		// A window smaller than a record finds the same: the reads that
		// cross its edges are no different from the whole buffer's.
		small := 1 + int64(len(body)%61)
		var gotSmall []*Batch
		scSmall, errSmall := scanSegment(seg, bufReader(buf, small), 1, 0, func(b *Batch) error {
			gotSmall = append(gotSmall, b)
			return nil
		})
		if fmt.Sprint(err) != fmt.Sprint(errSmall) || sc != scSmall || !cmp.Equal(got, gotSmall) {
			t.Fatalf("window of %d bytes: scan = %+v, %v, %d records; with the whole window %+v, %v, %d records",
				small, scSmall, errSmall, len(gotSmall), sc, err, len(got))
		}
		if err != nil {
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Offset < 0 || ce.Offset > int64(len(buf)) {
				t.Fatalf("scan error %v is not a CorruptionError inside the segment", err)
			}
			return
		}
		if sc.records != len(got) || sc.end < segmentHeaderLen || sc.end > int64(len(buf)) {
			t.Fatalf("scan = %+v with %d records applied", sc, len(got))
		}
		for i, b := range got {
			if b.LSN != LSN(i+1) {
				t.Fatalf("record %d has LSN %v", i, b.LSN)
			}
		}
	})
}
