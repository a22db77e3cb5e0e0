package store_test

import (
	"bytes"
	"testing"

	"github.com/participantd/participantd/store"
)

// TestPageBuffer_ReusesItsArrayPageAfterPage copies pages of payloads into
// one PageBuffer: every copy equals its payload, a nil buffer copies into
// an array of the copy's own, and once the buffer has grown to a page's
// size the next page of that size lands in the same array.
func TestPageBuffer_ReusesItsArrayPageAfterPage(t *testing.T) {
	if got := (*store.PageBuffer)(nil).Copy([]byte("abc")); string(got) != "abc" {
		t.Fatalf("nil buffer: Copy = %q, want abc", got)
	}
	var buf store.PageBuffer
	page := func(fill byte) []store.Entry {
		out := buf.Reset()
		for i := range 16 {
			p := bytes.Repeat([]byte{fill + byte(i)}, 1000+i)
			out = append(out, store.Entry{Seq: uint64(i), Payload: buf.Copy(p)})
		}
		buf.Keep(out)
		for i, e := range out {
			if want := bytes.Repeat([]byte{fill + byte(i)}, 1000+i); !bytes.Equal(e.Payload, want) {
				t.Fatalf("page %d, entry %d: the copy differs from the payload", fill, i)
			}
		}
		return out
	}
	page(0)
	second := page(50)
	third := page(100)
	if &second[0].Payload[0] != &third[0].Payload[0] {
		t.Fatal("a page of the size of the one before it did not reuse the buffer's array")
	}
	if cap(third[0].Payload) != len(third[0].Payload) {
		t.Fatalf("a copy has spare capacity %d: an append to it would write into the next copy", cap(third[0].Payload)-len(third[0].Payload))
	}
}
