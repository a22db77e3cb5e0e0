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

// The connection's binding cap (MaxConversationsPerConn) counts the
// bindings published in Conn.bindings plus the slots reserved by enrolls
// and attaches decided and not yet published or refused. These tests hold
// a batch after its publication and before its operations complete, and
// drive every way an operation holding a slot ends.

// heldWake is a connection's wake that, once armed, reports that it was
// called and then blocks the committing goroutine until released: it
// holds a batch after its publication (publish wakes connections) and
// before its operations complete.
type heldWake struct {
	armed   chan struct{}
	entered chan struct{}
	release chan struct{}
}

func newHeldWake() *heldWake {
	return &heldWake{armed: make(chan struct{}, 1), entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldWake) arm() { h.armed <- struct{}{} }

func (h *heldWake) wake() {
	select {
	case <-h.armed:
		close(h.entered)
		<-h.release
	default:
	}
}

// reservedSlots returns c's reserved binding slots and its published
// bindings.
func reservedSlots(c *Conn) (reserved, bound int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reserved, len(c.bindings)
}

// TestConnCap_APublishedBindingIsNotCountedTwice holds an enroll's or an
// attach's batch between the publication of its binding and the
// completion of its operation, and enrolls meanwhile in another
// conversation on the same connection, which holds one binding under a
// cap of two: the enroll fits and must commit. Counting the published
// binding and its reservation both refused it capacity_exceeded (the
// flake of TestPipelinedEnrollsRespectTheConnectionCap).
func TestConnCap_APublishedBindingIsNotCountedTwice(t *testing.T) {
	for _, held := range []string{"enroll", "attach"} {
		t.Run(held, func(t *testing.T) {
			ctx := context.Background()
			svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, MaxConversationsPerConn: 2})
			must(t, err)
			t.Cleanup(func() { svc.Close() })
			// watcher is bound in conversation 1, so the held operation's
			// records wake it.
			hw := newHeldWake()
			watcher := svc.Connect(hw.wake)
			mustEnroll(t, watcher, 1, 1)
			c := svc.Connect(nil)
			var call *Call[Bound]
			switch held {
			case "enroll":
				hw.arm()
				call = c.StartEnroll(ctx, Enroll{Conversation: 1, Token: token(2)})
			case "attach":
				other := svc.Connect(nil)
				b := mustEnroll(t, other, 1, 3)
				watcher.TakeReady()
				hw.arm()
				call = c.StartAttach(ctx, Attach{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: token(4)})
			}
			heldErr := make(chan error, 1)
			go func() {
				_, err := call.Wait()
				heldErr <- err
			}()
			<-hw.entered
			if _, bound := reservedSlots(c); bound != 1 {
				close(hw.release)
				t.Fatalf("the held %s's batch woke the watcher with %d bindings published on its connection, want 1", held, bound)
			}
			_, err = c.Enroll(ctx, Enroll{Conversation: 2, Token: token(5)})
			close(hw.release)
			if err != nil {
				t.Errorf("Enroll into a second conversation while the %s of the first is published and not completed = %v, want ok under a cap of 2", held, err)
			}
			if err := <-heldErr; err != nil {
				t.Fatalf("held %s = %v", held, err)
			}
			if reserved, bound := reservedSlots(c); reserved != 0 || bound != 2 {
				t.Errorf("after both operations the connection has %d slots reserved and %d bindings, want 0 and 2", reserved, bound)
			}
		})
	}
}

// TestConnCap_EachEndOfAnOperationGivesBackItsSlotOnce ends enrolls and
// attaches that reserved a binding slot in every way: committed, refused
// after the reservation, failed before barrier 1, in doubt, and on a
// connection ended after the commit. Each gives its slot back exactly
// once: none stays reserved, and none is given back twice (which would
// let the connection bind past its cap).
func TestConnCap_EachEndOfAnOperationGivesBackItsSlotOnce(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	sw := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")))
	// One flush in doubt, the attach's: the reload that follows it must
	// not meet another while the switch is still on.
	uncertain := faultstore.NewSwitch(faultstore.Once(faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpFlush))))
	fs.SetRules(sw, uncertain)
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, MaxConversationsPerConn: 2, MaxParticipants: 2})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	c := svc.Connect(nil)
	check := func(what string, wantBound int) {
		t.Helper()
		svc.waitReloads()
		if reserved, bound := reservedSlots(c); reserved != 0 || bound != wantBound {
			t.Fatalf("after %s the connection has %d slots reserved and %d bindings, want 0 and %d", what, reserved, bound, wantBound)
		}
	}
	wantCode := func(what string, err error, code Code) {
		t.Helper()
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != code {
			t.Fatalf("%s = %v, want %v", what, err, code)
		}
	}

	mustEnroll(t, c, 1, 1)
	check("a committed enroll", 1)

	// Conversation 2 is full: the enroll reserves, then is refused.
	full := svc.Connect(nil)
	mustEnroll(t, full, 2, 2)
	other := svc.Connect(nil)
	held := mustEnroll(t, other, 2, 3)
	_, err = c.Enroll(ctx, Enroll{Conversation: 2, Token: token(4)})
	wantCode("Enroll into a full conversation", err, CodeCapacityExceeded)
	check("a refused enroll", 1)

	sw.Set(true)
	_, err = c.Enroll(ctx, Enroll{Conversation: 3, Token: token(5)})
	wantCode("Enroll with a failing oplog append", err, CodeInDoubt)
	// The enroll's slot stays reserved until the reload finds that it
	// wrote nothing (TestConnCap_AnAttachInDoubtKeepsItsSlotUntilALoadSettlesIt).
	svc.waitReloads()
	_, err = c.Attach(ctx, Attach{Conversation: 2, Participant: held.Participant, Generation: held.Generation, Secret: held.Secret, Token: token(6)})
	wantCode("Attach with a failing oplog append", err, CodeInDoubt)
	sw.Set(false)
	check("a failed enroll and attach", 1)

	if _, err := c.Enroll(ctx, Enroll{Conversation: 3, Token: token(5)}); err != nil {
		t.Fatalf("Enroll retried once the store recovered = %v", err)
	}
	check("a second committed enroll", 2)
	_, err = c.Enroll(ctx, Enroll{Conversation: 4, Token: token(7)})
	wantCode("Enroll past the cap", err, CodeCapacityExceeded)
	check("an enroll refused at the cap", 2)
	d3 := c.Bindings()[1]
	if _, err := c.Detach(ctx, Detach{Conversation: d3.Conversation, Participant: d3.Participant, Generation: 1, Token: token(8)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	check("a detach", 1)

	// In doubt and durable: the reconciliation binds the participant on
	// c, which took no slot for it; then the cap is full again.
	uncertain.Set(true)
	_, err = c.Attach(ctx, Attach{Conversation: 2, Participant: held.Participant, Generation: held.Generation, Secret: held.Secret, Token: token(9)})
	wantCode("Attach with an uncertain flush", err, CodeInDoubt)
	uncertain.Set(false)
	check("an attach in doubt that committed", 2)
	_, err = c.Enroll(ctx, Enroll{Conversation: 5, Token: token(10)})
	wantCode("Enroll past the cap after an attach in doubt", err, CodeCapacityExceeded)
	check("an enroll refused at the cap", 2)

	// Enrolls on a connection that ends as they commit: End waits for
	// them, and each gives its slot back once, bound or not.
	d := svc.Connect(nil)
	calls := []*Call[Bound]{
		d.StartEnroll(ctx, Enroll{Conversation: 6, Token: token(11)}),
		d.StartEnroll(ctx, Enroll{Conversation: 7, Token: token(12)}),
		d.StartEnroll(ctx, Enroll{Conversation: 8, Token: token(13)}),
	}
	ended := make(chan error, 1)
	go func() { ended <- d.End(ctx, oplog.CauseConnectionLost) }()
	for i, call := range calls {
		if _, err := call.Wait(); err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded {
				t.Errorf("enroll %d on an ending connection = %v, want ok or capacity_exceeded", i, err)
			}
		}
	}
	if err := <-ended; err != nil {
		t.Fatalf("End = %v", err)
	}
	if reserved, _ := reservedSlots(d); reserved != 0 {
		t.Errorf("an ended connection keeps %d slots reserved, want 0", reserved)
	}
}

// TestConnCap_AnEnrollForgottenUnderItsBatchGivesItsSlotBack forgets
// the conversation (its ownership lost) while an enroll's batch waits on
// its flush, on a connection with a cap of one: the rows are durable, so
// the enroll is answered, but its binding is not published. The service
// may never load the conversation again (another node ends the binding),
// so the slot is given back at once, not parked until a load that may
// never come. When the conversation does load here again, the binding is
// bound with a free slot of the connection, or, when the connection
// filled its slot meanwhile (an enroll into another conversation), ended
// died/unclean_restart as on any node that loads it after the loss:
// never bound past the cap.
func TestConnCap_AnEnrollForgottenUnderItsBatchGivesItsSlotBack(t *testing.T) {
	for _, filled := range []bool{false, true} {
		name := "room"
		if filled {
			name = "filled"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			fs := faultstore.New(store.NewMemory())
			hang := faultstore.NewSwitch(faultstore.When(faultstore.Hang, faultstore.Kind(faultstore.OpFlush)))
			fs.SetRules(hang)
			svc, err := Open(ctx, fs, Options{NodeKey: testKey, MaxConversationsPerConn: 1})
			must(t, err)
			t.Cleanup(func() { svc.Close() })
			owner := svc.Connect(nil)
			ob := mustEnroll(t, owner, 1, 1)
			c := svc.Connect(nil)

			hang.Set(true)
			call := c.StartEnroll(ctx, Enroll{Conversation: 1, Token: token(2)})
			type answer struct {
				b   Bound
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				b, err := call.Wait() // the caller leads its batch
				answered <- answer{b, err}
			}()
			<-fs.Hung()
			if reserved, bound := reservedSlots(c); reserved != 1 || bound != 0 {
				t.Fatalf("with the enroll's flush held, the connection has %d slots reserved and %d bindings, want 1 and 0", reserved, bound)
			}
			svc.Forget(1)
			hang.Set(false)
			fs.Release()
			a := <-answered
			b, err := a.b, a.err
			if err != nil {
				t.Fatalf("Enroll whose conversation was forgotten under its durable batch = %v, want its answer", err)
			}
			if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
				t.Fatalf("after the enroll forgotten under its batch, the connection has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
			}
			if filled {
				if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(3)}); err != nil {
					t.Fatalf("Enroll into a second conversation once the first was forgotten = %v, want ok under a cap of 1", err)
				}
			}
			// The owner's tell loads conversation 1 again.
			if _, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")}); err != nil {
				t.Fatalf("Tell after the conversation's reload = %v", err)
			}
			svc.waitReloads()
			if reserved, bound := reservedSlots(c); reserved != 0 || bound != 1 {
				t.Fatalf("after the reload, the connection has %d slots reserved and %d bindings, want 0 and 1", reserved, bound)
			}
			st, _ := svc.Status(1)
			if got := st.Participants[b.Participant].Bound; got == filled {
				t.Errorf("after the reload the enroll's participant is bound: %v, want %v", got, !filled)
			}
			if filled {
				if got := c.Bindings(); len(got) != 1 || got[0].Conversation != 2 {
					t.Errorf("the connection is bound in %v, want conversation 2 alone", got)
				}
				var died bool
				for _, d := range drainNext(owner, 1) {
					died = died || d.Kind == outbox.KindDied && d.Participant == b.Participant && d.Cause == oplog.CauseUncleanRestart
				}
				if !died {
					t.Errorf("the owner was not told that the enroll's binding died/unclean_restart")
				}
			}
		})
	}
}

// TestConnCap_AnAttachInDoubtKeepsItsSlotUntilALoadSettlesIt makes an
// attach's flush uncertain (durable, answered in_doubt) on a connection
// with a cap of one, and keeps the conversation's reload failing: until a
// load finds the binding, the attach's slot stays reserved, so an enroll
// into another conversation is refused at the cap; the load then binds
// the participant with that slot. A second attach in doubt that did not
// commit (its append failed) has its slot given back by the load that
// finds nothing.
func TestConnCap_AnAttachInDoubtKeepsItsSlotUntilALoadSettlesIt(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	uncertain := faultstore.NewSwitch(faultstore.Once(faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpFlush))))
	// The reload reads the conversation's oplog back: failing it keeps
	// the conversation unloaded.
	noReload := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Prefix(oplog.Stream(1))))
	noAppend := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(oplog.Stream(1))))
	fs.SetRules(uncertain, noReload, noAppend)
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, MaxConversationsPerConn: 1})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	owner := svc.Connect(nil)
	held := mustEnroll(t, owner, 1, 1)
	c := svc.Connect(nil)
	wantCode := func(what string, err error, code Code) {
		t.Helper()
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != code {
			t.Fatalf("%s = %v, want %v", what, err, code)
		}
	}

	uncertain.Set(true)
	noReload.Set(true)
	_, err = c.Attach(ctx, Attach{Conversation: 1, Participant: held.Participant, Generation: held.Generation, Secret: held.Secret, Token: token(2)})
	wantCode("Attach with an uncertain flush", err, CodeInDoubt)
	svc.waitReloads() // the background reload fails
	_, err = c.Enroll(ctx, Enroll{Conversation: 2, Token: token(3)})
	wantCode("Enroll into a second conversation while an attach is in doubt", err, CodeCapacityExceeded)
	if reserved, bound := reservedSlots(c); reserved != 1 || bound != 0 {
		t.Fatalf("after an attach in doubt and a failed reload, the connection has %d slots reserved and %d bindings, want 1 (parked) and 0", reserved, bound)
	}

	noReload.Set(false)
	b1, err := c.Attach(ctx, Attach{Conversation: 1, Participant: held.Participant, Generation: held.Generation, Secret: held.Secret, Token: token(2)})
	if err != nil {
		t.Fatalf("Attach retried with its token = %v, want its committed answer", err)
	}
	svc.waitReloads()
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 1 {
		t.Fatalf("after the load that found the attach's binding, the connection has %d slots reserved and %d bindings, want 0 and 1", reserved, bound)
	}

	// An attach in doubt that wrote nothing (its append failed): the load
	// finds the binding where it was, on c, and gives d's slot back.
	d := svc.Connect(nil)
	noAppend.Set(true)
	_, err = d.Attach(ctx, Attach{Conversation: 1, Participant: b1.Participant, Generation: b1.Generation, Secret: b1.Secret, Token: token(5)})
	noAppend.Set(false)
	wantCode("Attach with a failing oplog append", err, CodeInDoubt)
	svc.waitReloads()
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 1 {
		t.Fatalf("after an attach elsewhere that wrote nothing, the bound connection has %d slots reserved and %d bindings, want 0 and 1", reserved, bound)
	}
	if reserved, bound := reservedSlots(d); reserved != 0 || bound != 0 {
		t.Fatalf("after an attach that wrote nothing and a reload, its connection has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
	}
}

// TestConnCap_ASlotParkedOnAConversationMovedElsewhereIsGivenBack makes
// an enroll's barrier 1 uncertain (its oplog row durable, the answer
// in_doubt) on a connection with a cap of one, and the conversation moves
// to another node at that instant without a Forget (cluster mode: a
// commit fenced off, its claim found taken): the reload the failure
// starts is answered moved, and the slot parked on the conversation is
// given back, as a Forget gives it back; kept, it refused the connection
// capacity_exceeded everywhere until the conversation loaded here again.
// When it does (a fresh grant), the binding it finds, the connection's
// slot taken by then, is ended, not bound past the cap.
func TestConnCap_ASlotParkedOnAConversationMovedElsewhereIsGivenBack(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	own := newFakeOwnership(fs)
	uncertain := faultstore.NewSwitch(faultstore.Once(faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpFlush))))
	fs.SetRules(uncertain)
	fs.SetObserver(func(_ faultstore.Op, a faultstore.Action, _ error) {
		if a == faultstore.Uncertain {
			own.mu.Lock()
			own.owner[1] = "b:7000"
			own.mu.Unlock()
		}
	})
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, Ownership: own, MaxConversationsPerConn: 1})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	owner := svc.Connect(nil)
	ob := mustEnroll(t, owner, 1, 1)
	c := svc.Connect(nil)

	uncertain.Set(true)
	_, err = c.Enroll(ctx, Enroll{Conversation: 1, Token: token(2)})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeInDoubt {
		t.Fatalf("Enroll with an uncertain barrier = %v, want in_doubt", err)
	}
	svc.waitReloads() // answered moved
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
		t.Fatalf("after the reload answered moved, the connection has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(3)}); err != nil {
		t.Fatalf("Enroll into a second conversation once the first moved elsewhere = %v, want ok under a cap of 1", err)
	}

	// The conversation comes back: a fresh grant reloads it.
	own.mu.Lock()
	delete(own.owner, 1)
	own.fresh[1] = true
	own.mu.Unlock()
	if _, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")}); err != nil {
		t.Fatalf("Tell once the conversation is back = %v", err)
	}
	svc.waitReloads()
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 1 {
		t.Fatalf("after the reload, the connection has %d slots reserved and %d bindings, want 0 and 1", reserved, bound)
	}
	st, _ := svc.Status(1)
	if len(st.Participants) != 2 || st.Participants[1].Bound {
		t.Errorf("after the reload, the participants are %+v, want the enroll's second one, not bound", st.Participants)
	}
}

// TestConnCap_ALoadForgottenUnderItPublishesNoBinding forgets a
// conversation (its ownership lost) while a load of it is reading it
// back. The load finds a binding stored on a connection that holds none
// (an enroll answered in_doubt whose row is durable, its slot parked): it
// must publish nothing, as it installs nothing. Published, the
// connection was bound in a conversation this service had forgotten and
// may never load again (another node ends the binding): it counted
// against the connection's cap, so an enroll into another conversation
// was refused capacity_exceeded, and the connection was never idle.
func TestConnCap_ALoadForgottenUnderItPublishesNoBinding(t *testing.T) {
	ctx := context.Background()
	hang := faultstore.NewSwitch(faultstore.When(faultstore.Hang, faultstore.Kind(faultstore.OpRead), faultstore.Prefix(oplog.Stream(1))))
	p := parkEnroll(t, Options{MaxConversationsPerConn: 1}, hang)
	svc, fs, owner, ob, c, noReload := p.svc, p.fs, p.owner, p.ob, p.c, p.noReload
	if reserved, bound := reservedSlots(c); reserved != 1 || bound != 0 {
		t.Fatalf("after an enroll in doubt, the connection has %d slots reserved and %d bindings, want 1 (parked) and 0", reserved, bound)
	}

	// The owner's tell loads the conversation; its read is held while the
	// conversation is forgotten.
	noReload.Set(false)
	hang.Set(true)
	told := make(chan error, 1)
	go func() {
		_, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")})
		told <- err
	}()
	<-fs.Hung()
	svc.Forget(1)
	hang.Set(false)
	fs.Release()
	if err := <-told; !errors.Is(err, errForgotten) {
		t.Fatalf("Tell whose load was forgotten under it = %v, want %v", err, errForgotten)
	}
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
		t.Fatalf("after the forgotten load, the connection has %d slots reserved and %d bindings %v, want 0 and 0", reserved, bound, c.Bindings())
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(3)}); err != nil {
		t.Fatalf("Enroll into a second conversation once the first was forgotten = %v, want ok under a cap of 1", err)
	}
}

// TestConnCap_AnEndedConnectionsParkedSlotIsGivenBack ends a connection
// whose enroll is in doubt, its slot parked on a conversation whose
// reload keeps failing. A parked slot is settled by the conversation's
// next load, or by a Forget: neither may ever come (nothing touches the
// conversation again), and until then the slot held the ended connection
// in memory, with its maps, one more for every connection that ended so.
// End gives the connection's parked slots back, as park gives back the
// slot of a connection that already ended; the load that then finds the
// binding ends it (died/connection_lost).
func TestConnCap_AnEndedConnectionsParkedSlotIsGivenBack(t *testing.T) {
	ctx := context.Background()
	p := parkEnroll(t, Options{})
	svc, owner, ob, c, noReload := p.svc, p.owner, p.ob, p.c, p.noReload
	cv := svc.existing(1)
	parkedOn := func() int {
		cv.mu.RLock()
		defer cv.mu.RUnlock()
		n := 0
		for _, slot := range cv.parked {
			if slot.c == c {
				n++
			}
		}
		return n
	}
	if n := parkedOn(); n != 1 {
		t.Fatalf("after an enroll in doubt, %d slots of the connection are parked on the conversation, want 1", n)
	}
	if err := c.End(ctx, oplog.CauseConnectionLost); err != nil {
		t.Fatalf("End: %v", err)
	}
	if n := parkedOn(); n != 0 {
		t.Fatalf("after the connection ended, %d of its slots are parked on the conversation (holding it in memory), want 0", n)
	}
	if reserved, bound := reservedSlots(c); reserved != 0 || bound != 0 {
		t.Fatalf("after the connection ended, it has %d slots reserved and %d bindings, want 0 and 0", reserved, bound)
	}

	// The conversation loads: the enroll's binding, on a connection that
	// ended, is ended.
	noReload.Set(false)
	if _, err := owner.Tell(ctx, Tell{Conversation: 1, Participant: ob.Participant, Generation: ob.Generation, Token: token(4), Payload: []byte("x")}); err != nil {
		t.Fatalf("Tell once the conversation loads = %v", err)
	}
	st, _ := svc.Status(1)
	for i, p := range st.Participants {
		if i != int(ob.Participant) && p.Bound {
			t.Errorf("after the load, participant %d is bound, want the enroll's binding ended", i)
		}
	}
}
