package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// fastClusterOpts is a Cluster's configuration for the fake's nodes.
var fastClusterOpts = client.ClusterOptions{
	Options: client.Options{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		BindingCheckInterval: -1},
	AttemptTimeout: time.Second,
}

func dialClusterT(t *testing.T, seeds []string, opts client.ClusterOptions) *client.Cluster {
	t.Helper()
	c, err := client.DialCluster(testCtx(t), seeds, opts)
	if err != nil {
		t.Fatalf("DialCluster = %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A node answering unavailable (cut off from etcd, say) is not the only
// node: the Cluster tries another, which serves the conversation.
func TestCluster_Unavailable_TriesAnotherNode(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	b := srv.addNode()
	sick := -1 // the node of the first enroll, guarded by srv.mu
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Enroll); ok && sick < 0 {
			sick = fc.node
		}
		if fc.node == sick {
			srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "scripted: etcd unreachable"}
			return refuse
		}
		return pass
	})
	c := dialClusterT(t, []string{srv.addr(), b}, fastClusterOpts)
	if _, err := c.Enroll(ctx, 1); err != nil {
		t.Fatalf("Enroll = %v, want it enrolled through the healthy node", err)
	}
}

// An operation every node refused unavailable, whose caller gives up, is
// not in doubt: nothing was done.
func TestCluster_AllUnavailable_NotInDoubt(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.addNode()
	srv.setHook(func(fc *fconn, m wire.Message) action {
		srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "scripted"}
		return refuse
	})
	// The caller gives up while the Cluster backs off, not while a
	// request is in flight (which may have been applied: in_doubt).
	opts := fastClusterOpts
	opts.MinBackoff, opts.MaxBackoff = 20*time.Second, 20*time.Second
	c := dialClusterT(t, []string{srv.addr(), b}, opts)
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	_, err := c.Enroll(ctx, 1)
	if errors.Is(err, client.ErrInDoubt) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enroll refused unavailable everywhere = %v, want the context's error, not in_doubt", err)
	}
}

// Two nodes naming each other as the owner: the Cluster follows moved a
// bounded number of times, with backoff, and returns moved (nothing
// done), not in_doubt.
func TestCluster_MovedStorm_Bounded(t *testing.T) {
	srv := newFakeServer(t)
	addrs := []string{srv.addr(), srv.addNode()}
	enrolls := 0 // guarded by srv.mu
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Enroll); ok {
			enrolls++
		}
		owner := addrs[1-fc.node]
		srv.refusal = wire.Error{Code: wire.CodeMoved, Detail: "scripted", Owner: &owner}
		return refuse
	})
	c := dialClusterT(t, addrs, fastClusterOpts)
	_, err := c.Enroll(testCtx(t), 1)
	if !errors.Is(err, client.ErrMoved) || errors.Is(err, client.ErrInDoubt) {
		t.Errorf("Enroll between two nodes naming each other = %v, want moved", err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if enrolls > client.MaxMoved+1 {
		t.Errorf("%d enrolls sent, want at most %d", enrolls, client.MaxMoved+1)
	}
}

// A Cluster's detach whose answer is lost: neither the node's Client nor
// the Cluster's follower re-attaches the participant, and the retry
// replays the detach.
func TestCluster_Detach_AnswerLost_NoReattach(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialClusterT(t, []string{srv.addr()}, fastClusterOpts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	srv.setHook(onFirst[*wire.Detach](commitThenDrop))
	if _, err := c.Detach(ctx, cred); err != nil {
		t.Fatalf("Detach = %v", err)
	}
	wantUnbound(t, srv, cred.Participant)
	c.Close()
	if m := srv.member(1, cred.Participant); m.gen != 1 {
		t.Errorf("after Close: generation %d, want 1 (attached after the detach)", m.gen)
	}
	if got, want := requestsAfter[*wire.Detach](srv), []string{"detach"}; !cmp.Equal(got, want) {
		t.Errorf("requests after the first detach = %v, want %v", got, want)
	}
}

// A Cluster's leave whose answer is lost does not report the participant
// lost.
func TestCluster_Leave_AnswerLost_NotLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	opts := fastClusterOpts
	opts.OnLost = lost.onLost
	c := dialClusterT(t, []string{srv.addr()}, opts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	srv.setHook(onFirst[*wire.Leave](commitThenDrop))
	if _, err := c.Leave(ctx, cred); err != nil {
		t.Fatalf("Leave = %v", err)
	}
	c.Close()
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost called with %v for a participant the application left", got)
	}
}

// The Cluster deduplicates on (conversation, recipient, seq) too.
func TestCluster_Deliveries_DedupPerRecipient(t *testing.T) {
	srv := newFakeServer(t)
	c := dialClusterT(t, []string{srv.addr()}, fastClusterOpts)
	for _, m := range dedupPushes {
		srv.pushMsg(m)
	}
	if diff := cmp.Diff(dedupWant, gotOf(collect(t, c.Deliveries(), 99))); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}

// A Cluster's detach committed on a node that then stops answering: the
// retry on another node must not attach the participant there first (the
// replay would report detached for a participant bound again).
func TestCluster_Detach_NodeGone_NoReattachElsewhere(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	b := srv.addNode()
	opts := fastClusterOpts
	opts.AttemptTimeout = 200 * time.Millisecond
	c := dialClusterT(t, []string{srv.addr(), b}, opts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	gone := -1 // the node the detach committed on, guarded by srv.mu
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if fc.node == gone {
			return dropBefore
		}
		if _, ok := m.(*wire.Detach); ok && gone < 0 {
			gone = fc.node
			return commitThenDrop
		}
		return pass
	})
	if _, err := c.Detach(ctx, cred); err != nil {
		t.Fatalf("Detach = %v", err)
	}
	wantUnbound(t, srv, cred.Participant)
	for _, a := range attaches(srv) {
		t.Errorf("attach %+v sent", a)
	}
}

// A Cluster dialled to one single server (its welcome names no node) has
// no owner to wait for: a call that gives up says it waited for the
// server, with the server's own reason (a failed store, say), not for
// "the owner of conversation N".
func TestCluster_SingleServer_SaysServer(t *testing.T) {
	srv := newFakeServer(t)
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Enroll); ok {
			srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "store failed: no space left on device"}
			return refuse
		}
		return pass
	})
	c := dialClusterT(t, []string{srv.addr()}, fastClusterOpts)
	if !c.SingleServer() {
		t.Fatal("SingleServer() = false for one seed answering without a node")
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	_, err := c.Enroll(ctx, 1)
	if err == nil {
		t.Fatal("Enroll succeeded against a server that refuses it")
	}
	msg := err.Error()
	if !strings.Contains(msg, "waiting for the server at "+srv.addr()) || !strings.Contains(msg, "no space left on device") || strings.Contains(msg, "owner") {
		t.Errorf("Enroll = %q, want it to name the server and its reason, not an owner", msg)
	}
	if errors.Is(err, client.ErrInDoubt) {
		t.Errorf("Enroll = %v: every attempt was refused unavailable, nothing is in doubt", err)
	}
}

// receipt_expired is given only for a token that committed (its answer's
// secret is no longer replayed): a retry that meets it after a lost answer
// must not be reported as a refusal that applied nothing.
func TestCluster_ReceiptExpiredAfterALostAnswer_IsInDoubt(t *testing.T) {
	srv := newFakeServer(t)
	first := true
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Enroll); !ok {
			return pass
		}
		if first {
			first = false
			return commitThenDrop
		}
		srv.refusal = wire.Error{Code: wire.CodeReceiptExpired, Detail: "scripted: deadline"}
		return refuse
	})
	c := dialClusterT(t, []string{srv.addr()}, fastClusterOpts)
	_, err := c.Enroll(testCtx(t), 1)
	if !errors.Is(err, client.ErrInDoubt) {
		t.Fatalf("Enroll whose retry met receipt_expired = %v, want in_doubt: the enroll committed", err)
	}
}
