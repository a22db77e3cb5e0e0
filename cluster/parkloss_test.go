package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
)

// A connection's binding slot parked on a conversation (an enroll or
// attach in doubt, or answered while its conversation was forgotten under
// its batch: its binding may be stored, not published) and the node's
// lease lost: the node no longer serves the conversation, so the slot
// must not stay reserved until the conversation happens to load here
// again. Under a cap of one binding per connection that left the
// connection unable to bind anywhere. And when the conversation does load
// here again, the binding it finds on the connection must not bind it
// past its cap.

// parkOwnership is a node as the service's Ownership, with hooks on its
// flushes and acquisitions of one conversation.
type parkOwnership struct {
	*cluster.Node
	conv participant.ConversationID

	mu sync.Mutex
	// onFlushOf, when set, is each flush of conv, given the count of
	// them since it was set and the flush itself.
	// +checklocks:mu
	onFlushOf func(n int, flush func() error) error
	// +checklocks:mu
	flushes int
	// hold, when set, is waited on by each Acquire of conv.
	// +checklocks:mu
	hold chan struct{}
}

func (o *parkOwnership) Flush(c participant.ConversationID) error {
	if c != o.conv {
		return o.Node.Flush(c)
	}
	o.mu.Lock()
	f := o.onFlushOf
	o.flushes++
	n := o.flushes
	o.mu.Unlock()
	if f == nil {
		return o.Node.Flush(c)
	}
	return f(n, func() error { return o.Node.Flush(c) })
}

func (o *parkOwnership) Acquire(ctx context.Context, c participant.ConversationID) (bool, error) {
	if c == o.conv {
		o.mu.Lock()
		hold := o.hold
		o.mu.Unlock()
		if hold != nil {
			<-hold
		}
	}
	return o.Node.Acquire(ctx, c)
}

// onFlush sets onFlushOf, counting from 0.
func (o *parkOwnership) onFlush(f func(n int, flush func() error) error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.onFlushOf, o.flushes = f, 0
}

// holdAcquires makes every Acquire of conv wait until releaseAcquires.
func (o *parkOwnership) holdAcquires() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.hold == nil {
		o.hold = make(chan struct{})
	}
}

// releaseAcquires lets the Acquires of conv through again.
func (o *parkOwnership) releaseAcquires() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.hold != nil {
		close(o.hold)
		o.hold = nil
	}
}

var errFlushAnswerLost = errors.New("test: the flush's answer was lost")

// startCapNode starts node id with a service whose connections hold at
// most one binding each, its Ownership hooked on conversation conv.
func startCapNode(t *testing.T, pfx, id string, conv participant.ConversationID) (*parkOwnership, *participant.Service) {
	t.Helper()
	ctx := context.Background()
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: id, Advertise: id + ":7000", Prefix: pfx, LeaseTTL: lossTTL})
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	key, err := n.NodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	own := &parkOwnership{Node: n, conv: conv}
	svc, err := participant.Open(ctx, n.Store(), participant.Options{NodeKey: key, Ownership: own, MaxConversationsPerConn: 1})
	if err != nil {
		t.Fatalf("participant.Open(%s): %v", id, err)
	}
	n.OnLost(svc.Forget)
	t.Cleanup(func() {
		svc.Close()
		n.Close()
	})
	return own, svc
}

// TestCluster_AParkedSlotIsGivenBackWhenTheLeaseIsLost enrolls, on a
// connection with a cap of one binding, into conversation A, and loses
// the node's lease at the enroll's commit (cluster mode keeps a
// conversation's writes in order, so both barriers share one): before it
// (nothing committed) or after it, its answer lost (in doubt) or not
// (answered, A forgotten under the batch). A lease lost between two
// barriers of their own is participant's TestConnCap_* (an unordered
// store). The enroll's
// slot was parked on A; with A forgotten, the connection must be able to
// enroll into conversation B at once. Then A loads on the node again (the
// reload a failed batch starts, or another participant's tell): a binding
// of the enroll found there is ended (died/unclean_restart, as any node
// that loads A after the loss ends it) when the connection has no room
// for it, and bound again when it has; never past the cap.
func TestCluster_AParkedSlotIsGivenBackWhenTheLeaseIsLost(t *testing.T) {
	for i, tc := range []struct {
		name string
		// at is the flush of A the lease is lost at (the enroll's one);
		// flushed when that flush made the rows durable first (the
		// enroll's binding is then stored), answered when it returns nil.
		at                int
		flushed, answered bool
		// room: the connection does not enroll into B, so it has room
		// for the binding when A loads.
		room bool
	}{
		{name: "in doubt, nothing committed", at: 1},
		{name: "in doubt, nothing committed, room", at: 1, room: true},
		{name: "in doubt, committed", at: 1, flushed: true},
		{name: "in doubt, committed, room", at: 1, flushed: true, room: true},
		{name: "answered, forgotten under its batch", at: 1, flushed: true, answered: true},
		{name: "answered, forgotten under its batch, room", at: 1, flushed: true, answered: true, room: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			convA := participant.ConversationID(7100 + 10*i)
			convB := convA + 1
			own, svc := startCapNode(t, prefix(), "a", convA)
			owner := svc.Connect(nil)
			ob, err := owner.Enroll(ctx, participant.Enroll{Conversation: convA, Token: tok(0x71, 0)})
			if err != nil {
				t.Fatal(err)
			}
			c := svc.Connect(nil)

			t.Cleanup(own.releaseAcquires)
			own.onFlush(func(n int, flush func() error) error {
				if n != tc.at {
					return flush()
				}
				own.onFlush(nil)
				if tc.flushed {
					if err := flush(); err != nil {
						return err
					}
				}
				if err := own.Node.LoseLease(ctx); err != nil {
					t.Errorf("LoseLease: %v", err)
				}
				// From here on A loads only once the test lets it: the
				// reload a failed batch starts waits.
				own.holdAcquires()
				if !tc.answered {
					return errFlushAnswerLost
				}
				return nil
			})
			bc, err := c.Enroll(ctx, participant.Enroll{Conversation: convA, Token: tok(0x71, 1)})
			if !tc.answered {
				if !errors.Is(err, &participant.Error{Code: participant.CodeInDoubt}) {
					t.Fatalf("Enroll losing the lease at flush %d with its answer = %v, want in_doubt", tc.at, err)
				}
			} else if err != nil {
				t.Fatalf("Enroll answered after its barriers, A forgotten under its batch = %v, want its answer", err)
			}
			// The enroll's participant, if it committed, is A's second:
			// an enroll in doubt has no answer to name it.
			enrolled := ob.Participant + 1
			if err == nil && bc.Participant != enrolled {
				t.Fatalf("the enroll minted %v, want %v", bc.Participant, enrolled)
			}
			if got := c.Bindings(); len(got) != 0 {
				t.Fatalf("after the enroll, the connection is bound in %v, want nowhere (not published)", got)
			}

			var inB participant.Bound
			if !tc.room {
				if inB, err = c.Enroll(ctx, participant.Enroll{Conversation: convB, Token: tok(0x71, 2)}); err != nil {
					t.Fatalf("Enroll into B once A is forgotten with the node's lease = %v, want ok: the slot parked on A must be given back", err)
				}
			}

			// A loads here again: behind the reload, if a failed batch
			// started one, the owner's tell claims A and loads it.
			own.releaseAcquires()
			if _, err := owner.Tell(ctx, participant.Tell{Conversation: convA, Participant: ob.Participant, Generation: ob.Generation,
				Token: tok(0x71, 3), Payload: []byte("x")}); err != nil {
				t.Fatalf("the owner's tell once A loads again: %v", err)
			}
			bindings := c.Bindings()
			if len(bindings) > 1 {
				t.Fatalf("the connection is bound in %v, past its cap of 1", bindings)
			}
			st, ok := svc.Status(convA)
			if !ok || !st.Loaded {
				t.Fatalf("Status(A) = %+v, %v, want it loaded", st, ok)
			}
			var bound bool
			if tc.flushed {
				if int(enrolled) >= len(st.Participants) {
					t.Fatalf("A has %d participants, the enroll's %v not among them", len(st.Participants), enrolled)
				}
				ps := st.Participants[enrolled]
				bound = ps.Bound
				if bound && ps.Conn != c.ID() {
					t.Errorf("the enroll's participant is bound on %v, want %v", ps.Conn, c.ID())
				}
			}
			want := []participant.Binding{{Conversation: convB, Participant: inB.Participant}}
			switch {
			case tc.room && tc.flushed:
				want = []participant.Binding{{Conversation: convA, Participant: enrolled}}
				if !bound {
					t.Errorf("the enroll's binding, stored, is not bound again on a connection with room for it")
				}
			case tc.room:
				want = nil
			case tc.flushed && bound:
				t.Errorf("the enroll's binding is bound again on a connection whose one slot B took")
			case tc.flushed:
				// Ended, and the owner is told so.
				var died bool
				for _, d := range drain(owner, convA) {
					died = died || d.Kind.String() == "died" && d.Participant == enrolled && d.Cause.String() == "unclean_restart"
				}
				if !died {
					t.Errorf("the owner was not told that the enroll's binding, found without room on its connection, died/unclean_restart")
				}
			}
			if !sameBindings(bindings, want) {
				t.Errorf("the connection is bound in %v, want %v", bindings, want)
			}
		})
	}
}

func sameBindings(a, b []participant.Binding) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
