package logfirst_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/storetest"
)

func open(t *testing.T, dir string, opts logfirst.Options) *logfirst.Store {
	t.Helper()
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestStore_Conformance(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts logfirst.Options
	}{
		// Everything stays in the log and memory until Close.
		{"NoCheckpoint", logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64}},
		// A checkpoint after nearly every record, racing the reads.
		{"EagerCheckpoint", logfirst.Options{CheckpointInterval: time.Millisecond, CheckpointBytes: 1, SegmentSize: 4096}},
		// Flushes wait for checkpoints to free memory.
		{"TinyMemory", logfirst.Options{CheckpointInterval: time.Hour, MaxUncheckpointed: 1, SegmentSize: 4096}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			harness := func(wrap func(store.DurableStore) store.DurableStore, unwrap func(store.DurableStore) *logfirst.Store) storetest.Harness {
				return storetest.Harness{
					Open: func(t *testing.T) store.DurableStore { return wrap(open(t, t.TempDir(), tt.opts)) },
					Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
						lf := unwrap(s)
						logfirst.Abandon(lf)
						return wrap(open(t, lf.Dir(), tt.opts))
					},
				}
			}
			t.Run("Bare", func(t *testing.T) {
				storetest.Run(t, harness(
					func(s store.DurableStore) store.DurableStore { return s },
					func(s store.DurableStore) *logfirst.Store { return s.(*logfirst.Store) }))
			})
			t.Run("Faultstore", func(t *testing.T) {
				// Idle rules, consulted on every op and never firing: the
				// wrapper must be transparent over this store too.
				inner := map[store.DurableStore]*logfirst.Store{}
				storetest.Run(t, harness(
					func(s store.DurableStore) store.DurableStore {
						fs := faultstore.New(s)
						fs.SetRules(faultstore.OnIndex(math.MaxUint64, faultstore.Cut))
						inner[fs] = s.(*logfirst.Store)
						return fs
					},
					func(s store.DurableStore) *logfirst.Store { return inner[s] }))
			})
		})
	}
}

// TestStore_ConformanceOnFaultFS runs the suite with the log on a faultfs,
// whose CrashDuringFlush cuts the power at each file-system call of a
// Flush, tearing the last write at a random byte, and restarts.
func TestStore_ConformanceOnFaultFS(t *testing.T) {
	opts := logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64, SegmentSize: 4096}
	fsOf := map[store.DurableStore]*faultfs.FS{}
	openOn := func(t *testing.T, ffs *faultfs.FS, dir string) *logfirst.Store {
		o := opts
		o.FS = ffs
		s := open(t, dir, o)
		fsOf[s] = ffs
		return s
	}
	rng := rand.New(rand.NewPCG(7, 11))
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.DurableStore { return openOn(t, faultfs.New(), t.TempDir()) },
		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
			lf := s.(*logfirst.Store)
			logfirst.Abandon(lf)
			ffs := fsOf[s]
			if err := ffs.Crash(nil); err != nil {
				t.Fatalf("Crash: %v", err)
			}
			return openOn(t, ffs, lf.Dir())
		},
		CrashDuringFlush: func(t *testing.T, s store.DurableStore, i int) (store.DurableStore, bool) {
			lf := s.(*logfirst.Store)
			ffs := fsOf[s]
			ffs.SetRule(faultfs.CutAt(ffs.Ops() + uint64(i)))
			err := lf.Flush()
			_, crashed := ffs.CutOp()
			if !crashed && err != nil {
				t.Fatalf("Flush without a crash: %v", err)
			}
			logfirst.Abandon(lf)
			if err := ffs.Crash(rng); err != nil {
				t.Fatalf("Crash: %v", err)
			}
			return openOn(t, ffs, lf.Dir()), crashed
		},
	})
}
