package client_test

import (
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// A node's Client that re-attaches a participant by itself (its
// connection ended and it reconnected) moves the participant's binding to
// that node: the Cluster must learn it, so that when that binding ends
// too it follows the participant to its conversation's owner. Here a
// reader that never sends is bound on node 1; node 0's Client wants it
// bound too, from a Cluster attempt there that was refused, and binds it
// on its next connection. When node 0's connections end and node 0 no
// longer serves the conversation, the Cluster must attach the reader on
// node 1 again, or it receives nothing more. (The nemesis found this:
// cluster mode, a reader's last records never delivered.)
func TestCluster_ReattachedByANodeClient_StillFollowed(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	srv.mu.Lock()
	srv.reoffer = true
	srv.mu.Unlock()
	addrs := []string{srv.addr(), srv.addNode()}
	opts, reconnected := reconnectSignalled(fastClusterOpts)
	readers := dialClusterT(t, addrs, opts)
	r, err := readers.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The writer is a plain Client on node 1: node 0's ends leave it be.
	writer, err := client.Dial(ctx, addrs[1], fastClusterOpts.Options)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	w, err := writer.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	first := <-readers.Deliveries() // w joined
	// refuse1 refuses, with code, the first request of type typ through
	// node; the hook runs under srv.mu.
	refuse1 := func(node int, typ string, code wire.Code) func(fc *fconn, m wire.Message) bool {
		done := false
		return func(fc *fconn, m wire.Message) bool {
			if done || fc.node != node || m.Type() != typ {
				return false
			}
			done = true
			srv.refusal = wire.Error{Code: code, Detail: "scripted"}
			return true
		}
	}
	script := func(rules ...func(fc *fconn, m wire.Message) bool) {
		srv.setHook(func(fc *fconn, m wire.Message) action {
			for _, r := range rules {
				if r(fc, m) {
					return refuse
				}
			}
			return pass
		})
	}
	// Node 0 cannot serve the ack: the Cluster binds the reader on node 1.
	script(refuse1(0, wire.TypeAck, wire.CodeUnavailable))
	if _, err := readers.Ack(ctx, r, first.Seq); err != nil {
		t.Fatalf("Ack = %v", err)
	}
	if n := srv.boundNode(1, r.Participant); n != 1 {
		t.Fatalf("the reader is bound on node %d, want node 1", n)
	}
	// Node 1 cannot serve the next ack, and node 0 refuses the attach
	// the Cluster tries there before the ack: node 0's Client now wants
	// the reader bound, while node 1 holds it and serves the ack.
	script(refuse1(1, wire.TypeAck, wire.CodeUnavailable), refuse1(0, wire.TypeAttach, wire.CodeUnavailable))
	if _, err := readers.Ack(ctx, r, first.Seq); err != nil {
		t.Fatalf("Ack = %v", err)
	}
	if n := srv.boundNode(1, r.Participant); n != 1 {
		t.Fatalf("the reader is bound on node %d, want node 1", n)
	}
	// Node 0's connection ends; its Client reconnects and binds the
	// reader there by itself.
	srv.setHook(nil)
	srv.dropNode(0)
	<-reconnected
	if n := srv.boundNode(1, r.Participant); n != 0 {
		t.Fatalf("the reader is bound on node %d, want node 0 (re-attached by its Client)", n)
	}
	// Node 0's connection ends again, and node 0 no longer serves the
	// conversation (moved to node 1).
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Attach); ok && fc.node == 0 {
			srv.refusal = wire.Error{Code: wire.CodeMoved, Detail: "scripted", Owner: &addrs[1]}
			return refuse
		}
		return pass
	})
	srv.dropNode(0)
	seq, err := writer.Tell(ctx, w, []byte("after"))
	if err != nil {
		t.Fatalf("Tell = %v", err)
	}
	for {
		select {
		case d := <-readers.Deliveries():
			if d.Seq == seq {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the reader never received record %d: no node binds it (bound on node %d)", seq, srv.boundNode(1, r.Participant))
		}
	}
}

// A Cluster's detach tried on a node that first attaches the participant
// there (a detach needs the binding) and is refused before it detaches
// leaves that node's Client wanting the participant bound: once the
// detach committed on another node, that Client's next connection must
// not bind the participant again. (The nemesis found a detached writer
// bound again at a later generation.)
func TestCluster_Detach_AttachRefusedOnANode_NotBoundAgain(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	addrs := []string{srv.addr(), srv.addNode()}
	opts, reconnected := reconnectSignalled(fastClusterOpts)
	c := dialClusterT(t, addrs, opts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The node holding the binding cannot serve the detach at first; the
	// other refuses the attach the detach sends there before it; the
	// first then serves the detach.
	first, other := -1, -1 // the nodes, guarded by srv.mu
	refused := false
	srv.setHook(func(fc *fconn, m wire.Message) action {
		switch m.(type) {
		case *wire.Detach:
			if first < 0 {
				first, other = fc.node, 1-fc.node
				srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "scripted"}
				return refuse
			}
		case *wire.Attach:
			if fc.node == other && !refused {
				refused = true
				srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "scripted"}
				return refuse
			}
		}
		return pass
	})
	if _, err := c.Detach(ctx, cred); err != nil {
		t.Fatalf("Detach = %v", err)
	}
	wantUnbound(t, srv, cred.Participant)
	srv.mu.Lock()
	other, tried := other, refused
	srv.mu.Unlock()
	if !tried {
		t.Fatalf("the detach was not tried on node %d", other)
	}
	// That node's connection ends; its Client reconnects.
	srv.dropNode(other)
	<-reconnected
	if n := srv.boundNode(1, cred.Participant); n >= 0 {
		t.Errorf("the detached participant (answered) is bound again, on node %d, at generation %d", n, srv.member(1, cred.Participant).gen)
	}
}

// A node's Client that believes a participant bound on its live
// connection, while an attach of the Cluster's through another node
// committed (superseding that binding) and lost its answer, must send
// that attach in doubt again before it takes the participant for bound:
// else the Cluster's operations present the superseded generation, are
// refused stale_authority, and bind it again "here" without sending
// anything, until their context ends, and the participant stays bound
// nowhere. (The nemesis found a reader unbound for good this way.)
func TestCluster_AttachInDoubtElsewhere_SentAgainBeforeTrustingTheBinding(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	addrs := []string{srv.addr(), srv.addNode()}
	c := dialClusterT(t, addrs, fastClusterOpts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := srv.boundNode(1, cred.Participant)
	b := 1 - a
	// a cannot serve the ack until b's connection ended; b commits the
	// attach the ack sends there but answers in_doubt, drops the
	// connection on its retry, and then says a owns the conversation.
	bAttaches, dropped := 0, false // guarded by srv.mu
	srv.setHook(func(fc *fconn, m wire.Message) action {
		switch m.(type) {
		case *wire.Ack:
			if fc.node == a && !dropped {
				srv.refusal = wire.Error{Code: wire.CodeUnavailable, Detail: "scripted"}
				return refuse
			}
		case *wire.Attach:
			if fc.node != b {
				return pass
			}
			switch bAttaches++; bAttaches {
			case 1:
				return commitInDoubt
			case 2:
				dropped = true
				return dropBefore
			}
			srv.refusal = wire.Error{Code: wire.CodeMoved, Detail: "scripted", Owner: &addrs[a]}
			return refuse
		}
		return pass
	})
	if _, err := c.Ack(ctx, cred, 1); err != nil {
		t.Fatalf("Ack = %v, want it acked on node %d once the attach in doubt is settled there", err, a)
	}
	srv.mu.Lock()
	tried := dropped
	srv.mu.Unlock()
	if !tried {
		t.Fatalf("the ack never went to node %d", b)
	}
	if n := srv.boundNode(1, cred.Participant); n != a {
		t.Errorf("the participant is bound on node %d, want node %d", n, a)
	}
}

// reconnectSignalled returns opts with an OnReconnect that signals each
// reconnect on the channel it returns (buffered: a test waits for the
// first it needs, the rest are dropped).
func reconnectSignalled(opts client.ClusterOptions) (client.ClusterOptions, <-chan struct{}) {
	reconnected := make(chan struct{}, 16)
	opts.OnReconnect = func(client.Welcome) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	}
	return opts, reconnected
}
