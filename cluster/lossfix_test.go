package cluster_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/etcdstore"
)

// trigger runs f once, at the first step that match accepts while armed.
type trigger struct {
	armed atomic.Bool
	match func(step string, c participant.ConversationID) bool
	f     func()
}

func (g *trigger) at(step string, c participant.ConversationID) {
	if g.armed.Load() && g.match(step, c) && g.armed.CompareAndSwap(true, false) {
		g.f()
	}
}

// TestCluster_StaleCheckpointIsNeverWritten: node a derives a checkpoint
// of a conversation; before it writes it, a loses its lease, b claims the
// conversation, commits, checkpoints, compacts the rows below its
// checkpoint away and releases it, and a claims it back. a must not
// write its older checkpoint over b's: the rows it stands for are gone,
// and the conversation would be unloadable (checkpoint_mismatch) for good.
func TestCluster_StaleCheckpointIsNeverWritten(t *testing.T) {
	const conv = participant.ConversationID(61)
	pfx := prefix()
	g := &trigger{}
	a := startLossNode(t, pfx, "a", g.at)
	b := startLossNode(t, pfx, "b", nil)
	c := startLossNode(t, pfx, "c", nil)
	ctx := context.Background()
	ca, cr := a.svc.Connect(nil), a.svc.Connect(nil)
	sender, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := cr.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		told, err := ca.Tell(ctx, participant.Tell{Conversation: conv, Participant: sender.Participant,
			Generation: sender.Generation, Token: tok(2, i), Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cr.Ack(ctx, participant.Ack{Conversation: conv, Participant: reader.Participant,
			Generation: reader.Generation, Through: told.Seq}); err != nil {
			t.Fatal(err)
		}
	}
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	derived, err := ro.Len(oplog.Stream(conv))
	if err != nil {
		t.Fatal(err)
	}
	// Once a derived its checkpoint (its last read is of the outbox's
	// rows, after the outbox's length), the conversation changes hands
	// twice: b takes it, settles everything, checkpoints and compacts past
	// where a's checkpoint stands, and releases it; a takes it back.
	outboxReads := 0
	g.match = func(step string, _ participant.ConversationID) bool {
		if step == "read outbox" {
			outboxReads++
		}
		return outboxReads == 2
	}
	g.f = func() {
		if err := a.node.LoseLease(ctx); err != nil {
			t.Errorf("LoseLease: %v", err)
			return
		}
		settle(t, b.svc, conv, sender, reader)
		if n, err := b.svc.CheckpointPass(ctx); err != nil || n != 1 {
			t.Errorf("b's CheckpointPass = %d, %v; want 1", n, err)
		}
		if _, err := b.svc.CompactPass(ctx); err != nil {
			t.Errorf("b's CompactPass: %v", err)
		}
		if first, err := ro.First(oplog.Stream(conv)); err != nil || first < derived {
			t.Errorf("b compacted the oplog up to row %d (%v), want past row %d, where a's checkpoint stands", first, err, derived)
		}
		if err := b.node.Release(ctx); err != nil {
			t.Errorf("b's release: %v", err)
		}
		release, ok := participanttest.TryTurn(a.svc, conv)
		if !ok {
			t.Errorf("a's checkpoint pass holds the turn while deriving")
			return
		}
		release()
		// a claims the conversation back (the attach itself is refused).
		_, _ = a.svc.Connect(nil).Attach(ctx, participant.Attach{Conversation: conv, Generation: 1, Token: tok(4, 0)})
	}
	g.armed.Store(true)
	n, err := a.svc.CheckpointPass(ctx)
	if g.armed.Load() {
		t.Fatal("a's checkpoint pass never read the outbox")
	}
	if n != 0 {
		t.Errorf("a's CheckpointPass = %d, %v; want nothing written (b checkpointed and compacted meanwhile)", n, err)
	}
	if t.Failed() {
		t.FailNow()
	}
	// Another node takes over: the conversation loads, from b's
	// checkpoint, and a's tells replay.
	if err := a.node.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cc := c.svc.Connect(nil)
	told, err := cc.Tell(ctx, participant.Tell{Conversation: conv, Participant: sender.Participant,
		Generation: sender.Generation, Token: tok(2, 4), Payload: []byte("x")})
	if err != nil || told.Replay != participant.ReplayCommitted {
		t.Fatalf("replay of a's last tell on c = %+v, %v; want a committed replay", told, err)
	}
	if u := c.svc.Unloadable(); len(u) != 0 {
		t.Fatalf("unloadable on c: %+v", u)
	}
}

// settle has svc attach sender and reader, tell once, and both
// acknowledge everything, so that a compaction on svc may remove every
// row below its checkpoint.
func settle(t *testing.T, svc *participant.Service, conv participant.ConversationID, who ...participant.Bound) {
	t.Helper()
	ctx := context.Background()
	bound := make([]participant.Bound, len(who))
	conns := make([]*participant.Conn, len(who))
	for i, w := range who {
		var err error
		conns[i] = svc.Connect(nil)
		bound[i], err = conns[i].Attach(ctx, participant.Attach{Conversation: conv, Participant: w.Participant,
			Generation: w.Generation, Secret: w.Secret, Token: tok(5, i)})
		if err != nil {
			t.Errorf("attach of %v: %v", w.Participant, err)
			return
		}
	}
	_, err := conns[0].Tell(ctx, participant.Tell{Conversation: conv, Participant: bound[0].Participant,
		Generation: bound[0].Generation, Token: tok(6, 0), Payload: []byte("settled")})
	if err != nil {
		t.Errorf("tell: %v", err)
		return
	}
	for i, b := range bound {
		last, ok := lastOffered(conns[i], conv)
		if !ok {
			continue
		}
		if _, err := conns[i].Ack(ctx, participant.Ack{Conversation: conv, Participant: b.Participant,
			Generation: b.Generation, Through: last}); err != nil {
			t.Errorf("ack of %v: %v", b.Participant, err)
		}
	}
}

// lastOffered returns the seq of the last record cn would push of conv.
func lastOffered(cn *participant.Conn, conv participant.ConversationID) (participant.Seq, bool) {
	var off participant.Offered
	found := false
	cn.SetOfferedForTest(conv, off)
	for {
		d, ok := cn.Next(conv)
		if !ok {
			return off.Through, found
		}
		off, found = participant.Offered{Epoch: d.Epoch, Through: d.Seq}, true
	}
}

// TestCluster_LossAfterBarrierTwoDoesNotCrash: a node loses its lease
// (every conversation dropped and forgotten, from the keep-alive's
// goroutine, without the conversation's turn) just after an enroll's
// second barrier returned: the enroll committed and is answered, but the
// batch installs nothing into the forgotten conversation (it used to
// write its binding into the forgotten, nil map, and the node panicked),
// and the next operation claims and reconciles it.
func TestCluster_LossAfterBarrierTwoDoesNotCrash(t *testing.T) {
	const conv = participant.ConversationID(62)
	pfx := prefix()
	g := &trigger{}
	a := startLossNode(t, pfx, "a", g.at)
	ctx := context.Background()
	ca := a.svc.Connect(nil)
	first, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	// The enroll's one flush is its second barrier: cluster mode keeps a
	// conversation's writes in order, so barrier 1 shares it.
	g.match = func(step string, c participant.ConversationID) bool {
		return step == "flushed" && c == conv
	}
	g.f = func() {
		if err := a.node.LoseLease(ctx); err != nil {
			t.Errorf("LoseLease: %v", err)
		}
	}
	g.armed.Store(true)
	cb := a.svc.Connect(nil)
	second, err := cb.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
	if g.armed.Load() {
		t.Fatal("the enroll never passed its second barrier")
	}
	if err != nil {
		t.Fatalf("Enroll, committed past its second barrier = %v, want its answer", err)
	}
	if _, ok := cb.Next(conv); ok {
		t.Fatal("a pushed a record of a conversation it forgot")
	}
	// The next operation claims the conversation again and reconciles it.
	told, err := ca.Tell(ctx, participant.Tell{Conversation: conv, Participant: first.Participant,
		Generation: first.Generation, Token: tok(2, 0), Payload: []byte("after")})
	if err != nil {
		t.Fatalf("Tell after the loss = %+v, %v", told, err)
	}
	replay, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
	if err != nil || replay.Participant != second.Participant || replay.Replay == participant.ReplayNone {
		t.Fatalf("replay of the enroll = %+v, %v; want participant %v replayed", replay, err, second.Participant)
	}
}

// lapse is a node with a sender and a reader in conv, the reader with a
// delivery to push, and its keep-alive stopped as one that has not ticked
// yet.
type lapse struct {
	a              *lossNode
	conv           participant.ConversationID
	sender, reader *participant.Conn
	sent           participant.Bound
}

func newLapse(t *testing.T, conv participant.ConversationID) *lapse {
	t.Helper()
	l := &lapse{a: startLossNode(t, prefix(), "a", nil), conv: conv}
	ctx := context.Background()
	l.sender, l.reader = l.a.svc.Connect(nil), l.a.svc.Connect(nil)
	var err error
	if l.sent, err = l.sender.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.reader.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.sender.Tell(ctx, l.tell()); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.reader.Next(conv); !ok {
		t.Fatal("nothing to push before the lapse")
	}
	l.a.node.StopKeepAlive()
	return l
}

func (l *lapse) tell() participant.Tell {
	return participant.Tell{Conversation: l.conv, Participant: l.sent.Participant, Generation: l.sent.Generation,
		Token: tok(2, 0), Payload: []byte("x")}
}

// check fails unless the node pushes and answers nothing of the
// conversation now, before its keep-alive noticed the lapse.
func (l *lapse) check(t *testing.T) {
	t.Helper()
	// From the durable cursor: the record offered before the lapse is
	// pushable again but for the lapse.
	l.reader.SetOfferedForTest(l.conv, participant.Offered{})
	if d, ok := l.reader.Next(l.conv); ok {
		t.Errorf("pushed seq %v after the lease's local deadline passed", d.Seq)
	}
	if l.a.node.LeaseHeld() {
		t.Error("LeaseHeld after the lease's local deadline passed")
	}
	if told, err := l.sender.Tell(context.Background(), l.tell()); !errors.Is(err, participant.ErrUnavailable) {
		t.Errorf("replay of a tell after the lease's local deadline passed = %+v, %v; want unavailable (no lease)", told, err)
	}
}

// TestCluster_NoPushAfterTheLocalDeadline: once the lease's local
// deadline passes (a stall: both clocks moved past it), the node pushes
// nothing and answers nothing from memory, though its keep-alive has not
// noticed yet: by then etcd may have expired the lease and another node
// may serve the conversation.
func TestCluster_NoPushAfterTheLocalDeadline(t *testing.T) {
	l := newLapse(t, 63)
	l.a.clock.Stall(2 * lossTTL)
	l.check(t)
}

// TestCluster_SuspendedNodeServesNothing: a VM suspended for longer than
// the lease resumes with its monotonic clock where it stopped; the boot
// clock counted the suspend, so the node knows its lease lapsed and
// pushes and answers nothing before its keep-alive noticed.
func TestCluster_SuspendedNodeServesNothing(t *testing.T) {
	l := newLapse(t, 64)
	l.a.clock.Suspend(2 * lossTTL)
	l.check(t)
}

// TestCluster_RefusedEnrollCostsNothing: under the invite policy, enrolls
// without a valid invitation into conversations that exist nowhere are
// refused with no claim, no etcd write and nothing held in memory, so
// that refusals cannot fill etcd and the node's memory (issue 18); an
// enroll with its invitation still creates the conversation, and its
// retry without the invitation still replays.
func TestCluster_RefusedEnrollCostsNothing(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	a := startMemberOn(t, shared.Client, pfx, "a", lossTTL, participant.Options{EnrollPolicy: participant.EnrollInvite})
	n, svc := a.node, a.svc
	key, err := n.NodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rev := func() int64 {
		resp, err := shared.Client.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	wrong, err := participant.MintInvite(key, 1, time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cn := svc.Connect(nil)
	before := rev()
	for i := range 50 {
		req := participant.Enroll{Conversation: participant.ConversationID(100 + i), Token: tok(7, i)}
		want := participant.CodeInviteRequired
		if i%2 == 1 {
			req.Invite, want = wrong, participant.CodeInviteInvalid
		}
		if _, err := cn.Enroll(ctx, req); !errors.Is(err, &participant.Error{Code: want}) {
			t.Fatalf("Enroll %d = %v, want %s", i, err, want)
		}
	}
	if after := rev(); after != before {
		t.Errorf("refused enrolls moved the etcd revision from %d to %d", before, after)
	}
	if s := n.Stats(); s.Claims != 0 || s.Owned != 0 {
		t.Errorf("node stats after refused enrolls = %+v, want no claim", s)
	}
	if s := svc.Stats(); s.Conversations != 0 {
		t.Errorf("service stats after refused enrolls = %+v, want no conversation held", s)
	}
	inv, err := participant.MintInvite(key, 1, time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, err := cn.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(8, 0), Invite: inv})
	if err != nil {
		t.Fatalf("Enroll with its invitation = %v", err)
	}
	r, err := svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(8, 0), Invite: inv})
	if err != nil || r.Participant != b.Participant || r.Replay == participant.ReplayNone {
		t.Fatalf("retry with the invitation = %+v, %v; want participant %v replayed", r, err, b.Participant)
	}
}

// TestCluster_StatelessRefusalsCostNothing: enrolls into conversations
// that exist nowhere, refused for a reason that needs no state of them
// (the connection's bindings, the client's share of the conversations at
// their limits), claim nothing and write nothing to etcd, like
// the uninvited ones (issue 18, item 2); the conversations that exist
// are still served.
func TestCluster_StatelessRefusalsCostNothing(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	a := startMemberOn(t, shared.Client, pfx, "a", lossTTL, participant.Options{MaxConversationsPerConn: 1, MaxConversations: 40, ClientShare: 5})
	n, svc := a.node, a.svc
	rev := func() int64 {
		resp, err := shared.Client.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	refusals := func(cn *participant.Conn, base, count int, want participant.Code) {
		t.Helper()
		before, claims := rev(), n.Stats().Claims
		for i := range count {
			_, err := cn.Enroll(ctx, participant.Enroll{Conversation: participant.ConversationID(base + i), Token: tok(9, base+i)})
			if !errors.Is(err, &participant.Error{Code: want}) {
				t.Fatalf("Enroll into new conversation %d = %v, want %s", base+i, err, want)
			}
		}
		if after := rev(); after != before {
			t.Errorf("%d enrolls refused %s moved the etcd revision from %d to %d", count, want, before, after)
		}
		if got := n.Stats().Claims; got != claims {
			t.Errorf("%d enrolls refused %s made %d claims", count, want, got-claims)
		}
	}

	// One binding per connection: the second conversation is refused.
	cn := svc.Connect(nil)
	if _, err := cn.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(8, 1)}); err != nil {
		t.Fatalf("first enroll = %v", err)
	}
	refusals(cn, 1000, 30, participant.CodeCapacityExceeded)

	// Principal p's share of 40 conversations is 2.
	for i := range 2 {
		if _, err := svc.ConnectAs("p", nil).Enroll(ctx, participant.Enroll{Conversation: participant.ConversationID(10 + i), Token: tok(8, 10+i)}); err != nil {
			t.Fatalf("p's enroll %d = %v", i, err)
		}
	}
	refusals(svc.ConnectAs("p", nil), 2000, 30, participant.CodeCapacityExceeded)

	// A client past its creation rate: its bucket is empty.
	limited := svc.Connect(nil)
	limited.LimitCreates(participant.CreateLimit{Allow: func() bool { return false }, Exhausted: func() bool { return true }, Rate: 1, Burst: 1})
	refusals(limited, 3000, 30, participant.CodeRateLimited)

	if s := svc.Stats(); s.Conversations != 3 {
		t.Errorf("service holds %d conversations after the refusals, want the 3 created", s.Conversations)
	}
	if _, err := svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(8, 2)}); err != nil {
		t.Errorf("an enroll into an existing conversation = %v, want enrolled", err)
	}
}

// TestCluster_EvictIsDecidedByTheOwner: the operator's eviction asked of
// a node that does not own the conversation is moved, with the owner's
// address, and changes nothing; the owner evicts.
func TestCluster_EvictIsDecidedByTheOwner(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	a := startMemberOn(t, shared.Client, pfx, "a", lossTTL, participant.Options{})
	b := startMemberOn(t, shared.Client, pfx, "b", lossTTL, participant.Options{})
	p, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 5, Token: tok(6, 0)})
	if err != nil {
		t.Fatalf("enroll on a = %v", err)
	}
	_, err = b.svc.Evict(ctx, 5, p.Participant)
	var pe *participant.Error
	if !errors.As(err, &pe) || pe.Code != participant.CodeMoved || pe.Owner != "a:7000" {
		t.Fatalf("Evict on b = %v, want moved to a:7000", err)
	}
	if _, err := b.svc.Drop(ctx, 5); !errors.Is(err, participant.ErrMoved) {
		t.Fatalf("Drop on b = %v, want moved", err)
	}
	if _, err := a.svc.Evict(ctx, 5, p.Participant); err != nil {
		t.Fatalf("Evict on the owner = %v", err)
	}
}
