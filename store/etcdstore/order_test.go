package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// orderedWrite is one write of TestStore_AScopeCutOverTransactionsKeepsItsOrder's
// sequence: an append, a CAS, a trim or a byte value.
type orderedWrite struct {
	stream, payload string
	key             string
	old, new        uint64
	trim            uint64
	bytes           string
}

// orderedState is what a reader finds of the sequence's names.
type orderedState struct {
	Log, Out []string
	First    uint64
	V1, V2   uint64
	B        string
}

// after returns the state once the first n writes of ws are durable, over
// base, what was committed before them.
func after(base orderedState, ws []orderedWrite, n int) orderedState {
	st := base
	st.Log, st.Out = append([]string(nil), base.Log...), append([]string(nil), base.Out...)
	for _, w := range ws[:n] {
		switch {
		case w.stream == "a/log":
			st.Log = append(st.Log, w.payload)
		case w.stream == "a/out":
			st.Out = append(st.Out, w.payload)
		case w.key == "a/v1":
			st.V1 = w.new
		case w.key == "a/v2":
			st.V2 = w.new
		case w.trim != 0:
			st.First = w.trim
		default:
			st.B = w.bytes
		}
	}
	return st
}

// TestStore_AScopeCutOverTransactionsKeepsItsOrder: a scope whose writes
// do not fit one transaction is committed as several, and a commit that
// fails at any of them, refused or with its outcome unknown (applied or
// not), leaves in etcd a prefix of the scope's writes in the order their
// calls returned: never a CAS without the appends made before it, never an
// outbox entry without the log entries before it (store.ScopeOrdered).
// Before the order was kept, a split scope wrote every value first and its
// streams in map order.
func TestStore_AScopeCutOverTransactionsKeepsItsOrder(t *testing.T) {
	ws := []orderedWrite{
		{key: "a/v1", old: 0, new: 1},
		{stream: "a/log", payload: "l2"},
		{stream: "a/log", payload: "l3"},
		{stream: "a/out", payload: "o0"},
		{key: "a/v2", old: 0, new: 5},
		{key: "a/v1", old: 1, new: 2},
		{stream: "a/log", payload: "l4"},
		{bytes: "ckpt-1"},
		{stream: "a/log", payload: "l5"},
		{stream: "a/out", payload: "o1"},
		{trim: 1},
		{stream: "a/out", payload: "o2"},
		{key: "a/v1", old: 2, new: 3},
		{stream: "a/log", payload: "l6"},
		{bytes: "ckpt-2"},
		{stream: "a/out", payload: "o3"},
		{key: "a/v2", old: 5, new: 6},
		{stream: "a/log", payload: "l7"},
		{stream: "a/out", payload: "o4"},
	}
	base := orderedState{Log: []string{"l0", "l1"}}
	var prefixes []orderedState
	for n := range len(ws) + 1 {
		prefixes = append(prefixes, after(base, ws, n))
	}
	for _, fenced := range []bool{false, true} {
		for _, mode := range []faultMode{refuse, unknownNotApplied, unknownApplied} {
			cutInOrder(t, ws, prefixes, mode, fenced)
		}
	}
	cutInOrder(t, ws, prefixes, fenceLost, true)
}

// cutInOrder makes the writes ws in a fresh scope (fenced: under a claim,
// so that its transactions compare the fence alone), fails the k-th
// writing transaction of their commit as mode says, for each k until a
// commit passes, and requires etcd to hold one of prefixes each time.
func cutInOrder(t *testing.T, ws []orderedWrite, prefixes []orderedState, fault faultMode, fenced bool) {
	t.Helper()
	mode := cutMode{fault, fenced}
	for k := 1; ; k++ {
		pfx := prefix()
		opts := etcdstore.Options{Prefix: pfx, Scope: byFirstSegment, MaxTxnOps: 4}
		setup := open(t, opts)
		mustAppend(t, setup, "a/log", "l0", 0)
		mustAppend(t, setup, "a/log", "l1", 1)
		if err := setup.Flush(); err != nil {
			t.Fatal(err)
		}
		setup.Close()

		fault := &writeFault{mode: mode.fault}
		fault.Arm(k)
		s := etcdstore.OpenKV(fault.kv(), opts)
		if fenced {
			key := pfx + "own/a"
			s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
			// Another node's claim: the key deleted (the lease expired)
			// and created again, a new create revision.
			fault.steal = func() { deleteKey(t, key); claim(t, key) }
		}
		for i, w := range ws {
			var err error
			switch {
			case w.stream != "":
				var n uint64
				if n, err = s.Len(w.stream); err == nil {
					_, err = s.Append(w.stream, []byte(w.payload), n)
				}
			case w.key != "":
				err = s.CAS(w.key, w.old, w.new)
			case w.trim != 0:
				err = s.Trim("a/log", w.trim)
			default:
				err = s.PutBytes([]store.Bytes{{Key: "a/b", Value: []byte(w.bytes)}})
			}
			if err != nil {
				t.Fatalf("%v, fault at transaction %d: write %d: %v", mode, k, i, err)
			}
		}
		ferr := s.Flush()
		s.Close()
		got := readOrdered(t, etcdstore.Open(shared.Client, opts))
		matched := -1
		for n, want := range prefixes {
			if cmp.Equal(got, want) {
				matched = n
			}
		}
		if matched < 0 {
			t.Fatalf("%v at transaction %d (flush: %v): etcd holds %+v, no prefix of the writes", mode, k, ferr, got)
		}
		if !fault.Fired() {
			if ferr != nil || matched != len(ws) {
				t.Fatalf("no fault injected (%d writing transactions): flush %v, %d of %d writes durable", fault.Seen(), ferr, matched, len(ws))
			}
			if k < 3 {
				t.Fatalf("the scope took %d transactions: the test must cut it over several", k-1)
			}
			t.Logf("%v: %d transactions cut, each leaving a prefix", mode, k-1)
			return
		}
		if ferr == nil {
			t.Fatalf("%v at transaction %d: Flush = nil", mode, k)
		}
		if mode.fault == fenceLost && !errors.Is(ferr, etcdstore.ErrFenced) {
			t.Fatalf("%v at transaction %d: Flush = %v, want ErrFenced", mode, k, ferr)
		}
		if mode.fault == unknownApplied && matched == 0 {
			t.Fatalf("%v at transaction %d: the applied transaction left nothing", mode, k)
		}
	}
}

// readOrdered reads the sequence's names from s and closes it.
func readOrdered(t *testing.T, s *etcdstore.Store) orderedState {
	t.Helper()
	defer s.Close()
	var st orderedState
	first, err := s.First("a/log")
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Len("a/log")
	if err != nil {
		t.Fatal(err)
	}
	// The entries below the floor are gone: read them as the base had them.
	for i := range first {
		st.Log = append(st.Log, fmt.Sprintf("l%d", i))
	}
	if first < n {
		es, err := s.ReadFrom("a/log", first, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			st.Log = append(st.Log, string(e.Payload))
		}
	}
	st.Out = readAll(t, s, "a/out")
	if first > 0 {
		st.First = first
	}
	if st.V1, err = s.ReadValue("a/v1"); err != nil {
		t.Fatal(err)
	}
	if st.V2, err = s.ReadValue("a/v2"); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBytes("a/b")
	if err != nil {
		t.Fatal(err)
	}
	st.B = string(b)
	return st
}

// cutMode is how cutInOrder fails a transaction, and whether the scope
// is fenced.
type cutMode struct {
	fault  faultMode
	fenced bool
}

func (m cutMode) String() string {
	if m.fenced {
		return m.fault.String() + ", fenced"
	}
	return m.fault.String()
}

type faultMode int

const (
	refuse            faultMode = iota // the transaction fails, not sent
	unknownNotApplied                  // its outcome is unknown; it did not apply
	unknownApplied                     // its outcome is unknown; it applied
	fenceLost                          // the fence is lost just before it (writeFault.steal); sent, etcd refuses it
)

func (m faultMode) String() string {
	return [...]string{"refused", "unknown outcome, not applied", "unknown outcome, applied", "fence lost"}[m]
}

// writeFault counts the transactions that write, and fails the one its
// Trigger fires on as mode says; for fenceLost it calls steal (which takes
// the fence away in etcd) and then sends the transaction.
type writeFault struct {
	etcdtest.Trigger
	mode  faultMode
	steal func()
}

// kv returns the shared client's KV with f's fault in front of it.
func (f *writeFault) kv() clientv3.KV {
	return etcdtest.Hook(shared.Client.KV, etcdtest.Hooks{Txn: f.commit})
}

func (f *writeFault) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	if !t.Writes() || !f.Hit() {
		return t.Send()
	}
	switch f.mode {
	case fenceLost:
		f.steal()
		return t.Send()
	case unknownApplied:
		return t.Fail(etcdtest.LostApplied)
	case unknownNotApplied:
		return t.Fail(etcdtest.Lost)
	}
	// Refused, as if another writer had made a compare fail and then
	// undone it: the store's read back finds every compare holding.
	return t.Fail(etcdtest.Refused)
}

// TestStore_KeepsOrderWithinOneScopeOnly: the store answers for the names
// of one scope, never across scopes, which commit and fail apart.
func TestStore_KeepsOrderWithinOneScopeOnly(t *testing.T) {
	s := open(t, etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment})
	if !store.KeepsOrderWithin(s, "a/log", "a/out", "a/v1") {
		t.Error("names of scope a: order not kept")
	}
	if store.KeepsOrderWithin(s, "a/log", "b/out") {
		t.Error("names of scopes a and b: order kept")
	}
	if store.KeepsOrder(s) {
		t.Error("the store claims every write's order (store.Ordered)")
	}
}
