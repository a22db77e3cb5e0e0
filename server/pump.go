package server

import (
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// pumpBatch is how many deliveries of one conversation the pump pushes
// before turning to the next ready one, so that a busy conversation does
// not starve the others.
const pumpBatch = 64

// pump pushes deliveries: woken by the service, it takes the ready
// conversations and pushes each one's records in order, each continuing
// after what the connection last offered (the service remembers it per
// binding). Pushing blocks while the outbound queue is full.
func (c *conn) pump() {
	defer close(c.pumpDone)
	var round []participant.ConversationID
	queued := make(map[participant.ConversationID]bool)
	for {
		if len(round) == 0 {
			select {
			case <-c.wake:
			case <-c.quit:
				return
			}
		}
		for _, conv := range c.pc.TakeReady() {
			if !queued[conv] {
				queued[conv] = true
				round = append(round, conv)
			}
		}
		var next []participant.ConversationID
		for _, conv := range round {
			more, ok := c.pushSome(conv)
			if !ok {
				return
			}
			if more {
				next = append(next, conv)
			} else {
				delete(queued, conv)
			}
			select {
			case <-c.quit:
				return
			default:
			}
		}
		round = next
	}
}

// pushSome pushes up to pumpBatch deliveries of conv under one hold of the
// outbound queue, so that they leave together, with any answer a worker
// queued meanwhile (conn.work leaves its answers to the pump's release
// when deliveries are ready). It reports whether conv may have more, and
// false if the writer is gone.
func (c *conn) pushSome(conv participant.ConversationID) (more, ok bool) {
	c.out.hold()
	defer c.out.release(true)
	for range pumpBatch {
		d, ok := c.pc.Next(conv)
		if !ok {
			return false, true
		}
		if !c.out.sendHeld(delivery(d)) {
			return false, false
		}
		if d.First != 0 {
			c.srv.metrics.compactedNotice()
		} else {
			c.srv.metrics.delivered()
		}
	}
	return true, true
}

// delivery converts a service delivery to its push: a delivery, or the
// compacted notice.
func delivery(d participant.Delivery) wire.Message {
	if d.First != 0 {
		return &wire.Compacted{Conversation: uint64(d.Conversation), Recipient: uint64(d.Recipient), First: uint64(d.First)}
	}
	w := &wire.Delivery{
		Conversation: uint64(d.Conversation),
		Recipient:    uint64(d.Recipient),
		Seq:          uint64(d.Seq),
		Kind:         wire.Kind(d.Kind.String()),
		Participant:  uint64(d.Participant),
	}
	if w.Kind == wire.KindRecord {
		w.Payload = d.Payload
		if w.Payload == nil {
			w.Payload = []byte{}
		}
	}
	if d.Cause != oplog.CauseNone {
		w.Cause = ptr(wire.Cause(d.Cause.String()))
	}
	return w
}
