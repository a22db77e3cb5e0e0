package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// registryFault fails, once armed, the first transaction that puts a key
// containing key (a node's registry stream), as fault says; every other
// call passes through.
type registryFault struct {
	etcdtest.Trigger
	key   string
	fault etcdtest.Fault
}

// kv returns kv with f's fault in front of it.
func (f *registryFault) kv(kv clientv3.KV) clientv3.KV {
	return etcdtest.Hook(kv, etcdtest.Hooks{Txn: f.commit})
}

func (f *registryFault) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	hit := t.Has(func(op clientv3.Op) bool { return op.IsPut() && strings.Contains(string(op.KeyBytes()), f.key) })
	if !hit || !f.Hit() {
		return t.Send()
	}
	return t.Fail(f.fault)
}

// TestCluster_ARegistryFlushThatFailsAnswersRightAndDecidesOnce: the
// first batch of a new conversation flushes its registry entry (the
// global scope) before its rows (participant, batch.write) when its
// store keeps the order of the conversation's writes but not the
// registry's with them: an etcd store laid out in scopes.
//
// A node never takes that path: a claim is a fresh grant, which marks the
// conversation registered (participant, acquireTurn), so a node writes no
// registry entry at all (DESIGN.md, "Global streams and values": a
// conversation needs none in cluster mode); armed, the fault never fires
// and the enroll commits. The path runs where a service uses such a store
// without a node (the etcd cut loops and model): there the registry's
// flush failing, refused or with its outcome unknown (applied or not),
// answers the enroll unavailable (nothing of the batch was written),
// fails the service (a global scope's failure is the store's: a restart
// reconciles), and leaves no row of the conversation; a retry with the
// same token on the failed service writes nothing, and after a restart
// commits once, a second retry replaying it, with the registry entry
// durable before the rows.
func TestCluster_ARegistryFlushThatFailsAnswersRightAndDecidesOnce(t *testing.T) {
	ctx := context.Background()
	const conv = 5
	req := participant.Enroll{Conversation: conv, Token: tok(6, 1)}
	t.Run("a node", func(t *testing.T) {
		pfx := prefix()
		cli := newClient(t)
		fault := &registryFault{key: "node/a/conversations", fault: etcdtest.Refused}
		cli.KV = fault.kv(cli.KV)
		a := startMemberOn(t, cli, pfx, "a", 5*time.Second, participant.Options{})
		fault.Arm(1)
		if _, err := a.svc.Connect(func() {}).Enroll(ctx, req); err != nil {
			t.Fatalf("Enroll on a node: %v", err)
		}
		if fault.Fired() || registered(t, pfx+"d/", "node/a/conversations", conv) {
			t.Fatal("a node wrote a registry entry")
		}
		if kinds := rowKinds(t, pfx+"d/", conv); fmt.Sprint(kinds) != "[genesis enroll]" {
			t.Fatalf("oplog of %d = %v, want [genesis enroll]", conv, kinds)
		}
	})
	for _, mode := range []etcdtest.Fault{etcdtest.Refused, etcdtest.Lost, etcdtest.LostApplied} {
		t.Run(mode.String(), func(t *testing.T) {
			pfx := prefix()
			opts := etcdstore.Options{Prefix: pfx, Scope: cluster.Scope, ScanScope: cluster.ScanScope}
			fault := &registryFault{key: registry.Stream, fault: mode}
			open := func(kv clientv3.KV) (*etcdstore.Store, *participant.Service) {
				st := etcdstore.OpenKV(kv, opts)
				claimConvs(t, st, pfx)
				svc, err := participant.Open(ctx, st, participant.Options{NodeKey: participanttest.NodeKey})
				if err != nil {
					t.Fatalf("participant.Open: %v", err)
				}
				return st, svc
			}
			st, svc := open(fault.kv(shared.Client.KV))
			fault.Arm(1)
			c := svc.Connect(nil)
			_, err := c.Enroll(ctx, req)
			if !fault.Fired() {
				t.Fatal("the registry's transaction was not failed")
			}
			if !errors.Is(err, participant.ErrUnavailable) {
				t.Fatalf("Enroll whose registry flush failed = %v, want unavailable", err)
			}
			if err := svc.Failed(); err == nil {
				t.Fatal("the service did not fail with the store's global scope")
			}
			if _, err := c.Enroll(ctx, req); !errors.Is(err, participant.ErrUnavailable) && !errors.Is(err, participant.ErrInDoubt) {
				t.Fatalf("the retry on the failed service = %v, want unavailable or in_doubt", err)
			}
			svc.Close()
			st.Close()
			if kinds := rowKinds(t, pfx, conv); len(kinds) != 0 {
				t.Fatalf("after the failed registry flush etcd holds rows %v of the conversation, want none", kinds)
			}
			// Only a transaction whose answer was lost after it applied
			// leaves the entry (and the restart must not write it twice).
			if got, want := registered(t, pfx, registry.Stream, conv), mode == etcdtest.LostApplied; got != want {
				t.Fatalf("after the failed registry flush: registered = %v, want %v", got, want)
			}

			st, svc = open(shared.Client.KV)
			defer st.Close()
			defer svc.Close()
			if unl := svc.Unloadable(); len(unl) != 0 {
				t.Fatalf("after the restart: unloadable %+v", unl)
			}
			c = svc.Connect(nil)
			bound, err := c.Enroll(ctx, req)
			if err != nil {
				t.Fatalf("the retry after the restart: %v", err)
			}
			again, err := c.Enroll(ctx, req)
			if err != nil || again.Participant != bound.Participant || again.Generation != bound.Generation || again.Secret != bound.Secret {
				t.Fatalf("the second retry = %+v, %v, want %+v replayed", again, err, bound)
			}
			if kinds := rowKinds(t, pfx, conv); fmt.Sprint(kinds) != "[genesis enroll]" {
				t.Fatalf("oplog of %d = %v, want [genesis enroll]", conv, kinds)
			}
			if !registered(t, pfx, registry.Stream, conv) {
				t.Fatalf("conversation %d has rows and no registry entry", conv)
			}
		})
	}
}

// rowKinds returns the kinds of conversation conv's oplog rows in the
// etcd store at prefix pfx.
func rowKinds(t *testing.T, pfx string, conv participant.ConversationID) []string {
	t.Helper()
	var kinds []string
	for _, r := range oplogRows(t, pfx, conv) {
		kinds = append(kinds, fmt.Sprint(r.Kind))
	}
	return kinds
}

// oplogRows returns the rows etcd holds of conv's oplog, in an etcd
// store's data at prefix pfx.
func oplogRows(t *testing.T, pfx string, conv participant.ConversationID) []oplog.Row {
	t.Helper()
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx, Scope: cluster.Scope})
	defer ro.Close()
	es, err := ro.ReadFrom(oplog.Stream(conv), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows := make([]oplog.Row, 0, len(es))
	for _, e := range es {
		r, err := oplog.Decode(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	return rows
}

// registered reports whether the registry stream reg of the etcd store
// at prefix pfx names conv.
func registered(t *testing.T, pfx, reg string, conv participant.ConversationID) bool {
	t.Helper()
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx, Scope: cluster.Scope})
	defer ro.Close()
	es, err := ro.ReadFrom(reg, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		en, err := registry.Decode(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if en.Conversation == conv {
			return true
		}
	}
	return false
}
