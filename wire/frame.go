package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sync"
)

// retainLimit is the largest buffer a Reader or Writer keeps between frames.
// A Reader reads bigger bodies into buffers of bigPool, returned when the
// next ReadFrame begins, so an idle connection that once carried a 1 MiB
// frame does not pin 1 MiB.
const retainLimit = 64 << 10

// bigPool holds the buffers of bodies above retainLimit, shared by every
// Reader: class k holds buffers of retainLimit<<k bytes (k <= 16 covers
// every length a header can announce). A stream of large frames then
// reuses a few buffers rather than allocating each body, and each
// doubling on the way to its length, afresh (about three times the bytes
// received, a garbage rate the collector paces the heap against).
var bigPool [17]sync.Pool

// bigClass returns the class of the smallest pooled buffer of at least n
// bytes (n > retainLimit).
func bigClass(n uint64) int { return bits.Len64((n - 1) / retainLimit) }

func getBig(n uint64) *[]byte {
	k := bigClass(n)
	if b, ok := bigPool[k].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, uint64(retainLimit)<<k)
	return &b
}

func putBig(b *[]byte) {
	if b != nil {
		bigPool[bigClass(uint64(len(*b)))].Put(b)
	}
}

// firstChunk is the most a Reader allocates for a body before that many
// bytes have arrived; it then grows by doubling, so what a peer makes it
// allocate stays within twice what it actually sent, and never above the
// announced length.
const firstChunk = 4 << 10

func limit(maxFrame int) uint64 {
	switch {
	case maxFrame <= 0:
		return DefaultMaxFrame
	case uint64(maxFrame) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint64(maxFrame)
}

// Reader reads frames from a byte stream. It is not safe for concurrent use.
type Reader struct {
	r   *bufio.Reader
	max uint64
	hdr [HeaderLen]byte
	buf []byte  // reused between frames while cap(buf) <= retainLimit
	big *[]byte // the bigPool buffer of the last body, returned at the next ReadFrame
	err error   // sticky
}

// NewReader returns a Reader of r that accepts bodies of at most maxFrame
// bytes (DefaultMaxFrame when maxFrame <= 0; at most math.MaxUint32). If r
// is a *bufio.Reader it is used as is; otherwise it is wrapped in one, which
// may read ahead of the frame being returned: once a Reader is in use, read
// r only through it.
func NewReader(r io.Reader, maxFrame int) *Reader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReader(r)
	}
	return &Reader{r: br, max: limit(maxFrame)}
}

// MaxFrame returns the largest body the Reader accepts.
func (r *Reader) MaxFrame() int { return int(r.max) }

// Buffered returns how many bytes the Reader has read ahead of the frames
// it returned: when it is 0, the next ReadFrame waits for the stream. A
// client that queues requests while it handles what it read writes them
// before it waits.
func (r *Reader) Buffered() int { return r.r.Buffered() }

// ReadFrame reads one frame and returns its body.
//
// The body is owned by the Reader and valid only until the next call to
// ReadFrame: the Reader reuses its buffer. Decoding it (DecodeRequest,
// DecodeServerMessage) yields a message that does not alias it.
//
// Errors:
//   - io.EOF, unwrapped, when the stream ends cleanly at a frame boundary;
//   - an error wrapping io.ErrUnexpectedEOF when it ends inside a header or
//     body;
//   - a *FrameTooLargeError (errors.Is ErrFrameTooLarge) carrying the
//     announced length, when the header announces more than the limit. It
//     is decided from the header alone: nothing of the body is read or
//     allocated;
//   - otherwise the underlying reader's error, wrapped.
//
// Errors are sticky: once ReadFrame failed, it returns the same error again,
// since the stream is no longer at a frame boundary.
func (r *Reader) ReadFrame() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	body, err := r.readFrame()
	if err != nil {
		r.err = err
		return nil, err
	}
	return body, nil
}

func (r *Reader) readFrame() ([]byte, error) {
	// The last body is no longer valid: its pooled buffer may serve
	// another Reader while this one waits.
	putBig(r.big)
	r.big = nil
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("wire: reading frame header: %w", err)
	}
	n := uint64(binary.BigEndian.Uint32(r.hdr[:]))
	if n > r.max {
		return nil, &FrameTooLargeError{Length: n, Max: r.max}
	}
	if n > uint64(cap(r.buf)) && n <= firstChunk {
		r.buf = make([]byte, min(firstChunk, r.max))
	}
	if n <= uint64(cap(r.buf)) {
		body := r.buf[:n]
		if _, err := io.ReadFull(r.r, body); err != nil {
			return nil, bodyErr(err)
		}
		return body, nil
	}
	// Grow as the bytes arrive rather than trusting the header with an
	// allocation of its size: what a peer makes a Reader hold stays
	// within four times what it sent (a pooled buffer is at most twice
	// the doubling asked for).
	body := r.buf[:cap(r.buf)]
	if len(body) < firstChunk {
		body = make([]byte, min(n, firstChunk))
	}
	var big *[]byte
	got := uint64(0)
	for {
		m, err := io.ReadFull(r.r, body[got:min(n, uint64(len(body)))])
		got += uint64(m)
		if err != nil {
			putBig(big)
			return nil, bodyErr(err)
		}
		if got == n {
			break
		}
		size := min(n, 2*uint64(len(body)))
		var grown []byte
		var grownBig *[]byte
		if size > retainLimit {
			grownBig = getBig(size)
			grown = *grownBig
		} else {
			grown = make([]byte, size)
		}
		copy(grown, body[:got])
		if big == nil && cap(body) <= retainLimit && cap(body) > cap(r.buf) {
			// Kept for the next frame, whose first bytes it takes.
			r.buf = body[:0]
		}
		putBig(big)
		body, big = grown, grownBig
	}
	if big == nil && cap(body) <= retainLimit {
		r.buf = body
	}
	r.big = big
	return body[:n:n], nil
}

func bodyErr(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("wire: reading frame body: %w", err)
}

// Writer writes frames to a byte stream. It is not safe for concurrent use;
// Conn serializes writers.
//
// Each frame, header and body, goes to the underlying writer in exactly one
// Write call, so a Writer adds no buffering of its own and needs no Flush:
// when WriteFrame returns nil the frame has been handed to the underlying
// writer (if that is a *bufio.Writer, flushing it is the caller's job).
type Writer struct {
	w   io.Writer
	max uint64
	buf []byte // reused between frames while cap(buf) <= retainLimit
}

// NewWriter returns a Writer to w that refuses bodies longer than maxFrame
// bytes (DefaultMaxFrame when maxFrame <= 0; at most math.MaxUint32).
func NewWriter(w io.Writer, maxFrame int) *Writer {
	return &Writer{w: w, max: limit(maxFrame)}
}

// MaxFrame returns the largest body the Writer sends.
func (w *Writer) MaxFrame() int { return int(w.max) }

// SetMaxFrame changes the limit, as a client does on learning the server's
// max_frame from welcome. maxFrame <= 0 means DefaultMaxFrame.
func (w *Writer) SetMaxFrame(maxFrame int) { w.max = limit(maxFrame) }

// WriteFrame writes body as one frame. A body longer than the limit is
// refused with a *FrameTooLargeError (errors.Is ErrFrameTooLarge) and
// nothing is written. Other errors are the underlying writer's, wrapped; the
// frame may then have been partly written. WriteFrame does not retain body.
func (w *Writer) WriteFrame(body []byte) error {
	if uint64(len(body)) > w.max {
		return &FrameTooLargeError{Length: uint64(len(body)), Max: w.max}
	}
	b := binary.BigEndian.AppendUint32(w.buf[:0], uint32(len(body)))
	return w.write(append(b, body...))
}

// WriteMessage encodes m and writes it as one frame, with the errors of
// WriteFrame.
func (w *Writer) WriteMessage(m Message) error {
	b := AppendFrame(w.buf[:0], m)
	if n := uint64(len(b) - HeaderLen); n > w.max {
		w.keep(b)
		return &FrameTooLargeError{Length: n, Max: w.max}
	}
	return w.write(b)
}

func (w *Writer) write(b []byte) error {
	_, err := w.w.Write(b)
	w.keep(b)
	if err != nil {
		return fmt.Errorf("wire: writing frame: %w", err)
	}
	return nil
}

func (w *Writer) keep(b []byte) {
	if cap(b) <= retainLimit {
		w.buf = b[:0]
	}
}
