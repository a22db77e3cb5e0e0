package participant

import (
	"context"
	"errors"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// CodeMoved is the protocol's `moved`: another node owns the conversation
// (cluster mode). Error.Owner names it; empty when no node owns it at the
// moment.
const CodeMoved Code = "moved"

// ErrMoved matches every moved refusal (errors.Is).
var ErrMoved = &Error{Code: CodeMoved}

// Ownership decides which conversations this service may serve, and makes
// their writes durable under that right. It is the service's only seam to
// cluster mode (see docs/DESIGN.md, "Cluster mode: decisions"): the default,
// for a single node, grants everything and flushes the store; the cluster
// implementation claims conversations under an etcd lease and fences every
// commit with the claim.
//
// Acquire and Flush are called by the holder of c's turn; implementations
// must not wait on anything only that turn's holder can release.
type Ownership interface {
	// Acquire reports whether the service may serve c now. It returns an
	// error matching ErrMoved (with Owner) when another node owns c, and
	// another error when ownership cannot be decided (unavailable). fresh
	// reports that the right to c was gained since the last grant, so that
	// anything held in memory of c is stale: the service reconciles c from
	// the store before using it.
	Acquire(ctx context.Context, c ConversationID) (fresh bool, err error)
	// Holds reports whether the right to serve c that the last Acquire
	// granted still holds by the local clock: false from the instant it
	// may have lapsed (another node may own c by then), before the loss
	// is noticed and c forgotten. The service pushes nothing of c while
	// it is false. It must be cheap: it is asked for every delivery.
	Holds(c ConversationID) bool
	// Flush returns nil only when every write of c made before the call is
	// durable under c's ownership. A failure concerns c only.
	Flush(c ConversationID) error
	// Exists reports whether c has data in the store although this service
	// has no entry for it (another node created it, or it was deleted and
	// its entry forgotten), so that a request on it is served, routed or
	// answered retired rather than unknown_participant.
	Exists(ctx context.Context, c ConversationID) (bool, error)
}

// OrderedOwnership is implemented by an Ownership under which c's writes
// keep their order across a crash (store.Ordered): whatever survives is a
// prefix of them in the order they returned, whichever Flushes carried
// them. A batch then appends its oplog rows before its outbox rows and
// flushes once, so that barrier 1 shares the sync of barrier 2 (see
// docs/DESIGN.md, "One sync for both barriers"). An Ownership without it,
// or answering false, gets a flush per barrier.
type OrderedOwnership interface {
	// KeepsOrder reports whether c's writes keep their order across a
	// crash. It is asked once per batch and must be cheap.
	KeepsOrder(c ConversationID) bool
}

// PipelinedOwnership is implemented by an Ownership that lets a batch of
// c hand c's turn on before its commit is durable (pipelined batches;
// docs/DESIGN.md). The batches decided while such a batch is in flight
// ask Acquire nothing: the right they commit under is the one the last
// Acquire granted, and Pipelines promises that a commit of c made after
// that right was lost fails (single node: it is never lost; cluster mode:
// every transaction compares c's fence), and that a claim of c taken
// afresh discards whatever of c was written and not yet committed (only
// Acquire takes one, and Acquire runs only while no batch of c is in
// flight). Only asked of an Ownership under which c's writes keep their
// order (OrderedOwnership), so that a crash keeps a prefix of them.
type PipelinedOwnership interface {
	// Pipelines reports whether batches of c may be pipelined. It is
	// asked once per batch and must be cheap.
	Pipelines(c ConversationID) bool
}

// SealingOwnership is implemented by an Ownership under which c's writes
// are committed one at a time, in order, each commit only once the one
// before it is durable (store.Sealer). Seal returns once every write of c
// made before the call is carried by a commit under way, so that any
// write of c made after it goes to a later commit; wait then returns nil
// only once the sealed writes are durable under c's ownership. A batch
// seals its oplog rows and appends its outbox rows while they are being
// written, instead of waiting for them first (see docs/DESIGN.md, "Sealed
// barriers"). An Ownership without it gets a flush per barrier.
type SealingOwnership interface {
	// Seal seals c's writes; err is a failure known at once (wait is
	// then nil), else wait must be called exactly once.
	Seal(c ConversationID) (wait func() error, err error)
}

// single is the Ownership of a single node: it owns everything.
type single struct{ st store.DurableStore }

// Seal implements SealingOwnership with the store's Seal, or its Flush
// (store.Seal).
func (o single) Seal(ConversationID) (func() error, error) { return store.Seal(o.st) }

// KeepsOrder implements OrderedOwnership with the store's answer: it
// keeps every write's order (store.Ordered), or those of the names a
// batch of c writes, which share one of its scopes (store.ScopeOrdered).
// Ordered is asked first so that a store that keeps every write's order
// (the log-first store) costs a batch no names.
func (o single) KeepsOrder(c ConversationID) bool {
	return store.KeepsOrder(o.st) || store.KeepsOrderWithin(o.st, batchNames(c)...)
}

// batchNames are the names a batch of c writes, but for the registry
// (see batch.write): its two streams, its token index (a token's key, the
// window's floor) and its charge.
func batchNames(c ConversationID) []string {
	return []string{oplog.Stream(c), outbox.Stream(c), tokenindex.Key(c, tokenindex.Enroll, Token{}),
		tokenindex.FloorKey(c), tokenindex.ChargeKey(c)}
}

// keepsRegistryOrder reports whether the registry's writes keep their
// order with c's across a crash, so that c's genesis row is never
// durable without the registry entry appended before it.
func (s *Service) keepsRegistryOrder(c ConversationID) bool {
	return store.KeepsOrderWithin(s.st, registry.Stream, oplog.Stream(c))
}

// Pipelines implements PipelinedOwnership: a single node's right to serve
// c is never lost.
func (single) Pipelines(ConversationID) bool { return true }

func (single) Acquire(context.Context, ConversationID) (bool, error) { return false, nil }
func (o single) Flush(ConversationID) error                          { return o.st.Flush() }
func (single) Holds(ConversationID) bool                             { return true }

// Exists finds the conversations a single node has no entry for although
// they are stored: the deleted ones (delete.go), whose entries it forgot.
func (o single) Exists(_ context.Context, c ConversationID) (bool, error) {
	n, err := o.st.Len(oplog.Stream(c))
	return n > 0, err
}

// ownership returns the configured Ownership, or the single-node one.
func (s *Service) ownership() Ownership { return s.own }

// ownershipOf returns opts' Ownership, or the single-node one over st.
// The service keeps it (Service.own): made per call, the single-node one
// was an allocation per barrier.
func ownershipOf(opts *Options, st store.DurableStore) Ownership {
	if opts.Ownership != nil {
		return opts.Ownership
	}
	return single{st}
}

// flush is the barrier of cv's writes.
func (s *Service) flush(c ConversationID) error { return s.ownership().Flush(c) }

// seal is barrier 1 of cv's writes under a SealingOwnership: it returns
// once they are carried by a commit under way, and wait once they are
// durable. Under any other Ownership it flushes them, and wait returns nil.
func (s *Service) seal(c ConversationID) (wait func() error, err error) {
	if o, ok := s.ownership().(SealingOwnership); ok {
		return o.Seal(c)
	}
	if err := s.flush(c); err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}

// pipelinesOwnership reports whether the Ownership lets batches of c be
// pipelined (PipelinedOwnership).
func (s *Service) pipelinesOwnership(c ConversationID) bool {
	o, ok := s.ownership().(PipelinedOwnership)
	return ok && o.Pipelines(c)
}

// keepsOrder reports whether c's writes keep their order across a crash
// (OrderedOwnership), so that one flush serves both of a batch's barriers.
func (s *Service) keepsOrder(c ConversationID) bool {
	o, ok := s.ownership().(OrderedOwnership)
	return ok && o.KeepsOrder(c)
}

// acquireTurn asks for the right to serve cv; the caller holds cv's turn.
// A fresh grant forgets what memory holds of cv, so that it is reconciled
// from the store: another node may have written it meanwhile.
func (s *Service) acquireTurn(ctx context.Context, cv *conversation) error {
	fresh, err := s.ownership().Acquire(ctx, cv.id)
	if err != nil {
		if errors.Is(err, ErrMoved) {
			// Another node serves cv, whether or not a Forget said so
			// (cluster mode: a commit fenced off, the claim found taken):
			// the slots parked on it are given back as Forget gives them.
			cv.mu.Lock()
			parked := cv.disownLocked()
			cv.mu.Unlock()
			releaseAll(parked)
			var pe *Error
			errors.As(err, &pe)
			return pe
		}
		return unavailable("deciding the conversation's owner", err)
	}
	if fresh {
		cv.registered.Store(true)
		cv.mu.Lock()
		cv.forgetLocked()
		cv.unloadable = nil
		cv.mu.Unlock()
	}
	return nil
}

// adopt returns a pinned entry for conversation id, which this service has
// none of, when the Ownership says it exists elsewhere; nil when it does
// not.
func (s *Service) adopt(ctx context.Context, id ConversationID) (*conversation, error) {
	ok, err := s.ownership().Exists(ctx, id)
	if err != nil {
		return nil, unavailable("looking the conversation up", err)
	}
	if !ok {
		return nil, nil
	}
	return s.pin(id), nil
}

// refuseStateless refuses an enroll from c into a conversation that
// exists nowhere when a check that needs none of its state refuses it:
// the token window; under the invite policy, no valid invitation; then the connection's
// bindings, the store's size, c's creation rate (its bucket empty: this
// check takes nothing from it), the server's conversations, c's
// principal's share, and the server's backlog ceiling at their limits
// (what the usual
// path would answer, in its order: decide.go, backpressure.go, share.go).
// No token of a conversation that exists nowhere can have committed, so
// nothing could replay. It is decided before the conversation is touched,
// so it costs none: in cluster mode a touch claims the conversation (an
// etcd write, and a claim that stays) and loads it; here the cost is at
// most a read (Exists), and only for an enroll that is refused. An enroll
// into a conversation that exists goes the usual way, where a committed
// token replays first (PROTOCOL.md, admission); so does one when the
// lookup fails. The checks are those of an enroll that stages nothing
// yet, so they refuse nothing the usual path would admit.
func (s *Service) refuseStateless(ctx context.Context, c *Conn, req *Enroll) error {
	if s.existing(req.Conversation) != nil || s.isDraining() {
		// A draining service answers shutting_down first (Conn.start).
		return nil
	}
	e, scope := s.statelessEnroll(c, req)
	if e == nil {
		return nil
	}
	if ok, err := s.ownership().Exists(ctx, req.Conversation); err != nil || ok {
		return nil
	}
	if scope != "" {
		s.backlog.refusals.add(scope)
	}
	return e
}

// statelessEnroll runs the checks of an enroll from c that need no state
// of its conversation, as if it were new, in the protocol's order. It
// returns the refusal, and for backlog_full the scope of the limit.
func (s *Service) statelessEnroll(c *Conn, req *Enroll) (*Error, string) {
	// The token first: a conversation that exists nowhere has no
	// persisted floor.
	if err := s.windowAdmits(0, req.Token); err != nil {
		var pe *Error
		errors.As(err, &pe)
		return pe, ""
	}
	d := c.decider(req.Conversation)
	if d.requireInvite {
		if e := checkInvite(d.key, d.conv, d.now, req.Invite); e != nil {
			return e, ""
		}
	}
	c.mu.Lock()
	d.connBindings = len(c.bindings) + c.reserved
	c.mu.Unlock()
	if e := d.connCapacity(); e != nil {
		return e, ""
	}
	if e := d.dataCapacity(); e != nil {
		return e, ""
	}
	if e := c.createsExhausted(); e != nil {
		return e, ""
	}
	if e := s.conversationSlots.full(); e != nil {
		return e, ""
	}
	total := s.backlog.records.Load()
	if sh := c.share; sh != nil {
		if e := s.shareRefusal(sh, sh.records.Load(), total, int64(s.conversationSlots.count())+1, false); e != nil {
			if e.Code == CodeBacklogFull {
				return e, backlogScopeClient
			}
			return e, ""
		}
	}
	return s.backlog.limits.admit(0, total, false)
}

// disownLocked records that this service lost the right to serve cv
// (lost), and takes the binding slots parked on it, which the caller gives
// back once cv.mu is released (releaseAll); cv.mu is held.
//
// +checklocks:cv.mu
func (cv *conversation) disownLocked() []*bindingSlot {
	cv.lost++
	parked := cv.parked
	cv.parked = nil
	return parked
}

// releaseAll gives back each of slots.
func releaseAll(slots []*bindingSlot) {
	for _, slot := range slots {
		slot.release()
	}
}

// Forget drops what memory holds of conversation id, because this service
// lost the right to serve it: nothing more of it is pushed, and the next
// operation on it asks the Ownership again. Correctness does not rest on
// Forget (the store's fence refuses every commit of a lost conversation);
// it makes a loss visible at once.
//
// The binding slots parked on id (park) are given back, and so is any
// slot a batch of id running now would park: a binding they stand for,
// if it was stored, is the next owner's to end, and this service may
// never load id again. Should it load id again, a binding it finds on a
// connection that has no room for it any more is ended (rebindTurn).
func (s *Service) Forget(id ConversationID) {
	cv := s.existing(id)
	if cv == nil {
		return
	}
	cv.mu.Lock()
	cv.forgetLocked()
	parked := cv.disownLocked()
	cv.mu.Unlock()
	releaseAll(parked)
}
