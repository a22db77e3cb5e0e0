// Package stage is the group commit the store engines share: the batch a
// Flush waits on, and the bookkeeping that makes concurrent Flush callers
// share one durable write.
//
// An engine stages writes in memory under its own mutex and owns one
// committer goroutine. What it supplies is the part that differs: how to
// write a batch durably (a bbolt transaction for store/boltstore, a log
// record for store/logfirst) and how its reads merge what is durable with
// what is staged. What this package keeps is the order that makes a Flush
// correct in every engine:
//
//	Flush with writes staged    joins the next batch, creating it and waking
//	                            the committer if it is the first; waits for it
//	Flush with nothing staged   waits for the batch in flight, if any (it may
//	                            carry writes that returned before the call)
//	committer                   takes the next batch, and with it every write
//	                            staged so far, under the engine's mutex; writes
//	                            it without the mutex; finishes it with the result
//	Close                       fails the next batch with store.ErrClosed
//
// A batch is finished once, after the engine has recorded its outcome
// under the mutex and released it: a Flush that returns nil has every
// write staged before it began durable.
//
// # Locks
//
// Group holds no lock of its own: its fields are guarded by the engine's
// mutex, and its methods ending in Locked are called with that mutex held.
// Nothing here sends on a channel or blocks while the caller holds it.
package stage
