// Package boltfmt is the bbolt file format of participantd: the buckets and
// keys a data file holds, the checks a file passes before bbolt maps it, and
// the page walk behind them. Two engines write this one format: store/boltstore
// commits into it directly, store/logfirst checkpoints its log into it; the
// offline tools read it. The functions that take a *bolt.Tx read or write
// exactly this layout, so that every writer of the file writes the same
// bytes; durability is the caller's (the transaction's commit).
//
// # bbolt layout
//
// A data file is one bbolt file (layout version 2), never opened with NoSync:
//
//	bucket    key                                          value
//	meta      "version"                                    1 byte: layout version (2) | sum
//	streams   2-byte BE len(name) | name | 8-byte BE seq   payload | sum
//	values    key                                          8-byte BE uint64 (0 is never stored) | sum
//	bytes     key                                          byte value | sum (Compactor; created by the first PutBytes)
//	meta      other keys (the log-first store's)           value | sum
//
// sum is 4 bytes, big-endian: the CRC-32C (Castagnoli) of the bucket's
// name, a zero byte, the key and the value before it, so that a value
// copied to another key or bucket does not verify there. Every read
// checks it (bbolt checksums only its meta pages): a mismatch is a
// *store.ChecksumError wrapping store.ErrCorrupt that names the file,
// bucket and key, never a value served or taken for absent. Check and
// the offline tools check every one.
//
// # Versions
//
//	version  "version" value  values
//	1        1 byte: 1        as above, without sum
//	2        2 | sum          sealed with sum
//
// Every version from 1 on is read. A read-write open (Lay) brings an older
// file to the current version in place, in transactions of at most
// upgradeBatchBytes (16 MiB) of values each, so that its memory does not
// grow with the file: the first seals the streams bucket's values from
// its first key, in key order, then the values and bytes buckets', each
// recording in meta "upgrade" (bucket index | last key sealed, itself
// sealed) how far the upgrade got; the last seals the meta bucket, writes
// the new version and deletes "upgrade". A crash between two resumes at
// the next open, and a reader (a read-only open may meet the file at any
// of these points) checks a value's sum exactly where "upgrade" says it
// is sealed. A read-only open never writes: it reads an older file as it
// is. A file of a newer version than this build knows is refused by
// every open with ErrNewerLayout, and left as it was; a version value
// that does not verify is ErrCorrupt.
//
// All streams share one bucket; the length prefix makes each stream's keys a
// range of their own, and big-endian seqs keep that range in seq order, so
// a read is one cursor walk in one read transaction and a stream's
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
// An engine's Open never hands bbolt a file it would crash on. bbolt maps the file and
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
// fails and makes the store sticky-failed. boltstore.Store.Check walks the pages
// again and reads every key and value, for offline verification.
//
// Options.ReadOnly opens with O_RDONLY and a shared lock, checks the layout
// in a read transaction instead of creating it, and refuses writes with
// ErrReadOnly: the file's bytes are left exactly as they were. A file Open
// creates is followed by an fsync of its directory, so that acknowledged
// commits cannot vanish with the directory entry.
package boltfmt
