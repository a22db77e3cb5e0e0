package registry_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/participantd/participantd/internal/golden"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/registry"
)

// FuzzDecode: Decode never panics and refuses with ErrUnknownVersion or
// ErrCorrupt; what it accepts re-encodes to exactly its bytes, the one
// encoding of an entry.
func FuzzDecode(f *testing.F) {
	for _, c := range []oplog.ConversationID{0, 1, 1 << 63, ^oplog.ConversationID(0)} {
		b := registry.Encode(registry.Entry{Conversation: c})
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, 0))
	}
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := registry.Decode(b)
		if err != nil {
			if !errors.Is(err, registry.ErrCorrupt) && !errors.Is(err, registry.ErrUnknownVersion) {
				t.Fatalf("Decode(%x) error %v wraps neither ErrCorrupt nor ErrUnknownVersion", b, err)
			}
			return
		}
		if again := registry.Encode(e); !bytes.Equal(again, b) {
			t.Fatalf("Encode(Decode(%x)) = %x", b, again)
		}
	})
}

// TestEncode_RoundTrip: Decode(Encode(e)) is e.
func TestEncode_RoundTrip(t *testing.T) {
	for _, c := range []oplog.ConversationID{0, 7, 1 << 63, ^oplog.ConversationID(0)} {
		e := registry.Entry{Conversation: c}
		if got, err := registry.Decode(registry.Encode(e)); err != nil || got != e {
			t.Errorf("Decode(Encode(%+v)) = %+v, %v", e, got, err)
		}
	}
}

// TestDecode_Refuses names the error of each malformed entry.
func TestDecode_Refuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, registry.ErrCorrupt},
		{"short", []byte{registry.Version, 0, 0}, registry.ErrCorrupt},
		{"long", append(registry.Encode(registry.Entry{Conversation: 1}), 0), registry.ErrCorrupt},
		{"version 0", []byte{0, 0, 0, 0, 0, 0, 0, 0, 1}, registry.ErrUnknownVersion},
		{"version 2", []byte{2, 0, 0, 0, 0, 0, 0, 0, 1}, registry.ErrUnknownVersion},
	} {
		if _, err := registry.Decode(tt.b); !errors.Is(err, tt.want) {
			t.Errorf("Decode(%s %x) = %v, want %v", tt.name, tt.b, err, tt.want)
		}
	}
}

// TestGolden: the entry of a fixed conversation is the bytes the golden
// file holds, and those bytes decode to it.
func TestGolden(t *testing.T) {
	want := registry.Entry{Conversation: 0x0102030405060708}
	stored := golden.Check(t, "testdata/golden.txt", []golden.Value{{Name: "version 1", Bytes: registry.Encode(want)}})
	if got, err := registry.Decode(stored["version 1"]); err != nil || got != want {
		t.Errorf("Decode(golden version 1) = %+v, %v, want %+v", got, err, want)
	}
}
