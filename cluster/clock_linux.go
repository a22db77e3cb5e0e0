package cluster

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootTime reads CLOCK_BOOTTIME: monotonic, and counting a suspend.
func bootTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Every Linux since 2.6.39 has it; fall back to the wall clock.
		return time.Duration(time.Now().UnixNano())
	}
	return time.Duration(ts.Nano())
}
