// Package participant is the participant service: every operation of the
// protocol (enroll, attach, tell, ack, detach, leave, and the end of a
// connection), committed through two durability barriers, replayed exactly
// on a retried token, reconciled and repaired at start and after a failed
// commit, and published to bound connections as ordered deliveries. It is
// transport-independent: package wire's messages map one to one onto
// Conn's methods and Delivery.
//
// # The commit
//
// Per conversation, operations are serialized by the conversation's turn (a
// one-slot semaphore held across the barriers); conversations commit in
// parallel and share the store's group commits. An operation
//
//  1. resolves its token (a replay or token_conflict answers at once),
//  2. decides, purely, in PROTOCOL.md's order of checks: a refusal, or the
//     oplog row to commit (decide.go),
//  3. barrier 1: writes the token index entry and appends the oplog row,
//     then flushes,
//  4. barrier 2: appends the outbox rows outbox.Project derives from the
//     row, then flushes,
//  5. applies the row to the in-memory state, wakes the connections with
//     something new to push, and answers.
//
// A failure before the first append answers unavailable; at or after it,
// in_doubt. Either way nothing is applied, published or woken, and the
// conversation's state is dropped: the next touch reconciles it from its
// streams, repairing (never rolling back) whatever the failed commit left.
//
// # Invariants
//
//   - An answer is sent only after both barriers of its operation.
//   - The outbox of a conversation is, byte for byte, the projection of its
//     oplog; nothing of a conversation is published before it is reconciled.
//   - A token commits at most once per scope (enroll: the conversation;
//     other operations: the participant); every retry of it replays the
//     original answer, for the life of the data.
//   - Each binding ends exactly once, and never before its own row is
//     durable: bindings are generations of the fence site (conversation,
//     participant) in package fence.
//   - Record seqs are gap-free from 1; a record is addressed to the members
//     at its commit except its subject.
//
// # Secrets
//
// Secrets are never stored. The attach secret of credential (conversation,
// participant, generation) is HMAC-SHA256 under the node key (32 random
// bytes in the data directory's node.key, mode 0600) over a domain tag, the
// conversation's random genesis nonce and the three numbers. Verification
// and replay re-derive it.
//
// # Deduplication
//
// The token index lives in the store (see tokens.go): one value per
// committed token, pointing at its oplog row, written in the row's barrier
// and verified against the row on every lookup. The heap holds no token
// set, so memory does not grow with the number of operations.
//
// # Locks
//
// Lock order: a conversation's turn, then its mu, then a Conn's mu;
// Service.mu is taken alone. No mutex is held across I/O; the turn is.
package participant
