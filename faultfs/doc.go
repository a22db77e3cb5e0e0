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
//
// A Rule decides per op: None runs it, Fail returns an error wrapping
// ErrInjected without running it, and Cut is a power cut: that op and
// every later one fail with ErrCut without running, until Crash.
//
// # Durability model
//
//	state                              survives Crash
//	bytes written, then File.Sync      yes
//	bytes written, not synced          no (Crash may keep a random prefix
//	                                   of the last such write: a torn write)
//	size changes (Truncate,            only after File.Sync
//	  Preallocate)
//	a created or removed name          only after SyncDir of its directory
//	MkdirAll                           yes, at once
//
// Crash applies the model: it rolls every file back to its synced content
// and the namespace back to its last synced state, and clears the cut, so
// that the same FS serves the restarted process. Handles opened before a
// Crash fail with ErrStale.
package faultfs
