package wal

import "testing"

// lastNonZero skips whole zero blocks: every length around the block size,
// every start, a written byte anywhere after the start (and one just before
// it, which must not count).
func TestLastNonZero_FindsTheLastWrittenByte(t *testing.T) {
	for _, n := range []int{0, 1, 5, zeroBlock - 1, zeroBlock, zeroBlock + 1, 3*zeroBlock + 7} {
		for off := 0; off <= n; off += max(1, n/7) {
			buf := make([]byte, n)
			if got, _ := lastNonZero(bufReader(buf, readChunk), int64(off)); got != int64(off)-1 {
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
				for _, chunk := range []int64{readChunk, zeroBlock - 3, 1000} {
					if got, err := lastNonZero(bufReader(b, chunk), int64(off)); got != int64(at) || err != nil {
						t.Fatalf("n=%d off=%d at=%d chunk=%d: %d, %v", n, off, at, chunk, got, err)
					}
				}
			}
		}
	}
}
