// Package storetest is the conformance suite every store.DurableStore
// implementation runs: the in-memory store, the bbolt store, and wrappers
// such as faultstore.
//
// A test package runs it with
//
//	storetest.Run(t, storetest.Harness{
//		Open:    func(t *testing.T) store.DurableStore { ... },
//		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore { ... },
//	})
//
// BenchAppendFlush is the commit-barrier benchmark the file stores share.
package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/participantd/participantd/store"
)

// Harness tells Run how to get stores of the implementation under test.
type Harness struct {
	// Open returns a fresh, empty, open store. Open owns the cleanup of
	// what it returns (typically with t.Cleanup); Run may already have
	// closed the store, so that cleanup must ignore ErrClosed.
	Open func(t *testing.T) store.DurableStore

	// Restart simulates a crash and restart of s, which Run no longer uses:
	// it returns an open store holding exactly the writes a successful
	// Flush covered. For Memory that is Crash; for a file store, Close
	// and open the same file again. Restart owns the cleanup of what it
	// returns, as Open does. Nil skips the tests that need a restart.
	Restart func(t *testing.T, s store.DurableStore) store.DurableStore

	// CrashDuringFlush calls s.Flush with a crash injected at the i-th
	// point of the implementation's write path (for a store over a file
	// system, its i-th file-system call from the Flush on, a write torn
	// at a random byte), then restarts as Restart does. It returns the
	// restarted store, and whether a crash happened: once i is past the
	// last point, the Flush completes and it returns false. Nil skips the
	// tests that need it.
	CrashDuringFlush func(t *testing.T, s store.DurableStore, i int) (restarted store.DurableStore, crashed bool)
}

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name    string
		restart bool
		fn      func(t *testing.T, h Harness)
	}{
		{"AppendAssignsExpectedSeqs", false, testAppendSeqs},
		{"AppendConflictIsTyped", false, testAppendConflict},
		{"AppendRejectsInvalidNames", false, testInvalidNames},
		{"ReadYourAppendsBeforeFlush", false, testReadYourAppends},
		{"ReadFromRanges", false, testReadFromRanges},
		{"LenCountsUnflushed", false, testLen},
		{"FlushOfNothingSucceeds", false, testFlushEmpty},
		{"RestartKeepsExactlyFlushed", true, testRestartKeepsFlushed},
		{"RestartContinuesSeqsGapFree", true, testRestartContinues},
		{"CASSemantics", false, testCAS},
		{"CASRaceHasOneWinner", false, testCASRace},
		{"ScanPrefixAndOrder", false, testScan},
		{"NamespacesAreIndependent", false, testNamespaces},
		{"ReturnedSlicesAreCopies", false, testCopies},
		{"LargePayload", false, testLargePayload},
		{"ManyStreams", false, testManyStreams},
		{"ConcurrentAppendersAndFlushers", false, testConcurrent},
		{"ClosedRefusesEverything", false, testClosed},
		{"ReadPageBoundsBytes", false, testReadPage},
		{"TrimKeepsSeqsAndLen", false, testTrimKeepsSeqs},
		{"TrimOnlyFlushedAndNeverTheLast", false, testTrimRange},
		{"TrimSurvivesRestart", true, testTrimSurvivesRestart},
		{"TrimLostInCrashLeavesValidEntries", true, testTrimLostInCrashLeavesValidEntries},
		{"BytesValues", false, testBytes},
		{"BytesSurviveRestart", true, testBytesSurviveRestart},
		{"ClosedRefusesCompaction", false, testCompactorClosed},
		{"FlushBatchIsAtomicAfterACrash", false, testBatchAtomic},
		{"OwnedAppendsAndBufferedPages", true, testOwnedAndBuffered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.restart && h.Restart == nil {
				t.Skip("harness has no Restart")
			}
			if tt.name == "FlushBatchIsAtomicAfterACrash" && h.CrashDuringFlush == nil {
				t.Skip("harness has no CrashDuringFlush")
			}
			tt.fn(t, h)
		})
	}
}

// mustAppend appends payload at want and fails the test otherwise.
func mustAppend(t *testing.T, s store.DurableStore, stream string, payload []byte, want uint64) {
	t.Helper()
	got, err := s.Append(stream, payload, want)
	if err != nil {
		t.Fatalf("Append(%q, seq=%d) error: %v", stream, want, err)
	}
	if got != want {
		t.Fatalf("Append(%q, seq=%d) = %d, want %d", stream, want, got, want)
	}
}

func mustFlush(t *testing.T, s store.DurableStore) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() error: %v", err)
	}
}

func mustCAS(t *testing.T, s store.DurableStore, key string, old, new uint64) {
	t.Helper()
	if err := s.CAS(key, old, new); err != nil {
		t.Fatalf("CAS(%q, %d, %d) error: %v", key, old, new, err)
	}
}

// payload returns a payload that names its stream and seq.
func payload(stream string, seq uint64) []byte {
	return []byte(fmt.Sprintf("%s#%d", stream, seq))
}

// checkStream fails unless stream holds exactly want, read whole.
func checkStream(t *testing.T, s store.DurableStore, stream string, want [][]byte) {
	t.Helper()
	if n, err := s.Len(stream); err != nil || n != uint64(len(want)) {
		t.Fatalf("Len(%q) = %d, %v, want %d, nil", stream, n, err, len(want))
	}
	got, err := s.ReadFrom(stream, 0, 0)
	if err != nil {
		t.Fatalf("ReadFrom(%q, 0, 0) error: %v", stream, err)
	}
	if len(got) != len(want) {
		t.Fatalf("ReadFrom(%q, 0, 0) returned %d entries, want %d", stream, len(got), len(want))
	}
	for i, e := range got {
		if e.Seq != uint64(i) || !bytes.Equal(e.Payload, want[i]) {
			t.Fatalf("ReadFrom(%q)[%d] = {%d, %.40q}, want {%d, %.40q}", stream, i, e.Seq, e.Payload, i, want[i])
		}
	}
}

func checkValue(t *testing.T, s store.DurableStore, key string, want uint64) {
	t.Helper()
	if got, err := s.ReadValue(key); err != nil || got != want {
		t.Fatalf("ReadValue(%q) = %d, %v, want %d, nil", key, got, err, want)
	}
}

func testAppendSeqs(t *testing.T, h Harness) {
	s := h.Open(t)
	for seq := uint64(0); seq < 5; seq++ {
		mustAppend(t, s, "s", payload("s", seq), seq)
	}
	mustFlush(t, s)
	mustAppend(t, s, "s", payload("s", 5), 5)
}

func testAppendConflict(t *testing.T, h Harness) {
	s := h.Open(t)
	mustAppend(t, s, "s", []byte("a"), 0)
	mustAppend(t, s, "s", []byte("b"), 1)
	for _, expected := range []uint64{0, 1, 3, 1 << 63} {
		t.Run(fmt.Sprintf("expected=%d", expected), func(t *testing.T) {
			seq, err := s.Append("s", []byte("x"), expected)
			if !errors.Is(err, store.ErrSequenceConflict) {
				t.Fatalf("Append(seq=%d) = %d, %v, want ErrSequenceConflict", expected, seq, err)
			}
			var sc *store.SequenceConflictError
			if !errors.As(err, &sc) {
				t.Fatalf("Append(seq=%d) error %T is not *SequenceConflictError", expected, err)
			}
			if sc.Stream != "s" || sc.Expected != expected || sc.Actual != 2 {
				t.Errorf("conflict = {%q, Expected %d, Actual %d}, want {\"s\", %d, 2}", sc.Stream, sc.Expected, sc.Actual, expected)
			}
		})
	}
	// A conflict writes nothing.
	checkStream(t, s, "s", [][]byte{[]byte("a"), []byte("b")})
}

func testInvalidNames(t *testing.T, h Harness) {
	s := h.Open(t)
	long := string(bytes.Repeat([]byte("n"), store.MaxNameLen+1))
	for _, name := range []string{"", long} {
		if _, err := s.Append(name, []byte("x"), 0); !errors.Is(err, store.ErrInvalidName) {
			t.Errorf("Append(name of %d bytes) error = %v, want ErrInvalidName", len(name), err)
		}
		if err := s.CAS(name, 0, 1); !errors.Is(err, store.ErrInvalidName) {
			t.Errorf("CAS(name of %d bytes) error = %v, want ErrInvalidName", len(name), err)
		}
	}
	// Refused writes stage nothing: a Flush still succeeds.
	mustFlush(t, s)
	maxName := string(bytes.Repeat([]byte("n"), store.MaxNameLen))
	mustAppend(t, s, maxName, []byte("x"), 0)
	mustCAS(t, s, maxName, 0, 1)
	mustFlush(t, s)
}

func testReadYourAppends(t *testing.T, h Harness) {
	s := h.Open(t)
	var want [][]byte
	for seq := uint64(0); seq < 3; seq++ {
		mustAppend(t, s, "s", payload("s", seq), seq)
		want = append(want, payload("s", seq))
		checkStream(t, s, "s", want)
	}
	// Part flushed, part staged: reads merge both.
	mustFlush(t, s)
	for seq := uint64(3); seq < 6; seq++ {
		mustAppend(t, s, "s", payload("s", seq), seq)
		want = append(want, payload("s", seq))
		checkStream(t, s, "s", want)
	}
}

func testReadFromRanges(t *testing.T, h Harness) {
	s := h.Open(t)
	// Entries 0..2 flushed, 3..5 staged, so ranges straddle the boundary.
	for seq := uint64(0); seq < 6; seq++ {
		mustAppend(t, s, "s", payload("s", seq), seq)
		if seq == 2 {
			mustFlush(t, s)
		}
	}
	tests := []struct {
		name   string
		stream string
		offset uint64
		limit  int
		want   []uint64
	}{
		{"all", "s", 0, 0, []uint64{0, 1, 2, 3, 4, 5}},
		{"negative limit is no limit", "s", 0, -1, []uint64{0, 1, 2, 3, 4, 5}},
		{"flushed only", "s", 0, 2, []uint64{0, 1}},
		{"straddling", "s", 1, 3, []uint64{1, 2, 3}},
		{"staged only", "s", 4, 1, []uint64{4}},
		{"limit past end", "s", 4, 10, []uint64{4, 5}},
		{"at end", "s", 6, 0, nil},
		{"past end", "s", 100, 1, nil},
		{"huge offset and limit", "s", 1<<64 - 1, 1 << 30, nil},
		{"absent stream", "absent", 0, 0, nil},
		{"prefix of a stream name", "", 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.ReadFrom(tt.stream, tt.offset, tt.limit)
			if err != nil {
				t.Fatalf("ReadFrom(%q, %d, %d) error: %v", tt.stream, tt.offset, tt.limit, err)
			}
			var seqs []uint64
			for _, e := range got {
				seqs = append(seqs, e.Seq)
				if want := payload(tt.stream, e.Seq); !bytes.Equal(e.Payload, want) {
					t.Errorf("ReadFrom(%q, %d, %d) seq %d payload = %q, want %q", tt.stream, tt.offset, tt.limit, e.Seq, e.Payload, want)
				}
			}
			if fmt.Sprint(seqs) != fmt.Sprint(tt.want) {
				t.Errorf("ReadFrom(%q, %d, %d) seqs = %v, want %v", tt.stream, tt.offset, tt.limit, seqs, tt.want)
			}
		})
	}
}

func testLen(t *testing.T, h Harness) {
	s := h.Open(t)
	if n, err := s.Len("absent"); err != nil || n != 0 {
		t.Fatalf("Len(absent) = %d, %v, want 0, nil", n, err)
	}
	for seq := uint64(0); seq < 4; seq++ {
		mustAppend(t, s, "s", nil, seq)
		if n, err := s.Len("s"); err != nil || n != seq+1 {
			t.Fatalf("Len after Append(seq=%d) = %d, %v, want %d, nil", seq, n, err, seq+1)
		}
		if seq == 1 {
			mustFlush(t, s)
		}
	}
	// An empty payload is an entry like any other.
	checkStream(t, s, "s", [][]byte{nil, nil, nil, nil})
}

func testFlushEmpty(t *testing.T, h Harness) {
	s := h.Open(t)
	mustFlush(t, s)
	mustFlush(t, s)
	mustAppend(t, s, "s", []byte("x"), 0)
	mustFlush(t, s)
	mustFlush(t, s)
}

func testRestartKeepsFlushed(t *testing.T, h Harness) {
	s := h.Open(t)
	mustAppend(t, s, "kept", []byte("k0"), 0)
	mustAppend(t, s, "kept", []byte("k1"), 1)
	mustCAS(t, s, "v/kept", 0, 7)
	mustCAS(t, s, "v/deleted", 0, 9)
	mustFlush(t, s)
	mustCAS(t, s, "v/deleted", 9, 0)
	mustFlush(t, s)

	// Staged only: lost at the restart.
	mustAppend(t, s, "kept", []byte("lost"), 2)
	mustAppend(t, s, "lost", []byte("lost"), 0)
	mustCAS(t, s, "v/kept", 7, 8)
	mustCAS(t, s, "v/lost", 0, 1)
	mustCAS(t, s, "v/deleted", 0, 3)

	s = h.Restart(t, s)
	checkStream(t, s, "kept", [][]byte{[]byte("k0"), []byte("k1")})
	checkStream(t, s, "lost", nil)
	checkValue(t, s, "v/kept", 7)
	checkValue(t, s, "v/lost", 0)
	checkValue(t, s, "v/deleted", 0)
	vals, err := s.Scan("v/")
	if err != nil {
		t.Fatalf("Scan(v/) error: %v", err)
	}
	if want := []store.Value{{Key: "v/kept", Value: 7}}; fmt.Sprint(vals) != fmt.Sprint(want) {
		t.Fatalf("Scan(v/) = %v, want %v", vals, want)
	}
}

func testRestartContinues(t *testing.T, h Harness) {
	s := h.Open(t)
	var want [][]byte
	for round := 0; round < 3; round++ {
		n := uint64(len(want))
		mustAppend(t, s, "s", payload("s", n), n)
		mustAppend(t, s, "s", payload("s", n+1), n+1)
		mustFlush(t, s)
		want = append(want, payload("s", n), payload("s", n+1))
		mustAppend(t, s, "s", []byte("lost"), n+2)
		s = h.Restart(t, s)
		checkStream(t, s, "s", want)
	}
}

func testCAS(t *testing.T, h Harness) {
	s := h.Open(t)
	checkValue(t, s, "k", 0)
	mustCAS(t, s, "k", 0, 5)
	checkValue(t, s, "k", 5)

	conflicts := []struct {
		name     string
		old, new uint64
	}{
		{"stale old", 3, 6},
		{"create when present", 0, 6},
		{"delete with wrong old", 4, 0},
	}
	for _, tt := range conflicts {
		t.Run(tt.name, func(t *testing.T) {
			err := s.CAS("k", tt.old, tt.new)
			if !errors.Is(err, store.ErrCASConflict) {
				t.Fatalf("CAS(k, %d, %d) = %v, want ErrCASConflict", tt.old, tt.new, err)
			}
			var ce *store.CASConflictError
			if !errors.As(err, &ce) {
				t.Fatalf("CAS(k, %d, %d) error %T is not *CASConflictError", tt.old, tt.new, err)
			}
			if ce.Key != "k" || ce.Expected != tt.old || ce.Actual != 5 {
				t.Errorf("conflict = {%q, Expected %d, Actual %d}, want {\"k\", %d, 5}", ce.Key, ce.Expected, ce.Actual, tt.old)
			}
			checkValue(t, s, "k", 5)
		})
	}

	mustFlush(t, s)
	mustCAS(t, s, "k", 5, 5) // same value: allowed, changes nothing
	mustCAS(t, s, "k", 5, 6)
	checkValue(t, s, "k", 6)
	mustFlush(t, s)
	mustCAS(t, s, "k", 6, 0) // back to 0 deletes
	checkValue(t, s, "k", 0)
	if vals, err := s.Scan(""); err != nil || len(vals) != 0 {
		t.Fatalf("Scan(\"\") after delete = %v, %v, want none", vals, err)
	}
	mustCAS(t, s, "k", 0, 1)
	checkValue(t, s, "k", 1)
}

func testCASRace(t *testing.T, h Harness) {
	s := h.Open(t)
	const rounds, racers = 20, 16
	for round := uint64(0); round < rounds; round++ {
		errs := make(chan error, racers)
		start := make(chan struct{})
		for range racers {
			go func() {
				<-start
				errs <- s.CAS("counter", round, round+1)
			}()
		}
		close(start)
		winners := 0
		for range racers {
			err := <-errs
			var ce *store.CASConflictError
			switch {
			case err == nil:
				winners++
			case errors.As(err, &ce):
				if ce.Actual != round+1 {
					t.Errorf("round %d: losing CAS saw Actual %d, want %d", round, ce.Actual, round+1)
				}
			default:
				t.Fatalf("round %d: CAS error: %v", round, err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d CAS winners, want 1", round, winners)
		}
		if round%4 == 0 {
			mustFlush(t, s)
		}
	}
	checkValue(t, s, "counter", rounds)
}

func testScan(t *testing.T, h Harness) {
	s := h.Open(t)
	// Some values flushed, some staged, one flushed then deleted, one
	// flushed then changed: Scan must merge them all.
	mustCAS(t, s, "a/2", 0, 2)
	mustCAS(t, s, "b/1", 0, 11)
	mustCAS(t, s, "a/gone", 0, 9)
	mustCAS(t, s, "a/changed", 0, 1)
	mustFlush(t, s)
	mustCAS(t, s, "a/1", 0, 1)
	mustCAS(t, s, "a/10", 0, 10)
	mustCAS(t, s, "ab", 0, 12)
	mustCAS(t, s, "a", 0, 13)
	mustCAS(t, s, "a/gone", 9, 0)
	mustCAS(t, s, "a/changed", 1, 4)
	tests := []struct {
		prefix string
		want   []store.Value
	}{
		{"a/", []store.Value{{Key: "a/1", Value: 1}, {Key: "a/10", Value: 10}, {Key: "a/2", Value: 2}, {Key: "a/changed", Value: 4}}},
		{"a/1", []store.Value{{Key: "a/1", Value: 1}, {Key: "a/10", Value: 10}}},
		{"a", []store.Value{{Key: "a", Value: 13}, {Key: "a/1", Value: 1}, {Key: "a/10", Value: 10}, {Key: "a/2", Value: 2}, {Key: "a/changed", Value: 4}, {Key: "ab", Value: 12}}},
		{"b", []store.Value{{Key: "b/1", Value: 11}}},
		{"", []store.Value{{Key: "a", Value: 13}, {Key: "a/1", Value: 1}, {Key: "a/10", Value: 10}, {Key: "a/2", Value: 2}, {Key: "a/changed", Value: 4}, {Key: "ab", Value: 12}, {Key: "b/1", Value: 11}}},
		{"c", nil},
		{"a/gone", nil},
	}
	check := func(t *testing.T) {
		for _, tt := range tests {
			got, err := s.Scan(tt.prefix)
			if err != nil {
				t.Fatalf("Scan(%q) error: %v", tt.prefix, err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Scan(%q) = %v, want %v", tt.prefix, got, tt.want)
			}
		}
	}
	t.Run("staged", check)
	mustFlush(t, s)
	t.Run("flushed", check)
}

func testNamespaces(t *testing.T, h Harness) {
	s := h.Open(t)
	mustAppend(t, s, "x", []byte("stream x"), 0)
	mustCAS(t, s, "x", 0, 42)
	mustAppend(t, s, "x/y", []byte("stream x/y"), 0)
	mustAppend(t, s, "x/y", []byte("stream x/y"), 1)
	mustAppend(t, s, "xx", []byte("stream xx"), 0)
	for _, flushed := range []bool{false, true} {
		checkStream(t, s, "x", [][]byte{[]byte("stream x")})
		checkStream(t, s, "x/y", [][]byte{[]byte("stream x/y"), []byte("stream x/y")})
		checkStream(t, s, "xx", [][]byte{[]byte("stream xx")})
		checkValue(t, s, "x", 42)
		checkValue(t, s, "x/y", 0)
		if vals, err := s.Scan("x"); err != nil || len(vals) != 1 {
			t.Fatalf("Scan(x) (flushed=%t) = %v, %v, want only the value x", flushed, vals, err)
		}
		mustFlush(t, s)
	}
}

func testCopies(t *testing.T, h Harness) {
	s := h.Open(t)
	p := []byte("original")
	mustAppend(t, s, "s", p, 0)
	copy(p, "XXXXXXXX")
	mustCAS(t, s, "k", 0, 1)
	for _, phase := range []string{"staged", "flushed"} {
		t.Run(phase, func(t *testing.T) {
			got, err := s.ReadFrom("s", 0, 0)
			if err != nil || len(got) != 1 {
				t.Fatalf("ReadFrom(s) = %v, %v, want one entry", got, err)
			}
			copy(got[0].Payload, "YYYYYYYY")
			got[0].Seq = 99
			vals, err := s.Scan("")
			if err != nil || len(vals) != 1 {
				t.Fatalf("Scan() = %v, %v, want one value", vals, err)
			}
			vals[0].Value = 99
			vals[0].Key = "changed"
			checkStream(t, s, "s", [][]byte{[]byte("original")})
			checkValue(t, s, "k", 1)
			if vals, _ := s.Scan(""); fmt.Sprint(vals) != fmt.Sprint([]store.Value{{Key: "k", Value: 1}}) {
				t.Fatalf("Scan() after mutating a result = %v, want [{k 1}]", vals)
			}
		})
		mustFlush(t, s)
	}
}

func testLargePayload(t *testing.T, h Harness) {
	s := h.Open(t)
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>8)
	}
	mustAppend(t, s, "big", big, 0)
	mustAppend(t, s, "big", []byte("after"), 1)
	want := [][]byte{big, []byte("after")}
	checkStream(t, s, "big", want)
	mustFlush(t, s)
	checkStream(t, s, "big", want)
	if h.Restart != nil {
		s = h.Restart(t, s)
		checkStream(t, s, "big", want)
	}
}

func testManyStreams(t *testing.T, h Harness) {
	s := h.Open(t)
	const n = 10000
	name := func(i int) string { return fmt.Sprintf("conv/%05d", i) }
	for i := range n {
		mustAppend(t, s, name(i), payload(name(i), 0), 0)
		if i%2 == 0 {
			mustAppend(t, s, name(i), payload(name(i), 1), 1)
		}
	}
	mustFlush(t, s)
	check := func(t *testing.T) {
		for i := range n {
			want := uint64(1 + (i+1)%2)
			if got, err := s.Len(name(i)); err != nil || got != want {
				t.Fatalf("Len(%q) = %d, %v, want %d, nil", name(i), got, err, want)
			}
			e, err := s.ReadFrom(name(i), want-1, 1)
			if err != nil || len(e) != 1 || !bytes.Equal(e[0].Payload, payload(name(i), want-1)) {
				t.Fatalf("ReadFrom(%q, %d, 1) = %v, %v, want its last entry", name(i), want-1, e, err)
			}
		}
	}
	check(t)
	if h.Restart != nil {
		s = h.Restart(t, s)
		check(t)
	}
}

func testClosed(t *testing.T, h Harness) {
	s := h.Open(t)
	mustAppend(t, s, "s", []byte("x"), 0)
	mustCAS(t, s, "k", 0, 1)
	mustFlush(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close() error: %v", err)
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"Append", func() error { _, err := s.Append("s", []byte("y"), 1); return err }},
		{"ReadFrom", func() error { _, err := s.ReadFrom("s", 0, 0); return err }},
		{"Len", func() error { _, err := s.Len("s"); return err }},
		{"CAS", func() error { return s.CAS("k", 1, 2) }},
		{"ReadValue", func() error { _, err := s.ReadValue("k"); return err }},
		{"Scan", func() error { _, err := s.Scan(""); return err }},
		{"Flush", s.Flush},
		{"Close", s.Close},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", c.name, err)
		}
	}
}

// testBatchAtomic crashes a Flush at every point of the store's write path
// and checks that the batch it carried survives whole or not at all, over
// what an earlier Flush made durable.
func testBatchAtomic(t *testing.T, h Harness) {
	type state struct {
		Streams map[string]int
		Values  map[string]uint64
	}
	read := func(s store.DurableStore) state {
		st := state{Streams: map[string]int{}, Values: map[string]uint64{}}
		for _, name := range []string{"a", "b", "c"} {
			n, err := s.Len(name)
			if err != nil {
				t.Fatalf("Len(%s) error: %v", name, err)
			}
			st.Streams[name] = int(n)
			checkStream(t, s, name, payloads(name, int(n)))
		}
		for _, key := range []string{"k", "j"} {
			v, err := s.ReadValue(key)
			if err != nil {
				t.Fatalf("ReadValue(%s) error: %v", key, err)
			}
			st.Values[key] = v
		}
		return st
	}
	before := state{Streams: map[string]int{"a": 1, "b": 0, "c": 0}, Values: map[string]uint64{"k": 1, "j": 0}}
	after := state{Streams: map[string]int{"a": 2, "b": 1, "c": 5}, Values: map[string]uint64{"k": 2, "j": 7}}
	crashes := 0
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatalf("CrashDuringFlush still crashed at point %d", i)
		}
		s := h.Open(t)
		mustAppend(t, s, "a", payload("a", 0), 0)
		mustCAS(t, s, "k", 0, 1)
		mustFlush(t, s)
		// The batch: appends to three streams, one of them new, and two
		// value writes, one creating its key.
		mustAppend(t, s, "a", payload("a", 1), 1)
		mustAppend(t, s, "b", payload("b", 0), 0)
		for seq := range 5 {
			mustAppend(t, s, "c", payload("c", uint64(seq)), uint64(seq))
		}
		mustCAS(t, s, "k", 1, 2)
		mustCAS(t, s, "j", 0, 7)
		r, crashed := h.CrashDuringFlush(t, s, i)
		got := read(r)
		if !crashed {
			if diff := cmpState(after, got); diff != "" {
				t.Fatalf("after a Flush that completed: %s", diff)
			}
			break
		}
		crashes++
		if cmpState(before, got) != "" && cmpState(after, got) != "" {
			t.Fatalf("crash at point %d kept part of the batch: got %+v, want %+v or %+v", i, got, before, after)
		}
	}
	if crashes == 0 {
		t.Fatalf("CrashDuringFlush never crashed")
	}
}

func payloads(stream string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = payload(stream, uint64(i))
	}
	return out
}

func cmpState(want, got any) string {
	w, g := fmt.Sprintf("%+v", want), fmt.Sprintf("%+v", got)
	if w == g {
		return ""
	}
	return fmt.Sprintf("state %s, want %s", g, w)
}

// testOwnedAndBuffered appends through store.AppendOwned, payloads with
// the room an owned payload may be sealed in and without it, and reads
// them back through store.ReadPageBuffered, staged, flushed and after a
// restart: every page equals ReadPage's, a buffered page is never
// changed by the store, and a payload without room is not written past
// its length (the store copied it).
func testOwnedAndBuffered(t *testing.T, h Harness) {
	s := h.Open(t)
	const n = 40
	payload := func(i int) []byte {
		p := bytes.Repeat([]byte{byte(i)}, 100+i*977%5000)
		return append(p, fmt.Sprint(i)...)
	}
	var want [][]byte
	var tight [][]byte
	for i := range n {
		p := payload(i)
		want = append(want, p)
		var given []byte
		if i%2 == 0 {
			given = make([]byte, len(p), len(p)+store.SealRoom)
			copy(given, p)
		} else {
			// No room: the store must copy, never write past len.
			whole := make([]byte, len(p)+store.SealRoom)
			copy(whole, p)
			given = whole[:len(p):len(p)]
			tight = append(tight, whole)
		}
		if got, err := store.AppendOwned(s, "owned", given, uint64(i)); err != nil || got != uint64(i) {
			t.Fatalf("AppendOwned(owned, %d) = %d, %v", i, got, err)
		}
		if i == n/2 {
			mustFlush(t, s)
		}
	}
	check := func(t *testing.T, s store.DurableStore) {
		t.Helper()
		var buf store.PageBuffer
		var got [][]byte
		for off := uint64(0); off < n; {
			page, err := store.ReadPageBuffered(s, "owned", off, 7, 16<<10, &buf)
			if err != nil || len(page) == 0 || page[0].Seq != off {
				t.Fatalf("ReadPageBuffered(owned, %d) = %d entries, %v", off, len(page), err)
			}
			plain, err := store.ReadPage(s, "owned", off, 7, 16<<10)
			if err != nil || len(plain) != len(page) {
				t.Fatalf("ReadPage(owned, %d) = %d entries, %v; the buffered page has %d", off, len(plain), err, len(page))
			}
			for k := range page {
				if page[k].Seq != plain[k].Seq || !bytes.Equal(page[k].Payload, plain[k].Payload) {
					t.Fatalf("buffered entry %d differs from ReadPage's", page[k].Seq)
				}
				got = append(got, bytes.Clone(page[k].Payload))
			}
			off += uint64(len(page))
		}
		if len(got) != n {
			t.Fatalf("read %d entries, want %d", len(got), n)
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("entry %d = %d bytes, want %d", i, len(got[i]), len(want[i]))
			}
		}
	}
	t.Run("staged", func(t *testing.T) { check(t, s) })
	mustFlush(t, s)
	t.Run("flushed", func(t *testing.T) { check(t, s) })
	for i, g := range tight {
		if !bytes.Equal(g[len(g)-store.SealRoom:], make([]byte, store.SealRoom)) {
			t.Errorf("the store wrote past the length of payload %d, which had no spare capacity", 2*i+1)
		}
	}
	s = h.Restart(t, s)
	t.Run("restarted", func(t *testing.T) { check(t, s) })
}
