package server

import "sync/atomic"

// maxIdleWorkers bounds the conversation workers the server keeps parked
// between requests: enough for every connection of a busy node at one
// request in flight to find one, few enough that what their stacks hold
// stays small (the collector also shrinks the stack of a parked one).
const maxIdleWorkers = 128

// workPool runs the connections' conversation workers (conn.work) on
// goroutines that outlive one queue: a worker that ran out of requests
// parks for the next conversation that needs one instead of exiting.
// Started afresh for every request (at one request in flight each queue
// holds one), a worker's stack grew again through decide and commit at
// every request: stack copying took 5 % of the CPU of the tell benchmark
// at window 1, and a parked worker is woken as cheaply as a new one is
// started.
type workPool struct {
	// jobs hands a job to a parked worker; unbuffered, so that a send
	// succeeds only when one is parked.
	jobs chan func()
	// quit, closed by stop, sends the parked workers away; a busy one
	// exits once its job returns.
	quit chan struct{}
	idle atomic.Int32
}

func newWorkPool() *workPool {
	return &workPool{jobs: make(chan func()), quit: make(chan struct{})}
}

// run runs f on a parked worker, or on a new one if none is parked.
func (p *workPool) run(f func()) {
	select {
	case p.jobs <- f:
	default:
		go p.loop(f)
	}
}

func (p *workPool) loop(f func()) {
	for {
		f()
		if p.idle.Add(1) > maxIdleWorkers {
			p.idle.Add(-1)
			return
		}
		select {
		case f = <-p.jobs:
			p.idle.Add(-1)
		case <-p.quit:
			p.idle.Add(-1)
			return
		}
	}
}

// stop sends the parked workers away, and every busy one once its job
// returns; run still runs what it is given, each job on a goroutine that
// ends with it.
func (p *workPool) stop() { close(p.quit) }
