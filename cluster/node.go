package cluster

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore"
)

// Defaults for the zero Options.
const (
	DefaultLeaseTTL = 5 * time.Second
	DefaultTimeout  = 5 * time.Second
)

// Sentinel errors.
var (
	// ErrNodeIDInUse reports a node id whose live-node key another process
	// holds under a lease that did not expire within Options.StartWait.
	ErrNodeIDInUse = errors.New("cluster: node id is in use by a live process")
	// ErrNoLease reports an operation while the node holds no lease (lost,
	// not yet regained): the node serves nothing.
	ErrNoLease = errors.New("cluster: no lease held")
	// ErrClosed reports a call on a closed Node.
	ErrClosed = errors.New("cluster: node closed")
)

// Options configures Start. The zero value is valid except for NodeID.
type Options struct {
	// NodeID names this node in the cluster; required.
	NodeID string
	// Advertise is the wire address clients are sent to for conversations
	// this node owns (moved{owner}).
	Advertise string
	// AdvertiseHealth is the URL of the node's health listener
	// (http://host:port or https://host:port), where an operator is sent
	// for the status of a conversation this node owns (Owner); empty when
	// not known.
	AdvertiseHealth string
	// Prefix is the etcd key prefix of the whole data set; default
	// etcdstore.DefaultPrefix. A "/" is appended when it does not end in one.
	Prefix string
	// LeaseTTL is the lease under which the node holds its conversations;
	// default DefaultLeaseTTL. Failover takes about this long.
	LeaseTTL time.Duration
	// Timeout bounds every etcd call; default DefaultTimeout.
	Timeout time.Duration
	// StartWait bounds how long Start waits for the key of a previous
	// process with the same node id to expire; default twice LeaseTTL.
	StartWait time.Duration
	// Logger receives the node's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// Observer, if set, is told about claims, moves, lost leases and
	// etcd transactions.
	Observer Observer
	// DialLeader, if set, sends the store's commits to the etcd leader
	// over clients it dials (etcdstore Options.DialLeader); the node's
	// lease, claims and reads use the client given to Start.
	DialLeader func(ctx context.Context, endpoint string) (*clientv3.Client, error)
	// Clock measures the lease's local deadline; nil means the system's
	// monotonic and boot clocks (see Clock).
	Clock Clock
	// SealKey, if set (SealKeySize bytes, LoadSealKey), seals the cluster
	// secret in etcd (see secret.go): NodeKey creates it sealed, opens a
	// sealed one, and seals one it finds unsealed. Without it a sealed
	// secret is refused (ErrNodeKeySealed).
	SealKey []byte
	// PreviousSealKey, if set with SealKey, is the sealing key being
	// rotated out: NodeKey opens a secret sealed under it and seals it
	// again under SealKey, in place (see secret.go, Rotation).
	PreviousSealKey []byte
}

// Observer receives the node's events, for metrics. Calls must not block.
type Observer interface {
	// Claimed reports a conversation claimed by this node.
	Claimed()
	// Moved reports a request answered moved: another node owns it.
	Moved()
	// LeaseLost reports a lost lease; owned conversations were dropped.
	LeaseLost(owned int)
	// Txn reports one commit transaction of the store.
	Txn(d time.Duration, ops int, err error)
}

type nopObserver struct{}

func (nopObserver) Claimed()                      {}
func (nopObserver) Moved()                        {}
func (nopObserver) LeaseLost(int)                 {}
func (nopObserver) Txn(time.Duration, int, error) {}

// record is the value of an ownership or live-node key.
type record struct {
	Node   string `json:"node"`
	Addr   string `json:"addr"`
	Health string `json:"health,omitempty"`
}

// Node is one participantd node of a cluster: its lease, its identity, the
// conversations it owns, and the fenced etcd store they are written to. It
// implements participant.Ownership.
//
// A Node owns one keep-alive goroutine, started by Start and stopped by
// Close or Abandon.
type Node struct {
	cli     *clientv3.Client
	opts    Options
	log     zerolog.Logger
	obs     Observer
	etcd    *etcdstore.Store
	store   *Store
	ordinal uint64
	rec     string

	owned   atomic.Int64
	claims  atomic.Uint64
	moves   atomic.Uint64
	lost    atomic.Uint64
	forgetf atomic.Pointer[func(participant.ConversationID)]

	stop chan struct{}
	done chan struct{}
	// run bounds the keep-alive loop's etcd calls; halt cancels it, so
	// that a close never waits out a call to an etcd that stopped
	// answering.
	run       context.Context
	cancelRun context.CancelFunc
	// paused, when set (tests only), stops the keep-alive loop from
	// refreshing or checking the lease, as a paused process would.
	paused atomic.Bool

	// mu guards the fields below. It is never held across an etcd call.
	mu sync.Mutex
	// lease is the lease the node holds, 0 while it holds none; deadline
	// is when it expires at the latest, by the local clocks (both must
	// say it holds), counted from the send time of the grant or of the
	// last successful keep-alive.
	// +checklocks:mu
	lease clientv3.LeaseID
	// +checklocks:mu
	deadline reading
	// stale are the leases this node lost: keys still held under one of
	// them (their revoke failed while etcd had no quorum) are this node's
	// own leftovers, deleted rather than waited out.
	// +checklocks:mu
	stale map[clientv3.LeaseID]bool
	// claimsByConv maps each owned conversation to the create revision of
	// its ownership key: the fence of its commits.
	// +checklocks:mu
	claimsByConv map[participant.ConversationID]int64
	// +checklocks:mu
	closed bool
}

// Start joins the cluster behind cli: it takes a lease, registers the node
// id (waiting for a previous process's registration to expire), learns the
// node's ordinal, opens the fenced store, and starts keeping the lease
// alive. The caller keeps ownership of cli and closes it after Close.
func Start(ctx context.Context, cli *clientv3.Client, opts Options) (*Node, error) {
	if opts.NodeID == "" {
		return nil, errors.New("cluster: node id is required")
	}
	opts.Prefix = NormalizePrefix(opts.Prefix)
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StartWait <= 0 {
		opts.StartWait = 2 * opts.LeaseTTL
	}
	if opts.Clock == nil {
		opts.Clock = systemClock{start: time.Now()}
	}
	n := &Node{
		cli:          cli,
		opts:         opts,
		log:          opts.Logger.With().Str("component", "cluster").Str("node", opts.NodeID).Logger(),
		obs:          opts.Observer,
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
		claimsByConv: make(map[participant.ConversationID]int64),
	}
	n.run, n.cancelRun = context.WithCancel(context.Background())
	if n.obs == nil {
		n.obs = nopObserver{}
	}
	rec, err := json.Marshal(record{Node: opts.NodeID, Addr: opts.Advertise, Health: opts.AdvertiseHealth})
	if err != nil {
		return nil, err
	}
	n.rec = string(rec)
	if err := n.checkNotRestoring(ctx); err != nil {
		return nil, err
	}
	if err := n.ensureFormat(ctx); err != nil {
		return nil, err
	}
	if err := n.acquireLease(ctx); err != nil {
		return nil, err
	}
	if n.ordinal, err = n.loadOrdinal(ctx); err != nil {
		n.revoke()
		return nil, err
	}
	n.etcd = etcdstore.Open(cli, etcdstore.Options{
		Prefix:       opts.Prefix + "d/",
		Scope:        Scope,
		ScanScope:    ScanScope,
		RequireFence: true,
		Timeout:      opts.Timeout,
		Logger:       opts.Logger,
		OnTxn:        func(d time.Duration, ops int, err error) { n.obs.Txn(d, ops, err) },
		DialLeader:   opts.DialLeader,
	})
	n.store = newStore(n.etcd, opts.NodeID, n.ordinal)
	go n.keepAlive()
	n.log.Info().Uint64("ordinal", n.ordinal).Int64("lease", int64(n.currentLease())).Msg("joined the cluster")
	return n, nil
}

// Store returns the DurableStore to open the participant.Service on.
func (n *Node) Store() *Store { return n.store }

// ID returns the node id.
func (n *Node) ID() string { return n.opts.NodeID }

// OnLost sets the function told about every conversation the node stops
// owning because it lost its lease or released it
// (participant.Service.Forget).
func (n *Node) OnLost(f func(participant.ConversationID)) { n.forgetf.Store(&f) }

func (n *Node) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, n.opts.Timeout)
}

func (n *Node) key(parts ...string) string {
	k := n.opts.Prefix
	for i, p := range parts {
		if i > 0 {
			k += "/"
		}
		k += p
	}
	return k
}

func (n *Node) ownKey(c participant.ConversationID) string { return n.key("own", c.String()) }

// now reads the node's clocks.
func (n *Node) now() reading { return readClock(n.opts.Clock) }

// heldLocked reports whether the node holds a lease whose local deadline
// has not passed; n.mu is held.
//
// +checklocks:n.mu
func (n *Node) heldLocked() bool { return n.lease != 0 && n.now().before(n.deadline) }

func (n *Node) currentLease() clientv3.LeaseID {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lease
}

// acquireLease grants a lease and registers node/<id> under it,
// create-if-absent; a registration of another lease is waited out for up to
// StartWait (a previous process of this node whose lease has not expired),
// so that two live processes never share a node id.
//
// Each attempt grants a lease of its own, and an attempt that finds the key
// taken revokes it before waiting: nothing keeps a lease alive during the
// wait, which can outlast the TTL (the old lease was refreshed just before
// its process died, or an etcd leader change extended it), and a
// registration under a lease etcd already expired would fail.
func (n *Node) acquireLease(ctx context.Context) error {
	key := n.key("node", n.opts.NodeID)
	wait := time.NewTimer(n.opts.StartWait)
	defer wait.Stop()
	for {
		// etcd counts the TTL from when it grants, after the request was
		// sent: the local deadline counts from the send.
		sent := n.now()
		cctx, cancel := n.ctx(ctx)
		g, err := n.cli.Grant(cctx, int64((n.opts.LeaseTTL+time.Second-1)/time.Second))
		cancel()
		if err != nil {
			return fmt.Errorf("cluster: grant lease: %w", err)
		}
		rev, held, err := n.create(ctx, key, g.ID)
		if rev != 0 {
			n.mu.Lock()
			n.lease, n.deadline = g.ID, sent.add(time.Duration(g.TTL)*time.Second)
			n.mu.Unlock()
			return nil
		}
		n.revokeIn(ctx, g.ID)
		switch {
		case errors.Is(err, ErrRestoring):
			return fmt.Errorf("%w: %s exists; let the restore finish, or delete the prefix and restore again", ErrRestoring, n.key(RestoringKey))
		case err != nil:
			return fmt.Errorf("cluster: register node: %w", err)
		case held == nil:
			continue
		}
		if n.isStale(held.Lease) {
			if err := n.deleteIfUnchanged(ctx, key, held.ModRevision); err != nil {
				return fmt.Errorf("cluster: register node: %w", err)
			}
			continue
		}
		// Wait for the holder's key to go (its lease expiring), then try again.
		if err := n.awaitDeleted(ctx, key, held.ModRevision, wait.C); err != nil {
			return err
		}
	}
}

// create puts the node's record at key under lease if key is absent and
// no restore is writing the prefix, both compared in the one transaction:
// a check before it (Start's) can be overtaken by a restore's first
// transaction. It returns the revision it created key at; else (rev 0)
// key as it stands (nil if absent), or ErrRestoring while a restore runs,
// or the call's error (the put may have been made).
func (n *Node) create(ctx context.Context, key string, lease clientv3.LeaseID) (rev int64, held *mvccpb.KeyValue, err error) {
	marker := n.key(RestoringKey)
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	resp, err := n.cli.Txn(cctx).If(
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(marker), "=", 0),
	).Then(clientv3.OpPut(key, n.seal(key, []byte(n.rec)), clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key), clientv3.OpGet(marker, clientv3.WithCountOnly())).Commit()
	switch {
	case err != nil:
		return 0, nil, err
	case resp.Succeeded:
		return resp.Header.Revision, nil, nil
	case resp.Responses[1].GetResponseRange().Count > 0:
		return 0, nil, ErrRestoring
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		return 0, kvs[0], nil
	}
	return 0, nil, nil
}

// awaitDeleted blocks until key, last modified at rev, is deleted (or
// written again: the caller then reads it anew); it returns ErrNodeIDInUse
// when expired fires first, or ctx's error, or the error of a read of key.
//
// A watch that ends without a deletion is no deletion: etcd cancels a watch
// whose start revision it compacted away (a node restarted after
// compaction), and the stream ends with the client. awaitDeleted then
// reads key at the current revision and watches from there, after a
// backoff, so that a watch canceled again and again waits rather than
// spins.
func (n *Node) awaitDeleted(ctx context.Context, key string, rev int64, expired <-chan time.Time) error {
	from := rev + 1
	pause := watchRetryMin
	for {
		deleted, err := n.watchDeleted(ctx, key, from, expired)
		if deleted || err != nil {
			return err
		}
		cctx, cancel := n.ctx(ctx)
		resp, err := n.cli.Get(cctx, key, clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return fmt.Errorf("cluster: register node: read %s after its watch ended: %w", key, err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision != rev {
			return nil
		}
		from = resp.Header.Revision + 1
		t := time.NewTimer(jitter(pause))
		select {
		case <-t.C:
		case <-expired:
			t.Stop()
			return fmt.Errorf("%w: %s", ErrNodeIDInUse, n.opts.NodeID)
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		pause = min(2*pause, watchRetryMax)
	}
}

// Bounds of the pause between two watches of a key awaitDeleted waits on.
const (
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = 2 * time.Second
)

// jitter returns a duration drawn uniformly from [d/2, d).
func jitter(d time.Duration) time.Duration { return d/2 + mrand.N(d/2) }

// watchDeleted watches key from revision from and reports whether it saw
// key deleted; false with a nil error when the watch ended first (canceled
// by etcd, its start revision compacted, or its stream closed).
func (n *Node) watchDeleted(ctx context.Context, key string, from int64, expired <-chan time.Time) (bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := n.cli.Watch(wctx, key, clientv3.WithRev(from))
	for {
		select {
		case wr, ok := <-ch:
			if !ok {
				return false, ctx.Err()
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return true, nil
				}
			}
			if wr.Canceled || wr.Err() != nil {
				n.log.Debug().Err(wr.Err()).Int64("compacted", wr.CompactRevision).Str("key", key).Msg("watch ended without a deletion; reading the key again")
				return false, ctx.Err()
			}
		case <-expired:
			return false, fmt.Errorf("%w: %s", ErrNodeIDInUse, n.opts.NodeID)
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// loadOrdinal returns the node's ordinal, assigning the next free one (from
// 1) the first time this node id joins.
func (n *Node) loadOrdinal(ctx context.Context) (uint64, error) {
	key, counter := n.key("ordinal", n.opts.NodeID), n.key("ordinals")
	for range 100 {
		cctx, cancel := n.ctx(ctx)
		resp, err := n.cli.Txn(cctx).If().Then(clientv3.OpGet(key), clientv3.OpGet(counter)).Commit()
		cancel()
		if err != nil {
			return 0, fmt.Errorf("cluster: read ordinal: %w", err)
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			v, err := n.unsealUint(key, kvs[0].Value)
			if err != nil {
				return 0, fmt.Errorf("cluster: node ordinal: %w", err)
			}
			return v, nil
		}
		var last uint64
		cmp := clientv3.Compare(clientv3.CreateRevision(counter), "=", 0)
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			if last, err = n.unsealUint(counter, kvs[0].Value); err != nil {
				return 0, fmt.Errorf("cluster: node ordinal counter: %w", err)
			}
			// The sealed bytes as read: the trailer is a function of
			// the key and the body.
			cmp = clientv3.Compare(clientv3.Value(counter), "=", string(kvs[0].Value))
		}
		next := []byte(strconv.FormatUint(last+1, 10))
		cctx, cancel = n.ctx(ctx)
		resp, err = n.cli.Txn(cctx).If(cmp, clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(counter, n.seal(counter, next)), clientv3.OpPut(key, n.seal(key, next))).Commit()
		cancel()
		if err != nil {
			return 0, fmt.Errorf("cluster: assign ordinal: %w", err)
		}
		if resp.Succeeded {
			return last + 1, nil
		}
	}
	return 0, errors.New("cluster: assign ordinal: too much contention")
}

// unsealUint returns the decimal number stored sealed at key.
func (n *Node) unsealUint(key string, sealed []byte) (uint64, error) {
	body, err := n.unseal(key, sealed)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(body), 10, 64)
}

// NodeKey returns the cluster secret that derives every attach secret,
// creating it (32 random bytes, create-if-absent) on the first call in the
// cluster, so that credentials verify on every node. With Options.SealKey
// it is stored sealed, and a secret stored unsealed is sealed in place.
func (n *Node) NodeKey(ctx context.Context) ([]byte, error) {
	key := make([]byte, participant.NodeKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	stored := key
	if n.opts.SealKey != nil {
		var err error
		if stored, err = sealNodeKey(n.opts.SealKey, key); err != nil {
			return nil, fmt.Errorf("cluster: node key: %w", err)
		}
	}
	k := n.key(NodeKeyName)
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	resp, err := n.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, n.seal(k, stored))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return nil, fmt.Errorf("cluster: node key: %w", err)
	}
	if resp.Succeeded {
		return key, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return nil, fmt.Errorf("cluster: node key: %s vanished", k)
	}
	held, err := n.unseal(k, kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("cluster: node key: %w", err)
	}
	key, current, err := openNodeKey(n.opts.SealKey, n.opts.PreviousSealKey, held)
	if err != nil {
		return nil, err
	}
	if n.opts.SealKey != nil && !current {
		n.sealInPlace(cctx, k, key, kvs[0].ModRevision)
	}
	return key, nil
}

// sealInPlace replaces the secret at k, as it was at revision rev (unsealed,
// or sealed under the previous sealing key), with key sealed under the
// sealing key. Failing, it logs: the secret stays usable, and the
// next start seals it.
func (n *Node) sealInPlace(ctx context.Context, k string, key []byte, rev int64) {
	s, err := sealNodeKey(n.opts.SealKey, key)
	if err == nil {
		_, err = n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, n.seal(k, s))).Commit()
	}
	if err != nil {
		n.log.Warn().Err(err).Msg("the cluster secret in etcd is not sealed under the sealing key, and sealing it failed; the next start tries again")
		return
	}
	n.log.Info().Msg("sealed the cluster secret in etcd under the sealing key")
}

// keepAlive refreshes the lease every third of its TTL. A lease that etcd
// no longer knows, or whose local deadline passed (by either clock: a
// stall, a partition, a suspended VM), is lost for good, even if a later
// refresh would succeed: the node stopped serving and pushing its
// conversations at the deadline (Holds), so it drops every owned
// conversation at once and takes a new lease.
func (n *Node) keepAlive() {
	defer close(n.done)
	tick := time.NewTicker(n.opts.LeaseTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		if n.paused.Load() {
			continue
		}
		lease := n.currentLease()
		if lease == 0 {
			if err := n.acquireLease(n.run); err != nil {
				n.log.Warn().Err(err).Msg("no lease; retrying")
			}
			continue
		}
		if n.lapsed(lease) {
			n.loseLease(lease, errLapsed)
			continue
		}
		sent := n.now()
		ctx, cancel := context.WithTimeout(n.run, n.opts.LeaseTTL/3)
		resp, err := n.cli.KeepAliveOnce(ctx, lease)
		cancel()
		n.mu.Lock()
		switch {
		case n.lease != lease:
			n.mu.Unlock()
		case !n.heldLocked():
			n.mu.Unlock()
			n.loseLease(lease, errLapsed)
		case err == nil:
			n.deadline = sent.add(time.Duration(resp.TTL) * time.Second)
			n.mu.Unlock()
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			n.mu.Unlock()
			n.loseLease(lease, err)
		default:
			n.mu.Unlock()
		}
	}
}

// errLapsed is the cause of a lease lost at its local deadline.
var errLapsed = errors.New("cluster: the lease's local deadline passed without a refresh")

// lapsed reports whether lease is the node's lease and its local deadline
// passed.
func (n *Node) lapsed(lease clientv3.LeaseID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lease == lease && !n.heldLocked()
}

// loseLease drops every conversation owned under lease.
func (n *Node) loseLease(lease clientv3.LeaseID, cause error) {
	n.mu.Lock()
	if n.lease != lease {
		n.mu.Unlock()
		return
	}
	n.lease = 0
	if n.stale == nil {
		n.stale = make(map[clientv3.LeaseID]bool)
	}
	n.stale[lease] = true
	owned := n.claimsByConv
	n.claimsByConv = make(map[participant.ConversationID]int64)
	n.owned.Store(0)
	n.mu.Unlock()
	n.lost.Add(1)
	n.obs.LeaseLost(len(owned))
	n.log.Error().Err(cause).Int("conversations", len(owned)).Msg("lease lost; every owned conversation dropped")
	for c := range owned {
		n.drop(c)
	}
	n.revokeIn(n.run, lease)
}

// drop ends what the node holds of c, which it no longer owns: the store
// refuses c's scope, and the service (OnLost) forgets c.
func (n *Node) drop(c participant.ConversationID) {
	n.etcd.Drop(scopeOf(c))
	if forget := n.forgetf.Load(); forget != nil {
		(*forget)(c)
	}
}

// revoke revokes the node's lease, if it holds one.
func (n *Node) revoke() { n.revokeIn(context.Background(), n.currentLease()) }

// isStale reports whether lease is one this node lost.
func (n *Node) isStale(lease int64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stale[clientv3.LeaseID(lease)]
}

// deleteIfUnchanged deletes key if it was not modified since rev.
func (n *Node) deleteIfUnchanged(ctx context.Context, key string, rev int64) error {
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	_, err := n.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
	return err
}

// revokeIn revokes lease id, within parent and Timeout; a lease etcd no
// longer knows is no error.
func (n *Node) revokeIn(parent context.Context, id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(parent, n.opts.Timeout)
	defer cancel()
	if _, err := n.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		n.log.Warn().Err(err).Msg("revoke lease")
	}
}

// LeaseHeld reports whether the node holds a lease (for /ready).
func (n *Node) LeaseHeld() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.heldLocked()
}

// Stats are the node's counters, for metrics.
type Stats struct {
	Owned      int64
	Claims     uint64
	Moves      uint64
	LostLeases uint64
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	return Stats{Owned: n.owned.Load(), Claims: n.claims.Load(), Moves: n.moves.Load(), LostLeases: n.lost.Load()}
}

// Release gives up every owned conversation (deleting its ownership key if
// it is still this node's claim; the service is told, as for a lost lease)
// and the lease, so that other nodes take over at once. The daemon calls
// it on drain, after ending bindings.
func (n *Node) Release(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	owned := n.claimsByConv
	n.claimsByConv = make(map[participant.ConversationID]int64)
	n.owned.Store(0)
	n.mu.Unlock()
	var first error
	for c, rev := range owned {
		n.drop(c)
		if err := n.unclaim(ctx, c, rev); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// unclaim deletes c's ownership key if it is still the claim of create
// revision rev, this node's.
func (n *Node) unclaim(ctx context.Context, c participant.ConversationID, rev int64) error {
	k := n.ownKey(c)
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	_, err := n.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev)).Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return fmt.Errorf("cluster: release %v: %w", c, err)
	}
	return nil
}

var _ participant.Disowner = (*Node)(nil)

// Disown lets deleted conversation c go (participant.Disowner): the node
// forgets its claim, the store its scope, and its ownership key is deleted
// if it is still this node's. The service has forgotten c already. A
// failure to delete the key is logged: the key ends with the lease, and
// until then a request on c is routed here and answered retired.
func (n *Node) Disown(ctx context.Context, c participant.ConversationID) {
	n.mu.Lock()
	rev, ok := n.claimsByConv[c]
	if ok {
		delete(n.claimsByConv, c)
		n.owned.Add(-1)
	}
	n.mu.Unlock()
	if !ok {
		return
	}
	n.etcd.Drop(scopeOf(c))
	if err := n.unclaim(ctx, c, rev); err != nil {
		n.log.Warn().Err(err).Uint64("conversation", uint64(c)).Msg("the ownership key of a deleted conversation stays until the lease ends")
	}
}

// Close stops the keep-alive, revokes the lease (releasing whatever is
// still owned) and closes the store. Call Release first for a drain.
func (n *Node) Close() error {
	if !n.halt() {
		return ErrClosed
	}
	n.revoke()
	return n.etcd.Close()
}

// Abandon stops the node as a crash would: the keep-alive stops and
// nothing is released or revoked, so the node's conversations stay owned
// until its lease expires. For tests of failover.
func (n *Node) Abandon() {
	if n.halt() {
		n.etcd.Close()
	}
}

func (n *Node) halt() bool {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false
	}
	n.closed = true
	n.mu.Unlock()
	close(n.stop)
	n.cancelRun()
	<-n.done
	return true
}
