package server

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

// writesConn is a connection that hands every Write to the test, one
// slice per call, so that a test sees how frames were grouped into writes.
type writesConn struct {
	net.Conn // nil: only what the writer calls is implemented
	writes   chan []byte
}

func newWritesConn() *writesConn { return &writesConn{writes: make(chan []byte, 64)} }

func (c *writesConn) Write(b []byte) (int, error) {
	c.writes <- bytes.Clone(b)
	return len(b), nil
}
func (c *writesConn) SetWriteDeadline(time.Time) error { return nil }
func (c *writesConn) Close() error                     { return nil }

// newTestOutq returns a queue over a writesConn with room for own bytes,
// and the connection; the test's cleanup stops its writer.
func newTestOutq(t *testing.T, own int64) (*outq, *writesConn) {
	t.Helper()
	nc := newWritesConn()
	quit := make(chan struct{})
	shared := newSharedBudget(1<<20, 100, 1<<10)
	q := newOutq(nc, time.Hour, newBudget(own), shared.join(""), quit)
	t.Cleanup(func() {
		close(quit)
		q.finish(nil)
	})
	return q, nc
}

func frames(ms ...wire.Message) []byte {
	var b []byte
	for _, m := range ms {
		b = wire.AppendFrame(b, m)
	}
	return b
}

// wantWrite fails t unless the next write on nc is exactly the frames of
// ms; what names the write and what it should hold, for the message.
func wantWrite(t *testing.T, nc *writesConn, what string, ms ...wire.Message) {
	t.Helper()
	if got, want := <-nc.writes, frames(ms...); !bytes.Equal(got, want) {
		t.Errorf("%s = %d bytes, want %d bytes", what, len(got), len(want))
	}
}

// A worker's answer and the delivery its batch made due, of the tests
// that hold them together.
var (
	testAnswer   = &wire.Told{ID: 1, Conversation: 7, Seq: 3}
	testDelivery = &wire.Delivery{Conversation: 7, Recipient: 2, Seq: 4, Kind: wire.KindRecord, Participant: 1, Payload: []byte("x")}
)

// woken reports whether the writer has a wake pending (it is parked and
// nothing else can take the wake from the channel).
func woken(q *outq) bool { return len(q.ready) > 0 }

func TestOutq_HeldFramesLeaveInOneWriteAtRelease(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	a, b := &wire.Told{ID: 1, Conversation: 7, Seq: 3}, &wire.Acked{ID: 2, Conversation: 7, Participant: 1, Cursor: 2}
	q.hold()
	if !q.sendHeld(a) || !q.sendHeld(b) {
		t.Fatal("sendHeld = false on a running writer")
	}
	if woken(q) {
		t.Fatal("the writer was woken while the frames were held")
	}
	q.release(true)
	wantWrite(t, nc, "first write (both frames in one)", a, b)
}

// A worker that knows deliveries are about to be pushed releases without
// a wake: its answers wait for the pump's frames and leave with them.
func TestOutq_ReleaseWithoutKickLeavesTheFramesToTheNextRelease(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	q.hold() // the worker
	q.sendHeld(testAnswer)
	q.hold() // the pump
	q.release(false)
	if woken(q) {
		t.Fatal("a release without kick woke the writer")
	}
	q.sendHeld(testDelivery)
	q.release(true)
	wantWrite(t, nc, "first write (the answer and the delivery in one)", testAnswer, testDelivery)
}

// The pump's release may come first, while the worker still holds: the
// kick it asked for is owed to the worker's release, whatever that one
// asks.
func TestOutq_LastReleaseWakesForAnEarlierReleasesKick(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	q.hold() // the worker
	q.sendHeld(testAnswer)
	q.hold() // the pump
	q.sendHeld(testDelivery)
	q.release(true)
	if woken(q) {
		t.Fatal("the writer was woken while the worker still held")
	}
	q.release(false)
	wantWrite(t, nc, "first write (the answer and the delivery in one)", testAnswer, testDelivery)
}

// A frame sent by a goroutine outside the hold (a pong) is not lost when
// the holder releases without a kick.
func TestOutq_SendDuringAHoldIsWrittenAtTheRelease(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	pong := &wire.Pong{ID: 9}
	q.hold()
	if !q.send(pong) {
		t.Fatal("send = false on a running writer")
	}
	if woken(q) {
		t.Fatal("a send during a hold woke the writer")
	}
	q.release(false)
	wantWrite(t, nc, "write (the pong)", pong)
}

// Held frames may fill the connection's budget: the send that then needs
// room wakes the writer, which drains them, instead of waiting forever
// for the holder's release.
func TestOutq_SendIntoABudgetFullOfHeldFramesDrainsThem(t *testing.T) {
	m := &wire.Told{ID: 1, Conversation: 7, Seq: 3}
	size := int64(len(frames(m)))
	q, nc := newTestOutq(t, 2*size)
	q.hold()
	q.sendHeld(m)
	q.sendHeld(m)
	if woken(q) {
		t.Fatal("the writer was woken while the frames were held")
	}
	if !q.sendHeld(m) { // returns once the writer gave the room back
		t.Fatal("sendHeld = false on a running writer")
	}
	wantWrite(t, nc, "first write (the two held frames)", m, m)
	q.release(true)
	wantWrite(t, nc, "second write (the third frame)", m)
}

// The last frame goes out, with what a hold still holds, whatever the
// holds: teardown never waits for a release.
func TestOutq_FinishWritesHeldFrames(t *testing.T) {
	nc := newWritesConn()
	quit := make(chan struct{})
	defer close(quit)
	shared := newSharedBudget(1<<20, 100, 1<<10)
	q := newOutq(nc, time.Hour, newBudget(1<<20), shared.join(""), quit)
	m, bye := &wire.Told{ID: 1, Conversation: 7, Seq: 3}, &wire.ServerBye{Reason: wire.ByeShutdown}
	q.hold()
	q.sendHeld(m)
	q.finish(bye)
	wantWrite(t, nc, "write (the held frame and the last one)", m, bye)
}
