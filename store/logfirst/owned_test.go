package logfirst_test

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// TestAppendOwned_KeepsThePayloadItIsGiven appends 64 KiB payloads with
// the room a checkpoint seals them in, through Append and through
// store.AppendOwned, and counts the bytes each allocates: Append copies
// every payload (its contract), AppendOwned keeps it, so that a row
// encoded for its append is not copied a second time on the commit path.
// Bytes are counted, not allocations, so that the race detector does not
// matter.
func TestAppendOwned_KeepsThePayloadItIsGiven(t *testing.T) {
	const n, size = 64, 64 << 10
	s := open(t, t.TempDir(), logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64})
	payloads := make([][]byte, 2*n)
	for i := range payloads {
		payloads[i] = make([]byte, size, size+store.SealRoom)
		payloads[i][0] = byte(i)
	}
	alloc := func(stream string, appendOne func(stream string, p []byte, seq uint64) (uint64, error), ps [][]byte) uint64 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i, p := range ps {
			if _, err := appendOne(stream, p, uint64(i)); err != nil {
				t.Fatalf("append %d to %s: %v", i, stream, err)
			}
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	copied := alloc("copied", s.Append, payloads[:n])
	owned := alloc("owned", func(stream string, p []byte, seq uint64) (uint64, error) {
		return store.AppendOwned(s, stream, p, seq)
	}, payloads[n:])
	if copied < n*size {
		t.Fatalf("Append of %d payloads of %d bytes allocated %d bytes: the copies are not counted", n, size, copied)
	}
	if owned > n*size/8 {
		t.Errorf("AppendOwned of %d payloads of %d bytes allocated %d bytes, want at most %d (Append: %d)", n, size, owned, n*size/8, copied)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"copied", "owned"} {
		got, err := s.ReadFrom(stream, 0, 0)
		if err != nil || len(got) != n {
			t.Fatalf("ReadFrom(%s) = %d entries, %v", stream, len(got), err)
		}
		for i, e := range got {
			want := byte(i)
			if stream == "owned" {
				want = byte(n + i)
			}
			if len(e.Payload) != size || e.Payload[0] != want {
				t.Fatalf("%s entry %d = %d bytes starting %d, want %d starting %d", stream, i, len(e.Payload), e.Payload[0], size, want)
			}
		}
	}
}
