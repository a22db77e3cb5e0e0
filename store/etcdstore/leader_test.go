package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// leaderCluster starts a 3-member etcd and a client on every member, and
// returns them with a DialLeader that dials as the client does and counts
// its dials.
func leaderCluster(t *testing.T) (*etcdtest.Cluster, *clientv3.Client, func(context.Context, string) (*clientv3.Client, error), *atomic.Int64) {
	t.Helper()
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	cfg := clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	var dials atomic.Int64
	dial := func(ctx context.Context, ep string) (*clientv3.Client, error) {
		dials.Add(1)
		c := cfg
		c.Endpoints = []string{ep}
		c.Context = ctx
		return clientv3.New(c)
	}
	return etcd, cli, dial, &dials
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		<-tick.C
	}
}

// leaderEndpoint returns the client URL of the member that leads now, ""
// when none does.
func leaderEndpoint(etcd *etcdtest.Cluster) string {
	if i := etcd.Leader(); i >= 0 {
		return etcd.Endpoints()[i]
	}
	return ""
}

// TestLeaderAffinity_CommitsGoToLeader: with DialLeader and several
// endpoints, the store finds the member that leads and sends its commit
// transactions through a client on that member alone.
func TestLeaderAffinity_CommitsGoToLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("3 etcd members")
	}
	etcd, cli, dial, dials := leaderCluster(t)
	s := etcdstore.Open(cli, etcdstore.Options{Prefix: "/la/", Scope: byFirstSegment, DialLeader: dial,
		LeaderCheckInterval: 100 * time.Millisecond})
	defer s.Close()
	waitFor(t, 20*time.Second, "leader client on the leader", func() bool {
		ep := leaderEndpoint(etcd)
		return ep != "" && s.LeaderEndpoint() == ep
	})
	before := s.LeaderTxns()
	const flushes = 20
	for i := range flushes {
		mustAppend(t, s, "a/log", fmt.Sprint(i), uint64(i))
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.LeaderTxns() - before; got < flushes {
		t.Errorf("transactions through the leader's client = %d, want at least %d (one per flush)", got, flushes)
	}
	if got := readAll(t, s, "a/log"); len(got) != flushes {
		t.Errorf("read back %d entries, want %d", len(got), flushes)
	}
	// A stable leader is dialled once; checks that find it again do not
	// dial.
	if got := dials.Load(); got != 1 {
		t.Errorf("dials = %d, want 1", got)
	}
}

// TestLeaderAffinity_SingleEndpointOrNoDial: with one endpoint, or without
// DialLeader, everything goes through the client given to Open.
func TestLeaderAffinity_SingleEndpointOrNoDial(t *testing.T) {
	var dials atomic.Int64
	dial := func(context.Context, string) (*clientv3.Client, error) {
		dials.Add(1)
		return nil, errors.New("not to be called")
	}
	for _, o := range []etcdstore.Options{
		{Prefix: prefix(), DialLeader: dial, LeaderCheckInterval: time.Millisecond},
		{Prefix: prefix()},
	} {
		s := etcdstore.Open(shared.Client, o)
		mustAppend(t, s, "log", "x", 0)
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if ep, n := s.LeaderEndpoint(), s.LeaderTxns(); ep != "" || n != 0 {
			t.Errorf("leader endpoint %q, %d transactions through it; want none", ep, n)
		}
		s.Close()
	}
	if got := dials.Load(); got != 0 {
		t.Errorf("dials = %d, want 0", got)
	}
}

// TestLeaderAffinity_LeaderLoss: writers commit under load while the
// leader member stops. A commit fails only as any commit in flight when a
// member is lost does (ErrUnknownOutcome); the writers then go on through
// the other endpoints, and the store pins the new leader.
func TestLeaderAffinity_LeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("3 etcd members")
	}
	etcd, cli, dial, _ := leaderCluster(t)
	s := etcdstore.Open(cli, etcdstore.Options{Prefix: "/ll/", Scope: byFirstSegment, DialLeader: dial,
		Timeout: 2 * time.Second, LeaderCheckInterval: 200 * time.Millisecond})
	defer s.Close()
	waitFor(t, 20*time.Second, "leader client on the leader", func() bool {
		ep := leaderEndpoint(etcd)
		return ep != "" && s.LeaderEndpoint() == ep
	})
	old := etcd.Leader()
	oldEP := etcd.Endpoints()[old]

	const writers = 4
	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		bad     []error
		unknown int
		commits [writers]atomic.Int64
	)
	for w := range writers {
		wg.Go(func() {
			sc := fmt.Sprintf("w%d", w)
			name := sc + "/log"
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := s.Len(name)
				if err == nil {
					if _, err = s.Append(name, []byte("x"), n); err == nil {
						err = s.FlushScopes(sc)
					}
				}
				switch {
				case err == nil:
					commits[w].Add(1)
				case errors.Is(err, etcdstore.ErrUnknownOutcome):
					mu.Lock()
					unknown++
					mu.Unlock()
					s.Reset(sc)
				default:
					mu.Lock()
					bad = append(bad, err)
					mu.Unlock()
					s.Reset(sc)
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	counts := func() (c [writers]int64) {
		for w := range writers {
			c[w] = commits[w].Load()
		}
		return c
	}
	progressed := func(from [writers]int64, by int64) func() bool {
		return func() bool {
			now := counts()
			for w := range writers {
				if now[w] < from[w]+by {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 20*time.Second, "commits before the loss", progressed([writers]int64{}, 5))
	if ep := s.LeaderEndpoint(); ep != oldEP {
		t.Fatalf("before the loss, commits go to %q, want the leader %q", ep, oldEP)
	}

	etcd.Stop(old)
	waitFor(t, 30*time.Second, "the new leader pinned", func() bool {
		ep := leaderEndpoint(etcd)
		return ep != "" && ep != oldEP && s.LeaderEndpoint() == ep
	})
	through := s.LeaderTxns()
	waitFor(t, 30*time.Second, "commits after the loss", progressed(counts(), 5))
	if s.LeaderTxns() <= through {
		t.Errorf("no transaction through the new leader's client")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, err := range bad {
		t.Errorf("commit failed with %v, want only ErrUnknownOutcome", err)
	}
	t.Logf("%d commits failed with an unknown outcome around the loss", unknown)
}
