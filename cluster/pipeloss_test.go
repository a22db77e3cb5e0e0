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
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_LeaseLostAlongThePipeline: a node's first tell of a
// conversation is held in etcd's client, a second tell is decided on its
// state behind it (pipelined), and the node's lease is lost at a step of
// the second batch:
//
//	step            the second batch when the lease goes  the first commit
//	deciding        its token looked up, nothing appended  held
//	staged          its rows appended, no flush asked yet  held
//	staged/applied  the same                               applied, answered
//	committing      its own transaction held in etcd       applied, answered
//
// in one of three ways:
//
//	lost    the node knows (its keep-alive failed): it drops every
//	        conversation and takes a new lease, and claims the
//	        conversation again for the retries
//	stolen  lost, and node b claims the conversation
//	taken   the node does not know (paused past its lease's expiry), and
//	        node b claims the conversation: only etcd's fence stops the
//	        node's commits
//
// The node reads through a lagging member (etcdtest.Lag, as the members
// startMember starts do). Then every held call goes on. Every answer is either committed (the
// first tell, when its commit applied before the loss) or in_doubt, and
// nothing staged under the lost claim is committed; the node holds the
// conversation no longer; a retry of each in_doubt tell with its token,
// on the node that owns the conversation then, commits it once, each
// tell replays there with its seq, and etcd holds the two tells in
// order, once each.
func TestCluster_LeaseLostAlongThePipeline(t *testing.T) {
	for _, step := range []string{"deciding", "staged", "staged/applied", "committing"} {
		for _, loss := range []string{"lost", "stolen", "taken"} {
			t.Run(step+"/"+loss, func(t *testing.T) { leaseLostAlongThePipeline(t, step, loss) })
		}
	}
}

func leaseLostAlongThePipeline(t *testing.T, step, loss string) {
	ctx := context.Background()
	pfx := prefix()
	const conv = 9
	cli := newClient(t)
	// The node reads through a lagging member, as startMemberWith's do.
	cli.KV = etcdtest.Lag(cli.KV, memberLagSeed(t, "a"))
	// first holds the first commit; own holds the second batch's own one:
	// the second transaction that writes the node's data (the first, once
	// let, passes through own), claims aside.
	first, own := newHeldCommit((*etcdtest.Txn).Send), newHeldCommit((*etcdtest.Txn).Send)
	own.match = func(txn *etcdtest.Txn) bool {
		return txn.Has(func(op clientv3.Op) bool {
			return op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), pfx+cluster.DataPrefix)
		})
	}
	cli.KV = etcdtest.Hook(etcdtest.Hook(cli.KV, etcdtest.Hooks{Txn: own.commit}), etcdtest.Hooks{Txn: first.commit})
	ttl := 5 * time.Second
	if loss == "taken" {
		ttl = time.Second
	}
	// at holds the second batch at the step, once armed: after its token
	// lookup, or as it asks for its flush.
	at := newGate()
	hold := &trigger{f: at.hold, match: func(s string, c participant.ConversationID) bool {
		return c == conv && (step == "deciding" && s == "read token" || strings.HasPrefix(step, "staged") && s == "flush")
	}}
	a := startMemberAt(t, cli, pfx, "a", ttl, participant.Options{}, hold.at)
	t.Cleanup(func() { // before the member's cleanup, which waits for the tells
		at.let()
		first.let()
		own.let()
	})
	ca, cb, ea, eb, tells := enrollTellers(t, a, conv)
	rows := oplogLen(t, a.node, conv)

	first.Arm(1)
	own.Arm(2)
	told := make([]participant.Told, 2)
	errs := make([]error, 2)
	answered := make([]chan struct{}, 2)
	for i, c := range []*participant.Conn{ca, cb} {
		answered[i] = make(chan struct{})
		go func() {
			defer close(answered[i])
			told[i], errs[i] = c.Tell(ctx, tells[i])
		}()
		if i == 0 {
			<-first.held
			// The first batch's token lookup and flush are behind it.
			hold.armed.Store(true)
		}
	}
	// committed: the first commit applied before the loss.
	committed := step == "staged/applied" || step == "committing"
	if step == "committing" {
		waitUntil(t, "the second tell staged behind the first", func() bool { return oplogLen(t, a.node, conv) == rows+2 })
	} else {
		waitUntil(t, "the second tell at the step", closed(at.held))
	}
	if a.svc.Pipelined() == 0 {
		t.Fatal("the second tell was not decided behind the first: nothing pipelined")
	}
	want := rows + 2
	if step == "deciding" {
		want = rows + 1
	}
	if n := oplogLen(t, a.node, conv); n != want {
		t.Fatalf("the oplog holds %d rows at the step, want %d", n, want)
	}
	if committed {
		first.let()
		<-answered[0]
		if errs[0] != nil {
			t.Fatalf("the first tell, its commit let: %v", errs[0])
		}
		if step == "committing" {
			waitUntil(t, "the second batch's commit", closed(own.held))
		}
	}

	// The loss. The retries go to the conversation's owner then: b,
	// which claims it by attaching both participants, or a again (lost).
	conns := []*participant.Conn{ca, cb}
	if loss == "taken" {
		a.node.PauseKeepAlive()
		waitDeleted(t, pfx+"own/"+fmt.Sprint(conv))
	} else {
		if err := a.node.LoseLease(ctx); err != nil {
			t.Fatal(err)
		}
		if a.node.Holds(conv) {
			t.Error("a holds the conversation after losing its lease")
		}
	}
	if loss != "lost" {
		b := startMember(t, pfx, "b", 5*time.Second)
		for i, e := range []participant.Bound{ea, eb} {
			conns[i] = b.svc.Connect(func() {})
			bound, err := conns[i].Attach(ctx, participant.Attach{Conversation: conv, Participant: e.Participant,
				Generation: e.Generation, Secret: e.Secret, Token: tok(3, i)})
			if err != nil {
				t.Fatalf("attach of %v on b: %v", e.Participant, err)
			}
			tells[i].Generation = bound.Generation
		}
	}
	at.let()
	first.let()
	own.let()
	<-answered[0]
	<-answered[1]

	for i, err := range errs {
		if i == 0 && committed {
			continue
		}
		if !errors.Is(err, participant.ErrInDoubt) {
			t.Fatalf("tell %d = %+v, %v, want in_doubt", i+1, told[i], err)
		}
	}
	if loss != "lost" && a.node.Holds(conv) {
		t.Error("a holds the conversation b claimed")
	}
	if committed {
		checkTells(t, pfx, conv, "one")
	} else {
		checkTells(t, pfx, conv)
	}

	if loss != "lost" {
		if _, err := ca.Tell(ctx, tells[0]); !errors.Is(err, participant.ErrMoved) {
			t.Fatalf("the first tell again on a = %v, want moved", err)
		}
	}
	for i, c := range conns {
		again, err := c.Tell(ctx, tells[i])
		if err != nil {
			t.Fatalf("tell %d again: %v", i+1, err)
		}
		if replayed := again.Replay != ""; replayed != (i == 0 && committed) {
			t.Fatalf("tell %d again = %+v: replayed %v, want %v", i+1, again, replayed, i == 0 && committed)
		}
		if i == 0 && committed && again.Seq != told[0].Seq {
			t.Fatalf("tell 1 again = %+v, want a replay of seq %d", again, told[0].Seq)
		}
		told[i] = again
	}
	if told[1].Seq <= told[0].Seq {
		t.Fatalf("after the retries, seqs %d and %d, want the second tell after the first", told[0].Seq, told[1].Seq)
	}
	for i, c := range conns {
		again, err := c.Tell(ctx, tells[i])
		if err != nil || again.Replay == "" || again.Seq != told[i].Seq {
			t.Fatalf("tell %d once more = %+v, %v, want a replay of seq %d", i+1, again, err, told[i].Seq)
		}
	}
	checkTells(t, pfx, conv, "one", "two")
	if err := a.svc.Failed(); err != nil {
		t.Fatalf("a's service failed: %v", err)
	}
}
