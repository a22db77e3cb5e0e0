package client

import (
	"context"
	"sync"

	"github.com/participantd/participantd/wire"
)

// Kind is the kind of a delivered record: wire.KindRecord, wire.KindJoined,
// wire.KindAttached, wire.KindDetached, wire.KindDied or wire.KindLeft;
// or KindCompacted.
type Kind = wire.Kind

// KindCompacted is the kind of the Delivery that stands for the server's
// compacted push (docs/PROTOCOL.md, Compacted history): every record of
// the conversation below First no longer exists, and some addressed to
// Recipient were never delivered (the server released them
// unacknowledged, under its --max-unacked-age). The deliveries that
// follow continue from First. It carries no record: do not Ack it.
const KindCompacted Kind = "compacted"

// Cause is why a binding ended, for detached and died deliveries, or why
// a participant left, for an evicted one.
type Cause = wire.Cause

// Delivery is one record pushed to a participant this client holds.
type Delivery struct {
	Conversation uint64
	Recipient    uint64 // the participant it is addressed to
	Seq          uint64
	Kind         Kind
	// Participant is the sender of a record, or the participant the
	// lifecycle event is about.
	Participant uint64
	// Payload is the record of a KindRecord delivery; the receiver owns it.
	Payload []byte
	// Cause is set for KindDetached and KindDied, and for KindLeft when
	// the operator evicted the participant (wire.CauseEvicted); else empty.
	Cause Cause
	// First is set for KindCompacted only: the seq from which records of
	// Conversation still exist.
	First uint64
	// Credential is the latest credential the client held for Recipient
	// when the delivery arrived: pass it to Ack. (Ack always presents the
	// latest credential held, so it stays right after a re-attachment.)
	Credential Credential
}

// deliver takes a delivery from a reader: it drops a repeat (a seq at or
// below the highest delivered to its recipient in its conversation: each
// participant has a cursor of its own) and queues the rest.
func (c *Client) deliver(m *wire.Delivery) {
	k := key{m.Conversation, m.Recipient}
	c.mu.Lock()
	if !c.handed.fresh(k, false, m.Seq) {
		c.mu.Unlock()
		return
	}
	var cred Credential
	if mb := c.members[k]; mb != nil {
		cred = mb.cred
	}
	c.mu.Unlock()
	if c.opts.DiscardDeliveries {
		return
	}
	d := Delivery{
		Conversation: m.Conversation, Recipient: m.Recipient, Seq: m.Seq,
		Kind: m.Kind, Participant: m.Participant, Payload: m.Payload,
		Credential: cred,
	}
	if m.Cause != nil {
		d.Cause = *m.Cause
	}
	c.queue.push(c.ctx, d)
}

// compacted takes a compacted push from a reader: history below m.First
// is gone, some of it addressed to m.Recipient and never delivered. The
// caller learns it in order with the deliveries, as a KindCompacted
// Delivery, once per gap: a notice whose First is not past the last one
// handed on for its recipient (the server repeats it after a reconnect,
// or another node's) is a repeat, dropped.
func (c *Client) compacted(m *wire.Compacted) {
	c.mu.Lock()
	fresh := c.handed.fresh(key{m.Conversation, m.Recipient}, true, m.First)
	c.mu.Unlock()
	if fresh && !c.opts.DiscardDeliveries {
		c.queue.push(c.ctx, Delivery{Conversation: m.Conversation, Recipient: m.Recipient, Kind: KindCompacted, First: m.First})
	}
}

// handedOn is what a stream of deliveries handed on, per (conversation,
// recipient), so that repeats are dropped: a record at or below the
// highest seq handed on, a compacted notice whose first is not past the
// highest first handed on. Its owner guards it.
type handedOn struct {
	seqs   map[key]uint64
	firsts map[key]uint64
}

func newHandedOn() handedOn {
	return handedOn{seqs: make(map[key]uint64), firsts: make(map[key]uint64)}
}

// fresh reports whether a delivery to k is no repeat, and if so records
// it: a record at seq n, or (compacted) a notice that history below n is
// gone.
func (h *handedOn) fresh(k key, compacted bool, n uint64) bool {
	m := h.seqs
	if compacted {
		m = h.firsts
	}
	if n <= m[k] {
		return false
	}
	m[k] = n
	return true
}

// queue decouples readers from the deliveries channel, so that a caller
// that reads deliveries slowly does not stall the answers to its calls. It
// holds at most cap(slots) deliveries: push blocks beyond that.
type queue struct {
	wake  chan struct{} // capacity 1: a pending wake-up of pump
	slots chan struct{} // one token per queued delivery

	// mu guards items.
	mu    sync.Mutex
	items []Delivery
}

// push queues d, waiting for room while the queue is full or until ctx
// ends.
func (q *queue) push(ctx context.Context, d Delivery) {
	select {
	case q.slots <- struct{}{}:
	case <-ctx.Done():
		return
	}
	q.mu.Lock()
	q.items = append(q.items, d)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) take() []Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// pump moves queued deliveries to the channel until Close, then closes it.
func (c *Client) pump() {
	defer c.wg.Done()
	defer close(c.out)
	for {
		for _, d := range c.queue.take() {
			select {
			case c.out <- d:
				<-c.queue.slots
			case <-c.ctx.Done():
				return
			}
		}
		select {
		case <-c.queue.wake:
		case <-c.ctx.Done():
			return
		}
	}
}
