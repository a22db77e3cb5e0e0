package server

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestWorkPool_RunsEveryJobAndStopEndsItsWorkers: jobs handed to the pool
// from many goroutines at once, more than it keeps parked, all run once;
// after stop, jobs still run, and no worker outlives them (goleak, in
// TestMain, fails the package on a parked one left behind).
func TestWorkPool_RunsEveryJobAndStopEndsItsWorkers(t *testing.T) {
	p := newWorkPool()
	var ran atomic.Int64
	var wg sync.WaitGroup
	const senders, each = 8, 4 * maxIdleWorkers
	var senderWG sync.WaitGroup
	for range senders {
		senderWG.Go(func() {
			for range each {
				wg.Add(1)
				p.run(func() {
					ran.Add(1)
					wg.Done()
				})
			}
		})
	}
	senderWG.Wait()
	wg.Wait()
	if got := ran.Load(); got != senders*each {
		t.Fatalf("ran %d jobs, want %d", got, senders*each)
	}
	p.stop()
	wg.Add(1)
	p.run(func() { ran.Add(1); wg.Done() })
	wg.Wait()
	if got := ran.Load(); got != senders*each+1 {
		t.Fatalf("after stop, ran %d jobs, want %d", got, senders*each+1)
	}
}
