package participanttest

import (
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// CutLoop is faultstore.CutLoop with this package's workloads and checks:
// it runs CutWorkload (or Workload) over the Backend, cutting it at store
// operation Offset, Offset+Stride, Offset+2·Stride, ... in turn, crashes
// the store, and checks what the restart finds with CheckInvariants (and
// CheckCompacted, or Completed, after the run the cut did not reach, which
// ends the loop).
type CutLoop struct {
	Backend faultstore.Backend
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
	workload, completed := l.Workload, l.Completed
	if workload == nil {
		workload = CutWorkload
	}
	if completed == nil {
		completed = CheckCompacted
	}
	var log []Answered
	return faultstore.CutLoop{
		Backend: l.Backend, Stride: l.Stride, Offset: l.Offset, MaxCuts: l.MaxCuts,
		Workload: func(s *faultstore.Store) error {
			log = nil
			return workload(s, &log)
		},
		Check: func(t faultstore.TB, st store.DurableStore, run faultstore.CutRun) {
			CheckInvariants(t, st, log)
			if run.Completed {
				completed(t, st)
			}
		},
	}.Run(t)
}
