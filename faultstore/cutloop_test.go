package faultstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
)

// fakeTB records failures instead of stopping the goroutine, so a test can
// watch CutLoop fail.
type fakeTB struct {
	errors []string
	fatal  string
}

func (f *fakeTB) Helper()                         {}
func (f *fakeTB) Logf(format string, args ...any) {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	if f.fatal != "" {
		panic("Fatalf called twice")
	}
	f.fatal = fmt.Sprintf(format, args...)
}

// twoBarriers appends to a and flushes, appends to a again, sets k and
// flushes, then appends to b and never flushes: six ops, #0 to #5.
func twoBarriers(s *Store) error {
	if _, err := s.Append("a", []byte("a0"), 0); err != nil {
		return err
	}
	if err := s.Flush(); err != nil {
		return err
	}
	if _, err := s.Append("a", []byte("a1"), 1); err != nil {
		return err
	}
	if err := s.CAS("k", 0, 1); err != nil {
		return err
	}
	if err := s.Flush(); err != nil {
		return err
	}
	_, err := s.Append("b", []byte("b0"), 0)
	return err
}

func TestCutLoop_VisitsEveryCutPointOnceThenCompletes(t *testing.T) {
	type visit struct {
		CutAt     uint64
		Completed bool
		Ops       uint64
	}
	var visits []visit
	CutLoop{
		Workload: twoBarriers,
		Check: func(t TB, mem store.DurableStore, run CutRun) {
			visits = append(visits, visit{run.CutAt, run.Completed, run.Ops})
			if !run.Completed && !errors.Is(run.Err, ErrCut) {
				t.Errorf("workload returned %v, want ErrCut", run.Err)
			}
			// Only what a flush before the cut covered survives.
			var wantA []string
			var wantK uint64
			switch {
			case run.CutAt >= 5:
				wantA, wantK = []string{"a0", "a1"}, 1
			case run.CutAt >= 2:
				wantA = []string{"a0"}
			}
			if diff := cmp.Diff(wantA, payloads(t, mem, "a")); diff != "" {
				t.Errorf("stream a (-want +got):\n%s", diff)
			}
			if v, _ := mem.ReadValue("k"); v != wantK {
				t.Errorf("ReadValue(k) = %d, want %d", v, wantK)
			}
			if n, _ := mem.Len("b"); n != 0 {
				t.Errorf("Len(b) = %d, want 0: b was never flushed", n)
			}
		},
	}.Run(t)

	want := []visit{
		{0, false, 1}, {1, false, 2}, {2, false, 3}, {3, false, 4}, {4, false, 5}, {5, false, 6},
		{6, true, 6},
	}
	if diff := cmp.Diff(want, visits); diff != "" {
		t.Errorf("visited runs (-want +got):\n%s", diff)
	}
}

func TestCutLoop_StrideSamplesCutPointsAndReleasesEachStore(t *testing.T) {
	mem := MemoryBackend(nil)
	var made, released []store.DurableStore
	var cuts []uint64
	runs := CutLoop{
		Backend: Backend{
			Fresh: func(t TB) store.DurableStore {
				st := mem.Fresh(t)
				made = append(made, st)
				return st
			},
			Crash:   mem.Crash,
			Release: func(_ TB, st store.DurableStore) { released = append(released, st) },
		},
		Stride:   3,
		Offset:   1,
		Workload: twoBarriers,
		Check:    func(t TB, st store.DurableStore, run CutRun) { cuts = append(cuts, run.CutAt) },
	}.Run(t)
	if diff := cmp.Diff([]uint64{1, 4, 7}, cuts); diff != "" {
		t.Errorf("cut points (-want +got):\n%s", diff)
	}
	if runs != 3 {
		t.Errorf("Run = %d, want 3 runs checked", runs)
	}
	if len(released) != len(made) || len(made) != 3 {
		t.Fatalf("made %d stores and released %d, want 3 and 3", len(made), len(released))
	}
	for i := range made {
		if made[i] != released[i] {
			t.Errorf("run %d released another store than the one it made", i)
		}
	}
}

func TestCutLoop_StartsEachRunFromNewMemory(t *testing.T) {
	runs := 0
	CutLoop{
		Backend: MemoryBackend(func() *store.Memory {
			mem := store.NewMemory()
			if _, err := mem.Append("seed", []byte("s0"), 0); err != nil {
				t.Fatal(err)
			}
			if err := mem.Flush(); err != nil {
				t.Fatal(err)
			}
			return mem
		}),
		Workload: func(s *Store) error {
			// The seeded entry is there and was not counted as an op.
			if n, err := s.Len("seed"); err != nil || n != 1 {
				return fmt.Errorf("Len(seed) = %d, %v, want 1", n, err)
			}
			_, err := s.Append("seed", []byte("s1"), 1)
			return err
		},
		Check: func(t TB, mem store.DurableStore, run CutRun) {
			runs++
			if diff := cmp.Diff([]string{"s0"}, payloads(t, mem, "seed")); diff != "" {
				t.Errorf("seed stream (-want +got):\n%s", diff)
			}
		},
	}.Run(t)
	if runs != 3 {
		t.Errorf("Check ran %d times, want 3 (cuts at #0 and #1, then a completed run)", runs)
	}
}

func TestCutLoop_StopsARunawayWorkload(t *testing.T) {
	var tb fakeTB
	var cuts []uint64
	CutLoop{
		// Never completes: it appends until the cut stops it.
		Workload: func(s *Store) error {
			for seq := uint64(0); ; seq++ {
				if _, err := s.Append("a", nil, seq); err != nil {
					return err
				}
			}
		},
		Check:   func(t TB, mem store.DurableStore, run CutRun) { cuts = append(cuts, run.CutAt) },
		MaxCuts: 4,
	}.Run(&tb)
	if diff := cmp.Diff([]uint64{0, 1, 2, 3}, cuts); diff != "" {
		t.Errorf("cut points (-want +got):\n%s", diff)
	}
	if want := "faultstore: workload still reached its cut after 4 runs (MaxCuts)"; tb.fatal != want {
		t.Errorf("Fatalf(%q), want %q", tb.fatal, want)
	}
}

func TestCutLoop_FailsWhenTheCompletedRunFails(t *testing.T) {
	var tb fakeTB
	checked := 0
	CutLoop{
		Workload: func(s *Store) error { return errors.New("boom") },
		Check:    func(t TB, mem store.DurableStore, run CutRun) { checked++ },
	}.Run(&tb)
	if want := "faultstore: workload failed without reaching the cut at op 0: boom"; tb.fatal != want {
		t.Errorf("Fatalf(%q), want %q", tb.fatal, want)
	}
	if checked != 0 {
		t.Errorf("Check ran %d times after the failed run, want 0", checked)
	}
}

func TestCutLoop_PrefixesFailuresWithTheRun(t *testing.T) {
	var tb fakeTB
	CutLoop{
		Workload: func(s *Store) error {
			_, err := s.Append("a", nil, 0)
			return err
		},
		Check: func(t TB, mem store.DurableStore, run CutRun) { t.Errorf("bad %d", run.Ops) },
	}.Run(&tb)
	want := []string{"cut at op 0: bad 1", "completed run (1 ops): bad 1"}
	if diff := cmp.Diff(want, tb.errors); diff != "" {
		t.Errorf("Errorf messages (-want +got):\n%s", diff)
	}
	if tb.fatal != "" {
		t.Errorf("Fatalf(%q), want no fatal failure", tb.fatal)
	}
}
