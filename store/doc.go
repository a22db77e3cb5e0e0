// Package store defines DurableStore, the storage contract of participantd,
// and Memory, the in-memory implementation tests run on. The engines live
// in packages of their own, one per backend: store/logfirst (the default:
// a write-ahead log checkpointed into a bbolt file), store/boltstore
// (--store bbolt: group commit straight into the bbolt file) and
// store/etcdstore (cluster mode). store/boltfmt is the bbolt file format
// the first two share, and store/storetest the conformance suite every
// implementation passes.
//
// # Contract
//
// A store holds named append-only streams of byte payloads and named uint64
// values. Appends are optimistic: the caller names the seq it expects the
// append to get, and a mismatch is a typed conflict that writes nothing.
// Writes are visible to reads at once and durable only once a Flush that
// began after them returns nil:
//
//	call            visible      durable
//	Append / CAS    on return    after the next Flush that returns nil
//	Flush           -            every write that returned before it began
//	crash / Close   -            unflushed writes are lost, nothing else
//
// A store that failed to make writes durable refuses every later call with
// that error (sticky, wrapping ErrFailed): a failed fsync leaves the file in
// an unknown state, and the only safe way back is to reopen and reconcile.
//
// A store may also implement PageReader, whose ReadPage bounds a read in
// bytes as well as entries, so that a reader of a long stream holds one
// bounded page at a time (every store of this project does); ReadPage, the
// function, falls back to ReadFrom for a store that does not.
//
// A store may implement Compactor (every store of this project does): Trim
// drops a stream's flushed prefix while seqs stay where they were (a read
// below the first stored entry is a *CompactedError), and byte values hold
// checkpoints and token receipts. Trims and byte values are durable after
// the next Flush, or earlier (boltstore writes them in transactions of
// their own), so a caller flushes what they rely on first.
//
// Stored data that is damaged is an error wrapping ErrCorrupt, never a
// value served nor one read as absent: the bbolt engines seal every value
// with a CRC-32C of its key (store/boltfmt) and check it on every read, a
// mismatch being a *ChecksumError naming the file and key. The caller
// contains what the value belongs to, or refuses to start.
//
// Names are 1..MaxNameLen bytes and payloads at most MaxPayloadLen bytes in
// every implementation; a write outside those limits is refused before it is
// staged, so it cannot fail a later commit.
//
// # Locks
//
// Memory.mu guards everything of a Memory.
package store
