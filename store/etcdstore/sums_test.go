package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// sumsData writes one value of every kind the store keeps, in a fenced
// scope ("a", claimed at own/a) and in the global scope: stream entries
// and their lengths, values, a byte value. It returns a function opening
// a fresh store on it (nothing cached, the scope fenced again), reading
// through kv (nil: the shared client's).
func sumsData(t *testing.T) (pfx string, open func(kv clientv3.KV) *etcdstore.Store) {
	t.Helper()
	pfx = prefix()
	rev := claim(t, pfx+"own/a")
	open = func(kv clientv3.KV) *etcdstore.Store {
		if kv == nil {
			kv = shared.Client.KV
		}
		s := etcdstore.OpenKV(kv, etcdstore.Options{Prefix: pfx + "d/", Scope: byFirstSegment, ScanScope: firstSegmentOf})
		s.SetFence("a", etcdstore.Fence{Key: pfx + "own/a", CreateRevision: rev})
		return s
	}
	s := open(nil)
	defer s.Close()
	for i, p := range []string{"transfer 100 to alice", "transfer 7 to bob"} {
		if _, err := s.Append("a/log", []byte(p), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append("registry", []byte("conversation a"), 0); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]uint64{"a/tok/x": 7, "a/tok/y": 300, "incarnation": 3} {
		if err := s.CAS(k, 0, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutBytes([]store.Bytes{{Key: "a/checkpoint", Value: []byte("state at row 2")}}); err != nil {
		t.Fatal(err)
	}
	// A stream of two runs trimmed inside the first: its floor key.
	mustAppend(t, s, "a/trim", "t0", 0)
	mustAppend(t, s, "a/trim", "t1", 1)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, "a/trim", "t2", 2)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim("a/trim", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	return pfx, open
}

// sumsReads is what every read of the store answers on sumsData: each
// read's answer, or the error it returned.
type sumsReads map[string]string

// observeSums makes every kind of read on a fresh store: stream lengths and
// entries, values (the fenced scope's through the batched, pinned reads),
// a Scan of one scope's range and one walking every key, a byte value.
func observeSums(open func(clientv3.KV) *etcdstore.Store, kv clientv3.KV) (sumsReads, []error) {
	s := open(kv)
	defer s.Close()
	out := sumsReads{}
	var errs []error
	note := func(what string, v any, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			out[what] = "error"
			return
		}
		out[what] = fmt.Sprint(v)
	}
	for _, st := range []string{"a/log", "registry", "a/trim"} {
		n, err := s.Len(st)
		note("Len("+st+")", n, err)
		first, err := s.First(st)
		note("First("+st+")", first, err)
		ents, err := s.ReadFrom(st, first, 0)
		var ps []string
		for _, e := range ents {
			ps = append(ps, fmt.Sprintf("%d:%s", e.Seq, e.Payload))
		}
		note("ReadFrom("+st+")", ps, err)
	}
	for _, k := range []string{"a/tok/x", "a/tok/y", "incarnation"} {
		v, err := s.ReadValue(k)
		note("ReadValue("+k+")", v, err)
	}
	for _, p := range []string{"a/tok/", ""} {
		vs, err := s.Scan(p)
		note("Scan("+p+")", vs, err)
	}
	b, err := s.GetBytes("a/checkpoint")
	note("GetBytes(a/checkpoint)", string(b), err)
	return out, errs
}

// TestSums_EveryFlippedByteOfEveryValueIsRefused flips one bit of every
// byte of every value the store wrote to etcd (runs, a trim's floor,
// values, byte values, fenced and global), one at a time, and makes every kind of
// read on a fresh store: each read answers exactly what it answered on the
// intact data or fails with store.ErrCorrupt, read directly or through
// a lagging member; a flipped value is never
// served (a payload "transfer 100" read as "transfer 900", a token index
// pointing at another row, a length that hides or invents entries).
func TestSums_EveryFlippedByteOfEveryValueIsRefused(t *testing.T) {
	pfx, open := sumsData(t)
	want, errs := observeSums(open, nil)
	if len(errs) > 0 {
		t.Fatalf("reads of the intact data: %v", errs)
	}
	ctx := context.Background()
	resp, err := shared.Client.Get(ctx, pfx+"d/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) < 9 {
		t.Fatalf("the data set has %d keys, want every kind (9: 4 runs, a floor, 3 values, a byte value)", len(resp.Kvs))
	}
	flips, refused := 0, 0
	for _, kv := range resp.Kvs {
		key, orig := string(kv.Key), string(kv.Value)
		for i := range len(orig) {
			bad := []byte(orig)
			bad[i] ^= 1 << (i % 8)
			put(t, key, string(bad))
			// Every other flip is read through a lagging member (its
			// pinned reads refused as future revisions, then read
			// again from the leader or linearizably).
			var via clientv3.KV
			if i%2 == 1 {
				via = etcdtest.Lag(shared.Client.KV, uint64(i))
			}
			got, errs := observeSums(open, via)
			flips++
			for what, v := range got {
				if v == "error" {
					continue
				}
				if v != want[what] {
					t.Errorf("bit %d of byte %d of %q flipped: %s = %s, want %s or store.ErrCorrupt", i%8, i, key[len(pfx):], what, v, want[what])
				}
			}
			for _, err := range errs {
				if !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("byte %d of %q flipped: %v, want store.ErrCorrupt", i, key[len(pfx):], err)
				}
			}
			if len(errs) > 0 {
				refused++
			}
			put(t, key, orig)
		}
	}
	t.Logf("%d flips over %d values: %d refused by at least one read, %d served unchanged", flips, len(resp.Kvs), refused, flips-refused)
	if refused != flips {
		t.Errorf("%d of %d flips were refused by no read; every byte of a value is under its checksum", flips-refused, flips)
	}
}

// TestSums_AValueMovedUnderAnotherKeyIsRefused copies the stored bytes of
// one value, entry and byte value over another key of the same kind: each
// verifies under its own key only, so the copy is refused, never read as
// the other key's (a token index entry answering for another token).
func TestSums_AValueMovedUnderAnotherKeyIsRefused(t *testing.T) {
	pfx, open := sumsData(t)
	ctx := context.Background()
	get := func(rel string) string {
		t.Helper()
		resp, err := shared.Client.Get(ctx, pfx+"d/"+rel)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("Get(%s) = %v, %v", rel, resp, err)
		}
		return string(resp.Kvs[0].Value)
	}
	put(t, pfx+"d/c/a/v/a/tok/y", get("c/a/v/a/tok/x"))
	entry := func(seq byte) string { return "c/a/s/\x00\x05a/log\x00\x00\x00\x00\x00\x00\x00" + string(seq) }
	put(t, pfx+"d/"+entry(1), get(entry(0)))
	put(t, pfx+"d/c/a/b/a/other", get("c/a/b/a/checkpoint"))
	s := open(nil)
	defer s.Close()
	if v, err := s.ReadValue("a/tok/y"); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("ReadValue(a/tok/y) holding a/tok/x's bytes = %d, %v; want store.ErrCorrupt", v, err)
	}
	if ents, err := s.ReadFrom("a/log", 1, 0); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("ReadFrom(a/log, 1) holding entry 0's bytes = %v, %v; want store.ErrCorrupt", ents, err)
	}
	if b, err := s.GetBytes("a/other"); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("GetBytes(a/other) holding a/checkpoint's bytes = %q, %v; want store.ErrCorrupt", b, err)
	}
	var ce *store.ChecksumError
	if _, err := s.ReadValue("a/tok/y"); !errors.As(err, &ce) || ce.Key == "" {
		t.Errorf("ReadValue(a/tok/y) = %v; want a *store.ChecksumError naming the key", err)
	}
}

// TestSums_FencingComparesStillHold: a value and a stream length written
// sealed compare equal in the next transaction (the store compares the
// sealed bytes), so commits after commits, and after a fresh store read
// them back, go through; a value changed behind the store's back still
// conflicts.
func TestSums_FencingComparesStillHold(t *testing.T) {
	_, open := sumsData(t)
	s := open(nil)
	defer s.Close()
	if err := s.CAS("a/tok/x", 7, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("a/log", []byte("third"), 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush after reading sealed values back: %v", err)
	}
	if err := s.CAS("a/tok/x", 8, 9); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("second Flush: %v", err)
	}
	// A value of the unfenced global scope, which always compares its
	// values (a fenced scope loaded under its claim compares the fence
	// alone: nothing else writes it while the claim holds).
	if v, err := s.ReadValue("incarnation"); err != nil || v != 3 {
		t.Fatalf("ReadValue(incarnation) = %d, %v; want 3", v, err)
	}
	other := open(nil)
	defer other.Close()
	if err := other.CAS("incarnation", 3, 4); err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.CAS("incarnation", 3, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); !errors.Is(err, etcdstore.ErrConflict) {
		t.Fatalf("Flush of a CAS over a value another writer changed = %v, want ErrConflict", err)
	}
}

func put(t *testing.T, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := shared.Client.Put(ctx, key, val); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

// TestSeal_Golden pins the stored bytes of format 1: a value's body, the
// tag 0x01 and the CRC-32C of the key relative to the root, a zero byte,
// the body and the tag. A change here is a change of the format in etcd,
// which every cluster's data would have to be converted for. The sums
// were computed apart, by a bitwise CRC-32C (polynomial 0x82F63B78).
func TestSeal_Golden(t *testing.T) {
	for _, c := range []struct{ rel, body, want string }{
		{"c/1/s/\x00\x07oplog/1\x00\x00\x00\x00\x00\x00\x00\x00", "payload", "payload\x01\xb7\x48\x64\x9e"},
		{"c/1/l/oplog/1", "\x00\x00\x00\x00\x00\x00\x00\x01", "\x00\x00\x00\x00\x00\x00\x00\x01\x01\x52\xc6\x07\xd2"},
		{"c/1/v/token/1/e/abc", "\x00\x00\x00\x00\x00\x00\x00\x02", "\x00\x00\x00\x00\x00\x00\x00\x02\x01\x4a\x0d\x8b\x9e"},
		{"c/1/b/checkpoint/1", "", "\x01\x51\xbf\x36\xa3"},
		{"format", "1", "1\x01\xfa\x24\x9d\x51"},
	} {
		got := etcdstore.Seal(c.rel, []byte(c.body))
		if got != c.want {
			t.Errorf("Seal(%q, %q) = %q, want %q", c.rel, c.body, got, c.want)
		}
		body, err := etcdstore.Unseal("", c.rel, []byte(c.want))
		if err != nil || string(body) != c.body {
			t.Errorf("Unseal(%q) = %q, %v; want %q", c.want, body, err, c.body)
		}
	}
	if diff := cmp.Diff(etcdstore.SealOverhead, 5); diff != "" {
		t.Error(diff)
	}
}
