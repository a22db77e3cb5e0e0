package participant

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	// TokenFloor is the conversation's persisted token floor (The token
	// window): tokens drawn before it may have been forgotten. Zero when
	// no window ever compacted the conversation.
	TokenFloor time.Time `json:"token_floor,omitzero"`
}

// ClassTokenIndexMissing is a finding of Inspect only (a start does not
// look for it): a stored token-bearing oplog row whose token index entry
// does not name it, although the token window did not forget its token.
// A retry of that token would commit a second time.
const ClassTokenIndexMissing = "token_index_missing"

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
// from row 0, while that row is stored, and compared with it. Of a
// conversation that reconciles it then checks the token index
// (checkTokens): a stored row's token that a retry would not find is
// refused ClassTokenIndexMissing. It only reads: it neither repairs nor ends
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
		floor, err := st.ReadValue(windowKey(id))
		if err != nil {
			return nil, fmt.Errorf("participant: inspect %v: token floor: %w", id, err)
		}
		if floor > 0 {
			rep.TokenFloor = time.UnixMilli(int64(floor)).UTC()
		}
		r, err := reconcile(context.Background(), st, id, p)
		if err == nil {
			err = rederive(context.Background(), st, id, p)
		}
		if err == nil {
			err = checkTokens(context.Background(), st, id, p, int64(floor))
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

// checkTokens checks that every token-bearing row of c's oplog still
// stored, from the stream's first row to its end, has the token index
// entry a retry of its token looks up, naming that row; except a row
// whose token is a UUIDv7 below floor, c's persisted token floor, whose
// entry compaction may have deleted (docs/DESIGN.md, The token window)
// before trimming the row. A row that breaks it is a
// ClassTokenIndexMissing refusal, one that does not decode a
// ClassOplogCorrupt one (rows below a checkpoint are not replayed, so it
// may be the first to read them). It reads the rows a page at a time,
// holding one page of p's budget, and one index entry per token-bearing
// row, so a start does not run it.
func checkTokens(ctx context.Context, st store.DurableStore, c ConversationID, p pages, floor int64) error {
	held, err := p.budget.acquire(ctx, int64(p.bytes))
	if err != nil {
		return fmt.Errorf("participant: waiting to read %v: %w", c, err)
	}
	defer p.budget.release(held)
	first, err := streamFirst(st, oplog.Stream(c))
	if err != nil {
		return err
	}
	ops, err := newPageReader(st, oplog.Stream(c), p.bytes, first)
	if err != nil {
		return err
	}
	for i := first; ops.more(); i++ {
		b, err := ops.entry()
		if err != nil {
			return err
		}
		row, err := oplog.Decode(b)
		if err != nil {
			return &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", i, err)}
		}
		if !row.Kind.HasToken() {
			continue
		}
		key := rowTokenKey(c, &row)
		v, err := st.ReadValue(key)
		if err != nil {
			return fmt.Errorf("participant: read %s: %w", key, err)
		}
		if v == i+1 {
			continue
		}
		if ms, v7 := tokenTime(row.Token); v7 && ms < floor {
			// Forgotten under the window; the row awaits its trim.
			continue
		}
		names := "is absent"
		if v > 0 {
			names = fmt.Sprintf("names oplog row %d", v-1)
		}
		return &refusal{ClassTokenIndexMissing, fmt.Sprintf(
			"oplog row %d (%v of participant %d, token %v): its token index entry %s; a retry of the token would commit again",
			i, row.Kind, row.Participant, row.Token, names)}
	}
	return nil
}
