package etcdtest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store/etcdstore"
)

// Lagging is a clientv3.KV that answers some serializable reads as an etcd
// member cut off from its peers does: from its own store, at the revision it
// last applied, which may be far behind the cluster's. etcd's client spreads
// requests over the members it knows, so in a real cluster a share of
// serializable reads reach such a member and get arbitrarily old data; a
// one-member test cluster never does, so the tests wrap their KV in this.
//
// The model, per serializable read (a Get, or a read-only transaction of
// serializable Gets): half of them reach the lagging member, the others an
// up-to-date one (passed through). The lagging member is either in step or
// frozen at a revision picked among the last revisions seen through this
// KV; a read that reaches it while in step freezes it with probability 1/3,
// one that reaches it while frozen lets it catch up with probability 1/8.
// A frozen member honours etcd's semantics: a read pinned at a revision
// past its own fails with rpctypes.ErrFutureRev ("required revision is a
// future revision"), any other is answered at the pinned revision or, when
// unpinned, at the member's own, and the answer's header carries the
// member's revision. Linearizable reads and every write pass through: a
// cut-off member cannot serve them (it waits for the leader).
//
// The decisions come from a generator seeded by the caller, so one seed
// makes one stream of decisions; which read meets which decision depends
// on the order callers reach the KV in. Lagging is safe for concurrent use.
//
// A freeze picks its revision anew, so successive freezes may go back in
// time, as successive reads that reach different lagging members do. It
// does not model slow or lost answers (see Cluster.Stop for an unreachable
// member) nor a member that serves linearizable reads stale (etcd's read
// index prevents it).
type Lagging struct {
	kv clientv3.KV

	// stale counts the unpinned reads answered at the lagging member's
	// revision, refused those refused as future revisions.
	stale   atomic.Uint64
	refused atomic.Uint64

	// mu guards the fields below.
	mu  sync.Mutex
	rng *rand.Rand
	// seen holds the last revisions answers carried (a ring), latest the
	// highest of them.
	seen   []int64
	next   int
	latest int64
	// applied is the frozen member's revision; 0 while it is in step.
	applied int64
	// frozen, set by Freeze, replaces the random model: every
	// serializable read of a key frozenKeys matches reaches a member at
	// frozen.
	frozen     int64
	frozenKeys func(key string) bool
}

// lagHistory is how many of the last revisions seen a frozen member may
// be frozen at.
const lagHistory = 256

// Lag returns kv with a lagging member in front of its serializable reads,
// its decisions drawn from seed.
func Lag(kv clientv3.KV, seed uint64) *Lagging {
	return &Lagging{kv: kv, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995)), seen: make([]int64, 0, lagHistory)}
}

// Stale returns how many unpinned reads the lagging member answered at its
// own revision, behind the newest one seen.
func (l *Lagging) Stale() uint64 { return l.stale.Load() }

// Refused returns how many reads the lagging member refused as future
// revisions.
func (l *Lagging) Refused() uint64 { return l.refused.Load() }

// Freeze replaces the random model, until Thaw, by one member frozen at
// rev that answers every serializable read of a key keys matches (nil:
// every key; a transaction goes there when any of its keys matches), for
// a test that needs one schedule: one read reaching a lagging member, the
// one beside it an up-to-date one.
func (l *Lagging) Freeze(rev int64, keys func(key string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if keys == nil {
		keys = func(string) bool { return true }
	}
	l.frozen, l.frozenKeys = rev, keys
}

// Thaw brings the frozen member of Freeze in step and the random model
// back.
func (l *Lagging) Thaw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frozen, l.frozenKeys = 0, nil
}

// observe records a revision an answer carried.
func (l *Lagging) observe(rev int64) {
	if rev <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev <= l.latest {
		return
	}
	l.latest = rev
	if len(l.seen) < lagHistory {
		l.seen = append(l.seen, rev)
	} else {
		l.seen[l.next] = rev
		l.next = (l.next + 1) % lagHistory
	}
}

// route decides where one serializable read of keys goes: 0 for an
// up-to-date member, else the revision of the frozen member that answers
// it.
func (l *Lagging) route(keys ...[]byte) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frozenKeys != nil {
		for _, k := range keys {
			if l.frozenKeys(string(k)) {
				return l.frozen
			}
		}
		return 0
	}
	if l.rng.IntN(2) == 0 || len(l.seen) == 0 {
		return 0
	}
	switch {
	case l.applied == 0 && l.rng.IntN(3) == 0:
		l.applied = l.seen[l.rng.IntN(len(l.seen))]
	case l.applied != 0 && l.rng.IntN(8) == 0:
		l.applied = 0
	}
	if l.applied >= l.latest {
		l.applied = 0
	}
	return l.applied
}

// catchUp brings the frozen member in step (its revision was compacted
// away: a real member never holds less than the cluster compacted).
func (l *Lagging) catchUp() {
	l.mu.Lock()
	l.applied, l.frozen = 0, 0
	l.mu.Unlock()
}

// pin returns the revision a read asking for rev is answered at by a
// member at applied, or rpctypes.ErrFutureRev.
func pin(rev, applied int64) (int64, error) {
	switch {
	case rev > applied:
		return 0, rpctypes.ErrFutureRev
	case rev > 0:
		return rev, nil
	}
	return applied, nil
}

// Get implements clientv3.KV.
func (l *Lagging) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	if op.IsSerializable() {
		if applied := l.route(op.KeyBytes()); applied != 0 {
			rev, err := pin(op.Rev(), applied)
			if err != nil {
				l.refused.Add(1)
				return nil, err
			}
			resp, err := l.kv.Get(ctx, key, append(opts[:len(opts):len(opts)], clientv3.WithRev(rev))...)
			if errors.Is(err, rpctypes.ErrCompacted) {
				l.catchUp()
				return l.Get(ctx, key, opts...)
			}
			if err != nil {
				return nil, err
			}
			if op.Rev() == 0 {
				l.stale.Add(1)
			}
			resp.Header.Revision = applied
			return resp, nil
		}
	}
	resp, err := l.kv.Get(ctx, key, opts...)
	if err == nil {
		l.observe(resp.Header.Revision)
	}
	return resp, err
}

// Put implements clientv3.KV.
func (l *Lagging) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	resp, err := l.kv.Put(ctx, key, val, opts...)
	if err == nil {
		l.observe(resp.Header.Revision)
	}
	return resp, err
}

// Delete implements clientv3.KV.
func (l *Lagging) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	resp, err := l.kv.Delete(ctx, key, opts...)
	if err == nil {
		l.observe(resp.Header.Revision)
	}
	return resp, err
}

// Compact implements clientv3.KV.
func (l *Lagging) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return l.kv.Compact(ctx, rev, opts...)
}

// Do implements clientv3.KV; it passes every op through.
func (l *Lagging) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	return l.kv.Do(ctx, op)
}

// GetStream implements clientv3.KV; it passes through.
func (l *Lagging) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	return l.kv.GetStream(ctx, key, opts...)
}

// Txn implements clientv3.KV: a read-only transaction of serializable
// Gets may reach the lagging member; any other passes through.
func (l *Lagging) Txn(ctx context.Context) clientv3.Txn { return &lagTxn{l: l, ctx: ctx} }

type lagTxn struct {
	l           *Lagging
	ctx         context.Context
	cmps        []clientv3.Cmp
	thens, elss []clientv3.Op
}

func (t *lagTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.cmps = append(t.cmps, cs...); return t }
func (t *lagTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thens = append(t.thens, ops...)
	return t
}
func (t *lagTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.elss = append(t.elss, ops...); return t }

// serializableReads reports whether the transaction is one etcd answers
// from a member's own store: no compares, only serializable Gets.
func (t *lagTxn) serializableReads() bool {
	if len(t.cmps) > 0 || len(t.elss) > 0 || len(t.thens) == 0 {
		return false
	}
	for _, op := range t.thens {
		if !op.IsGet() || !op.IsSerializable() {
			return false
		}
	}
	return true
}

func (t *lagTxn) Commit() (*clientv3.TxnResponse, error) {
	l := t.l
	if t.serializableReads() {
		keys := make([][]byte, len(t.thens))
		for i, op := range t.thens {
			keys[i] = op.KeyBytes()
		}
		if applied := l.route(keys...); applied != 0 {
			ops := make([]clientv3.Op, len(t.thens))
			unpinned := false
			for i, op := range t.thens {
				unpinned = unpinned || op.Rev() == 0
				rev, err := pin(op.Rev(), applied)
				if err != nil {
					// etcd checks every range of a transaction before it
					// runs any: one future revision refuses all.
					l.refused.Add(1)
					return nil, err
				}
				ops[i] = etcdstore.OpAtRevision(op, rev)
			}
			resp, err := l.kv.Txn(t.ctx).Then(ops...).Commit()
			if errors.Is(err, rpctypes.ErrCompacted) {
				l.catchUp()
				return t.Commit()
			}
			if err != nil {
				return nil, err
			}
			if unpinned {
				l.stale.Add(1)
			}
			resp.Header.Revision = applied
			return resp, nil
		}
	}
	resp, err := l.kv.Txn(t.ctx).If(t.cmps...).Then(t.thens...).Else(t.elss...).Commit()
	if err == nil {
		l.observe(resp.Header.Revision)
	}
	return resp, err
}

var _ clientv3.KV = (*Lagging)(nil)
