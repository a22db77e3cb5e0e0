package boltstore_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/storetest"
)

// BenchmarkBolt_AppendFlush measures Append followed by Flush, the shape of
// one commit barrier, with 1 writer and with 64 writers on distinct streams.
// With group commit, 64 writers should share commits: commits/op falls well
// below 1 and ops/s rises well above the single writer's.
func BenchmarkBolt_AppendFlush(b *testing.B) {
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			benchAppendFlush(b, writers)
		})
	}
}

func benchAppendFlush(b *testing.B, writers int) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "data.db"), boltstore.Options{})
	if err != nil {
		b.Fatalf("Open error: %v", err)
	}
	defer s.Close()
	storetest.BenchAppendFlush(b, s, writers)
}
