package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func frameOf(body []byte) []byte { return append(be32(uint32(len(body))), body...) }

func TestReader_ReadFrame(t *testing.T) {
	ping := Encode(&Ping{ID: 1})
	tests := []struct {
		name    string
		stream  []byte
		max     int
		bodies  [][]byte
		wantErr error // after the bodies; io.EOF is checked for identity
	}{
		{name: "empty stream is a clean EOF", stream: nil, wantErr: io.EOF},
		{name: "one frame then clean EOF", stream: frameOf(ping), bodies: [][]byte{ping}, wantErr: io.EOF},
		{name: "two frames", stream: append(frameOf(ping), frameOf([]byte("x"))...), bodies: [][]byte{ping, []byte("x")}, wantErr: io.EOF},
		{name: "zero-length frame", stream: frameOf(nil), bodies: [][]byte{{}}, wantErr: io.EOF},
		{name: "truncated header", stream: raw(0, 0), wantErr: io.ErrUnexpectedEOF},
		{name: "truncated header after a frame", stream: append(frameOf(ping), 0), bodies: [][]byte{ping}, wantErr: io.ErrUnexpectedEOF},
		{name: "truncated body", stream: frameOf(ping)[:len(ping)], wantErr: io.ErrUnexpectedEOF},
		{name: "header only", stream: be32(10), wantErr: io.ErrUnexpectedEOF},
		{name: "2 GiB header", stream: be32(1 << 31), wantErr: ErrFrameTooLarge},
		{name: "4 GiB-1 header", stream: be32(0xffffffff), wantErr: ErrFrameTooLarge},
		{name: "exactly the limit", stream: frameOf(filled(100)), max: 100, bodies: [][]byte{filled(100)}, wantErr: io.EOF},
		{name: "one over the limit", stream: frameOf(filled(101)), max: 100, wantErr: ErrFrameTooLarge},
		{name: "big frame grows in steps", stream: frameOf(filled(300000)), bodies: [][]byte{filled(300000)}, wantErr: io.EOF},
	}
	for _, tc := range tests {
		for _, chunked := range []bool{false, true} {
			name := tc.name
			var src io.Reader = bytes.NewReader(tc.stream)
			if chunked {
				name += "/one byte at a time"
				src = iotest.OneByteReader(src)
			}
			t.Run(name, func(t *testing.T) {
				r := NewReader(src, tc.max)
				for i, want := range tc.bodies {
					got, err := r.ReadFrame()
					if err != nil {
						t.Fatalf("ReadFrame #%d error: %v", i, err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("ReadFrame #%d = %.32x, want %.32x", i, got, want)
					}
				}
				_, err := r.ReadFrame()
				if tc.wantErr == io.EOF {
					if err != io.EOF {
						t.Fatalf("ReadFrame at the end = %v, want io.EOF itself", err)
					}
				} else if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ReadFrame at the end = %v, want %v", err, tc.wantErr)
				}
				if _, again := r.ReadFrame(); again != err {
					t.Errorf("ReadFrame after %v = %v, want the same error (sticky)", err, again)
				}
			})
		}
	}
}

func TestReader_FrameTooLargeCarriesLength(t *testing.T) {
	_, err := NewReader(bytes.NewReader(be32(1<<31)), 0).ReadFrame()
	var fe *FrameTooLargeError
	if !errors.As(err, &fe) {
		t.Fatalf("ReadFrame = %v, want a *FrameTooLargeError", err)
	}
	if fe.Length != 1<<31 || fe.Max != DefaultMaxFrame {
		t.Errorf("FrameTooLargeError = %+v, want Length 2147483648, Max %d", *fe, DefaultMaxFrame)
	}
}

// headerThenFail hands out a header, then fails the test on any further read:
// an oversized frame must be refused without waiting for its body.
type headerThenFail struct {
	t    *testing.T
	hdr  []byte
	done bool
}

func (r *headerThenFail) Read(p []byte) (int, error) {
	if r.done {
		r.t.Errorf("Read after the header of an oversized frame")
		return 0, io.EOF
	}
	r.done = true
	return copy(p, r.hdr), nil
}

func TestReader_OversizedRefusedFromHeaderAlone(t *testing.T) {
	for _, n := range []uint32{DefaultMaxFrame + 1, 1 << 31, 0xffffffff} {
		src := &headerThenFail{t: t, hdr: be32(n)}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		_, err := NewReader(src, 0).ReadFrame()
		runtime.ReadMemStats(&ms1)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("ReadFrame(header %d) = %v, want ErrFrameTooLarge", n, err)
		}
		// The bufio buffer (4 KiB) and a few small objects, never the body.
		if got := ms1.TotalAlloc - ms0.TotalAlloc; got > 64<<10 {
			t.Errorf("ReadFrame(header %d) allocated %d bytes", n, got)
		}
	}
}

// TestReader_AllocatesWhatArrives checks that a header announcing the
// limit, followed by little, costs a little, not the limit.
func TestReader_AllocatesWhatArrives(t *testing.T) {
	stream := append(be32(DefaultMaxFrame), filled(100)...)
	r := NewReader(bytes.NewReader(stream), 0)
	if _, err := r.ReadFrame(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadFrame = %v, want io.ErrUnexpectedEOF", err)
	}
	allocs := testing.AllocsPerRun(10, func() {
		r := NewReader(bytes.NewReader(stream), 0)
		r.ReadFrame()
	})
	if allocs > 10 {
		t.Errorf("allocs = %v", allocs)
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	NewReader(bytes.NewReader(stream), 0).ReadFrame()
	runtime.ReadMemStats(&ms1)
	if got := ms1.TotalAlloc - ms0.TotalAlloc; got > 64<<10 {
		t.Errorf("a truncated 1 MiB frame of 100 bytes allocated %d bytes", got)
	}
}

func TestReader_ReusesSmallBuffers(t *testing.T) {
	var stream []byte
	for i := range 100 {
		stream = append(stream, frameOf(filled(i))...)
	}
	stream = append(stream, frameOf(filled(retainLimit+1))...)
	stream = append(stream, frameOf(filled(10))...)
	r := NewReader(bytes.NewReader(stream), 0)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(98, func() { // 99 calls: 1..99
		if _, err := r.ReadFrame(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("ReadFrame of small frames allocs = %v, want 0", allocs)
	}
	big, err := r.ReadFrame()
	if err != nil || len(big) != retainLimit+1 {
		t.Fatalf("ReadFrame(big) = %d bytes, %v", len(big), err)
	}
	if cap(r.buf) > retainLimit {
		t.Errorf("Reader keeps a buffer of %d bytes after a big frame, want <= %d", cap(r.buf), retainLimit)
	}
	if small, err := r.ReadFrame(); err != nil || !bytes.Equal(small, filled(10)) {
		t.Fatalf("ReadFrame after big = %x, %v", small, err)
	}
}

// Bodies above retainLimit come from a pool the Readers share: a stream
// of 64 KiB tells (a frame a little over the limit) is read without
// allocating a body per frame, where each was three times its size in
// doublings before, the garbage that paced a deaf reader's server heap.
func TestReader_BigBodiesAreReusedNotAllocated(t *testing.T) {
	const frames = 50
	const size = 64<<10 + 100
	var stream []byte
	for i := range frames {
		body := filled(size)
		body[0] = byte(i)
		stream = append(stream, frameOf(body)...)
	}
	want := filled(size)
	r := NewReader(bytes.NewReader(stream), 0)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	// Bytes, not allocations: under the race detector sync.Pool drops a
	// quarter of what is put back, so a pooled buffer is now and then
	// allocated again (128 KiB, a quarter of the frames on average);
	// without the pool every frame cost about 190 KiB.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i < frames; i++ {
		got, err := r.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		want[0] = byte(i)
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d differs from what was sent", i)
		}
	}
	runtime.ReadMemStats(&after)
	if perFrame := (after.TotalAlloc - before.TotalAlloc) / (frames - 1); perFrame > 64<<10 {
		t.Errorf("ReadFrame of a 64 KiB frame allocated %d bytes a frame, want under 64 KiB", perFrame)
	}
	if cap(r.buf) > retainLimit {
		t.Errorf("Reader keeps a buffer of %d bytes, want <= %d", cap(r.buf), retainLimit)
	}
}

// Two Readers never share a body: each holds its pooled buffer until its
// own next ReadFrame.
func TestReader_PooledBodiesAreTheirReadersUntilTheNextFrame(t *testing.T) {
	a := NewReader(bytes.NewReader(append(frameOf(bytes.Repeat([]byte{'a'}, 200<<10)), frameOf(filled(3))...)), 0)
	b := NewReader(bytes.NewReader(frameOf(bytes.Repeat([]byte{'b'}, 200<<10))), 0)
	bodyA, err := a.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bodyA, bytes.Repeat([]byte{'a'}, 200<<10)) {
		t.Fatal("a's body changed under another Reader's frame")
	}
	if _, err := a.ReadFrame(); err != nil {
		t.Fatal(err)
	}
}

// countingWriter records every Write call.
type countingWriter struct {
	writes [][]byte
	err    error
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

func TestWriter_OneWritePerFrame(t *testing.T) {
	var cw countingWriter
	w := NewWriter(&cw, 0)
	tell := &Tell{ID: 1, Token: testToken(1), Payload: filled(1000)}
	if err := w.WriteMessage(tell); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFrame([]byte("raw")); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{AppendFrame(nil, tell), frameOf([]byte("raw"))}
	if diff := cmp.Diff(want, cw.writes); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	w = NewWriter(io.Discard, 0)
	var m Message = tell
	allocs := testing.AllocsPerRun(100, func() {
		if err := w.WriteMessage(m); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("WriteMessage allocs = %v, want 0", allocs)
	}
}

func TestWriter_RefusesOversized(t *testing.T) {
	var cw countingWriter
	w := NewWriter(&cw, 100)
	err := w.WriteFrame(filled(101))
	var fe *FrameTooLargeError
	if !errors.As(err, &fe) || fe.Length != 101 || fe.Max != 100 {
		t.Fatalf("WriteFrame(101 bytes) = %v, want a FrameTooLargeError of 101 > 100", err)
	}
	if err := w.WriteMessage(&Tell{ID: 1, Payload: filled(100)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("WriteMessage(oversized tell) = %v, want ErrFrameTooLarge", err)
	}
	if len(cw.writes) != 0 {
		t.Errorf("oversized frames wrote %d times, want 0", len(cw.writes))
	}
	w.SetMaxFrame(1000)
	if err := w.WriteFrame(filled(101)); err != nil {
		t.Errorf("WriteFrame after SetMaxFrame(1000) = %v", err)
	}
}

func TestWriter_WrapsWriteErrors(t *testing.T) {
	boom := errors.New("boom")
	w := NewWriter(&countingWriter{err: boom}, 0)
	if err := w.WriteMessage(&Ping{ID: 1}); !errors.Is(err, boom) {
		t.Errorf("WriteMessage = %v, want it to wrap %v", err, boom)
	}
}

// TestConn_ConcurrentWritersNeverInterleave writes from many goroutines and
// checks that the peer reads whole frames.
func TestConn_ConcurrentWritersNeverInterleave(t *testing.T) {
	a, b := net.Pipe()
	ca, cb := NewConn(a, ConnOptions{}), NewConn(b, ConnOptions{})
	defer ca.Close()
	defer cb.Close()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				d := &Delivery{Conversation: uint64(g), Recipient: 1, Seq: uint64(i + 1), Kind: KindRecord, Payload: filled(g * 100)}
				if err := ca.WriteMessage(d); err != nil {
					t.Errorf("WriteMessage: %v", err)
					return
				}
			}
		}()
	}
	next := make([]uint64, writers)
	for range writers * each {
		m, err := cb.ReadServerMessage()
		if err != nil {
			t.Fatalf("ReadServerMessage: %v", err)
		}
		d := m.(*Delivery)
		if next[d.Conversation]++; d.Seq != next[d.Conversation] || len(d.Payload) != int(d.Conversation)*100 {
			t.Fatalf("delivery %+v out of order or torn", d)
		}
	}
	wg.Wait()
}

func TestConn_RequestsAndAnswers(t *testing.T) {
	a, b := net.Pipe()
	client, server := NewConn(a, ConnOptions{}), NewConn(b, ConnOptions{MaxReadFrame: 4096})
	defer client.Close()
	defer server.Close()
	go func() {
		client.WriteMessage(&Hello{Versions: []uint64{Version}})
		client.WriteMessage(&Tell{ID: 2, Conversation: 42, Token: testToken(1), Payload: []byte("hi")})
		client.WriteFrame(frameOf(nil)[:0]) // a zero-length frame
	}()
	if m, err := server.ReadRequest(); err != nil || m.Type() != TypeHello {
		t.Fatalf("ReadRequest = %v, %v; want hello", m, err)
	}
	if m, err := server.ReadRequest(); err != nil || m.(*Tell).Conversation != 42 {
		t.Fatalf("ReadRequest = %v, %v; want tell", m, err)
	}
	if _, err := server.ReadRequest(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("ReadRequest(empty frame) = %v, want ErrMalformed", err)
	}
}
