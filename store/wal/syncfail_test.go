package wal

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store/vfs"
)

// failNextSync makes the next Sync fail the Linux way (faultfs.FailSync).
func failNextSync(ffs *faultfs.FS) {
	done := false
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		if !done && op.Kind == faultfs.OpSync {
			done = true
			return faultfs.FailSync
		}
		return faultfs.None
	})
}

// appendPayload appends a record of one payload.
func appendPayload(t *testing.T, l *Log, p []byte) error {
	t.Helper()
	_, err := l.Append(&Batch{Appends: []StreamAppend{{Stream: "s", Payloads: [][]byte{p}}}})
	return err
}

// A record whose fdatasync failed the Linux way is still in the page
// cache: a restart without a reboot replays it, and builds on it. Open
// must make it durable before it is used, or a power cut later loses it
// under records acknowledged after it (an LSN gap, or a torn tail in a
// segment that is not the last: the log refused, those records lost).
func TestOpen_WritesAgainWhatOnlyThePageCacheHeld(t *testing.T) {
	big := bytes.Repeat([]byte{'z'}, 2500) // several sectors: a crash tears it
	small := [][]byte{{'a'}, {'b'}, {'c'}}
	checkWritesAgain(t, Options{SegmentSize: 4096}, small, big, 100)
}

// The same when the records written back span several read windows:
// Open writes back each window's records before it reads the next, and
// a record larger than the window from its own buffer.
func TestOpen_WritesAgainWhatOnlyThePageCacheHeldAcrossWindows(t *testing.T) {
	if testing.Short() {
		t.Skip("segments of several MiB")
	}
	before := [][]byte{
		bytes.Repeat([]byte{'a'}, readChunk*2/5),
		bytes.Repeat([]byte{'b'}, readChunk*2/5),
		bytes.Repeat([]byte{'c'}, readChunk*2/5),
	}
	opts := Options{SegmentSize: 8 * readChunk}
	t.Run("a record in the window", func(t *testing.T) {
		checkWritesAgain(t, opts, before, bytes.Repeat([]byte{'z'}, readChunk*7/10), 10)
	})
	t.Run("a record larger than the window", func(t *testing.T) {
		checkWritesAgain(t, opts, before, bytes.Repeat([]byte{'z'}, readChunk*5/2), 10)
	})
}

// checkWritesAgain appends before, then unsynced with its sync failing
// the Linux way, restarts without a reboot (the page cache still serves
// unsynced), appends three more records, cuts the power, and checks that
// every record survived, for seeds power cuts.
func checkWritesAgain(t *testing.T, opts Options, before [][]byte, unsynced []byte, seeds uint64) {
	t.Helper()
	const dir = "/data/wal"
	var want []byte
	for _, p := range before {
		want = append(want, p[0])
	}
	want = append(want, unsynced[0], 'e', 'f', 'g')
	for seed := range seeds {
		ffs := faultfs.New()
		opts.FS = ffs
		l, _, err := Open(dir, 0, opts, func(*Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range before {
			if err := appendPayload(t, l, p); err != nil {
				t.Fatal(err)
			}
		}
		failNextSync(ffs)
		if err := appendPayload(t, l, unsynced); !errors.Is(err, faultfs.ErrInjected) {
			t.Fatalf("Append whose sync fails = %v, want ErrInjected", err)
		}
		l.Close()

		// A restart without a reboot: it replays the unsynced record from
		// the page cache, and three records follow it.
		var replayed int
		l, _, err = Open(dir, 0, opts, func(*Batch) error { replayed++; return nil })
		if err != nil {
			t.Fatalf("seed %d: Open after the failed sync: %v", seed, err)
		}
		if replayed != len(before)+1 {
			t.Fatalf("seed %d: the restart replayed %d records, want %d (the page cache serves the unsynced one)", seed, replayed, len(before)+1)
		}
		for i := range 3 {
			if err := appendPayload(t, l, []byte{byte('e' + i)}); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()

		if err := ffs.Crash(rand.New(rand.NewPCG(seed, 7))); err != nil {
			t.Fatal(err)
		}
		var got []byte
		l, _, err = Open(dir, 0, opts, func(b *Batch) error {
			got = append(got, b.Appends[0].Payloads[0][0])
			return nil
		})
		if err != nil {
			t.Fatalf("seed %d: Open after the power cut: %v", seed, err)
		}
		l.Close()
		if string(got) != string(want) {
			t.Fatalf("seed %d: after the power cut the records begin %q, want %q", seed, got, want)
		}
	}
}

// A segment that is not the last and holds only records at or below the
// checkpoint is covered: damage in it, a torn tail whose page a failed
// sync never wrote or a removal a crash undid, loses nothing, and replay
// skips it. The same damage in a segment the checkpoint does not cover is
// refused.
func TestReplay_SkipsDamageInACoveredSegment(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 30, Options{SegmentSize: 256})
	segs, err := listSegments(osFS(), dir)
	if err != nil || len(segs) < 3 {
		t.Fatalf("segments = %d, %v; want at least 3", len(segs), err)
	}
	first := join(dir, segs[0])
	raw, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	// Tear its last record: keep the first half of it.
	offs := segmentRecords(raw)
	last, end := offs[len(offs)-2], offs[len(offs)-1]
	torn := bytes.Clone(raw)
	clear(torn[(last+end)/2:])
	if err := os.WriteFile(first, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	covered := segs[1].first - 1
	got, _, err := replayAll(t, dir, covered)
	if err != nil {
		t.Fatalf("Replay after %v of a log whose covered first segment is torn: %v", covered, err)
	}
	if want := 30 - int(covered); len(got) != want {
		t.Fatalf("Replay after %v = %d records, want %d", covered, len(got), want)
	}
	var ce *CorruptionError
	if _, _, err := replayAll(t, dir, covered-1); !errors.As(err, &ce) || ce.Segment != segs[0].name {
		t.Fatalf("Replay after %v (the torn record not covered) = %v, want a CorruptionError naming %s", covered-1, err, segs[0].name)
	}
}

// A segment whose magic names another format version (a newer binary
// wrote it) is refused with ErrUnknownVersion wherever it is, even with
// no record in it, and never removed or cut; a torn header is a prefix of
// the current magic or zeros, never that.
func TestOpen_RefusesASegmentOfAnotherFormatVersion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		which func(segs []segment) segment
		bare  bool // the segment holds only its header
	}{
		{"last", func(segs []segment) segment { return segs[len(segs)-1] }, false},
		{"last, header only", func(segs []segment) segment { return segs[len(segs)-1] }, true},
		{"first", func(segs []segment) segment { return segs[0] }, false},
	} {
		dir := t.TempDir()
		writeLog(t, dir, 20, Options{SegmentSize: 512})
		segs, err := listSegments(osFS(), dir)
		if err != nil || len(segs) < 2 {
			t.Fatalf("segments = %d, %v", len(segs), err)
		}
		seg := tc.which(segs)
		path := join(dir, seg)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if tc.bare {
			raw = append(raw[:segmentHeaderLen:segmentHeaderLen], make([]byte, 100)...)
		}
		raw[7] = segmentFormat2 + 1
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		before := snapshotDir(t, dir)
		if _, _, err := Open(dir, 0, Options{SegmentSize: 512}, func(*Batch) error { return nil }); !errors.Is(err, ErrUnknownVersion) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: Open = %v, want ErrUnknownVersion (ErrCorrupt)", tc.name, err)
		}
		if _, _, err := replayAll(t, dir, 0); !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("%s: Replay = %v, want ErrUnknownVersion", tc.name, err)
		}
		// Covered by a checkpoint or not, it is not this binary's to judge.
		if _, _, err := replayAll(t, dir, 19); !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("%s: Replay after 19 = %v, want ErrUnknownVersion", tc.name, err)
		}
		if after := snapshotDir(t, dir); !mapsEqual(before, after) {
			t.Fatalf("%s: a refused Open changed the log directory", tc.name)
		}
	}
}

func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range names {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// RemoveBelow's removals are durable: after a crash the removed segments
// stay removed.
func TestRemoveBelow_SyncsTheDirectory(t *testing.T) {
	const dir = "/data/wal"
	ffs := faultfs.New()
	opts := Options{SegmentSize: 256, FS: ffs}
	l, _, err := Open(dir, 0, opts, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := l.Append(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.RemoveBelow(15); err != nil {
		t.Fatal(err)
	}
	want := l.Segments()
	l.Close()
	if err := ffs.Crash(nil); err != nil {
		t.Fatal(err)
	}
	segs, err := listSegments(ffs, dir)
	if err != nil || len(segs) != want {
		t.Fatalf("after a crash %d segments (%v), want the %d RemoveBelow left", len(segs), err, want)
	}
}

// A restart that finds the only segment without a record reuses it in
// place: it never removes that name (a journaling file system may commit
// a removal before a later creation, and a crash between the two left
// wal/ without a segment), and a power cut at any call of that Open
// leaves a log that opens.
func TestOpen_ReusesAnEmptyOnlySegmentInPlace(t *testing.T) {
	const dir = "/data/wal"
	setup := func() (*faultfs.FS, string) {
		ffs := faultfs.New()
		l, _, err := Open(dir, 0, Options{SegmentSize: 4096, FS: ffs}, func(*Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		segs, err := listSegments(ffs, dir)
		if err != nil || len(segs) != 1 {
			t.Fatalf("segments = %v, %v; want 1", segs, err)
		}
		return ffs, join(dir, segs[0])
	}
	ffs, only := setup()
	start := ffs.Ops()
	var removed []string
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		// The scratch entry vfs.Dirty creates and removes is no segment.
		if op.Kind == faultfs.OpRemove && filepath.Base(op.Path) != vfs.DirtyName {
			removed = append(removed, op.Path)
		}
		return faultfs.None
	})
	l, _, err := Open(dir, 0, Options{SegmentSize: 4096, FS: ffs}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if len(removed) != 0 {
		t.Fatalf("Open of a log whose only segment %s is empty removed %v", only, removed)
	}
	calls := ffs.Ops() - start
	rng := rand.New(rand.NewPCG(11, 12))
	for at := range calls + 1 {
		ffs, _ := setup()
		ffs.SetRule(faultfs.CutAt(ffs.Ops() + at))
		if l, _, err := Open(dir, 0, Options{SegmentSize: 4096, FS: ffs}, func(*Batch) error { return nil }); err == nil {
			l.Close()
		}
		if err := ffs.Crash(rng); err != nil {
			t.Fatal(err)
		}
		segs, err := listSegments(ffs, dir)
		if err != nil || len(segs) != 1 || join(dir, segs[0]) != only {
			t.Fatalf("cut at call %d of the reopen: segments %v, %v; want %s", at, segs, err, only)
		}
		l, _, err := Open(dir, 0, Options{SegmentSize: 4096, FS: ffs}, func(*Batch) error { return nil })
		if err != nil {
			t.Fatalf("cut at call %d of the reopen: Open after the power cut: %v", at, err)
		}
		l.Close()
	}
}

// A last segment without a record that the new segment does not replace
// (the caller's checkpoint is past the log) is removed once the new one
// is durable, and the new one holds what is appended after.
func TestOpen_RemovesAnEmptyLastSegmentTheNewOneDoesNotReplace(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 3, Options{})
	writeLog(t, dir, 0, Options{}) // a start that appends nothing: an empty segment 4
	l, _, err := Open(dir, 10, Options{}, func(*Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if lsn, err := l.Append(testBatch(0)); err != nil || lsn != 11 {
		t.Fatalf("Append after a checkpoint at 10 = %v, %v; want LSN 11", lsn, err)
	}
	l.Close()
	segs, err := listSegments(osFS(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []LSN
	for _, s := range segs {
		names = append(names, s.first)
	}
	if len(names) != 2 || names[0] != 1 || names[1] != 11 {
		t.Fatalf("segments start at %v, want [1 11]: the empty one removed, the new one kept", names)
	}
	got, _, err := replayAll(t, dir, 10)
	if err != nil || len(got) != 1 || got[0].LSN != 11 {
		t.Fatalf("Replay after 10 = %d records, %v; want the one appended, LSN 11", len(got), err)
	}
}
