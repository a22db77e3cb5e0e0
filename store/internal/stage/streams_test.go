package stage

import (
	"errors"
	"sync"
	"testing"

	"github.com/participantd/participantd/store"
)

type testStream struct {
	durable uint64
	pending [][]byte
}

func (s *testStream) LenLocked() uint64          { return s.durable + uint64(len(s.pending)) }
func (s *testStream) StageLocked(payload []byte) { s.pending = append(s.pending, payload) }

// A stream is loaded once, then staged in memory: an append that does not
// expect the stream's length stages nothing.
func TestStreams_AppendLocked_StagesAtTheExpectedSeqOnly(t *testing.T) {
	var mu sync.Mutex
	ss := NewStreams[*testStream]()
	loads := 0
	load := func(string) (*testStream, error) { loads++; return &testStream{durable: 3}, nil }
	usable := func() error { return nil }
	mu.Lock()
	defer mu.Unlock()
	st, err := ss.Get(&mu, "s", usable, load)
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := ss.AppendLocked("s", st, []byte("x"), 3); err != nil || seq != 3 {
		t.Fatalf("AppendLocked(expect 3) = %d, %v; want 3, nil", seq, err)
	}
	if _, err := ss.AppendLocked("s", st, []byte("y"), 3); !errors.Is(err, store.ErrSequenceConflict) {
		t.Fatalf("AppendLocked(expect 3 again) = %v, want a sequence conflict", err)
	}
	if again, _ := ss.Get(&mu, "s", usable, load); again != st || loads != 1 {
		t.Fatalf("second Get: state %p (first %p), %d loads; want the same state, 1 load", again, st, loads)
	}
	var taken []string
	ss.TakeDirtyLocked(func(name string, st *testStream) { taken = append(taken, name) })
	if len(taken) != 1 || taken[0] != "s" || ss.DirtyLocked() {
		t.Fatalf("TakeDirtyLocked took %q and left dirty %v; want [s] and nothing", taken, ss.DirtyLocked())
	}
}

// Get returns the engine's error, and loads nothing, once the engine
// refuses service.
func TestStreams_Get_StopsWhenTheEngineIsNotUsable(t *testing.T) {
	var mu sync.Mutex
	ss := NewStreams[*testStream]()
	mu.Lock()
	defer mu.Unlock()
	_, err := ss.Get(&mu, "s", func() error { return store.ErrClosed }, func(string) (*testStream, error) {
		t.Fatal("loaded a stream of a closed engine")
		return nil, nil
	})
	if !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get on a closed engine = %v, want store.ErrClosed", err)
	}
}

// Peek keeps no state for a stream load finds empty, keeps one for a
// stream that has entries, and returns the state Get made, even when Get
// made it while Peek's load ran.
func TestStreams_Peek_KeepsNoStateForAnEmptyStream(t *testing.T) {
	var mu sync.Mutex
	ss := NewStreams[*testStream]()
	usable := func() error { return nil }
	empty := func(string) (*testStream, error) { return &testStream{}, nil }
	mu.Lock()
	defer mu.Unlock()
	for range 3 {
		if st, err := ss.Peek(&mu, "absent", usable, empty); err != nil || st.LenLocked() != 0 {
			t.Fatalf("Peek(absent) = %v, %v; want an empty state", st, err)
		}
	}
	if n := ss.CountLocked(); n != 0 {
		t.Fatalf("after Peek of an empty stream %d states are kept, want 0", n)
	}
	if st, err := ss.Peek(&mu, "full", usable, func(string) (*testStream, error) { return &testStream{durable: 2}, nil }); err != nil || st.LenLocked() != 2 {
		t.Fatalf("Peek(full) = %v, %v; want 2 entries", st, err)
	}
	if _, ok := ss.LookupLocked("full"); !ok || ss.CountLocked() != 1 {
		t.Fatalf("a stream with entries is not kept after Peek (%d states)", ss.CountLocked())
	}
	// Get stages into the empty stream while Peek's load runs (mu
	// released): Peek answers with Get's state.
	var made *testStream
	racing := func(string) (*testStream, error) {
		mu.Lock()
		st, err := ss.Get(&mu, "absent", usable, empty)
		if err == nil {
			_, err = ss.AppendLocked("absent", st, []byte("x"), 0)
		}
		made = st
		mu.Unlock()
		return &testStream{}, err
	}
	if st, err := ss.Peek(&mu, "absent", usable, racing); err != nil || st != made || st.LenLocked() != 1 {
		t.Fatalf("Peek racing an append = %v, %v; want Get's state with 1 entry", st, err)
	}
}
