package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// hookKV returns kv calling afterGet after each Get and afterCommit after
// each committed transaction (nil: not called), so that a test can put
// another writer between a restore's (or a node's) steps.
func hookKV(kv clientv3.KV, afterGet func(key string), afterCommit func()) clientv3.KV {
	return etcdtest.Hook(kv, etcdtest.Hooks{
		Get: func(_ context.Context, g *etcdtest.Get) (*clientv3.GetResponse, error) {
			resp, err := g.Send()
			if err == nil && afterGet != nil {
				afterGet(g.Key)
			}
			return resp, err
		},
		Txn: func(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
			resp, err := t.Send()
			if err == nil && resp.Succeeded && afterCommit != nil {
				afterCommit()
			}
			return resp, err
		},
	})
}

// raceBackup returns a backup of keys data keys that restores in about
// keys/2 transactions (MaxTxnOps 2), and the format key.
func raceBackup(t *testing.T, keys int) []byte {
	t.Helper()
	p := shared.Prefix()
	for i := range keys {
		rel := fmt.Sprintf("d/c/7/s/%03d", i)
		put(t, p+rel, cluster.SealRel(rel, []byte("row")))
	}
	// A data set of this version's format, which a node serves once
	// restored.
	put(t, p+cluster.FormatKey, cluster.SealRel(cluster.FormatKey, []byte("1")))
	var buf bytes.Buffer
	if _, err := backup.Export(context.Background(), shared.Client.KV, p, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func restoring(t *testing.T, prefix string) bool {
	t.Helper()
	resp, err := shared.Client.Get(context.Background(), prefix+cluster.RestoringKey, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// TestRestore_NodeStartingAtTheSameTimeServesNothingHalfRestored: the
// restore race. A restore checks that its prefix is empty, then writes it
// in several transactions under the marker; a node of the same prefix
// starts in between. Whatever the interleaving, no node claims a
// conversation while the restore is writing: a node that registered
// before the first transaction makes the restore fail (the first
// transaction compares that the prefix is empty), and a node that passed
// its start check before the first transaction is refused its
// registration, or else every claim (ErrRestoring), until the last one.
func TestRestore_NodeStartingAtTheSameTimeServesNothingHalfRestored(t *testing.T) {
	const conv = participant.ConversationID(7)
	file := raceBackup(t, 8)
	opts := backup.RestoreOptions{MaxTxnOps: 2}

	t.Run("node registers after the empty check, before the first transaction", func(t *testing.T) {
		ctx := context.Background()
		q := shared.Prefix()
		var node *cluster.Node
		var claimed []string
		afterGet := func(string) {
			if node != nil {
				return
			}
			var err error
			node, err = cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "n1", Prefix: q, LeaseTTL: 5 * time.Second})
			if err != nil {
				t.Errorf("Start before the restore's first transaction: %v", err)
			}
		}
		txns := 0
		afterCommit := func() {
			txns++
			if node == nil || !restoring(t, q) {
				return
			}
			if _, err := node.Acquire(ctx, conv); err == nil {
				claimed = append(claimed, fmt.Sprintf("after transaction %d", txns))
			}
		}
		sum, err := backup.Restore(ctx, hookKV(shared.Client.KV, afterGet, afterCommit), q, bytes.NewReader(file), opts)
		if node != nil {
			defer node.Close()
		}
		if len(claimed) > 0 {
			t.Fatalf("a live node claimed conversation %v while the restore was writing (%s): it serves a half-restored data set", conv, strings.Join(claimed, ", "))
		}
		if !errors.Is(err, backup.ErrNotEmpty) {
			t.Fatalf("Restore with a node registered under the prefix = %+v, %v; want ErrNotEmpty", sum, err)
		}
		if restoring(t, q) {
			t.Fatalf("the refused restore left %s: it wrote something", cluster.RestoringKey)
		}
	})

	t.Run("node passes the start check before the first transaction, registers after it", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q := shared.Prefix()
		nodeChecked, firstDone, proceed := make(chan struct{}), make(chan struct{}), make(chan struct{})
		wait := func(ch chan struct{}) {
			select {
			case <-ch:
			case <-ctx.Done():
			}
		}
		// The restore's empty check and first transaction run after the
		// node's start check; the rest of the restore waits for the
		// node's claim.
		var once sync.Once
		rkv := hookKV(shared.Client.KV, func(string) { wait(nodeChecked) }, func() {
			once.Do(func() {
				close(firstDone)
				wait(proceed)
			})
		})
		type result struct {
			sum backup.Summary
			err error
		}
		restored := make(chan result, 1)
		go func() {
			sum, err := backup.Restore(ctx, rkv, q, bytes.NewReader(file), opts)
			restored <- result{sum, err}
		}()

		cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		// The node's start check reads the marker before the restore's
		// first transaction; everything after it runs after that one.
		var checked sync.Once
		cli.KV = hookKV(cli.KV, func(key string) {
			if strings.HasSuffix(key, cluster.RestoringKey) {
				checked.Do(func() {
					close(nodeChecked)
					wait(firstDone)
				})
			}
		}, nil)
		// Start refuses (its registration compares the marker), or, if
		// it registered, every claim does.
		node, err := cluster.Start(ctx, cli, cluster.Options{NodeID: "n1", Prefix: q, LeaseTTL: 5 * time.Second})
		if err == nil {
			defer node.Close()
			_, err = node.Acquire(ctx, conv)
		}
		close(proceed)
		if !errors.Is(err, cluster.ErrRestoring) {
			t.Fatalf("a node started while the restore was writing: Start and Acquire(%v) = %v, want ErrRestoring: the node would serve a half-restored conversation", conv, err)
		}
		r := <-restored
		if r.err != nil {
			t.Fatalf("Restore: %+v, %v", r.sum, r.err)
		}
		if r.sum.Txns < 2 {
			t.Fatalf("Restore took %d transactions; the test needs several", r.sum.Txns)
		}
		if node == nil {
			if node, err = cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "n1", Prefix: q, LeaseTTL: 5 * time.Second}); err != nil {
				t.Fatalf("Start after the restore: %v", err)
			}
			defer node.Close()
		}
		if ok, err := node.Acquire(ctx, conv); err != nil || !ok {
			t.Fatalf("Acquire(%v) after the restore = %v, %v; want a fresh claim", conv, ok, err)
		}
	})
}

// TestRestore_DefaultLimitsFitEtcd: a backup larger than one transaction
// restores with the default limits into an etcd with its default
// --max-txn-ops (128): no transaction, the first with its extra compare
// included, has more operations than etcd takes.
func TestRestore_DefaultLimitsFitEtcd(t *testing.T) {
	file := raceBackup(t, 300)
	q := shared.Prefix()
	sum, err := backup.Restore(context.Background(), shared.Client.KV, q, bytes.NewReader(file), backup.RestoreOptions{})
	if err != nil || sum.Keys != 301 {
		t.Fatalf("Restore = %+v, %v; want 301 keys (300 and the format key)", sum, err)
	}
}
