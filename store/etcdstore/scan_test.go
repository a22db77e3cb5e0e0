package etcdstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// firstSegmentOf is byFirstSegment's ScanScope: every name under a prefix
// that holds a '/' has the prefix's first segment as its scope.
func firstSegmentOf(prefix string) bool { return strings.Contains(prefix, "/") }

// countingGets counts the Gets through it and the keys they return.
type countingGets struct {
	clientv3.KV
	gets, keys atomic.Int64
}

func (k *countingGets) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.gets.Add(1)
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.keys.Add(int64(len(resp.Kvs)))
	}
	return resp, err
}

// TestStore_ScanOfOneScopeReadsItsRange: with Options.ScanScope, a Scan of
// a prefix in one scope finds what walking every key finds (values
// flushed, staged, changed and deleted; a prefix that ends mid-name; a
// prefix in no one scope), and reads that scope's values only, however
// many other scopes hold, in one range read.
func TestStore_ScanOfOneScopeReadsItsRange(t *testing.T) {
	pfx := prefix()
	kv := &countingGets{KV: shared.Client.KV}
	s := etcdstore.OpenKV(kv, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment, ScanScope: firstSegmentOf})
	t.Cleanup(func() { s.Close() })
	cas := func(key string, old, new uint64) {
		t.Helper()
		if err := s.CAS(key, old, new); err != nil {
			t.Fatalf("CAS(%s, %d, %d): %v", key, old, new, err)
		}
	}
	flush := func() {
		t.Helper()
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
	}
	for i := range 200 {
		cas(fmt.Sprintf("b/%03d", i), 0, uint64(i+1))
	}
	cas("a/2", 0, 2)
	cas("a/gone", 0, 9)
	cas("a/changed", 0, 1)
	cas("ab/1", 0, 11)
	cas("a", 0, 13)
	flush()
	cas("a/1", 0, 1)
	cas("a/10", 0, 10)
	cas("a/gone", 9, 0)
	cas("a/changed", 1, 4)
	tests := []struct {
		prefix string
		want   string
	}{
		{"a/", "[{a/1 1} {a/10 10} {a/2 2} {a/changed 4}]"},
		{"a/1", "[{a/1 1} {a/10 10}]"},
		{"a/gone", "[]"},
		{"ab/", "[{ab/1 11}]"},
		{"a", "[{a 13} {a/1 1} {a/10 10} {a/2 2} {a/changed 4} {ab/1 11}]"},
	}
	check := func(state string) {
		t.Helper()
		for _, tt := range tests {
			got, err := s.Scan(tt.prefix)
			if err != nil {
				t.Fatalf("%s: Scan(%q): %v", state, tt.prefix, err)
			}
			if got == nil {
				got = []store.Value{}
			}
			if fmt.Sprint(got) != tt.want {
				t.Errorf("%s: Scan(%q) = %v, want %s", state, tt.prefix, got, tt.want)
			}
		}
	}
	check("staged")
	flush()
	check("flushed")

	keys, gets := kv.keys.Load(), kv.gets.Load()
	if _, err := s.Scan("a/"); err != nil {
		t.Fatal(err)
	}
	if n := kv.keys.Load() - keys; n > 4 {
		t.Errorf("Scan(a/) read %d keys beside 200 values of another scope, want at most 4 (scope a's values)", n)
	}
	if n := kv.gets.Load() - gets; n != 1 {
		t.Errorf("Scan(a/) made %d reads, want 1 (the range of scope a's values, with them)", n)
	}
}
