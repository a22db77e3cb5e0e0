package etcdstore_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// runPayload is the payload of entry i of the run tests: sizes vary, so
// that byte-bounded pages end inside runs and at their edges.
func runPayload(i int) string { return fmt.Sprintf("e%d-%s", i, strings.Repeat("x", i%7)) }

// writeRuns appends to stream name one flush per size in sizes (so one run
// each, the runs small), from seq from, and returns every payload
// appended.
func writeRuns(t *testing.T, s store.DurableStore, name string, from int, sizes []int) []string {
	t.Helper()
	var out []string
	seq := from
	for _, n := range sizes {
		for range n {
			p := runPayload(seq)
			mustAppend(t, s, name, p, uint64(seq))
			out = append(out, p)
			seq++
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// rawKeys returns the keys and values of stored under the etcd prefix p.
func rawKeys(t *testing.T, p string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := shared.Client.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for _, kv := range resp.Kvs {
		out[string(kv.Key[len(p):])] = string(kv.Value)
	}
	return out
}

// runKey is the key, relative to the store's prefix, of stream a/log's
// run (or layout 1 entry) at seq, in scope a.
func runKey(stream string, seq uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return "c/a/s/" + string([]byte{0, byte(len(stream))}) + stream + string(b[:])
}

// checkReads reads stream from every offset at or after first with every
// limit and several byte bounds, and fails unless each answer is want's
// entries from there (a page: at least one entry, then those that fit).
func checkReads(t *testing.T, s *etcdstore.Store, stream string, first int, want []string) {
	t.Helper()
	for off := first; off <= len(want); off++ {
		for _, limit := range []int{0, 1, 2, 5, len(want)} {
			for _, maxBytes := range []int{0, 1, 12, 40, 1 << 20} {
				got, err := s.ReadPage(stream, uint64(off), limit, maxBytes)
				if err != nil {
					t.Fatalf("ReadPage(%s, %d, %d, %d) error: %v", stream, off, limit, maxBytes, err)
				}
				var exp []string
				size := 0
				for i := off; i < len(want) && (limit == 0 || len(exp) < limit); i++ {
					if maxBytes > 0 && len(exp) > 0 && size+len(want[i]) > maxBytes {
						break
					}
					size += len(want[i])
					exp = append(exp, want[i])
				}
				var have []string
				for i, e := range got {
					if e.Seq != uint64(off+i) {
						t.Fatalf("ReadPage(%s, %d, %d, %d): entry %d has seq %d", stream, off, limit, maxBytes, i, e.Seq)
					}
					have = append(have, string(e.Payload))
				}
				if fmt.Sprint(have) != fmt.Sprint(exp) {
					t.Fatalf("ReadPage(%s, %d, %d, %d) = %q, want %q", stream, off, limit, maxBytes, have, exp)
				}
			}
		}
	}
}

func checkCompactedRead(t *testing.T, s *etcdstore.Store, stream string, off, first uint64) {
	t.Helper()
	got, err := s.ReadFrom(stream, off, 0)
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.First != first {
		t.Fatalf("ReadFrom(%s, %d) = %d entries, %v; want a *CompactedError with First %d", stream, off, len(got), err, first)
	}
}

// TestRuns_OneKeyPerStreamPerCommit_ReadsAcrossRunBoundaries: each flush
// writes a stream's entries as one key, and a fresh store reads them from
// every offset, with every limit and byte bound, across the runs' edges.
func TestRuns_OneKeyPerStreamPerCommit_ReadsAcrossRunBoundaries(t *testing.T) {
	pfx := prefix()
	s := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	want := writeRuns(t, s, "a/log", 0, []int{1, 3, 7, 2, 5})
	keys := rawKeys(t, pfx)
	if len(keys) != 5 {
		t.Fatalf("%d keys stored for 5 flushes of one stream, want 5 runs: %q", len(keys), keys)
	}
	for _, seq := range []uint64{0, 1, 4, 11, 13} {
		if _, ok := keys[runKey("a/log", seq)]; !ok {
			t.Fatalf("no run at %d", seq)
		}
	}
	fresh := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	if n, err := fresh.Len("a/log"); err != nil || n != 18 {
		t.Fatalf("Len = %d, %v; want 18 (the last run's first seq and count)", n, err)
	}
	checkReads(t, fresh, "a/log", 0, want)
	// The next append continues the stream: no fork at the last run.
	want = append(want, writeRuns(t, fresh, "a/log", 18, []int{2})...)
	checkReads(t, open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment}), "a/log", 0, want)
}

// TestRuns_TrimInsideARun: a trim whose floor falls inside a run keeps the
// run whole and deletes the runs below it; reads below the floor are
// compacted, in this store and in a fresh one (the floor key), and a
// later trim past the run deletes it.
func TestRuns_TrimInsideARun(t *testing.T) {
	pfx := prefix()
	s := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	want := writeRuns(t, s, "a/log", 0, []int{5, 3, 2}) // runs at 0, 5, 8
	trim := func(s *etcdstore.Store, below uint64) {
		t.Helper()
		if err := s.Trim("a/log", below); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	trim(s, 3)
	if _, ok := rawKeys(t, pfx)[runKey("a/log", 0)]; !ok {
		t.Fatal("the run straddling the floor was deleted")
	}
	for _, st := range []*etcdstore.Store{s, open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})} {
		if f, err := st.First("a/log"); err != nil || f != 3 {
			t.Fatalf("First = %d, %v; want 3", f, err)
		}
		for off := range uint64(3) {
			checkCompactedRead(t, st, "a/log", off, 3)
		}
		checkReads(t, st, "a/log", 3, want)
	}
	fresh := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	trim(fresh, 6)
	keys := rawKeys(t, pfx)
	if _, ok := keys[runKey("a/log", 0)]; ok {
		t.Fatal("the run below the floor's run survived the trim")
	}
	if _, ok := keys[runKey("a/log", 5)]; !ok {
		t.Fatal("the run holding the floor was deleted")
	}
	checkCompactedRead(t, fresh, "a/log", 5, 6)
	checkReads(t, fresh, "a/log", 6, want)
	trim(fresh, 8) // at a run's first seq
	if _, ok := rawKeys(t, pfx)[runKey("a/log", 5)]; ok {
		t.Fatal("the run below a floor at a run's start survived")
	}
	again := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	checkCompactedRead(t, again, "a/log", 7, 8)
	checkReads(t, again, "a/log", 8, want)
	if n, err := again.Len("a/log"); err != nil || n != 10 {
		t.Fatalf("Len after trims = %d, %v; want 10", n, err)
	}
}

// TestRuns_SplitBySize: a commit's entries of one stream past MaxRunBytes
// go in several runs, each within the bound (an entry larger than it in a
// run of its own), and a scope past a request's size in several
// transactions; every entry reads back in order.
func TestRuns_SplitBySize(t *testing.T) {
	pfx := prefix()
	s := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment, MaxRunBytes: 100})
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("%02d%s", i, strings.Repeat("y", 28)))
		mustAppend(t, s, "a/log", want[i], uint64(i))
	}
	want = append(want, strings.Repeat("z", 500))
	mustAppend(t, s, "a/log", want[20], 20)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	keys := rawKeys(t, pfx)
	if len(keys) < 11 {
		t.Fatalf("%d runs for 20 entries of 30 bytes and one of 500 under 100-byte runs, want at least 11", len(keys))
	}
	for k, v := range keys {
		if len(v) > 100 && !strings.HasSuffix(k, "\x00\x00\x00\x00\x00\x00\x00\x14") {
			t.Errorf("run %q holds %d bytes, more than MaxRunBytes", k, len(v))
		}
	}
	checkReads(t, open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment}), "a/log", 0, want)

	// A request of 96 KiB holds one 20 KiB entry beside another, not ten:
	// the commit splits into transactions, each run within the request.
	pfx2 := prefix()
	txns := 0
	big := open(t, etcdstore.Options{Prefix: pfx2, Scope: byFirstSegment, MaxRequestBytes: 96 << 10,
		OnTxn: func(time.Duration, int, error) { txns++ }})
	want = nil
	for i := range 10 {
		want = append(want, fmt.Sprintf("%02d%s", i, strings.Repeat("w", 20<<10)))
		mustAppend(t, big, "a/log", want[i], uint64(i))
	}
	if err := big.Flush(); err != nil {
		t.Fatal(err)
	}
	if txns < 3 {
		t.Fatalf("%d transactions for 200 KiB under 96 KiB requests, want at least 3", txns)
	}
	for k, v := range rawKeys(t, pfx2) {
		if len(v) > 96<<10-64<<10 {
			t.Errorf("run %q holds %d bytes, more than a request holds beside its keys", k, len(v))
		}
	}
	checkReads(t, open(t, etcdstore.Options{Prefix: pfx2, Scope: byFirstSegment}), "a/log", 0, want)
}

// loadGolden writes testdata/layout1.txt, a layout 1 data set written by
// the store before runs, under pfx.
func loadGolden(t *testing.T, pfx string) {
	t.Helper()
	f, err := os.Open("testdata/layout1.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, rest, err := unquotePrefix(line)
		if err != nil {
			t.Fatalf("testdata/layout1.txt: %q: %v", line, err)
		}
		v, err := strconv.Unquote(strings.TrimSpace(rest))
		if err != nil {
			t.Fatalf("testdata/layout1.txt: %q: %v", line, err)
		}
		put(t, pfx+k, v)
		n++
	}
	if err := sc.Err(); err != nil || n == 0 {
		t.Fatalf("testdata/layout1.txt: %d keys, %v", n, err)
	}
}

// unquotePrefix unquotes the Go string literal line starts with and
// returns the rest.
func unquotePrefix(line string) (string, string, error) {
	q, err := strconv.QuotedPrefix(line)
	if err != nil {
		return "", "", err
	}
	s, err := strconv.Unquote(q)
	return s, line[len(q):], err
}

// TestRuns_ALayout1DataSetReadsAndGrows: a data set written before runs
// (one key per entry, a length key per stream, a trim's deleted entries)
// reads as it did; appended to, a stream holds layout 1 entries then
// runs, read across the change, trimmed inside either, and a flipped bit
// in a layout 1 entry is still refused.
func TestRuns_ALayout1DataSetReadsAndGrows(t *testing.T) {
	pfx := prefix()
	loadGolden(t, pfx+"d/")
	rev := claim(t, pfx+"own/a")
	openGolden := func() *etcdstore.Store {
		s := open(t, etcdstore.Options{Prefix: pfx + "d/", Scope: byFirstSegment, ScanScope: firstSegmentOf})
		s.SetFence("a", etcdstore.Fence{Key: pfx + "own/a", CreateRevision: rev})
		return s
	}
	s := openGolden()
	rows := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("row %d", i))
		}
		return out
	}
	for _, c := range []struct {
		stream      string
		first, size uint64
	}{{"a/log", 2, 6}, {"a/out", 0, 1}, {"registry", 0, 1}} {
		if n, err := s.Len(c.stream); err != nil || n != c.size {
			t.Fatalf("Len(%s) = %d, %v; want %d", c.stream, n, err, c.size)
		}
		if f, err := s.First(c.stream); err != nil || f != c.first {
			t.Fatalf("First(%s) = %d, %v; want %d", c.stream, f, err, c.first)
		}
	}
	checkCompactedRead(t, s, "a/log", 1, 2)
	want := append([]string{"", ""}, rows(2, 6)...)
	checkReads(t, s, "a/log", 2, want)
	if got := readAll(t, s, "a/out"); fmt.Sprint(got) != "[delivery 0]" {
		t.Fatalf("a/out = %q", got)
	}
	if got := readAll(t, s, "registry"); fmt.Sprint(got) != "[conversation a]" {
		t.Fatalf("registry = %q", got)
	}
	for k, v := range map[string]uint64{"a/tok/x": 3, "incarnation": 7} {
		if got, err := s.ReadValue(k); err != nil || got != v {
			t.Fatalf("ReadValue(%s) = %d, %v; want %d", k, got, err, v)
		}
	}
	if b, err := s.GetBytes("a/checkpoint"); err != nil || string(b) != "state at row 2" {
		t.Fatalf("GetBytes = %q, %v", b, err)
	}

	// Grown by runs: layout 1 entries 2..5, runs at 6 and 9.
	for i := 6; i < 11; i++ {
		want = append(want, fmt.Sprintf("row %d", i))
	}
	for i := 6; i < 11; i++ {
		mustAppend(t, s, "a/log", want[i], uint64(i))
		if i == 8 {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	checkReads(t, openGolden(), "a/log", 2, want)
	trim := func(s *etcdstore.Store, below uint64) {
		t.Helper()
		if err := s.Trim("a/log", below); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	trim(openGolden(), 4) // at a layout 1 entry
	g := openGolden()
	checkCompactedRead(t, g, "a/log", 3, 4)
	checkReads(t, g, "a/log", 4, want)
	trim(g, 7) // inside the run at 6, past every layout 1 entry
	keys := rawKeys(t, pfx+"d/")
	for seq := uint64(0); seq < 6; seq++ {
		if _, ok := keys[runKey("a/log", seq)]; ok {
			t.Errorf("layout 1 entry %d survived a trim past it", seq)
		}
	}
	if _, ok := keys[runKey("a/log", 6)]; !ok {
		t.Fatal("the run holding the floor was deleted")
	}
	g = openGolden()
	checkCompactedRead(t, g, "a/log", 6, 7)
	checkReads(t, g, "a/log", 7, want)
	if n, err := g.Len("a/log"); err != nil || n != 11 {
		t.Fatalf("Len = %d, %v; want 11", n, err)
	}

	// A flipped bit in a layout 1 entry is refused as before.
	k := pfx + "d/" + runKey("a/out", 0)
	v := []byte(keys[runKey("a/out", 0)])
	v[2] ^= 4
	put(t, k, string(v))
	var ce *store.ChecksumError
	if got, err := openGolden().ReadFrom("a/out", 0, 0); !errors.As(err, &ce) || !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("ReadFrom of a flipped layout 1 entry = %v, %v; want a *store.ChecksumError", got, err)
	}
}

// TestRuns_AFlippedBitInARunIsRefused: a bit flipped anywhere in a run
// (its count, a length, a payload, an entry's sum, the run's sum) fails
// every read of it with a *store.ChecksumError, and a run whose own sum
// was forged over a broken structure or a broken entry sum is refused as
// corrupt: never an entry served wrong, nor a length invented.
func TestRuns_AFlippedBitInARunIsRefused(t *testing.T) {
	pfx := prefix()
	s := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	writeRuns(t, s, "a/log", 0, []int{3})
	rel := runKey("a/log", 0)
	orig := rawKeys(t, pfx)[rel]
	refused := func(what string) {
		t.Helper()
		f := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
		if n, err := f.Len("a/log"); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("%s: Len = %d, %v; want store.ErrCorrupt", what, n, err)
		}
		f = open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
		if got, err := f.ReadPage("a/log", 1, 1, 0); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("%s: ReadPage = %v, %v; want store.ErrCorrupt", what, got, err)
		}
	}
	for i := range len(orig) {
		bad := []byte(orig)
		bad[i] ^= 1 << (i % 8)
		put(t, pfx+rel, string(bad))
		refused(fmt.Sprintf("bit %d of byte %d flipped", i%8, i))
	}
	body := []byte(orig[:len(orig)-etcdstore.SealOverhead])
	// The run's sum forged over a payload changed in place: the entry's
	// own sum refuses it.
	forged := append([]byte(nil), body...)
	forged[len(forged)-etcdstore.SealOverhead-1] ^= 1
	put(t, pfx+rel, etcdstore.SealRunBody(rel, forged))
	refused("an entry changed under a forged run sum")
	// A count that does not match the lengths.
	forged = append([]byte(nil), body...)
	forged[0] = 2
	put(t, pfx+rel, etcdstore.SealRunBody(rel, forged))
	refused("a count of 2 for 3 entries")
	put(t, pfx+rel, etcdstore.SealRunBody(rel, []byte{0}))
	refused("a run of no entries")
	put(t, pfx+rel, orig)
	checkReads(t, open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment}), "a/log", 0, []string{runPayload(0), runPayload(1), runPayload(2)})
}

// TestSealRun_Golden pins the stored bytes of a run of layout 2: its
// count, its lengths, each entry sealed under its own key as layout 1
// sealed it, then the run's tag 0x02 and the CRC-32C of its key, a zero
// byte, its body and the tag, computed here apart from the store's code.
func TestSealRun_Golden(t *testing.T) {
	pfx := prefix()
	s := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
	mustAppend(t, s, "a/log", "one", 0)
	mustAppend(t, s, "a/log", "three", 1)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	rel := runKey("a/log", 0)
	got := rawKeys(t, pfx)[rel]
	body := "\x02\x03\x05" + etcdstore.Seal(runKey("a/log", 0), []byte("one")) + etcdstore.Seal(runKey("a/log", 1), []byte("three"))
	sum := crc32.Checksum([]byte(rel+"\x00"+body+"\x02"), crc32.MakeTable(crc32.Castagnoli))
	want := body + "\x02" + string(binary.BigEndian.AppendUint32(nil, sum))
	if got != want {
		t.Fatalf("run stored as %q, want %q", got, want)
	}
}
