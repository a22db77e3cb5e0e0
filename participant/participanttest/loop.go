package participanttest

import (
	"fmt"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// Backend makes the stores a CutLoop runs over.
type Backend struct {
	// Fresh returns an empty store for one run, its own.
	Fresh func(t faultstore.TB) store.DurableStore
	// Crash kills st as a process crash would: what was staged and not
	// flushed is lost. It returns the store a restarted process opens on
	// what survived, which may be st itself.
	Crash func(t faultstore.TB, st store.DurableStore) store.DurableStore
	// Release frees a store Crash returned, once it was checked; nil
	// means there is nothing to free.
	Release func(t faultstore.TB, st store.DurableStore)
}

// CutLoop is faultstore.CutLoop over any Backend: it runs CutWorkload (or
// Workload) over and over, cutting it at store operation Offset, Offset+Stride,
// Offset+2·Stride, ... in turn, crashes the store, and checks what the
// restart finds with CheckInvariants (and CheckCompacted, or Completed,
// after the run the cut did not reach, which ends the loop).
//
// A Stride above one samples the cut points, for backends whose
// operations are too slow to cut at every one.
type CutLoop struct {
	Backend Backend
	// Stride is the distance between cut points; zero means one.
	Stride uint64
	// Offset is the first cut point; it should be below Stride.
	Offset uint64
	// MaxCuts bounds the runs that reach their cut; zero means
	// faultstore.DefaultMaxCuts.
	MaxCuts uint64
	// Workload is what the loop cuts; nil means CutWorkload.
	Workload func(store.DurableStore, *[]Answered) error
	// Completed checks the run the cut did not reach; nil means
	// CheckCompacted (WindowWorkload's is CheckForgotten).
	Completed func(faultstore.TB, store.DurableStore)
}

// Run runs the loop and returns how many runs it checked.
func (l CutLoop) Run(t faultstore.TB) int {
	t.Helper()
	stride := max(l.Stride, 1)
	maxCuts := l.MaxCuts
	if maxCuts == 0 {
		maxCuts = faultstore.DefaultMaxCuts
	}
	workload, completed := l.Workload, l.Completed
	if workload == nil {
		workload = CutWorkload
	}
	if completed == nil {
		completed = CheckCompacted
	}
	runs := 0
	for i := l.Offset; ; i += stride {
		st := l.Backend.Fresh(t)
		fs := faultstore.New(st)
		fs.SetRules(faultstore.OnIndex(i, faultstore.Cut))
		var log []Answered
		err := workload(fs, &log)
		cutAt, cut := fs.CutAt()
		// The process is dead: a restart finds only what was flushed.
		st = l.Backend.Crash(t, st)
		if !cut && err != nil {
			t.Fatalf("workload failed without reaching the cut at op %d: %v", i, err)
		}
		label := fmt.Sprintf("cut at op %d: ", cutAt)
		if !cut {
			label = fmt.Sprintf("completed run (%d ops): ", fs.Ops())
		}
		pt := prefixTB{TB: t, prefix: label}
		CheckInvariants(pt, st, log)
		if !cut {
			completed(pt, st)
		}
		if l.Backend.Release != nil {
			l.Backend.Release(t, st)
		}
		runs++
		if !cut {
			return runs
		}
		if uint64(runs) >= maxCuts {
			t.Fatalf("the workload still reached its cut after %d runs (MaxCuts)", runs)
		}
	}
}

// prefixTB prefixes failure messages with the run they belong to.
type prefixTB struct {
	faultstore.TB
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
