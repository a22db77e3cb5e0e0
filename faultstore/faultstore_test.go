package faultstore

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
)

// record is what an Observer saw of one op.
type record struct {
	Op     Op
	Action Action
	Err    error
}

// recorder collects observed ops.
type recorder struct {
	// mu guards records.
	mu      sync.Mutex
	records []record
}

func (r *recorder) observe(op Op, a Action, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, record{op, a, err})
}

// sorted returns the records in op index order.
func (r *recorder) sorted() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.records)
	slices.SortFunc(out, func(a, b record) int { return int(a.Op.Index) - int(b.Op.Index) })
	return out
}

func newObserved() (*store.Memory, *Store, *recorder) {
	mem := store.NewMemory()
	s := New(mem)
	rec := &recorder{}
	s.SetObserver(rec.observe)
	return mem, s, rec
}

func mustAppend(t *testing.T, s store.DurableStore, stream string, payload string, seq uint64) {
	t.Helper()
	if got, err := s.Append(stream, []byte(payload), seq); err != nil || got != seq {
		t.Fatalf("Append(%q, seq=%d) = %d, %v, want %d, nil", stream, seq, got, err, seq)
	}
}

func mustFlush(t *testing.T, s store.DurableStore) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() = %v, want nil", err)
	}
}

// payloads returns the payloads of stream as strings.
func payloads(t TB, s store.DurableStore, stream string) []string {
	t.Helper()
	entries, err := s.ReadFrom(stream, 0, 0)
	if err != nil {
		t.Fatalf("ReadFrom(%q) = %v", stream, err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, string(e.Payload))
	}
	return out
}

func TestStore_CountsEveryCallButClose(t *testing.T) {
	_, s, rec := newObserved()
	mustAppend(t, s, "a", "x", 0)
	if _, err := s.ReadFrom("a", 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Len("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.CAS("k", 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadValue("k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Scan("k"); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, s)
	if got := s.Ops(); got != 7 {
		t.Errorf("Ops() = %d, want 7", got)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if got := s.Ops(); got != 7 {
		t.Errorf("Ops() after Close = %d, want 7 (Close is not an op)", got)
	}

	want := []Op{
		{Index: 0, Kind: OpAppend, Name: "a"},
		{Index: 1, Kind: OpRead, Name: "a"},
		{Index: 2, Kind: OpRead, Name: "a"},
		{Index: 3, Kind: OpCAS, Name: "k"},
		{Index: 4, Kind: OpRead, Name: "k"},
		{Index: 5, Kind: OpScan, Name: "k"},
		{Index: 6, Kind: OpFlush, Pending: []string{"a"}},
	}
	var got []Op
	for _, r := range rec.sorted() {
		got = append(got, r.Op)
		if r.Action != None || r.Err != nil {
			t.Errorf("op %s: action %s, err %v, want none, nil", r.Op, r.Action, r.Err)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("observed ops (-want +got):\n%s", diff)
	}
}

func TestStore_FailDoesNotReachInner(t *testing.T) {
	mem, s, rec := newObserved()
	s.SetRules(When(Fail, Not(Kind(OpFlush))))
	if _, err := s.Append("a", []byte("x"), 0); !errors.Is(err, ErrInjected) {
		t.Errorf("Append = %v, want ErrInjected", err)
	}
	if err := s.CAS("k", 0, 1); !errors.Is(err, ErrInjected) {
		t.Errorf("CAS = %v, want ErrInjected", err)
	}
	for _, call := range []func() error{
		func() error { _, err := s.ReadFrom("a", 0, 0); return err },
		func() error { _, err := s.Len("a"); return err },
		func() error { _, err := s.ReadValue("k"); return err },
		func() error { _, err := s.Scan(""); return err },
	} {
		if err := call(); !errors.Is(err, ErrInjected) || errors.Is(err, ErrCut) {
			t.Errorf("read = %v, want ErrInjected and not ErrCut", err)
		}
	}
	if n, _ := mem.Len("a"); n != 0 {
		t.Errorf("inner Len(a) = %d after a failed append, want 0", n)
	}
	if v, _ := mem.ReadValue("k"); v != 0 {
		t.Errorf("inner ReadValue(k) = %d after a failed CAS, want 0", v)
	}
	var e *Error
	if _, err := s.Append("a", []byte("x"), 0); !errors.As(err, &e) || e.Action != Fail || e.Op.Index != 6 {
		t.Errorf("Append error = %#v, want *Error{Action: fail, Op.Index: 6}", err)
	}

	// A failed flush makes nothing durable and leaves the append pending.
	s.SetRules(OnKind(OpFlush, Fail))
	mustAppend(t, s, "a", "x", 0)
	if err := s.Flush(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Flush = %v, want ErrInjected", err)
	}
	s.SetRules()
	mem.Crash()
	if n, _ := mem.Len("a"); n != 0 {
		t.Errorf("after a failed flush and Crash, inner Len(a) = %d, want 0", n)
	}
	for _, r := range rec.sorted() {
		if r.Action != Fail && r.Action != None {
			t.Errorf("op %s applied %s", r.Op, r.Action)
		}
	}
}

func TestStore_UncertainReachesInner(t *testing.T) {
	mem, s, _ := newObserved()
	s.SetRules(When(Uncertain))
	if seq, err := s.Append("a", []byte("x"), 0); !errors.Is(err, ErrInjected) || seq != 0 {
		t.Errorf("Append = %d, %v, want 0, ErrInjected", seq, err)
	}
	if err := s.CAS("k", 0, 7); !errors.Is(err, ErrInjected) {
		t.Errorf("CAS = %v, want ErrInjected", err)
	}
	if entries, err := s.ReadFrom("a", 0, 0); !errors.Is(err, ErrInjected) || entries != nil {
		t.Errorf("ReadFrom = %v, %v, want nil, ErrInjected", entries, err)
	}
	err := s.Flush()
	if !errors.Is(err, ErrInjected) {
		t.Fatalf("Flush = %v, want ErrInjected", err)
	}
	if want := `faultstore: injected fault: #3 flush [a] performed, reported as failed`; err.Error() != want {
		t.Errorf("Flush error = %q, want %q", err, want)
	}
	// The flush did make both writes durable.
	mem.Crash()
	s.SetRules()
	if diff := cmp.Diff([]string{"x"}, payloads(t, s, "a")); diff != "" {
		t.Errorf("after an uncertain flush and Crash, a (-want +got):\n%s", diff)
	}
	if v, _ := s.ReadValue("k"); v != 7 {
		t.Errorf("ReadValue(k) = %d, want 7", v)
	}
	// A durable uncertain flush clears the pending set.
	s.SetRules(OnKind(OpFlush, Fail))
	var e *Error
	if err := s.Flush(); !errors.As(err, &e) || len(e.Op.Pending) != 0 {
		t.Errorf("Flush after an uncertain flush: %v, want an injected flush with no pending streams", err)
	}
}

func TestStore_UncertainReturnsInnerError(t *testing.T) {
	_, s, _ := newObserved()
	s.SetRules(When(Uncertain))
	_, err := s.Append("a", []byte("x"), 5)
	if !errors.Is(err, store.ErrSequenceConflict) || errors.Is(err, ErrInjected) {
		t.Errorf("uncertain Append(seq=5) on an empty stream = %v, want the inner sequence conflict only", err)
	}
}

func TestStore_FlushPendingTracksAppendsSinceTheLastDurableFlush(t *testing.T) {
	_, s, rec := newObserved()
	fail := NewSwitch(OnKind(OpFlush, Fail))
	s.SetRules(fail)

	mustAppend(t, s, "oplog/1", "o", 0)
	mustAppend(t, s, "outbox/1", "b", 0)
	mustAppend(t, s, "oplog/1", "o", 1)
	if _, err := s.Append("other", []byte("x"), 9); err == nil {
		t.Fatal("Append with a wrong seq succeeded")
	}
	fail.Set(true)
	if err := s.Flush(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Flush = %v, want ErrInjected", err)
	}
	mustAppend(t, s, "oplog/2", "o", 0)
	fail.Set(false)
	mustFlush(t, s)
	mustFlush(t, s)

	var got [][]string
	for _, r := range rec.sorted() {
		if r.Op.Kind == OpFlush {
			got = append(got, r.Op.Pending)
		}
	}
	want := [][]string{
		{"oplog/1", "outbox/1"},            // the conflicting append never landed
		{"oplog/1", "oplog/2", "outbox/1"}, // a failed flush keeps its streams pending
		{},                                 // a durable flush clears them
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flush Pending (-want +got):\n%s", diff)
	}
}

func TestStore_SeedSwitchesFailOnlyOutboxBarriers(t *testing.T) {
	mem, s, _ := newObserved()
	failAppend := NewSwitch(When(Fail, Kind(OpAppend), Prefix("outbox/")))
	failFlush := NewSwitch(When(Fail, Kind(OpFlush), Prefix("outbox/")))
	s.SetRules(failAppend, failFlush)

	// fail_append: the oplog barrier holds, the outbox append fails.
	failAppend.Set(true)
	mustAppend(t, s, "oplog/1", "o0", 0)
	mustFlush(t, s)
	if _, err := s.Append("outbox/1", []byte("b0"), 0); !errors.Is(err, ErrInjected) {
		t.Fatalf("outbox Append with fail_append = %v, want ErrInjected", err)
	}
	mustFlush(t, s) // nothing of the outbox is pending
	failAppend.Set(false)

	// fail_flush: the outbox append lands, its flush fails, and only the
	// flush that covers it.
	failFlush.Set(true)
	mustAppend(t, s, "outbox/1", "b0", 0)
	if err := s.Flush(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Flush covering an outbox append with fail_flush = %v, want ErrInjected", err)
	}
	if diff := cmp.Diff([]string{"b0"}, payloads(t, s, "outbox/1")); diff != "" {
		t.Errorf("outbox after a failed flush is visible (-want +got):\n%s", diff)
	}
	mem.Crash()
	if diff := cmp.Diff([]string(nil), payloads(t, s, "outbox/1")); diff != "" {
		t.Errorf("outbox after a failed flush and Crash (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"o0"}, payloads(t, s, "oplog/1")); diff != "" {
		t.Errorf("oplog after Crash (-want +got):\n%s", diff)
	}
	// The restarted process wraps the crashed store anew: the old Store
	// still counts the lost outbox append as pending.
	s = New(mem)
	s.SetRules(failAppend, failFlush)
	mustAppend(t, s, "oplog/1", "o1", 1)
	mustFlush(t, s) // an oplog-only flush is not covered by fail_flush

	failFlush.Set(false)
	mustAppend(t, s, "outbox/1", "b0", 0)
	mustFlush(t, s)
	mem.Crash()
	if diff := cmp.Diff([]string{"b0"}, payloads(t, s, "outbox/1")); diff != "" {
		t.Errorf("repaired outbox after Crash (-want +got):\n%s", diff)
	}
}

func TestStore_CutStopsEverythingAfter(t *testing.T) {
	mem, s, rec := newObserved()
	if _, ok := s.CutAt(); ok {
		t.Fatal("CutAt() reports a cut before any op")
	}
	s.SetRules(OnIndex(4, Cut))
	mustAppend(t, s, "a", "a0", 0) // #0
	mustFlush(t, s)                // #1: a0 durable
	mustAppend(t, s, "a", "a1", 1) // #2: visible, not durable
	if err := s.CAS("k", 0, 1); err != nil {
		t.Fatal(err) // #3
	}
	err := s.Flush() // #4: the process dies here
	if !errors.Is(err, ErrCut) || errors.Is(err, ErrInjected) {
		t.Fatalf("Flush at the cut = %v, want ErrCut only", err)
	}
	if want := "faultstore: cut: process died at #4 flush [a]"; err.Error() != want {
		t.Errorf("cut error = %q, want %q", err, want)
	}
	// Every later op fails, whatever the rules say.
	s.SetRules()
	if _, err := s.Append("a", []byte("a2"), 2); !errors.Is(err, ErrCut) {
		t.Errorf("Append after the cut = %v, want ErrCut", err)
	} else if want := `faultstore: cut: #5 append "a" not performed, process died at #4`; err.Error() != want {
		t.Errorf("Append after the cut = %q, want %q", err, want)
	}
	if _, err := s.ReadFrom("a", 0, 0); !errors.Is(err, ErrCut) {
		t.Errorf("ReadFrom after the cut = %v, want ErrCut", err)
	}
	if err := s.Flush(); !errors.Is(err, ErrCut) {
		t.Errorf("Flush after the cut = %v, want ErrCut", err)
	}
	if at, ok := s.CutAt(); !ok || at != 4 {
		t.Errorf("CutAt() = %d, %v, want 4, true", at, ok)
	}
	if got := s.Ops(); got != 8 {
		t.Errorf("Ops() = %d, want 8", got)
	}
	if n, _ := mem.Len("a"); n != 2 {
		t.Errorf("inner Len(a) before Crash = %d, want 2 (the append after the cut never arrived)", n)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close after the cut = %v, want nil", err)
	}

	mem.Crash()
	if diff := cmp.Diff([]string{"a0"}, payloads(t, mem, "a")); diff != "" {
		t.Errorf("after Crash, a (-want +got):\n%s", diff)
	}
	if v, _ := mem.ReadValue("k"); v != 0 {
		t.Errorf("after Crash, k = %d, want 0 (the CAS was never flushed)", v)
	}
	var actions []Action
	for _, r := range rec.sorted() {
		actions = append(actions, r.Action)
	}
	want := []Action{None, None, None, None, Cut, Cut, Cut, Cut}
	if diff := cmp.Diff(want, actions); diff != "" {
		t.Errorf("observed actions (-want +got):\n%s", diff)
	}
}

func TestStore_ConcurrentUseIsRaceFree(t *testing.T) {
	const workers, perWorker = 16, 50
	mem, s, rec := newObserved()
	failFlush := NewSwitch(When(Fail, Kind(OpFlush), Prefix("w3/")))
	s.SetRules(failFlush, OnPrefix("w5/", Uncertain))

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			stream := fmt.Sprintf("w%d/", w)
			for i := range perWorker {
				switch w {
				case 0:
					failFlush.Set(i%2 == 0)
				case 1:
					s.AddRule(OnIndex(1<<40, Fail))
				case 2:
					s.SetObserver(rec.observe)
				}
				_, err := s.Append(stream, []byte{byte(i)}, uint64(i))
				if err != nil && !errors.Is(err, ErrInjected) {
					t.Errorf("Append(%q, seq=%d) = %v", stream, i, err)
					return
				}
				if err := s.Flush(); err != nil && !errors.Is(err, ErrInjected) {
					t.Errorf("Flush() = %v", err)
					return
				}
			}
		})
	}
	wg.Wait()

	const total = workers * perWorker * 2
	if got := s.Ops(); got != total {
		t.Errorf("Ops() = %d, want %d", got, total)
	}
	records := rec.sorted()
	if len(records) != total {
		t.Fatalf("observed %d ops, want %d", len(records), total)
	}
	for i, r := range records {
		if r.Op.Index != uint64(i) {
			t.Fatalf("observed op indices skip or repeat at %d: %s", i, r.Op)
		}
	}
	for w := range workers {
		if n, _ := mem.Len(fmt.Sprintf("w%d/", w)); n != perWorker {
			t.Errorf("inner Len(w%d/) = %d, want %d", w, n, perWorker)
		}
	}
}

func TestStore_ConcurrentCutAdmitsNothingAfterIt(t *testing.T) {
	const workers, perWorker, cutAt = 8, 40, 100
	mem, s, rec := newObserved()
	s.SetRules(OnIndex(cutAt, Cut))

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			stream := fmt.Sprintf("w%d", w)
			seq := uint64(0)
			for range perWorker {
				if _, err := s.Append(stream, []byte{byte(seq)}, seq); err == nil {
					seq++
				} else if !errors.Is(err, ErrCut) {
					t.Errorf("Append(%q, seq=%d) = %v", stream, seq, err)
				}
				if err := s.Flush(); err != nil && !errors.Is(err, ErrCut) {
					t.Errorf("Flush() = %v", err)
				}
			}
		})
	}
	wg.Wait()

	landed := 0
	for _, r := range rec.sorted() {
		before := r.Op.Index < cutAt
		if before != (r.Err == nil) {
			t.Errorf("op %s: err %v; want nil exactly for ops before the cut at #%d", r.Op, r.Err, cutAt)
		}
		if before && r.Op.Kind == OpAppend {
			landed++
		}
	}
	inner := 0
	for w := range workers {
		n, _ := mem.Len(fmt.Sprintf("w%d", w))
		inner += int(n)
	}
	if inner != landed {
		t.Errorf("inner store holds %d entries, want the %d appends admitted before the cut", inner, landed)
	}
}

func TestStore_SetRulesReplacesAndAddRuleAppends(t *testing.T) {
	_, s, rec := newObserved()
	s.AddRule(OnKind(OpRead, Fail))
	s.AddRule(When(Uncertain)) // later: loses to the read rule
	if _, err := s.Len("a"); !errors.Is(err, ErrInjected) {
		t.Fatalf("Len = %v, want ErrInjected", err)
	}
	if _, err := s.Append("a", []byte("x"), 0); !errors.Is(err, ErrInjected) {
		t.Fatalf("Append = %v, want ErrInjected from the catch-all rule", err)
	}
	s.SetRules()
	if n, err := s.Len("a"); err != nil || n != 1 {
		t.Fatalf("Len with no rules = %d, %v, want 1, nil", n, err)
	}
	s.SetObserver(nil)
	if _, err := s.Len("a"); err != nil {
		t.Fatalf("Len = %v", err)
	}
	var got []Action
	for _, r := range rec.sorted() {
		got = append(got, r.Action)
	}
	if diff := cmp.Diff([]Action{Fail, Uncertain, None}, got); diff != "" {
		t.Errorf("observed actions (-want +got):\n%s", diff)
	}
}

// A Fatal flush fails the store as a real one fails on ENOSPC: the flush
// is not performed, and it and every later op, reads included, return an
// error wrapping store.ErrFailed and the cause, naming the op it failed at.
func TestFatalFailsTheStoreForEveryLaterOp(t *testing.T) {
	for _, cause := range []error{syscall.ENOSPC, syscall.EIO} {
		s := New(store.NewMemory())
		if cause != syscall.EIO {
			s.SetFatalCause(cause)
		}
		s.SetRules(Once(OnKind(OpFlush, Fatal)))
		if _, err := s.Append("a", []byte("x"), 0); err != nil {
			t.Fatalf("Append = %v", err)
		}
		ferr := s.Flush()
		if !errors.Is(ferr, store.ErrFailed) || !errors.Is(ferr, cause) || errors.Is(ferr, ErrInjected) {
			t.Fatalf("Flush = %v, want store.ErrFailed and %v", ferr, cause)
		}
		s.SetRules() // the failure is the store's, not the rule's
		_, aerr := s.Append("a", []byte("y"), 1)
		_, rerr := s.ReadFrom("a", 0, 0)
		for _, err := range []error{aerr, rerr, s.Flush(), s.CAS("k", 0, 1)} {
			var fe *Error
			if !errors.As(err, &fe) || fe.Action != Fatal || fe.CutAt != 1 || !errors.Is(err, store.ErrFailed) || !errors.Is(err, cause) {
				t.Fatalf("op after the failure = %v, want a Fatal *Error at #1 wrapping store.ErrFailed and %v", err, cause)
			}
		}
	}
}

// TestStore_HangHoldsUntilRelease hangs a flush: it does not return, nor
// reach the inner store, until Release; an op the rule does not match runs
// meanwhile; once released the flush makes the append durable, and a later
// Hang op goes through at once.
func TestStore_HangHoldsUntilRelease(t *testing.T) {
	mem, s, rec := newObserved()
	s.SetRules(OnKind(OpFlush, Hang))
	mustAppend(t, s, "oplog/1", "a", 0)
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush() }()
	<-s.Hung()
	if n := s.Hanging(); n != 1 {
		t.Fatalf("Hanging() = %d, want 1", n)
	}
	// Not a flush: not held.
	mustAppend(t, s, "oplog/1", "b", 1)
	select {
	case err := <-flushed:
		t.Fatalf("a hung Flush returned %v before Release", err)
	default:
	}
	if st := mem.Stats(); st.Flushes != 0 {
		t.Fatalf("inner Flushes before Release = %d, want 0", st.Flushes)
	}
	s.Release()
	if err := <-flushed; err != nil {
		t.Fatalf("released Flush() = %v, want nil", err)
	}
	if n := s.Hanging(); n != 0 {
		t.Fatalf("Hanging() after Release = %d, want 0", n)
	}
	mustFlush(t, s) // released: a later Hang op passes at once
	s.Release()     // idempotent
	mem.Crash()
	if got, want := payloads(t, mem, "oplog/1"), []string{"a", "b"}; !cmp.Equal(got, want) {
		t.Fatalf("after Crash oplog/1 = %q, want %q", got, want)
	}
	var actions []Action
	for _, r := range rec.sorted() {
		if r.Op.Kind == OpFlush {
			actions = append(actions, r.Action)
		}
	}
	if want := []Action{Hang, Hang}; !cmp.Equal(actions, want) {
		t.Fatalf("flush actions = %v, want %v", actions, want)
	}
}
