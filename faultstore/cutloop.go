package faultstore

import (
	"fmt"

	"github.com/participantd/participantd/store"
)

// DefaultMaxCuts is the number of cut points a CutLoop tries when MaxCuts
// is zero. A workload that still reaches its cut after that many runs is
// taken to be runaway (it never finishes, or its op count grows with every
// run) and fails the test.
const DefaultMaxCuts = 10_000

// TB is the part of testing.TB a CutLoop uses, so that this package does
// not import testing; *testing.T and *testing.B satisfy it.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// CutRun describes one run of a CutLoop to its Check.
type CutRun struct {
	// CutAt is the index of the op the process died at. For the completed
	// run it is the index the cut was placed at and never reached, which is
	// the number of ops the workload made.
	CutAt uint64
	// Completed reports that the workload returned without reaching the
	// cut: this is the last run, and everything it did was allowed to
	// happen.
	Completed bool
	// Ops is how many ops the workload attempted, those refused after the
	// cut included.
	Ops uint64
	// Err is what the workload returned. It is nil for the completed run.
	Err error
}

// Backend makes the stores a CutLoop runs over.
type Backend struct {
	// Fresh returns the store one run starts from, its own.
	Fresh func(t TB) store.DurableStore
	// Crash kills st as a process crash would: what was staged and not
	// flushed is lost. It returns the store a restarted process opens on
	// what survived, which may be st itself.
	Crash func(t TB, st store.DurableStore) store.DurableStore
	// Release frees a store Crash returned, once it was checked; nil
	// means there is nothing to free.
	Release func(t TB, st store.DurableStore)
}

// MemoryBackend returns the Backend of memory stores made by newMemory
// (nil means store.NewMemory), which a crash cuts to what was flushed
// (Memory.Crash). Writes newMemory makes are not ops and cannot be cut.
func MemoryBackend(newMemory func() *store.Memory) Backend {
	if newMemory == nil {
		newMemory = store.NewMemory
	}
	return Backend{
		Fresh: func(TB) store.DurableStore { return newMemory() },
		Crash: func(_ TB, st store.DurableStore) store.DurableStore {
			st.(*store.Memory).Crash()
			return st
		},
	}
}

// CutLoop runs a workload over and over, killing it at op Offset,
// Offset+Stride, Offset+2·Stride, ... in turn, and checks after each death
// what a restarted process would find, in the spirit of pebble's
// TestErrors. Its zero value is not usable: Workload and Check are
// required.
//
// Run i starts from a fresh store of Backend, wraps it in a Store whose
// first rule is OnIndex(cut point i, Cut), runs Workload, then crashes the
// store, so that only what was flushed before the cut remains, and calls
// Check. The loop ends after the first run that returns without reaching
// its cut; that run is checked too, after its own crash, so Check also
// sees the outcome of an uninterrupted workload. With a Stride of one, a
// deterministic workload of n ops is therefore run n+1 times, with cuts at
// 0, 1, ..., n-1 and a completed run whose CutAt is n.
type CutLoop struct {
	// Backend makes and crashes the stores; the zero Backend is
	// MemoryBackend(nil).
	Backend Backend
	// Stride is the distance between cut points; zero means one. A Stride
	// above one samples the cut points, for backends whose ops are too
	// slow to cut at every one.
	Stride uint64
	// Offset is the first cut point; it should be below Stride.
	Offset uint64
	// Workload drives the store. It must be deterministic enough that a
	// run reaches its cut point when the run before reached its own, and
	// must not return before the goroutines it started are done with s.
	// It may add rules of its own with AddRule but must not call
	// SetRules, which would drop the cut. An error it returns after the
	// cut is expected and passed to Check; an error from the completed
	// run fails the test.
	Workload func(s *Store) error
	// Check inspects the crashed store, which holds exactly what was
	// flushed before the cut. The TB it gets prefixes every failure with
	// the cut point.
	Check func(t TB, st store.DurableStore, run CutRun)
	// MaxCuts bounds the number of runs that reach their cut; zero means
	// DefaultMaxCuts.
	MaxCuts uint64
}

// Run runs the loop, reporting failures on t, and returns how many runs it
// checked.
func (c CutLoop) Run(t TB) int {
	t.Helper()
	backend := c.Backend
	if backend.Fresh == nil {
		backend = MemoryBackend(nil)
	}
	stride := max(c.Stride, 1)
	maxCuts := c.MaxCuts
	if maxCuts == 0 {
		maxCuts = DefaultMaxCuts
	}
	runs := 0
	for i := c.Offset; ; i += stride {
		st := backend.Fresh(t)
		s := New(st)
		s.SetRules(OnIndex(i, Cut))
		err := c.Workload(s)
		cutAt, cut := s.CutAt()
		// The process is dead: a restart finds only what was flushed.
		st = backend.Crash(t, st)
		run := CutRun{CutAt: i, Completed: !cut, Ops: s.Ops(), Err: err}
		if cut {
			run.CutAt = cutAt
		}
		if run.Completed && err != nil {
			t.Fatalf("faultstore: workload failed without reaching the cut at op %d: %v", i, err)
			return runs
		}
		label := fmt.Sprintf("cut at op %d: ", run.CutAt)
		if run.Completed {
			label = fmt.Sprintf("completed run (%d ops): ", run.Ops)
		}
		c.Check(prefixTB{TB: t, prefix: label}, st, run)
		if backend.Release != nil {
			backend.Release(t, st)
		}
		runs++
		if run.Completed {
			return runs
		}
		if uint64(runs) >= maxCuts {
			t.Fatalf("faultstore: workload still reached its cut after %d runs (MaxCuts)", maxCuts)
			return runs
		}
	}
}

// prefixTB prefixes failure messages with the run they belong to.
type prefixTB struct {
	TB
	prefix string
}

func (p prefixTB) Errorf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Errorf(p.prefix+format, args...)
}

func (p prefixTB) Fatalf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Fatalf(p.prefix+format, args...)
}
