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
//	0       8     magic "pdwal\x00\x00\x02" (last byte: segment format)
//	8       8     LSN of the first record, little-endian
//	16      ...   records, back to back, then zeros to the end
//
// Segment format 2, the one written, cuts each record's body into
// fragments that never cross a 512-byte sector, each checked on its own
// (sector.go): the first starts where the record before ended (or at
// the next sector, zeros between, when fewer than 17 bytes are left in
// the sector), every other starts a sector, and every one but the last
// fills its sector to the end.
//
//	fragment
//	offset  size  field
//	0       1     kind: 0xa1 whole record, 0xa2 first, 0xa3 middle, 0xa4 last
//	1       2     n, the data's length, little-endian
//	3       4     stamp: the record's LSN, low 32 bits
//	7       4     CRC-32C of bytes 0-6, the data and the end byte
//	11      4     CRC-32C of bytes 0-10
//	15      n     data: the next n bytes of the body
//	15+n    1     end byte 0x5a
//
// Segment format 1, still read (never written), frames each body whole:
//
//	record (format 1)
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
//   - Space not yet written in a segment reads as zeros (preallocated,
//     or a hole), and a segment is never appended to after a start, so
//     the bytes after the last record are zeros unless that record was
//     torn.
//   - A failed write, fdatasync or segment creation is sticky, and so is
//     a failed sync of the log's directory, wherever it happens
//     (ErrDirSync).
//
// # Replay
//
// Replay and Open read every segment in order:
//
//	found                                              meaning
//	in a format-2 segment, after the last valid       torn tail, never
//	  record: what a torn write of the next leaves       acknowledged: cut off
//	  (see "Torn or damaged" below)                      (Open truncates it
//	in a format-1 segment: an unfinished or CRC-bad    away durably)
//	  record at the very end of the last segment,
//	  nothing valid after it
//	a last-segment header that is a prefix of its     an unfinished creation:
//	  header (either format), zeros after              reused or removed
//	a header of this magic with another version       ErrUnknownVersion (a
//	  byte, in any segment                             newer binary's): refused
//	any other bad header                               corruption: refused
//	in a format-2 segment, anything else after the    corruption: refused
//	  last valid record
//	in a format-1 segment, a bad record with a valid  corruption: refused
//	  record after it, past where a torn write of the
//	  bad one could reach
//	bad bytes at the end of an earlier segment         corruption: refused
//	an LSN gap (between records or segments, or        corruption: refused
//	  between the checkpoint and the log)
//	anything in a covered segment: not the last, its   skipped: its records are
//	  successor starting at or below after+1           all at or below after
//
// # Torn or damaged
//
// A record is written in one pwrite over zeros (the preallocated
// segment, or the rest of the sector the record before it ended in) and
// synced before the next is written, so a crash can leave one record
// unfinished, the last: a prefix of its bytes, or any subset of its
// sectors whole (faultfs's TornPrefix and Blocks), zeros elsewhere. In
// format 2 each of its fragments is then lost (zeros to its sector's
// end), kept (every check holds), or, at most one and only with no lost
// one before it and nothing but zeros after it, cut (a prefix of it:
// only its header's first bytes, or its header whole and its end byte
// zero). The scan accepts exactly those shapes after the last valid
// record as a torn tail; anything else there is refused as corruption.
//
// A record that was acknowledged was synced whole, so every fragment of
// it is kept. One flipped bit in it leaves it none of the torn shapes:
// the kind and end bytes have at least two bits set, so no fragment
// turns into zeros; a flipped data byte, CRC or end byte fails the data's
// CRC with the end byte non-zero, which a cut never leaves; a flipped
// kind, length, stamp or CRC fails the header's own CRC with the data and
// end byte after it, which a cut inside the header never leaves. So the
// log's last record is refused like any other, never cut as torn. The
// stamp and the kinds bind each fragment to its record and place: a
// fragment of another record, whole and valid, is never read as this
// one's. What a torn write leaves cannot be told from damage that
// turns a whole sector of the last record to zeros (a lost write); and
// damage to the zeros after the last record is refused (unless it lies
// where a cut header could, the first 15 bytes past the end), though it
// harms no record. A file system that shows a torn sector as neither its
// old nor its new content (stale blocks after a crash) is outside this
// model: format 2 refuses such a tail rather than guess.
//
// Format 1 cannot tell a torn last record from a damaged one and cuts
// both, weighing a valid frame after a bad one as follows: a torn
// write keeps a prefix of the record, or any subset of its
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
// segment's end back, and a torn tail sector by sector (format 2) or its
// reach byte by byte (format 1). Each fragment of a format-2 record is
// checked once, where the window holds it, on one read: its header (CRC,
// kind, stamp, length), then its data's CRC and end byte. A record at or
// below after (all of a covered segment's) is walked past: checked in
// place, its version and LSN read, nothing of it copied or decoded. A
// record given to apply is copied out of the window into a buffer of its
// own; one the window did not hold whole as it was checked (at most one
// a window, where the window ends, and each larger than the window) is
// read again whole, into a buffer of its own when larger than the
// window, and checked there, as those bytes are the ones written back;
// its body is another. A format-1 frame larger than the window is read into a
// buffer of its own size only once its CRC, checked a window at a time,
// holds, so a damaged length field claiming the rest of the segment
// costs no buffer of that size. A replay's memory is the window and one
// record (two copies of one larger than the window), whatever the
// segment size; what apply keeps it is given in buffers of its own.
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
