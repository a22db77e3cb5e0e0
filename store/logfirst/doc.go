// Package logfirst is the embedded DurableStore of participantd: a
// write-ahead log (package wal) that makes each group commit durable with
// one write and one fdatasync, and a bbolt file, in package store's
// layout, that a background checkpoint brings up to date in big batches.
// It keeps store.DurableStore's contract, batch atomicity included.
//
// # Files
//
//	path                      content
//	<dir>/participantd.db     bbolt, store's layout (see package store), plus
//	                          meta "checkpoint_lsn": 8-byte BE LSN of the last
//	                          log record applied to the file
//	<dir>/wal/<lsn>.wal       log segments (see package wal)
//	<dir>/wal.created         empty: the log was made durable here once
//	<dir>/sync.failed         empty, never synced: a bbolt commit runs or
//	                          failed, or a log write failed; the next Open
//	                          rewrites the bbolt file
//
// The bbolt file is what a user backs up, inspects and verifies; with the
// log beside it, it is the whole store. OpenReadOnly replays the log in
// memory over a read-only bbolt, changing no file.
//
// # Layers
//
// Each stream's entries and each value live in one of three layers:
//
//	layer       seqs of a stream          where
//	checkpointed [0, base)                bbolt
//	logged       [base, base+len(logged)) the log, and memory until checkpointed
//	pending      after those              memory only: staged, or being logged
//
// Reads merge the three (values through one map of every key written
// since its last checkpoint); Len is O(1) once a stream's base is loaded.
//
// # Trims and byte values (store.Compactor, store.PageReader)
//
// Trim and PutBytes are writes like Append and CAS: staged and visible at
// once (a stream's first seq in memory; byte values in a map of every key
// written since its last checkpoint), carried by the next record (wal
// record version 2), replayed by Open, and applied to bbolt by the
// checkpoint in LSN order with store's helpers (boltfmt.TrimEntries,
// boltfmt.PutBytesTx): a checkpoint or replay transaction applies its
// appends, then its values, trims and byte values, which is the order
// they were made in since a trim covers only logged entries, which are in
// records before its own. A trim is refused below the stream's logged
// length (ErrTrimRange), so bbolt always keeps a stream's last entry and
// its length stays derivable. Once a trim is in bbolt the trimmed keys
// are gone, and no record after the checkpoint holds them: a trimmed range
// never reappears.
//
// # Backup
//
// Backup forces a checkpoint of every record logged when it is called and
// then writes the bbolt file from one read transaction (bbolt's
// Tx.WriteTo). See Store.Backup for why no batch can be lost. The file is
// mapped at 10 GiB or twice its size, whichever is more (mmapSize), so that
// a checkpoint growing it does not remap while the backup's reader is
// slow: a remap waits for every read transaction, and Flush would then
// wait behind the reader once the uncheckpointed log reached its bound.
//
// # Commit and checkpoint
//
//   - A commit takes every staged write, encodes it as one record, appends
//     it with one write and one fdatasync, and only then moves it to the
//     logged layer and answers every Flush of the batch. A Flush that
//     finds no record being written runs the commit itself; Flushes
//     arriving meanwhile form the next batch, which the committer
//     goroutine writes as soon as the log is free (the group commit of
//     store/internal/stage keeps one record in flight: the single
//     writer).
//   - The checkpointer, CheckpointInterval after the last checkpoint
//     ended or once CheckpointBytes are logged that no running checkpoint
//     took (checkpointDueLocked), takes the whole logged layer (exactly
//     the records up to the last LSN, since a commit moves a record in
//     under mu), writes it to bbolt with that LSN in one transaction, then
//     drops it from memory and removes the log segments wholly at or
//     below the LSN. It runs beside the committer: a Flush waits for a
//     checkpoint only when MaxUncheckpointed bytes are logged and not yet
//     checkpointed.
//   - Point reads of values that miss memory (a fresh token's lookup)
//     share one bbolt read transaction between two write transactions
//     (readtx.go): every write transaction, and Close, ends it first, so
//     it never holds a remap or the pages a commit frees, and is never
//     older than the last commit. Its lock is taken last: no other lock of
//     the store is taken while it is held.
//   - A failed log write or checkpoint is sticky (store.ErrFailed), and
//     so is a failed sync of the log's directory (wal.ErrDirSync), at a
//     rotation or at a checkpoint's removal of segments.
//
// # Open and crash recovery
//
// Open reads the checkpoint LSN from bbolt and replays the records after
// it into bbolt (storing the LSN reached in the same transactions); the
// log cuts off a torn last record, which no Flush was answered for, and
// refuses a corrupt log (wal.ErrCorrupt, naming segment and offset),
// the last record included: the log tells a damaged record from a torn
// one (store/wal, "Torn or damaged"). A record is the unit of both the
// log and the replay, so a Flush's batch is all or nothing after a
// crash, and a crash leaves a prefix of the writes in order: the store
// claims store.Ordered (one sync for a batch's two barriers).
//
// Open refuses, with ErrNoSpace and both numbers, a disk (vfs.Spacer)
// with less free space than StartSpace: the segment it preallocates and
// the bbolt file's next growth. Before that check it has written no
// segment and no layout, only what bbolt's open writes (a new file's
// first pages).
//
// Every directory entry is durable before a write is acknowledged: Open
// syncs the parent of each directory it creates (the data directory,
// wal/) and, for a new bbolt file, the data directory. A lost entry would
// lose the whole log: the next Open would start after the checkpoint with
// no error. Once the first Open's log is durable it writes wal.created; a
// later Open (or OpenReadOnly) that finds it but no segment in wal/
// refuses ErrLogLost, naming the checkpoint LSN after which writes are
// gone, rather than start a new log over the loss. An Open that finds
// the marker changes the data directory (vfs.Dirty) and syncs it: the
// marker may be an entry a failed sync left unwritten, which only a sync
// after a change writes. A directory holding
// only the bbolt file (a restore) has no marker and starts a new log.
// The bbolt file is complete at every commit and backups are byte copies
// of it, so only a file beside it, which restores do not copy, can say
// that a log existed. Started tells the offline tools whether a
// directory is this engine's (wal/ or the marker), so that they open it
// through Open or OpenReadOnly and meet the same refusal.
//
// Every bbolt commit (a checkpoint, or a start's layout or replay) runs
// under SyncFailedFile, created before it without a sync and removed once
// it succeeded, and a failed log write creates it:
// on Linux the pages a failed fdatasync did not write are marked clean and
// the page cache serves them to the next process, which would build on
// them. An Open that finds the marker writes the whole bbolt file over
// itself, meta pages last, once bbolt holds its lock, and removes the marker
// once its replay is durable; the log writes every record it replays again
// in any case (see package wal, Failed syncs).
//
// Open and OpenReadOnly start the same way (startLSN), and Open refuses
// before it writes: it reads the layout and checkpoint LSN in a read
// transaction, checks the disk's space and the log's presence, and only
// then writes the layout. A power cut between bbolt's creation of the
// file and the layout's commit leaves a valid bbolt file without a
// bucket: Open lays it out, the empty store, and OpenReadOnly reads it as
// that empty store (Fresh), without writing.
//
// bbolt's checkpoint LSN never goes back: segments at or below it may be
// removed, so a lower one would make the next Open refuse an LSN gap (or
// apply records twice). A replay that finds nothing after it writes
// nothing, and a transaction that would lower it fails
// (errCheckpointBehind), which fails the store.
//
// bbolt writes its freelist at every commit here (no NoFreelistSync): the
// file is written only by Open's replay and the checkpointer, off the hot
// path, and a persisted freelist is what keeps Open from growing with the
// file: bbolt reads that page instead of walking every page, and
// boltfmt.CheckFile checks the freelist and the branch structure instead of
// every page (see package store, Opening a file). A file without one (from
// --store bbolt) is walked once by the Open that writes it. A commit
// persists the freelist only while it lists at most maxPersistedFreePages
// ids (bbolt writes every id at every commit that persists it): past that,
// as after a compaction that freed much of the file, an open walks the
// reachable pages again until writes have reused the free ones.
//
// # Locks
//
// Store.mu is the only lock. It is never held across a bbolt call, a log
// write or a channel send; memFreed is a condition on it. A method whose
// name ends in Locked needs Store.mu held when called and holds it when it
// returns; commitAndUnlock is the one that is called with it and releases
// it.
package logfirst
