package participant

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/fence"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// maxBatch bounds how many queued operations of one conversation share one
// pair of barriers.
const maxBatch = 256

// A batch commits the operations queued on one conversation together: the
// turn's holder decides them one after the other against a working copy of
// the state, so each sees the effects of those before it exactly as if they
// had committed one by one, and then writes all their rows behind one pair
// of barriers:
//
//	decide each → [registry] → token CASes → oplog appends → seal (barrier 1)
//	→ outbox appends → flush (barrier 2) → swap in the working state → wake
//
// The seal returns once the oplog rows are carried by a commit under way
// (SealingOwnership), or, under any other Ownership, once they are
// durable; the outbox rows then go to a later commit, written only once
// the oplog rows' is durable, and the batch waits for both.
//
// On a store that keeps c's writes in order (OrderedOwnership) barrier 1
// is kept by the appends' order and shares barrier 2's flush.
//
// A failure before the first append leaves nothing of the batch in the
// store: unavailable. A failure at or after it may or may not have
// committed: in_doubt. Either way nothing is applied, published or woken,
// and the conversation's state is dropped, so that the next touch reconciles
// it from its streams (repairing, never rolling back).
type batch struct {
	s  *Service
	cv *conversation
	// live is the published state; st is the working copy the batch's
	// decisions run against.
	live, st *outbox.State
	ops      []*op
	// tokens are the tokens staged in this batch, by index key, so that a
	// repeat within the batch replays.
	tokens map[string]*prior
	// prefetched are token index values read before the batch's
	// decisions, by key (prefetchTokens); nil when not prefetching.
	prefetched map[string]uint64
	// bindings are the fence tokens of bindings staged in this batch.
	bindings map[ParticipantID]fence.Token
	// reservedSlot is set when the batch's first enroll of a new
	// conversation took a conversation slot; a failure before the
	// conversation is registered gives it back.
	reservedSlot bool
	// storeCharge is the principal key a commit stores as the
	// conversation's charge (share.go), 0 for none.
	storeCharge uint64
	// span traces the batch (trace.go); nil when tracing is off.
	span trace.Span
	// clock times the batch's stages (Stages).
	clock batchClock

	// Pipelining (pipeline.go). prev is the batch in flight when this
	// one began, whose working state this one decided on; nil for none,
	// and once its outcome is known (a pipeline that never drains keeps
	// no chain of batches).
	prev *batch
	// done is closed once a batch that handed the turn on has its
	// outcome, werr (nil: durable and installed); nil for a batch that
	// kept its turn.
	done chan struct{}
	werr error
	// cloned is set, under cv.mu, once a later batch cloned st.
	cloned atomic.Bool
	// afterFailed is set when the batch failed because prev did: every
	// one of its operations shares the failure (lead).
	afterFailed bool
}

// op is one staged operation.
type op struct {
	row oplog.Row
	// genesis is the conversation's genesis row, for its first enroll.
	genesis *oplog.Row
	// tok is the token index write, for rows that carry a token.
	tok *tokenWrite
	// ending is the binding this operation ends, if any; ended names it
	// for the connections' bookkeeping.
	ending *ending
	ended  *superseded
	// binds is set when the row creates a binding (enroll, attach).
	binds bool
	bound fence.Token
	// slot is the binding slot the operation reserved on its connection,
	// which the publication of its binding takes over; nil for none.
	slot *bindingSlot
	// rows are the outbox rows the row projects to.
	rows []outbox.Row
}

func (s *Service) newBatch(cv *conversation, live *outbox.State) *batch {
	return &batch{s: s, cv: cv, live: live, st: live.Clone()}
}

// stage decides that o commits: it consumes the fence generation of the
// binding o ends, issues the one o creates, and projects o's row (and
// genesis) on the working state, applying them there. It fails only when
// the fence refuses the ending, which means the binding ended already.
//
// The ending of a binding this batch started (enroll or attach, then
// detach, leave, a superseding attach or the connection's end, pipelined)
// does not wait for the binding's lease: the batch holds that lease until
// its barriers return, and its start row precedes the ending's in the
// batch's oplog appends, so the ending is already ordered after it.
// Waiting would wait on this very batch, holding the turn forever.
func (b *batch) stage(o *op) error {
	if o.ending != nil {
		if err := o.ending.accept(b.s.ctx, b.s); err != nil {
			return unavailable("fencing the binding's end", err)
		}
	}
	if o.binds {
		b.issueBinding(o)
	}
	if o.genesis != nil {
		if _, err := outbox.Project(b.st, 0, o.genesis); err != nil {
			panic(fmt.Sprintf("participant: genesis does not project: %v", err))
		}
		outbox.Apply(b.st, 0, o.genesis, nil)
	}
	idx := b.st.Applied
	rows, err := outbox.Project(b.st, idx, &o.row)
	if err != nil {
		// The decision code produced a row its own projection refuses.
		panic(fmt.Sprintf("participant: decided %v row does not project: %v", o.row.Kind, err))
	}
	outbox.Apply(b.st, idx, &o.row, rows)
	o.rows = rows
	if o.tok != nil {
		if b.tokens == nil {
			b.tokens = make(map[string]*prior)
		}
		b.tokens[o.tok.key] = &prior{idx: idx, row: o.row}
	}
	b.ops = append(b.ops, o)
	return nil
}

// lookup resolves token t in scope: a commit staged earlier in this batch,
// else the store's index, read ahead (prefetchTokens) or now. A token
// not committed must pass the token window (admitToken).
func (b *batch) lookup(scope tokenindex.Scope, match func(*oplog.Row) bool, t Token) (*prior, tokenWrite, error) {
	key := tokenindex.Key(b.cv.id, scope, t)
	if pr, ok := b.tokens[key]; ok && match(&pr.row) {
		return pr, tokenWrite{key: key}, nil
	}
	var (
		pr  *prior
		tw  tokenWrite
		err error
	)
	if v, ok := b.prefetched[key]; ok {
		pr, tw, err = indexedRow(b.s.st, b.cv.id, b.live.Applied, match, t, tokenWrite{key: key, old: v})
	} else {
		pr, tw, err = b.s.lookupToken(b.cv.id, b.live.Applied, key, match, t)
	}
	if err != nil {
		// A damaged entry is neither "never committed" nor a passing
		// failure: the conversation is contained.
		b.s.containCorrupt(b.cv, err)
		return nil, tw, unavailable("reading the token index", err)
	}
	if pr == nil {
		if err := b.s.admitToken(b.cv, t); err != nil {
			return nil, tw, err
		}
	}
	return pr, tw, nil
}

// endingOf returns the ending of p's current binding in the working state.
// A binding loaded before a Forget that overtook the batch has no token any
// more, so the fence refuses its ending (see DESIGN.md, "Bindings and
// fencing").
func (b *batch) endingOf(p ParticipantID) *ending {
	if t, ok := b.bindings[p]; ok {
		return &ending{site: site{b.cv.id, p}, token: t, held: true}
	}
	b.cv.mu.RLock()
	defer b.cv.mu.RUnlock()
	return &ending{site: site{b.cv.id, p}, token: b.cv.bindingTokens[p]}
}

// issueBinding stages the fence generation of the binding o creates. It is
// issued before the row is written and its lease gate stays armed until
// the batch's barriers settle, so no ending of it can be recorded first.
func (b *batch) issueBinding(o *op) {
	o.bound = b.s.fences.Issue(site{b.cv.id, o.row.Participant}, epochKey(b.cv.id, &o.row), 1)
	b.s.fences.ArmLease(o.bound)
	if b.bindings == nil {
		b.bindings = make(map[ParticipantID]fence.Token)
	}
	b.bindings[o.row.Participant] = o.bound
}

// write commits the staged operations. On success the working state is
// published and the affected connections are woken; on failure the
// conversation is dropped and the error is unavailable or in_doubt.
func (b *batch) write() error {
	s, cv := b.s, b.cv
	for _, o := range b.ops {
		if o.binds {
			defer s.fences.SettleLease(o.bound)
		}
	}
	if len(b.ops) == 0 {
		return nil
	}
	// On a store that keeps c's writes in order (OrderedOwnership)
	// barrier 1 is kept by the appends' order and shares barrier 2's
	// flush; see appendRows.
	shared := s.keepsOrder(cv.id)
	oplogDurable, err := b.appendRows(shared)
	if err != nil {
		return err
	}
	// Barrier 2: the outbox rows (and, shared, the oplog rows) must be
	// durable before the operations are applied, published or answered.
	// Under a seal it is asked for first, so that the commit after the
	// oplog rows' is taken as soon as theirs is durable.
	name := SpanOutboxBarrier
	if shared {
		name = SpanSharedSync
	}
	sp := b.startBarrier(name)
	timing, err := s.flushTimed(cv.id)
	endSpan(sp, err)
	if err == nil {
		b.clock.flush = timing
	}
	if oplogDurable != nil {
		if oerr := oplogDurable(); oerr != nil {
			return b.fail(CodeInDoubt, "oplog flush", oerr)
		}
	}
	if err != nil {
		if shared {
			return b.fail(CodeInDoubt, "oplog and outbox flush", err)
		}
		return b.fail(CodeInDoubt, "outbox flush", err)
	}
	b.clock.durable = time.Now()
	b.install()
	return nil
}

// fail undoes what the batch did in memory and drops the conversation,
// so that it is reconciled from what the store holds, and returns the
// batch's error: code, with what failed and its cause. The caller holds
// the turn.
func (b *batch) fail(code Code, what string, err error) error {
	s, cv := b.s, b.cv
	b.clock.failed = true
	if b.reservedSlot && !cv.counted {
		s.conversationSlots.release()
	}
	cv.drop()
	// Undo in reverse staging order, each op's issue before its
	// ending's consumption: a binding started and ended in this batch
	// is restored by its ending and then revoked by its start, so the
	// site ends up holding what it held before the batch.
	for i := len(b.ops) - 1; i >= 0; i-- {
		o := b.ops[i]
		if o.binds {
			s.fences.Revoke(site{cv.id, o.row.Participant}, o.bound)
		}
		o.ending.restore(s)
	}
	if code == CodeInDoubt {
		b.logInDoubt(what, err)
	}
	return &Error{Code: code, Detail: what, cause: err}
}

// logInDoubt logs a commit that failed in doubt.
func (b *batch) logInDoubt(what string, err error) {
	ev := b.s.log.Warn().Err(err).Uint64("conversation", uint64(b.cv.id)).Int("operations", len(b.ops)).Str("phase", what)
	if b.span != nil {
		ev = ev.Stringer("trace_id", b.span.SpanContext().TraceID()).Stringer("span_id", b.span.SpanContext().SpanID())
	}
	ev.Msg("commit in doubt; conversation dropped for reconciliation")
}

// appendRows writes the staged operations' rows, up to barrier 2: the
// registry entry of a new conversation, its charge, the token index
// values, the oplog rows, barrier 1, the outbox rows. With shared,
// barrier 1 shares barrier 2's flush and oplogDurable is nil; otherwise
// it is the wait of barrier 1's seal, which must be called once. A
// failure is returned as fail returns it.
func (b *batch) appendRows(shared bool) (oplogDurable func() error, _ error) {
	s, cv := b.s, b.cv
	var oplogRows, outboxRows [][]byte
	for _, o := range b.ops {
		if o.genesis != nil {
			enc, err := oplog.Encode(o.genesis)
			if err != nil {
				return nil, b.fail(CodeUnavailable, "encoding genesis", err)
			}
			oplogRows = append(oplogRows, enc)
			if !cv.registered.Load() {
				if err := s.register(cv.id); err != nil {
					return nil, b.fail(CodeUnavailable, "registering the conversation", err)
				}
				if shared && !s.keepsRegistryOrder(cv.id) {
					// The entry must be durable whenever the genesis row
					// is; its order with c's writes is not kept (another
					// scope of the store), and barrier 1 is not a flush
					// of its own here: flush it first. Nothing of the
					// batch is written yet. Registered only once the
					// flush returned: an entry whose flush failed is not
					// one a retry may rely on (it registers again; a
					// second entry is read once).
					if err := s.flush(cv.id); err != nil {
						return nil, b.fail(CodeUnavailable, "registering the conversation", err)
					}
				}
				cv.registered.Store(true)
			}
			if b.reservedSlot {
				cv.counted = true
			}
		}
		enc, err := oplog.Encode(&o.row)
		if err != nil {
			return nil, b.fail(CodeUnavailable, "encoding the operation", err)
		}
		oplogRows = append(oplogRows, enc)
		for i := range o.rows {
			enc, err := outbox.Encode(&o.rows[i])
			if err != nil {
				return nil, b.fail(CodeUnavailable, "encoding the outbox", err)
			}
			outboxRows = append(outboxRows, enc)
		}
	}
	if b.storeCharge != 0 {
		// Before barrier 1, with the rows whose commit charged it.
		if err := s.st.CAS(tokenindex.ChargeKey(cv.id), 0, b.storeCharge); err != nil {
			return nil, b.fail(CodeUnavailable, "storing the conversation's charge", err)
		}
		cv.chargeStored = true // a failure from here on reloads it
	}
	idx := b.live.Applied
	for _, o := range b.ops {
		if o.genesis != nil {
			idx++
		}
		if o.tok != nil {
			if err := s.st.CAS(o.tok.key, o.tok.old, tokenindex.Value(idx)); err != nil {
				return nil, b.fail(CodeUnavailable, "indexing the token", err)
			}
		}
		idx++
	}
	// Every row's encoding was made for its append and is handed to the
	// store, which keeps it rather than a copy where it can.
	oplogStream := oplog.Stream(cv.id)
	for i, enc := range oplogRows {
		if _, err := store.AppendOwned(s.st, oplogStream, enc, b.live.Applied+uint64(i)); err != nil {
			return nil, b.fail(CodeInDoubt, "oplog append", err)
		}
	}
	// Barrier 1: the oplog rows must be durable before any outbox row of
	// them is. A store that keeps c's writes in order makes that so by
	// the appends' order alone: no crash leaves an outbox row without the
	// oplog rows appended before it, and barrier 2's flush makes both
	// durable ("One sync for both barriers" in docs/DESIGN.md). Otherwise
	// the oplog rows are sealed into a commit of their own, which is
	// durable before any later commit is written: the outbox rows,
	// appended once the seal returns, go to a later commit and cannot be
	// durable without them ("Sealed barriers" in docs/DESIGN.md).
	b.clock.decided = time.Now()
	if !shared {
		// The span covers the seal: under a sealing store the wait for
		// durability overlaps barrier 2's.
		b.clock.split = true
		sp := b.startBarrier(SpanOplogBarrier)
		var err error
		oplogDurable, err = s.seal(cv.id)
		endSpan(sp, err)
		if err != nil {
			return nil, b.fail(CodeInDoubt, "oplog flush", err)
		}
		b.clock.oplog = time.Since(b.clock.decided)
	}
	// Barrier 2's stages begin with the outbox appends.
	b.clock.barriers = true
	outboxStream := outbox.Stream(cv.id)
	for i, enc := range outboxRows {
		if _, err := store.AppendOwned(s.st, outboxStream, enc, b.live.Produced+uint64(i)); err != nil {
			if oplogDurable != nil {
				// The answer is in_doubt whatever the oplog rows' commit
				// did, and says so with the append's error. The wait is
				// called only because a seal's wait must be called once
				// (SealingOwnership): a watched store ends its watched
				// flush in it, the fault store puts back what was not
				// made durable. Its error adds nothing to the answer.
				_ = oplogDurable()
			}
			return nil, b.fail(CodeInDoubt, "outbox append", err)
		}
	}
	return oplogDurable, nil
}

// install publishes the batch's working state once its rows are
// durable, unless the conversation was forgotten under the batch (its
// ownership lost): the rows are durable, so the operations are answered,
// but nothing is installed or published; whoever owns the conversation
// next reconciles it from them. A later batch that decided on the
// working state (pipelined, pipeline.go) shares its records, so the
// install leaves them alone then: that batch's own install evicts.
func (b *batch) install() {
	cv := b.cv
	cv.mu.Lock()
	if !cv.currentLocked() {
		cv.mu.Unlock()
		return
	}
	cv.swapStateLocked(b.st, !b.cloned.Load())
	for _, o := range b.ops {
		if o.ending != nil {
			delete(cv.bindingTokens, o.ending.site.p)
		}
		if o.binds {
			cv.bindingTokens[o.row.Participant] = o.bound
		}
	}
	cv.mu.Unlock()
	b.publish()
}

// publish runs after a successful write: it moves binding bookkeeping from
// ended bindings' connections to new bindings' connections, and wakes every
// connection with something new to push: the bound recipients of the new
// records, and a new binding with records after its cursor.
func (b *batch) publish() {
	s, cv, st := b.s, b.cv, b.st
	for _, o := range b.ops {
		if o.ended != nil {
			if c := s.conn(o.ended.conn); c != nil {
				c.unbind(cv.id, o.ended.p)
			}
		}
		if o.binds {
			if c := s.conn(o.row.Conn); c != nil {
				c.bind(cv.id, o.row.Participant, o.slot)
			}
		}
	}
	wake := make(map[ConnID]struct{})
	for _, o := range b.ops {
		for _, row := range o.rows {
			for _, rec := range row.Records {
				for _, r := range rec.Recipients {
					if m := &st.Members[r]; m.Bound {
						wake[m.Conn] = struct{}{}
					}
				}
			}
		}
		if o.binds {
			if m := st.Member(o.row.Participant); m.Bound && (m.Released > m.Cursor || waiting(st, o.row.Participant)) {
				wake[m.Conn] = struct{}{}
			}
		}
		if o.row.Kind == oplog.KindRelease {
			// Each bound member that lost records gets its notice.
			for i := range st.Members {
				if m := &st.Members[i]; m.Bound && m.Released > m.Cursor {
					wake[m.Conn] = struct{}{}
				}
			}
		}
	}
	for id := range wake {
		if c := s.conn(id); c != nil {
			c.markReady(cv.id)
		}
	}
}

// ending is the end of one binding being committed: the fence generation of
// the binding, consumed before the row is written so that exactly one ending
// is recorded per binding, and restored if the commit fails.
type ending struct {
	site  site
	token fence.Token
	// held is set when this batch issued token and holds its lease armed:
	// the binding started earlier in the same batch.
	held     bool
	accepted fence.Accepted
	consumed bool
}

// accept consumes the binding's fence generation. A binding of an earlier
// batch waits at its lease gate, which is settled by then (its batch
// released the turn after its barriers); one started in this batch is
// accepted without waiting (see stage).
func (e *ending) accept(ctx context.Context, s *Service) error {
	var (
		acc fence.Accepted
		err error
	)
	if e.held {
		acc, err = s.fences.AcceptHeld(e.site, e.token)
	} else {
		acc, err = s.fences.Accept(ctx, e.site, e.token)
	}
	if err != nil {
		return err
	}
	e.accepted, e.consumed = acc, true
	return nil
}

func (e *ending) restore(s *Service) {
	if e != nil && e.consumed {
		s.fences.RestoreIfAbsent(e.site, e.accepted)
	}
}

// superseded names a binding a commit ended.
type superseded struct {
	conn ConnID
	p    ParticipantID
}

// epochKey is the fence generation key of the binding row creates.
func epochKey(c ConversationID, row *oplog.Row) string {
	return fence.IdempotencyKey("participantd.binding", uint64(c), uint64(row.Participant),
		row.Conn.Server, row.Conn.Ordinal, uint64(row.Generation))
}

// register appends cv's registry entry, before its genesis row is
// appended, so that a restart finds every conversation that has one.
// Barrier 1 makes both durable with one flush: the store keeps a prefix of
// the writes across a crash, so the genesis row is never durable without
// the entry appended before it.
func (s *Service) register(id ConversationID) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	n, err := s.st.Len(registry.Stream)
	if err == nil {
		_, err = s.st.Append(registry.Stream, registry.Encode(registry.Entry{Conversation: id}), n)
	}
	return err
}
