package participant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// Report describes one conversation as reconciliation finds it, without
// changing anything: what the offline tools (`participantctl inspect` and
// `verify`) print.
type Report struct {
	Conversation ConversationID `json:"conversation_id"`
	// OplogRows and OutboxRows count the stored rows: those appended
	// minus those compaction trimmed, which OplogCompacted and
	// OutboxCompacted count.
	OplogRows       uint64 `json:"oplog_rows"`
	OutboxRows      uint64 `json:"outbox_rows"`
	OplogCompacted  uint64 `json:"oplog_compacted,omitempty"`
	OutboxCompacted uint64 `json:"outbox_compacted,omitempty"`
	// Repairs is how many outbox rows reconciliation would append.
	Repairs int `json:"repairs"`
	// Refused is set when the conversation would be unloadable.
	Refused *Unloadable `json:"refused,omitempty"`
	// Deleted is set when every participant had left the conversation and
	// it was deleted (its oplog ends with a Delete row); nothing else is
	// reported of it.
	Deleted bool `json:"deleted,omitempty"`
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
	p := pages{budget: newByteBudget(2 * DefaultReadPageBytes), bytes: DefaultReadPageBytes, window: DefaultBacklogWindowBytes}
	out := make([]Report, 0, len(ids))
	for _, id := range ids {
		rep := Report{Conversation: id}
		rep.OplogRows, rep.OplogCompacted, err = storedRows(st, oplog.Stream(id))
		if err == nil {
			rep.OutboxRows, rep.OutboxCompacted, err = storedRows(st, outbox.Stream(id))
		}
		if err != nil {
			// A stream's length may be read from a stored entry (the
			// etcd store's last run): damage there is the
			// conversation's, as it is in any other row.
			var ref *refusal
			if errors.As(corruptRefusal(err), &ref) {
				rep.Refused = &Unloadable{Conversation: id, Class: ref.class, Reason: ref.reason}
				out = append(out, rep)
				continue
			}
			return nil, fmt.Errorf("participant: inspect %v: %w", id, err)
		}
		floor, err := st.ReadValue(tokenindex.FloorKey(id))
		if err != nil {
			return nil, fmt.Errorf("participant: inspect %v: token floor: %w", id, err)
		}
		if floor > 0 {
			rep.TokenFloor = time.UnixMilli(int64(floor)).UTC()
		}
		r, err := reconcile(context.Background(), st, id, p)
		if err == nil && r.Deleted {
			rep.Deleted = true
			out = append(out, rep)
			continue
		}
		if err == nil {
			err = rederive(context.Background(), st, id, p)
		}
		if err == nil {
			err = checkTokens(context.Background(), st, id, p, int64(floor))
		}
		err = corruptRefusal(err)
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

// storedRows returns how many rows of stream st still stores and how many
// compaction trimmed: Len counts every row ever appended, since seqs never
// move, and First is where the stored ones begin.
func storedRows(st store.DurableStore, stream string) (stored, trimmed uint64, err error) {
	n, err := st.Len(stream)
	if err != nil {
		return 0, 0, err
	}
	first, err := streamFirst(st, stream)
	if err != nil {
		return 0, 0, err
	}
	return n - first, first, nil
}

// checkTokens checks that every token-bearing row of c's oplog still
// stored, from the stream's first row to its end, is found by a retry of
// its token through the lookup the live path makes (liveLookup's scope
// and match, tokenindex.Key, indexedRow, which reads the row the
// entry names and checks it committed the token); except a row
// whose token is a UUIDv7 below floor, c's persisted token floor, whose
// entry compaction may have deleted (docs/DESIGN.md, The token window)
// before trimming the row. The first row, by index, that breaks it is a
// ClassTokenIndexMissing refusal; one that does not decode a
// ClassOplogCorrupt one (rows below a checkpoint are not replayed, so it
// may be the first to read them). It reads the rows a page at a time,
// holding one page of p's budget, and the entries of up to
// tokenCheckRows rows at once, prefetchParallelism at a time (one round
// trip each on etcd). Reading every row's entry is why a start does not
// run it.
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
	batch := make([]tokenCheck, 0, tokenCheckRows)
	check := func() error { return checkTokenBatch(st, c, ops.end, batch, floor) }
	for i := first; ops.more(); i++ {
		b, err := ops.entry()
		if err != nil {
			return err
		}
		row, err := oplog.Decode(b)
		if err != nil {
			if err := check(); err != nil {
				return err
			}
			return &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", i, err)}
		}
		if !row.HasToken() {
			continue
		}
		scope, _ := liveLookup(row.Kind, row.Participant)
		batch = append(batch, tokenCheck{idx: i, kind: row.Kind, p: row.Participant, t: row.Token, key: tokenindex.Key(c, scope, row.Token)})
		if len(batch) == cap(batch) {
			if err := check(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return check()
}

// liveLookup is the token index lookup the live path makes for a request
// that would commit a row of kind by participant p: an enroll looks in
// the conversation's enroll scope and takes any row (operation.go), every
// other operation in its participant's scope and takes that
// participant's rows (ops.go, lookupParticipant).
func liveLookup(kind oplog.Kind, p ParticipantID) (tokenindex.Scope, func(*oplog.Row) bool) {
	if kind == oplog.KindEnroll {
		return tokenindex.Enroll, anyRow
	}
	return tokenindex.Participant(p), byParticipant(p)
}

// tokenCheckRows bounds the rows whose index entries checkTokens holds
// and reads at once.
const tokenCheckRows = 1024

// tokenCheck is a token-bearing oplog row checkTokens checks: its index,
// what names it in a finding, and its index entry's key and value.
type tokenCheck struct {
	idx  uint64
	kind oplog.Kind
	p    ParticipantID
	t    Token
	key  string
	v    uint64
	err  error
}

// checkTokenBatch reads the index entries of batch, concurrently, and
// resolves each as a retry would (indexedRow, with applied the
// oplog's length), and returns the first failed read or finding, in row
// order (checkTokens).
func checkTokenBatch(st store.DurableStore, c ConversationID, applied uint64, batch []tokenCheck, floor int64) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(batch), prefetchParallelism) {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(batch) {
					return
				}
				batch[k].v, batch[k].err = st.ReadValue(batch[k].key)
			}
		})
	}
	wg.Wait()
	for k := range batch {
		r := &batch[k]
		if r.err != nil {
			return fmt.Errorf("participant: read %s: %w", r.key, r.err)
		}
		_, match := liveLookup(r.kind, r.p)
		pr, _, err := indexedRow(st, c, applied, match, r.t, tokenWrite{key: r.key, old: r.v})
		if err != nil {
			return fmt.Errorf("participant: the token index lookup of oplog row %d: %w", r.idx, err)
		}
		if pr != nil && pr.idx == r.idx {
			continue
		}
		if ms, v7 := tokenTime(r.t); v7 && ms < floor {
			// Forgotten under the window; the row awaits its trim.
			continue
		}
		names := "is absent"
		if idx, ok := tokenindex.Index(r.v); ok {
			names = fmt.Sprintf("names oplog row %d", idx)
		}
		return &refusal{ClassTokenIndexMissing, fmt.Sprintf(
			"oplog row %d (%v of participant %d, token %v): its token index entry %s; a retry of the token would commit again",
			r.idx, r.kind, r.p, r.t, names)}
	}
	return nil
}
