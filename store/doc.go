// Package store defines DurableStore, the storage contract of participantd,
// and its two implementations: a bbolt file (the embedded default, with
// group commit) and an in-memory store for tests.
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
package store
