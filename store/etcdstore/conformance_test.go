package etcdstore_test

import (
	"errors"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/storetest"
)

// harness runs the conformance suite on stores over cli, each under a
// fresh prefix; Restart closes the store (dropping what was not flushed,
// as a crash does) and opens a new one on the same prefix.
func harness(cli *clientv3.Client, opts etcdstore.Options, wrap func(store.DurableStore) store.DurableStore) storetest.Harness {
	var mu sync.Mutex
	inner := make(map[store.DurableStore]*etcdstore.Store)
	unwrap := func(s store.DurableStore) *etcdstore.Store {
		mu.Lock()
		defer mu.Unlock()
		return inner[s]
	}
	open := func(t *testing.T, o etcdstore.Options) store.DurableStore {
		st := etcdstore.Open(cli, o)
		t.Cleanup(func() {
			if err := st.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
				t.Errorf("Close() error: %v", err)
			}
		})
		w := wrap(st)
		mu.Lock()
		inner[w] = st
		mu.Unlock()
		return w
	}
	return storetest.Harness{
		Open: func(t *testing.T) store.DurableStore {
			o := opts
			o.Prefix = prefix()
			return open(t, o)
		},
		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
			st := unwrap(s)
			o := opts
			o.Prefix = st.Prefix()
			st.Close()
			return open(t, o)
		},
	}
}

func bare(s store.DurableStore) store.DurableStore { return s }

// byFirstSegment scopes "a/b/c" as "a" and "x" as global, so that the
// suite's streams spread over many scopes and share transactions.
func byFirstSegment(name string) string {
	for i := range len(name) {
		if name[i] == '/' {
			return name[:i]
		}
	}
	return ""
}

func TestStore_Conformance(t *testing.T) {
	t.Parallel() // each under prefixes of its own on the shared member
	storetest.Run(t, harness(shared.Client, etcdstore.Options{}, bare))
}

// TestStore_ConformanceSmallTxns forces every commit to split into many
// transactions: the contract must hold across the split.
func TestStore_ConformanceSmallTxns(t *testing.T) {
	t.Parallel() // each under prefixes of its own on the shared member
	storetest.Run(t, harness(shared.Client, etcdstore.Options{Scope: byFirstSegment, MaxTxnOps: 16}, bare))
}

// TestStore_ConformancePipelined lets several group commits be in flight.
func TestStore_ConformancePipelined(t *testing.T) {
	t.Parallel() // each under prefixes of its own on the shared member
	storetest.Run(t, harness(shared.Client, etcdstore.Options{Scope: byFirstSegment, MaxInflightCommits: 4}, bare))
}

// TestStore_ConformanceThroughFaultstore runs the suite through a
// faultstore wrapper whose rules never fire: it must be indistinguishable.
func TestStore_ConformanceThroughFaultstore(t *testing.T) {
	t.Parallel() // each under prefixes of its own on the shared member
	storetest.Run(t, harness(shared.Client, etcdstore.Options{Scope: byFirstSegment}, func(s store.DurableStore) store.DurableStore {
		f := faultstore.New(s)
		f.SetRules(faultstore.When(faultstore.Fail, faultstore.Prefix("\xff")))
		return f
	}))
}
