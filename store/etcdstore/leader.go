package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"
)

// Leader affinity (see doc.go, "Leader affinity").
const (
	// DefaultLeaderCheckInterval is how often the store asks the members
	// who leads, when Options.DialLeader is set.
	DefaultLeaderCheckInterval = 3 * time.Second
	// leaderRetryGap is the least time between two discoveries asked for
	// by failed commits, so that a leaderless cluster is not polled in a
	// loop.
	leaderRetryGap = time.Second
	// statusTimeout bounds one member's Status during discovery: a member
	// that is down would otherwise hold discovery for the whole Timeout.
	statusTimeout = time.Second
	// retiredPoll is how often retired leader clients are checked for
	// calls still running on them.
	retiredPoll = 100 * time.Millisecond
)

// errNoLeader reports a discovery in which no member named a leader.
var errNoLeader = errors.New("etcdstore: no member reports a leader")

// pinned is a client connected to the one member that led when it was
// dialled. users counts the calls running on it; once retired, it takes no
// new call and is closed by the leader goroutine when users is zero.
type pinned struct {
	cli      *clientv3.Client
	endpoint string
	member   uint64
	users    atomic.Int64
	retired  atomic.Bool
}

// leaderConn keeps a client connected to the etcd leader alone, for the
// store's commits. It owns one goroutine (run), started by newLeaderConn and
// stopped by stop, which discovers the leader, dials, switches and closes
// the clients it dialled; commits never wait for it.
type leaderConn struct {
	main     *clientv3.Client
	dial     func(ctx context.Context, endpoint string) (*clientv3.Client, error)
	interval time.Duration
	log      zerolog.Logger

	// cur is the client in use, nil while commits go through main.
	cur atomic.Pointer[pinned]
	// txns counts the transactions sent through a pinned client.
	txns atomic.Uint64
	// wake asks run for a discovery now (capacity 1: wakes coalesce).
	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// mu guards retired: pinned clients switched away from, which run
	// closes once no call runs on them. It is held for nothing else.
	mu      sync.Mutex
	retired []*pinned
}

func newLeaderConn(main *clientv3.Client, dial func(context.Context, string) (*clientv3.Client, error), interval time.Duration, log zerolog.Logger) *leaderConn {
	ctx, cancel := context.WithCancel(context.Background())
	l := &leaderConn{
		main:     main,
		dial:     dial,
		interval: interval,
		log:      log,
		wake:     make(chan struct{}, 1),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	go l.run()
	return l
}

// acquire returns the KV a commit should use and the pinned client it
// belongs to (nil for main), which release must be given back. It never
// blocks: with no usable leader client it returns main's KV.
func (l *leaderConn) acquire() (clientv3.KV, *pinned) {
	p := l.cur.Load()
	if p == nil {
		return l.main.KV, nil
	}
	p.users.Add(1)
	if p.retired.Load() {
		p.users.Add(-1)
		return l.main.KV, nil
	}
	// A connection that is failing (the member is down or unreachable)
	// would hold the call until its deadline: go to every endpoint
	// instead, and find the leader again.
	if st := p.cli.ActiveConnection().GetState(); st == connectivity.TransientFailure || st == connectivity.Shutdown {
		p.users.Add(-1)
		l.fallback(p, fmt.Errorf("connection to %s is %s", p.endpoint, st))
		return l.main.KV, nil
	}
	l.txns.Add(1)
	return p.cli.KV, p
}

// release ends a call acquired on p; err is its error. Any error of a call
// on the leader client sends later commits to every endpoint until the
// leader is found again: the main client is always correct, and the error
// may be the member's loss or its leadership's.
func (l *leaderConn) release(p *pinned, err error) {
	if p == nil {
		return
	}
	p.users.Add(-1)
	if err != nil {
		l.fallback(p, err)
	}
}

// fallback stops using p (if it is still in use) and asks for a discovery.
func (l *leaderConn) fallback(p *pinned, err error) {
	if l.cur.CompareAndSwap(p, nil) {
		l.retire(p)
		l.log.Info().Err(err).Str("endpoint", p.endpoint).Msg("commits go to every etcd endpoint until the leader is found again")
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// retire marks p as taking no new call and hands it to run to close.
func (l *leaderConn) retire(p *pinned) {
	p.retired.Store(true)
	l.mu.Lock()
	l.retired = append(l.retired, p)
	l.mu.Unlock()
}

// retiredLen returns how many retired clients are not closed yet.
func (l *leaderConn) retiredLen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.retired)
}

// stop ends run, which closes every client it dialled. Calls must no
// longer acquire.
func (l *leaderConn) stop() {
	l.cancel()
	<-l.done
}

func (l *leaderConn) run() {
	defer close(l.done)
	defer func() {
		if p := l.cur.Swap(nil); p != nil {
			l.retire(p)
		}
		l.mu.Lock()
		all := l.retired
		l.retired = nil
		l.mu.Unlock()
		for _, p := range all {
			p.cli.Close()
		}
	}()
	// last is when the last discovery began; asked is set by a wake that
	// came too soon after it, so that the discovery happens at the gap.
	var last time.Time
	asked := true
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.wake:
			asked = true
		case <-t.C:
		}
		since := time.Since(last)
		if since >= l.interval || (asked && since >= leaderRetryGap) {
			asked = false
			last = time.Now()
			l.discover()
			since = 0
		}
		l.closeRetired()
		next := l.interval - since
		if asked {
			next = min(next, leaderRetryGap-since)
		}
		if l.retiredLen() > 0 {
			next = min(next, retiredPoll)
		}
		t.Reset(max(next, 0))
	}
}

// closeRetired closes the retired clients no call runs on.
func (l *leaderConn) closeRetired() {
	var idle []*pinned
	l.mu.Lock()
	kept := l.retired[:0]
	for _, p := range l.retired {
		if p.users.Load() > 0 {
			kept = append(kept, p)
		} else {
			idle = append(idle, p)
		}
	}
	clear(l.retired[len(kept):])
	l.retired = kept
	l.mu.Unlock()
	for _, p := range idle {
		p.cli.Close()
	}
}

// discover finds the leader and switches to a client on it when it is not
// the one in use; on failure commits go through main.
func (l *leaderConn) discover() {
	cur := l.cur.Load()
	ep, member, err := l.find(cur)
	if err != nil {
		if cur != nil && l.cur.CompareAndSwap(cur, nil) {
			l.retire(cur)
		}
		if l.ctx.Err() == nil {
			l.log.Debug().Err(err).Msg("etcd leader not found; commits go to every endpoint")
		}
		return
	}
	if cur != nil && cur.member == member && cur.endpoint == ep {
		return
	}
	cli, err := l.dial(l.ctx, ep)
	if err != nil {
		l.log.Warn().Err(err).Str("endpoint", ep).Msg("dialling the etcd leader failed; commits go to every endpoint")
		if cur != nil && l.cur.CompareAndSwap(cur, nil) {
			l.retire(cur)
		}
		return
	}
	p := &pinned{cli: cli, endpoint: ep, member: member}
	if old := l.cur.Swap(p); old != nil {
		l.retire(old)
	}
	l.log.Info().Str("endpoint", ep).Uint64("member", member).Msg("commits go to the etcd leader")
}

// find asks the members, the pinned one first, who leads: the endpoint of
// the member that answers as the leader itself, else the leader's first
// client URL in the member list.
func (l *leaderConn) find(cur *pinned) (string, uint64, error) {
	eps := l.main.Endpoints()
	if cur != nil {
		ordered := []string{cur.endpoint}
		for _, ep := range eps {
			if ep != cur.endpoint {
				ordered = append(ordered, ep)
			}
		}
		eps = ordered
	}
	var leader uint64
	var lastErr error = errNoLeader
	for _, ep := range eps {
		ctx, cancel := context.WithTimeout(l.ctx, statusTimeout)
		st, err := l.main.Status(ctx, ep)
		cancel()
		if err != nil {
			lastErr = err
			if l.ctx.Err() != nil {
				return "", 0, err
			}
			continue
		}
		if st.Leader == 0 {
			continue
		}
		if st.Header.GetMemberId() == st.Leader {
			return ep, st.Leader, nil
		}
		leader = st.Leader
	}
	if leader == 0 {
		return "", 0, lastErr
	}
	ctx, cancel := context.WithTimeout(l.ctx, statusTimeout)
	ml, err := l.main.MemberList(ctx)
	cancel()
	if err != nil {
		return "", 0, err
	}
	for _, m := range ml.Members {
		if m.ID == leader && len(m.ClientURLs) > 0 {
			return m.ClientURLs[0], leader, nil
		}
	}
	return "", 0, fmt.Errorf("%w: leader %x has no client URL", errNoLeader, leader)
}
