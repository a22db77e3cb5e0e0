package participant

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// Report describes one conversation as reconciliation finds it, without
// changing anything: what the offline tools (`participantctl inspect` and
// `verify`) print.
type Report struct {
	Conversation ConversationID `json:"conversation_id"`
	// OplogRows and OutboxRows count the stored rows.
	OplogRows  uint64 `json:"oplog_rows"`
	OutboxRows uint64 `json:"outbox_rows"`
	// Repairs is how many outbox rows reconciliation would append.
	Repairs int `json:"repairs"`
	// Refused is set when the conversation would be unloadable.
	Refused *Unloadable `json:"refused,omitempty"`
	// LastSeq is the seq of the last record.
	LastSeq Seq `json:"last_seq"`
	// Participants describes every participant, by id.
	Participants []ParticipantReport `json:"participants"`
}

// ParticipantReport describes one participant in a Report.
type ParticipantReport struct {
	Participant ParticipantID `json:"participant"`
	Generation  Generation    `json:"generation"`
	Retired     bool          `json:"retired"`
	Bound       bool          `json:"bound"`
	// Conn is the connection incarnation of the binding, when bound.
	Conn   string `json:"conn,omitempty"`
	Cursor Seq    `json:"cursor"`
}

// Inspect reconciles every registered conversation of st in dry run and
// reports what it finds; a conversation with a checkpoint is also replayed
// from row 0, while that row is stored, and compared with it. It only reads: it neither repairs nor ends
// bindings. An unreadable registry or a failing store is an error; a
// conversation that would be refused is reported with Refused set.
func Inspect(st store.DurableStore) ([]Report, error) {
	ids, err := readRegistry(st)
	if err != nil {
		return nil, err
	}
	p := pages{budget: newByteBudget(2 * DefaultReadPageBytes), bytes: DefaultReadPageBytes}
	out := make([]Report, 0, len(ids))
	for _, id := range ids {
		rep := Report{Conversation: id}
		if rep.OplogRows, err = st.Len(oplog.Stream(id)); err != nil {
			return nil, fmt.Errorf("participant: inspect %v: %w", id, err)
		}
		if rep.OutboxRows, err = st.Len(outbox.Stream(id)); err != nil {
			return nil, fmt.Errorf("participant: inspect %v: %w", id, err)
		}
		r, err := reconcile(context.Background(), st, id, p)
		if err == nil {
			err = rederive(context.Background(), st, id, p)
		}
		var ref *refusal
		switch {
		case errors.As(err, &ref):
			rep.Refused = &Unloadable{Conversation: id, Class: ref.class, Reason: ref.reason}
		case err != nil:
			return nil, fmt.Errorf("participant: inspect %v: %w", id, err)
		default:
			rep.Repairs = len(r.Repairs)
			rep.LastSeq = r.State.LastSeq
			for i, m := range r.State.Members {
				pr := ParticipantReport{
					Participant: ParticipantID(i),
					Generation:  m.Generation,
					Retired:     m.Retired,
					Bound:       m.Bound,
					Cursor:      m.Cursor,
				}
				if m.Bound {
					pr.Conn = m.Conn.String()
				}
				rep.Participants = append(rep.Participants, pr)
			}
		}
		out = append(out, rep)
	}
	return out, nil
}
