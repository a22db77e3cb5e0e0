package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// fastCluster is the client configuration of the tests that lose a node:
// short backoff and attempts, and no binding check, so that a reader
// sends nothing at all.
var fastCluster = client.ClusterOptions{
	Options: client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		BindingCheckInterval: -1},
	AttemptTimeout: time.Second,
}

func nodeConfig(pfx, id, advertise string) server.Config {
	return server.Config{DrainTimeout: 5 * time.Second, Cluster: server.ClusterConfig{
		Endpoints: shared.Endpoints(), NodeID: id, Prefix: pfx, Advertise: advertise, LeaseTTL: 2 * time.Second}}
}

// TestCluster_AttachInDoubtReplaysOnTheNewOwner: a participant's
// re-attachment after a reconnect commits on its owner a (generation 1 to
// 2) and its answer is lost; then a dies. On the new owner the attach must
// go out again as the same intended operation (its token, presenting
// generation 1): it replays the generation a minted, the participant is
// attached again with it and tells. An attach with a new token presenting
// generation 1 is refused stale_authority and loses the participant.
func TestCluster_AttachInDoubtReplaysOnTheNewOwner(t *testing.T) {
	pfx := prefix()
	px := startProxy(t)
	a := startDaemon(t, nodeConfig(pfx, "a", px.addr()))
	px.setTarget(a.srv.Addr().String())
	b := startDaemon(t, nodeConfig(pfx, "b", ""))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const conv = 41

	// The conversation is a's: created through a alone.
	setup, err := client.DialCluster(ctx, []string{px.addr()}, fastCluster)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Enroll(ctx, conv); err != nil {
		t.Fatal(err)
	}
	setup.Close()

	opts := fastCluster
	opts.DiscardDeliveries = true
	cl, err := client.DialCluster(ctx, []string{px.addr(), b.srv.Addr().String()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cred, err := cl.Enroll(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Generation != 1 {
		t.Fatalf("enrolled at generation %d, want 1", cred.Generation)
	}

	// The connection to a drops; the re-attachment on the next one
	// commits, and its answer is lost.
	px.deafen()
	px.cut()
	for lost := false; !lost; {
		select {
		case m := <-px.dropped:
			at, ok := m.(*wire.Attached)
			lost = ok && at.Participant == cred.Participant && at.Generation == 2
		case <-ctx.Done():
			t.Fatal("the re-attachment on a never committed")
		}
	}
	a.srv.Abandon()
	a.cancel()

	if _, err := cl.Tell(ctx, cred, []byte("on the new owner")); err != nil {
		t.Fatalf("Tell after the owner died with the re-attachment's answer = %v, want the attach replayed on b and the tell told", err)
	}
	if cur, _ := cl.Credential(cred.Conversation, cred.Participant); cur.Generation != 3 {
		t.Errorf("generation after the failover = %d, want 3 (2 minted on a and replayed on b, then one attach on b)", cur.Generation)
	}
}

// TestCluster_ReaderFollowsItsConversation: a reader that never sends
// (no tell, no ack, no binding check) keeps receiving after its
// conversation's owner is lost, abruptly (listener and connections cut,
// nothing released) or by a graceful drain (bye, ownership released):
// every record told, before and after, reaches the application once, in
// seq order. So does a reader whose node loses its lease while the
// connection stays up: the node forgets the binding without a word, and
// only the reader's binding check (an ack at its cursor, which changes
// nothing) finds it gone.
func TestCluster_ReaderFollowsItsConversation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check time.Duration // the reader's BindingCheckInterval
		lose  func(t *testing.T, d *daemon, lease clientv3.LeaseID)
	}{
		{"owner killed", -1, func(t *testing.T, d *daemon, _ clientv3.LeaseID) { d.srv.Abandon(); d.cancel() }},
		{"owner drained", -1, func(t *testing.T, d *daemon, _ clientv3.LeaseID) {
			if err := d.shutdown(); err != nil {
				t.Fatalf("drain = %v", err)
			}
		}},
		{"owner's lease lost", 500 * time.Millisecond, func(t *testing.T, _ *daemon, lease clientv3.LeaseID) {
			if _, err := shared.Client.Revoke(context.Background(), lease); err != nil {
				t.Fatalf("revoke the owner's lease: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pfx := prefix()
			nodes := []*daemon{startDaemon(t, nodeConfig(pfx, "a", "")), startDaemon(t, nodeConfig(pfx, "b", ""))}
			seeds := []string{nodes[0].srv.Addr().String(), nodes[1].srv.Addr().String()}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const conv = 42

			ropts := fastCluster
			ropts.BindingCheckInterval = tc.check
			readers, err := client.DialCluster(ctx, seeds, ropts)
			if err != nil {
				t.Fatal(err)
			}
			defer readers.Close()
			wopts := fastCluster
			wopts.DiscardDeliveries = true
			writers, err := client.DialCluster(ctx, seeds, wopts)
			if err != nil {
				t.Fatal(err)
			}
			defer writers.Close()
			if _, err := readers.Enroll(ctx, conv); err != nil {
				t.Fatal(err)
			}
			writer, err := writers.Enroll(ctx, conv)
			if err != nil {
				t.Fatal(err)
			}
			r := readRecords(readers)
			var told []string
			via := writers
			tell := func(p string) {
				t.Helper()
				if err := tellOnce(ctx, via, writer, p); err != nil {
					t.Fatal(err)
				}
				told = append(told, p)
			}
			for i := range 5 {
				tell(fmt.Sprintf("before/%d", i))
			}
			r.await(t, ctx, told)

			owner, lease := ownerOf(t, pfx, conv)
			victim := -1
			for i, d := range nodes {
				if d.srv.Addr().String() == owner {
					victim = i
				}
			}
			if victim < 0 {
				t.Fatalf("owner %q is no node of the test", owner)
			}
			tc.lose(t, nodes[victim], lease)
			// The tells after go through the survivor alone, which
			// claims the conversation at the first.
			via, err = client.DialCluster(ctx, []string{seeds[1-victim]}, wopts)
			if err != nil {
				t.Fatal(err)
			}
			defer via.Close()
			writer, _ = writers.Credential(writer.Conversation, writer.Participant)
			for i := range 10 {
				tell(fmt.Sprintf("after/%d", i))
			}
			r.await(t, ctx, told)
		})
	}
}

// tellOnce tells p, retrying an in_doubt answer with the same token.
func tellOnce(ctx context.Context, cl *client.Cluster, cred client.Credential, p string) error {
	tok := client.NewToken()
	for {
		_, err := cl.Tell(ctx, cred, []byte(p), client.WithToken(tok))
		var ce *client.Error
		if errors.As(err, &ce) && ce.Code == client.CodeInDoubt && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return fmt.Errorf("tell %s: %w", p, err)
		}
		return nil
	}
}

// records collects the records a Cluster's application receives, per
// conversation, checking as they come that each conversation's seqs only
// ascend (the Cluster delivers each (conversation, seq) once, in order).
type records struct {
	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	byConv map[uint64][]string
	// +checklocks:mu
	lastSeq map[uint64]uint64
	// +checklocks:mu
	errs    []error
	changed chan struct{} // capacity 1: a pending wake-up of await
}

func readRecords(cl *client.Cluster) *records {
	r := &records{byConv: make(map[uint64][]string), lastSeq: make(map[uint64]uint64), changed: make(chan struct{}, 1)}
	go func() {
		for d := range cl.Deliveries() {
			r.mu.Lock()
			if d.Seq <= r.lastSeq[d.Conversation] {
				r.errs = append(r.errs, fmt.Errorf("conversation %d: seq %d delivered after seq %d", d.Conversation, d.Seq, r.lastSeq[d.Conversation]))
			}
			r.lastSeq[d.Conversation] = d.Seq
			if d.Kind == wire.KindRecord {
				r.byConv[d.Conversation] = append(r.byConv[d.Conversation], string(d.Payload))
			}
			r.mu.Unlock()
			select {
			case r.changed <- struct{}{}:
			default:
			}
		}
	}()
	return r
}

// await waits until the single conversation read has received every
// payload of want, then checks each arrived once.
func (r *records) await(t *testing.T, ctx context.Context, want []string) {
	t.Helper()
	r.awaitConv(t, ctx, 0, want)
}

// awaitConv waits until conversation conv (0: the only one read) has
// received every payload of want, and checks that none arrived twice and
// that seqs only ascended.
func (r *records) awaitConv(t *testing.T, ctx context.Context, conv uint64, want []string) {
	t.Helper()
	for {
		r.mu.Lock()
		if conv == 0 {
			for c := range r.byConv {
				conv = c
			}
		}
		got := append([]string(nil), r.byConv[conv]...)
		errs := r.errs
		r.mu.Unlock()
		if len(errs) > 0 {
			t.Fatal(errors.Join(errs...))
		}
		count := make(map[string]int)
		for _, p := range got {
			count[p]++
		}
		missing := 0
		for _, p := range want {
			if count[p] > 1 {
				t.Fatalf("conversation %d: record %q reached the application %d times", conv, p, count[p])
			}
			if count[p] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-r.changed:
		case <-ctx.Done():
			t.Fatalf("conversation %d: the reader received %d of the %d records told (%d missing): %q", conv, len(want)-missing, len(want), missing, got)
		}
	}
}

// ownerOf returns the advertised address of the owner of conv under pfx,
// and the lease it owns it under.
func ownerOf(t *testing.T, pfx string, conv uint64) (string, clientv3.LeaseID) {
	t.Helper()
	resp, err := shared.Client.Get(context.Background(), fmt.Sprintf("%sown/%d", pfx, conv))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("owner of %d: %v, %d keys", conv, err, len(resp.Kvs))
	}
	var rec struct{ Addr string }
	if err := jsonUnmarshal(unsealed(t, pfx, resp.Kvs[0]), &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Addr, clientv3.LeaseID(resp.Kvs[0].Lease)
}
