package oplog_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
)

// seedRows is one valid row of every kind, with every field used.
func seedRows() []oplog.Row {
	tok := oplog.Token{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	return []oplog.Row{
		{Kind: oplog.KindGenesis, At: 1700000000000, Nonce: [16]byte{9, 9, 9}},
		{Kind: oplog.KindEnroll, Participant: 3, Generation: 1, Token: tok, Conn: oplog.ConnID{Server: 2, Ordinal: 7}, Seq: 4, At: 1},
		{Kind: oplog.KindAttach, Participant: 3, Generation: 5, Token: tok, Conn: oplog.ConnID{Server: 3, Ordinal: 8}, Seq: 9, Cursor: 2, At: 2},
		{Kind: oplog.KindTell, Participant: 1, Generation: 2, Token: tok, Seq: 10, At: 3, Payload: []byte("hello")},
		{Kind: oplog.KindTell, Participant: 1, Generation: 2, Token: tok, Seq: 11, Payload: bytes.Repeat([]byte{0xc1}, 300)},
		{Kind: oplog.KindAck, Participant: 1, Generation: 2, Through: 10},
		{Kind: oplog.KindDetach, Participant: 1, Generation: 2, Token: tok, Seq: 12},
		{Kind: oplog.KindLeave, Participant: 1, Generation: 2, Token: tok, Seq: 13},
		{Kind: oplog.KindEnd, Participant: 1, Generation: 2, Conn: oplog.ConnID{Server: 3, Ordinal: 8}, Cause: 1, Seq: 14},
		{Kind: oplog.KindTell, Participant: ^oplog.ParticipantID(0), Generation: ^oplog.Generation(0), Seq: ^oplog.Seq(0), At: -1},
	}
}

// FuzzDecode checks the oplog row decoder on any stored bytes: it never
// panics, refuses with ErrUnknownVersion or ErrCorrupt, and what it accepts
// re-encodes to a row that decodes to the same value, stably.
func FuzzDecode(f *testing.F) {
	for _, r := range seedRows() {
		b, err := oplog.Encode(&r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(append(b, 0))
	}
	f.Add([]byte{})
	f.Add([]byte{oplog.Version})
	f.Add([]byte{2, 0x9c})
	f.Add([]byte{oplog.Version, 0xdd, 0xff, 0xff, 0xff, 0xff})             // array of 2^32-1
	f.Add([]byte{oplog.Version, 0x9c, 0x04, 0x00, 0x00, 0xc6, 0xff, 0xff}) // bin32 of 4 GiB
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := oplog.Decode(b)
		if err != nil {
			if !errors.Is(err, oplog.ErrCorrupt) && !errors.Is(err, oplog.ErrUnknownVersion) {
				t.Fatalf("Decode(%x) error %v wraps neither ErrCorrupt nor ErrUnknownVersion", b, err)
			}
			return
		}
		if r.Kind < oplog.KindGenesis || r.Kind > oplog.KindDelete {
			t.Fatalf("Decode(%x) accepted kind %d", b, r.Kind)
		}
		for _, scratch := range [][]byte{nil, make([]byte, 3), make([]byte, len(b))} {
			reused, next, err := oplog.DecodeReusing(b, scratch)
			if err != nil {
				t.Fatalf("DecodeReusing(%x) error %v where Decode accepts", b, err)
			}
			if diff := cmp.Diff(r, reused, cmp.AllowUnexported(oplog.Row{}, oplog.ConnID{}), cmp.Comparer(bytesEqual)); diff != "" {
				t.Fatalf("DecodeReusing(%x) differs from Decode (-Decode +DecodeReusing):\n%s", b, diff)
			}
			if len(reused.Payload) > 0 && len(reused.Payload) <= cap(scratch) && &reused.Payload[0] != &scratch[:1][0] {
				t.Fatalf("DecodeReusing(%x): a payload of %d bytes was allocated beside a scratch of %d", b, len(reused.Payload), cap(scratch))
			}
			if cap(next) < cap(scratch) {
				t.Fatalf("DecodeReusing returned a scratch of %d bytes for one of %d", cap(next), cap(scratch))
			}
		}
		enc, err := oplog.Encode(&r)
		if err != nil {
			t.Fatalf("Encode(Decode(%x)) error: %v", b, err)
		}
		r2, err := oplog.Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)) error: %v", r, err)
		}
		if diff := cmp.Diff(r, r2, cmp.AllowUnexported(oplog.Row{}, oplog.ConnID{}), cmp.Comparer(bytesEqual)); diff != "" {
			t.Fatalf("round trip mismatch (-decoded +re-decoded):\n%s", diff)
		}
		if enc2, _ := oplog.Encode(&r2); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}

// bytesEqual treats a nil and an empty payload alike: msgpack stores both
// the same way.
func bytesEqual(a, b []byte) bool { return bytes.Equal(a, b) }

func TestDecode_SeedRowsRoundTrip(t *testing.T) {
	for _, r := range seedRows() {
		b, err := oplog.Encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := oplog.Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%v row)) error: %v", r.Kind, err)
		}
		if diff := cmp.Diff(r, got, cmp.AllowUnexported(oplog.Row{}, oplog.ConnID{}), cmp.Comparer(bytesEqual)); diff != "" {
			t.Errorf("%v row round trip (-want +got):\n%s", r.Kind, diff)
		}
	}
}
