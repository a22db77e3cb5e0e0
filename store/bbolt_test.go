package store_test

import (
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/storetest"
)

func openBolt(t *testing.T, path string) *store.Bolt {
	t.Helper()
	b, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("Open(%s) error: %v", path, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestBolt_Conformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.DurableStore {
			return openBolt(t, filepath.Join(t.TempDir(), "data.db"))
		},
		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
			b := s.(*store.Bolt)
			if err := b.Close(); err != nil {
				t.Fatalf("Close() error: %v", err)
			}
			return openBolt(t, b.Path())
		},
	})
}
