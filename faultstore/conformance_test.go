package faultstore

import (
	"math"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/storetest"
)

// TestStore_Conformance runs the DurableStore conformance suite through a
// Store over a memory store, once bare and once with rules and an observer
// that are consulted on every op but never fire: without faults the wrapper
// must be indistinguishable from what it wraps.
func TestStore_Conformance(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(s *Store)
	}{
		{"NoRules", func(*Store) {}},
		{"IdleRules", func(s *Store) {
			s.SetRules(
				NewSwitch(When(Fail)),
				OnIndex(math.MaxUint64, Cut),
				When(Uncertain, Kind(OpFlush), Prefix("\xff")),
			)
			s.SetObserver(func(Op, Action, error) {})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			open := func(mem *store.Memory) store.DurableStore {
				s := New(mem)
				tt.setup(s)
				return s
			}
			storetest.Run(t, storetest.Harness{
				Open: func(t *testing.T) store.DurableStore { return open(store.NewMemory()) },
				// A restarted process finds the crashed memory store and
				// wraps it anew.
				Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
					mem := s.(*Store).inner.(*store.Memory)
					mem.Crash()
					return open(mem)
				},
			})
		})
	}
}
