package store

import (
	"errors"
	"fmt"
	"time"
)

// Entry is one payload of a stream with the sequence number it was assigned.
type Entry struct {
	// Seq is the entry's 0-based position in its stream.
	Seq uint64
	// Payload is the appended bytes. Entries returned by a store are copies
	// the caller owns.
	Payload []byte
}

// Value is one durable counter, as returned by Scan.
type Value struct {
	Key   string
	Value uint64
}

// DurableStore is the storage contract every layer above builds on: named
// append-only streams and named uint64 values, made durable together by Flush.
//
// Streams, values and keys are independent namespaces: a stream and a value
// may share a name without affecting each other.
//
// Visibility and durability are separate. A successful Append or CAS is
// visible to every later read at once, and becomes durable only when a Flush
// that began after it returns nil. A crash loses exactly the writes that no
// successful Flush covered, and nothing else.
//
// Writes become durable in the order they returned, and in batches: a
// crash keeps a prefix of them (if a write survives, so does every write
// that returned before it), and the writes one Flush covers are durable
// all together or not at all when no other Flush runs concurrently. So a
// caller may append a registry entry and then a row that needs it, and
// flush once: the row never survives a crash without the entry.
//
// Implementations are safe for concurrent use. Once an implementation fails
// to make writes durable it refuses every later call with that error (the
// error is sticky); the way back is to reopen the store and reconcile.
type DurableStore interface {
	// Append adds payload at the end of stream and returns its seq. The
	// assigned seq (0-based, the stream's length before the call) must equal
	// expectedSeq; otherwise nothing is written and the error is a
	// *SequenceConflictError (errors.Is ErrSequenceConflict). The store keeps
	// its own copy of payload (AppendOwned hands it over where the store can
	// keep it). An empty or over-long stream name fails with
	// ErrInvalidName, a payload over MaxPayloadLen with ErrTooLarge.
	Append(stream string, payload []byte, expectedSeq uint64) (uint64, error)

	// ReadFrom returns up to limit entries of stream starting at seq offset,
	// in seq order, flushed or not. Reading past the end, or a stream that
	// does not exist, returns no entries and no error. limit <= 0 means no
	// limit. The returned entries and payloads are copies the caller owns.
	ReadFrom(stream string, offset uint64, limit int) ([]Entry, error)

	// Len returns the number of entries in stream (the seq the next Append
	// must expect), counting unflushed appends. An absent stream has length 0.
	Len(stream string) (uint64, error)

	// CAS sets value key to new if its current value is old. An absent value
	// reads as 0, so CAS from 0 creates it. A mismatch writes nothing and
	// returns a *CASConflictError (errors.Is ErrCASConflict) carrying the
	// actual value. Like an append, the write is visible at once and durable
	// after the next successful Flush. An empty or over-long key fails with
	// ErrInvalidName.
	CAS(key string, old, new uint64) error

	// ReadValue returns the current value of key, 0 when absent.
	ReadValue(key string) (uint64, error)

	// Scan returns every value whose key starts with prefix, in ascending key
	// order. Values equal to 0 are absent and not returned.
	Scan(prefix string) ([]Value, error)

	// Flush returns nil only when every Append and CAS that returned before
	// Flush was called is durable (fsync'd). Writes made concurrently with
	// the call may or may not be covered.
	Flush() error

	// Close releases the store. Unflushed writes are discarded, as in a
	// crash. Every call after Close returns ErrClosed.
	Close() error
}

// Sentinel errors. Typed errors below unwrap to them.
var (
	// ErrSequenceConflict reports an Append whose expectedSeq was not the
	// stream's length.
	ErrSequenceConflict = errors.New("store: sequence conflict")
	// ErrCASConflict reports a CAS whose old value was not the current one.
	ErrCASConflict = errors.New("store: cas conflict")
	// ErrClosed reports a call on a closed store.
	ErrClosed = errors.New("store: closed")
	// ErrFailed wraps the sticky error of a store that failed to make writes
	// durable; every call after the failure returns it.
	ErrFailed = errors.New("store: failed")
	// ErrLocked reports a data file held by another process.
	ErrLocked = errors.New("store: data file is locked by another process")
	// ErrInvalidName reports an Append or CAS whose stream or key name is
	// empty or longer than MaxNameLen. It is refused before anything is
	// staged, so a bad name can never poison a later Flush.
	ErrInvalidName = errors.New("store: invalid stream or key name")
	// ErrTooLarge reports an Append whose payload is longer than
	// MaxPayloadLen.
	ErrTooLarge = errors.New("store: payload too large")
	// ErrReadOnly reports a write to a store opened with Options.ReadOnly.
	ErrReadOnly = errors.New("store: opened read-only")
	// ErrNoData reports a missing or 0-byte data file where one must
	// exist (Options.ReadOnly or Options.MustExist).
	ErrNoData = errors.New("store: data file is missing or empty")
	// ErrCorrupt reports stored data that is damaged: a data file too
	// short, truncated below what its meta page claims, with meta pages
	// that fail their checksum or pages bbolt cannot read; or a stored
	// value whose checksum does not match (*ChecksumError), in a file or
	// in etcd. The error names the file (or key). Damage is never read as
	// absence: a caller contains what the value belongs to, or refuses to
	// start when it is global.
	ErrCorrupt = errors.New("store: data file is damaged")
)

// ChecksumError reports a stored value whose checksum does not match its
// key and bytes: a bit flipped on the disk, in a backup, or in etcd.
type ChecksumError struct {
	// File is the data file, or the etcd key prefix, that holds the value.
	File string
	// Key names the value: the bucket and key in a data file, the key in
	// etcd.
	Key string
	// What says what did not match, with the checksum stored and the one
	// computed.
	What string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("store: %s: value %s is damaged: %s", e.File, e.Key, e.What)
}

// Unwrap returns ErrCorrupt.
func (e *ChecksumError) Unwrap() error { return ErrCorrupt }

// Limits every implementation enforces, so that code tested against one
// store does not fail on another.
const (
	// MaxNameLen is the longest stream or key name, in bytes.
	MaxNameLen = 1024
	// MaxPayloadLen is the longest payload, in bytes.
	MaxPayloadLen = 1 << 30
)

// CheckWrite reports whether a stream or key name and a payload length are
// acceptable to every implementation: ErrInvalidName or ErrTooLarge, or
// nil. Implementations call it before they stage a write.
func CheckWrite(name string, payloadLen int) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%q: %w", truncate(name), ErrInvalidName)
	}
	if payloadLen > MaxPayloadLen {
		return fmt.Errorf("%d bytes: %w", payloadLen, ErrTooLarge)
	}
	return nil
}

func truncate(name string) string {
	if len(name) > 64 {
		return name[:64] + "..."
	}
	return name
}

// SequenceConflictError is returned by Append when expectedSeq is not the
// seq the append would be assigned.
type SequenceConflictError struct {
	Stream   string
	Expected uint64 // the caller's expectedSeq
	Actual   uint64 // the stream's length, the seq the append would get
}

func (e *SequenceConflictError) Error() string {
	return fmt.Sprintf("store: sequence conflict on %q: expected %d, actual %d", e.Stream, e.Expected, e.Actual)
}

// Unwrap returns ErrSequenceConflict.
func (e *SequenceConflictError) Unwrap() error { return ErrSequenceConflict }

// CASConflictError is returned by CAS when old is not the current value.
type CASConflictError struct {
	Key      string
	Expected uint64 // the caller's old value
	Actual   uint64 // the current value
}

func (e *CASConflictError) Error() string {
	return fmt.Sprintf("store: cas conflict on %q: expected %d, actual %d", e.Key, e.Expected, e.Actual)
}

// Unwrap returns ErrCASConflict.
func (e *CASConflictError) Unwrap() error { return ErrCASConflict }

// Ordered is implemented by stores that keep their writes' order across a
// crash however Flushes group them: what a crash leaves is a prefix of
// every write (Append, CAS, Trim, PutBytes) in the order the calls
// returned, across streams and values, whether one Flush or several, by
// this caller or another, covered them. A caller that needs write A
// durable whenever write B is may then make A before B and flush once
// after B, instead of flushing between them; the participant's two
// barriers share one sync that way (docs/DESIGN.md, "One sync for both
// barriers").
//
// The DurableStore contract alone promises less: the writes of one Flush
// are all or nothing only when no other Flush runs. A store that commits
// its parts independently (etcd's scopes, a scope's writes split over
// several transactions) does not keep the order and must not implement
// Ordered, or must answer false.
type Ordered interface {
	// KeepsOrder reports whether the store keeps its writes' order across
	// a crash, as above. A wrapper answers for the store it wraps.
	KeepsOrder() bool
}

// KeepsOrder reports whether st keeps its writes' order across a crash
// (Ordered): false for a store that does not say so.
func KeepsOrder(st DurableStore) bool {
	o, ok := st.(Ordered)
	return ok && o.KeepsOrder()
}

// ScopeOrdered is implemented by stores that keep the order of each
// scope's writes across a crash, though not of writes in different scopes
// (etcd's: a scope is one key range under one fence, committed one
// transaction at a time, in order, none after a failed one, each scope
// failing alone; see the etcd store's doc, Order). A scope is a set of
// names the store commits together; which names share one is the store's
// to say. What a crash leaves of a scope is a prefix of its writes in the
// order the calls returned. A caller whose ordered writes all fall in one
// scope may rely on it as on Ordered.
type ScopeOrdered interface {
	// KeepsOrderWithin reports whether the writes to names (stream or
	// value names) keep their order across a crash with respect to each
	// other: true when they are all of one scope whose order the store
	// keeps. A wrapper answers for the store it wraps.
	KeepsOrderWithin(names ...string) bool
}

// KeepsOrderWithin reports whether st keeps the order of the writes to
// names across a crash: it keeps every write's (Ordered), or names share
// a scope whose writes' order it keeps (ScopeOrdered).
func KeepsOrderWithin(st DurableStore, names ...string) bool {
	if KeepsOrder(st) {
		return true
	}
	o, ok := st.(ScopeOrdered)
	return ok && o.KeepsOrderWithin(names...)
}

// Sealer is implemented by stores that write their commits one at a time,
// in order, each only once the one before it is durable, and none after a
// failed one. Seal closes a commit: it returns once every write that
// returned before the call is carried by a commit already under way (or
// already durable), so that every write made after Seal returns goes into
// a later commit. Such a write is then never durable without the sealed
// ones, and never lands in the same commit as them: a damaged last commit
// cannot take both. A caller that needs write B never durable without
// write A, and the two in different commits, may seal after A, make B
// while A's commit is being written, and then wait for both, instead of
// flushing in between: the participant's two barriers pipeline that way
// (docs/DESIGN.md, "Sealed barriers").
//
// Seal returns Flush's error when the failure is known at once (the store
// failed or is closed). Otherwise the returned wait reports what Flush
// would have: nil only once every write sealed is durable; it must be
// called exactly once.
type Sealer interface {
	Seal() (wait func() error, err error)
}

// Seal seals st's writes if st is a Sealer, and otherwise flushes them
// (once they are durable, every later write goes to a later commit); the
// wait then returns nil at once.
func Seal(st DurableStore) (wait func() error, err error) {
	if s, ok := st.(Sealer); ok {
		return s.Seal()
	}
	if err := st.Flush(); err != nil {
		return nil, err
	}
	return durable, nil
}

func durable() error { return nil }

// FlushTiming is how one Flush's time divides: Wait from the call until
// the commit carrying its writes began to be written (the group commit's
// wait: the commit before it, a full memory bound), Write that commit's
// write and sync. A Flush that found nothing to wait for has both 0.
type FlushTiming struct {
	Wait, Write time.Duration
}

// TimedFlusher is implemented by stores that can say where a Flush's time
// went (FlushTiming), for the latency metrics. A wrapper answers for the
// store it wraps.
type TimedFlusher interface {
	// FlushTimed is Flush, with the timing of the commit that carried
	// the writes; the timing is meaningful only when the error is nil.
	FlushTimed() (FlushTiming, error)
}

// FlushTimed flushes st, with its timing when st is a TimedFlusher; for
// any other store the whole call is counted as Write (TimeFlush).
func FlushTimed(st DurableStore) (FlushTiming, error) {
	if t, ok := st.(TimedFlusher); ok {
		return t.FlushTimed()
	}
	return TimeFlush(st.Flush)
}

// TimeFlush runs flush, which says nothing of how its time divides, and
// counts the whole call as Write.
func TimeFlush(flush func() error) (FlushTiming, error) {
	start := time.Now()
	err := flush()
	return FlushTiming{Write: time.Since(start)}, err
}

// PageReader is implemented by stores that bound a read in bytes as well as
// in entries, so that a reader of a long stream holds one bounded page at a
// time however large its entries are. A store that does not implement it is
// read with ReadPage's fallback.
type PageReader interface {
	// ReadPage is ReadFrom that also stops before the entry that would
	// bring the payload bytes returned past maxBytes. It returns at least
	// the entry at offset when one exists, whatever its size, so that a
	// reader always progresses; maxBytes <= 0 means no byte bound. The
	// returned entries and payloads are copies the caller owns.
	ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]Entry, error)
}

// ReadPage reads a page of stream from st: through PageReader when st
// implements it, else through ReadFrom with limit alone (the caller then
// bounds a page's bytes by choosing limit from the largest entry it
// expects). Errors are those of the call made.
func ReadPage(st DurableStore, stream string, offset uint64, limit int, maxBytes int) ([]Entry, error) {
	if pr, ok := st.(PageReader); ok {
		return pr.ReadPage(stream, offset, limit, maxBytes)
	}
	entries, err := st.ReadFrom(stream, offset, limit)
	if err != nil {
		return nil, err
	}
	// The store reads whole; the page is still bounded as promised.
	n := pageEnd(func(i int) int { return len(entries[i].Payload) }, len(entries), maxBytes)
	return entries[:n], nil
}

// pageEnd returns how many of sizes, taken in order, fit in maxBytes: at
// least one when sizes is not empty; all of them when maxBytes <= 0.
func pageEnd(sizes func(i int) int, n int, maxBytes int) int {
	if maxBytes <= 0 || n == 0 {
		return n
	}
	total := 0
	for i := range n {
		total += sizes(i)
		if total > maxBytes && i > 0 {
			return i
		}
	}
	return n
}

// AsCompactor returns st's Compactor when st compacts: st itself, or, for a
// wrapper (one with Inner, like faultstore), the store it wraps must. A
// wrapper that forwards the methods to a store without them would answer
// ErrUnsupported to every call; callers ask here instead.
func AsCompactor(st DurableStore) (Compactor, bool) {
	c, ok := st.(Compactor)
	if !ok {
		return nil, false
	}
	if w, ok := st.(interface{ Inner() DurableStore }); ok {
		if _, ok := AsCompactor(w.Inner()); !ok {
			return nil, false
		}
	}
	return c, true
}

// Compactor is implemented by stores that can drop what a conversation no
// longer needs (see docs/DESIGN.md, Data lifecycle): the prefix of a stream,
// with seqs kept stable, and byte values for checkpoints and receipts. A
// store that does not implement it runs with compaction off.
//
// Ordering is the caller's: a trim or a byte value may become durable
// before writes staged earlier, so whatever a trim relies on (the
// checkpoint that replaces the trimmed rows, the receipts of their tokens)
// must be flushed before the trim is made.
type Compactor interface {
	// Trim drops the entries of stream with seq < below. Seqs never move:
	// Len is unchanged, the next Append still expects Len, and First
	// becomes below. Only flushed entries may go, and never a stream's
	// last flushed entry (a stream's length stays derivable from its
	// entries in every implementation): below must be smaller than the
	// number of flushed entries, else nothing is trimmed and the error
	// wraps ErrTrimRange. below <= First is a no-op. The trim is visible
	// at once and durable after the next Flush that returns nil, or
	// earlier; a trim lost in a crash leaves entries that were valid.
	Trim(stream string, below uint64) error

	// First returns the seq of the first entry of stream still stored:
	// 0 for a stream never trimmed (and for an absent one).
	First(stream string) (uint64, error)

	// PutBytes sets byte values, in a namespace of their own (a byte value
	// and a uint64 value may share a key), each to a copy of its Value; an
	// empty Value deletes the key. All of them are visible at once and
	// durable after the next Flush that returns nil, or earlier. A key
	// outside the name limits fails with ErrInvalidName and a value over
	// MaxPayloadLen with ErrTooLarge, before anything is written.
	PutBytes(values []Bytes) error

	// GetBytes returns a copy of byte value key, nil when absent.
	GetBytes(key string) ([]byte, error)
}

// Bytes is one byte value for Compactor.PutBytes.
type Bytes struct {
	Key   string
	Value []byte
}

var (
	// ErrCompacted reports a read below a stream's first stored entry; the
	// error is a *CompactedError.
	ErrCompacted = errors.New("store: compacted")
	// ErrTrimRange reports a Trim of unflushed entries or of a stream's
	// last flushed entry.
	ErrTrimRange = errors.New("store: trim out of range")
	// ErrUnsupported reports a Compactor call on a wrapper whose inner
	// store does not implement Compactor.
	ErrUnsupported = errors.New("store: not supported by this store")
)

// CompactedError is returned by ReadFrom and ReadPage for an offset below
// the stream's first stored entry.
type CompactedError struct {
	Stream string
	Offset uint64 // the offset asked for
	First  uint64 // the first seq still stored
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("store: compacted: %q holds entries from %d, read asked for %d", e.Stream, e.First, e.Offset)
}

// Unwrap returns ErrCompacted.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// CheckBytes reports whether byte values are acceptable to every
// implementation: ErrInvalidName or ErrTooLarge, or nil.
func CheckBytes(values []Bytes) error {
	for _, v := range values {
		if err := CheckWrite(v.Key, len(v.Value)); err != nil {
			return err
		}
	}
	return nil
}
