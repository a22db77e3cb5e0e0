package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/wire"
)

// Many participants over fewer connections (--conns): the tell shape's
// participants, each with its own window and its own cumulative acks,
// share K connections. The protocol lets a connection hold at most one
// binding per conversation (docs/PROTOCOL.md), so the two members of a
// conversation sit on different connections, and a delivery is for the one
// participant its connection holds in the delivery's conversation: the
// connection's demux finds it by conversation and checks the recipient.

// errConnsTooFew is spread's refusal: some conversation has more members
// than there are connections to hold them one each.
var errConnsTooFew = errors.New("bench: a connection holds at most one binding per conversation")

// spread assigns each participant (convOf[i] is participant i's
// conversation) one of k connections, round robin, skipping a connection
// that already holds a member of the same conversation. With k equal to
// the number of participants it is the identity. It returns
// errConnsTooFew when some conversation has more than k members.
func spread(convOf []int, k int) ([]int, error) {
	if k <= 0 {
		return nil, fmt.Errorf("bench: %d connections", k)
	}
	held := make([]map[int]bool, k)
	for j := range held {
		held[j] = map[int]bool{}
	}
	out := make([]int, len(convOf))
	for i, c := range convOf {
		placed := false
		for d := range k {
			j := (i + d) % k
			if !held[j][c] {
				held[j][c] = true
				out[i] = j
				placed = true
				break
			}
		}
		if !placed {
			return nil, fmt.Errorf("%w: conversation %d has more than %d members", errConnsTooFew, c, k)
		}
	}
	return out, nil
}

// demux routes the deliveries one shared connection reads to the workers
// bound on it. Its map is filled before the connection's reader starts and
// only read after, so it needs no lock.
type demux struct {
	byConv map[uint64]*worker
	// first is a worker of the connection, charged with a delivery for no
	// conversation the connection is bound in.
	first *worker
}

// deliver hands d to the worker bound in its conversation. A delivery for
// a conversation the connection holds no binding in, or for another
// recipient than the participant bound there, is the server's mistake: it
// is counted as an error of the worker of that conversation (or of any
// worker of the connection).
func (m *demux) deliver(d *wire.Delivery) {
	w := m.byConv[d.Conversation]
	if w == nil {
		if m.first != nil {
			m.first.fail(fmt.Errorf("delivery of conversation %d, seq %d on a connection bound in no such conversation", d.Conversation, d.Seq))
		}
		return
	}
	if p := w.bound.Load(); p != 0 && d.Recipient != p {
		w.fail(fmt.Errorf("delivery of conversation %d, seq %d for participant %d on the connection of participant %d", d.Conversation, d.Seq, d.Recipient, p))
		return
	}
	w.delivered(d)
}

// setupShared dials k connections, places the tell workers on them
// (spread) and enrolls each worker on its own. It is setup's path for
// --conns below the number of participants. On an error it closes the
// connections it dialed.
func (r *loadRun) setupShared(ctx context.Context, k int) (err error) {
	defer func() {
		if err != nil {
			r.close()
			r.conns = nil
		}
	}()
	convOf := make([]int, len(r.workers))
	for i, w := range r.workers {
		convOf[i] = int(w.conv &^ r.nonce)
	}
	place, err := spread(convOf, k)
	if err != nil {
		return err
	}
	r.conns = make([]*benchConn, 0, k)
	muxes := make([]*demux, k)
	for j := range muxes {
		muxes[j] = &demux{byConv: map[uint64]*worker{}}
	}
	for i, w := range r.workers {
		m := muxes[place[i]]
		m.byConv[w.conv] = w
		if m.first == nil {
			m.first = w
		}
	}
	for j := range k {
		c, err := dialBench(ctx, r.cfg.addr)
		if err != nil {
			return fmt.Errorf("connection %d: %w", j, err)
		}
		r.conns = append(r.conns, c)
		c.onDelivery = muxes[j].deliver
		c.start()
	}
	for i, w := range r.workers {
		w.conn = r.conns[place[i]]
	}
	return r.eachWorker(ctx, "participant", (*worker).enroll)
}
