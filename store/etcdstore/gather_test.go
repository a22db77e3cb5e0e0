package etcdstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// gateKV holds the first transaction begun after arm until release is
// closed, so that a test stages writes while a commit is in flight.
type gateKV struct {
	clientv3.KV
	armed   atomic.Bool
	held    chan struct{} // closed when the held transaction waits
	release chan struct{}
}

func (g *gateKV) arm() {
	g.held, g.release = make(chan struct{}), make(chan struct{})
	g.armed.Store(true)
}

func (g *gateKV) Txn(ctx context.Context) clientv3.Txn {
	if g.armed.CompareAndSwap(true, false) {
		close(g.held)
		<-g.release
	}
	return g.KV.Txn(ctx)
}

// gathered is what a fresh store reads of the names
// TestStore_ACommitWritesWhatEachNameLastStaged writes.
type gathered struct {
	V, W  uint64
	B, C  string
	First uint64
	Log   []string
	Out   []string
}

// TestStore_ACommitWritesWhatEachNameLastStaged: a commit writes each
// value's and byte value's last write, every entry of a stream and its
// last trim, however the scope's writes interleave, whether the scope
// fits one transaction or is cut over several, fenced or not; and what is
// staged while the scope's commit is in flight (a value, a byte value and
// a stream written again, a trim) is written by its next commit. A fresh
// store reads the last of each. A commit gathers each name's writes from
// the scope's log at its first write there and passes over the rest, so
// that gathering the first write's value instead of the last, or missing
// a name written again during a commit, loses a write that Flush
// reported durable.
func TestStore_ACommitWritesWhatEachNameLastStaged(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxTxnOps int
		fenced    bool
	}{{"whole", 0, false}, {"whole-fenced", 0, true}, {"cut", 4, false}, {"cut-fenced", 4, true}} {
		t.Run(tc.name, func(t *testing.T) {
			pfx := prefix()
			opts := etcdstore.Options{Prefix: pfx, MaxTxnOps: tc.maxTxnOps, Scope: func(name string) string {
				sc, _, _ := strings.Cut(name, "/")
				return sc
			}}
			gate := &gateKV{KV: shared.Client.KV}
			s := etcdstore.OpenKV(gate, opts)
			defer s.Close()
			if tc.fenced {
				key := pfx + "own/a"
				s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
			}
			appendTo := func(name, payload string) {
				t.Helper()
				n, err := s.Len(name)
				if err == nil {
					_, err = s.Append(name, []byte(payload), n)
				}
				if err != nil {
					t.Fatalf("Append(%q, %q) = %v", name, payload, err)
				}
			}
			cas := func(key string, old, new uint64) {
				t.Helper()
				if err := s.CAS(key, old, new); err != nil {
					t.Fatalf("CAS(%q, %d, %d) = %v", key, old, new, err)
				}
			}
			put := func(key, v string) {
				t.Helper()
				if err := s.PutBytes([]store.Bytes{{Key: key, Value: []byte(v)}}); err != nil {
					t.Fatalf("PutBytes(%q, %q) = %v", key, v, err)
				}
			}
			trim := func(below uint64) {
				t.Helper()
				if err := s.Trim("a/log", below); err != nil {
					t.Fatalf("Trim(a/log, %d) = %v", below, err)
				}
			}
			for i := range 4 {
				appendTo("a/log", fmt.Sprintf("l%d", i))
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}

			// One commit: every name written more than once, interleaved.
			cas("a/v", 0, 1)
			cas("a/w", 0, 7)
			appendTo("a/log", "l4")
			cas("a/v", 1, 2)
			put("a/b", "x")
			put("a/c", "p")
			appendTo("a/log", "l5")
			trim(1)
			put("a/b", "y")
			cas("a/w", 7, 8)
			appendTo("a/out", "o0")
			trim(2)
			put("a/c", "q")
			cas("a/v", 2, 3)
			appendTo("a/log", "l6")

			// Its commit held in flight while the same names are written
			// again.
			gate.arm()
			flushed := make(chan error, 1)
			go func() { flushed <- s.Flush() }()
			<-gate.held
			cas("a/v", 3, 4)
			put("a/b", "z")
			appendTo("a/log", "l7")
			trim(3)
			cas("a/v", 4, 5)
			appendTo("a/out", "o1")
			put("a/b", "zz")
			close(gate.release)
			if err := <-flushed; err != nil {
				t.Fatalf("first Flush = %v", err)
			}
			if err := s.Flush(); err != nil {
				t.Fatalf("second Flush = %v", err)
			}

			got := readGathered(t, etcdstore.Open(shared.Client, opts))
			want := gathered{V: 5, W: 8, B: "zz", C: "q", First: 3, Log: []string{"l3", "l4", "l5", "l6", "l7"}, Out: []string{"o0", "o1"}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("a fresh store reads (-want +got):\n%s", diff)
			}
		})
	}
}

// readGathered reads the names of TestStore_ACommitWritesWhatEachNameLastStaged
// through s, and closes it.
func readGathered(t *testing.T, s *etcdstore.Store) gathered {
	t.Helper()
	defer s.Close()
	var g gathered
	for key, into := range map[string]*uint64{"a/v": &g.V, "a/w": &g.W} {
		v, err := s.ReadValue(key)
		if err != nil {
			t.Fatalf("ReadValue(%q) = %v", key, err)
		}
		*into = v
	}
	for key, into := range map[string]*string{"a/b": &g.B, "a/c": &g.C} {
		b, err := s.GetBytes(key)
		if err != nil {
			t.Fatalf("GetBytes(%q) = %v", key, err)
		}
		*into = string(b)
	}
	var err error
	if g.First, err = s.First("a/log"); err != nil {
		t.Fatal(err)
	}
	for name, into := range map[string]*[]string{"a/log": &g.Log, "a/out": &g.Out} {
		from := uint64(0)
		if name == "a/log" {
			from = g.First
		}
		ents, err := s.ReadFrom(name, from, 100)
		if err != nil {
			t.Fatalf("ReadFrom(%q, %d) = %v", name, from, err)
		}
		for _, e := range ents {
			*into = append(*into, string(e.Payload))
		}
	}
	return g
}
