package participant

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// readPageEntries bounds the entries of a reconciliation page, besides its
// bytes.
const readPageEntries = 4096

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
	// Deleted is set, and nothing else, when the conversation was deleted
	// (delete.go): its oplog ends with a Delete row, at index DeletedAt.
	Deleted   bool
	DeletedAt uint64
}

// pages is how reconciliation reads: each stream in pages of at most bytes
// bytes (or one entry, when that is larger). A reconciliation reserves two
// pages from budget (an oplog and an outbox page, read in lockstep) for as
// long as it reads, as one grant, so that reconciliations waiting for the
// budget never hold part of it. Every reconciliation of a Service shares
// one budget: the pages in flight at a start are bounded in bytes whatever
// the number of workers and the length of the histories. A loaded state
// keeps at most window payload bytes of its retained records in memory
// (Options.BacklogWindowBytes), the oldest past it evicted as they load
// (0: every payload).
type pages struct {
	budget *byteBudget
	bytes  int
	window int64
}

// pageReader reads one stream forward, a page at a time, from next up to
// end (the stream's length when reconciliation began).
type pageReader struct {
	st       store.DurableStore
	stream   string
	maxBytes int
	next     uint64
	end      uint64
	page     []store.Entry
	// buf, when not nil, is the memory pages are read into
	// (store.ReadPageBuffered): a payload entry returns is then valid
	// only until the next call of entry.
	buf *store.PageBuffer
}

func newPageReader(st store.DurableStore, stream string, maxBytes int, from uint64) (*pageReader, error) {
	end, err := st.Len(stream)
	if err != nil {
		return nil, fmt.Errorf("participant: length of %s: %w", stream, err)
	}
	return &pageReader{st: st, stream: stream, maxBytes: maxBytes, next: from, end: max(end, from)}, nil
}

// newBufferedPageReader is newPageReader for a caller done with each
// payload before it asks for the next (one that decodes each row into
// memory of its own): the reader reads every page into one buffer, so
// that a replay of any length allocates no payload.
func newBufferedPageReader(st store.DurableStore, stream string, maxBytes int, from uint64) (*pageReader, error) {
	r, err := newPageReader(st, stream, maxBytes, from)
	if err != nil {
		return nil, err
	}
	r.buf = &store.PageBuffer{}
	return r, nil
}

// more reports whether entries are left before end.
func (r *pageReader) more() bool { return r.next < r.end }

// entry returns the payload of entry r.next and advances. The payload is
// the caller's, and the page drops its reference to it; in a buffered
// reader it is valid only until the next call.
func (r *pageReader) entry() ([]byte, error) {
	if len(r.page) == 0 {
		limit := int(min(r.end-r.next, readPageEntries))
		var page []store.Entry
		var err error
		if r.buf != nil {
			page, err = store.ReadPageBuffered(r.st, r.stream, r.next, limit, r.maxBytes, r.buf)
		} else {
			page, err = store.ReadPage(r.st, r.stream, r.next, limit, r.maxBytes)
		}
		if err != nil {
			return nil, fmt.Errorf("participant: read %s: %w", r.stream, err)
		}
		if len(page) == 0 || page[0].Seq != r.next {
			return nil, fmt.Errorf("participant: read %s: no entry %d of %d", r.stream, r.next, r.end)
		}
		r.page = page
	}
	e := r.page[0]
	r.page[0] = store.Entry{}
	r.page = r.page[1:]
	r.next++
	return e.Payload, nil
}

// reconcile rebuilds conversation c from its streams without writing
// anything: it validates the whole outbox (versions, decoding, sources),
// replays the oplog through the projection the live path uses, matches
// every stored outbox row against the expected one byte for byte, and
// collects the expected rows missing at the end. Both streams are read in
// pages (see pages), the outbox twice: once to validate it whole before
// anything of it is trusted, once in lockstep with the replay. A finding
// that forbids loading is a *refusal, and so is a stored value of the
// conversation that is damaged (corruptRefusal); a storage failure, or ctx
// ending while waiting for the page budget, is returned as is.
func reconcile(ctx context.Context, st store.DurableStore, c ConversationID, p pages) (*Reconciled, error) {
	r, err := reconcileRows(ctx, st, c, p)
	return r, corruptRefusal(err)
}

// ClassStoreCorrupt is a conversation a stored value of which is damaged:
// it fails its checksum, or the page holding it cannot be read
// (store.ErrCorrupt). Its bytes are never served nor taken for absent.
const ClassStoreCorrupt = "store_corrupt"

// corruptRefusal returns err, or, when err reports damaged stored data
// (store.ErrCorrupt) of one conversation, a ClassStoreCorrupt refusal
// that contains it. A failed store (store.ErrFailed) is every
// conversation's failure, not one's damage: returned as is.
func corruptRefusal(err error) error {
	var ref *refusal
	if err == nil || errors.As(err, &ref) || !errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrFailed) {
		return err
	}
	return &refusal{ClassStoreCorrupt, err.Error()}
}

func reconcileRows(ctx context.Context, st store.DurableStore, c ConversationID, p pages) (*Reconciled, error) {
	held, err := p.budget.acquire(ctx, 2*int64(p.bytes))
	if err != nil {
		return nil, fmt.Errorf("participant: waiting to read %v: %w", c, err)
	}
	defer p.budget.release(held)
	base, err := loadCheckpoint(st, c)
	if err != nil {
		return nil, err
	}
	var from, outFrom uint64
	if base != nil {
		from, outFrom = base.Index, base.Produced
	} else if first, err := streamFirst(st, oplog.Stream(c)); err != nil {
		return nil, err
	} else if first > 0 {
		// A deleted conversation's purge removes its checkpoint, then
		// the rows before its Delete row (delete.go): its last row alone
		// says what it is.
		if at, ok, err := deletedAt(st, c); err != nil || ok {
			return &Reconciled{Deleted: ok, DeletedAt: at}, err
		}
		return nil, &refusal{ClassCheckpointMissing, fmt.Sprintf(
			"the oplog starts at row %d and no checkpoint says what the rows before it built", first)}
	}
	ops, err := newPageReader(st, oplog.Stream(c), p.bytes, from)
	if err != nil {
		return nil, err
	}
	stored, err := newPageReader(st, outbox.Stream(c), p.bytes, outFrom)
	if err != nil {
		return nil, err
	}
	r := &Reconciled{State: &outbox.State{}, Stored: outFrom}
	if base != nil {
		if err := verifyCheckpoint(st, base, c, ops.end, stored.end); err != nil {
			return nil, err
		}
		r.State = base.State()
		if err := loadRetained(st, base, c, p.bytes, r.State, nil); err != nil {
			return nil, err
		}
		if err := loadPayloads(st, c, r.State, p.window); err != nil {
			return nil, err
		}
	}
	if ref, err := validateOutbox(st, c, p.bytes, outFrom, ops.end); ref != nil {
		return nil, ref
	} else if err != nil {
		return nil, err
	}
	rp := &rebuilder{state: r.State, window: p.window}
	for i := from; ops.more(); i++ {
		_, row, expected, err := replayRow(ops, r.State, i)
		if err != nil {
			return nil, err
		}
		for k := range expected {
			enc, err := encodeExpected(&expected[k])
			if err != nil {
				return nil, err
			}
			if stored.more() {
				if err := matchStored(stored, enc, i); err != nil {
					return nil, err
				}
				r.Stored++
				continue
			}
			r.Repairs = append(r.Repairs, enc)
		}
		rp.apply(i, &row, expected)
	}
	if r.Stored < stored.end {
		return nil, &refusal{ClassOutboxConflict, fmt.Sprintf(
			"outbox has %d rows, the oplog projects %d", stored.end, r.Stored)}
	}
	if r.State.Deleted {
		// Deleted, its purge not begun or not past the checkpoint.
		return &Reconciled{Deleted: true, DeletedAt: r.State.Applied - 1}, nil
	}
	return r, nil
}

// replayRow reads oplog row i, the next entry of ops, decodes it and
// projects the outbox rows it derives from state: the step that a start's
// replay and a checkpoint's derivation share. A row that does not decode
// is a ClassOplogCorrupt refusal, one that state cannot take a
// ClassOplogInconsistent one. It returns the row's bytes (the caller's),
// the row and the rows it projects; state is not changed.
func replayRow(ops *pageReader, state *outbox.State, i uint64) ([]byte, oplog.Row, []outbox.Row, error) {
	b, row, expected, _, err := replayRowReusing(ops, state, i, nil)
	return b, row, expected, err
}

// replayRowReusing is replayRow for a replay that drops each row's
// payload before it reads the next (a checkpoint's derivation): the
// payload is decoded into scratch's array when it fits
// (oplog.DecodeReusing), so that a derivation over rows of 64 KiB tells
// does not allocate each payload a second time. It returns the scratch
// for the next row.
func replayRowReusing(ops *pageReader, state *outbox.State, i uint64, scratch []byte) ([]byte, oplog.Row, []outbox.Row, []byte, error) {
	b, err := ops.entry()
	if err != nil {
		return nil, oplog.Row{}, nil, scratch, err
	}
	var row oplog.Row
	if scratch == nil {
		row, err = oplog.Decode(b)
	} else {
		row, scratch, err = oplog.DecodeReusing(b, scratch)
	}
	if err != nil {
		return nil, oplog.Row{}, nil, scratch, &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", i, err)}
	}
	expected, err := outbox.Project(state, i, &row)
	if err != nil {
		return nil, oplog.Row{}, nil, scratch, &refusal{ClassOplogInconsistent, fmt.Sprintf("oplog row %d: %v", i, err)}
	}
	return b, row, expected, scratch, nil
}

// encodeExpected encodes an outbox row a replay projected, to be matched
// byte for byte against the stored one.
func encodeExpected(r *outbox.Row) ([]byte, error) {
	enc, err := outbox.Encode(r)
	if err != nil {
		return nil, fmt.Errorf("participant: encode expected outbox row: %w", err)
	}
	return enc, nil
}

// matchStored reads the next row of stored, which the caller knows is
// there, and refuses it (ClassOutboxConflict) unless it is enc byte for
// byte, the encoding of a row that oplog row i projects.
func matchStored(stored *pageReader, enc []byte, i uint64) error {
	at := stored.next
	have, err := stored.entry()
	if err != nil {
		return err
	}
	if !bytes.Equal(enc, have) {
		return &refusal{ClassOutboxConflict, fmt.Sprintf(
			"outbox row %d differs from the row oplog row %d projects", at, i)}
	}
	return nil
}

// validateOutbox checks c's outbox from row from (where its checkpoint
// stands) to its end, page by page, before anything of it is trusted:
// versions, decoding, increasing sources (outbox.Validator), and no row
// deriving from an oplog row at or past oplogLen.
func validateOutbox(st store.DurableStore, c ConversationID, pageBytes int, from, oplogLen uint64) (*refusal, error) {
	rd, err := newPageReader(st, outbox.Stream(c), pageBytes, from)
	if err != nil {
		return nil, err
	}
	v := outbox.Validator{First: from}
	var boundary *refusal
	for i := from; rd.more() && !v.Mixed(); i++ {
		b, err := rd.entry()
		if err != nil {
			return nil, err
		}
		row, ok := v.Add(b)
		if ok && boundary == nil && row.Source >= oplogLen {
			boundary = &refusal{ClassImpossibleBoundary, fmt.Sprintf(
				"impossible future boundary: outbox row %d derives from oplog row %d, the oplog has %d rows",
				i, row.Source, oplogLen)}
		}
	}
	err = v.Err()
	switch {
	case errors.Is(err, outbox.ErrMixedVersion):
		return &refusal{ClassOutboxMixedVersion, err.Error()}, nil
	case errors.Is(err, outbox.ErrUnknownVersion):
		return &refusal{ClassOutboxUnknownVersion, err.Error()}, nil
	case err != nil:
		return &refusal{ClassOutboxCorrupt, err.Error()}, nil
	}
	return boundary, nil
}

// errForgotten refuses an operation whose conversation was forgotten (its
// ownership lost) while it was being reconciled; nothing was committed.
//
// It is returned only under cv.mu, which checklocks would otherwise infer
// guards it; a global set once guards nothing.
var errForgotten = &Error{Code: CodeUnavailable, Detail: "the conversation's ownership was lost while loading it"} // +checklocksignore

// install publishes st, loaded or reconciled, as cv's state with its
// bindings' fence tokens, unless cv was forgotten since its turn's holder
// began to use it: then it installs nothing and returns errForgotten. The
// caller holds cv's turn.
func (cv *conversation) install(st *outbox.State, tokens map[ParticipantID]fenceToken) error {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if !cv.currentLocked() {
		return errForgotten
	}
	cv.installLocked(st, tokens)
	return nil
}

// installLocked publishes st as cv's state with its bindings' fence
// tokens; cv.mu is held, and cv was not forgotten (currentLocked).
//
// +checklocks:cv.mu
func (cv *conversation) installLocked(st *outbox.State, tokens map[ParticipantID]fenceToken) {
	cv.setStateLocked(st)
	cv.bindingTokens = tokens
}

// ensureLoadedTurn returns cv's state, reconciling it first when it is not
// loaded. The caller holds cv's turn. Loading ends the bindings that cannot
// be live any more — those of an earlier server incarnation
// (died/unclean_restart) and those of connections of this incarnation that
// have ended (died/connection_lost) — through the normal two barriers, and
// only then publishes: it wakes every connection with something to push.
func (s *Service) ensureLoadedTurn(ctx context.Context, cv *conversation) (*outbox.State, error) {
	// Before the grant: a Forget that overtakes it gives back what the
	// turn would park, at worst a slot whose binding a load then finds on
	// a connection with room for it, or ends.
	cv.mu.RLock()
	lost := cv.lost
	cv.mu.RUnlock()
	cv.lostAt = lost
	if err := s.acquireTurn(ctx, cv); err != nil {
		return nil, err
	}
	cv.heldAt = cv.resets.Load()
	cv.mu.RLock()
	st, unl := cv.state, cv.unloadable
	cv.mu.RUnlock()
	if unl != nil {
		return nil, refuse(CodeUnavailable, "conversation %v is unloadable: %s", cv.id, unl.Class)
	}
	if st != nil {
		if st.Deleted {
			return nil, errDeleted(cv.id)
		}
		return st, nil
	}
	if !cv.registered.Load() {
		if n, err := s.st.Len(oplog.Stream(cv.id)); err != nil {
			return nil, unavailable("looking the conversation up", err)
		} else if n > 0 {
			// Deleted (delete.go): its entry was forgotten.
			cv.registered.Store(true)
		}
	}
	if !cv.registered.Load() {
		// Never registered, so nothing of it is stored.
		st := &outbox.State{}
		if err := cv.install(st, make(map[ParticipantID]fenceToken)); err != nil {
			return nil, err
		}
		cv.settleParked()
		return st, nil
	}
	st, err := s.reconcileTurn(ctx, cv)
	if err != nil {
		return nil, err
	}
	charge, err := s.st.ReadValue(tokenindex.ChargeKey(cv.id))
	if err != nil {
		return nil, unavailable("reading the conversation's charge", err)
	}
	ends, live, err := s.rebindTurn(cv, st)
	if err != nil {
		return nil, err
	}
	cv.settleParked()
	s.chargeLoaded(cv, charge)
	s.forgetStaleBindings(cv.id, st)
	if len(ends) > 0 {
		if st, err = s.endStaleTurn(cv, st, ends); err != nil {
			return nil, err
		}
	}
	for _, c := range live {
		c.markReady(cv.id)
	}
	return st, nil
}

// reconcileTurn reconciles cv from the store, appends the outbox rows
// reconciliation repairs, and makes all of it durable, returning the
// reconciled state. A conversation whose stored rows are refused is
// contained: marked Unloadable, logged, and refused unavailable. The
// caller holds cv's turn.
func (s *Service) reconcileTurn(ctx context.Context, cv *conversation) (*outbox.State, error) {
	r, err := reconcile(ctx, s.st, cv.id, s.pages)
	var ref *refusal
	if errors.As(err, &ref) {
		s.contain(cv, ref)
		return nil, refuse(CodeUnavailable, "conversation %v is unloadable: %s", cv.id, ref.class)
	}
	if err != nil {
		return nil, unavailable("reconciling the conversation", err)
	}
	if r.Deleted {
		return nil, s.loadedDeleted(ctx, cv, r.DeletedAt)
	}
	s.countLoaded(cv, r.State)
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
	return r.State, nil
}

// containCorrupt contains cv, whose turn the caller holds, when err
// reports one of its stored values damaged (corruptRefusal): it is marked
// unloadable with ClassStoreCorrupt, as a start would find it, logged, and
// refused unavailable from its next operation on. Any other error is left
// to the caller. It reports whether it contained cv.
func (s *Service) containCorrupt(cv *conversation, err error) bool {
	var ref *refusal
	if !errors.As(corruptRefusal(err), &ref) || ref.class != ClassStoreCorrupt {
		return false
	}
	s.contain(cv, ref)
	return true
}

// contain marks cv unloadable with ref's finding, logs it, and gives back
// the binding slots parked on cv. Nothing of a contained conversation
// loads, so no load settles them, and each would hold its connection's
// slot of the cap until the connection ended. A binding one stands for,
// if it was stored, is found by a load of cv once it is loadable again
// (a fresh claim) and bound where its connection has room, or ended
// (rebindTurn), as after a Forget; a slot parked on cv from now on is
// given back at once (park).
func (s *Service) contain(cv *conversation, ref *refusal) {
	cv.mu.Lock()
	cv.unloadable = &Unloadable{Conversation: cv.id, Class: ref.class, Reason: ref.reason}
	parked := cv.parked
	cv.parked = nil
	cv.mu.Unlock()
	releaseAll(parked)
	s.log.Error().Uint64("conversation", uint64(cv.id)).Str("class", ref.class).Str("reason", ref.reason).
		Msg("conversation unloadable; contained")
}

// staleBinding is a binding a load ends: participant p's binding by conn,
// with its cause.
type staleBinding struct {
	p     ParticipantID
	conn  ConnID
	cause Cause
}

// rebindTurn sorts the bindings of st, conversation cv's reconciled
// state, whose turn the caller holds, and installs st with them: every
// site's current fence is revoked and each bound member is issued a new
// token; a binding whose connection is of an earlier incarnation, gone,
// ended (checked as it is published, under the connection's mu: rebind),
// or without room for it is stale and returned in ends, with its cause;
// any other is bound to its live connection again, which is returned in
// live when it has something to push. When cv was forgotten since its turn's holder
// began to use it, it publishes no binding and installs nothing, and
// returns errForgotten: a connection bound in a conversation this
// service forgot would count the binding against its cap, and may never
// learn of its end (another node ends it).
func (s *Service) rebindTurn(cv *conversation, st *outbox.State) (ends []staleBinding, live []*Conn, err error) {
	id := cv.id
	tokens := make(map[ParticipantID]fenceToken)
	type found struct {
		p ParticipantID
		c *Conn
	}
	var rebinds []found
	for i := range st.Members {
		p := ParticipantID(i)
		site := site{id, p}
		s.fences.RevokeCurrent(site)
		m := &st.Members[i]
		if !m.Bound {
			continue
		}
		row := oplog.Row{Participant: p, Conn: m.Conn, Generation: m.Generation}
		tokens[p] = s.fences.Issue(site, epochKey(id, &row), 1)
		c := s.conn(m.Conn)
		switch {
		case m.Conn.Server != s.incarnation:
			ends = append(ends, staleBinding{p, m.Conn, oplog.CauseUncleanRestart})
		case c == nil:
			ends = append(ends, staleBinding{p, m.Conn, oplog.CauseConnectionLost})
		default:
			rebinds = append(rebinds, found{p, c})
		}
	}
	if hook := s.rebindHook.Load(); hook != nil {
		(*hook)(id)
	}
	// Published under cv.mu with the state, so that a Forget comes
	// either before (nothing is published) or after (it forgets both).
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if !cv.currentLocked() {
		return nil, nil, errForgotten
	}
	for _, f := range rebinds {
		// The slot an unpublished enroll or attach of c parked (holding)
		// is taken over by the binding it made. Without one (given back
		// when the conversation was forgotten with its ownership:
		// Forget) the binding takes a free slot of c, or ends as it
		// would on any node that loads the conversation after the loss:
		// never past c's cap. A connection that ended, since it was
		// looked up or before, has the binding end here with the cause
		// its End was given (a bye stays detached/clean): End may have
		// listed its bindings already.
		if ok, cause := f.c.rebind(id, f.p, cv.takeParkedLocked(f.c), s.opts.MaxConversationsPerConn); !ok {
			ends = append(ends, staleBinding{f.p, f.c.id, cause})
			continue
		}
		if waiting(st, f.p) {
			live = append(live, f.c)
		}
	}
	cv.installLocked(st, tokens)
	return ends, live, nil
}

// endStaleTurn ends the stale bindings ends of cv, installed as st, in one
// batch through the normal two barriers, and returns the state after it.
// The caller holds cv's turn.
func (s *Service) endStaleTurn(cv *conversation, st *outbox.State, ends []staleBinding) (*outbox.State, error) {
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
	return b.st, nil
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
				delete(c.offered, id)
			}
		}
		c.mu.Unlock()
	}
}
