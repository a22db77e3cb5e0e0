package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// member is one node with its participant service.
type member struct {
	node *cluster.Node
	svc  *participant.Service
}

func startMember(t *testing.T, pfx, id string, ttl time.Duration) *member {
	t.Helper()
	return startMemberWith(t, pfx, id, ttl, participant.Options{})
}

// startMemberWith is startMember with the service's options (NodeKey and
// Ownership are set here). The node's client reads through a lagging
// member of its own (etcdtest.Lag, seeded from the test's name and id),
// as a node's client of a real cluster may.
func startMemberWith(t *testing.T, pfx, id string, ttl time.Duration, opts participant.Options) *member {
	t.Helper()
	cli, _, err := shared.LaggingClient(memberLagSeed(t, id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return startMemberOn(t, cli, pfx, id, ttl, opts)
}

// memberLagSeed is the seed of the lagging member node id of the test reads
// through: one of its own per test and node.
func memberLagSeed(t *testing.T, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(t.Name() + "/" + id))
	return h.Sum64()
}

// startMemberOn is startMemberWith on client cli (a lagging one, say).
func startMemberOn(t *testing.T, cli *clientv3.Client, pfx, id string, ttl time.Duration, opts participant.Options) *member {
	t.Helper()
	return startMemberAt(t, cli, pfx, id, ttl, opts, nil)
}

// startMemberAt is startMemberOn with at, if not nil, called at each step
// of the node's store and Ownership (hooked).
func startMemberAt(t *testing.T, cli *clientv3.Client, pfx, id string, ttl time.Duration, opts participant.Options,
	at func(step string, c participant.ConversationID)) *member {
	t.Helper()
	ctx := context.Background()
	n, err := cluster.Start(ctx, cli, cluster.Options{NodeID: id, Advertise: id + ":7000", Prefix: pfx, LeaseTTL: ttl})
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	key, err := n.NodeKey(ctx)
	if err != nil {
		t.Fatalf("NodeKey: %v", err)
	}
	var st store.DurableStore = n.Store()
	opts.NodeKey, opts.Ownership = key, n
	if at != nil {
		st, opts.Ownership = hooked(n, at)
	}
	svc, err := participant.Open(ctx, st, opts)
	if err != nil {
		t.Fatalf("participant.Open(%s): %v", id, err)
	}
	n.OnLost(svc.Forget)
	m := &member{node: n, svc: svc}
	t.Cleanup(func() {
		svc.Close()
		n.Close()
	})
	return m
}

// newClient returns a client of the shared etcd of the test's own, for a
// test that wraps its KV or Lease; it is closed when the test ends.
func newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// startDeleting is startMemberOn with a service that deletes a
// conversation every participant left once its last row is a minute old,
// on the returned clock.
func startDeleting(t *testing.T, cli *clientv3.Client, pfx, id string) (*member, *participanttest.Clock) {
	t.Helper()
	clk := participanttest.NewClock(time.UnixMilli(1_700_000_000_000))
	return startMemberOn(t, cli, pfx, id, lossTTL, participant.Options{Retain: time.Minute, Now: clk.Now}), clk
}

func tok(b byte, i int) participant.Token {
	var t participant.Token
	t[0], t[1], t[2] = b, byte(i), byte(i>>8)
	return t
}

// waitDeleted blocks until key is absent from etcd.
func waitDeleted(t *testing.T, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := shared.Client.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return
	}
	for wr := range shared.Client.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatalf("%s was not deleted: %v", key, ctx.Err())
}

// TestNode_SecondNodeAnswersMoved: the node that enrolled first owns the
// conversation; another node answers moved with the owner's address, for
// a replay as for anything else, and does not claim it.
func TestNode_SecondNodeAnswersMoved(t *testing.T) {
	pfx := prefix()
	a := startMember(t, pfx, "a", 5*time.Second)
	b := startMember(t, pfx, "b", 5*time.Second)
	ctx := context.Background()
	ca := a.svc.Connect(func() {})
	bound, err := ca.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(1, 0)})
	if err != nil {
		t.Fatalf("Enroll on a: %v", err)
	}
	cb := b.svc.Connect(func() {})
	_, err = cb.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(1, 0)})
	var pe *participant.Error
	if !errors.As(err, &pe) || pe.Code != participant.CodeMoved || pe.Owner != "a:7000" {
		t.Fatalf("Enroll replay on b = %v, want moved{a:7000}", err)
	}
	_, err = cb.Attach(ctx, participant.Attach{Conversation: 1, Participant: bound.Participant,
		Generation: bound.Generation, Secret: bound.Secret, Token: tok(2, 0)})
	if !errors.Is(err, participant.ErrMoved) {
		t.Fatalf("Attach on b = %v, want moved", err)
	}
	_, err = cb.Tell(ctx, participant.Tell{Conversation: 99, Participant: 0, Generation: 1, Token: tok(3, 0)})
	if !errors.Is(err, participant.ErrUnknownParticipant) {
		t.Fatalf("Tell on a conversation nobody created = %v, want unknown_participant", err)
	}
	if s := a.node.Stats(); s.Owned != 1 || s.Claims != 1 {
		t.Fatalf("a stats = %+v, want one owned, one claim", s)
	}
	if s := b.node.Stats(); s.Owned != 0 || s.Moves != 2 {
		t.Fatalf("b stats = %+v, want none owned, two moves", s)
	}
}

// TestNode_ReleaseHandsOver: after a drain releases its ownerships, another
// node claims the conversation at once, reconciles it from etcd, ends the
// first node's binding as died/unclean_restart, and serves the
// credential the first node issued (the cluster secret is shared).
func TestNode_ReleaseHandsOver(t *testing.T) {
	pfx := prefix()
	a := startMember(t, pfx, "a", 5*time.Second)
	b := startMember(t, pfx, "b", 5*time.Second)
	ctx := context.Background()
	ca := a.svc.Connect(func() {})
	bound, err := ca.Enroll(ctx, participant.Enroll{Conversation: 7, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Tell(ctx, participant.Tell{Conversation: 7, Participant: bound.Participant, Generation: bound.Generation, Token: tok(2, 0), Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := a.node.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	cb := b.svc.Connect(func() {})
	rebound, err := cb.Attach(ctx, participant.Attach{Conversation: 7, Participant: bound.Participant,
		Generation: bound.Generation, Secret: bound.Secret, Token: tok(3, 0)})
	if err != nil {
		t.Fatalf("Attach on b after a released: %v", err)
	}
	if rebound.Generation != bound.Generation+1 {
		t.Fatalf("Attach generation = %d, want %d", rebound.Generation, bound.Generation+1)
	}
	// The tell a committed replays on b with its original answer.
	told, err := cb.Tell(ctx, participant.Tell{Conversation: 7, Participant: bound.Participant, Generation: rebound.Generation, Token: tok(2, 0), Payload: []byte("x")})
	if err != nil || told.Replay != participant.ReplayCommitted {
		t.Fatalf("Tell replay on b = %+v, %v, want a committed replay", told, err)
	}
	// a no longer serves it.
	if _, err := ca.Tell(ctx, participant.Tell{Conversation: 7, Participant: bound.Participant, Generation: bound.Generation, Token: tok(4, 0)}); !errors.Is(err, participant.ErrMoved) {
		t.Fatalf("Tell on a after release = %v, want moved", err)
	}
}

// TestNode_FencedOldOwnerIsRefusedByEtcd: a paused node keeps believing it
// owns a conversation after its lease expired and another node claimed
// it; its commit is refused by etcd (the fence), answered in_doubt or
// unavailable, and the stream read back holds no row of it.
func TestNode_FencedOldOwnerIsRefusedByEtcd(t *testing.T) {
	pfx := prefix()
	a := startMember(t, pfx, "a", time.Second)
	b := startMember(t, pfx, "b", 5*time.Second)
	ctx := context.Background()
	ca := a.svc.Connect(func() {})
	bound, err := ca.Enroll(ctx, participant.Enroll{Conversation: 3, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	a.node.PauseKeepAlive()
	waitDeleted(t, pfx+"own/3")

	cb := b.svc.Connect(func() {})
	rebound, err := cb.Attach(ctx, participant.Attach{Conversation: 3, Participant: bound.Participant,
		Generation: bound.Generation, Secret: bound.Secret, Token: tok(2, 0)})
	if err != nil {
		t.Fatalf("Attach on b after a's lease expired: %v", err)
	}
	if _, err := cb.Tell(ctx, participant.Tell{Conversation: 3, Participant: rebound.Participant, Generation: rebound.Generation, Token: tok(3, 0), Payload: []byte("from b")}); err != nil {
		t.Fatalf("Tell on b: %v", err)
	}

	// a wakes up and commits on its stale binding: etcd refuses.
	_, err = ca.Tell(ctx, participant.Tell{Conversation: 3, Participant: bound.Participant, Generation: bound.Generation, Token: tok(4, 0), Payload: []byte("from a")})
	if !errors.Is(err, participant.ErrInDoubt) && !errors.Is(err, participant.ErrUnavailable) {
		t.Fatalf("Tell on the fenced-off a = %v, want in_doubt or unavailable", err)
	}
	if !errors.Is(err, etcdstore.ErrFenced) {
		t.Fatalf("Tell on the fenced-off a = %v, want it caused by etcdstore.ErrFenced", err)
	}
	// A conversation lost concerns that conversation only: a's service has
	// not failed (it would drain and exit), and a serves the next touch,
	// here by naming the new owner.
	if err := a.svc.Failed(); err != nil {
		t.Fatalf("a's service failed after one conversation was fenced off: %v", err)
	}
	if _, err := ca.Tell(ctx, participant.Tell{Conversation: 3, Participant: bound.Participant, Generation: bound.Generation, Token: tok(4, 0), Payload: []byte("from a")}); !errors.Is(err, participant.ErrMoved) {
		t.Fatalf("retry on a after the refusal = %v, want moved (b owns 3)", err)
	}

	// Read back with a store of nobody's: b's rows, none of a's.
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	entries, err := ro.ReadFrom(oplog.Stream(3), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range entries {
		row, err := oplog.Decode(e.Payload)
		if err != nil {
			t.Fatalf("oplog row %d: %v", e.Seq, err)
		}
		if row.Kind == oplog.KindTell && string(row.Payload) != "from b" {
			t.Fatalf("oplog row %d is a tell %q, want only b's", e.Seq, row.Payload)
		}
		kinds = append(kinds, fmt.Sprint(row.Kind))
	}
	// genesis, enroll (a), b's reconciliation ending a's binding as
	// died/unclean_restart, attach (b), tell (b).
	if fmt.Sprint(kinds) != "[genesis enroll end attach tell]" {
		t.Fatalf("oplog of 3 = %v, want [genesis enroll end attach tell]", kinds)
	}
	// And b keeps serving.
	if _, err := cb.Tell(ctx, participant.Tell{Conversation: 3, Participant: rebound.Participant, Generation: rebound.Generation, Token: tok(5, 0), Payload: []byte("from b")}); err != nil {
		t.Fatalf("Tell on b after a was refused: %v", err)
	}
}

// TestNode_LostLeaseDropsEveryOwnedConversation: when etcd no longer knows
// the node's lease (it expired, here revoked behind the node's back), the
// node drops every conversation it owned at once, takes a new lease, and
// serves again by claiming anew; the binding of its own live connection
// survives the reconciliation.
func TestNode_LostLeaseDropsEveryOwnedConversation(t *testing.T) {
	pfx := prefix()
	a := startMember(t, pfx, "a", time.Second)
	lost := make(chan participant.ConversationID, 8)
	a.node.OnLost(func(c participant.ConversationID) {
		a.svc.Forget(c)
		lost <- c
	})
	ctx := context.Background()
	ca := a.svc.Connect(func() {})
	var bounds []participant.Bound
	for c := range 3 {
		b, err := ca.Enroll(ctx, participant.Enroll{Conversation: participant.ConversationID(20 + c), Token: tok(9, c)})
		if err != nil {
			t.Fatal(err)
		}
		bounds = append(bounds, b)
	}
	resp, err := shared.Client.Get(ctx, pfx+"node/a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node key: %v", err)
	}
	if _, err := shared.Client.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	got := map[participant.ConversationID]bool{}
	for range 3 {
		select {
		case c := <-lost:
			got[c] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("dropped %v, want all of 20, 21, 22", got)
		}
	}
	if s := a.node.Stats(); s.LostLeases != 1 || s.Owned != 0 {
		t.Fatalf("stats after the loss = %+v, want one lost lease, nothing owned", s)
	}
	// Served again once a new lease is held (unavailable until then).
	for i, b := range bounds {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		for {
			_, err := ca.Tell(tctx, participant.Tell{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Token: tok(10, i), Payload: []byte("after")})
			if err == nil {
				break
			}
			if !errors.Is(err, participant.ErrUnavailable) || tctx.Err() != nil {
				cancel()
				t.Fatalf("Tell on %v after the loss = %v, want success once a lease is held", b.Conversation, err)
			}
		}
		cancel()
	}
}

// TestNode_PrefixIsADirectory: a prefix without a trailing slash still
// keeps the data set in a key directory of its own, so "/p" and "/p2" do
// not share keys.
func TestNode_PrefixIsADirectory(t *testing.T) {
	pfx := strings.TrimSuffix(prefix(), "/")
	n, err := cluster.Start(context.Background(), shared.Client, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	resp, err := shared.Client.Get(context.Background(), pfx+"/node/a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(%s/node/a) = %v, %v; want the node key under %s/", pfx, resp, err, pfx)
	}
}

// TestNode_RestartWaitsOutAPreviousRegistrationLongerThanItsLease: a node
// restarted while its previous process's node key is still live (here
// under a longer lease; in production an etcd leader change extends it,
// or the crash came just after a refresh) waits for the key to go, then
// registers under a lease that is still alive: the wait may outlast the
// new lease's TTL, and nothing refreshes a lease while it waits.
func TestNode_RestartWaitsOutAPreviousRegistrationLongerThanItsLease(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	old, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	old.Abandon() // SIGKILL: node/a stays until its 4 s lease expires
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: time.Second, StartWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("restart within the previous process's lease: %v", err)
	}
	defer n.Close()
	resp, err := shared.Client.Get(ctx, pfx+"node/a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(node/a) = %v, %v; want the new process's registration", resp, err)
	}
	ttl, err := shared.Client.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil || ttl.TTL < 0 || ttl.GrantedTTL == 0 {
		t.Fatalf("lease of node/a: %+v, %v; want a live lease", ttl, err)
	}
	if !n.LeaseHeld() {
		t.Fatal("the restarted node holds no lease")
	}
}
