package cluster_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/tokenindex"
)

// countingKV counts the keys the reads through it return: ranges of Get
// and Do, and the range responses of transactions.
type countingKV struct {
	clientv3.KV
	keys atomic.Int64
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.keys.Add(int64(len(resp.Kvs)))
	}
	return resp, err
}

func (k *countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	resp, err := k.KV.Do(ctx, op)
	if err == nil {
		if g := resp.Get(); g != nil {
			k.keys.Add(int64(len(g.Kvs)))
		}
		if t := resp.Txn(); t != nil {
			k.countTxn(t)
		}
	}
	return resp, err
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	return &countingTxn{Txn: k.KV.Txn(ctx), kv: k}
}

func (k *countingKV) countTxn(resp *clientv3.TxnResponse) {
	for _, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil {
			k.keys.Add(int64(len(rr.Kvs)))
		}
	}
}

type countingTxn struct {
	clientv3.Txn
	kv *countingKV
}

func (t *countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *countingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *countingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *countingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil {
		t.kv.countTxn(resp)
	}
	return resp, err
}

// keysReadToDelete deletes a conversation every participant left, on a
// node of a data set that holds others conversations besides (each with
// a token index of a few entries, as a served conversation has), and
// returns how many keys the node read from etcd during the pass that
// deleted it.
func keysReadToDelete(t *testing.T, others int) int64 {
	t.Helper()
	pfx := prefix()
	ctx := context.Background()
	for first := 0; first < others; first += 32 {
		var ops []clientv3.Op
		for c := first; c < min(first+32, others); c++ {
			conv := oplog.ConversationID(1000 + c)
			for i := range 3 {
				name := tokenindex.Key(conv, tokenindex.Participant(oplog.ParticipantID(i+1)), oplog.Token(tok(5, i)))
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sd/c/%d/v/%s", pfx, conv, name), "\x00\x00\x00\x00\x00\x00\x00\x01"))
			}
		}
		if _, err := shared.Client.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	cli := newClient(t)
	kv := &countingKV{KV: cli.KV}
	cli.KV = kv
	a, clk := startDeleting(t, cli, pfx, "a")
	c := a.svc.Connect(nil)
	for i := range 2 {
		e, err := c.Enroll(ctx, participant.Enroll{Conversation: 7, Token: tok(9, i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Leave(ctx, participant.Leave{Conversation: 7, Participant: e.Participant, Generation: e.Generation, Secret: e.Secret, Token: tok(9, 10+i)}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Minute)
	before := kv.keys.Load()
	got, err := a.svc.CompactPass(ctx)
	if err != nil || got.Deleted != 1 {
		t.Fatalf("CompactPass = %+v, %v; want conversation 7 deleted", got, err)
	}
	return kv.keys.Load() - before
}

// TestCluster_DeletionReadsOnlyTheConversationsKeys: deleting a
// conversation reads its own keys, not the data set's: the keys read by
// the pass that deletes it are the same beside 10 other conversations as
// beside 1,000 (the token index is scanned as one etcd range of the
// conversation's scope, not by walking the whole data prefix).
func TestCluster_DeletionReadsOnlyTheConversationsKeys(t *testing.T) {
	small := keysReadToDelete(t, 10)
	large := keysReadToDelete(t, 1000)
	t.Logf("keys read to delete a conversation: %d beside 10 others, %d beside 1,000", small, large)
	if small != large {
		t.Fatalf("keys read to delete a conversation: %d beside 10 others, %d beside 1,000; want the same", small, large)
	}
}
