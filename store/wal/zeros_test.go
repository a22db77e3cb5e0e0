package wal

import "testing"

// lastNonZero skips whole zero blocks: every length around the block size,
// every start, a written byte anywhere after the start (and one just before
// it, which must not count).
func TestLastNonZero_FindsTheLastWrittenByte(t *testing.T) {
	for _, n := range []int{0, 1, 5, zeroBlock - 1, zeroBlock, zeroBlock + 1, 3*zeroBlock + 7} {
		for off := 0; off <= n; off += max(1, n/7) {
			buf := make([]byte, n)
			if got := lastNonZero(buf, int64(off)); got != int64(off)-1 {
				t.Fatalf("n=%d off=%d zeros: %d", n, off, got)
			}
			for _, at := range []int{off, (off + n) / 2, n - 1} {
				if at < off || at >= n {
					continue
				}
				b := make([]byte, n)
				b[at] = 1
				if off > 0 {
					b[off-1] = 9
				}
				if got := lastNonZero(b, int64(off)); got != int64(at) {
					t.Fatalf("n=%d off=%d at=%d: %d", n, off, at, got)
				}
			}
		}
	}
}
