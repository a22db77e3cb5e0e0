package store

// Owner is implemented by stores that can keep an appended payload instead
// of a copy of it. A payload is most often an encoding made for the one
// Append (an oplog or outbox row), which the caller drops at once: the
// copy Append's contract makes is then one more copy of every appended
// byte, on the commit path.
type Owner interface {
	// AppendOwned is Append, but payload becomes the store's: the caller
	// neither changes nor keeps it, and the store may write into its
	// spare capacity (payload[len(payload):cap(payload)]), as a store
	// that seals each value with a checksum in place does. SealRoom bytes
	// of spare capacity let such a store keep the payload as it is;
	// with less it copies.
	AppendOwned(stream string, payload []byte, expectedSeq uint64) (uint64, error)
}

// SealRoom is the spare capacity past an owned payload that lets every
// Owner keep it without a copy: a checksum's length (boltfmt.SumLen).
const SealRoom = 4

// AppendOwned appends payload to stream of st, handing it over (Owner)
// where st can keep it, and through Append, which copies, otherwise. The
// caller neither changes nor keeps payload either way.
func AppendOwned(st DurableStore, stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	if o, ok := st.(Owner); ok {
		return o.AppendOwned(stream, payload, expectedSeq)
	}
	return st.Append(stream, payload, expectedSeq)
}

// BufferedPageReader is implemented by PageReaders that can copy a page
// into memory the caller lends them, so that a reader that is done with
// each page before it reads the next (a replay that decodes every row
// and keeps none of its bytes) reads a stream of any length through one
// buffer instead of allocating every payload.
type BufferedPageReader interface {
	// ReadPageBuffered is ReadPage, but the entries and payloads it
	// returns are in buf's memory: valid only until the next read with
	// buf, and never to be changed.
	ReadPageBuffered(stream string, offset uint64, limit int, maxBytes int, buf *PageBuffer) ([]Entry, error)
}

// PageBuffer is the memory a BufferedPageReader lends one page at a time.
// The zero value is ready; it grows to the largest page read through it
// and keeps that. A PageBuffer is used by one reader at a time.
type PageBuffer struct {
	entries []Entry
	bytes   []byte
}

// Reset forgets the previous page (its entries and payloads become
// invalid) and returns the entries slice to append the next page to.
func (b *PageBuffer) Reset() []Entry {
	clear(b.entries)
	b.bytes = b.bytes[:0]
	return b.entries[:0]
}

// Copy returns a copy of p in the buffer's memory, or in an array of its
// own when b is nil (a reader that lends no buffer). When the buffer's
// array is full it moves to a larger one; the entries already copied keep
// the old array, which they alone then hold.
func (b *PageBuffer) Copy(p []byte) []byte {
	if b == nil {
		return append([]byte(nil), p...)
	}
	if len(b.bytes)+len(p) > cap(b.bytes) {
		b.bytes = make([]byte, 0, max(2*cap(b.bytes), len(b.bytes)+len(p), 4<<10))
	}
	n := len(b.bytes)
	b.bytes = append(b.bytes, p...)
	return b.bytes[n:len(b.bytes):len(b.bytes)]
}

// Keep records the entries of the page just read, so that the next Reset
// clears them and reuses their slice.
func (b *PageBuffer) Keep(entries []Entry) {
	if entries != nil {
		b.entries = entries
	}
}

// ReadPageBuffered reads a page of stream from st into buf where st is a
// BufferedPageReader, and through ReadPage otherwise (the page is then
// the caller's, which is more than the contract promises). Either way the
// caller treats the page as valid until its next read with buf.
func ReadPageBuffered(st DurableStore, stream string, offset uint64, limit int, maxBytes int, buf *PageBuffer) ([]Entry, error) {
	if br, ok := st.(BufferedPageReader); ok {
		return br.ReadPageBuffered(stream, offset, limit, maxBytes, buf)
	}
	return ReadPage(st, stream, offset, limit, maxBytes)
}
