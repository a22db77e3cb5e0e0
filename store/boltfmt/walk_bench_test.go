package boltfmt

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkOpenChecks compares the pre-open page walk with bbolt's own
// read-write open of the same file (which walks every page too), so that
// the walk's cost reads as a ratio: about 1x on a warm page cache. The
// Persisted variants are the same on a file with a persisted freelist,
// where the walk reads the structure only and bbolt the freelist page:
// both are a small fraction of the walks, and do not grow with the leaves.
func BenchmarkOpenChecks(b *testing.B) {
	build := func(persist bool) string {
		path := filepath.Join(b.TempDir(), "bench.db")
		writeStore(b, path, persist, 20000, 20000, make([]byte, 1000), false)
		return path
	}
	walk := func(path string, mode walkMode) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				_, m, err := checkFile(path)
				if err != nil {
					b.Fatal(err)
				}
				if err := walkFile(path, m, mode); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	open := func(path string, persist bool) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				db, err := bolt.Open(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType, NoFreelistSync: !persist})
				if err != nil {
					b.Fatal(err)
				}
				db.Close()
			}
		}
	}
	path, persisted := build(false), build(true)
	b.Run("walkFile", walk(path, walkAll))
	b.Run("bboltOpen", open(path, false))
	b.Run("walkFilePersisted", walk(persisted, walkStructure))
	b.Run("bboltOpenPersisted", open(persisted, true))
}
