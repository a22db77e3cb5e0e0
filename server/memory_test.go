package server_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
	"github.com/participantd/participantd/wire/wsframe"
)

// quiet is a raw connection that reads only when told to: it sets up its
// bindings, then stops reading, or reads a trickle.
type quiet struct {
	t  *testing.T
	nc net.Conn
	r  *wire.Reader
	w  *wire.Writer
	id uint64
}

// dialQuiet connects over the harness's transport with a kernel receive
// buffer of rcvbuf bytes (0: the kernel's) and says hello.
func (h *harness) dialQuiet(rcvbuf int) *quiet {
	h.t.Helper()
	var nc net.Conn
	if h.overWS() {
		ws, _ := h.dialWSTCP(nil, rcvbuf)
		nc = wsframe.New(ws)
	} else {
		var err error
		if nc, err = net.Dial("tcp", h.srv.Addr().String()); err != nil {
			h.t.Fatalf("dial: %v", err)
		}
		if tc, ok := nc.(*net.TCPConn); ok && rcvbuf > 0 {
			tc.SetReadBuffer(rcvbuf)
		}
	}
	h.t.Cleanup(func() { nc.Close() })
	q := &quiet{t: h.t, nc: nc, r: wire.NewReader(bufio.NewReaderSize(nc, 4096), 16<<20), w: wire.NewWriter(nc, min(1<<31, math.MaxInt)), id: 1}
	q.send(&wire.Hello{Versions: []uint64{1}})
	if _, ok := q.next().(*wire.Welcome); !ok {
		h.t.Fatal("hello not answered with welcome")
	}
	return q
}

func (q *quiet) send(m wire.Message) error { return q.w.WriteFrame(wire.Encode(m)) }

// next reads the next frame that is not a delivery.
func (q *quiet) next() wire.Message {
	q.t.Helper()
	q.nc.SetReadDeadline(time.Now().Add(waitFor))
	defer q.nc.SetReadDeadline(time.Time{})
	for {
		body, err := q.r.ReadFrame()
		if err != nil {
			q.t.Fatalf("read: %v", err)
		}
		m, err := wire.DecodeServerMessage(body)
		if err != nil {
			q.t.Fatalf("decode: %v", err)
		}
		if _, ok := m.(*wire.Delivery); !ok {
			return m
		}
	}
}

func (q *quiet) enroll(conv uint64) cred {
	q.t.Helper()
	q.id++
	if err := q.send(&wire.Enroll{ID: q.id, Conversation: conv, Token: token()}); err != nil {
		q.t.Fatalf("send enroll: %v", err)
	}
	e, ok := q.next().(*wire.Enrolled)
	if !ok {
		q.t.Fatal("enroll refused")
	}
	return cred{conv, e.Participant, e.Generation, e.Secret}
}

// metric returns the value of an unlabelled metric from /metrics.
func (h *harness) metric(name string) float64 {
	h.t.Helper()
	_, body := h.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				h.t.Fatalf("metric %s = %q: %v", name, v, err)
			}
			return f
		}
	}
	h.t.Fatalf("metric %s not in /metrics", name)
	return 0
}

// eventually polls cond every 20ms until it holds, failing the test after
// waitFor.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitFor)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// flood tells n payloads of size bytes from c as cr, pipelined in windows
// of 32, and checks every answer.
func flood(t *testing.T, c *client, cr cred, n, size int) {
	t.Helper()
	payload := bytes.Repeat([]byte{0x5a}, size)
	for sent := 0; sent < n; {
		w := min(32, n-sent)
		for range w {
			c.send(&wire.Tell{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: payload})
		}
		for range w {
			if a, ok := c.next().(*wire.Told); !ok {
				t.Fatalf("tell answered %#v", a)
			}
		}
		sent += w
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestASlowReaderThatTricklesIsCut has a recipient read its deliveries a
// trickle at a time while a sender tells at full speed: every frame must be
// written within WriteProgressTimeout of being queued, so the trickle is
// cut even though bytes keep moving. (The cut shows in the server's
// connection count: the trickle itself would see the close only after
// draining what the kernel still holds for it.)
func TestASlowReaderThatTricklesIsCut(t *testing.T) {
	h := start(t, server.Config{WriteProgressTimeout: time.Second, MaxOutboundBytes: 2 << 20})
	slow := h.dialQuiet(4096)
	slow.enroll(1)
	sender := h.dial()
	cr := sender.enroll(1)

	// The trickle: 2 KiB every 50ms, about 40 KiB/s.
	var read atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	defer func() {
		close(stop)
		slow.nc.Close()
		<-done
	}()
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		buf := make([]byte, 2048)
		for {
			select {
			case <-tick.C:
			case <-stop:
				return
			}
			n, err := slow.nc.Read(buf)
			read.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	payload := bytes.Repeat([]byte{0x33}, 32<<10)
	deadline := time.Now().Add(waitFor)
	for i := 0; ; i++ {
		if i%50 == 0 && h.openConnections() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d tells of 32 KiB the trickling reader is still connected", i)
		}
		a := sender.call(&wire.Tell{ID: sender.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: payload})
		if _, ok := a.(*wire.Told); !ok {
			t.Fatalf("tell answered %#v", a)
		}
	}
	if read.Load() == 0 {
		t.Error("the trickle read nothing before the cut: the test did not trickle")
	}
}

// TestAReaderThatNeverReadsKeepsTheHeapBounded tells 32 MiB to a recipient
// that never reads: the server holds the backlog budget and one outbound
// queue of it in memory, not the data, and cuts the recipient once its
// oldest frame waited WriteProgressTimeout.
func TestAReaderThatNeverReadsKeepsTheHeapBounded(t *testing.T) {
	const (
		budget = 4 << 20
		size   = 64 << 10
		total  = 32 << 20
	)
	h := start(t, server.Config{WriteProgressTimeout: 2 * time.Second, MaxBacklogBytes: budget, LogMemoryBytes: budget})
	deaf := h.dialQuiet(4096)
	deaf.enroll(1)
	sender := h.dial()
	cr := sender.enroll(1)
	before := heapAlloc()
	flood(t, sender, cr, total/size, size)
	after := heapAlloc()
	// Backlog (4 MiB) + one outbound queue (4 MiB) + the log-first
	// store's uncheckpointed batches (4 MiB) + slack; without the budgets
	// the heap held the 32 MiB several times over.
	const bound = 24 << 20
	if after > before && after-before > bound {
		t.Errorf("%d MiB told to a recipient that never reads grew the heap by %.1f MiB, want < %d MiB",
			total>>20, float64(after-before)/(1<<20), bound>>20)
	}
	if got := h.metric(server.MetricOutboundQueuedBytes); got > float64(server.DefaultMaxOutboundTotal) {
		t.Errorf("%s = %v, above the server's budget %d", server.MetricOutboundQueuedBytes, got, server.DefaultMaxOutboundTotal)
	}
	// The server's own account: the deaf conversation keeps its window of
	// payloads in memory, not the backlog budget; the rest is read back
	// from the oplog.
	if got, retained := h.metric(server.MetricBacklogBytes), h.metric(server.MetricBacklogTotalBytes); got > participant.DefaultBacklogWindowBytes || retained < total {
		t.Errorf("%s = %v of %v retained, want at most the conversation's window, %d, of all %d told",
			server.MetricBacklogBytes, got, retained, participant.DefaultBacklogWindowBytes, total)
	}
	eventually(t, "the recipient that never reads is cut", func() bool {
		return h.openConnections() == 1
	})
	if got := h.metric(server.MetricOutboundQueuedBytes); got != 0 {
		t.Errorf("%s = %v after the cut, want 0: a cut connection gives its bytes back", server.MetricOutboundQueuedBytes, got)
	}
}

// TestPendingRequestsPastTheByteBudgetStopTheReader has a connection that
// never reads pipeline large tells while its outbound queue is full of
// deliveries, so that no answer can leave: its pending requests must stop
// at MaxPendingBytes, with the server no longer reading its socket, and
// the heap must not grow with what it sends.
func TestPendingRequestsPastTheByteBudgetStopTheReader(t *testing.T) {
	const (
		pendingBudget = 2 << 20
		size          = 256 << 10
		n             = 512 // 128 MiB
	)
	// The requests commit (only their answers go unread), so their
	// payloads also pass through the log-first store's memory, up to
	// LogMemoryBytes (8 MiB by default) before its checkpoint catches up,
	// and again through bbolt's dirty pages while that checkpoint runs.
	// 2 MiB here keeps the store's share small, so that what this
	// measures is the pending budget: with the default, a loaded machine
	// measured up to 54 MiB once; with 2 MiB, 9-26 MiB under load.
	h := start(t, server.Config{WriteProgressTimeout: time.Minute, MaxPendingBytes: pendingBudget, MaxOutboundBytes: 2 << 20, LogMemoryBytes: 2 << 20})
	deaf := h.dialQuiet(4096)
	deaf.enroll(1)
	own := deaf.enroll(2)
	sender := h.dial()
	// Fill the deaf connection's kernel buffers and outbound queue with
	// deliveries.
	flood(t, sender, sender.enroll(1), 64, 128<<10)

	before := heapAlloc()
	sent := make(chan int, 1)
	go func() {
		payload := bytes.Repeat([]byte{0x77}, size)
		i := 0
		for ; i < n; i++ {
			if deaf.send(&wire.Tell{ID: uint64(1000 + i), Conversation: own.conv, Participant: own.p, Generation: own.gen, Token: token(), Payload: payload}) != nil {
				break
			}
		}
		sent <- i
	}()
	eventually(t, "the deaf connection's pending requests fill their budget", func() bool {
		return h.metric(server.MetricPendingRequestBytes) > pendingBudget-2*size
	})
	if got := h.metric(server.MetricPendingRequestBytes); got > pendingBudget {
		t.Errorf("%s = %v, above the connection's budget %d", server.MetricPendingRequestBytes, got, pendingBudget)
	}
	after := heapAlloc()
	// A pending request's payload exists a few times over while it commits
	// (decoded request, the decided row's copy, the log-first store's
	// frame and memtable until its checkpoint, bbolt's dirty pages during
	// one): measured growth is 4-22 MiB, at times 33 MiB when a store
	// checkpoint is in flight. The bound is a multiple of the 2 MiB budget
	// and well under what is sent (128 MiB), all of which the count cap
	// alone (1,024) let in.
	t.Logf("heap grew by %.1f MiB, pipelining up to %d MiB", (float64(after)-float64(before))/(1<<20), n*size>>20)
	if after > before && after-before > 48<<20 {
		t.Errorf("a connection pipelining %d MiB it never reads answers to grew the heap by %.1f MiB, want < 48 MiB",
			n*size>>20, float64(after-before)/(1<<20))
	}
	select {
	case i := <-sent:
		t.Errorf("the deaf connection wrote all %d requests (%d MiB): the server kept reading past its pending budget", i, i*size>>20)
	default:
	}
	deaf.nc.Close()
	<-sent
	eventually(t, "the deaf connection's pending bytes are given back", func() bool {
		return h.metric(server.MetricPendingRequestBytes) == 0
	})
}

// TestMetricsShowTheBacklog checks the backlog gauges: records and payload
// bytes awaiting an ack, in memory and in total, then zero once acked.
func TestMetricsShowTheBacklog(t *testing.T) {
	h := start(t, server.Config{MaxBacklogBytes: 64 << 10})
	rx := h.dial()
	rcr := rx.enroll(1)
	tx := h.dial()
	tcr := tx.enroll(1)
	var last uint64
	for range 10 {
		last = tx.tell(tcr, strings.Repeat("x", 10<<10)).Seq
	}
	if got := h.metric(server.MetricBacklogRecords); got != 11 { // joined + 10 records
		t.Errorf("%s = %v, want 11", server.MetricBacklogRecords, got)
	}
	if got := h.metric(server.MetricBacklogTotalBytes); got != 100<<10 {
		t.Errorf("%s = %v, want %d", server.MetricBacklogTotalBytes, got, 100<<10)
	}
	if got := h.metric(server.MetricBacklogBytes); got > 64<<10 || got == 0 {
		t.Errorf("%s = %v, want in (0, %d]", server.MetricBacklogBytes, got, 64<<10)
	}
	if got := h.metric(server.MetricBacklogEvicted); got < 36<<10 {
		t.Errorf("%s = %v, want >= %d", server.MetricBacklogEvicted, got, 36<<10)
	}
	a := rx.call(&wire.Ack{ID: rx.id(), Conversation: 1, Participant: rcr.p, Generation: rcr.gen, Through: last})
	if _, ok := a.(*wire.Acked); !ok {
		t.Fatalf("ack answered %#v", a)
	}
	for _, name := range []string{server.MetricBacklogRecords, server.MetricBacklogBytes, server.MetricBacklogTotalBytes} {
		if got := h.metric(name); got != 0 {
			t.Errorf("%s = %v after the ack, want 0", name, got)
		}
	}
}

// TestARecipientCatchingUpReceivesEvictedRecordsByteForByte lets a
// recipient's backlog go far past the backlog budget while it is away, then
// attaches it again: the pump reads the evicted payloads back from the
// oplog, and every record arrives in order, byte for byte.
func TestARecipientCatchingUpReceivesEvictedRecordsByteForByte(t *testing.T) {
	const n = 100
	h := start(t, server.Config{MaxBacklogBytes: 64 << 10})
	away := h.dial()
	rcr := away.enroll(1)
	away.send(&wire.Bye{})
	away.expectClosed()
	sender := h.dial()
	scr := sender.enroll(1)
	want := make(map[uint64][]byte)
	for i := range n {
		p := bytes.Repeat([]byte{byte(i)}, 4<<10+i*97)
		binary.BigEndian.PutUint32(p, uint32(i))
		want[sender.tell(scr, string(p)).Seq] = p
	}
	if got := h.metric(server.MetricBacklogBytes); got > 64<<10 {
		t.Fatalf("%s = %v, want <= %d: the budget did not hold", server.MetricBacklogBytes, got, 64<<10)
	}
	back := h.dial()
	back.attach(rcr)
	for got := 0; got < n; {
		d := back.delivery()
		if d.Kind != wire.KindRecord {
			continue
		}
		if w, ok := want[d.Seq]; !ok || !bytes.Equal(d.Payload, w) {
			t.Fatalf("record %d: payload of %d bytes differs from the %d told", d.Seq, len(d.Payload), len(w))
		}
		delete(want, d.Seq)
		got++
	}
	if len(want) != 0 {
		t.Errorf("%d records not delivered", len(want))
	}
}

// TestByteBudgetsHoldAtLeastOneFrame raises max-frame past the byte budgets
// given: the server starts, and a frame of the largest size goes both ways.
func TestByteBudgetsHoldAtLeastOneFrame(t *testing.T) {
	h := start(t, server.Config{MaxFrame: 4 << 20, MaxRecordBytes: 3 << 20, MaxPendingBytes: 1 << 20, MaxOutboundBytes: 1 << 20})
	rx := h.dial()
	rx.enroll(1)
	tx := h.dial()
	cr := tx.enroll(1)
	payload := strings.Repeat("m", 3<<20)
	tx.tell(cr, payload)
	if d := rx.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindRecord }); len(d.Payload) != len(payload) {
		t.Errorf("delivered a payload of %d bytes, want %d", len(d.Payload), len(payload))
	}
}
