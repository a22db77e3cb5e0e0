package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// TestCluster_CompactedConversationFailsOver: node a checkpoints and
// compacts a conversation in etcd (its checkpoint and receipts in the
// conversation's fenced scope, the settled rows trimmed); a then stops
// renewing its lease, and node b, claiming the conversation, starts it from
// that checkpoint: every committed token replays its original answer (the
// trimmed ones from their receipts), a token reused with another payload
// is token_conflict, the reader is offered exactly what it did not
// acknowledge, and new tells commit after the old ones.
func TestCluster_CompactedConversationFailsOver(t *testing.T) {
	const (
		conv    = participant.ConversationID(21)
		tells   = 60
		unacked = 3
	)
	pfx := prefix()
	clk := participanttest.NewClock(time.UnixMilli(1_700_000_000_000))
	opts := participant.Options{CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	a := startMemberWith(t, pfx, "a", time.Second, opts)
	if _, ok := any(a.node.Store()).(store.Compactor); !ok {
		t.Fatal("the node's store is not a store.Compactor: cluster mode would run without checkpoints")
	}
	ctx := context.Background()

	ca, cr := a.svc.Connect(func() {}), a.svc.Connect(func() {})
	sender, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := cr.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Ack(ctx, participant.Ack{Conversation: conv, Participant: sender.Participant, Generation: sender.Generation, Through: 2}); err != nil {
		t.Fatal(err)
	}
	seqs := make([]participant.Seq, tells)
	var pending []string
	for i := range tells {
		body := fmt.Sprintf("tell %d", i)
		told, err := ca.Tell(ctx, participant.Tell{Conversation: conv, Participant: sender.Participant,
			Generation: sender.Generation, Token: tok(2, i), Payload: []byte(body)})
		if err != nil {
			t.Fatalf("tell %d: %v", i, err)
		}
		seqs[i] = told.Seq
		if i < tells-unacked {
			if _, err := cr.Ack(ctx, participant.Ack{Conversation: conv, Participant: reader.Participant,
				Generation: reader.Generation, Through: told.Seq}); err != nil {
				t.Fatalf("ack %d: %v", i, err)
			}
		} else {
			pending = append(pending, body)
		}
	}

	if n, err := a.svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass on a = %d, %v, want 1, nil", n, err)
	}
	clk.Advance(2 * time.Minute)
	got, err := a.svc.CompactPass(ctx)
	if err != nil || got.Conversations != 1 || got.OplogRows == 0 || got.Receipts == 0 {
		t.Fatalf("CompactPass on a = %+v, %v, want the settled history removed", got, err)
	}

	// What a wrote is in etcd, in the conversation's scope.
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	first, err := ro.First(oplog.Stream(conv))
	if err != nil || first != got.OplogRows {
		t.Fatalf("First(oplog) read back = %d, %v, want %d", first, err, got.OplogRows)
	}
	if _, err := ro.ReadFrom(oplog.Stream(conv), 0, 0); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("ReadFrom(oplog, 0) read back = %v, want ErrCompacted", err)
	}
	resp, err := shared.Client.Get(ctx, ro.ScopePrefix(cluster.Scope(oplog.Stream(conv)))+"b/"+checkpoint.Key(conv))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("checkpoint key in the conversation's scope: %v, %d keys, want 1", err, len(resp.Kvs))
	}

	// Failover: a stops renewing its lease; b claims on first touch.
	a.node.PauseKeepAlive()
	waitDeleted(t, pfx+"own/"+conv.String())
	b := startMemberWith(t, pfx, "b", 5*time.Second, opts)

	cb := b.svc.Connect(func() {})
	for i := range tells {
		req := participant.Tell{Conversation: conv, Participant: sender.Participant, Generation: sender.Generation,
			Token: tok(2, i), Payload: []byte(fmt.Sprintf("tell %d", i))}
		told, err := cb.Tell(ctx, req)
		if err != nil || told.Replay != participant.ReplayCommitted || told.Seq != seqs[i] {
			t.Fatalf("retry of tell %d on b = %+v, %v, want seq %d replayed", i, told, err, seqs[i])
		}
		req.Payload = []byte("something else")
		_, err = cb.Tell(ctx, req)
		var pe *participant.Error
		if !errors.As(err, &pe) || pe.Code != participant.CodeTokenConflict {
			t.Fatalf("retry of tell %d on b with another payload = %v, want token_conflict", i, err)
		}
	}
	replayed, err := cb.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil || replayed.Participant != sender.Participant || replayed.Secret != sender.Secret || replayed.Replay == participant.ReplayNone {
		t.Fatalf("retry of the first enroll on b = %+v, %v, want its original answer", replayed, err)
	}
	if unl := b.svc.Unloadable(); len(unl) != 0 {
		t.Fatalf("Unloadable() on b = %+v", unl)
	}

	crb := b.svc.Connect(func() {})
	rb, err := crb.Attach(ctx, participant.Attach{Conversation: conv, Participant: reader.Participant,
		Generation: reader.Generation, Secret: reader.Secret, Token: tok(3, 0)})
	if err != nil {
		t.Fatalf("reader's Attach on b: %v", err)
	}
	var offered []string
	for _, d := range drain(crb, conv) {
		if d.Kind == outbox.KindRecord {
			offered = append(offered, string(d.Payload))
		}
	}
	if diff := cmp.Diff(pending, offered); diff != "" {
		t.Fatalf("records offered on b after compaction and failover (-want +got):\n%s", diff)
	}
	sb, err := cb.Attach(ctx, participant.Attach{Conversation: conv, Participant: sender.Participant,
		Generation: sender.Generation, Secret: sender.Secret, Token: tok(3, 1)})
	if err != nil {
		t.Fatalf("sender's Attach on b: %v", err)
	}
	told, err := cb.Tell(ctx, participant.Tell{Conversation: conv, Participant: sb.Participant, Generation: sb.Generation,
		Token: tok(4, 0), Payload: []byte("after failover")})
	if err != nil || told.Seq <= seqs[tells-1] {
		t.Fatalf("new tell on b = %+v, %v, want a seq after %d", told, err, seqs[tells-1])
	}
	if rb.Generation != reader.Generation+1 {
		t.Fatalf("reader's generation on b = %d, want %d", rb.Generation, reader.Generation+1)
	}
}

// drain returns every delivery c has ready for conv after its binding's
// durable cursor.
func drain(c *participant.Conn, conv participant.ConversationID) []participant.Delivery {
	c.SetOfferedForTest(conv, participant.Offered{})
	var out []participant.Delivery
	for {
		d, ok := c.Next(conv)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// TestCluster_PassesRunAfterALoss: a node that lost its lease (every
// conversation dropped), took a new one and claimed one conversation back
// while another node claimed the other keeps checkpointing and compacting
// the one it owns: the lost conversation's failed scope concerns that
// conversation only, never a pass.
func TestCluster_PassesRunAfterALoss(t *testing.T) {
	const kept, lost = participant.ConversationID(31), participant.ConversationID(32)
	pfx := prefix()
	clk := participanttest.NewClock(time.UnixMilli(1_700_000_000_000))
	opts := participant.Options{CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	a := startMemberWith(t, pfx, "a", 5*time.Second, opts)
	b := startMemberWith(t, pfx, "b", 5*time.Second, opts)
	ctx := context.Background()

	ca := a.svc.Connect(func() {})
	bound := make(map[participant.ConversationID]participant.Bound)
	for _, c := range []participant.ConversationID{kept, lost} {
		bd, err := ca.Enroll(ctx, participant.Enroll{Conversation: c, Token: tok(byte(c), 0)})
		if err != nil {
			t.Fatal(err)
		}
		bound[c] = bd
	}
	// a loses both, takes kept back, and b takes lost.
	if err := a.node.LoseLease(ctx); err != nil {
		t.Fatal(err)
	}
	tell := func(cn *participant.Conn, c participant.ConversationID, gen participant.Generation, i int) {
		t.Helper()
		bd := bound[c]
		if _, err := cn.Tell(ctx, participant.Tell{Conversation: c, Participant: bd.Participant, Generation: gen,
			Token: tok(byte(c), 100+i), Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatalf("tell %d on %v: %v", i, c, err)
		}
	}
	attach := func(cn *participant.Conn, c participant.ConversationID) participant.Generation {
		t.Helper()
		bd := bound[c]
		rb, err := cn.Attach(ctx, participant.Attach{Conversation: c, Participant: bd.Participant,
			Generation: bd.Generation, Secret: bd.Secret, Token: tok(byte(c), 1)})
		if err != nil {
			t.Fatalf("attach on %v: %v", c, err)
		}
		return rb.Generation
	}
	ca = a.svc.Connect(func() {})
	ga := attach(ca, kept)
	cb := b.svc.Connect(func() {})
	gb := attach(cb, lost)
	for i := range 10 {
		tell(ca, kept, ga, i)
		tell(cb, lost, gb, i)
	}
	if n, err := a.svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass on a after losing %v = %d, %v, want 1 (of %v), nil", lost, n, err, kept)
	}
	clk.Advance(2 * time.Minute)
	if got, err := a.svc.CompactPass(ctx); err != nil || got.Conversations != 1 || got.OplogRows == 0 {
		t.Fatalf("CompactPass on a after losing %v = %+v, %v, want %v compacted", lost, got, err, kept)
	}
	if n, err := b.svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass on b = %d, %v, want 1 (of %v), nil", n, err, lost)
	}
}

// TestCluster_ConflictedScopeIsResetNotStuck: a commit of a conversation
// that etcd refuses while the node still holds the claim (here a checkpoint
// another writer touched: ErrConflict) fails that conversation only; the
// next touch resets its scope and reconciles it from etcd, and a retried
// token commits once.
func TestCluster_ConflictedScopeIsResetNotStuck(t *testing.T) {
	const conv = participant.ConversationID(41)
	pfx := prefix()
	a := startMemberWith(t, pfx, "a", 5*time.Second, participant.Options{CheckpointRows: 1})
	ctx := context.Background()
	ca := a.svc.Connect(func() {})
	bd, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	tell := func(i int) (participant.Told, error) {
		return ca.Tell(ctx, participant.Tell{Conversation: conv, Participant: bd.Participant, Generation: bd.Generation,
			Token: tok(2, i), Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := tell(0); err != nil {
		t.Fatal(err)
	}
	if n, err := a.svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass = %d, %v, want 1, nil", n, err)
	}
	if _, err := tell(1); err != nil {
		t.Fatal(err)
	}
	// Another writer rewrites the checkpoint (same bytes, newer revision)
	// after the node's last commit of the conversation.
	key := pfx + "d/c/" + conv.String() + "/b/" + checkpoint.Key(conv)
	resp, err := shared.Client.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(%s) = %v, %v", key, resp, err)
	}
	if _, err := shared.Client.Put(ctx, key, string(resp.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	_, err = a.svc.CheckpointPass(ctx)
	if !errors.Is(err, etcdstore.ErrConflict) || errors.Is(err, store.ErrFailed) {
		t.Fatalf("CheckpointPass over a checkpoint changed behind the node = %v, want ErrConflict, not store.ErrFailed", err)
	}
	if err := a.svc.Failed(); err != nil {
		t.Fatalf("the service failed over one conversation's conflict: %v", err)
	}
	// The next tell may meet the failed scope (in_doubt or unavailable);
	// retried with its token it commits once, on a scope read afresh.
	told, err := tell(2)
	for attempt := 1; err != nil; attempt++ {
		if attempt == 5 || (!errors.Is(err, participant.ErrInDoubt) && !errors.Is(err, participant.ErrUnavailable)) {
			t.Fatalf("tell 2 after the conflict, attempt %d: %v", attempt, err)
		}
		told, err = tell(2)
	}
	if again, err := tell(2); err != nil || again.Seq != told.Seq || again.Replay != participant.ReplayCommitted {
		t.Fatalf("replay of tell 2 = %+v, %v, want seq %d replayed", again, err, told.Seq)
	}
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	entries, err := ro.ReadFrom(oplog.Stream(conv), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	told2 := 0
	for _, e := range entries {
		row, err := oplog.Decode(e.Payload)
		if err != nil {
			t.Fatalf("oplog row %d: %v", e.Seq, err)
		}
		if row.Kind == oplog.KindTell && string(row.Payload) == "2" {
			told2++
		}
	}
	if told2 != 1 {
		t.Fatalf("tell 2 is in the oplog %d times, want once", told2)
	}
	if n, err := a.svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass after the reset = %d, %v, want 1, nil", n, err)
	}
}
