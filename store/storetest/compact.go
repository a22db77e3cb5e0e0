package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/participantd/participantd/store"
)

// compactor returns s as a store.Compactor, or skips the test.
func compactor(t *testing.T, s store.DurableStore) store.Compactor {
	t.Helper()
	c, ok := store.AsCompactor(s)
	if !ok {
		t.Skip("store does not implement store.Compactor")
	}
	return c
}

func checkFirst(t *testing.T, c store.Compactor, stream string, want uint64) {
	t.Helper()
	if got, err := c.First(stream); err != nil || got != want {
		t.Fatalf("First(%q) = %d, %v, want %d, nil", stream, got, err, want)
	}
}

// checkCompacted fails unless reading stream at offset is refused as
// compacted, naming first.
func checkCompacted(t *testing.T, s store.DurableStore, stream string, offset uint64, limit int, first uint64) {
	t.Helper()
	reads := map[string]func() ([]store.Entry, error){
		"ReadFrom": func() ([]store.Entry, error) { return s.ReadFrom(stream, offset, limit) },
	}
	if pr, ok := s.(store.PageReader); ok {
		reads["ReadPage"] = func() ([]store.Entry, error) { return pr.ReadPage(stream, offset, limit, 1<<20) }
	}
	for name, read := range reads {
		got, err := read()
		var ce *store.CompactedError
		if !errors.As(err, &ce) || !errors.Is(err, store.ErrCompacted) {
			t.Fatalf("%s(%q, %d, %d) = %d entries, %v, want a *CompactedError", name, stream, offset, limit, len(got), err)
		}
		if ce.First != first || ce.Offset != offset || ce.Stream != stream {
			t.Fatalf("%s(%q, %d, %d) error = %+v, want first %d", name, stream, offset, limit, ce, first)
		}
	}
}

// checkSeqs fails unless ReadFrom(stream, offset, 0) returns exactly the
// entries from offset to end, with the payloads they were appended with.
func checkSeqs(t *testing.T, s store.DurableStore, stream string, offset, end uint64) {
	t.Helper()
	got, err := s.ReadFrom(stream, offset, 0)
	if err != nil {
		t.Fatalf("ReadFrom(%q, %d, 0) error: %v", stream, offset, err)
	}
	if uint64(len(got)) != end-offset {
		t.Fatalf("ReadFrom(%q, %d, 0) returned %d entries, want %d", stream, offset, len(got), end-offset)
	}
	for i, e := range got {
		seq := offset + uint64(i)
		if e.Seq != seq || !bytes.Equal(e.Payload, payload(stream, seq)) {
			t.Fatalf("ReadFrom(%q, %d, 0)[%d] = {%d, %q}, want {%d, %q}", stream, offset, i, e.Seq, e.Payload, seq, payload(stream, seq))
		}
	}
}

func testTrimKeepsSeqs(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	for seq := range uint64(10) {
		mustAppend(t, s, "s", payload("s", seq), seq)
		mustAppend(t, s, "other", payload("other", seq), seq)
	}
	mustFlush(t, s)
	checkFirst(t, c, "s", 0)
	checkFirst(t, c, "absent", 0)
	if err := c.Trim("s", 4); err != nil {
		t.Fatalf("Trim(s, 4) error: %v", err)
	}
	checkFirst(t, c, "s", 4)
	if n, err := s.Len("s"); err != nil || n != 10 {
		t.Fatalf("Len(s) after Trim = %d, %v, want 10, nil", n, err)
	}
	checkSeqs(t, s, "s", 4, 10)
	checkCompacted(t, s, "s", 0, 0, 4)
	checkCompacted(t, s, "s", 3, 1, 4)
	// A trim is a no-op at or below First, and touches no other stream.
	for _, below := range []uint64{0, 2, 4} {
		if err := c.Trim("s", below); err != nil {
			t.Fatalf("Trim(s, %d) below First error: %v", below, err)
		}
	}
	checkFirst(t, c, "s", 4)
	checkFirst(t, c, "other", 0)
	checkSeqs(t, s, "other", 0, 10)
	// Appends continue at Len.
	mustAppend(t, s, "s", payload("s", 10), 10)
	mustFlush(t, s)
	checkSeqs(t, s, "s", 4, 11)
	if err := c.Trim("s", 10); err != nil {
		t.Fatalf("Trim(s, 10) error: %v", err)
	}
	checkSeqs(t, s, "s", 10, 11)
	checkCompacted(t, s, "s", 9, 0, 10)
}

func testTrimRange(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	for seq := range uint64(5) {
		mustAppend(t, s, "s", payload("s", seq), seq)
	}
	mustFlush(t, s)
	for seq := uint64(5); seq < 8; seq++ {
		mustAppend(t, s, "s", payload("s", seq), seq)
	}
	// 5 flushed, 3 staged: the last flushed entry and anything staged stay.
	for _, below := range []uint64{5, 6, 8, 9} {
		if err := c.Trim("s", below); !errors.Is(err, store.ErrTrimRange) {
			t.Fatalf("Trim(s, %d) with 5 flushed of 8 = %v, want ErrTrimRange", below, err)
		}
	}
	if err := c.Trim("absent", 1); !errors.Is(err, store.ErrTrimRange) {
		t.Fatalf("Trim(absent, 1) = %v, want ErrTrimRange", err)
	}
	checkFirst(t, c, "s", 0)
	checkSeqs(t, s, "s", 0, 8)
	if err := c.Trim("s", 4); err != nil {
		t.Fatalf("Trim(s, 4) error: %v", err)
	}
	checkSeqs(t, s, "s", 4, 8)
}

func testTrimSurvivesRestart(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	for seq := range uint64(6) {
		mustAppend(t, s, "s", payload("s", seq), seq)
	}
	mustFlush(t, s)
	if err := c.Trim("s", 3); err != nil {
		t.Fatalf("Trim(s, 3) error: %v", err)
	}
	mustFlush(t, s)
	s = h.Restart(t, s)
	c = compactor(t, s)
	checkFirst(t, c, "s", 3)
	checkSeqs(t, s, "s", 3, 6)
	checkCompacted(t, s, "s", 1, 2, 3)
	mustAppend(t, s, "s", payload("s", 6), 6)
	mustFlush(t, s)
	checkSeqs(t, s, "s", 3, 7)
}

func testTrimLostInCrashLeavesValidEntries(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	for seq := range uint64(6) {
		mustAppend(t, s, "s", payload("s", seq), seq)
	}
	mustFlush(t, s)
	if err := c.Trim("s", 3); err != nil {
		t.Fatalf("Trim(s, 3) error: %v", err)
	}
	// No Flush: the trim may or may not have survived, and what remains
	// reads as it was appended.
	s = h.Restart(t, s)
	c = compactor(t, s)
	first, err := c.First("s")
	if err != nil || (first != 0 && first != 3) {
		t.Fatalf("First(s) after an unflushed trim and a crash = %d, %v, want 0 or 3", first, err)
	}
	checkSeqs(t, s, "s", first, 6)
}

func testBytes(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	if v, err := c.GetBytes("k"); err != nil || v != nil {
		t.Fatalf("GetBytes(absent) = %q, %v, want nil, nil", v, err)
	}
	val := []byte("checkpoint")
	if err := c.PutBytes([]store.Bytes{{Key: "k", Value: val}, {Key: "k2", Value: []byte{0}}}); err != nil {
		t.Fatalf("PutBytes error: %v", err)
	}
	val[0] = 'X' // the store kept its own copy
	got, err := c.GetBytes("k")
	if err != nil || string(got) != "checkpoint" {
		t.Fatalf("GetBytes(k) = %q, %v, want %q", got, err, "checkpoint")
	}
	got[0] = 'Y' // and returned one the caller owns
	if again, _ := c.GetBytes("k"); string(again) != "checkpoint" {
		t.Fatalf("GetBytes(k) after modifying a returned value = %q", again)
	}
	// Byte values and uint64 values are separate namespaces.
	checkValue(t, s, "k", 0)
	mustCAS(t, s, "k", 0, 7)
	if got, _ := c.GetBytes("k"); string(got) != "checkpoint" {
		t.Fatalf("GetBytes(k) after CAS(k) = %q, want %q", got, "checkpoint")
	}
	// An empty value deletes; a replaced value reads as the new one.
	if err := c.PutBytes([]store.Bytes{{Key: "k", Value: nil}, {Key: "k2", Value: []byte("two")}}); err != nil {
		t.Fatalf("PutBytes error: %v", err)
	}
	if v, err := c.GetBytes("k"); err != nil || v != nil {
		t.Fatalf("GetBytes(k) after deleting = %q, %v, want nil, nil", v, err)
	}
	if v, _ := c.GetBytes("k2"); string(v) != "two" {
		t.Fatalf("GetBytes(k2) = %q, want %q", v, "two")
	}
	// Bad names are refused whole.
	err = c.PutBytes([]store.Bytes{{Key: "ok", Value: []byte("x")}, {Key: "", Value: []byte("x")}})
	if !errors.Is(err, store.ErrInvalidName) {
		t.Fatalf("PutBytes with an empty key = %v, want ErrInvalidName", err)
	}
	if v, _ := c.GetBytes("ok"); v != nil {
		t.Fatalf("GetBytes(ok) after a refused PutBytes = %q, want nil", v)
	}
}

func testBytesSurviveRestart(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	var values []store.Bytes
	for i := range 50 {
		values = append(values, store.Bytes{Key: fmt.Sprintf("receipt/%03d", i), Value: bytes.Repeat([]byte{byte(i)}, 1+i)})
	}
	if err := c.PutBytes(values); err != nil {
		t.Fatalf("PutBytes error: %v", err)
	}
	mustFlush(t, s)
	s = h.Restart(t, s)
	c = compactor(t, s)
	for _, v := range values {
		got, err := c.GetBytes(v.Key)
		if err != nil || !bytes.Equal(got, v.Value) {
			t.Fatalf("GetBytes(%q) after restart = %x, %v, want %x", v.Key, got, err, v.Value)
		}
	}
}

func testCompactorClosed(t *testing.T, h Harness) {
	s := h.Open(t)
	c := compactor(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close() error: %v", err)
	}
	for name, call := range map[string]func() error{
		"Trim":     func() error { return c.Trim("s", 1) },
		"First":    func() error { _, err := c.First("s"); return err },
		"PutBytes": func() error { return c.PutBytes([]store.Bytes{{Key: "k", Value: []byte("v")}}) },
		"GetBytes": func() error { _, err := c.GetBytes("k"); return err },
	} {
		if err := call(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
}
