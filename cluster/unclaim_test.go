package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/participant"
)

// lateDelete is a clientv3.KV that holds back the first transaction, after
// arm, that deletes key: its Commit fails as a timeout does, without
// reaching etcd, and apply sends it later, as a request stuck in the
// network applies after its client gave up.
type lateDelete struct {
	clientv3.KV

	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	key string
	// +checklocks:mu
	held *lateDeleteTxn
}

func (l *lateDelete) arm(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.key = key
}

// apply sends the held transaction and reports whether it committed.
func (l *lateDelete) apply(t *testing.T) bool {
	t.Helper()
	l.mu.Lock()
	h := l.held
	l.mu.Unlock()
	if h == nil {
		t.Fatal("no transaction held back")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := l.KV.Txn(ctx).If(h.cmps...).Then(h.thens...).Commit()
	if err != nil {
		t.Fatalf("late transaction: %v", err)
	}
	return resp.Succeeded
}

func (l *lateDelete) Txn(ctx context.Context) clientv3.Txn { return &lateDeleteTxn{l: l, ctx: ctx} }

type lateDeleteTxn struct {
	l           *lateDelete
	ctx         context.Context
	cmps        []clientv3.Cmp
	thens, elss []clientv3.Op
}

func (t *lateDeleteTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *lateDeleteTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thens = append(t.thens, ops...)
	return t
}

func (t *lateDeleteTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elss = append(t.elss, ops...)
	return t
}

func (t *lateDeleteTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.hold() {
		return nil, context.DeadlineExceeded
	}
	return t.l.KV.Txn(t.ctx).If(t.cmps...).Then(t.thens...).Else(t.elss...).Commit()
}

func (t *lateDeleteTxn) hold() bool {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.key == "" {
		return false
	}
	for _, op := range t.thens {
		if op.IsDelete() && string(op.KeyBytes()) == l.key {
			l.key, l.held = "", t
			return true
		}
	}
	return false
}

// TestCluster_LateUnclaimCannotDeleteAClaimTakenBack: a node lets a deleted
// conversation's claim go, but the delete of its ownership key times out
// and reaches etcd only later; meanwhile a request on the conversation
// makes the node claim it again and find the key still under its lease.
// Taking that key back as it is would hand the late delete a claim to
// remove (it compares the create revision, the same one), leaving a node
// that believes it owns a conversation whose key is gone, which another
// node may claim. The node deletes such a key and claims afresh instead:
// the late delete then compares an old revision and removes nothing.
func TestCluster_LateUnclaimCannotDeleteAClaimTakenBack(t *testing.T) {
	const conv = participant.ConversationID(7)
	pfx := prefix()
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	late := &lateDelete{KV: cli.KV}
	cli.KV = late
	var mu sync.Mutex
	now := time.UnixMilli(1_700_000_000_000)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	a := startMemberOn(t, cli, pfx, "a", lossTTL, participant.Options{Retain: time.Minute, Now: clock})
	c := a.svc.Connect(nil)
	x, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(9, 1)})
	if err != nil {
		t.Fatal(err)
	}
	leave := participant.Leave{Conversation: conv, Participant: x.Participant, Generation: x.Generation, Secret: x.Secret, Token: tok(9, 2)}
	if _, err := c.Leave(ctx, leave); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	own := pfx + "own/" + conv.String()
	late.arm(own)
	if got, err := a.svc.CompactPass(ctx); err != nil || got.Deleted != 1 {
		t.Fatalf("CompactPass = %+v, %v; want conversation %v deleted", got, err, conv)
	}
	// The request claims the conversation again and answers retired.
	_, err = c.Leave(ctx, leave)
	if !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
		t.Fatalf("the retried leave = %v, want retired", err)
	}
	if late.apply(t) {
		t.Errorf("the late delete of the released claim removed the claim taken back")
	}
	resp, err := shared.Client.Get(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	if a.node.Holds(conv) && (len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != a.node.CurrentLease()) {
		t.Fatalf("node a holds conversation %v, but its ownership key is %v", conv, resp.Kvs)
	}
}
