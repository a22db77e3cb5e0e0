package heapgoal

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

func TestRule_FollowsTheMedianNotOneCollectionsPeak(t *testing.T) {
	r := rule{window: 8, factor: 2.25, growth: 1.5, ceiling: math.MaxInt64}
	lives := []uint64{18 * mib, 17 * mib, 19 * mib, 18 * mib, 18 * mib, 17 * mib, 18 * mib}
	base := r.limit(lives, 3*mib)
	if want := int64(2.25*18*mib) + 3*mib; base != want {
		t.Fatalf("limit at the median = %d, want %d", base, want)
	}
	// A collection whose live heap peaks at 1.4 times the median: the
	// runtime's own goal would be 2 × 25 MiB; the limit stays.
	if got := r.limit(append(lives, 25*mib), 3*mib); got != base {
		t.Fatalf("limit after one peak = %d, want the median's %d", got, base)
	}
}

func TestRule_ALiveHeapThatGrowsIsFollowed(t *testing.T) {
	r := rule{window: 8, factor: 2.25, growth: 1.5, ceiling: math.MaxInt64}
	lives := []uint64{10 * mib, 10 * mib, 10 * mib, 10 * mib}
	// At once: never below Growth × the last live heap.
	if got, want := r.limit(append(lives, 40*mib), 0), int64(60*mib); got != want {
		t.Fatalf("limit after a jump to 40 MiB = %d, want %d", got, want)
	}
	// Once it is the median, the median's factor.
	grown := []uint64{10 * mib, 10 * mib, 10 * mib, 40 * mib, 40 * mib, 40 * mib, 40 * mib}
	if got, want := r.limit(grown, 0), int64(2.25*40*mib); got != want {
		t.Fatalf("limit once 40 MiB is the median = %d, want %d", got, want)
	}
}

func TestRule_NeverAboveTheCeiling(t *testing.T) {
	r := rule{window: 8, factor: 2.25, growth: 1.5, ceiling: 30 * mib}
	if got := r.limit([]uint64{20 * mib}, mib); got != 30*mib {
		t.Fatalf("limit = %d, want the ceiling %d", got, 30*mib)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []uint64
		want uint64
	}{
		{[]uint64{5}, 5},
		{[]uint64{9, 1}, 1},
		{[]uint64{3, 1, 2}, 2},
		{[]uint64{4, 1, 3, 2}, 2},
	} {
		xs := append([]uint64(nil), c.xs...)
		if got := median(xs); got != c.want {
			t.Errorf("median(%v) = %d, want %d", c.xs, got, c.want)
		}
		for i := range xs {
			if xs[i] != c.xs[i] {
				t.Fatalf("median reordered its input: %v", xs)
			}
		}
	}
}

// run starts f and returns a channel of the limits it set after each
// collection, and a stop that waits for Run to return.
func run(t *testing.T, f *Follower) (<-chan int64, func()) {
	t.Helper()
	limits := make(chan int64, 1024)
	f.handled = func(_ uint64, limit int64) {
		select {
		case limits <- limit:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	return limits, func() {
		cancel()
		<-done
	}
}

// collect forces a collection and returns the limit f set after it.
func collect(t *testing.T, limits <-chan int64) int64 {
	t.Helper()
	for {
		runtime.GC()
		// The cleanup that wakes Run runs after the sweep of the next
		// collection at the latest; a second one makes sure it was queued.
		runtime.GC()
		l, ok := <-limits
		if !ok {
			t.Fatal("Run stopped")
		}
		// Drain the ones queued meanwhile: the last is the current one.
		for {
			select {
			case l = <-limits:
				continue
			default:
			}
			break
		}
		return l
	}
}

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var keep [][]byte

// TestFollower_HoldsTheHeapGoalThroughAPeak runs the Follower in this
// process: a live heap of 16 MiB for a dozen collections, then one
// collection that finds 40 MiB live. The runtime's own goal would follow
// that peak to about 80 MiB; the limit holds it at the median's.
func TestFollower_HoldsTheHeapGoalThroughAPeak(t *testing.T) {
	defer func() { keep = nil }()
	keep = [][]byte{make([]byte, 16*mib)}
	limits, stop := run(t, New(Options{Window: 16}))
	var steady int64
	for range 12 {
		steady = collect(t, limits)
	}
	if steady == math.MaxInt64 || steady < 2*16*mib || steady > 3*16*mib+16*mib {
		t.Fatalf("limit at a steady 16 MiB live heap = %d, want about 2.25 × 16 MiB plus the runtime's own", steady)
	}
	keep = append(keep, make([]byte, 24*mib))
	peak := collect(t, limits)
	if peak > 2*40*mib {
		t.Fatalf("limit after a peak of 40 MiB = %d MiB: followed the peak", peak/mib)
	}
	if goal := heapGoal(); goal > 2*40*mib-8*mib {
		t.Errorf("heap goal after the peak = %d MiB, want held by the limit (%d MiB)", goal/mib, peak/mib)
	}
	keep = keep[:1]
	stop()
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		t.Fatalf("limit after Run returned = %d, want the one before it (none)", l)
	}
}

// TestFollower_FollowsALiveHeapThatGrows: a live heap that quadruples for
// good is never held under a limit below 1.5 times itself, and once it is
// the median the limit is the median's again.
func TestFollower_FollowsALiveHeapThatGrows(t *testing.T) {
	defer func() { keep = nil }()
	keep = [][]byte{make([]byte, 16*mib)}
	limits, stop := run(t, New(Options{Window: 8}))
	defer stop()
	for range 8 {
		collect(t, limits)
	}
	keep = append(keep, make([]byte, 48*mib))
	// The first collection after the growth may be handled before it is
	// seen; the one after is not.
	collect(t, limits)
	if l := collect(t, limits); l < 96*mib {
		t.Fatalf("limit with 64 MiB live = %d MiB, want at least 1.5 times it", l/mib)
	}
	var l int64
	for range 8 {
		l = collect(t, limits)
	}
	if l < 2*64*mib {
		t.Fatalf("limit once 64 MiB is the median = %d MiB, want 2.25 times it", l/mib)
	}
}

func TestFollower_NothingWithGOGCOff(t *testing.T) {
	old := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(old)
	f := New(Options{})
	f.handled = func(uint64, int64) { t.Error("a collection handled with GOGC off") }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	runtime.GC()
	runtime.GC()
	cancel()
	<-done
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		t.Fatalf("limit = %d, want none", l)
	}
}

func TestFollower_KeepsUnderTheOperatorsLimit(t *testing.T) {
	old := debug.SetMemoryLimit(512 * mib)
	defer debug.SetMemoryLimit(old)
	keep = [][]byte{make([]byte, 240*mib)}
	defer func() { keep = nil }()
	limits, stop := run(t, New(Options{}))
	if l := collect(t, limits); l != 512*mib {
		t.Fatalf("limit with a 240 MiB live heap under GOMEMLIMIT=512MiB = %d MiB, want 512", l/mib)
	}
	stop()
	if l := debug.SetMemoryLimit(-1); l != 512*mib {
		t.Fatalf("limit after Run = %d, want the operator's back", l)
	}
}
