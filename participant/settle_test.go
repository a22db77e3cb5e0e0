package participant

import (
	"context"
	"errors"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// endRow returns the row of conv's oplog in st that ends a binding on
// conn, and whether there is one.
func endRow(t *testing.T, st store.DurableStore, conv ConversationID, conn ConnID) (oplog.Row, bool) {
	t.Helper()
	es, err := st.ReadFrom(oplog.Stream(conv), 0, 0)
	if err != nil {
		t.Fatalf("reading the oplog of %v: %v", conv, err)
	}
	for _, e := range es {
		r, err := oplog.Decode(e.Payload)
		if err != nil {
			t.Fatalf("decoding oplog row %d of %v: %v", e.Seq, conv, err)
		}
		if r.Kind == oplog.KindEnd && r.Conn == conn {
			return r, true
		}
	}
	return oplog.Row{}, false
}

// parked is the start the parked-slot tests share: conversation 1 with
// its owner's binding, and a second connection c whose enroll into it
// was answered in_doubt (its flush uncertain) while the conversation's
// reload fails, so that the enroll's slot is parked on the conversation.
// noReload is still on; extra rules follow the two the setup arms.
type parked struct {
	svc      *Service
	fs       *faultstore.Store
	mem      *store.Memory
	owner, c *Conn
	ob       Bound
	noReload *faultstore.Switch
}

func parkEnroll(t *testing.T, opts Options, extra ...faultstore.Rule) parked {
	t.Helper()
	p := parked{mem: store.NewMemory()}
	p.fs = faultstore.New(p.mem)
	uncertain := faultstore.NewSwitch(faultstore.Once(faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpFlush))))
	p.noReload = faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Prefix(oplog.Stream(1))))
	p.fs.SetRules(append([]faultstore.Rule{uncertain, p.noReload}, extra...)...)
	opts.NodeKey = testKey
	svc, err := Open(context.Background(), p.fs, opts)
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	p.svc = svc
	p.owner = svc.Connect(nil)
	p.ob = mustEnroll(t, p.owner, 1, 1)
	p.c = svc.Connect(nil)
	uncertain.Set(true)
	p.noReload.Set(true)
	_, err = p.c.Enroll(context.Background(), Enroll{Conversation: 1, Token: token(2)})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeInDoubt {
		t.Fatalf("Enroll with an uncertain flush = %v, want in_doubt", err)
	}
	svc.waitReloads() // the background reload fails
	return p
}

// TestConnCap_AConnectionEndingUnderALoadHasTheBindingEnded ends a
// connection while a load of a conversation it has a binding stored in
// (an enroll answered in_doubt, not published) holds it between the
// sorting of the bindings, which found the connection live, and their
// publication. End took its list of bindings to end before the load
// published this one: published, it was never ended, bound in the
// stored state to a connection gone (records kept for it, its maps kept
// in memory) until the conversation's next load, which may never come.
// The load publishes nothing on an ended connection and ends the binding
// itself with the connection's cause, as it ends one it finds on a
// connection already ending.
func TestConnCap_AConnectionEndingUnderALoadHasTheBindingEnded(t *testing.T) {
	ctx := context.Background()
	p := parkEnroll(t, Options{})
	svc, mem, owner, ob, c, noReload := p.svc, p.mem, p.owner, p.ob, p.c, p.noReload
	noReload.Set(false)

	// The owner's tell loads the conversation; between the sorting and
	// the publication, c ends.
	var endErr error
	ended := false
	hook := func(id ConversationID) {
		if id == 1 && !ended {
			ended = true
			endErr = c.End(ctx, oplog.CauseConnectionLost)
		}
	}
	svc.rebindHook.Store(&hook)
	if _, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")}); err != nil {
		t.Fatalf("Tell that loads the conversation = %v", err)
	}
	svc.rebindHook.Store(nil)
	if !ended || endErr != nil {
		t.Fatalf("the connection was ended under the load: %v, End = %v", ended, endErr)
	}
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
		t.Errorf("the ended connection has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
	}
	st, _ := svc.Status(1)
	for i, p := range st.Participants {
		if i != int(ob.Participant) && p.Bound {
			t.Errorf("after the load, participant %d is bound on %v, an ended connection; want its binding ended", i, p.Conn)
		}
	}
	if r, ok := endRow(t, mem, 1, c.ID()); !ok || r.Cause != oplog.CauseConnectionLost {
		t.Errorf("the binding on the ended connection: end row %v (cause %v), want one, cause connection_lost", ok, r.Cause)
	}
}

// TestConnCap_AnUnloadableConversationGivesItsParkedSlotsBack: a
// connection at its cap (1) has an enroll answered in_doubt, its slot
// parked on the conversation until the conversation's next load settles
// it; that load finds the conversation's stored rows damaged and
// contains it (unloadable). Nothing of a contained conversation loads
// again, so nothing settled the slot: the connection was refused
// capacity_exceeded everywhere until it ended. Containment gives the
// parked slots back, as a Forget does; the binding, if stored, is found
// by a load once the conversation is loadable again, and bound where the
// connection has room, or ended.
func TestConnCap_AnUnloadableConversationGivesItsParkedSlotsBack(t *testing.T) {
	ctx := context.Background()
	p := parkEnroll(t, Options{MaxConversationsPerConn: 1})
	svc, mem, owner, ob, c, noReload := p.svc, p.mem, p.owner, p.ob, p.c, p.noReload
	if reserved, bound := reservedSlots(c); reserved != 1 || bound != 0 {
		t.Fatalf("after an enroll in doubt, the connection has %d slots reserved and %d bindings, want 1 (parked) and 0", reserved, bound)
	}

	// A damaged outbox row: the next load refuses the conversation.
	n, err := mem.Len(outbox.Stream(1))
	must(t, err)
	_, err = mem.Append(outbox.Stream(1), []byte{0xff, 0xff, 0xff}, n)
	must(t, err)
	must(t, mem.Flush())
	noReload.Set(false)
	if _, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Tell in a conversation whose outbox is damaged = %v, want unavailable", err)
	}
	if unl := svc.Unloadable(); len(unl) != 1 || unl[0].Conversation != 1 {
		t.Fatalf("Unloadable() = %+v, want conversation 1", unl)
	}
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
		t.Errorf("after the conversation was contained, the connection has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(3)}); err != nil {
		t.Fatalf("Enroll into another conversation once the first is contained = %v, want ok under a cap of 1", err)
	}
}
