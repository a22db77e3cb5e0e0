package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/internal/golden"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

var ckCmp = cmp.Options{
	cmpopts.IgnoreUnexported(checkpoint.Checkpoint{}, checkpoint.Member{}, checkpoint.Record{}, checkpoint.Mark{},
		checkpoint.Released{}, checkpoint.Invite{}, checkpoint.Window{}, outbox.Record{}, oplog.ConnID{}),
	cmpopts.EquateEmpty(),
}

// seed is a well-formed checkpoint of version 1: a member bound, a record
// owed, a mark.
func seed() *checkpoint.Checkpoint {
	return &checkpoint.Checkpoint{Conversation: 9, Index: 3, Produced: 2, LastSeq: 2, Nonce: [16]byte{7, 7},
		Members:     []checkpoint.Member{{Generation: 1, Cursor: 2}, {Generation: 2, Bound: true, Conn: oplog.ConnID{Server: 1, Ordinal: 2}, BindingSource: 2}},
		Records:     []checkpoint.Record{{Record: outbox.Record{Seq: 2, Kind: outbox.KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{0}}, Oplog: 2, Outbox: 1}},
		Marks:       []checkpoint.Mark{{At: 5, Oplog: 1, Outbox: 1}},
		OplogDigest: [32]byte{1}, OutboxDigest: [32]byte{2}}
}

// seedReleased is a well-formed checkpoint of version 2: member 0 was
// released through seq 1, above its cursor 0, and no record is retained.
func seedReleased() *checkpoint.Checkpoint {
	ck := seed()
	ck.Members[0].Cursor = 0
	ck.Records = nil
	ck.Released = []checkpoint.Released{{Member: 0, Through: 2}}
	return ck
}

// seedInvites is seed with invitation uses: version 3.
func seedInvites() *checkpoint.Checkpoint {
	ck := seed()
	ck.Invites = []checkpoint.Invite{{ID: 3, Uses: 1}, {ID: 9, Uses: 2}}
	return ck
}

// seedWindow is seedInvites naming its record's rows instead of holding
// it: version 4.
func seedWindow() *checkpoint.Checkpoint {
	ck := seedInvites()
	ck.Records = nil
	ck.Window = &checkpoint.Window{First: 2, Oplog: 2, Outbox: 1}
	return ck
}

// seedWindowEmpty is a version 4 checkpoint retaining no record, with a
// member released.
func seedWindowEmpty() *checkpoint.Checkpoint {
	ck := seedReleased()
	ck.Window = &checkpoint.Window{First: 3, Oplog: 3, Outbox: 2}
	return ck
}

func encode(t testing.TB, ck *checkpoint.Checkpoint) []byte {
	t.Helper()
	b, err := checkpoint.Encode(ck)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecode: a stored checkpoint never panics the decoder, errors wrap
// ErrCorrupt, and what decodes is well formed, re-encodes to exactly its
// bytes and decodes again to the same checkpoint.
func FuzzDecode(f *testing.F) {
	for _, ck := range []*checkpoint.Checkpoint{seed(), seedReleased(), seedInvites(), seedWindow(), seedWindowEmpty()} {
		b := encode(f, ck)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{checkpoint.Version1})
	f.Fuzz(func(t *testing.T, b []byte) {
		ck, err := checkpoint.Decode(b)
		if err != nil {
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Decode error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if err := ck.WellFormed(); err != nil {
			t.Fatalf("Decode accepted a checkpoint that is not well formed: %v", err)
		}
		again, err := checkpoint.Encode(ck)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded checkpoint re-encodes to %x, %v; stored %x", again, err, b)
		}
		ck2, err := checkpoint.Decode(again)
		if err != nil || !cmp.Equal(ck, ck2, ckCmp) {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", ck, ck2, err)
		}
	})
}

// TestEncode_VersionIsTheOldestThatHoldsIt: releases make a checkpoint
// version 2, invitation uses version 3, a window version 4, and each
// round-trips.
func TestEncode_VersionIsTheOldestThatHoldsIt(t *testing.T) {
	for _, tt := range []struct {
		ck   *checkpoint.Checkpoint
		want byte
	}{
		{seed(), checkpoint.Version1},
		{seedReleased(), checkpoint.Version2},
		{seedInvites(), checkpoint.Version3},
		{seedWindow(), checkpoint.Version4},
		{seedWindowEmpty(), checkpoint.Version4},
	} {
		b := encode(t, tt.ck)
		if b[0] != tt.want {
			t.Errorf("Encode(%+v) is version %d, want %d", tt.ck, b[0], tt.want)
		}
		got, err := checkpoint.Decode(b)
		if err != nil {
			t.Fatalf("Decode(version %d) = %v", b[0], err)
		}
		if diff := cmp.Diff(tt.ck, got, ckCmp); diff != "" {
			t.Errorf("version %d round trip (-want +got):\n%s", b[0], diff)
		}
	}
}

// TestState: a checkpoint's State holds its members with their releases,
// its invitation uses, and its records with the rows that produced them.
func TestState(t *testing.T) {
	st := seedInvites().State()
	if len(st.InviteUses) != 2 || st.InviteUses[3] != 1 || st.InviteUses[9] != 2 {
		t.Errorf("State().InviteUses = %v, want 3:1 9:2", st.InviteUses)
	}
	if st.Applied != 3 || st.Produced != 2 || st.LastSeq != 2 || len(st.Members) != 2 || !st.Members[1].Bound {
		t.Errorf("State() = %+v, want the seed's positions and members", st)
	}
	if n := st.Records.Len(); n != 1 {
		t.Errorf("State() retains %d records, want record 2", n)
	} else if r := st.Records.At(0); r.Source != 2 || r.Seq != 2 || r.Payload() != nil {
		t.Errorf("State() retains %+v, want record 2 from oplog row 2 without its payload", r)
	}
	if rel := seedReleased().State(); rel.Members[0].Released != 2 || rel.Members[1].Released != 0 {
		t.Errorf("State() of a release = %+v, want member 0 released through 2", rel.Members)
	}
	if w := seedWindow().State(); w.Records.Len() != 0 || w.LastSeq != 2 || w.InviteUses[9] != 2 {
		t.Errorf("State() of a window = %+v, want no records (the caller reads them) and the rest", w)
	}
}

// TestFirstRetained: where the first retained record is, held or named.
func TestFirstRetained(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ck    *checkpoint.Checkpoint
		seq   oplog.Seq
		oplog uint64
		ok    bool
	}{
		{"records held", seed(), 2, 2, true},
		{"none held", seedReleased(), 0, 0, false},
		{"window", seedWindow(), 2, 2, true},
		{"empty window", seedWindowEmpty(), 0, 0, false},
	} {
		seq, row, ok := tt.ck.FirstRetained()
		if ok != tt.ok || (ok && (seq != tt.seq || row != tt.oplog)) {
			t.Errorf("%s: FirstRetained() = %v, %d, %v, want %v, %d, %v", tt.name, seq, row, ok, tt.seq, tt.oplog, tt.ok)
		}
	}
}

// TestDecode_RejectsMalformedWindows: a window outside the rows and
// records a checkpoint covers, or beside records, is ErrCorrupt, and so
// is a version 4 body without a window.
func TestDecode_RejectsMalformedWindows(t *testing.T) {
	enc := encode(t, seedWindow())
	if _, err := checkpoint.Decode(enc); err != nil {
		t.Fatalf("Decode(valid) error: %v", err)
	}
	for _, tt := range []struct {
		name   string
		mutate func(ck *checkpoint.Checkpoint)
	}{
		{"first 0", func(ck *checkpoint.Checkpoint) { ck.Window.First = 0 }},
		{"first past the last seq", func(ck *checkpoint.Checkpoint) { ck.Window.First = 4 }},
		{"oplog row 0", func(ck *checkpoint.Checkpoint) { ck.Window.Oplog = 0 }},
		{"oplog row not covered", func(ck *checkpoint.Checkpoint) { ck.Window.Oplog = 3 }},
		{"outbox row not covered", func(ck *checkpoint.Checkpoint) { ck.Window.Outbox = 2 }},
		{"empty window elsewhere", func(ck *checkpoint.Checkpoint) { ck.Window = &checkpoint.Window{First: 3, Oplog: 1, Outbox: 2} }},
		{"release of a retained record", func(ck *checkpoint.Checkpoint) { ck.Released = []checkpoint.Released{{Member: 1, Through: 2}} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bad, err := checkpoint.Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			tt.mutate(bad)
			if _, err := checkpoint.Decode(encode(t, bad)); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Decode = %v, want ErrCorrupt", err)
			}
		})
	}
	both := seedWindow()
	both.Records = seed().Records
	if _, err := checkpoint.Encode(both); err == nil {
		t.Errorf("Encode(a window and records) = nil error, want one")
	}
	type body struct {
		//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
		_msgpack   struct{} `msgpack:",as_array"`
		Checkpoint *checkpoint.Checkpoint
		Released   []checkpoint.Released
		Invites    []checkpoint.Invite
		Window     *checkpoint.Window
	}
	v3 := seedInvites()
	for _, tt := range []struct {
		name string
		b    body
	}{
		{"version 4 without a window", body{Checkpoint: v3, Invites: v3.Invites}},
		{"version 4 with records", body{Checkpoint: v3, Invites: v3.Invites, Window: &checkpoint.Window{First: 2, Oplog: 2, Outbox: 1}}},
	} {
		b, err := msgpack.Marshal(&tt.b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkpoint.Decode(framed(checkpoint.Version4, b)); !errors.Is(err, checkpoint.ErrCorrupt) {
			t.Errorf("Decode(%s) = %v, want ErrCorrupt", tt.name, err)
		}
	}
}

// TestDecode_RejectsMalformed: a checkpoint that no state can have, or
// bytes that are not a checkpoint's one encoding, are ErrCorrupt.
func TestDecode_RejectsMalformed(t *testing.T) {
	good := &checkpoint.Checkpoint{Index: 3, Produced: 2, LastSeq: 2,
		Members: []checkpoint.Member{{Generation: 1, Cursor: 2}, {Generation: 1, Bound: true, Conn: oplog.ConnID{Server: 1, Ordinal: 2}, BindingSource: 2}},
		Records: []checkpoint.Record{{Record: outbox.Record{Seq: 2, Kind: outbox.KindJoined, Participant: 1, Recipients: []oplog.ParticipantID{0}}, Oplog: 2, Outbox: 1}},
		Marks:   []checkpoint.Mark{{At: 5, Oplog: 1, Outbox: 1}}}
	enc := encode(t, good)
	if _, err := checkpoint.Decode(enc); err != nil {
		t.Fatalf("Decode(valid) error: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(ck *checkpoint.Checkpoint)
	}{
		{"covers no row", func(ck *checkpoint.Checkpoint) { ck.Index = 0 }},
		{"generation 0", func(ck *checkpoint.Checkpoint) { ck.Members[0].Generation = 0 }},
		{"cursor past last seq", func(ck *checkpoint.Checkpoint) { ck.Members[0].Cursor = 3 }},
		{"bound without connection", func(ck *checkpoint.Checkpoint) { ck.Members[1].Conn = oplog.ConnID{} }},
		{"connection without binding", func(ck *checkpoint.Checkpoint) { ck.Members[0].Conn = oplog.ConnID{Server: 1, Ordinal: 1} }},
		{"binding source past index", func(ck *checkpoint.Checkpoint) { ck.Members[1].BindingSource = 3 }},
		{"record past last seq", func(ck *checkpoint.Checkpoint) { ck.Records[0].Record.Seq = 3 }},
		{"record of an unknown member", func(ck *checkpoint.Checkpoint) { ck.Records[0].Record.Participant = 5 }},
		{"recipient out of range", func(ck *checkpoint.Checkpoint) { ck.Records[0].Record.Recipients = []oplog.ParticipantID{7} }},
		{"record from an uncovered row", func(ck *checkpoint.Checkpoint) { ck.Records[0].Oplog = 3 }},
		{"unknown record kind", func(ck *checkpoint.Checkpoint) { ck.Records[0].Record.Kind = 42 }},
		{"mark past the rows", func(ck *checkpoint.Checkpoint) { ck.Marks[0].Oplog = 4 }},
		{"mark going back", func(ck *checkpoint.Checkpoint) {
			ck.Marks = append(ck.Marks, checkpoint.Mark{At: 4, Oplog: 1, Outbox: 1})
		}},
		{"release of an unknown member", func(ck *checkpoint.Checkpoint) { ck.Released = []checkpoint.Released{{Member: 2, Through: 1}} }},
		{"release at its member's cursor", func(ck *checkpoint.Checkpoint) { ck.Released = []checkpoint.Released{{Member: 0, Through: 2}} }},
		{"release of a retained record", func(ck *checkpoint.Checkpoint) { ck.Released = []checkpoint.Released{{Member: 1, Through: 2}} }},
		{"releases out of order", func(ck *checkpoint.Checkpoint) {
			ck.Released = []checkpoint.Released{{Member: 1, Through: 1}, {Member: 1, Through: 1}}
		}},
		{"invitation used 0 times", func(ck *checkpoint.Checkpoint) { ck.Invites = []checkpoint.Invite{{ID: 3, Uses: 0}} }},
		{"invitations out of order", func(ck *checkpoint.Checkpoint) {
			ck.Invites = []checkpoint.Invite{{ID: 9, Uses: 1}, {ID: 3, Uses: 1}}
		}},
		{"invitation used more than the members", func(ck *checkpoint.Checkpoint) { ck.Invites = []checkpoint.Invite{{ID: 3, Uses: 3}} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad, err := checkpoint.Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			tt.mutate(bad)
			if _, err := checkpoint.Decode(encode(t, bad)); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Decode = %v, want ErrCorrupt", err)
			}
		})
	}
	// Trailing bytes inside a valid CRC are not canonical.
	body := append(bytes.Clone(enc[1:len(enc)-4]), 0xc0)
	if _, err := checkpoint.Decode(framed(checkpoint.Version1, body)); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("Decode(trailing bytes) = %v, want ErrCorrupt", err)
	}

	// A release makes the checkpoint version 2, which decodes only with
	// releases, and only as version 2.
	released := *good
	released.Released = []checkpoint.Released{{Member: 1, Through: 1}}
	enc2 := encode(t, &released)
	if enc2[0] != checkpoint.Version2 {
		t.Fatalf("Encode(with a release) is version %d, want %d", enc2[0], checkpoint.Version2)
	}
	withReleased := func(ck *checkpoint.Checkpoint, rel []checkpoint.Released) []byte {
		type body struct {
			//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
			_msgpack   struct{} `msgpack:",as_array"`
			Checkpoint *checkpoint.Checkpoint
			Released   []checkpoint.Released
		}
		b, err := msgpack.Marshal(&body{Checkpoint: ck, Released: rel})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := framed(checkpoint.Version2, withReleased(&released, released.Released)); !bytes.Equal(got, enc2) {
		t.Fatalf("version 2 is not [checkpoint, releases]: %x, Encode wrote %x", got, enc2)
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"version 2 without releases", framed(checkpoint.Version2, withReleased(good, nil))},
		{"version 2 without a checkpoint", framed(checkpoint.Version2, withReleased(nil, released.Released))},
		{"version 1 with releases", framed(checkpoint.Version1, enc2[1:len(enc2)-4])},
		{"version 2 of a version 1 body", framed(checkpoint.Version2, enc[1:len(enc)-4])},
		{"version 4 of a version 1 body", framed(checkpoint.Version4, enc[1:len(enc)-4])},
		{"version 5", framed(5, enc[1:len(enc)-4])},
	} {
		if _, err := checkpoint.Decode(tt.b); !errors.Is(err, checkpoint.ErrCorrupt) {
			t.Errorf("Decode(%s) = %v, want ErrCorrupt", tt.name, err)
		}
	}
}

// framed is body framed as a checkpoint of version v, with a valid CRC.
func framed(v byte, body []byte) []byte {
	b := append([]byte{v}, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

// TestGolden: the fixed checkpoints of each version are the bytes the
// golden file holds, and those bytes decode to them.
func TestGolden(t *testing.T) {
	values := []struct {
		name string
		ck   *checkpoint.Checkpoint
	}{
		{"version 1", seed()},
		{"version 2", seedReleased()},
		{"version 3", seedInvites()},
		{"version 4", seedWindow()},
		{"version 4, no record retained", seedWindowEmpty()},
	}
	var want []golden.Value
	for _, v := range values {
		want = append(want, golden.Value{Name: v.name, Bytes: encode(t, v.ck)})
	}
	want = append(want, golden.Value{Name: "key", Bytes: []byte(checkpoint.Key(12))})
	stored := golden.Check(t, "testdata/golden.txt", want)
	for _, v := range values {
		got, err := checkpoint.Decode(stored[v.name])
		if err != nil {
			t.Errorf("Decode(golden %s) = %v", v.name, err)
			continue
		}
		if diff := cmp.Diff(v.ck, got, ckCmp); diff != "" {
			t.Errorf("Decode(golden %s) (-want +got):\n%s", v.name, diff)
		}
	}
}
