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
// and a function that stops its writer.
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
	if got, want := <-nc.writes, frames(a, b); !bytes.Equal(got, want) {
		t.Errorf("first write = %d bytes, want both frames (%d bytes) in one write", len(got), len(want))
	}
}

// A worker that knows deliveries are about to be pushed releases without
// a wake: its answers wait for the pump's frames and leave with them.
func TestOutq_ReleaseWithoutKickLeavesTheFramesToTheNextRelease(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	answer := &wire.Told{ID: 1, Conversation: 7, Seq: 3}
	delivery := &wire.Delivery{Conversation: 7, Recipient: 2, Seq: 4, Kind: wire.KindRecord, Participant: 1, Payload: []byte("x")}
	q.hold() // the worker
	q.sendHeld(answer)
	q.hold() // the pump
	q.release(false)
	if woken(q) {
		t.Fatal("a release without kick woke the writer")
	}
	q.sendHeld(delivery)
	q.release(true)
	if got, want := <-nc.writes, frames(answer, delivery); !bytes.Equal(got, want) {
		t.Errorf("first write = %d bytes, want the answer and the delivery (%d bytes) in one write", len(got), len(want))
	}
}

// The pump's release may come first, while the worker still holds: the
// kick it asked for is owed to the worker's release, whatever that one
// asks.
func TestOutq_LastReleaseWakesForAnEarlierReleasesKick(t *testing.T) {
	q, nc := newTestOutq(t, 1<<20)
	answer := &wire.Told{ID: 1, Conversation: 7, Seq: 3}
	delivery := &wire.Delivery{Conversation: 7, Recipient: 2, Seq: 4, Kind: wire.KindRecord, Participant: 1, Payload: []byte("x")}
	q.hold() // the worker
	q.sendHeld(answer)
	q.hold() // the pump
	q.sendHeld(delivery)
	q.release(true)
	if woken(q) {
		t.Fatal("the writer was woken while the worker still held")
	}
	q.release(false)
	if got, want := <-nc.writes, frames(answer, delivery); !bytes.Equal(got, want) {
		t.Errorf("first write = %d bytes, want the answer and the delivery (%d bytes) in one write", len(got), len(want))
	}
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
	if got, want := <-nc.writes, frames(pong); !bytes.Equal(got, want) {
		t.Errorf("write = %x, want the pong %x", got, want)
	}
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
	if got, want := <-nc.writes, frames(m, m); !bytes.Equal(got, want) {
		t.Errorf("first write = %d bytes, want the two held frames (%d bytes)", len(got), len(want))
	}
	q.release(true)
	if got, want := <-nc.writes, frames(m); !bytes.Equal(got, want) {
		t.Errorf("second write = %d bytes, want the third frame (%d bytes)", len(got), len(want))
	}
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
	if got, want := <-nc.writes, frames(m, bye); !bytes.Equal(got, want) {
		t.Errorf("write = %d bytes, want the held frame and the last one (%d bytes)", len(got), len(want))
	}
}
