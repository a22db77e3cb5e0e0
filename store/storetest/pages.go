package storetest

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/participantd/participantd/store"
)

// testReadPage checks PageReader: the byte bound ends a page before the
// entry that would pass it, a page always holds its first entry, entries
// staged and flushed read alike, and paging with any bound reads every
// entry exactly once.
func testReadPage(t *testing.T, h Harness) {
	s := h.Open(t)
	pr, ok := s.(store.PageReader)
	if !ok {
		t.Skip("store does not implement store.PageReader")
	}
	// Entry i has 10*(i+1) bytes; 0..3 flushed, 4..7 staged.
	sizes := []int{10, 20, 30, 40, 50, 60, 70, 80}
	want := make([][]byte, len(sizes))
	for i, n := range sizes {
		want[i] = bytes.Repeat([]byte{byte('a' + i)}, n)
		mustAppend(t, s, "s", want[i], uint64(i))
		if i == 3 {
			mustFlush(t, s)
		}
	}
	tests := []struct {
		name     string
		offset   uint64
		limit    int
		maxBytes int
		want     []uint64
	}{
		{"no byte bound", 0, 0, 0, []uint64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"bound exactly met", 0, 0, 60, []uint64{0, 1, 2}},
		{"bound one short", 0, 0, 59, []uint64{0, 1}},
		{"first entry alone past the bound", 5, 0, 1, []uint64{5}},
		{"limit before bound", 0, 2, 1000, []uint64{0, 1}},
		{"straddling flushed and staged", 2, 0, 120, []uint64{2, 3, 4}},
		{"staged only", 6, 0, 150, []uint64{6, 7}},
		{"past end", 8, 0, 10, nil},
		{"absent stream", 0, 0, 10, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := "s"
			if tt.name == "absent stream" {
				stream = "absent"
			}
			got, err := pr.ReadPage(stream, tt.offset, tt.limit, tt.maxBytes)
			if err != nil {
				t.Fatalf("ReadPage(%q, %d, %d, %d) error: %v", stream, tt.offset, tt.limit, tt.maxBytes, err)
			}
			var seqs []uint64
			for _, e := range got {
				seqs = append(seqs, e.Seq)
				if !bytes.Equal(e.Payload, want[e.Seq]) {
					t.Errorf("ReadPage seq %d payload = %q, want %q", e.Seq, e.Payload, want[e.Seq])
				}
			}
			if fmt.Sprint(seqs) != fmt.Sprint(tt.want) {
				t.Errorf("ReadPage(%q, %d, %d, %d) seqs = %v, want %v", stream, tt.offset, tt.limit, tt.maxBytes, seqs, tt.want)
			}
		})
	}
	for _, bound := range []int{1, 35, 64, 100, 1000} {
		var got [][]byte
		for next := uint64(0); ; {
			page, err := pr.ReadPage("s", next, 0, bound)
			if err != nil {
				t.Fatalf("ReadPage(s, %d, 0, %d) error: %v", next, bound, err)
			}
			if len(page) == 0 {
				break
			}
			total := 0
			for i, e := range page {
				if e.Seq != next+uint64(i) {
					t.Fatalf("ReadPage(s, %d, 0, %d)[%d].Seq = %d, want %d", next, bound, i, e.Seq, next+uint64(i))
				}
				total += len(e.Payload)
				got = append(got, e.Payload)
			}
			if len(page) > 1 && total > bound {
				t.Fatalf("ReadPage(s, %d, 0, %d) returned %d bytes in %d entries", next, bound, total, len(page))
			}
			next += uint64(len(page))
		}
		if len(got) != len(want) {
			t.Fatalf("paging with bound %d read %d entries, want %d", bound, len(got), len(want))
		}
	}
}
