package store_test

import (
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/storetest"
)

func TestMemory_Conformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.DurableStore {
			m := store.NewMemory()
			t.Cleanup(func() { m.Close() })
			return m
		},
		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
			m := s.(*store.Memory)
			m.Crash()
			return m
		},
	})
}
