package tokenindex_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/participantd/participantd/internal/golden"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/tokenindex"
)

// entry names one token of the index: in the enroll scope, or in
// participant p's.
type entry struct {
	c      oplog.ConversationID
	enroll bool
	p      oplog.ParticipantID
	t      oplog.Token
}

func (e entry) key() string {
	if e.enroll {
		return tokenindex.Key(e.c, tokenindex.Enroll, e.t)
	}
	return tokenindex.Key(e.c, tokenindex.Participant(e.p), e.t)
}

// FuzzKey: the index has no byte decoder (its values are the store's
// uint64s), so what it must keep is that its encoding loses nothing: two
// different tokens never share a key, no token key is a floor key, every
// key starts with token/<conversation>/ (the cluster scopes keys by it),
// and Index reads back what Value wrote, for any value without panicking.
func FuzzKey(f *testing.F) {
	f.Add(uint64(1), false, uint64(0), []byte{1}, uint64(7), true, uint64(0), []byte{1}, uint64(41))
	f.Add(uint64(12), false, uint64(3), []byte{2}, uint64(1), false, uint64(23), []byte{2}, uint64(0))
	f.Add(^uint64(0), true, ^uint64(0), []byte{0xff}, ^uint64(0), false, ^uint64(0), []byte{0xff}, ^uint64(0))
	f.Fuzz(func(t *testing.T, c1 uint64, e1 bool, p1 uint64, t1 []byte, c2 uint64, e2 bool, p2 uint64, t2 []byte, v uint64) {
		a := entry{c: oplog.ConversationID(c1), enroll: e1, p: oplog.ParticipantID(p1)}
		b := entry{c: oplog.ConversationID(c2), enroll: e2, p: oplog.ParticipantID(p2)}
		copy(a.t[:], t1)
		copy(b.t[:], t2)
		if a.enroll {
			a.p = 0
		}
		if b.enroll {
			b.p = 0
		}
		if (a.key() == b.key()) != (a == b) {
			t.Fatalf("%+v and %+v: keys %q and %q", a, b, a.key(), b.key())
		}
		for _, e := range []entry{a, b} {
			if k, pfx := e.key(), tokenindex.Prefix+e.c.String()+"/"; !strings.HasPrefix(k, pfx) {
				t.Fatalf("key %q of %+v does not start with %q", k, e, pfx)
			}
			for _, c := range []oplog.ConversationID{a.c, b.c} {
				if e.key() == tokenindex.FloorKey(c) {
					t.Fatalf("key %q of %+v is the floor key of %v", e.key(), e, c)
				}
			}
		}
		if idx, ok := tokenindex.Index(v); ok != (v != 0) || ok && tokenindex.Value(idx) != v {
			t.Fatalf("Index(%d) = %d, %v", v, idx, ok)
		}
		if v < ^uint64(0) {
			if idx, ok := tokenindex.Index(tokenindex.Value(v)); !ok || idx != v {
				t.Fatalf("Index(Value(%d)) = %d, %v", v, idx, ok)
			}
		}
	})
}

// TestRowKey: an enroll's token is kept in the enroll scope, every other
// row's in its participant's.
func TestRowKey(t *testing.T) {
	tok := oplog.Token{9}
	for _, tt := range []struct {
		row  oplog.Row
		want string
	}{
		{oplog.Row{Kind: oplog.KindEnroll, Participant: 4, Token: tok}, tokenindex.Key(3, tokenindex.Enroll, tok)},
		{oplog.Row{Kind: oplog.KindAttach, Participant: 4, Token: tok}, tokenindex.Key(3, tokenindex.Participant(4), tok)},
		{oplog.Row{Kind: oplog.KindTell, Participant: 5, Token: tok}, tokenindex.Key(3, tokenindex.Participant(5), tok)},
	} {
		if got := tokenindex.RowKey(3, &tt.row); got != tt.want {
			t.Errorf("RowKey(3, %v of %v) = %q, want %q", tt.row.Kind, tt.row.Participant, got, tt.want)
		}
	}
}

// TestGolden: the keys of fixed tokens and the value naming a fixed row
// are what the golden file holds.
func TestGolden(t *testing.T) {
	tok := oplog.Token{0x01, 0x8f, 0x3a, 0x10, 0x20, 0x30, 0x70, 0x01, 0x80, 2, 3, 4, 5, 6, 7, 8}
	golden.Check(t, "testdata/golden.txt", []golden.Value{
		{Name: "enroll key", Bytes: []byte(tokenindex.Key(12, tokenindex.Enroll, tok))},
		{Name: "participant key", Bytes: []byte(tokenindex.Key(12, tokenindex.Participant(3), tok))},
		{Name: "floor key", Bytes: []byte(tokenindex.FloorKey(12))},
		{Name: "value of oplog row 41, big-endian", Bytes: binary.BigEndian.AppendUint64(nil, tokenindex.Value(41))},
	})
}

// Key is Prefix, the conversation, the scope and the token as their
// String methods spell them, joined by slashes, at every width: the
// widest conversation and participant numbers, and tokens of every nibble.
func TestKey_IsTheStringsJoined(t *testing.T) {
	var all oplog.Token
	for i := range all {
		all[i] = byte(i*17 + 9)
	}
	for _, c := range []oplog.ConversationID{0, 7, 1 << 40, ^oplog.ConversationID(0)} {
		for _, s := range []tokenindex.Scope{tokenindex.Enroll, tokenindex.Participant(0), tokenindex.Participant(^oplog.ParticipantID(0))} {
			for _, tok := range []oplog.Token{{}, all, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
				want := tokenindex.Prefix + c.String() + "/" + string(s) + "/" + tok.String()
				if got := tokenindex.Key(c, s, tok); got != want {
					t.Errorf("Key(%v, %q, %v) = %q, want %q", c, s, tok, got, want)
				}
			}
		}
	}
}

// BenchmarkKey measures the key of a participant's token, which every
// lookup of an operation that carries a token builds.
func BenchmarkKey(b *testing.B) {
	b.ReportAllocs()
	tok := oplog.Token{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for i := range b.N {
		_ = tokenindex.Key(oplog.ConversationID(1<<20+i), tokenindex.Participant(1), tok)
	}
}
