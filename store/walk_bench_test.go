package store

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkOpenChecks compares the pre-open page walk with bbolt's own
// read-write open of the same file (which walks every page too), so that
// the walk's cost reads as a ratio: about 1x on a warm page cache.
func BenchmarkOpenChecks(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.db")
	st, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1000)
	for i := uint64(0); i < 20000; i++ {
		if _, err := st.Append("s", payload, i); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Flush(); err != nil {
		b.Fatal(err)
	}
	st.Close()
	b.Run("walkFile", func(b *testing.B) {
		for b.Loop() {
			_, m, err := checkFile(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := walkFile(path, m, walkAll); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bboltOpen", func(b *testing.B) {
		for b.Loop() {
			db, err := bolt.Open(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType, NoFreelistSync: true})
			if err != nil {
				b.Fatal(err)
			}
			db.Close()
		}
	})
}
