package participant

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
)

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestRefusedEnrollsDoNotGrowMemory refuses many enrolls into conversations
// that do not exist (capacity_exceeded: the connection is at its cap) and
// checks that the heap does not grow with them: a refused enroll leaves no
// conversation entry behind.
//
// It runs over the in-memory store and over the log-first store, the
// default engine, whose per-stream state a refusal's existence check
// (Ownership.Exists) once left behind for every conversation named.
func TestRefusedEnrollsDoNotGrowMemory(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testRefusedEnrollsDoNotGrowMemory(t, store.NewMemory()) })
	t.Run("logfirst", func(t *testing.T) {
		st, err := logfirst.Open(t.TempDir(), logfirst.Options{})
		must(t, err)
		t.Cleanup(func() { st.Close() })
		testRefusedEnrollsDoNotGrowMemory(t, st)
	})
}

func testRefusedEnrollsDoNotGrowMemory(t *testing.T, st store.DurableStore) {
	const n = 20000
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, MaxConversationsPerConn: 1})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	c := svc.Connect(nil)
	mustEnroll(t, c, 1, 1)
	ctx := context.Background()
	refuseOne := func(conv ConversationID) {
		var tok Token
		rand.Read(tok[:])
		_, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: tok})
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded {
			t.Fatalf("Enroll(conversation %v) on a full connection = %v, want capacity_exceeded", conv, err)
		}
	}
	// Warm up, so that lazily built structures are not counted.
	for i := range 100 {
		refuseOne(ConversationID(1_000_000 + i))
	}
	before := heapInUse()
	for i := range n {
		refuseOne(ConversationID(2 + i))
	}
	after := heapInUse()
	// Each leaked entry costs about 1 KiB, so a leak shows as ~20 MiB; the
	// bound leaves room for noise.
	const bound = 2 << 20
	if after > before && after-before > bound {
		t.Errorf("%d refused enrolls grew the heap by %d bytes, want < %d", n, after-before, bound)
	}
	svc.mu.Lock()
	entries := len(svc.convs)
	svc.mu.Unlock()
	if entries != 1 {
		t.Errorf("after %d refused enrolls the service holds %d conversation entries, want 1", n, entries)
	}
}

// TestPipelinedEnrollsRespectTheConnectionCap starts many enrolls into
// distinct conversations from one connection before any is answered, and
// waits for them concurrently, so that their conversations decide in
// parallel: no more than MaxConversationsPerConn may commit.
func TestPipelinedEnrollsRespectTheConnectionCap(t *testing.T) {
	const limit, n = 8, 200
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxConversationsPerConn: limit})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	c := svc.Connect(nil)
	ctx := context.Background()
	calls := make([]*Call[Bound], n)
	for i := range calls {
		var tok Token
		rand.Read(tok[:])
		calls[i] = c.StartEnroll(ctx, Enroll{Conversation: ConversationID(i + 1), Token: tok})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { _, errs[i] = call.Wait() })
	}
	wg.Wait()
	committed := 0
	for i, err := range errs {
		var pe *Error
		switch {
		case err == nil:
			committed++
		case errors.As(err, &pe) && pe.Code == CodeCapacityExceeded:
			if pe.Limit != limit {
				t.Errorf("enroll %d refused with limit %d, want %d", i, pe.Limit, limit)
			}
		default:
			t.Errorf("enroll %d = %v, want ok or capacity_exceeded", i, err)
		}
	}
	if committed != limit {
		t.Errorf("%d pipelined enrolls committed past a cap of %d, want exactly %d", committed, limit, limit)
	}
	if got := len(c.Bindings()); got != limit {
		t.Errorf("the connection holds %d bindings, want %d", got, limit)
	}
	// The refused enrolls released their reservations: after a detach, one
	// more enroll fits.
	b := c.Bindings()[0]
	if _, err := c.Detach(ctx, Detach{Conversation: b.Conversation, Participant: b.Participant, Generation: 1, Token: token(9)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: n + 1, Token: token(10)}); err != nil {
		t.Errorf("Enroll after a detach freed a slot = %v, want ok", err)
	}
}

// backlogEnv is a service on a bbolt store (so that the store's data is not
// on the heap) with a sender and a recipient that never acks, both bound in
// conversation 1.
type backlogEnv struct {
	svc        *Service
	sender     *Conn
	recipient  *Conn
	tx, rx     Bound
	ctx        context.Context
	nextTokenN uint64
}

func newBacklogEnv(t *testing.T, budget int64) *backlogEnv {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{})
	must(t, err)
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, MaxBacklogBytes: budget})
	must(t, err)
	t.Cleanup(func() {
		svc.Close()
		st.Close()
	})
	e := &backlogEnv{svc: svc, sender: svc.Connect(nil), recipient: svc.Connect(nil), ctx: context.Background()}
	e.rx = mustEnroll(t, e.recipient, 1, 1)
	e.tx = mustEnroll(t, e.sender, 1, 2)
	return e
}

func (e *backlogEnv) tell(t *testing.T, payload []byte) Seq {
	t.Helper()
	e.nextTokenN++
	var tok Token
	binary.BigEndian.PutUint64(tok[:], e.nextTokenN)
	tok[15] = 0xee
	told, err := e.sender.Tell(e.ctx, Tell{Conversation: 1, Participant: e.tx.Participant, Generation: e.tx.Generation, Token: tok, Payload: payload})
	must(t, err)
	return told.Seq
}

// payloadOf returns the deterministic payload of the i-th tell.
func payloadOf(i, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint64(b, uint64(i))
	for j := 8; j < size; j++ {
		b[j] = byte(i*31 + j)
	}
	return b
}

// TestBacklogOfANeverAckingRecipientIsBoundedInMemory tells 32 MiB to a
// recipient that never acknowledges with a 4 MiB backlog budget: the heap
// must stay near the budget, not grow with the data.
func TestBacklogOfANeverAckingRecipientIsBoundedInMemory(t *testing.T) {
	const (
		budget = 4 << 20
		size   = 64 << 10
		total  = 32 << 20
	)
	e := newBacklogEnv(t, budget)
	before := heapInUse()
	for i := range total / size {
		e.tell(t, payloadOf(i, size))
	}
	after := heapInUse()
	// Without the budget the heap holds all 32 MiB; with it, the budget,
	// one batch past it, and the store's buffers.
	const bound = 16 << 20
	if after > before && after-before > bound {
		t.Errorf("%d MiB told to a recipient that never acks grew the heap by %.1f MiB, want < %d MiB",
			total>>20, float64(after-before)/(1<<20), bound>>20)
	}
	bl := e.svc.Backlog()
	if bl.MemoryBytes > budget {
		t.Errorf("Backlog().MemoryBytes = %d, want <= %d", bl.MemoryBytes, budget)
	}
	if got, want := bl.MemoryBytes+bl.EvictedBytes, int64(total); got != want {
		t.Errorf("Backlog() memory+evicted = %d bytes, want %d", got, want)
	}
}

// TestSlowRecipientReceivesEvictedRecordsByteForByte lets a recipient fall
// far past the backlog budget, then catch up: every record arrives, in
// order, with its payload byte for byte, and acknowledging frees the
// backlog.
func TestSlowRecipientReceivesEvictedRecordsByteForByte(t *testing.T) {
	const (
		budget = 256 << 10
		n      = 200
	)
	e := newBacklogEnv(t, budget)
	want := make(map[Seq][]byte)
	for i := range n {
		p := payloadOf(i, 8+(i*977)%(16<<10))
		want[e.tell(t, p)] = p
	}
	if bl := e.svc.Backlog(); bl.EvictedBytes == 0 {
		t.Fatalf("Backlog() = %+v: nothing was evicted, the test does not test eviction", bl)
	}
	ds := drainNext(e.recipient, 1)
	var got int
	var last Seq
	for _, d := range ds {
		if d.Kind != outbox.KindRecord {
			continue
		}
		got++
		if diff := cmp.Diff(want[d.Seq], d.Payload); diff != "" {
			t.Errorf("record %v payload differs (-want +got):\n%s", d.Seq, diff)
		}
		last = d.Seq
	}
	if got != n {
		t.Fatalf("the slow recipient received %d records, want %d", got, n)
	}
	if _, err := e.recipient.Ack(e.ctx, Ack{Conversation: 1, Participant: e.rx.Participant, Generation: e.rx.Generation, Through: last}); err != nil {
		t.Fatalf("Ack(through %v): %v", last, err)
	}
	if bl := e.svc.Backlog(); bl.Records != 0 || bl.MemoryBytes != 0 || bl.EvictedBytes != 0 {
		t.Errorf("Backlog() after the recipient acknowledged everything = %+v, want zero", bl)
	}
}

// TestEvictionTakesFromTheLargestBacklogFirst fills the backlog budget with
// a conversation whose recipient never acks, then commits in a second
// conversation whose recipient keeps up: the first conversation's payloads
// are evicted, and the second one's recent payloads stay in memory, so its
// deliveries do not read the oplog.
func TestEvictionTakesFromTheLargestBacklogFirst(t *testing.T) {
	const budget = 1 << 20
	e := newBacklogEnv(t, budget)
	for i := range 64 { // 2 MiB into conversation 1
		e.tell(t, payloadOf(i, 32<<10))
	}
	// Conversation 2: a sender and a recipient that reads, on their own
	// connections.
	tx2, rx2 := e.svc.Connect(nil), e.svc.Connect(nil)
	r := mustEnroll(t, rx2, 2, 3)
	s := mustEnroll(t, tx2, 2, 4)
	for i := range 16 {
		var tok Token
		binary.BigEndian.PutUint64(tok[:], uint64(i))
		tok[15] = 0x22
		told, err := tx2.Tell(e.ctx, Tell{Conversation: 2, Participant: s.Participant, Generation: s.Generation, Token: tok, Payload: payloadOf(i, 8<<10)})
		must(t, err)
		st := e.svc.existing(2).loaded()
		if rec, ok := st.Record(told.Seq); !ok || rec.Evicted {
			t.Fatalf("tell %d of the conversation that keeps up was evicted while conversation 1 holds %d bytes",
				i, e.svc.existing(1).loaded().PayloadBytes)
		}
		ds := drainNext(rx2, 2)
		if _, err := rx2.Ack(e.ctx, Ack{Conversation: 2, Participant: r.Participant, Generation: r.Generation, Through: ds[len(ds)-1].Seq}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if bl := e.svc.Backlog(); bl.MemoryBytes > budget {
		t.Errorf("Backlog().MemoryBytes = %d, want <= %d", bl.MemoryBytes, budget)
	}
}

// TestEvictionUnderConcurrentConversations runs several conversations at
// once with a backlog budget far below what they hold, so that their
// commits evict each other's payloads while recipients read and ack
// concurrently: every record must arrive byte for byte, and the account
// must come back to zero once everything is acknowledged. Run it with
// -race.
func TestEvictionUnderConcurrentConversations(t *testing.T) {
	const (
		convs  = 6
		tells  = 150
		budget = 64 << 10
	)
	e := newBacklogEnv(t, budget)
	var wg sync.WaitGroup
	errs := make(chan error, 2*convs)
	for k := range convs {
		conv := ConversationID(100 + k)
		rxConn, txConn := e.svc.Connect(nil), e.svc.Connect(nil)
		rx := mustEnroll(t, rxConn, conv, byte(2*k+10))
		tx := mustEnroll(t, txConn, conv, byte(2*k+11))
		sent := make(chan Told, tells)
		// Records 1 and 2 are the joins; tell i is record i+3.
		payload := func(i int) []byte { return payloadOf(int(conv)*1000+i, 8+(i*1931)%(6<<10)) }
		want := func(q Seq) []byte { return payload(int(q) - 3) }
		wg.Go(func() {
			defer close(sent)
			for i := range tells {
				p := payload(i)
				var tok Token
				binary.BigEndian.PutUint64(tok[:], uint64(conv)<<32|uint64(i))
				told, err := txConn.Tell(e.ctx, Tell{Conversation: conv, Participant: tx.Participant, Generation: tx.Generation, Token: tok, Payload: p})
				if err != nil {
					errs <- err
					return
				}
				sent <- told
			}
		})
		wg.Go(func() {
			var offered Offered
			got := 0
			for told := range sent {
				for {
					d, ok := rxConn.Next(conv)
					if !ok {
						break
					}
					offered = Offered{Epoch: d.Epoch, Through: d.Seq}
					if d.Kind != outbox.KindRecord {
						continue
					}
					if !bytes.Equal(d.Payload, want(d.Seq)) {
						errs <- fmt.Errorf("conversation %v record %v: payload differs", conv, d.Seq)
						return
					}
					got++
				}
				if told.Seq%7 == 0 && offered.Through > 0 {
					if _, err := rxConn.Ack(e.ctx, Ack{Conversation: conv, Participant: rx.Participant, Generation: rx.Generation, Through: offered.Through}); err != nil {
						errs <- err
						return
					}
				}
			}
			for {
				d, ok := rxConn.Next(conv)
				if !ok {
					break
				}
				offered = Offered{Epoch: d.Epoch, Through: d.Seq}
				if d.Kind == outbox.KindRecord {
					if !bytes.Equal(d.Payload, want(d.Seq)) {
						errs <- fmt.Errorf("conversation %v record %v: payload differs", conv, d.Seq)
						return
					}
					got++
				}
			}
			if got != tells {
				errs <- fmt.Errorf("conversation %v: %d records received, want %d", conv, got, tells)
				return
			}
			if _, err := rxConn.Ack(e.ctx, Ack{Conversation: conv, Participant: rx.Participant, Generation: rx.Generation, Through: offered.Through}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if bl := e.svc.Backlog(); bl.EvictedTotal == 0 {
		t.Errorf("Backlog() = %+v: nothing was evicted, the test does not test eviction", bl)
	}
	// Conversation 1 of the env keeps its joined record for p0, unacked.
	if bl := e.svc.Backlog(); bl.MemoryBytes != 0 || bl.EvictedBytes != 0 || bl.Records != 1 {
		t.Errorf("Backlog() after every record was acknowledged = %+v, want 1 record and no bytes", bl)
	}
}

// TestCheckpointDerivation_ReadsRowsThroughOneBuffer checkpoints a
// conversation of 64 KiB tells on the log-first store, the default engine,
// and counts the bytes the pass allocates. A derivation decodes each row
// and keeps none of its bytes, so it reads both streams through one
// buffer each (store.ReadPageBuffered): before, every row read was a copy
// of its own, and a pass allocated the size of every row it replayed.
// Bytes are counted, not allocations, so that the race detector's pool
// behaviour does not matter.
func TestCheckpointDerivation_ReadsRowsThroughOneBuffer(t *testing.T) {
	const n, size = 256, 64 << 10
	ctx := context.Background()
	st, err := logfirst.Open(t.TempDir(), logfirst.Options{})
	must(t, err)
	t.Cleanup(func() { st.Close() })
	svc, err := Open(ctx, st, Options{NodeKey: testKey, CheckpointInterval: time.Hour, CheckpointRows: 1,
		MaxBacklogRecords: 1 << 20, MaxBacklogBytes: 1 << 30})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	payload := make([]byte, size)
	for i := range n {
		binary.BigEndian.PutUint64(payload, uint64(i))
		if _, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation,
			Token: benchToken(7, uint64(i)), Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	w, err := svc.CheckpointPass(ctx)
	runtime.ReadMemStats(&after)
	if err != nil || w != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1", w, err)
	}
	// The replayed rows are n*size bytes; a copy of each was that much.
	if alloc, bound := after.TotalAlloc-before.TotalAlloc, uint64(n*size/4); alloc > bound {
		t.Errorf("a checkpoint pass over %d rows of %d bytes allocated %d bytes, want at most %d", n, size, alloc, bound)
	}
}

// TestEncodedRows_LeaveTheRoomAStoreSealsIn checks that an oplog row of a
// tell, its fields at their widest, is encoded with store.SealRoom bytes
// of spare capacity: the log-first store keeps an owned row as it is and
// seals it with its checksum in place at the checkpoint, which copies a
// row without that room.
func TestEncodedRows_LeaveTheRoomAStoreSealsIn(t *testing.T) {
	for _, size := range []int{0, 1, 200, 64 << 10, 512 << 10} {
		row := oplog.Row{Kind: oplog.KindTell, Participant: math.MaxUint64, Generation: math.MaxUint64,
			Conn: oplog.ConnID{Server: math.MaxUint64, Ordinal: math.MaxUint64}, Through: math.MaxUint64, Seq: math.MaxUint64, Cursor: math.MaxUint64,
			Cause: math.MaxUint8, At: math.MinInt64, Payload: make([]byte, size)}
		for i := range row.Token {
			row.Token[i] = 0xff
		}
		for i := range row.Nonce {
			row.Nonce[i] = 0xff
		}
		enc, err := oplog.Encode(&row)
		must(t, err)
		if room := cap(enc) - len(enc); room < store.SealRoom {
			t.Errorf("a tell of %d bytes is encoded in %d bytes with %d spare, want at least %d", size, len(enc), room, store.SealRoom)
		}
	}
}

// pageSizes is a log-first store that records the pages read through
// ReadPageBuffered: how many, and the payload bytes of the largest of more
// than one entry (a page of one entry is the row, whatever its size).
type pageSizes struct {
	*logfirst.Store
	mu sync.Mutex
	// +checklocks:mu
	pages int
	// +checklocks:mu
	largest int
}

func (s *pageSizes) ReadPageBuffered(stream string, offset uint64, limit int, maxBytes int, buf *store.PageBuffer) ([]store.Entry, error) {
	page, err := s.Store.ReadPageBuffered(stream, offset, limit, maxBytes, buf)
	n := 0
	for _, e := range page {
		n += len(e.Payload)
	}
	s.mu.Lock()
	s.pages++
	if len(page) > 1 {
		s.largest = max(s.largest, n)
	}
	s.mu.Unlock()
	return page, err
}

// TestCheckpointDerivation_HoldsPagesOfAtMostDerivePageBytes checkpoints
// conversations of 64 KiB and of 1 KiB tells, and checks that the pass
// reads both streams in pages of at most derivePageBytes (or one row):
// what a derivation holds of the rows it replays is bounded by that,
// whatever Options.ReadPageBytes and the rows replayed. Before, it read
// pages of ReadPageBytes, a megabyte of oplog rows held through every
// derivation of a stream of large tells.
func TestCheckpointDerivation_HoldsPagesOfAtMostDerivePageBytes(t *testing.T) {
	for _, tc := range []struct {
		n, size int
	}{{64, 64 << 10}, {1024, 1 << 10}} {
		t.Run(fmt.Sprintf("%dx%d", tc.n, tc.size), func(t *testing.T) {
			ctx := context.Background()
			lf, err := logfirst.Open(t.TempDir(), logfirst.Options{})
			must(t, err)
			st := &pageSizes{Store: lf}
			t.Cleanup(func() { st.Close() })
			svc, err := Open(ctx, st, Options{NodeKey: testKey, CheckpointInterval: time.Hour, CheckpointRows: 1,
				MaxBacklogRecords: 1 << 20, MaxBacklogBytes: 1 << 30, ReadPageBytes: 1 << 20})
			must(t, err)
			t.Cleanup(func() { svc.Close() })
			deaf, sender := svc.Connect(nil), svc.Connect(nil)
			mustEnroll(t, deaf, 1, 1)
			tx := mustEnroll(t, sender, 1, 2)
			payload := make([]byte, tc.size)
			tell := func(i int) {
				binary.BigEndian.PutUint64(payload, uint64(i))
				if _, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation,
					Token: benchToken(7, uint64(i)), Payload: payload}); err != nil {
					t.Fatal(err)
				}
			}
			// Two passes: the second derives from the first's checkpoint,
			// reading the retained records' outbox rows back too.
			for pass := range 2 {
				for i := range tc.n {
					tell(pass*tc.n + i)
				}
				st.mu.Lock()
				st.pages, st.largest = 0, 0
				st.mu.Unlock()
				if w, err := svc.CheckpointPass(ctx); err != nil || w != 1 {
					t.Fatalf("pass %d: CheckpointPass() = %d, %v, want 1", pass, w, err)
				}
				st.mu.Lock()
				pages, largest := st.pages, st.largest
				st.mu.Unlock()
				if pages == 0 {
					t.Fatalf("pass %d read no page through ReadPageBuffered: the test does not test the derivation", pass)
				}
				if largest > derivePageBytes {
					t.Errorf("pass %d over %d rows of %d bytes read a page of %d bytes, want at most %d (or one row)",
						pass, tc.n, tc.size, largest, derivePageBytes)
				}
			}
		})
	}
}
