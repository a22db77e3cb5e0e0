package server_test

import (
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// expectCreationRefused enrolls c into the new conversation conv and
// expects the creation rate's rate_limited, with the burst as limit.
func expectCreationRefused(t *testing.T, c *client, conv uint64, burst uint64) {
	t.Helper()
	m := c.call(&wire.Enroll{ID: c.id(), Conversation: conv, Token: token()})
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeRateLimited || e.Limit == nil || *e.Limit != burst {
		t.Fatalf("enroll creating conversation %d answered %#v, want rate_limited limit %d", conv, m, burst)
	}
}

// Issue 18 item 6: one client created ~9,100 conversations a second and
// filled --max-conversations in minutes. An address creates them at
// --conversation-rate from a bucket of --conversation-burst, whatever
// connections it uses; enrolls into existing conversations and replays are
// not counted.
func TestCaps_ConversationCreationRate(t *testing.T) {
	t.Run("per address", func(t *testing.T) {
		h := start(t, server.Config{LimitLoopback: true, ConnectionRate: 1000, ConversationRate: 0.001, ConversationBurst: 2})
		a, b := h.dial(), h.dial()
		first := &wire.Enroll{ID: a.id(), Conversation: 1, Token: token()}
		if m := a.call(first); !isEnrolled(m) {
			t.Fatalf("first enroll answered %#v", m)
		}
		a.enroll(2)
		expectCreationRefused(t, a, 3, 2)
		expectCreationRefused(t, b, 4, 2)
		b.enroll(1) // an existing conversation
		first.ID = a.id()
		if m := a.call(first); !isEnrolled(m) || m.(*wire.Enrolled).Replay == nil {
			t.Errorf("replayed enroll answered %#v, want its replay", m)
		}
	})
	t.Run("loopback exempt: a bucket per connection", func(t *testing.T) {
		h := start(t, server.Config{ConversationRate: 0.001, ConversationBurst: 1})
		a, b := h.dial(), h.dial()
		a.enroll(1)
		expectCreationRefused(t, a, 2, 1)
		b.enroll(3)
	})
}

func isEnrolled(m wire.Message) bool {
	_, ok := m.(*wire.Enrolled)
	return ok
}

// Issue 18 item 6: one conversation filled with --max-participants
// enrolls, and stayed full after they left. Through the listener: a
// participant who leaves frees its slot, and its leave still replays.
func TestCaps_LeavingFreesASlotThroughTheListener(t *testing.T) {
	h := start(t, server.Config{MaxParticipants: 2})
	a, b, c := h.dial(), h.dial(), h.dial()
	ca := a.enroll(7)
	b.enroll(7)
	m := c.call(&wire.Enroll{ID: c.id(), Conversation: 7, Token: token()})
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeCapacityExceeded || e.Limit == nil || *e.Limit != 2 {
		t.Fatalf("third enroll answered %#v, want capacity_exceeded limit 2", m)
	}
	leave := &wire.Leave{ID: a.id(), Conversation: 7, Participant: ca.p, Generation: ca.gen, Secret: ca.secret, Token: token()}
	if m := a.call(leave); !isLeft(m) {
		t.Fatalf("leave answered %#v", m)
	}
	if cc := c.enroll(7); cc.p != 2 {
		t.Errorf("enroll after a leave got %v, want the new id 2", cc.p)
	}
	leave.ID = a.id()
	if m := a.call(leave); !isLeft(m) || m.(*wire.Left).Replay == nil {
		t.Errorf("replayed leave answered %#v, want its replay", m)
	}
}

func isLeft(m wire.Message) bool {
	_, ok := m.(*wire.Left)
	return ok
}
