package store

// Stats counts what a store did since it was opened, so that a metrics layer
// can report flushes, commits and writes per commit. Counters only grow.
type Stats struct {
	// Flushes counts Flush calls accepted by an open, healthy store,
	// including those that found nothing to make durable.
	Flushes uint64
	// Commits counts transactions that made writes durable (for boltstore, bbolt
	// write transactions committed; for Memory, Flush calls that had
	// unflushed writes). With group commit, Commits is at most Flushes.
	Commits uint64
	// Appends counts successful Append calls.
	Appends uint64
	// CASWrites counts successful CAS calls.
	CASWrites uint64
	// ValueLoads counts values read from the file because no write of them
	// was in flight and they were not cached (boltstore only).
	ValueLoads uint64
}

// BackupSize is the number of bytes a store's Backup writes for the snapshot it
// takes, passed to begin before any byte is written (for a Content-Length).
type BackupSize func(size int64)
