package outbox_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// seedRows is one valid row of each kind, with every field used.
func seedRows() []outbox.Row {
	return []outbox.Row{
		{Kind: outbox.Produced, Source: 0, Records: []outbox.Record{
			{Seq: 1, Kind: outbox.KindJoined, Participant: 0},
		}},
		{Kind: outbox.Produced, Source: 4, Records: []outbox.Record{
			{Seq: 7, Kind: outbox.KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{0, 2, 3}},
			{Seq: 8, Kind: outbox.KindDied, Participant: 2, Cause: 4, Recipients: []oplog.ParticipantID{0}},
		}},
		{Kind: outbox.AckAdvanced, Source: 5, Participant: 3, Through: 8},
		{Kind: outbox.Produced, Source: ^uint64(0), Records: []outbox.Record{
			{Seq: ^oplog.Seq(0), Kind: outbox.KindLeft, Participant: ^oplog.ParticipantID(0)},
		}},
	}
}

func encodeAll(tb testing.TB, rows []outbox.Row) [][]byte {
	tb.Helper()
	out := make([][]byte, len(rows))
	for i := range rows {
		b, err := outbox.Encode(&rows[i])
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = b
	}
	return out
}

var rowCmp = []cmp.Option{cmp.AllowUnexported(outbox.Row{}, outbox.Record{}), cmpopts.EquateEmpty()}

// FuzzDecode checks the outbox row decoder on any stored bytes: it never
// panics, refuses with ErrUnknownVersion or ErrCorrupt, and what it accepts
// is well formed and round-trips through Encode, stably.
func FuzzDecode(f *testing.F) {
	for _, b := range encodeAll(f, seedRows()) {
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, 0xc0))
	}
	f.Add([]byte{})
	f.Add([]byte{outbox.Version, 0x95, 0x01, 0x00, 0x90, 0x00, 0x00}) // produced without records
	f.Add([]byte{outbox.Version, 0x95, 0x01, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{9, 0x90})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := outbox.Decode(b)
		if err != nil {
			if !errors.Is(err, outbox.ErrCorrupt) && !errors.Is(err, outbox.ErrUnknownVersion) {
				t.Fatalf("Decode(%x) error %v wraps neither ErrCorrupt nor ErrUnknownVersion", b, err)
			}
			return
		}
		if r.Kind == outbox.Produced && len(r.Records) == 0 || r.Kind != outbox.Produced && r.Kind != outbox.AckAdvanced {
			t.Fatalf("Decode(%x) accepted a malformed %v row", b, r.Kind)
		}
		enc, err := outbox.Encode(&r)
		if err != nil {
			t.Fatalf("Encode(Decode(%x)) error: %v", b, err)
		}
		r2, err := outbox.Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)) error: %v", r, err)
		}
		if diff := cmp.Diff(r, r2, rowCmp...); diff != "" {
			t.Fatalf("round trip mismatch (-decoded +re-decoded):\n%s", diff)
		}
		if enc2, _ := outbox.Encode(&r2); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}

// FuzzValidate splits data into stored rows at the positions cuts gives
// and validates the stream: it never panics, and what it accepts has
// strictly increasing sources, one row per payload.
func FuzzValidate(f *testing.F) {
	var all []byte
	var cuts []byte
	for _, b := range encodeAll(f, seedRows()) {
		all = append(all, b...)
		cuts = append(cuts, byte(len(b)))
	}
	f.Add(all, cuts)
	f.Add(all, []byte{3, 200, 1})
	f.Add([]byte{outbox.Version, 2}, []byte{1})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		var payloads [][]byte
		for i := 0; len(data) > 0 && i < 64; i++ {
			n := len(data)
			if len(cuts) > 0 {
				n = min(n, int(cuts[i%len(cuts)]))
			}
			payloads = append(payloads, data[:n])
			data = data[n:]
		}
		rows, err := outbox.Validate(payloads)
		if err != nil {
			if !errors.Is(err, outbox.ErrCorrupt) && !errors.Is(err, outbox.ErrUnknownVersion) && !errors.Is(err, outbox.ErrMixedVersion) {
				t.Fatalf("Validate error %v wraps no outbox sentinel", err)
			}
			return
		}
		if len(rows) != len(payloads) {
			t.Fatalf("Validate returned %d rows for %d payloads", len(rows), len(payloads))
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].Source <= rows[i-1].Source {
				t.Fatalf("Validate accepted source %d after %d", rows[i].Source, rows[i-1].Source)
			}
		}
	})
}

func TestValidate_SeedRowsAccepted(t *testing.T) {
	rows := seedRows()
	got, err := outbox.Validate(encodeAll(t, rows))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rows, got, rowCmp...); diff != "" {
		t.Errorf("Validate(seed rows) (-want +got):\n%s", diff)
	}
}
