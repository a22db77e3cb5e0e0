// Package fence decides which of several competing completions of one piece
// of work becomes truth. It is a port of the completion-fencing contract of
// seed 000 and imports nothing of participantd.
//
// A Fences holds, per execution site (a key of the caller's choosing), at
// most one generation: the set of random tokens issued for one attempt of
// one execution generation. Issue mints tokens, Accept consumes the whole
// generation for the first completion that presents one of them
// (AcceptHeld, for a caller that holds the completion's lease itself),
// RestoreIfAbsent puts it back when that completion could not be settled,
// Revoke withdraws one token and RevokeCurrent the whole generation. A lease
// gate (ArmLease, SettleLease, LeasePending, LeaseSettled) holds a
// completion back until the record that started its work is durable.
//
// # Invariants
//
//   - A generation is consumed at most once: comparison and removal share
//     one critical section, so of any number of concurrent Accepts of its
//     tokens (siblings of a redelivery included) exactly one succeeds.
//   - A restore never displaces a newer generation: RestoreIfAbsent writes
//     only into a site that has none.
//   - A revoke never removes a sibling: Revoke withdraws the caller's own
//     token; only RevokeCurrent, which parks the site, takes siblings.
//   - A gated token is never accepted before its lease settles: Accept
//     waits at LeaseSettled before it looks at the generation. The one
//     exception is AcceptHeld, whose caller armed the lease itself and
//     orders the completion's record after the lease's in one write, so
//     the completion cannot overtake it and a wait would be on itself.
//   - A superseded token stays refused: a different generation key or a
//     higher attempt replaces the generation, and a late re-issue of a
//     superseded attempt registers nothing.
//
// Nothing here is durable. A restarted process starts with an empty
// registry, so every token minted before the restart is refused
// (StaleGeneration once the site is issued again, NoCurrentGeneration
// before).
//
// # Use in participantd
//
// Each binding of a participant is one generation of the site
// (conversation, participant), keyed by IdempotencyKey("binding", ...) over
// the binding's epoch. Ending a binding (detach, supersession, connection
// loss, leave, shutdown) is accepting its token: the first ending consumes
// the generation and a competing one is refused, so exactly one ending is
// recorded. If the ending's barrier fails, RestoreIfAbsent gives the
// binding back unless a newer attach was issued meanwhile. The lease gate
// is armed when a binding's attach row is appended and settled once its
// barrier returns, whether it succeeded or not, so an ending is never
// recorded before the binding's own attach row is durable. An ending staged
// in the same batch as the binding's attach row (enroll then detach in one
// pipelined write) is ordered after that row by the batch's own oplog
// appends and settled by the same barriers: it uses AcceptHeld, since the
// batch holds the lease until its barriers return.
//
// # Idempotency key layout
//
// IdempotencyKey is lowercase hex of SHA-256 over:
//
//	bytes   field
//	34      "participantd.fence.idempotency.v1\x00" (NUL-terminated, NUL-free)
//	8       len(domain), big-endian uint64
//	n       domain
//	8 each  ids, big-endian uint64, in the caller's order
//
// # Lock order
//
// Fences has two mutexes, one for the generations and one for the lease
// gate. They are never held together, and neither is held while logging,
// waiting or closing a channel.
package fence
