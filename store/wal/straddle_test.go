package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestScan_RecordsStraddlingTheWindowReadBackWhole builds segments of
// both formats from records of random sizes (empty, a few bytes, a
// sector's worth, several sectors, larger than the window), then scans
// each through windows of random sizes, some smaller than a fragment and
// some ending inside a record, with the checkpoint at every record: apply
// gets each record after the checkpoint byte for byte as it was written,
// and the verdict is the one of a scan through a window that holds the
// whole segment, where nothing straddles; the same again with the last
// record torn (zeros from a point inside it), which no checkpoint covers.
func TestScan_RecordsStraddlingTheWindowReadBackWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 28))
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	for _, v := range []byte{segmentFormat1, segmentFormat2} {
		for round := range rounds {
			raw := formatHeader(1, v)
			var want []*Batch
			var lastAt int
			for lsn := LSN(1); lsn <= 24; lsn++ {
				var p []byte
				switch rng.IntN(5) {
				case 0:
				case 1:
					p = make([]byte, 1+rng.IntN(40))
				case 2:
					p = make([]byte, sectorSize-40+rng.IntN(80))
				default:
					p = make([]byte, 1+rng.IntN(6*sectorSize))
				}
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				lastAt = len(raw)
				b := &Batch{LSN: lsn, Appends: []StreamAppend{{Stream: "oplog/1", First: uint64(lsn), Payloads: [][]byte{p}}}}
				if v == segmentFormat1 {
					var err error
					if raw, err = appendFrame(raw, b); err != nil {
						t.Fatal(err)
					}
				} else {
					body, err := appendBody(nil, b)
					if err != nil {
						t.Fatal(err)
					}
					raw = appendRecord(raw, int64(len(raw)), lsn, body)
				}
				want = append(want, b)
			}
			intact := append(raw, make([]byte, 3*sectorSize)...)
			// A torn copy: the last record's bytes from a point inside it
			// on are zeros, as a write cut by a power loss leaves them.
			torn := bytes.Clone(intact)
			cut := lastAt + 1 + rng.IntN(len(raw)-lastAt-1)
			clear(torn[cut:len(raw)])
			seg := segment{name: segmentName(1), first: 1}
			for _, c := range []struct {
				name string
				raw  []byte
				n    int
			}{{"intact", intact, len(want)}, {"torn", torn, len(want) - 1}} {
				raw := c.raw
				scan := func(chunk int64, after LSN) (string, []*Batch) {
					var got []*Batch
					sc, err := scanSegment(seg, bufReader(raw, chunk), 1, after, func(b *Batch) error {
						got = append(got, b)
						return nil
					})
					return fmt.Sprintf("%v %v %v %d %v %d", err, sc.headerOK, sc.torn, sc.records, sc.last, sc.end), got
				}
				whole, all := scan(int64(len(raw)), 0)
				if len(all) != c.n {
					t.Fatalf("%s format %d round %d: the whole-window scan applied %d records, want %d (%s)", c.name, v, round, len(all), c.n, whole)
				}
				for range 12 {
					chunk := int64(1 + rng.IntN(3*sectorSize))
					for after := LSN(0); after <= LSN(c.n); after++ {
						verdict, got := scan(chunk, after)
						if verdict != whole {
							t.Fatalf("%s format %d round %d, window %d, after %v: scan %s, whole-window %s", c.name, v, round, chunk, after, verdict, whole)
						}
						if len(got) != c.n-int(after) {
							t.Fatalf("%s format %d round %d, window %d, after %v: applied %d records, want %d", c.name, v, round, chunk, after, len(got), c.n-int(after))
						}
						for i, b := range got {
							w := want[int(after)+i]
							if b.LSN != w.LSN || len(b.Appends) != 1 || !bytes.Equal(b.Appends[0].Payloads[0], w.Appends[0].Payloads[0]) {
								t.Fatalf("%s format %d round %d, window %d, after %v: record %v read back as %v, not as written", c.name, v, round, chunk, after, w.LSN, b.LSN)
							}
						}
					}
				}
			}
		}
	}
}
