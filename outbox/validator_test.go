package outbox

import (
	"errors"
	"testing"
)

func encodeRow(t *testing.T, r Row) []byte {
	t.Helper()
	b, err := Encode(&r)
	if err != nil {
		t.Fatalf("Encode(%+v): %v", r, err)
	}
	return b
}

// TestValidate_FindingsAndPrecedence checks Validate, and so Validator, on
// whole streams: a mixed version anywhere is reported before a corrupt row
// earlier in the stream, and the first corrupt row wins otherwise.
func TestValidate_FindingsAndPrecedence(t *testing.T) {
	ack := func(src uint64) []byte {
		return encodeRow(t, Row{Kind: AckAdvanced, Source: src, Participant: 1, Through: 2})
	}
	foreign := append([]byte{Version + 1}, ack(9)[1:]...)
	tests := []struct {
		name    string
		rows    [][]byte
		want    error
		wantLen int
	}{
		{"empty stream", nil, nil, 0},
		{"valid", [][]byte{ack(1), ack(2), ack(5)}, nil, 3},
		{"source goes back", [][]byte{ack(1), ack(3), ack(2)}, ErrCorrupt, 0},
		{"garbage", [][]byte{ack(1), {Version, 0xc1}}, ErrCorrupt, 0},
		{"unknown version throughout", [][]byte{foreign, foreign}, ErrUnknownVersion, 0},
		{"mixed after corrupt", [][]byte{ack(1), {Version, 0xc1}, ack(3), foreign}, ErrMixedVersion, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := Validate(tt.rows)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Validate() error = %v, want %v", err, tt.want)
			}
			if len(rows) != tt.wantLen {
				t.Fatalf("Validate() returned %d rows, want %d", len(rows), tt.wantLen)
			}
		})
	}
}
