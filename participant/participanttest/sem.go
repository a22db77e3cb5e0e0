package participanttest

import (
	"bytes"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
)

// semKey is the node key of the model's services.
var semKey = bytes.Repeat([]byte{0x5e}, participant.NodeKeySize)

// semClock is a settable clock for Options.Now, in whole milliseconds as
// the rows record time.
type semClock struct{ ms atomic.Int64 }

func newSemClock() *semClock {
	c := &semClock{}
	c.ms.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli())
	return c
}

func (c *semClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *semClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func (c *semClock) Set(ms int64)            { c.ms.Store(ms) }

// semConn is a connection that counts its wakes.
type semConn struct {
	*participant.Conn
	wakes *atomic.Int64
}

func connect(svc *participant.Service) semConn {
	n := new(atomic.Int64)
	return semConn{Conn: svc.Connect(func() { n.Add(1) }), wakes: n}
}

// semWant is an expected error answer.
type semWant struct {
	code        participant.Code
	gen         participant.Generation // stale_authority with the extra, receipt_expired
	hasGen      bool
	cursor      participant.Seq
	limit       uint64
	participant participant.ParticipantID
	reason      string
}

// semDrain returns every delivery c is offered in conv after start.
func semDrain(c semConn, conv participant.ConversationID, start participant.Offered) []participant.Delivery {
	c.SetOfferedForTest(conv, start)
	var out []participant.Delivery
	for len(out) < 10000 {
		d, ok := c.Next(conv)
		if !ok {
			break
		}
		out = append(out, d)
	}
	return out
}

// semShow renders deliveries compactly: "seq kind subject[/cause][=payload]".
func semShow(ds []participant.Delivery) string {
	parts := make([]string, 0, len(ds))
	for _, d := range ds {
		s := fmt.Sprintf("%d %v %v", d.Seq, d.Kind, d.Participant)
		if d.Cause != oplog.CauseNone {
			s += "/" + d.Cause.String()
		}
		if d.Kind == outbox.KindRecord {
			s += "=" + string(d.Payload)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
