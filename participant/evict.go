package participant

import (
	"context"
	"time"

	"github.com/participantd/participantd/oplog"
)

// Eviction is the operator's way out of what no client will undo: a member
// that never acknowledges pins its conversation's records (and its
// principal's share, share.go), and a leaked credential cannot be revoked
// by its holder's peers. Evict retires one participant as if it had left,
// and Drop every participant of a conversation: each is a Leave row with
// cause evicted and no token, committed through the usual two barriers
// (all of a Drop in one batch), so the records it was the last recipient
// of are reclaimed at once, its binding (if any) ends as a leave ends it,
// and the other members receive `left` with cause `evicted`. An evicted
// participant is retired: every later request of it is `retired`.
// Eviction decides nothing of a conversation that this service does not
// own: in cluster mode it is `moved`, with the owner, like any other
// operation.

// Evict retires participant p of conversation c on the operator's
// decision and returns the committed leave. Errors are *Error:
// unknown_participant (no such conversation or participant), retired (it
// left already), moved, shutting_down, unavailable or in_doubt.
func (s *Service) Evict(ctx context.Context, c ConversationID, p ParticipantID) (ended Ended, err error) {
	defer s.observe("evict", time.Now(), &err, "")
	cv, err := s.operatorEntry(ctx, c)
	if err != nil {
		return Ended{}, err
	}
	err = s.submit(ctx, cv, func(b *batch) func(error) error {
		if _, e := member(b.st, p); e != nil {
			return settled(e)
		}
		o, err := b.stageEvict(p)
		if err != nil {
			return settled(err)
		}
		return func(werr error) error {
			if werr == nil {
				ended = Ended{Conversation: c, Participant: p, Seq: o.row.Seq}
			}
			return werr
		}
	})
	return ended, err
}

// Drop evicts every participant of conversation c that has not left, in
// one batch, and returns the committed leaves (none when every participant
// had left). The conversation's records are all reclaimed then; its rows
// go after the retention period like any settled history. Errors are as
// Evict's, retired aside.
func (s *Service) Drop(ctx context.Context, c ConversationID) (ended []Ended, err error) {
	defer s.observe("drop", time.Now(), &err, "")
	cv, err := s.operatorEntry(ctx, c)
	if err != nil {
		return nil, err
	}
	err = s.submit(ctx, cv, func(b *batch) func(error) error {
		if b.st.Applied == 0 {
			return settled(refuse(CodeUnknownParticipant, "no conversation %v", c))
		}
		var ops []*op
		for i := range b.st.Members {
			p := ParticipantID(i)
			if b.st.Members[i].Retired {
				continue
			}
			o, err := b.stageEvict(p)
			if err != nil {
				// The ones staged before share the batch's outcome.
				return settled(err)
			}
			ops = append(ops, o)
		}
		return func(werr error) error {
			if werr == nil {
				for _, o := range ops {
					ended = append(ended, Ended{Conversation: c, Participant: o.row.Participant, Seq: o.row.Seq})
				}
			}
			return werr
		}
	})
	return ended, err
}

// operatorEntry returns the entry of conversation c for an operator's
// request, or the refusal: shutting_down, unknown_participant when c exists
// nowhere, unavailable when that cannot be told.
func (s *Service) operatorEntry(ctx context.Context, c ConversationID) (*conversation, error) {
	if s.isDraining() {
		return nil, refuse(CodeShuttingDown, "the server is draining")
	}
	if cv := s.existing(c); cv != nil {
		return cv, nil
	}
	cv, err := s.adopt(ctx, c)
	if err != nil {
		return nil, err
	}
	if cv == nil {
		return nil, refuse(CodeUnknownParticipant, "no conversation %v", c)
	}
	return cv, nil
}

// stageEvict stages the leave of member p with cause evicted, ending its
// binding if it has one.
func (b *batch) stageEvict(p ParticipantID) (*op, error) {
	m := b.st.Member(p)
	o := &op{row: oplog.Row{
		Kind:        oplog.KindLeave,
		Participant: p,
		Generation:  m.Generation,
		Conn:        m.Conn,
		Cause:       oplog.CauseEvicted,
		Seq:         b.st.LastSeq + 1,
		At:          b.s.now().UnixMilli(),
	}}
	if m.Bound {
		o.ending = b.endingOf(p)
		o.ended = &superseded{conn: m.Conn, p: p}
	}
	if err := b.stage(o); err != nil {
		return nil, err
	}
	return o, nil
}
