// Package store defines DurableStore, the storage contract of participantd,
// and its two implementations: a bbolt file, with group commit (participantd
// --store bbolt; the default engine, package store/logfirst, keeps its
// checkpoints in this same file layout), and an in-memory store for tests.
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
// bounded page at a time (every store of this package does); ReadPage, the
// function, falls back to ReadFrom for a store that does not.
//
// A store may implement Compactor (every store of this package does): Trim
// drops a stream's flushed prefix while seqs stay where they were (a read
// below the first stored entry is a *CompactedError), and byte values hold
// checkpoints and token receipts. Trims and byte values are durable after
// the next Flush, or earlier (Bolt writes them in transactions of their
// own), so a caller flushes what they rely on first.
//
// Names are 1..MaxNameLen bytes and payloads at most MaxPayloadLen bytes in
// every implementation; a write outside those limits is refused before it is
// staged, so it cannot fail a later commit.
//
// # bbolt layout
//
// Bolt keeps one bbolt file (layout version 1), never opened with NoSync:
//
//	bucket    key                                          value
//	meta      "version"                                    1 byte: layout version (1)
//	streams   2-byte BE len(name) | name | 8-byte BE seq   payload
//	values    key                                          8-byte BE uint64 (0 is never stored)
//	bytes     key                                          byte value (Compactor; created by the first PutBytes)
//
// All streams share one bucket; the length prefix makes each stream's keys a
// range of their own, and big-endian seqs keep that range in seq order, so
// ReadFrom is one cursor walk in one read transaction and a stream's
// committed length is the seq of the last key of its range plus one (which
// is why a Trim never deletes a stream's last committed entry), and its
// first stored seq is the seq of the first key. A
// single bucket rather than one sub-bucket per stream means a commit
// touching N streams dirties about N leaf pages and the branches above
// them, not also N bucket roots and their headers. Every transaction that
// writes the streams or bytes bucket packs their pages full
// (Bucket.FillPercent 1.0, which the file does not store): their keys are
// written in ascending order at a few points (a stream's end, a
// conversation's next receipt), where bbolt's default split would leave
// every page half empty. The values bucket, the token index, packs them
// to 80%: a UUIDv7 token's key comes after its scope's earlier ones, a
// random token's anywhere (valuesFillPercent weighs the two).
//
// # Opening a file
//
// Open never hands bbolt a file it would crash on. bbolt maps the file and
// reads pages through the mapping, so a page past the end of a truncated
// file is a SIGBUS and a garbled page a panic. Before mapping an existing
// file Open reads both meta pages itself, as bbolt does (magic, version,
// FNV-64a checksum; the valid one with the higher txid wins, so a meta
// page torn by a crash during a commit falls back to the previous one), and
// requires:
//
//	check                                      else
//	size >= 2 pages, a multiple of page size   ErrCorrupt
//	size >= the chosen meta's high water mark  ErrCorrupt
//	at least one valid meta page               ErrCorrupt
//	file present and > 0 bytes                 ErrNoData, with ReadOnly or MustExist
//
// Then the page structure is walked with pread, before bbolt sees it (a
// read-write open) or once the shared lock is held (a read-only open):
// every page reachable from the meta page, through branches and buckets,
// has an id below the high water mark, a header naming itself, a branch or
// leaf type, elements and keys inside it, and exactly one reference. A
// failure is ErrCorrupt, unless a writer holds the file (ErrLocked: what
// was read may be a commit in progress). How much is read depends on the
// freelist:
//
//	file                      bbolt at a read-write open       walk before it
//	no persisted freelist     walks every page (own goroutine)  every page
//	persisted freelist        reads the freelist page           the freelist, and every page
//	(Options.PersistFreelist,                                   but the leaves of nested
//	 the log-first store)                                       buckets past the first of each
//	                                                            lowest branch
//
// bbolt's own walk runs in a goroutine where a bad page id is a fatal
// fault and a cycle an endless recursion, so it must never meet damage:
// that file is walked whole, which is linear in its size. With a persisted
// freelist bbolt reads only what transactions touch, so the walk covers
// what no containment can (the branch pages, whose cycles would recurse
// without end) and the freelist, which bbolt trusts when it allocates: a
// freelist page, ids below the high water mark in ascending order, none
// of them a page in use. It reads about one page in a hundred, so a start
// does not grow with the file. Leaves it does not read (their overflow
// pages, a flipped type, keys out of place) are found when bbolt reads
// them, contained as below, or by Check. A read-only open and
// CheckFileWhole always walk every page.
//
// Damage past those checks (key order, garbled values) is found when bbolt
// reads it: every bbolt call runs with panics and memory faults contained
// (debug.SetPanicOnFault and a recover at that call only) and turned into
// an error naming the file and wrapping ErrCorrupt. A read fails; a commit
// fails and makes the store sticky-failed. Bolt.Check walks the pages
// again and reads every key and value, for offline verification.
//
// Options.ReadOnly opens with O_RDONLY and a shared lock, checks the layout
// in a read transaction instead of creating it, and refuses writes with
// ErrReadOnly: the file's bytes are left exactly as they were. A file Open
// creates is followed by an fsync of its directory, so that acknowledged
// commits cannot vanish with the directory entry.
//
// # Group commit
//
// Append and CAS stage writes in memory under Bolt.mu; reads merge the
// committed file with the staged writes. Each stream's committed length and
// staged payloads are cached after its first use, so Len is O(1). A single
// committer goroutine, owned by the Bolt and stopped by Close, writes to the
// file:
//
//   - A Flush with writes staged joins the next batch, creating it and waking
//     the committer if it is the first; it then waits for that batch.
//   - The committer takes every staged write into the batch under mu, then
//     writes them in one bbolt Update (fsync of the data pages, then of the
//     meta page) without mu, and wakes every waiter with the result.
//     Flushes arriving meanwhile form the next batch, so N concurrent
//     flushes cost one transaction, not N.
//   - A Flush with nothing staged waits only for a commit in progress, and
//     returns nil at once when there is none: no transaction.
//   - A failed transaction sets the sticky error; every later call returns
//     it.
//
// Sequence numbers stay gap-free because a commit takes a prefix of each
// stream's staged payloads and drops exactly that prefix, advancing the
// committed length, only after its transaction succeeded. A reader takes
// the committed length under mu before it begins its read transaction, so
// the transaction sees at least that many entries and memory supplies the
// rest.
//
// # Locks
//
// Bolt.mu is the only lock of the package. It is never held across a bbolt
// call or a channel operation, so bbolt's own locks are always taken
// without it. Memory.mu guards everything of a Memory.
package store
