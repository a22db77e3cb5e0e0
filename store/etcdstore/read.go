package etcdstore

import (
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Batched value reads. Every operation that carries a token reads its
// index key before it commits (for a new token: absent), so in cluster
// mode there is one value read per operation, against one transaction per
// group commit. Sent one by one, those reads cost etcd and the node a gRPC
// request each, which on a CPU-bound cluster is a large part of what an
// operation costs. Reads of fenced scopes (serializable) therefore share
// requests: a read joins a queue; while fewer than Options.MaxInflightReads
// batches are in flight, its caller sends what is queued at once (up to
// MaxTxnOps keys) as one read-only transaction of serializable Gets, which
// etcd answers from the member's own store, without the leader; reads that
// arrive meanwhile queue and go in the next batch, sent by one of their own
// callers when a batch finishes. So a read waits at most for one batch in
// flight, and batches grow only with load; no goroutine or timer is
// involved.
//
// Each read is pinned at its scope's revision (see Store.loadValue), so a
// member behind it refuses the batch (etcd's "required revision is a
// future revision") rather than answering stale data. The batch then goes
// to the leader as it is (with leader affinity: the leader answered the
// commits that advanced the revisions only once it had applied them, so it
// answers from its own store, without a round of heartbeats), or else as
// linearizable Gets of the newest values, which a member answers only once
// it has caught up with the leader; so does a batch whose pinned revision
// etcd compacted away. So a read costs one request while the member has
// applied the scope's revision, two when not. A member is often one
// commit behind right after a commit of the scope (a follower learns that
// an entry committed with the leader's next message), so a scope read
// just after its own commit takes the second request on a follower.
//
// A batch that fails (timeout, lost connection) fails each of its reads
// with that error, as a Get of its own would have; nothing is cached here.

// readReq is one value read: key is the etcd key; val and err are its
// result once done. lead is set when the caller is handed the turn to send
// the next batch. wake (capacity 1) is signalled once per change of done
// or lead. Guarded by Store.rmu.
type readReq struct {
	key  string
	rev  int64
	val  uint64
	err  error
	done bool
	lead bool
	wake chan struct{}
}

// readBatched reads value key (its etcd key) at revision rev, serializably,
// sharing a request with the reads queued beside it.
func (s *Store) readBatched(key string, rev int64) (uint64, error) {
	r := &readReq{key: key, rev: rev, wake: make(chan struct{}, 1)}
	s.rmu.Lock()
	s.rqueue = append(s.rqueue, r)
	lead := s.ractive < s.opts.MaxInflightReads
	if lead {
		s.ractive++
	}
	s.rmu.Unlock()
	for {
		if lead {
			s.sendReads()
		}
		s.rmu.Lock()
		for !r.done && !r.lead {
			s.rmu.Unlock()
			<-r.wake
			s.rmu.Lock()
		}
		done := r.done
		lead, r.lead = r.lead, false
		s.rmu.Unlock()
		if done {
			// The turn goes only to a read still queued, so a caller
			// answered holds none.
			return r.val, r.err
		}
	}
}

// sendReads sends one batch of the queued reads (the caller holds one of
// the MaxInflightReads turns), answers them, and passes the turn to the
// first read still queued, or gives it back.
func (s *Store) sendReads() {
	s.rmu.Lock()
	n := min(len(s.rqueue), s.opts.MaxTxnOps)
	if n == 0 {
		// Another sender took this caller's read along with its own
		// (both got a turn at once): nothing left to send.
		s.ractive--
		s.rmu.Unlock()
		return
	}
	batch := s.rqueue[:n:n]
	s.rqueue = s.rqueue[n:]
	if len(s.rqueue) == 0 {
		s.rqueue = nil
	}
	s.rmu.Unlock()

	vals, err := s.getValues(batch)
	s.reads.Add(1)

	s.rmu.Lock()
	var woken []*readReq
	for i, r := range batch {
		r.done = true
		if err != nil {
			r.err = err
		} else {
			r.val, r.err = vals[i].val, vals[i].err
		}
		woken = append(woken, r)
	}
	if len(s.rqueue) > 0 {
		next := s.rqueue[0]
		next.lead = true
		woken = append(woken, next)
	} else {
		s.ractive--
	}
	s.rmu.Unlock()
	for _, r := range woken {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// readResult is the outcome of one key of a batch.
type readResult struct {
	val uint64
	err error
}

// getValues reads the keys of batch in one read-only transaction of
// serializable Gets, each at its revision. When the member has not reached
// one of them, it sends the same again to the leader (with leader
// affinity), and when that fails too, or etcd compacted a revision away,
// as linearizable Gets of the newest values (a scope's revision advances
// only with its commits and loads, so an idle scope's reads past etcd's
// compaction cost two requests each).
func (s *Store) getValues(batch []*readReq) ([]readResult, error) {
	ops := make([]clientv3.Op, len(batch))
	for i, r := range batch {
		ops[i] = clientv3.OpGet(r.key, clientv3.WithSerializable(), clientv3.WithRev(r.rev))
	}
	resp, err := s.readTxn(s.kv, ops)
	if errors.Is(err, rpctypes.ErrFutureRev) && s.leader != nil {
		// The commits the revisions come from were answered by the
		// leader once it had applied them: it has them, unless the
		// leadership moved since.
		if kv, lc := s.commitKV(); lc != nil {
			s.caughtUp.Add(1)
			resp, err = s.readTxn(kv, ops)
			if behind(err) {
				s.commitDone(lc, nil)
			} else {
				s.commitDone(lc, err)
			}
		}
	}
	if behind(err) {
		s.caughtUp.Add(1)
		for i, r := range batch {
			ops[i] = clientv3.OpGet(r.key)
		}
		resp, err = s.readTxn(s.kv, ops)
	}
	if err != nil {
		return nil, fmt.Errorf("etcdstore: read %d values: %w", len(batch), err)
	}
	if len(resp.Responses) != len(batch) {
		return nil, fmt.Errorf("%w: a read of %d values answered %d", ErrCorrupt, len(batch), len(resp.Responses))
	}
	out := make([]readResult, len(batch))
	for i, rr := range resp.Responses {
		kvs := rr.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue
		}
		out[i].val, out[i].err = s.unsealU64(batch[i].key, kvs[0].Value)
	}
	return out, nil
}

// readTxn sends ops as one read-only transaction through kv.
func (s *Store) readTxn(kv clientv3.KV, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	return kv.Txn(ctx).Then(ops...).Commit()
}

// behind reports whether a pinned read failed because the member has not
// reached its revision, or etcd compacted it away.
func behind(err error) bool {
	return errors.Is(err, rpctypes.ErrFutureRev) || errors.Is(err, rpctypes.ErrCompacted)
}
