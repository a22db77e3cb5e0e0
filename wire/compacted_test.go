package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCompacted_DecodesFromThePageOfTheSpec decodes the compacted push and
// error as docs/PROTOCOL.md (Compacted history) writes them, field by field,
// and checks that encoding gives back the same bytes.
func TestCompacted_DecodesFromThePageOfTheSpec(t *testing.T) {
	first := uint64(42)
	tests := []struct {
		name string
		body []byte
		want Message
	}{
		{"push", mpMap(4, kv("t", mpS("compacted")), kv("conversation", mpU(7)), kv("recipient", mpU(3)), kv("first", mpU(42))),
			&Compacted{Conversation: 7, Recipient: 3, First: 42}},
		{"error", mpMap(5, kv("t", mpS("error")), kv("id", mpU(9)), kv("code", mpS("compacted")), kv("detail", mpS("d")), kv("first", mpU(42))),
			&Error{ID: 9, Code: CodeCompacted, Detail: "d", First: &first}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeServerMessage(tc.body)
			if err != nil {
				t.Fatalf("DecodeServerMessage error: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
			if enc := Encode(tc.want); !bytes.Equal(enc, tc.body) {
				t.Errorf("Encode = %x, want %x", enc, tc.body)
			}
		})
	}
}

func TestCompacted_MissingFirstIsABadMessage(t *testing.T) {
	body := mpMap(3, kv("t", mpS("compacted")), kv("conversation", mpU(7)), kv("recipient", mpU(3)))
	if _, err := DecodeServerMessage(body); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("DecodeServerMessage(compacted without first) = %v, want ErrBadRequest", err)
	}
}
