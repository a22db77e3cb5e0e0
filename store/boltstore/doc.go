// Package boltstore is the bbolt engine of participantd (--store bbolt): a
// store.DurableStore that writes each group commit as one bbolt write
// transaction into a data file of the layout of store/boltfmt. Open runs
// boltfmt's pre-open checks (see boltfmt, Opening a file) and fsyncs the
// directory of a file it creates; Check, Space and InUse serve the offline
// tools and the disk quota.
//
// # Group commit
//
// Append and CAS stage writes in memory under Store.mu; reads merge the
// committed file with the staged writes. Each stream's committed length and
// staged payloads are cached after its first use, so Len is O(1). A single
// committer goroutine, owned by the Store and stopped by Close, writes to the
// file, with the group commit of store/internal/stage (which logfirst uses
// too); what this package supplies is the write, one bbolt transaction:
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
// Store.mu is the only lock of the package. It is never held across a bbolt
// call or a channel operation, so bbolt's own locks are always taken
// without it.
package boltstore
