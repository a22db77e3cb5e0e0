package server_test

import (
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestBadInput_OthersKeepServing sends bad input on connections whose
// participant is bound in a conversation a bystander watches: each bad
// connection is refused alone, its binding ends as died with the cause the
// protocol names, and the bystander keeps being served throughout.
func TestBadInput_OthersKeepServing(t *testing.T) {
	h := start(t, server.Config{})
	const conv = 9
	by := h.dial()
	me := by.enroll(conv)
	for i, tc := range []struct {
		name   string
		send   func(c *client)
		reason wire.Reason // "" when the connection just ends
		cause  wire.Cause
	}{
		{"garbage bytes", func(c *client) { c.sendBytes([]byte{0, 0, 0, 3, 0xde, 0xad, 0xbe}) }, wire.ReasonMalformed, wire.CauseProtocolError},
		{"not a map", func(c *client) { c.sendFrame([]byte{0x93, 1, 2, 3}) }, wire.ReasonMalformed, wire.CauseProtocolError},
		{"no id", func(c *client) { c.sendMap(map[string]any{"t": "ping"}) }, wire.ReasonMalformed, wire.CauseProtocolError},
		{"2 GiB header", func(c *client) { c.sendBytes(header(1 << 31)) }, wire.ReasonFrameTooLarge, wire.CauseProtocolError},
		{"truncated frame then close", func(c *client) {
			c.sendFrameStart(append(header(100), 0x81, 0xa1))
			c.closeWrite()
		}, "", wire.CauseConnectionLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.dial()
			c.t = t
			cr := c.enroll(conv)
			by.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindJoined && d.Participant == cr.p })
			tc.send(c)
			if tc.reason != "" {
				c.expectRejected(tc.reason)
			} else {
				c.expectClosed()
			}
			d := by.deliveryWhere(func(d *wire.Delivery) bool { return d.Participant == cr.p })
			if d.Kind != wire.KindDied || d.Cause == nil || *d.Cause != tc.cause {
				t.Fatalf("bystander got %+v, want died/%s of participant %d", d, tc.cause, cr.p)
			}
			by.ping()
			by.tell(me, "still here "+string(rune('a'+i)))
		})
	}
}

func TestBadInput_BadRequestKeepsConnection(t *testing.T) {
	h := start(t, server.Config{})
	c := h.dial()
	cr := c.enroll(3)
	for _, tc := range []struct {
		name string
		body map[string]any
	}{
		{"15-byte token", map[string]any{"t": "tell", "id": 7, "conversation": 3, "participant": cr.p, "generation": cr.gen, "token": make([]byte, 15), "payload": []byte("x")}},
		{"zero token", map[string]any{"t": "enroll", "id": 7, "conversation": 3, "token": make([]byte, 16)}},
		{"unknown t", map[string]any{"t": "shout", "id": 7}},
		{"missing field", map[string]any{"t": "ack", "id": 7, "conversation": 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			c.sendMap(tc.body)
			m := c.next()
			if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeBadRequest || e.ID != 7 {
				t.Fatalf("got %#v, want error bad_request id 7", m)
			}
			c.ping()
			c.tell(cr, "after "+tc.name)
		})
	}
}
