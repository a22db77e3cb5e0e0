package etcdstore

import (
	"fmt"
	"hash/maphash"
	"testing"
)

// TestKeyFilter_NeverAnswersAbsentForAKeyItSaw: every key loaded or added,
// through several segments' growth, is answered "maybe"; keys never added
// are answered absent for all but about one in a hundred.
func TestKeyFilter_NeverAnswersAbsentForAKeyItSaw(t *testing.T) {
	for _, tc := range []struct{ loaded, added int }{{0, 0}, {0, 10}, {3, 5000}, {5000, 20000}} {
		t.Run(fmt.Sprintf("loaded=%d,added=%d", tc.loaded, tc.added), func(t *testing.T) {
			var names []string
			for i := range tc.loaded {
				names = append(names, fmt.Sprintf("token/1/e/%d", i))
			}
			f := newKeyFilter(maphash.MakeSeed(), names)
			size := f.size()
			for i := range tc.added {
				size += f.add(fmt.Sprintf("token/1/2/%d", i))
			}
			if size != f.size() {
				t.Fatalf("growth reported %d bytes, filter holds %d", size, f.size())
			}
			if n := tc.loaded + tc.added; f.size() > 4*n*filterBitsPerKey/8+8*filterMinKeys*filterBitsPerKey/64 {
				t.Fatalf("filter of %d keys takes %d bytes", n, f.size())
			}
			for _, n := range names {
				if !f.mayHold(n) {
					t.Fatalf("mayHold(%q) = false for a loaded key", n)
				}
			}
			for i := range tc.added {
				if n := fmt.Sprintf("token/1/2/%d", i); !f.mayHold(n) {
					t.Fatalf("mayHold(%q) = false for an added key", n)
				}
			}
			maybe := 0
			const probes = 10000
			for i := range probes {
				if f.mayHold(fmt.Sprintf("token/1/3/%d", i)) {
					maybe++
				}
			}
			// Each segment answers a false "maybe" about 1% of the time.
			if limit := probes * 2 * len(f.segs) / 100; maybe > limit {
				t.Fatalf("%d of %d absent keys answered maybe (%d segments), want at most %d", maybe, probes, len(f.segs), limit)
			}
		})
	}
}
