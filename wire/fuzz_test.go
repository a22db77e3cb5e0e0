package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// chunkReader hands out src in reads whose sizes come from sizes, cycling,
// the way a TCP stream splits frames at arbitrary points.
type chunkReader struct {
	src   []byte
	sizes []byte
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.src) == 0 {
		return 0, io.EOF
	}
	n := len(r.src)
	if len(r.sizes) > 0 {
		n = min(n, int(r.sizes[r.i%len(r.sizes)])+1)
		r.i++
	}
	n = copy(p, r.src[:n])
	r.src = r.src[n:]
	return n, nil
}

// goldenFrames returns the golden frames of one direction, by file name.
func goldenFrames(tb testing.TB, prefix string) map[string][]byte {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenDir, prefix+"*.bin"))
	if err != nil || len(paths) == 0 {
		tb.Fatalf("no golden frames %s*.bin in %s: %v", prefix, goldenDir, err)
	}
	frames := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		frames[strings.TrimSuffix(filepath.Base(p), ".bin")] = b
	}
	return frames
}

// hostileBodies are bodies that lie about their sizes or shape.
func hostileBodies() [][]byte {
	return [][]byte{
		nil,
		raw(0xc1),
		append(raw(0x81, 0xa1, 't', 0xc6), be32(0xffffffff)...),                                                                                    // 4 GiB bin
		append(raw(0xdf), be32(0xffffffff)...),                                                                                                     // 2^32-1 map entries
		append(raw(0x82, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g', 0xa1, 'x'), bytes.Repeat([]byte{0x91}, 5000)...),                                     // deep, unclosed
		append(append(raw(0x83, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g', 0xa2, 'i', 'd', 0x01, 0xa1, 'x'), bytes.Repeat([]byte{0x91}, 5000)...), 0xc0), // deep, closed
		append(Encode(&Ping{ID: 1}), 0x00),                                                                                                         // trailing byte
		raw(0x82, 0x01, 0x02, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g'),                                                                                 // non-string key
		raw(0x81, 0xa1, 't', 0xc7, 0xff, 0x01),                                                                                                     // ext8 past end
	}
}

func FuzzReadFrame(f *testing.F) {
	var all []byte
	for _, fr := range goldenFrames(f, "") {
		f.Add(fr, []byte{}, uint16(0))
		f.Add(fr, []byte{0, 3, 1}, uint16(64))
		all = append(all, fr...)
	}
	f.Add(all, []byte{7, 0, 200}, uint16(0))
	f.Add(be32(1<<31), []byte{}, uint16(0))
	f.Add(be32(0xffffffff), []byte{1}, uint16(0))
	f.Add(append(be32(100), filled(50)...), []byte{}, uint16(0))
	f.Add(raw(0, 0), []byte{}, uint16(0))
	f.Add(append(frameOf(nil), frameOf(raw(1, 2, 3))...), []byte{0}, uint16(2))

	f.Fuzz(func(t *testing.T, data, sizes []byte, maxFrame uint16) {
		r := NewReader(&chunkReader{src: data, sizes: sizes}, int(maxFrame))
		limit := uint64(r.MaxFrame())
		rest := data // what a straightforward parser still has to read
		for range len(data) + 1 {
			body, err := r.ReadFrame()
			if uint64(cap(r.buf)) > limit || uint64(cap(body)) > limit {
				t.Fatalf("buffer capacity %d (body %d) exceeds the limit %d", cap(r.buf), cap(body), limit)
			}
			// The reference: the frame grammar read directly off data.
			switch {
			case len(rest) == 0:
				if err != io.EOF {
					t.Fatalf("at the end: ReadFrame = %v, want io.EOF", err)
				}
				return
			case len(rest) < HeaderLen:
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("truncated header: ReadFrame = %v, want io.ErrUnexpectedEOF", err)
				}
				return
			}
			n := uint64(binary.BigEndian.Uint32(rest))
			switch {
			case n > limit:
				var fe *FrameTooLargeError
				if !errors.As(err, &fe) || fe.Length != n {
					t.Fatalf("header %d > limit %d: ReadFrame = %v, want FrameTooLargeError{Length: %d}", n, limit, err, n)
				}
				return
			case uint64(len(rest)-HeaderLen) < n:
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("truncated body: ReadFrame = %v, want io.ErrUnexpectedEOF", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadFrame = %v, want a frame of %d bytes", err, n)
			}
			want := rest[HeaderLen : HeaderLen+n]
			if !bytes.Equal(body, want) {
				t.Fatalf("ReadFrame = %x, want %x", body, want)
			}
			rest = rest[HeaderLen+n:]
		}
		t.Fatalf("ReadFrame did not reach the end of %d bytes", len(data))
	})
}

// checkDecoded holds for every outcome of a decoder: a *DecodeError of a
// known class on failure; on success, an encoding that decodes to the same
// value and is itself stable.
func checkDecoded(t *testing.T, decode func([]byte) (Message, error), body []byte, requests bool) {
	m, err := decode(body)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
		}
		switch de.Class {
		case Malformed:
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Malformed error %v does not wrap ErrMalformed", err)
			}
		case BadRequest:
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("BadRequest error %v does not wrap ErrBadRequest", err)
			}
			if requests && de.Type != TypeHello && !de.HasID {
				t.Fatalf("BadRequest error %v of a request has no id", err)
			}
		default:
			t.Fatalf("error %v has class %v", err, de.Class)
		}
		if m != nil {
			t.Fatalf("decode returned %#v with error %v", m, err)
		}
		return
	}
	enc := Encode(m)
	m2, err := decode(enc)
	if err != nil {
		t.Fatalf("decode(Encode(%#v)) error: %v", m, err)
	}
	if diff := cmp.Diff(m, m2); diff != "" {
		t.Fatalf("round trip mismatch (-decoded +re-decoded):\n%s", diff)
	}
	if enc2 := Encode(m2); !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
	}
	if len(enc) > len(body)+64 && len(body) > 0 {
		// Compact encoding never needs much more than the peer used;
		// the slack covers empty payloads/arrays the peer left out.
		if _, isHello := m.(*Hello); !isHello {
			t.Fatalf("encoding of %d bytes from a body of %d", len(enc), len(body))
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, fr := range goldenFrames(f, "client_") {
		f.Add(fr[HeaderLen:])
	}
	for _, b := range hostileBodies() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecoded(t, DecodeRequest, body, true)
	})
}

func FuzzDecodeServerMessage(f *testing.F) {
	for _, fr := range goldenFrames(f, "server_") {
		f.Add(fr[HeaderLen:])
	}
	for _, b := range hostileBodies() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecoded(t, DecodeServerMessage, body, false)
	})
}
