package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

var (
	_ participant.Ownership          = (*Node)(nil)
	_ participant.OrderedOwnership   = (*Node)(nil)
	_ participant.PipelinedOwnership = (*Node)(nil)
)

// Acquire grants c when the node owns it under a live lease, and otherwise
// claims it: a create-if-absent of own/<c> under the lease. A claim is
// fresh: the store forgets what it cached of c and fences c's commits with
// the claim's create revision. When another node holds c, Acquire returns
// participant's moved with that node's advertised address.
func (n *Node) Acquire(ctx context.Context, c participant.ConversationID) (bool, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false, ErrClosed
	}
	if !n.heldLocked() {
		n.mu.Unlock()
		return false, ErrNoLease
	}
	sc := scopeOf(c)
	fenced := false
	if _, ok := n.claimsByConv[c]; ok {
		ferr := n.etcd.Failed(sc)
		if ferr == nil {
			n.mu.Unlock()
			return false, nil
		}
		if !errors.Is(ferr, etcdstore.ErrFenced) {
			// The claim holds but a commit failed (its outcome unknown, a
			// compare refused): the store forgets what it held of c and
			// the service reconciles c from etcd. A commit still in flight
			// in etcd cannot fork c: the next commit compares the lengths
			// read now.
			n.etcd.Reset(sc)
			n.mu.Unlock()
			return true, nil
		}
		// Fenced off: the claim is gone, whatever the node believed. It
		// is dropped as a lost lease drops it (the service forgets c),
		// then claimed afresh (or the new owner learnt). The caller
		// holds c's turn, so nothing claims c meanwhile.
		fenced = true
	}
	lease := n.lease
	n.mu.Unlock()
	if fenced {
		n.fencedOff(c)
	}

	key := n.ownKey(c)
	rev, err := n.claim(ctx, c, key, lease)
	if err != nil {
		return false, err
	}
	n.mu.Lock()
	if n.lease != lease {
		// The lease was lost while claiming: the key went with it.
		n.mu.Unlock()
		return false, ErrNoLease
	}
	n.etcd.SetFence(sc, etcdstore.Fence{Key: key, CreateRevision: rev})
	n.etcd.Reset(sc)
	n.claimsByConv[c] = rev
	n.owned.Add(1)
	n.mu.Unlock()
	n.claims.Add(1)
	n.obs.Claimed()
	return true, nil
}

// claim creates own/<c> (key) under lease, and returns the claim's create
// revision, which fences c's commits. A key of this node's that it does
// not hold as a claim (under a lease it lost; or under its lease, made by
// an earlier claim whose answer was lost, or released by an unclaim that
// has not applied and may still apply later) is deleted and claimed
// again: taken back as it is, a late unclaim, which compares the same
// create revision, would delete the claim the node then holds. When
// another node holds c, it returns participant's moved with that node's
// advertised address.
func (n *Node) claim(ctx context.Context, c participant.ConversationID, key string, lease clientv3.LeaseID) (int64, error) {
	for attempt := 0; ; attempt++ {
		// The claim itself checks that no restore is writing the prefix
		// (ErrRestoring): a node that started before the restore's first
		// transaction must not load a half-restored conversation.
		made, held, err := n.create(ctx, key, lease)
		if err != nil {
			// ErrRestoring, or else the claim may have been made: a retry
			// finds it under this lease.
			return 0, fmt.Errorf("cluster: claim %v: %w", c, err)
		}
		if made != 0 {
			return made, nil
		}
		if held == nil {
			return 0, fmt.Errorf("cluster: claim %v: owner vanished while claiming; retry", c)
		}
		mine := clientv3.LeaseID(held.Lease) == lease || n.isStale(held.Lease)
		if mine && attempt == 0 {
			// Nothing commits under that key (the store has no fence of
			// it, or dropped it), so it goes now; the claim made next has
			// a create revision no earlier transaction compares.
			if err := n.deleteIfUnchanged(ctx, key, held.ModRevision); err != nil {
				return 0, fmt.Errorf("cluster: claim %v: %w", c, err)
			}
			continue
		}
		if mine {
			return 0, fmt.Errorf("cluster: claim %v: a claim of this node's reappeared while claiming; retry", c)
		}
		var r record
		body, err := n.unseal(key, held.Value)
		if err == nil {
			err = json.Unmarshal(body, &r)
		}
		if err != nil {
			// Another node's record this one cannot read (a newer
			// version, say): moved without an owner sends the client
			// to any node rather than to a wrong address.
			n.log.Warn().Err(err).Uint64("conversation", uint64(c)).Msg("unreadable ownership record; answering moved without an owner")
			r = record{}
		}
		n.moves.Add(1)
		n.obs.Moved()
		return 0, &participant.Error{Code: participant.CodeMoved, Owner: r.Addr,
			Detail: fmt.Sprintf("conversation %v is owned by node %q", c, r.Node)}
	}
}

// Holds reports whether the node still holds c: claimed, under a lease
// whose local deadline has not passed by either clock. Past the deadline
// etcd may have expired the lease and another node claimed c, so the
// node pushes nothing more of c (participant.Conn.Next asks) from that
// instant, not from when its keep-alive notices.
func (n *Node) Holds(c participant.ConversationID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.claimsByConv[c]
	return ok && n.heldLocked()
}

// Flush makes c's writes and the node's own global writes durable; its
// error concerns c (and the node) only, never another conversation. A
// failure of c's scope is a *ConversationError (not store.ErrFailed: the
// node keeps serving its other conversations); a failure of the node's
// global scope is returned as it is. A commit etcd refused on c's fence
// (etcdstore.ErrFenced: another node claimed c) ends the claim at once,
// as a lost lease ends it: the node pushes nothing more of c (Holds) and
// the service forgets c, whether or not anything acquires c again.
func (n *Node) Flush(c participant.ConversationID) error {
	sc := scopeOf(c)
	err := n.etcd.FlushScopes(sc, "")
	if err != nil && errors.Is(err, store.ErrFailed) && n.etcd.Failed("") == nil {
		if errors.Is(err, etcdstore.ErrFenced) {
			n.fencedOff(c)
		}
		return &ConversationError{Scope: sc, err: err}
	}
	return err
}

// fencedOff drops c, whose commit etcd refused on the fence, if the node
// still holds its claim; a scope already dropped (its claim released or
// its lease lost) is refused as fenced too, and has nothing left to end.
//
// Holds stays true from the refusal until the flusher gets here, and
// nothing in that window is pushed or answered that could not have been
// an instant before the refusal, when the node did not know yet. The
// store fails c's scope under its lock before any flusher of it wakes
// (etcdstore applyLocked), and the error is sticky until a Reset, which
// Acquire makes for a scope fenced off only once it claimed c afresh
// (and dropped the old claim here first): from the refusal on,
// every read and every flush of c's scope fails, so no commit of c is
// answered (a batch answers only once its flush returned nil) and no
// token replays (its index is read). A delivery pushes only the state
// the service published (Conn.Next), which it publishes only after a
// flush that returned nil (a batch, a load); an evicted payload is read
// back from c's scope, which refuses it. What Next may push in the
// window was committed under the claim before the other node took it,
// as was everything it pushed since that take, a stretch that begins at
// the take (the node's lease deadline or a pause, not the refusal) and
// that fencing and the clients' dedupe by (conversation, recipient, seq)
// already cover. A refused batch holds c's turn through here; a refused
// background pass (a checkpoint) holds none, and a batch of c deciding
// meanwhile can answer only what it decides from that same published
// state without the store (a refusal, an ack below the cursor), as it
// could before the refusal.
func (n *Node) fencedOff(c participant.ConversationID) {
	n.mu.Lock()
	_, ok := n.claimsByConv[c]
	if ok {
		delete(n.claimsByConv, c)
		n.owned.Add(-1)
	}
	n.mu.Unlock()
	if ok {
		n.drop(c)
	}
}

// KeepsOrder implements participant.OrderedOwnership: every name a batch
// of c writes (its streams, its token index, its charge) is in c's scope
// (Scope), and the etcd store keeps a scope's writes in order across a
// crash (store.ScopeOrdered: one transaction at a time, cut along the
// scope's log when it does not fit one, none after a failed one), under
// the claim that fences each of those transactions. A batch then flushes
// once for both barriers. A node writes no registry entry (the node's
// global scope, whose order with c's is not kept): a claim is a fresh
// grant, which counts c as registered (participant, acquireTurn).
func (n *Node) KeepsOrder(participant.ConversationID) bool { return true }

// Pipelines implements participant.PipelinedOwnership: a batch of c may
// hand c's turn on before its commit is durable, and the batches decided
// meanwhile, which ask Acquire nothing, commit under the claim the last
// Acquire took or not at all. Every transaction of c's scope compares
// that claim's fence, so a commit sent after the claim was lost (its
// lease expired, another node took c) is refused; c's scope commits one
// transaction at a time and none after a failed one, so a later batch's
// writes are never committed after an earlier one's failed (the scope's
// error is sticky until Acquire resets it); and a lost lease or a
// release drops the scope (Drop), discarding what was staged and not yet
// taken by a commit, so nothing of c staged under the old claim is
// committed under a new one. A claim taken afresh is taken by Acquire
// alone, which the service asks only while no batch of c is in flight.
func (n *Node) Pipelines(participant.ConversationID) bool { return true }

// Exists reports whether conversation c has anything stored, or an owner.
func (n *Node) Exists(ctx context.Context, c participant.ConversationID) (bool, error) {
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	resp, err := n.cli.Txn(cctx).Then(
		clientv3.OpGet(n.etcd.ScopePrefix(scopeOf(c)), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		clientv3.OpGet(n.ownKey(c), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("cluster: look up %v: %w", c, err)
	}
	return len(resp.Responses[0].GetResponseRange().Kvs) > 0 || len(resp.Responses[1].GetResponseRange().Kvs) > 0, nil
}
