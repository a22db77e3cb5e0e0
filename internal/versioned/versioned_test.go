package versioned

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

type row struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Kind    uint8
	At      int64
	Payload []byte
}

// The stored formats' golden tests pin the bytes of each row; this pins
// that Encode is msgpack.Marshal after the version byte whatever the hint.
func TestEncode_IsTheVersionThenMarshal(t *testing.T) {
	for _, r := range []row{{}, {Kind: 3, At: -1}, {Kind: 1, At: 1 << 40, Payload: bytes.Repeat([]byte{7}, 70000)}} {
		want, err := msgpack.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		want = append([]byte{9}, want...)
		for _, hint := range []int{0, 1, 16, len(want), 2 * len(want)} {
			got, err := Encode(9, &r, hint)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("hint %d: Encode gave %d bytes, differing from Marshal's %d", hint, len(got), len(want))
			}
		}
	}
}

// A row sized by its hint is one allocation of its own size, where
// Marshal grows a buffer and Encode of before copied it again.
func TestEncode_ARowOfItsHintIsOneAllocation(t *testing.T) {
	r := row{Kind: 1, Payload: make([]byte, 64<<10)}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := Encode(1, &r, 1+len(r.Payload)+64); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Fatalf("Encode of a 64 KiB row: %.0f allocations, want at most 2 (the buffer, the bytes.Buffer)", allocs)
	}
}
