package participant

import "github.com/participantd/participantd/outbox"

// Status is a snapshot of one conversation as this service holds it, for
// operators (the daemon's conversation status endpoint). It holds no
// secret: secrets are never stored, and the conversation's nonce is left
// out.
type Status struct {
	Conversation ConversationID
	// Held reports whether this service has the right to serve the
	// conversation now (Ownership.Holds): always on a single node; in
	// cluster mode, while this node owns it under a live lease.
	Held bool
	// Loaded reports whether its reconciled state is in memory. When it is
	// not (dropped after a failed commit and not reloaded yet, forgotten
	// with its ownership, or contained), the fields below Unloadable are
	// zero.
	Loaded bool
	// Unloadable is set when reconciliation contained the conversation.
	Unloadable *Unloadable
	// Applied is the number of oplog rows applied, LastSeq the seq of the
	// last record (0 before the first).
	Applied uint64
	LastSeq Seq
	// Retained is how many records the conversation keeps until every
	// recipient acknowledged them (its backlog), from FirstRetained (0
	// when none) to LastSeq; PayloadBytes and EvictedBytes are their
	// payload bytes held in memory and dropped from it (read back from
	// the oplog when delivered).
	Retained      int
	FirstRetained Seq
	PayloadBytes  int64
	EvictedBytes  int64
	// Participants are every member, retired ones included, by id.
	Participants []ParticipantStatus
}

// ParticipantStatus is one member of a conversation in a Status.
type ParticipantStatus struct {
	Participant ParticipantID
	// Generation is the current credential generation; a binding, when
	// Bound, is of this generation.
	Generation Generation
	Retired    bool
	// Bound reports a live binding, on connection Conn.
	Bound bool
	Conn  ConnID
	// Acked is the durable cursor: every record addressed to the
	// participant through it is acknowledged.
	Acked Seq
	// Offered is, when Bound, the last seq handed to the binding's
	// connection to push (Conn.Next; it may still wait in the
	// connection's outbound queue), or Acked if that is higher
	// (deliveries resume after it); 0 when unbound.
	Offered Seq
	// Unacked is how many retained records addressed to the participant
	// lie above its cursor: what it holds its conversation's history back
	// with.
	Unacked int
	// Released is the last record addressed to it that was released
	// unacknowledged (Options.MaxUnackedAge) while its cursor is below it;
	// 0 when none.
	Released Seq
}

// Status returns a snapshot of conversation id as this service holds it,
// and false when the service knows no such conversation (never registered
// here; in cluster mode also one this node never touched). It reads the
// state under the conversation's read lock and takes no turn, so it
// neither loads nor claims anything, and waits behind no commit; the
// returned slices are the caller's.
func (s *Service) Status(id ConversationID) (Status, bool) {
	cv := s.existing(id)
	if cv == nil {
		return Status{}, false
	}
	out := Status{Conversation: id, Held: s.ownership().Holds(id)}
	var recs []retainedMeta
	cv.mu.RLock()
	st := cv.state
	if cv.unloadable != nil {
		u := *cv.unloadable
		out.Unloadable = &u
	}
	if st != nil {
		out.Loaded = true
		out.Applied, out.LastSeq = st.Applied, st.LastSeq
		out.Retained, out.PayloadBytes, out.EvictedBytes = st.Records.Len(), st.PayloadBytes, st.EvictedBytes
		if st.Records.Len() > 0 {
			out.FirstRetained = st.Records.First()
		}
		out.Participants = make([]ParticipantStatus, 0, len(st.Members))
		for i, m := range st.Members {
			out.Participants = append(out.Participants, memberStatus(ParticipantID(i), &m))
		}
		// Only seqs and recipient lists are copied: the lists are never
		// written once made, so they are counted below, outside the lock.
		recs = make([]retainedMeta, st.Records.Len())
		for i, r := range st.Records.All() {
			recs[i] = retainedMeta{seq: r.Seq, recipients: r.Recipients()}
		}
	}
	cv.mu.RUnlock()
	if !out.Loaded && out.Unloadable == nil && !cv.registered.Load() {
		// An entry only an enroll in flight holds: nothing is stored yet.
		return Status{}, false
	}
	for _, r := range recs {
		for _, p := range r.recipients {
			if ps := &out.Participants[p]; !ps.Retired && ps.Acked < r.seq {
				ps.Unacked++
			}
		}
	}
	s.addOffered(id, out.Participants)
	return out, true
}

// retainedMeta is what Status counts of a retained record.
type retainedMeta struct {
	seq        Seq
	recipients []ParticipantID
}

func memberStatus(p ParticipantID, m *outbox.Member) ParticipantStatus {
	ps := ParticipantStatus{Participant: p, Generation: m.Generation, Retired: m.Retired, Bound: m.Bound, Acked: m.Cursor}
	if m.Cursor < m.Released {
		ps.Released = m.Released
	}
	if m.Bound {
		ps.Conn = m.Conn
	}
	return ps
}

// addOffered sets Offered of each bound participant of conversation id
// from what its connection was last handed for that very binding (same
// connection and generation). Service.mu and each Conn's mu are
// taken alone, as the lock order asks (no conversation lock is held).
func (s *Service) addOffered(id ConversationID, ps []ParticipantStatus) {
	for i := range ps {
		p := &ps[i]
		if !p.Bound {
			continue
		}
		p.Offered = p.Acked
		c := s.conn(p.Conn)
		if c == nil {
			continue
		}
		c.mu.Lock()
		o, ok := c.offered[id]
		c.mu.Unlock()
		if ok && o.Epoch == (Epoch{Conn: p.Conn, Generation: p.Generation}) {
			p.Offered = max(o.Through, p.Offered)
		}
	}
}
