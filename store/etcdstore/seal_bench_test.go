package etcdstore_test

import (
	"fmt"
	"testing"

	"github.com/participantd/participantd/store/etcdstore"
)

// BenchmarkSeal measures what the checksum adds to a put and a read of one
// value, beside what the put cost before it (the payload copied into the
// request's string): a token index value (8 bytes) and oplog rows of 256 B
// and 4 KiB, under an entry key of the cluster layout.
func BenchmarkSeal(b *testing.B) {
	key := "c/123456/s/\x00\x0eoplog/123456\x00\x00\x00\x00\x00\x00\x01\x00"
	for _, n := range []int{8, 256, 4096} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i)
		}
		sealed := []byte(etcdstore.Seal(key, body))
		b.Run(fmt.Sprintf("put-before/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				sink = string(body)
			}
		})
		b.Run(fmt.Sprintf("seal/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				sink = etcdstore.Seal(key, body)
			}
		})
		b.Run(fmt.Sprintf("unseal/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				if _, err := etcdstore.Unseal("", key, sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var sink string
