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
// Per conversation, operations are queued and decided in order by whoever
// holds the conversation's turn (a one-slot semaphore held across the
// barriers); conversations commit in parallel and share the store's group
// commits. The turn's holder takes every queued operation (up to maxBatch)
// as one batch (batch.go) and, against a working copy of the state,
//
//  1. resolves each operation's token (a replay or token_conflict answers
//     without committing; a token staged earlier in the batch replays too;
//     under Options.PrefetchTokens the index values of all the batch's
//     tokens are read concurrently first, tokens.go),
//  2. decides, purely, in docs/PROTOCOL.md's order of checks: a refusal, or the
//     oplog row to commit (decide.go), which it projects and applies to
//     the working copy, so the next decision sees it;
//
// then writes the batch behind one pair of barriers:
//
//  3. barrier 1: writes the token index entries and appends the oplog
//     rows, then flushes (not on a store that keeps its writes' order,
//     OrderedOwnership: there the appends' order keeps barrier 1 and
//     barrier 2's flush makes both durable; on one that seals,
//     SealingOwnership, it seals them into a commit of their own and
//     waits for it after barrier 2's flush),
//  4. barrier 2: appends the outbox rows outbox.Project derived, then
//     flushes,
//  5. publishes the working copy, wakes the connections with something new
//     to push, and answers every operation of the batch in order.
//
// A failure before the first append answers unavailable; at or after it,
// in_doubt, for every operation from the batch's first staged one on.
// Nothing is applied, published or woken, and the conversation's state is
// dropped: a background reload (and otherwise the next touch) reconciles it
// from its streams, repairing (never rolling back) what the failed commit
// left.
//
// Conn's synchronous methods (Tell, …) wait for their outcome; the Start
// variants (StartTell, …) queue the operation and return a Call, so a
// transport that starts a connection's pipelined requests in order and
// waits for them in order keeps the protocol's per-conversation order while
// they share barriers.
//
// An operation is its request type (operation.go): Enroll, Tell, … each
// say what queueing needs (spec: its name, conversation, whether it may
// create it, its token) and decide it within a batch (decide), and one
// generic start queues, waits for and observes every one of them. Package
// wire's Operation and the server's begin are the other two places an
// operation is named: its codec, and the mapping of its request and answer.
//
// # Invariants
//
//   - An answer is sent only after both barriers of its operation.
//   - The outbox of a conversation is, byte for byte, the projection of its
//     oplog; nothing of a conversation is published before it is reconciled.
//   - A token commits at most once per scope (enroll: the conversation;
//     other operations: the participant); every retry of it replays the
//     original answer, for the life of the data, or, under a token window
//     (Options.TokenWindow), until the window passes and then is refused
//     token_expired: never committed again.
//   - Under a token window, a committed token's index entry is gone only
//     if the token's time is below the conversation's persisted floor.
//   - Each binding ends exactly once, and never before its own row is
//     durable: the turn orders every ending after the state and barriers
//     of the batches before it, and bindings are generations of the fence
//     site (conversation, participant) in package fence, so an ending
//     decided under a Forget that overtook its batch is refused.
//   - Record seqs are gap-free from 1; a record is addressed to the members
//     at its commit except its subject.
//
// # Stored formats
//
// Every stored byte is in a format with its own package, its codec, its
// versions, a fuzzer and a golden file; this package writes and reads them
// through the store:
//
//	package     key or stream                      what
//	oplog       stream oplog/<c>                   committed operations
//	outbox      stream outbox/<c>                  delivery obligations
//	registry    stream conversations               every conversation
//	tokenindex  values token/<c>/…                 the row of each token, the floor
//	checkpoint  bytes checkpoint/<c>               the state after a prefix of rows
//	receipt     bytes receipt/<c>/<oplog index>    a compacted row's token
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
// The token index (package tokenindex) lives in the store: one value per
// committed token, pointing at its oplog row, written in the row's barrier
// and verified against the row on every lookup. The heap holds no token
// set, so memory does not grow with the number of operations. Compaction
// replaces the entries' rows with receipts (package receipt), or, under the
// token window, forgets the entries of tokens older than a floor it
// persists first (tokens.go, compaction.go).
//
// # Reconciliation and containment
//
// A conversation is loaded, at Open and after a drop, by reconcile.go,
// reading both streams in pages bounded in bytes under a byte budget that
// every reconciliation shares (LoadBytes), so no history is held whole:
// validate the whole outbox (versions, decoding, increasing sources, no
// source beyond the oplog), replay the oplog through outbox.Project,
// match every stored outbox row byte for byte, append the missing suffix,
// flush, then end the bindings a previous incarnation or an ended
// connection left (died/unclean_restart, died/connection_lost) in one
// batch. A finding that forbids loading contains the conversation: it is
// listed by Unloadable with a stable class and answers unavailable, and
// nothing of it is published. Inspect runs the same reconciliation
// without writing, for the offline tools, and then a check a start does
// not make, since it reads every stored row's token index entry: each
// names its row unless the row's UUIDv7 token is below the conversation's
// persisted token floor (else token_index_missing).
//
// # Memory
//
// A loaded conversation keeps the records some recipient has yet to
// acknowledge (outbox.State.Records); after every applied row the leading
// records nobody still needs are reclaimed. Their payloads are held in
// memory within Options.MaxBacklogBytes for the whole service: past it, the
// conversations holding the most drop their oldest payloads
// (outbox.State.Evict, under the victim's turn, taken without waiting, and
// its write lock; see backlog.go) and Conn.Next reads such a payload back
// from its oplog row, outside every lock. Each conversation also keeps at
// most Options.BacklogWindowBytes of payloads in memory, dropping its
// oldest at its own commit, so that a recipient that never reads costs its
// window whatever it is sent; a start evicts past the window as it loads,
// never holding every payload retained. The records themselves (16 bytes
// each in an outbox.Retention, and a run per stretch of records that share
// a subject and recipients; as much again in a checkpoint derivation's
// replay state; a checkpoint names their rows instead of holding them) are
// bounded by backpressure
// (backpressure.go): past Options.MaxBacklogRecords in a conversation, or
// past Options.BacklogRecords in the service for the conversations that
// retain the most, enroll, tell and attach are refused backlog_full before
// anything is written; what settles or ends is never refused. Each
// conversation is charged to the Principal (ConnectAs) that first adds to
// it, and one principal's conversations may take only Options.ClientShare
// of BacklogRecords and of MaxConversations (share.go), and above 80 % of
// either a principal holding a twentieth is refused first, so neither one
// client nor many principals of one host starve a newcomer; Evict and Drop are the operator's way to
// retire what no client will (evict.go). Backlog reports the account. A conversation entry exists only for a registered conversation
// or while an enroll that may create it is in flight, and a connection's
// binding slots are reserved when an enroll or attach is decided, so that
// neither refusals nor pipelining grow memory past the caps; the slot of
// one whose binding may be stored unpublished (in doubt) stays reserved
// until the conversation's next load settles it (conn.go, holding), or
// until the conversation is forgotten with its ownership (Forget, or an
// Acquire answered moved) or contained as unloadable, or the connection
// ends, after which a load that finds the binding binds it only where
// the connection has room, and ends it otherwise.
//
// # Admission and quotas
//
// Under EnrollInvite an enroll must carry an invitation to its conversation
// (invite.go): an expiry and an HMAC under the node key, domain-separated
// from the attach secrets, checked right after the token. MaxConversations
// caps the store's conversations: the first enroll of a new one takes a
// slot when it is decided (quota.go), so concurrent first enrolls cannot
// overshoot, and a commit failing before the registry entry returns it.
// MaxDataBytes caps the store's size as the DataBytes probe reports it, for
// enroll and tell only: what ends or advances existing state (ack, detach,
// leave, endings) always commits.
//
// # A failed store
//
// A store error wrapping store.ErrFailed (a failed fsync, a full disk) is
// sticky: no later write of this process can commit. The first one met, by
// an operation, a reconciliation or a reload, is logged once and reported
// by StoreFailed and Failed (failed.go); at Open it fails Open. The owner
// stops serving and restarts, and the restart reconciles.
//
// # Checkpoints
//
// A checkpoint (package checkpoint) is a conversation's state after its first
// Index oplog rows, kept as the byte value checkpoint/<conversation> of a
// store.Compactor. CheckpointPass (checkpointer.go), run in the background
// every Options.CheckpointInterval, derives it without the conversation's
// turn by replaying durable rows from the previous checkpoint through the
// same code as a start (rebuild.go), matching the stored outbox byte for
// byte. Reconciliation starts from the checkpoint: it checks it (CRC,
// canonical form, well-formedness, conversation, digests of the last rows
// it covers), reads its unacknowledged records from the outbox rows its
// window names (checkpoint.Window; inline in the versions before 4) and
// their payloads from their oplog rows, and replays only the rows after it. A checkpoint that fails
// is a refusal (checkpoint_corrupt, checkpoint_mismatch), and an oplog
// compacted without one is checkpoint_missing; nothing falls back to
// another starting point.
//
// # Compaction
//
// CompactPass (compaction.go), run after each checkpoint pass, removes the
// oplog and outbox rows below the newest compaction mark at least
// Options.Retain old (a mark records when every record produced below a
// row was settled), never the last row a checkpoint covers. It first
// writes, and flushes, a receipt (package receipt) for every token-bearing row
// about to go, then trims under the conversation's turn. A token lookup
// that names a compacted row verifies its receipt instead; a tell's retry
// compares the payload's hash. Compact runs the same passes offline.
//
// Both passes count what they did (stats.go): Lifecycle snapshots the
// counters (passes by outcome, checkpoints written and skipped by
// SkipReason, rows and bytes trimmed, receipts, the last successes, the
// conversations pinned by an unacknowledged record older than Retain), and
// an Options.Observer that implements PassObserver is told each pass's
// duration. A pass's step on one conversation that fails fails that
// conversation alone (passretry.go): damage contains it, anything else
// is retried by a later pass with backoff, each counted by
// ConversationStep; only a failed or closed store ends a pass.
//
// # Locks
//
// Lock order: a conversation's turn, then its mu (or qmu), then a Conn's
// mu; Service.mu is taken alone. No mutex is held across I/O; the turn is.
// A method whose name ends in Locked needs the mutex its comment names held
// when called and holds it when it returns; one ending in Turn needs the
// conversation's turn (ensureLoadedTurn, trimTurn). The mutexes' fields
// and the Locked methods carry checklocks annotations (+checklocks:mu,
// +checklocksread:cv.mu), which make lint checks: gVisor's checklocks
// proves each access holds the mutex named, and reports a field used
// under a mutex that has none. The turn is a channel, which it cannot
// follow: "Turn holder only" stays a comment.
package participant
