package server

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/wire"
)

// writeGroup is how many bytes of consecutive frames the writer hands the
// socket in one write, so that pipelined answers go out in few writes.
const writeGroup = 64 << 10

// outq is a connection's outbound queue and the writer goroutine that
// drains it into the socket. The queue is bounded in bytes, per connection
// and across the server: a send waits while either budget is spent
// (backpressure on the requests and the pump), and the bytes are given
// back as the writer hands them to the socket.
//
// Progress, not each write, has a deadline: every frame must be written
// within progress of being queued. A peer that reads nothing, or reads too
// slowly for the queue to move (a trickle), has its connection cut once
// the oldest frame waited that long; a fast peer never comes near it.
type outq struct {
	nc       net.Conn
	progress time.Duration
	// own and shared are the connection's and the server's outbound
	// budgets (one name per field: checklocks matches annotations to
	// fields by position, which a line declaring two fields shifts).
	own    *budget
	shared *holder
	// quit, when closed, makes sends that wait for room give up (the
	// connection is being torn down).
	quit <-chan struct{}

	// mu guards queue and stopped.
	mu sync.Mutex
	// +checklocks:mu
	queue []outFrame
	// stopped is set when the writer has stopped; nothing is queued after.
	// +checklocks:mu
	stopped bool

	// holders counts the goroutines queuing frames that belong together
	// (hold, release): while any does, a push does not wake the writer,
	// so that what they queue leaves in one write.
	holders atomic.Int32
	// owed is set when a frame was queued, or a hold released, that needs
	// the writer woken once holders is zero.
	owed atomic.Bool

	// ready wakes the writer; it holds at most one wake.
	ready chan struct{}
	// done is closed when the writer has stopped: after the last frame, or
	// after a failed write.
	done chan struct{}
	// frames counts frames written.
	frames atomic.Uint64
	// cut is set when a frame waited past the progress deadline; shed
	// when the server's outbound budget cut the connection (shares.go).
	cut  atomic.Bool
	shed atomic.Bool
}

// outCut is an outbound queue as a holding of the server's outbound
// budget that can be given up at once: its connection is closed, and the
// writer gives its bytes back as it stops.
type outCut struct{ q *outq }

func (o outCut) cut() {
	o.q.shed.Store(true)
	o.q.nc.Close()
}

func (o outCut) size() int64 { return o.q.own.inUse() }

type outFrame struct {
	b []byte
	// at is when the frame was queued; it must be written by at+progress.
	at   time.Time
	last bool
	// held is how many budget bytes the frame holds.
	held int64
	// timing is set for an answer whose write is timed.
	timing timing
}

// timing is what the writer needs to time an answer's write: its
// operation's series (nil: not timed), when its request was read and
// when the answer was handed to the queue (before any wait for budget).
type timing struct {
	stages       *opStages
	read, queued time.Time
}

func newOutq(nc net.Conn, progress time.Duration, own *budget, shared *holder, quit <-chan struct{}) *outq {
	q := &outq{nc: nc, progress: progress, own: own, shared: shared, quit: quit,
		ready: make(chan struct{}, 1), done: make(chan struct{})}
	shared.mayCut(outCut{q})
	go q.run()
	return q
}

// empty reports whether no frame is queued or being written.
func (q *outq) empty() bool { return q.own.inUse() == 0 }

// send queues m, waiting while the connection's or the server's outbound
// budget has no room for it, and wakes the writer, or, while a hold is on,
// leaves that to the last release. It returns false when the writer has
// stopped, or quit was closed while it waited; m is then dropped.
func (q *outq) send(m wire.Message) bool {
	if !q.enqueue(m) {
		return false
	}
	// owed before holders: a release that brings holders to zero after
	// this load sees it.
	q.owed.Store(true)
	if q.holders.Load() == 0 {
		q.wake()
	}
	return true
}

// sendHeld is send for a goroutine within a hold (hold): m is queued and
// the writer is woken by a release.
func (q *outq) sendHeld(m wire.Message) bool { return q.enqueue(m) }

// sendHeldTimed is sendHeld for an answer whose write the writer times
// with t.
func (q *outq) sendHeldTimed(m wire.Message, t timing) bool { return q.enqueueTimed(m, t) }

// enqueue queues m once the budgets have room for it.
func (q *outq) enqueue(m wire.Message) bool { return q.enqueueTimed(m, timing{}) }

// enqueueTimed is enqueue for a frame timed with t.
func (q *outq) enqueueTimed(m wire.Message, t timing) bool {
	b := wire.AppendFrame(nil, m)
	// Frames fit the budgets (Config validation); the clamp keeps an
	// oversized one from waiting forever.
	n := min(int64(len(b)), q.own.limit)
	// Frames held back (hold) may be what fills the budget: the writer
	// must drain them before this send can have room.
	if !takeOr(n, q.done, q.quit, q.kick, q.own, q.shared) {
		return false
	}
	return q.push(outFrame{b: b, at: time.Now(), held: n, timing: t})
}

// push appends f to the queue, or gives f's bytes back if the writer has
// stopped. The caller wakes the writer.
func (q *outq) push(f outFrame) bool {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		q.give(f.held)
		return false
	}
	q.queue = append(q.queue, f)
	q.mu.Unlock()
	return true
}

// wake wakes the writer.
func (q *outq) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// kick wakes the writer if a frame is queued.
func (q *outq) kick() {
	q.mu.Lock()
	n := len(q.queue)
	q.mu.Unlock()
	if n > 0 {
		q.wake()
	}
}

// hold defers waking the writer for the frames queued until the matching
// release, and until every other hold is released: frames that are ready
// together (the answers of one batch, the deliveries it made due) then
// leave in one write, and the peer reads them in one read, where the
// writer, woken by the first, would take them one write each. The holder
// queues with sendHeld. A send that must wait for budget wakes the writer
// first, so a hold never keeps its frames from draining into a full
// budget; it delays them only while its holder runs.
func (q *outq) hold() { q.holders.Add(1) }

// release ends a hold. kick says the frames the holder queued need the
// writer woken; false leaves them to a goroutine the caller knows will
// send or release soon (the pump, with deliveries ready), so that they
// leave with its frames. The last release wakes the writer if any release
// or send since the previous wake asked for it.
func (q *outq) release(kick bool) {
	if kick {
		q.owed.Store(true)
	}
	if q.holders.Add(-1) == 0 && q.owed.Swap(false) {
		q.kick()
	}
}

func (q *outq) give(n int64) {
	q.own.give(n)
	q.shared.give(n)
}

// finish queues m (if not nil) as the last frame and waits for the writer
// to write it, or to fail. Nothing is sent after it. The last frame takes
// no budget, so finish never waits for room.
func (q *outq) finish(m wire.Message) {
	f := outFrame{last: true, at: time.Now()}
	if m != nil {
		f.b = wire.AppendFrame(nil, m)
	}
	q.push(f)
	q.wake()
	<-q.done
}

func (q *outq) run() {
	var batch []outFrame
	i := 0 // batch[:i] is written
	// group is what a group of frames is copied into, made for the first
	// write that groups and kept while the writer runs: a connection
	// that never pipelines holds none, and one that does copies without
	// borrowing (a buffer lent from a pool for each write was lost at
	// every collection, and remade).
	var group []byte
	defer func() {
		q.mu.Lock()
		q.stopped = true
		rest := q.queue
		q.queue = nil
		q.mu.Unlock()
		var held int64
		for _, f := range batch[i:] {
			held += f.held
		}
		for _, f := range rest {
			held += f.held
		}
		q.shared.unmayCut(outCut{q})
		q.give(held)
		close(q.done)
	}()
	for {
		<-q.ready
		q.mu.Lock()
		batch, q.queue = q.queue, batch[:0]
		q.mu.Unlock()
		for i = 0; i < len(batch); {
			// Group consecutive frames into one write; its deadline is the
			// first one's.
			j, size := i, 0
			for j < len(batch) && (j == i || size+len(batch[j].b) <= writeGroup) && (j == i || !batch[j-1].last) {
				size += len(batch[j].b)
				j++
			}
			// One write per group whatever the connection (a TLS record
			// each, not one per frame): small frames are copied together.
			out := batch[i].b
			if j-i > 1 {
				if group == nil {
					group = make([]byte, 0, writeGroup)
				}
				group = group[:0]
				for _, f := range batch[i:j] {
					group = append(group, f.b...)
				}
				out = group
			}
			deadline := batch[i].at.Add(q.progress)
			q.nc.SetWriteDeadline(deadline)
			_, err := q.nc.Write(out)
			if err != nil {
				if !time.Now().Before(deadline) {
					q.cut.Store(true)
				}
				q.nc.Close() // the reader sees the loss
				return
			}
			var (
				held    int64
				last    bool
				written time.Time
			)
			for k := i; k < j; k++ {
				f := &batch[k]
				held += f.held
				if f.b != nil {
					q.frames.Add(1)
				}
				if f.timing.stages != nil {
					if written.IsZero() {
						written = time.Now()
					}
					f.timing.stages.written(f.timing.read, f.timing.queued, written)
				}
				last = f.last
				*f = outFrame{} // written: let its bytes go
			}
			i = j
			q.give(held)
			if last {
				return
			}
		}
		clear(batch)
	}
}
