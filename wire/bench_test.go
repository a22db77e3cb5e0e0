package wire

import (
	"bytes"
	"io"
	"testing"
)

func benchEncodeDecode(b *testing.B, m Message, decode func([]byte) (Message, error)) {
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		buf = AppendEncode(buf[:0], m)
		if _, err := decode(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func benchTell() *Tell {
	return &Tell{ID: 123456, Conversation: 42, Participant: 3, Generation: 7, Token: testToken(1), Payload: filled(256)}
}

func benchDelivery() *Delivery {
	return &Delivery{Conversation: 42, Recipient: 1, Seq: 100000, Kind: KindRecord, Participant: 3, Payload: filled(256)}
}

func BenchmarkTell_EncodeDecode(b *testing.B) { benchEncodeDecode(b, benchTell(), DecodeRequest) }

func BenchmarkDelivery_EncodeDecode(b *testing.B) {
	benchEncodeDecode(b, benchDelivery(), DecodeServerMessage)
}

func BenchmarkTell_Encode(b *testing.B) {
	b.ReportAllocs()
	m := benchTell()
	var buf []byte
	for b.Loop() {
		buf = AppendEncode(buf[:0], m)
	}
}

func BenchmarkTell_Decode(b *testing.B) {
	b.ReportAllocs()
	body := Encode(benchTell())
	for b.Loop() {
		if _, err := DecodeRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDelivery_Decode(b *testing.B) {
	b.ReportAllocs()
	body := Encode(benchDelivery())
	for b.Loop() {
		if _, err := DecodeServerMessage(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDelivery_WriteRead is the whole path of a push: encode into a
// frame, write, read the frame, decode.
func BenchmarkDelivery_WriteRead(b *testing.B) {
	b.ReportAllocs()
	var stream bytes.Buffer
	w := NewWriter(&stream, 0)
	var m Message = benchDelivery()
	r := NewReader(&stream, 0)
	for b.Loop() {
		if err := w.WriteMessage(m); err != nil {
			b.Fatal(err)
		}
		body, err := r.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeServerMessage(body); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		b.Fatalf("ReadFrame at the end = %v", err)
	}
}

// BenchmarkAppendFrame is a frame as the server's writer queues one: each
// in a slice of its own.
func BenchmarkAppendFrame(b *testing.B) {
	for _, m := range []Message{
		&Told{ID: 5, Conversation: 1 << 40, Seq: 70000},
		&Acked{ID: 6, Conversation: 1 << 40, Participant: 1, Cursor: 70000},
		benchDelivery(),
	} {
		b.Run(m.Type(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = AppendFrame(nil, m)
			}
		})
	}
}
