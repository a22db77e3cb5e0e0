package participant

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// testKey is the node key of every test service.
var testKey = make([]byte, NodeKeySize)

func openService(t testing.TB, st store.DurableStore) *Service {
	t.Helper()
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc
}

// wakeCounter counts a connection's wakes.
type wakeCounter struct{ n atomic.Int64 }

func (w *wakeCounter) wake()        { w.n.Add(1) }
func (w *wakeCounter) count() int64 { return w.n.Load() }

func token(b byte) Token {
	var t Token
	for i := range t {
		t[i] = b
	}
	return t
}

// rawOutbox returns the stored outbox payloads of conversation c.
// tb is what the helpers need of a test: testing.TB and faultstore.TB
// both satisfy it.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func rawOutbox(t tb, st store.DurableStore, c ConversationID) [][]byte {
	t.Helper()
	entries, err := st.ReadFrom(outbox.Stream(c), 0, 0)
	if err != nil {
		t.Fatalf("ReadFrom(outbox): %v", err)
	}
	out := make([][]byte, len(entries))
	for i, e := range entries {
		out[i] = e.Payload
	}
	return out
}

func oplogLen(t testing.TB, st store.DurableStore, c ConversationID) uint64 {
	t.Helper()
	n, err := st.Len(oplog.Stream(c))
	if err != nil {
		t.Fatalf("Len(oplog): %v", err)
	}
	return n
}

// drainNext offers every record to c's binding in conv from its durable
// cursor, as a pump of a new binding would, and returns the deliveries in
// order.
func drainNext(c *Conn, conv ConversationID) []Delivery {
	c.SetOfferedForTest(conv, Offered{})
	var out []Delivery
	for {
		d, ok := c.Next(conv)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// decodeOutbox decodes stored outbox rows, failing the test on error.
func decodeOutbox(t tb, payloads [][]byte) []outbox.Row {
	t.Helper()
	rows, err := outbox.Validate(payloads)
	if err != nil {
		t.Fatalf("Validate(outbox): %v", err)
	}
	return rows
}

func runtimeGosched() { runtime.Gosched() }

// must fails the test on a setup error.
func must(t tb, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// mustEnroll enrolls in conv with token tok, failing the test on error.
func mustEnroll(t tb, c *Conn, conv ConversationID, tok byte) Bound {
	t.Helper()
	b, err := c.Enroll(context.Background(), Enroll{Conversation: conv, Token: token(tok)})
	must(t, err)
	return b
}

// waitReloads waits for the background reloads started so far, to observe
// a settled service. An operation is answered before its batch gives up
// the conversation's turn and starts the reload a failed commit needs, so
// it first takes and gives back every conversation's turn: a batch counts
// its reload before it gives the turn up.
func (s *Service) waitReloads() {
	for _, cv := range s.conversations() {
		if cv.acquire(context.Background()) == nil {
			<-cv.turn
		}
	}
	s.bg.Wait()
}
