package wal

import (
	"bytes"
	"fmt"
	"testing"
)

// coveredSegment returns a segment of size bytes in format v, starting at
// LSN 1, filled with records of one append of a payload bytes long each
// up to the last that fits, zeros after; and the LSN of its last record.
func coveredSegment(tb testing.TB, v byte, size, payload int) ([]byte, LSN) {
	tb.Helper()
	raw := append(make([]byte, 0, size+2*payload+sectorSize), formatHeader(1, v)...)
	p := bytes.Repeat([]byte{5}, payload)
	var body []byte
	lsn := LSN(1)
	for ; ; lsn++ {
		b := &Batch{LSN: lsn, Appends: []StreamAppend{{Stream: "oplog/1", First: uint64(lsn), Payloads: [][]byte{p}}}}
		var next []byte
		if v == segmentFormat1 {
			var err error
			if next, err = appendFrame(raw, b); err != nil {
				tb.Fatal(err)
			}
		} else {
			var err error
			if body, err = appendBody(body[:0], b); err != nil {
				tb.Fatal(err)
			}
			next = appendRecord(raw, int64(len(raw)), lsn, body)
		}
		if len(next) > size {
			break
		}
		raw = next
	}
	return append(raw, make([]byte, size-len(raw))...), lsn - 1
}

// BenchmarkScan_ACoveredSegment scans, as Open does at a start, a 64 MiB
// segment of each format whose every record the checkpoint covers: each
// record is read and checked, none is applied. The segment is in memory,
// so that the figure is the scan's own work, not the disk's.
func BenchmarkScan_ACoveredSegment(b *testing.B) {
	const size = DefaultSegmentSize
	for _, payload := range []int{64 << 10, 400} {
		for _, v := range []byte{segmentFormat1, segmentFormat2} {
			raw, last := coveredSegment(b, v, size, payload)
			seg := segment{name: segmentName(1), first: 1}
			b.Run(fmt.Sprintf("format%d/%dB", v, payload), func(b *testing.B) {
				b.SetBytes(size)
				b.ReportAllocs()
				for range b.N {
					sc, err := scanSegment(seg, bufReader(raw, readChunk), 1, last, func(*Batch) error {
						b.Fatal("a covered record was applied")
						return nil
					})
					if err != nil || sc.last != last || sc.torn {
						b.Fatalf("scan = %+v, %v; want the records up to %v, not torn", sc, err, last)
					}
				}
			})
		}
	}
}

// TestScan_ARecordWalkedPastIsJudgedAsAReplayedOne scans the flip tests'
// segments of both formats, whole and with every byte flipped (one bit
// a byte; a seventh of the bytes under -short), through windows smaller than a sector and than a record, with
// the checkpoint after none, some or all of the records: a record the
// scan walks past, checked in place and not decoded, is judged as a
// replayed one is, and apply gets exactly the records after the
// checkpoint.
func TestScan_ARecordWalkedPastIsJudgedAsAReplayedOne(t *testing.T) {
	type verdict struct {
		err            string
		headerOK, torn bool
		records        int
		last           LSN
		end            int64
	}
	scan := func(c flipCase, raw []byte, chunk int64, after LSN) (verdict, []LSN) {
		var applied []LSN
		sc, err := scanSegment(c.seg, bufReader(raw, chunk), 1, after, func(b *Batch) error {
			applied = append(applied, b.LSN)
			return nil
		})
		return verdict{fmt.Sprint(err), sc.headerOK, sc.torn, sc.records, sc.last, sc.end}, applied
	}
	for _, format := range []byte{segmentFormat1, segmentFormat2} {
		for _, c := range flipCases(t, format) {
			for pos := int64(-1); pos < c.end; pos++ {
				if testing.Short() && pos >= 0 && pos%7 != 0 {
					continue // a seventh of the bytes
				}
				raw := c.raw
				if pos >= 0 {
					raw = bytes.Clone(c.raw)
					raw[pos] ^= 1 << (pos % 8)
				}
				want, _ := scan(c, raw, int64(len(raw)), 0)
				for _, chunk := range []int64{int64(len(raw)), 7, 700} {
					for _, after := range []LSN{0, 2, 3, LSN(len(c.want))} {
						got, applied := scan(c, raw, chunk, after)
						if got != want {
							t.Fatalf("format %d, %s, byte %d flipped, window %d, after %v: scan = %+v; replaying every record: %+v",
								format, c.name, pos, chunk, after, got, want)
						}
						for i, lsn := range applied {
							if lsn != after+LSN(i)+1 {
								t.Fatalf("format %d, %s, byte %d flipped, window %d, after %v: applied %v", format, c.name, pos, chunk, after, applied)
							}
						}
					}
				}
			}
		}
	}
}

// TestScan_ACoveredSegmentAllocatesNothingPerRecord scans a segment whose
// every record the checkpoint covers: the scan allocates its window and
// nothing for each record, of either format.
func TestScan_ACoveredSegmentAllocatesNothingPerRecord(t *testing.T) {
	for _, v := range []byte{segmentFormat1, segmentFormat2} {
		raw, last := coveredSegment(t, v, 4<<20, 400)
		seg := segment{name: segmentName(1), first: 1}
		allocs := testing.AllocsPerRun(3, func() {
			sc, err := scanSegment(seg, bufReader(raw, readChunk), 1, last, func(*Batch) error { return nil })
			if err != nil || sc.last != last {
				t.Fatalf("scan = %+v, %v; want the records up to %v", sc, err, last)
			}
		})
		if allocs > 8 {
			t.Errorf("format %d: the scan of %d covered records allocated %v times, want at most 8", v, last, allocs)
		}
	}
}
