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

// CutLoop runs a workload over and over, killing it at op 0, 1, 2, ... in
// turn, and checks after each death what a restarted process would find,
// in the spirit of pebble's TestErrors. Its zero value is not usable:
// Workload and Check are required.
//
// Run i starts from a fresh memory store, wraps it in a Store whose first
// rule is OnIndex(i, Cut), runs Workload, then calls Crash on the memory
// store, so that only what was flushed before op i remains, and calls
// Check. The loop ends after the first run that returns without reaching
// its cut; that run is checked too, after its own Crash, so Check also sees
// the outcome of an uninterrupted workload. A deterministic workload of n
// ops is therefore run n+1 times, with cuts at 0, 1, ..., n-1 and a
// completed run whose CutAt is n.
type CutLoop struct {
	// NewMemory returns the memory store a run starts from, for example
	// one seeded with flushed data. Nil means store.NewMemory. Writes made
	// to it here are not ops and cannot be cut.
	NewMemory func() *store.Memory
	// Workload drives the store. It must be deterministic enough that run
	// i reaches op i when run i-1 reached op i-1, and must not return
	// before the goroutines it started are done with s. It may add rules
	// of its own with AddRule but must not call SetRules, which would drop
	// the cut. An error it returns after the cut is expected and passed to
	// Check; an error from the completed run fails the test.
	Workload func(s *Store) error
	// Check inspects the crashed memory store, which holds exactly what
	// was flushed before the cut. The TB it gets prefixes every failure
	// with the cut point.
	Check func(t TB, mem *store.Memory, run CutRun)
	// MaxCuts bounds the number of runs that reach their cut; zero means
	// DefaultMaxCuts.
	MaxCuts uint64
}

// Run runs the loop, reporting failures on t.
func (c CutLoop) Run(t TB) {
	t.Helper()
	newMemory := c.NewMemory
	if newMemory == nil {
		newMemory = store.NewMemory
	}
	maxCuts := c.MaxCuts
	if maxCuts == 0 {
		maxCuts = DefaultMaxCuts
	}
	for i := uint64(0); ; i++ {
		mem := newMemory()
		s := New(mem)
		s.SetRules(OnIndex(i, Cut))
		err := c.Workload(s)
		cutAt, cut := s.CutAt()
		// The process is dead: a restart finds only what was flushed.
		mem.Crash()
		run := CutRun{CutAt: i, Completed: !cut, Ops: s.Ops(), Err: err}
		if cut {
			run.CutAt = cutAt
		}
		if run.Completed && err != nil {
			t.Fatalf("faultstore: workload failed without reaching the cut at op %d: %v", i, err)
			return
		}
		label := fmt.Sprintf("cut at op %d: ", run.CutAt)
		if run.Completed {
			label = fmt.Sprintf("completed run (%d ops): ", run.Ops)
		}
		c.Check(prefixTB{TB: t, prefix: label}, mem, run)
		if run.Completed {
			return
		}
		if i+1 >= maxCuts {
			t.Fatalf("faultstore: workload still reached its cut after %d runs (MaxCuts)", maxCuts)
			return
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
