package heapgoal

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"

	"github.com/rs/zerolog"
)

// Defaults of Options.
const (
	// DefaultWindow is the collections whose median live heap is followed.
	DefaultWindow = 64
	// DefaultGrowth bounds how far one collection's live heap raises the
	// limit at once: past Growth × the last live heap, a live heap that
	// grows for real is never held below its own size.
	DefaultGrowth = 1.5
	// headroom is added to the runtime's own factor (1 + GOGC/100) for
	// Factor's default, so that at the median the limit is above the
	// runtime's goal and only peaks meet it.
	headroom = 0.25
)

// Options configures a Follower; the zero value means the defaults.
type Options struct {
	// Window is the number of recent collections whose median live heap
	// the limit follows; 0 means DefaultWindow.
	Window int
	// Factor multiplies the median; 0 means the runtime's own factor at
	// the current GOGC plus a quarter (2.25 at GOGC=100).
	Factor float64
	// Growth multiplies the last collection's live heap for the limit's
	// lower bound; 0 means DefaultGrowth.
	Growth float64
	// Ceiling is the highest limit set, in bytes; 0 means the limit the
	// process started with (GOMEMLIMIT), none if it had none.
	Ceiling int64
	// Logger logs the start and the end; zero means none.
	Logger zerolog.Logger
}

// Follower sets the runtime's memory limit after each collection. Run
// owns it; at most one Follower may run in a process.
type Follower struct {
	o Options
	// gc receives a value after each collection (capacity 1: collections
	// that come while one is handled are handled once).
	gc chan struct{}
	// handled, when not nil, is called after each collection Run handled
	// with the limit then in force (tests).
	handled func(cycles uint64, limit int64)
}

// New returns a Follower with o's defaults filled in.
func New(o Options) *Follower {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Growth <= 0 {
		o.Growth = DefaultGrowth
	}
	return &Follower{o: o, gc: make(chan struct{}, 1)}
}

// Run sets the limit after each collection until ctx is done, then puts
// back the limit the process had before it and returns. With GOGC off
// (the runtime's goal then being the operator's memory limit alone) it
// changes nothing and waits for ctx.
func (f *Follower) Run(ctx context.Context) {
	initial := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(initial)
	ceiling := f.o.Ceiling
	if ceiling <= 0 {
		ceiling = initial // math.MaxInt64 without GOMEMLIMIT
	}
	r := newReader()
	gogc := r.gogc()
	if gogc < 0 {
		f.o.Logger.Info().Msg("heap goal: GOGC is off; the runtime's memory limit alone paces the collector")
		<-ctx.Done()
		return
	}
	factor := f.o.Factor
	if factor <= 0 {
		factor = 1 + float64(gogc)/100 + headroom
	}
	rule := rule{window: f.o.Window, factor: factor, growth: f.o.Growth, ceiling: ceiling}
	ev := f.o.Logger.Info().Int("window", rule.window).Float64("factor", rule.factor).
		Float64("growth", rule.growth)
	if ceiling < math.MaxInt64 {
		ev = ev.Int64("ceiling", ceiling)
	}
	ev.Msg("heap goal: the memory limit follows the median live heap")

	done := make(chan struct{})
	defer close(done)
	watchCollections(done, f.gc)
	lives := make([]uint64, 0, rule.window)
	var cycles uint64
	set := initial
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.gc:
		}
		s := r.read()
		if s.cycles == cycles || s.live == 0 {
			continue
		}
		cycles = s.cycles
		if len(lives) == rule.window {
			lives = append(lives[:0], lives[1:]...)
		}
		lives = append(lives, s.live)
		if l := rule.limit(lives, s.overhead); changed(set, l) {
			debug.SetMemoryLimit(l)
			set = l
		}
		if f.handled != nil {
			f.handled(cycles, set)
		}
	}
}

// changed reports whether limit next differs from the set one by more
// than 1/64 of it: setting the limit commits the pacer, not worth doing
// for noise.
func changed(set, next int64) bool {
	d := next - set
	if d < 0 {
		d = -d
	}
	return d > set/64
}

// watchCollections sends on gc (without blocking) after every collection
// until done is closed. A cleanup attached to an unreachable object runs
// once the collection that found it unreachable has swept; it arms the
// next one, so one is pending in every cycle.
func watchCollections(done <-chan struct{}, gc chan<- struct{}) {
	var arm func()
	arm = func() {
		// 16 bytes with a pointer: not from the tiny allocator, whose
		// blocks are freed together and may keep it reachable.
		s := &struct {
			p *byte
			_ [8]byte
		}{}
		runtime.AddCleanup(s, func(struct{}) {
			select {
			case <-done:
				return
			default:
			}
			select {
			case gc <- struct{}{}:
			default:
			}
			arm()
		}, struct{}{})
	}
	arm()
}

// rule is the limit's formula (the package doc).
type rule struct {
	window  int
	factor  float64
	growth  float64
	ceiling int64
}

// limit returns the memory limit for the live heaps of the last
// collections, oldest first (at least one), with overhead bytes of the
// runtime's memory outside the heap.
func (r rule) limit(lives []uint64, overhead uint64) int64 {
	last := float64(lives[len(lives)-1])
	goal := max(r.factor*float64(median(lives)), r.growth*last) + float64(overhead)
	if goal >= float64(r.ceiling) {
		return r.ceiling
	}
	return int64(math.Ceil(goal))
}

// median returns the median of xs (the lower of the middle two of an
// even count), which it does not modify.
func median(xs []uint64) uint64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// sample is what Run reads after a collection.
type sample struct {
	cycles   uint64 // collections completed
	live     uint64 // bytes the last collection marked live
	overhead uint64 // the runtime's mapped memory outside the heap
}

// reader reads samples from runtime/metrics.
type reader struct {
	s []metrics.Sample
}

// The metrics a reader reads, by their index in reader.s.
const (
	mCycles = iota
	mLive
	mTotal
	mHeapFree
	mHeapObjects
	mHeapReleased
	mHeapUnused
	mGOGC
)

func newReader() *reader {
	names := []string{
		mCycles:       "/gc/cycles/total:gc-cycles",
		mLive:         "/gc/heap/live:bytes",
		mTotal:        "/memory/classes/total:bytes",
		mHeapFree:     "/memory/classes/heap/free:bytes",
		mHeapObjects:  "/memory/classes/heap/objects:bytes",
		mHeapReleased: "/memory/classes/heap/released:bytes",
		mHeapUnused:   "/memory/classes/heap/unused:bytes",
		mGOGC:         "/gc/gogc:percent",
	}
	r := &reader{s: make([]metrics.Sample, len(names))}
	for i, n := range names {
		r.s[i].Name = n
	}
	return r
}

// read returns the current sample.
func (r *reader) read() sample {
	metrics.Read(r.s)
	u := func(i int) uint64 {
		if r.s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return r.s[i].Value.Uint64()
	}
	heap := u(mHeapFree) + u(mHeapObjects) + u(mHeapReleased) + u(mHeapUnused)
	var overhead uint64
	if t := u(mTotal); t > heap {
		overhead = t - heap
	}
	return sample{cycles: u(mCycles), live: u(mLive), overhead: overhead}
}

// gogc returns GOGC's current value, negative when it is off.
func (r *reader) gogc() int64 {
	metrics.Read(r.s)
	v := r.s[mGOGC].Value
	if v.Kind() != metrics.KindUint64 {
		return 100
	}
	// GOGC=off reads as -1 converted to uint64.
	if g := v.Uint64(); g <= math.MaxInt32 {
		return int64(g)
	}
	return -1
}
