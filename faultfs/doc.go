// Package faultfs is an in-memory vfs.FS that injects file-system faults
// and simulates power cuts, in the style of pebble's vfs/errorfs, so that
// tests can cut the write-ahead log at any system call and check what a
// restart finds.
//
// # Operations
//
// Every call that changes a file or a directory is an Op with a 0-based
// Index counted across the FS; reads (Open, ReadAt, Size, List) are not
// counted and never fail:
//
//	call                    kind
//	FS.Create               OpCreate
//	FS.OpenRW               OpOpenRW
//	FS.Remove               OpRemove
//	FS.MkdirAll             OpMkdir
//	FS.SyncDir              OpSyncDir
//	File.WriteAt            OpWrite
//	File.Sync               OpSync
//	File.Preallocate        OpPreallocate
//	File.Truncate           OpTruncate
//	FS.Commit               OpCommit (a bbolt transaction, see below)
//
// A Rule decides per op: None runs it, Fail returns an error wrapping
// ErrInjected without running it, FailSync fails a sync as Linux does
// (below), and Cut is a power cut: that op and every later one fail with
// ErrCut without running, until Crash.
//
// # Durability model
//
//	state                              survives Crash
//	bytes written, then File.Sync      yes
//	bytes written, not synced          as the Model says (below)
//	size changes (Truncate,            only after File.Sync (or with a
//	  Preallocate)                     block kept past the old size)
//	a created or removed name, of a    only after SyncDir of its directory
//	  file or a directory (MkdirAll)
//	anything in a lost directory       no, however well synced
//
// SetJournaled adds what a journaling file system may do: creates and
// removes of file names that no SyncDir covered reach the disk in the
// order they were made, and a Crash keeps a random prefix of them (a
// remove followed by a create of the same name may keep the remove alone).
//
// The Model decides what survives of a file's writes since its last Sync:
// TornPrefix keeps a random prefix of the last one and nothing of earlier
// ones; Blocks keeps or loses each BlockSize block that changed, each at
// its newest content, independently (a disk writing dirty sectors back in
// any order: the ALICE and CrashMonkey model); Strict, the default, picks
// one of the two per file at every Crash. The choices come from the rng
// given to Crash, so a seed replays them.
//
// Crash applies the model: it rolls every file back to what survives and
// the namespace back to its last synced state, and clears the cut, so
// that the same FS serves the restarted process. Handles opened before a
// Crash fail with ErrStale.
//
// # Failed syncs
//
// FailSync is a failed fsync or fdatasync on Linux (PostgreSQL's
// "fsyncgate"): the kernel reports the error once and marks the file's
// dirty pages clean without having written them. So:
//
//	after a FailSync of a Sync (or a Commit)   the model
//	reads, by this process or the next one      the unwritten bytes (the
//	  (a restart without a reboot)                page cache holds them)
//	a later Sync or Commit                      succeeds, and writes none of
//	                                              them
//	a later write to a page (WriteAt; for a     dirties it: the next sync
//	  Commit, a change of the page)               writes it whole
//	Crash                                       the stale pages are the
//	                                              disk's: gone, or for a file
//	                                              in memory torn as the Model
//	                                              tears unsynced writes
//
// A directory is one such page (small directories fit in one block): a
// FailSync of SyncDir marks its creates and removes since its last sync
// clean unwritten. The namespace (Open, List) still shows them; a later
// SyncDir of it succeeds and writes none of them, until a create or
// remove in it dirties it again and the next SyncDir writes it whole;
// a Crash loses them (a journaled FS may still keep a prefix of them, as
// of any create or remove no SyncDir wrote).
//
// A page (PageSize) is stale when its content differed from the disk's
// at the failed sync; a Truncate does not dirty the page it cuts into
// (the strictest reading), and one that cuts a stale page off drops it.
// A Commit whose sync fails runs its change on the operating system's
// file, which a restarted bbolt then reads from it, as it would from the
// page cache.
//
// # Space
//
// SetCapacity bounds the bytes all files hold together: a WriteAt,
// Preallocate or Truncate that would pass it fails with ErrNoSpace
// (wrapping syscall.ENOSPC) and changes nothing, and Available
// (vfs.Spacer) reports what is left, as statfs does on a real disk.
//
// # External files
//
// A file another library writes through the operating system (bbolt's
// data file, which it maps) cannot live in memory. Commit covers it: the
// caller wraps each durable change of it (bbolt's Open of a new file, each
// transaction) in Commit, which is one op. Commit reads the file back
// after each change as its synced content; its name joins the namespace
// like a created file's, durable after SyncDir of its directory. A cut
// during a Commit runs the change and then fails it, and Crash tears it as
// a crash tears a bbolt commit: either before bbolt's first fdatasync
// (the data pages past the two meta pages kept or lost per block, at the
// new size bbolt synced first, the meta pages as they were) or before its
// second (the data pages written, the changed meta page torn at a random
// byte or per block). Crash then rewrites the file on disk as it survives,
// or removes it if its entry did not. Writes bbolt makes outside Commit
// are not modelled: the log-first store routes all of them through it.
package faultfs
