package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// holdFrames opens n connections from ip, each of which announces a frame
// of size bytes and sends 16 bytes of its body, never the rest.
func holdFrames(h *harness, ip string, n int, size uint32) []*client {
	h.t.Helper()
	out := make([]*client, 0, n)
	for range n {
		c := h.dialFrom(ip)
		c.sendFrameStart(append(header(size), make([]byte, 16)...))
		out = append(out, c)
	}
	return out
}

// strangerIsServed has a client from ip ping and enroll, and fails unless
// both are answered (within the harness's bound, far below the frame read
// timeout the holders are under).
func strangerIsServed(h *harness, ip string, conv uint64) {
	h.t.Helper()
	s := h.dialFrom(ip)
	s.ping()
	s.enroll(conv)
}

// Issue 27, finding 1: one address holds 80 frames it never finishes
// (each announcing 1 MiB and sending 16 bytes of it, 1.3 KB in all), more
// than the server-wide pending budget. A stranger from another address is
// answered at once, while the holders still hold: one principal holds at
// most its share of the budget. Before shares, the holders took the whole
// budget and the stranger's ping waited out the frame read timeout (here
// an hour; 30 s by default).
func TestPendingShare_OneAddressCannotStallAStranger(t *testing.T) {
	h := start(t, server.Config{LimitLoopback: true, FrameReadTimeout: time.Hour})
	holders := holdFrames(h, "127.0.0.1", 80, 1<<20)
	eventually(t, "the holders hold six frames' worth of the pending budget", func() bool {
		return h.metric(server.MetricPendingRequestBytes) >= 6<<20
	})
	strangerIsServed(h, "127.0.0.2", 1)
	if got := h.metric(server.MetricPendingRequestBytes); got < 6<<20 {
		t.Errorf("pending bytes = %v after the stranger was served, want the holders still holding (>= %d)", got, 6<<20)
	}
	for i, c := range holders {
		select {
		case <-c.closed:
			t.Fatalf("holder %d was closed (%v): nobody needed its room", i, c.rerr)
		default:
		}
	}
}

// Issue 27, finding 1, from many addresses: fourteen addresses between
// them announce more than the whole pending budget (each within its
// share). A stranger from a fifteenth is answered at once: above 80 % of
// the budget only holders that hold little may take, and when it is full
// the holders that hold the most have their unfinished frames cut
// (rejected{overloaded}) rather than the stranger waiting.
func TestPendingShare_ManyAddressesCannotStallAStranger(t *testing.T) {
	const frame = 32 << 10
	h := start(t, server.Config{LimitLoopback: true, FrameReadTimeout: time.Hour,
		MaxFrame: 64 << 10, MaxRecordBytes: 1024, MaxPendingBytes: 64 << 10, MaxPendingBytesTotal: 1 << 20})
	var holders []*client
	for i := range 14 {
		holders = append(holders, holdFrames(h, fmt.Sprintf("127.0.0.%d", 10+i), 4, frame)...)
	}
	eventually(t, "the holders hold more than 80 % of the pending budget", func() bool {
		return h.metric(server.MetricPendingRequestBytes) > 0.8*(1<<20)
	})
	strangerIsServed(h, "127.0.0.99", 1)
	strangerIsServed(h, "127.0.0.98", 2)
	cut := 0
	defer func() { t.Logf("%d holders cut", cut) }()
	// Each cut holder was told why.
	for _, c := range holders {
		select {
		case <-c.closed:
			cut++
			var m wire.Message
			select {
			case m = <-c.in:
			default:
			}
			if r, ok := m.(*wire.Rejected); !ok || r.Reason != wire.ReasonOverloaded {
				t.Errorf("a cut holder got %#v (%v), want rejected{overloaded}", m, c.rerr)
			}
		default:
		}
	}
}

// Issue 27: above 80 % of --max-connections, an address that holds a
// twentieth of them is refused, while an address holding fewer is still
// admitted: the largest holders are refused first. Before, the first
// address took every connection its per-address limit allowed.
func TestConnectionShare_LargestAddressRefusedAbove80Percent(t *testing.T) {
	h := start(t, server.Config{LimitLoopback: true, MaxConnections: 40})
	for range 32 {
		h.dialFrom("127.0.0.1")
	}
	c := h.dialRawFrom("127.0.0.1")
	c.expectRejected(wire.ReasonOverloaded)
	h.dialFrom("127.0.0.2")
	h.dialFrom("127.0.0.2")
	h.dialRawFrom("127.0.0.2").expectRejected(wire.ReasonOverloaded)
	h.dialFrom("127.0.0.3").ping()
}
