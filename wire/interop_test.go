package wire

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// The tests in this file check this package's hand-written msgpack against
// an independent implementation, the project's msgpack library, as a client
// in another language would.

func TestInterop_LibraryReadsGoldenFrames(t *testing.T) {
	for name, fr := range goldenFrames(t, "") {
		body := fr[HeaderLen:]
		dec := msgpack.NewDecoder(bytes.NewReader(body))
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Errorf("%s: msgpack library: %v", name, err)
			continue
		}
		if _, err := dec.DecodeInterface(); err == nil {
			t.Errorf("%s: the library found a value after the map", name)
		}
		if _, ok := m["t"].(string); !ok {
			t.Errorf("%s: t = %#v, want a string", name, m["t"])
		}
		for k, v := range m {
			switch k {
			case "token", "secret", "payload":
				if _, ok := v.([]byte); !ok {
					t.Errorf("%s: %s = %T, want a bin", name, k, v)
				}
			}
		}
	}
}

func TestInterop_DecodesLibraryEncodings(t *testing.T) {
	tk, sc := testToken(4), testSecret(4)
	tests := []struct {
		name    string
		v       any
		compact bool
		want    Message
	}{
		{
			name: "tell map with int64 values",
			v: map[string]any{"t": "tell", "id": int64(5), "conversation": int64(42), "participant": int8(1),
				"generation": uint16(2), "token": tk[:], "payload": []byte("hi"), "extra": []any{1, "x", nil}},
			want: &Tell{ID: 5, Conversation: 42, Participant: 1, Generation: 2, Token: tk, Payload: []byte("hi")},
		},
		{
			name: "attach map, compact ints",
			v: map[string]any{"t": "attach", "id": uint64(1 << 40), "conversation": 300, "participant": 70000,
				"generation": 1, "secret": sc[:], "token": tk[:]},
			compact: true,
			want:    &Attach{ID: 1 << 40, Conversation: 300, Participant: 70000, Generation: 1, Secret: sc, Token: tk},
		},
		{
			name: "hello struct",
			v: struct {
				T        string `msgpack:"t"`
				Versions []int  `msgpack:"versions"`
				Client   string `msgpack:"client,omitempty"`
			}{"hello", []int{1}, "py"},
			want: &Hello{Versions: []uint64{1}, Client: new("py")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			enc := msgpack.NewEncoder(&buf)
			enc.UseCompactInts(tc.compact)
			enc.SetSortMapKeys(true)
			if err := enc.Encode(tc.v); err != nil {
				t.Fatal(err)
			}
			got, err := DecodeRequest(buf.Bytes())
			if err != nil {
				t.Fatalf("DecodeRequest(%x) error: %v", buf.Bytes(), err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
