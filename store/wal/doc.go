// Package wal is the write-ahead log of the log-first store: a directory
// of preallocated segment files holding one record per group commit, each
// made durable with one write and one fdatasync.
//
// # Layout
//
// A segment is named after the LSN of its first record, as 16 hex digits
// and ".wal" (0000000000000001.wal), and preallocated (fallocate, or a
// truncate where that is unsupported) to Options.SegmentSize, 64 MiB by
// default. A new segment is created, its header written, preallocated,
// synced, and its directory synced, before any record goes in.
//
//	segment
//	offset  size  field
//	0       8     magic "pdwal\x00\x00\x01" (last byte: segment format 1)
//	8       8     LSN of the first record, little-endian
//	16      ...   records, back to back, then zeros to the end
//
//	record
//	offset  size  field
//	0       4     n, the body's length, little-endian (0 marks the end)
//	4       4     CRC-32C (Castagnoli) of the length field and the body
//	8       n     body
//
//	body (version 1 or 2); uvarint = encoding/binary unsigned varint
//	1 byte   version (1, or 2 when the batch trims or sets byte values)
//	8 bytes  LSN, little-endian
//	uvarint  number of streams, then per stream:
//	         uvarint len, name; uvarint first seq; uvarint count,
//	         then per payload: uvarint len, payload
//	uvarint  number of values, then per value:
//	         uvarint len, key; 8 bytes value, little-endian (0 deletes)
//	version 2 only:
//	uvarint  number of trims, then per trim:
//	         uvarint len, stream; uvarint below (entries < below go)
//	uvarint  number of byte values, then per byte value:
//	         uvarint len, key; uvarint len, value (empty deletes)
//
// A batch's parts apply in that order; a trim covers only entries of
// earlier records. A reader refuses a version it does not know as
// corruption, never skipping a record that may have been acknowledged.
//
// # Invariants
//
//   - LSNs are consecutive across records and segments: the first record
//     of a segment follows the last record of the one before.
//   - Only the last segment is written to; a record is appended with one
//     pwrite and one fdatasync, and Append returns nil only after both.
//     So at most one record, the last, can be unfinished after a crash.
//   - A failed write, fdatasync or segment creation is sticky, and so is
//     a failed sync of the log's directory, wherever it happens
//     (ErrDirSync).
//
// # Replay
//
// Replay and Open read every segment in order:
//
//	found                                              meaning
//	an unfinished or CRC-bad record at the very end   torn tail, never
//	  of the last segment, nothing valid after it      acknowledged: cut off
//	  (Open truncates it away durably)
//	a last-segment header that is a prefix of its     an unfinished creation:
//	  header, zeros after (all a torn write leaves)    reused or removed
//	a header of this magic with another version       ErrUnknownVersion (a
//	  byte, in any segment                             newer binary's): refused
//	any other bad header                               corruption: refused
//	a bad record with a valid record after it, past    corruption: refused
//	  where a torn write of the bad one could reach
//	bad bytes at the end of an earlier segment         corruption: refused
//	an LSN gap (between records or segments, or        corruption: refused
//	  between the checkpoint and the log)
//	anything in a covered segment: not the last, its   skipped: its records are
//	  successor starting at or below after+1           all at or below after
//
// A torn write keeps a prefix of the record, or any subset of its
// 512-byte sectors, over the segment's zeros; its bytes are its own, and
// a client's payload may hold any frame. So a valid frame inside the
// reach of a torn record proves nothing: it counts only past the end the
// record's length field gives (or anywhere when that field is one no tear
// leaves: running past the segment, or zero with bytes beside it in its
// sector), or where the bad record is whole but for a damaged length: its
// CRC holds and its body decodes, LSN included, up to that frame (a
// strict prefix of a body never decodes, so a payload cannot pose as
// one). A length field straddling two sectors gives no reach, and a
// record damaged there is cut like a torn one.
//
// A segment is read through a window of readChunk (1 MiB) bytes, never
// whole: the records one after another, the zeros after them from the
// segment's end back, and a torn tail's reach byte by byte. A frame
// larger than the window is read into a buffer of its own size only
// once its CRC, checked a window at a time, holds, so a damaged length
// field claiming the rest of the segment costs no buffer of that size.
// A replay's memory is the window and one record, whatever the segment
// size; what apply keeps it is given in buffers of its own.
//
// Corruption is a *CorruptionError naming the segment and the offset;
// the log is never repaired by dropping records that may have been
// acknowledged. Open always starts a new segment, so a segment with a cut
// tail is never appended to.
//
// # Durability
//
// Open creates a missing log directory, and any missing parent, and syncs
// the directory holding each before anything goes in it. When Append
// returns nil the record is durable. RemoveBelow syncs the directory
// after its removals; a removed segment that reappeared would be covered
// and skipped.
//
// # Failed syncs
//
// A failed fdatasync is sticky: the Log writes nothing more. On Linux the
// pages it failed to write are marked clean, the page cache keeps serving
// them, and a later fdatasync does not write them (PostgreSQL's
// "fsyncgate"). A restarted process (no reboot) therefore reads records
// that are not on disk. Open trusts none of what it read: it writes every
// record after after (those it gives to apply) again over itself, cutting
// the last segment at its last valid record, and syncs, before it
// returns. It writes back the very bytes it checked and applied, from the
// read window before the window moves on, never a second read of them: a
// page marked clean but never written may be evicted in between, and the
// second read would return the disk's older bytes. Those are the only records a caller builds on, so none of them
// can vanish in a later power cut; a record at or below after that does
// is in a covered segment, or at the end of the last one, and its loss is
// harmless. A last segment without a record is reused in place when the
// new segment takes its name (a remove and create of one name could leave
// wal/ without a segment between the two), and otherwise removed only
// once the new segment is durable. A failed directory sync is Linux's
// too: the directory's creates and removes are marked clean unwritten,
// and a later sync writes them only once the directory changed again. A
// reused segment may be such an entry (the rotation that created it
// failed at its directory sync), so the reuse changes wal/ first
// (vfs.Dirty: a scratch entry, vfs.DirtyName, created and removed; the
// scan ignores one a crash left) before the sync that makes it durable.
//
// RemoveBelow runs beside Append, so its directory sync may fail between
// a rotation's create and the rotation's own sync, which then succeeds
// without writing the new segment's entry: a record acknowledged in it
// would vanish in a power cut. So a failed directory sync fails the log
// (ErrDirSync, sticky: Append and RemoveBelow refuse), and the
// directory's syncs are serialised (dirMu) with the recording of a
// failure, so that a rotation whose create a failed sync may have covered
// sees that failure at its own sync and fails. The restart's Open changes
// the directory (a new segment, or vfs.Dirty for a reused one) before its
// sync, which writes it whole.
package wal
