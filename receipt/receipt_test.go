package receipt_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/internal/golden"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/receipt"
)

var receiptCmp = cmp.AllowUnexported(receipt.Receipt{})

var (
	tell = oplog.Row{Kind: oplog.KindTell, Participant: 3, Generation: 2,
		Token: oplog.Token{0x01, 0x8f, 0x3a, 0x10, 0x20, 0x30, 0x70, 0x01, 0x80, 2, 3, 4, 5, 6, 7, 8},
		Seq:   1_234_567, Cursor: 1_234_500, At: 1_764_500_000_000, Payload: []byte("a payload")}
	enroll = oplog.Row{Kind: oplog.KindEnroll, Participant: 4, Generation: 1, Token: oplog.Token{7, 1}, Seq: 9, At: -5}
)

// FuzzDecode: a stored receipt never panics the decoder, errors wrap
// ErrCorrupt, and what decodes re-encodes to exactly its bytes in its
// version (each version has one encoding).
func FuzzDecode(f *testing.F) {
	for _, row := range []oplog.Row{tell, enroll} {
		v2, err := receipt.Encode(receipt.Of(&row))
		if err != nil {
			f.Fatal(err)
		}
		v1, err := receipt.EncodeV1(receipt.Of(&row))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v2)
		f.Add(v2[:len(v2)/2])
		f.Add(v1)
		f.Add(v1[:len(v1)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{3, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := receipt.Decode(b)
		if err != nil {
			if !errors.Is(err, receipt.ErrCorrupt) {
				t.Fatalf("Decode(%x) error %v does not wrap ErrCorrupt", b, err)
			}
			return
		}
		encode := receipt.Encode
		if b[0] == receipt.Version1 {
			encode = receipt.EncodeV1
		}
		again, err := encode(r)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded receipt re-encodes to %x, %v; stored %x", again, err, b)
		}
		r2, err := receipt.Decode(again)
		if err != nil || !cmp.Equal(r, r2, receiptCmp) {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", r, r2, err)
		}
	})
}

// TestEncode_CompactAndExact: a tell's receipt and its key stay small
// (they are kept forever, one per operation), and every field comes back
// exactly, for both versions.
func TestEncode_CompactAndExact(t *testing.T) {
	b, err := receipt.Encode(receipt.Of(&tell))
	if err != nil {
		t.Fatal(err)
	}
	key := receipt.Key(12345678901234567890, 9_999_999)
	if len(b) > 52 || len(key) > 40 {
		t.Errorf("a tell's receipt is %d bytes under a %d-byte key, want at most 52 and 40", len(b), len(key))
	}
	want := &receipt.Receipt{Kind: tell.Kind, Participant: tell.Participant, Generation: tell.Generation, Token: tell.Token,
		Seq: tell.Seq, Cursor: tell.Cursor, At: tell.At, PayloadHash: receipt.Hash(tell.Payload)}
	if got, err := receipt.Decode(b); err != nil || !cmp.Equal(want, got, receiptCmp) {
		t.Errorf("Decode(Encode(tell)) = %+v, %v, want %+v", got, err, want)
	}
	old, err := receipt.EncodeV1(want)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := receipt.Decode(old); err != nil || !cmp.Equal(want, got, receiptCmp) {
		t.Errorf("Decode(EncodeV1(tell)) = %+v, %v, want %+v", got, err, want)
	}
	row := tell
	row.Payload = nil
	if diff := cmp.Diff(row, want.Row(), cmp.AllowUnexported(oplog.Row{}, oplog.ConnID{})); diff != "" {
		t.Errorf("Row() of a tell's receipt (-want +got):\n%s", diff)
	}
	b, err = receipt.Encode(receipt.Of(&enroll))
	if err != nil {
		t.Fatal(err)
	}
	wantEnroll := &receipt.Receipt{Kind: enroll.Kind, Participant: enroll.Participant, Generation: enroll.Generation, Token: enroll.Token,
		Seq: enroll.Seq, At: enroll.At}
	if got, err := receipt.Decode(b); err != nil || !cmp.Equal(wantEnroll, got, receiptCmp) {
		t.Errorf("Decode(Encode(enroll)) = %+v, %v, want %+v", got, err, wantEnroll)
	}
	for n := range len(b) {
		if _, err := receipt.Decode(b[:n]); !errors.Is(err, receipt.ErrCorrupt) {
			t.Errorf("receipt cut to %d of %d bytes decoded: %v", n, len(b), err)
		}
	}
}

// TestEncode_RefusesAHashThatDoesNotFitTheKind: a tell needs its payload
// hash, and no other kind carries one.
func TestEncode_RefusesAHashThatDoesNotFitTheKind(t *testing.T) {
	noHash := receipt.Of(&tell)
	noHash.PayloadHash = nil
	withHash := receipt.Of(&enroll)
	withHash.PayloadHash = receipt.Hash(nil)
	for _, r := range []*receipt.Receipt{noHash, withHash} {
		if b, err := receipt.Encode(r); err == nil {
			t.Errorf("Encode(%v with a hash of %d bytes) = %x, want an error", r.Kind, len(r.PayloadHash), b)
		}
	}
}

// TestGolden: the receipts of a fixed tell and enroll, in each version,
// are the bytes the golden file holds, and those bytes decode to them.
func TestGolden(t *testing.T) {
	var want []golden.Value
	values := map[string]*receipt.Receipt{}
	for _, row := range []oplog.Row{tell, enroll} {
		r := receipt.Of(&row)
		v1, err := receipt.EncodeV1(r)
		if err != nil {
			t.Fatal(err)
		}
		v2, err := receipt.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, golden.Value{Name: "version 1 " + row.Kind.String(), Bytes: v1}, golden.Value{Name: "version 2 " + row.Kind.String(), Bytes: v2})
		values["version 1 "+row.Kind.String()], values["version 2 "+row.Kind.String()] = r, r
	}
	want = append(want, golden.Value{Name: "key version 1", Bytes: []byte(receipt.KeyV1(12, 7))}, golden.Value{Name: "key version 2", Bytes: []byte(receipt.Key(12, 7))})
	stored := golden.Check(t, "testdata/golden.txt", want)
	for name, r := range values {
		if got, err := receipt.Decode(stored[name]); err != nil || !cmp.Equal(got, r, receiptCmp) {
			t.Errorf("Decode(golden %s) = %+v, %v, want %+v", name, got, err, r)
		}
	}
}
