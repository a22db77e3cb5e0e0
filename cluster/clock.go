package cluster

import "time"

// Clock is what a node measures its lease's local deadline by: two clocks,
// because neither alone is safe. The monotonic clock never jumps but, on
// Linux, stops while the machine is suspended, so a VM resumed after a
// suspend longer than the lease would believe it still holds it; the boot
// clock keeps counting through a suspend. The deadline holds only while
// both say it does.
//
// Options.Clock injects one, so that a test can model a suspend (the
// monotonic clock frozen, the boot clock advanced) or a stall.
type Clock interface {
	// Monotonic returns the reading of a clock that never jumps and may
	// stop while the machine is suspended.
	Monotonic() time.Duration
	// Boot returns the reading of a clock that keeps counting while the
	// machine is suspended: CLOCK_BOOTTIME on Linux, the wall clock
	// elsewhere (which may jump: a forward jump only loses the lease
	// early, a backward one is bounded by the monotonic clock).
	Boot() time.Duration
}

// systemClock is the Clock of the zero Options.
type systemClock struct{ start time.Time }

func (c systemClock) Monotonic() time.Duration { return time.Since(c.start) }
func (systemClock) Boot() time.Duration        { return bootTime() }

// reading is the two clocks of a Clock read at one instant.
type reading struct{ mono, boot time.Duration }

func readClock(c Clock) reading { return reading{c.Monotonic(), c.Boot()} }

// add returns r moved d later on both clocks.
func (r reading) add(d time.Duration) reading { return reading{r.mono + d, r.boot + d} }

// before reports whether r is before d on both clocks: a deadline d holds
// at r only then.
func (r reading) before(d reading) bool { return r.mono < d.mono && r.boot < d.boot }
