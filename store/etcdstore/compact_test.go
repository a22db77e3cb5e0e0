package etcdstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// TestStore_FencedOffStoreCannotTrimOrPutBytes: a trim and a byte value
// staged by a store whose fence no longer holds are refused by etcd with
// the scope's other writes; the entries and the new owner's value stay.
func TestStore_FencedOffStoreCannotTrimOrPutBytes(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true}
	s := open(t, o)
	fence := o.Prefix + "own/a"
	s.SetFence("a", etcdstore.Fence{Key: fence, CreateRevision: claim(t, fence)})
	for seq := range uint64(5) {
		mustAppend(t, s, "a/log", fmt.Sprint(seq), seq)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() error: %v", err)
	}

	// Another owner takes "a" and writes a checkpoint.
	deleteKey(t, fence)
	newRev := claim(t, fence)
	owner := open(t, etcdstore.Options{Prefix: o.Prefix, Scope: byFirstSegment, RequireFence: true})
	owner.SetFence("a", etcdstore.Fence{Key: fence, CreateRevision: newRev})
	if err := owner.PutBytes([]store.Bytes{{Key: "a/ck", Value: []byte("new")}}); err != nil {
		t.Fatalf("PutBytes by the new owner error: %v", err)
	}
	if err := owner.Flush(); err != nil {
		t.Fatalf("Flush() by the new owner error: %v", err)
	}

	if err := s.Trim("a/log", 3); err != nil {
		t.Fatalf("Trim(a/log, 3) error: %v", err)
	}
	if err := s.PutBytes([]store.Bytes{{Key: "a/ck", Value: []byte("stale")}}); err != nil {
		t.Fatalf("PutBytes error: %v", err)
	}
	if err := s.Flush(); !errors.Is(err, etcdstore.ErrFenced) {
		t.Fatalf("Flush() of a fenced-off trim = %v, want ErrFenced", err)
	}
	if got := readAll(t, owner, "a/log"); fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("a/log after a refused trim = %v, want every entry", got)
	}
	if first, err := owner.First("a/log"); err != nil || first != 0 {
		t.Fatalf("First(a/log) = %d, %v, want 0", first, err)
	}
	if v, err := owner.GetBytes("a/ck"); err != nil || string(v) != "new" {
		t.Fatalf("GetBytes(a/ck) = %q, %v, want the new owner's", v, err)
	}
}

// TestStore_BytesWrittenBehindTheStoreConflict: a byte value another writer
// changed after this store loaded the scope is not overwritten; the scope
// fails with ErrConflict and etcd keeps the other writer's value. Values
// the store wrote itself it may write again.
func TestStore_BytesWrittenBehindTheStoreConflict(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment}
	s := open(t, o)
	put := func(st *etcdstore.Store, key, val string) error {
		if err := st.PutBytes([]store.Bytes{{Key: key, Value: []byte(val)}}); err != nil {
			return err
		}
		return st.Flush()
	}
	for i := range 3 {
		if err := put(s, "a/ck", fmt.Sprint("mine", i)); err != nil {
			t.Fatalf("rewriting a value of its own: %v", err)
		}
	}
	other := open(t, o)
	if err := put(other, "a/ck", "theirs"); err != nil {
		t.Fatalf("other writer: %v", err)
	}
	if err := put(s, "a/ck", "mine again"); !errors.Is(err, etcdstore.ErrConflict) || !errors.Is(err, store.ErrFailed) {
		t.Fatalf("overwriting another writer's value = %v, want ErrConflict", err)
	}
	fresh := open(t, o)
	if v, err := fresh.GetBytes("a/ck"); err != nil || string(v) != "theirs" {
		t.Fatalf("GetBytes(a/ck) = %q, %v, want %q", v, err, "theirs")
	}
	// After a Reset the store knows the scope again and may write.
	s.Reset("a")
	if err := put(s, "a/ck", "mine after reset"); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
}

// TestStore_ReadBelowAnotherStoresTrimIsCompacted: a store that never saw
// the trim (another store made it) finds the entries gone in etcd and
// reports the read as compacted, naming the first stored seq, never as
// corrupt.
func TestStore_ReadBelowAnotherStoresTrimIsCompacted(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment}
	s := open(t, o)
	for seq := range uint64(600) {
		mustAppend(t, s, "a/log", fmt.Sprint(seq), seq)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() error: %v", err)
	}
	if _, err := s.Len("a/log"); err != nil {
		t.Fatal(err)
	}
	trimmer := open(t, o)
	if err := trimmer.Trim("a/log", 500); err != nil {
		t.Fatalf("Trim error: %v", err)
	}
	if err := trimmer.Flush(); err != nil {
		t.Fatalf("Flush() error: %v", err)
	}
	for _, offset := range []uint64{0, 300, 499} {
		got, err := s.ReadFrom("a/log", offset, 0)
		var ce *store.CompactedError
		if !errors.As(err, &ce) || ce.First != 500 || ce.Offset != offset {
			t.Fatalf("ReadFrom(a/log, %d) = %d entries, %v, want compacted from 500", offset, len(got), err)
		}
	}
	if got, err := s.ReadFrom("a/log", 500, 0); err != nil || len(got) != 100 || string(got[0].Payload) != "500" {
		t.Fatalf("ReadFrom(a/log, 500) = %d entries, %v, want 100 from 500", len(got), err)
	}
}

// TestStore_ReadPageOfLargeEntriesStaysNearItsBound pages through entries
// of 64 KiB with a 200 KiB bound: every page holds at most what the bound
// allows, and the pages cover the stream exactly once.
func TestStore_ReadPageOfLargeEntriesStaysNearItsBound(t *testing.T) {
	s := open(t, etcdstore.Options{Prefix: prefix()})
	const n, size, bound = 40, 64 << 10, 200 << 10
	for seq := range uint64(n) {
		mustAppend(t, s, "log", string(bytes.Repeat([]byte{byte(seq)}, size)), seq)
		if seq%8 == 7 {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	next := uint64(0)
	for next < n {
		page, err := s.ReadPage("log", next, 0, bound)
		if err != nil {
			t.Fatalf("ReadPage(log, %d) error: %v", next, err)
		}
		if len(page) != bound/size {
			t.Fatalf("ReadPage(log, %d) = %d entries, want %d", next, len(page), bound/size)
		}
		for i, e := range page {
			if e.Seq != next+uint64(i) || len(e.Payload) != size || e.Payload[0] != byte(e.Seq) {
				t.Fatalf("ReadPage(log, %d)[%d] = seq %d, %d bytes", next, i, e.Seq, len(e.Payload))
			}
		}
		next += uint64(len(page))
		if rest := uint64(n) - next; rest < uint64(bound/size) {
			page, err := s.ReadPage("log", next, 0, bound)
			if err != nil || uint64(len(page)) != rest {
				t.Fatalf("ReadPage(log, %d) = %d entries, %v, want %d", next, len(page), err, rest)
			}
			next += rest
		}
	}
}
