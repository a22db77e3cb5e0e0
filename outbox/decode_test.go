package outbox

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
)

// reflected is Row without its DecodeMsgpack: msgpack decodes it by
// reflection, as every row was decoded before.
type reflected Row

// FuzzDecode_AsReflection holds Row.DecodeMsgpack to the reflective
// decoder it replaced, on any bytes: what it accepts, reflection accepts
// as the same row; what reflection accepts and it refuses is not a row
// Encode writes (the map form, anywhere in the row, which reflection also
// takes). Bytes that declare more items than they hold are left out:
// Decode refuses them (checkBounds) before decoding, and reflection would
// allocate what they declare.
func FuzzDecode_AsReflection(f *testing.F) {
	rows := []Row{
		{Kind: Produced, Source: 4, Records: []Record{
			{Seq: 7, Kind: KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{0, 2, 3}},
			{Seq: 8, Kind: KindDied, Participant: 2, Cause: 4, Recipients: []oplog.ParticipantID{}},
			{Seq: 9, Kind: KindLeft, Participant: 300},
		}},
		{Kind: AckAdvanced, Source: 1 << 40, Participant: 3, Through: 8},
		{Kind: Produced, Records: []Record{}},
		{},
	}
	for i := range rows {
		b, err := msgpack.Marshal((*reflected)(&rows[i]))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{0xc0})
	f.Add([]byte{0x90})
	f.Add([]byte{0x94, 1, 2, 0x90, 3})
	f.Add([]byte{0x95, 1, 2, 0x91, 0xc0, 3, 4})
	f.Add([]byte{0x95, 1, 2, 0x91, 0x95, 1, 2, 3, 4, 0xdd, 0xff, 0xff, 0xff, 0xff, 5, 6})
	f.Add([]byte{0x95, 0xd0, 0xff, 2, 0xc0, 3, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkBounds(b) != nil {
			return
		}
		var got Row
		gotErr := msgpack.Unmarshal(b, &got)
		var want reflected
		wantErr := msgpack.Unmarshal(b, &want)
		switch {
		case gotErr == nil && wantErr != nil:
			t.Fatalf("%x: DecodeMsgpack accepts what reflection refuses (%v)", b, wantErr)
		case gotErr != nil && wantErr == nil:
			if enc, err := msgpack.Marshal(&want); err == nil && bytes.HasPrefix(b, enc) {
				t.Fatalf("%x: DecodeMsgpack refuses (%v) a row as Encode writes it", b, gotErr)
			}
		case gotErr == nil:
			if diff := cmp.Diff(Row(want), got, cmp.AllowUnexported(Row{}, Record{})); diff != "" {
				t.Fatalf("%x: (-reflection +DecodeMsgpack):\n%s", b, diff)
			}
		}
	})
}

// A retained record's row decodes in a few allocations (the row's records
// and each record's recipients) where reflection took about fifteen.
func TestDecode_ARowIsAFewAllocations(t *testing.T) {
	r := Row{Kind: Produced, Source: 9, Records: []Record{{Seq: 10, Kind: KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{2}}}}
	b, err := Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Decode(b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 4 {
		t.Fatalf("Decode of a one-record row: %.0f allocations, want at most 4", allocs)
	}
	if got, _ := Decode(b); !bytes.Equal(mustEncode(t, &got), b) {
		t.Fatal("the decoded row encodes to other bytes")
	}
}

func mustEncode(t *testing.T, r *Row) []byte {
	t.Helper()
	b, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
