package participant

import (
	"context"
	"fmt"

	"github.com/participantd/participantd/fence"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// commit runs the two-barrier commit of row on cv, whose turn the caller
// holds and whose state is loaded. genesis, when set, is the conversation's
// genesis row, committed in the same barrier ahead of row; tok, when set, is
// the token index write.
//
//	decide (done) → [registry] → token CAS → oplog append → flush (barrier 1)
//	→ outbox append → flush (barrier 2) → apply → wake
//
// A failure before the first append leaves nothing of the operation in the
// store: unavailable. A failure at or after it may or may not have
// committed: in_doubt. Either way nothing is applied, published or woken,
// and the conversation's state is dropped, so the next touch reconciles it
// from its streams (repairing, never rolling back).
//
// On success it returns the outbox rows, already applied to the state.
func (s *Service) commit(ctx context.Context, cv *conversation, o *op) ([]outbox.Row, error) {
	st := cv.state
	row, genesis, tok, ending := &o.row, o.genesis, o.tok, o.ending
	if genesis != nil && !cv.registered {
		if err := s.register(cv.id); err != nil {
			cv.drop()
			return nil, &Error{Code: CodeUnavailable, Detail: "registering the conversation", cause: err}
		}
		cv.registered = true
	}
	if genesis != nil {
		// A new conversation has no readers yet: genesis is applied ahead of
		// its barrier, and dropped with the state if the barrier fails.
		if _, err := outbox.Project(st, 0, genesis); err != nil {
			panic(fmt.Sprintf("participant: genesis does not project: %v", err))
		}
		cv.mu.Lock()
		outbox.Apply(st, 0, genesis, nil)
		cv.mu.Unlock()
	}
	idx := st.Applied
	rows, err := outbox.Project(st, idx, row)
	if err != nil {
		// The decision code produced a row its own projection refuses.
		panic(fmt.Sprintf("participant: decided %v row does not project: %v", row.Kind, err))
	}
	encRow, err := oplog.Encode(row)
	if err != nil {
		cv.drop()
		return nil, &Error{Code: CodeUnavailable, Detail: "encoding the operation", cause: err}
	}
	encOut := make([][]byte, len(rows))
	for i := range rows {
		if encOut[i], err = outbox.Encode(&rows[i]); err != nil {
			cv.drop()
			return nil, &Error{Code: CodeUnavailable, Detail: "encoding the outbox", cause: err}
		}
	}
	var encGenesis []byte
	if genesis != nil {
		if encGenesis, err = oplog.Encode(genesis); err != nil {
			cv.drop()
			return nil, &Error{Code: CodeUnavailable, Detail: "encoding genesis", cause: err}
		}
	}
	if ending != nil {
		if err := ending.accept(ctx, s); err != nil {
			cv.drop()
			return nil, &Error{Code: CodeUnavailable, Detail: "fencing the binding's end", cause: err}
		}
	}
	var bound fence.Token
	if o.binds {
		// The new binding's generation is issued before its row is written
		// and its lease gate stays armed until the row's barriers settle,
		// so no ending of it can be recorded ahead of it.
		bound = s.fences.Issue(site{cv.id, row.Participant}, epochKey(cv.id, row), 1)
		s.fences.ArmLease(bound)
		defer s.fences.SettleLease(bound)
	}
	failed := func() {
		cv.drop()
		ending.restore(s)
		if o.binds {
			s.fences.Revoke(site{cv.id, row.Participant}, bound)
		}
	}
	inDoubt := func(what string, err error) ([]outbox.Row, error) {
		failed()
		s.log.Warn().Err(err).Uint64("conversation", uint64(cv.id)).Str("op", row.Kind.String()).
			Str("phase", what).Msg("commit in doubt; conversation dropped for reconciliation")
		return nil, &Error{Code: CodeInDoubt, Detail: what, cause: err}
	}
	if tok != nil {
		if err := s.st.CAS(tok.key, tok.old, idx+1); err != nil {
			failed()
			return nil, &Error{Code: CodeUnavailable, Detail: "indexing the token", cause: err}
		}
	}
	oplogStream := oplog.Stream(cv.id)
	if genesis != nil {
		if _, err := s.st.Append(oplogStream, encGenesis, 0); err != nil {
			return inDoubt("oplog append", err)
		}
	}
	if _, err := s.st.Append(oplogStream, encRow, idx); err != nil {
		return inDoubt("oplog append", err)
	}
	// Barrier 1: the oplog row must be durable before any outbox row of it
	// is appended.
	if err := s.st.Flush(); err != nil {
		return inDoubt("oplog flush", err)
	}
	outboxStream := outbox.Stream(cv.id)
	for i, b := range encOut {
		if _, err := s.st.Append(outboxStream, b, st.Produced+uint64(i)); err != nil {
			return inDoubt("outbox append", err)
		}
	}
	// Barrier 2: the outbox rows must be durable before the operation is
	// applied, published or answered.
	if len(encOut) > 0 {
		if err := s.st.Flush(); err != nil {
			return inDoubt("outbox flush", err)
		}
	}
	cv.mu.Lock()
	outbox.Apply(st, idx, row, rows)
	if ending != nil {
		delete(cv.bindingTokens, ending.site.p)
	}
	if o.binds {
		cv.bindingTokens[row.Participant] = bound
	}
	cv.mu.Unlock()
	return rows, nil
}

// op is a decided operation, ready to commit.
type op struct {
	row oplog.Row
	// genesis is the conversation's genesis row, for its first enroll.
	genesis *oplog.Row
	// tok is the token index write, for rows that carry a token.
	tok *tokenWrite
	// ending is the binding this operation ends, if any.
	ending *ending
	// binds is set when the row creates a binding (enroll, attach).
	binds bool
}

// ending is the end of one binding being committed: the fence generation of
// the binding, consumed before the row is written so that exactly one ending
// is recorded per binding, and restored if the commit fails.
type ending struct {
	site     site
	token    fence.Token
	accepted fence.Accepted
	consumed bool
}

func (e *ending) accept(ctx context.Context, s *Service) error {
	acc, err := s.fences.Accept(ctx, e.site, e.token)
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

// epochKey is the fence generation key of the binding row creates.
func epochKey(c ConversationID, row *oplog.Row) string {
	return fence.IdempotencyKey("participantd.binding", uint64(c), uint64(row.Participant),
		row.Conn.Server, row.Conn.Ordinal, uint64(row.Generation))
}

// register appends cv's registry entry and makes it durable: a conversation
// is registered before its genesis row exists, so a restart finds every
// conversation that has one.
func (s *Service) register(id ConversationID) error {
	s.regMu.Lock()
	n, err := s.st.Len(RegistryStream)
	if err == nil {
		_, err = s.st.Append(RegistryStream, encodeRegistryEntry(id), n)
	}
	s.regMu.Unlock()
	if err != nil {
		return err
	}
	// The registry entry must be durable before the genesis row is appended.
	return s.st.Flush()
}
