package versioned

import (
	"bytes"
	"runtime"
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

// A row sized by its hint costs one buffer of its own size: msgpack's
// Marshal grows a buffer past a 64 KiB payload, and Encode of before then
// copied it, about twice the row. (Counted in bytes, not allocations:
// under the race detector sync.Pool drops a quarter of what is put back,
// so the encoder pool's small allocations vary.)
func TestEncode_ARowOfItsHintIsOneBufferOfItsSize(t *testing.T) {
	r := row{Kind: 1, Payload: make([]byte, 64<<10)}
	hint := 1 + len(r.Payload) + 64
	perCall := func(f func()) uint64 {
		const calls = 20
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range calls {
			f()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / calls
	}
	got := perCall(func() {
		if _, err := Encode(1, &r, hint); err != nil {
			t.Fatal(err)
		}
	})
	if limit := uint64(hint + hint/4); got > limit {
		t.Fatalf("Encode of a %d-byte row allocated %d bytes a call, want at most %d", hint, got, limit)
	}
	marshalThenCopy := perCall(func() {
		b, err := msgpack.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		_ = append([]byte{1}, b...)
	})
	if marshalThenCopy <= uint64(hint+hint/4) {
		t.Fatalf("Marshal and a copy allocated %d bytes a call: this test no longer tells the two apart", marshalThenCopy)
	}
}
