package client

import (
	"sync"

	"github.com/participantd/participantd/wire"
)

// Kind is the kind of a delivered record: wire.KindRecord, wire.KindJoined,
// wire.KindAttached, wire.KindDetached, wire.KindDied or wire.KindLeft.
type Kind = wire.Kind

// Cause is why a binding ended, for detached and died deliveries.
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
	// Cause is set for KindDetached and KindDied, else empty.
	Cause Cause
}

// deliver takes a delivery from a reader: it drops a repeat (a seq at or
// below the highest delivered in its conversation) and queues the rest.
func (c *Client) deliver(m *wire.Delivery) {
	c.mu.Lock()
	if m.Seq <= c.seen[m.Conversation] {
		c.mu.Unlock()
		return
	}
	c.seen[m.Conversation] = m.Seq
	c.mu.Unlock()
	if c.opts.DiscardDeliveries {
		return
	}
	d := Delivery{
		Conversation: m.Conversation, Recipient: m.Recipient, Seq: m.Seq,
		Kind: m.Kind, Participant: m.Participant, Payload: m.Payload,
	}
	if m.Cause != nil {
		d.Cause = *m.Cause
	}
	c.queue.push(d)
}

// queue decouples readers from the deliveries channel, so that a caller
// that does not read deliveries never stalls the answers to its calls.
type queue struct {
	wake chan struct{} // capacity 1: a pending wake-up of pump

	// mu guards items.
	mu    sync.Mutex
	items []Delivery
}

func (q *queue) push(d Delivery) {
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
