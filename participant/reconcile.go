package participant

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// readPage is how many entries reconciliation reads per store call.
const readPage = 4096

// refusal is a reconciliation finding that makes a conversation unloadable.
type refusal struct {
	class  string
	reason string
}

func (r *refusal) Error() string { return r.class + ": " + r.reason }

// Reconciled is what reconciling one conversation found.
type Reconciled struct {
	// State is the conversation rebuilt from its oplog.
	State *outbox.State
	// Stored is how many outbox rows were stored and matched.
	Stored uint64
	// Repairs are the encoded outbox rows missing at the end of the stored
	// outbox, in order.
	Repairs [][]byte
}

// reconcile rebuilds conversation c from its streams without writing
// anything: it validates the whole outbox (versions, decoding, sources),
// replays the oplog through the projection the live path uses, matches
// every stored outbox row against the expected one byte for byte, and
// collects the expected rows missing at the end. A finding that forbids
// loading is a *refusal; a storage failure is returned as is.
func reconcile(st store.DurableStore, c ConversationID) (*Reconciled, error) {
	oplogRows, err := readAll(st, oplog.Stream(c))
	if err != nil {
		return nil, err
	}
	stored, err := readAll(st, outbox.Stream(c))
	if err != nil {
		return nil, err
	}
	rows, err := outbox.Validate(stored)
	switch {
	case errors.Is(err, outbox.ErrMixedVersion):
		return nil, &refusal{ClassOutboxMixedVersion, err.Error()}
	case errors.Is(err, outbox.ErrUnknownVersion):
		return nil, &refusal{ClassOutboxUnknownVersion, err.Error()}
	case err != nil:
		return nil, &refusal{ClassOutboxCorrupt, err.Error()}
	}
	for i := range rows {
		if rows[i].Source >= uint64(len(oplogRows)) {
			return nil, &refusal{ClassImpossibleBoundary, fmt.Sprintf(
				"impossible future boundary: outbox row %d derives from oplog row %d, the oplog has %d rows",
				i, rows[i].Source, len(oplogRows))}
		}
	}
	r := &Reconciled{State: &outbox.State{}}
	for i, b := range oplogRows {
		row, err := oplog.Decode(b)
		if err != nil {
			return nil, &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", i, err)}
		}
		expected, err := outbox.Project(r.State, uint64(i), &row)
		if err != nil {
			return nil, &refusal{ClassOplogInconsistent, fmt.Sprintf("oplog row %d: %v", i, err)}
		}
		for k := range expected {
			enc, err := outbox.Encode(&expected[k])
			if err != nil {
				return nil, fmt.Errorf("participant: encode expected outbox row: %w", err)
			}
			if r.Stored < uint64(len(stored)) {
				if !bytes.Equal(enc, stored[r.Stored]) {
					return nil, &refusal{ClassOutboxConflict, fmt.Sprintf(
						"outbox row %d differs from the row oplog row %d projects", r.Stored, i)}
				}
				r.Stored++
				continue
			}
			r.Repairs = append(r.Repairs, enc)
		}
		outbox.Apply(r.State, uint64(i), &row, expected)
	}
	if r.Stored < uint64(len(stored)) {
		return nil, &refusal{ClassOutboxConflict, fmt.Sprintf(
			"outbox has %d rows, the oplog projects %d", len(stored), r.Stored)}
	}
	return r, nil
}

func readAll(st store.DurableStore, stream string) ([][]byte, error) {
	var out [][]byte
	for {
		entries, err := st.ReadFrom(stream, uint64(len(out)), readPage)
		if err != nil {
			return nil, fmt.Errorf("participant: read %s: %w", stream, err)
		}
		for _, e := range entries {
			out = append(out, e.Payload)
		}
		if len(entries) < readPage {
			return out, nil
		}
	}
}

// ensureLoadedTurn returns cv's state, reconciling it first when it is not
// loaded. The caller holds cv's turn. Loading ends the bindings that cannot
// be live any more — those of an earlier server incarnation
// (died/unclean_restart) and those of connections of this incarnation that
// have ended (died/connection_lost) — through the normal two barriers, and
// only then publishes: it wakes every connection with something to push.
func (s *Service) ensureLoadedTurn(ctx context.Context, cv *conversation) (*outbox.State, error) {
	if err := s.acquireTurn(ctx, cv); err != nil {
		return nil, err
	}
	cv.mu.RLock()
	st, unl := cv.state, cv.unloadable
	cv.mu.RUnlock()
	if unl != nil {
		return nil, refuse(CodeUnavailable, "conversation %v is unloadable: %s", cv.id, unl.Class)
	}
	if st != nil {
		return st, nil
	}
	if !cv.registered {
		// Never registered, so nothing of it is stored.
		cv.mu.Lock()
		cv.state = &outbox.State{}
		cv.bindingTokens = make(map[ParticipantID]fenceToken)
		cv.mu.Unlock()
		return cv.state, nil
	}
	r, err := reconcile(s.st, cv.id)
	var ref *refusal
	if errors.As(err, &ref) {
		u := &Unloadable{Conversation: cv.id, Class: ref.class, Reason: ref.reason}
		cv.mu.Lock()
		cv.unloadable = u
		cv.mu.Unlock()
		s.log.Error().Uint64("conversation", uint64(cv.id)).Str("class", ref.class).Str("reason", ref.reason).
			Msg("conversation unloadable; contained")
		return nil, refuse(CodeUnavailable, "conversation %v is unloadable: %s", cv.id, ref.class)
	}
	if err != nil {
		return nil, unavailable("reconciling the conversation", err)
	}
	for i, b := range r.Repairs {
		if _, err := s.st.Append(outbox.Stream(cv.id), b, r.Stored+uint64(i)); err != nil {
			return nil, unavailable("repairing the outbox", err)
		}
	}
	// Everything reconciled, repaired rows and rows a failed commit left
	// visible but unflushed alike, must be durable before anything of the
	// conversation is published. With nothing staged this costs nothing.
	if err := s.flush(cv.id); err != nil {
		return nil, unavailable("making the reconciled conversation durable", err)
	}
	if len(r.Repairs) > 0 {
		s.log.Info().Uint64("conversation", uint64(cv.id)).Int("rows", len(r.Repairs)).Msg("outbox repaired")
	}
	st = r.State
	tokens := make(map[ParticipantID]fenceToken)
	type stale struct {
		p     ParticipantID
		conn  ConnID
		cause Cause
	}
	var ends []stale
	var live []*Conn
	for i := range st.Members {
		p := ParticipantID(i)
		site := site{cv.id, p}
		s.fences.RevokeCurrent(site)
		m := &st.Members[i]
		if !m.Bound {
			continue
		}
		row := oplog.Row{Participant: p, Conn: m.Conn, Generation: m.Generation}
		tokens[p] = s.fences.Issue(site, epochKey(cv.id, &row), 1)
		// A connection that is ending has its binding end here with the
		// cause its End was given (a bye stays detached/clean).
		c := s.conn(m.Conn)
		ending, cause := c.endingCause()
		switch {
		case m.Conn.Server != s.incarnation:
			ends = append(ends, stale{p, m.Conn, oplog.CauseUncleanRestart})
		case c == nil:
			ends = append(ends, stale{p, m.Conn, oplog.CauseConnectionLost})
		case ending:
			ends = append(ends, stale{p, m.Conn, cause})
		default:
			c.bind(cv.id, p)
			if st.Next(p, m.Cursor) != nil {
				live = append(live, c)
			}
		}
	}
	cv.mu.Lock()
	cv.setStateLocked(st)
	cv.bindingTokens = tokens
	cv.mu.Unlock()
	s.forgetStaleBindings(cv.id, st)
	if len(ends) > 0 {
		b := s.newBatch(cv, st)
		for _, e := range ends {
			if err := b.stageEnd(e.p, e.conn, e.cause); err != nil {
				cv.drop()
				return nil, err
			}
		}
		if err := b.write(); err != nil {
			return nil, err
		}
		st = b.st
	}
	for _, c := range live {
		c.markReady(cv.id)
	}
	return st, nil
}

// forgetStaleBindings removes conversation id from the bookkeeping of every
// connection that no longer holds the binding it remembers there: a failed
// commit can have moved a binding (a superseding attach that did commit)
// without the bookkeeping that follows a successful one.
func (s *Service) forgetStaleBindings(id ConversationID, st *outbox.State) {
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		if p, ok := c.bindings[id]; ok {
			if m := st.Member(p); m == nil || !m.Bound || m.Conn != c.id {
				delete(c.bindings, id)
			}
		}
		c.mu.Unlock()
	}
}
