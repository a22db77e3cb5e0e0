package server

import (
	"bufio"
	"net"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/wire"
)

// outqLen is how many frames may wait for the writer; past it, answers and
// pushes block (backpressure on the requests and the pump).
const outqLen = 256

// outq is a connection's outbound queue and the writer goroutine that
// drains it into the socket, flushing when the queue runs empty, so that
// pipelined answers go out in few writes.
type outq struct {
	nc           net.Conn
	writeTimeout time.Duration
	ch           chan outFrame
	// done is closed when the writer has stopped: after the last frame, or
	// after a failed write.
	done chan struct{}
	// frames counts frames written.
	frames atomic.Uint64
}

type outFrame struct {
	b    []byte
	last bool
}

func newOutq(nc net.Conn, writeTimeout time.Duration) *outq {
	q := &outq{nc: nc, writeTimeout: writeTimeout, ch: make(chan outFrame, outqLen), done: make(chan struct{})}
	go q.run()
	return q
}

// send queues m, waiting while the queue is full. It returns false when the
// writer has stopped; m is then dropped.
func (q *outq) send(m wire.Message) bool {
	select {
	case <-q.done:
		return false
	default:
	}
	select {
	case q.ch <- outFrame{b: wire.AppendFrame(nil, m)}:
		return true
	case <-q.done:
		return false
	}
}

// finish queues m (if not nil) as the last frame and waits for the writer
// to write and flush it, or to fail. Nothing is sent after it.
func (q *outq) finish(m wire.Message) {
	f := outFrame{last: true}
	if m != nil {
		f.b = wire.AppendFrame(nil, m)
	}
	select {
	case q.ch <- f:
	case <-q.done:
	}
	<-q.done
}

func (q *outq) run() {
	defer close(q.done)
	bw := bufio.NewWriterSize(deadlineWriter{q.nc, q.writeTimeout}, 64<<10)
	for f := range q.ch {
		if _, err := bw.Write(f.b); err != nil {
			q.nc.Close() // the reader sees the loss
			return
		}
		if f.b != nil {
			q.frames.Add(1)
		}
		if f.last || len(q.ch) == 0 {
			if err := bw.Flush(); err != nil {
				q.nc.Close()
				return
			}
		}
		if f.last {
			return
		}
	}
}

// deadlineWriter gives every write to the socket its own deadline, so that a
// peer that stops reading for that long is cut off.
type deadlineWriter struct {
	nc      net.Conn
	timeout time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.nc.Write(p)
}
