// Package checkpoint defines checkpoints: a conversation's state after its
// first Index oplog rows, so that a start replays only the rows after it
// and compaction may remove the rows below it (docs/DESIGN.md,
// Checkpoints).
//
// # Layout
//
// One byte value per conversation, `checkpoint/<conversation>` (Key),
// which each newer checkpoint replaces:
//
//	byte 0        version: Version1 to Version4
//	bytes 1..n-4  msgpack body, deterministic:
//	                Version1  Checkpoint as an array
//	                Version2  [Checkpoint, Released]
//	                Version3  [Checkpoint, Released, Invites]
//	                Version4  [Checkpoint (no Records), Released, Invites, Window]
//	last 4 bytes  CRC-32C (Castagnoli) of the body, big-endian
//
// Versions 1 to 3 hold a copy of every unreclaimed record (Records), so
// that their size, and the memory to derive, encode and decode them, grew
// with what a recipient had not acknowledged. Version4, the one package
// participant writes, holds a Window instead: the seq of the first
// unreclaimed record and the oplog and outbox rows that produced it; the
// records are the ones the outbox rows from there to Produced-1 carry,
// which a reader streams from the store. Its size depends on the members,
// marks and invitations only. A checkpoint with a Window is encoded as
// Version4; one without, as the oldest of Versions 1 to 3 that holds it:
// Version1 when no member waits for a compacted notice (no Released),
// byte for byte as before releases existed; Version2 when no invitation
// with a use count admitted an enroll (no Invites), byte for byte as
// before use counts existed; Version3 otherwise. Every version still
// decodes: a data directory checkpointed by an older binary loads, and
// its next checkpoint is written as Version4. An older binary refuses a
// Version4 checkpoint as corrupt (a downgrade contains the conversations
// checkpointed since).
//
// # Invariants
//
// Each version has one encoding of a checkpoint, and Decode accepts only
// it: a known version, the CRC matching, a body that re-encodes to exactly
// itself in the same version, and a checkpoint that is well formed on its
// own (WellFormed: positions inside the rows it covers, records
// contiguous, recipients and releases in order and range, marks
// monotonic), so that nothing that reads it indexes out of range or trusts
// an impossible state. Anything else is ErrCorrupt.
//
// # Writers and readers
//
// Package participant's checkpointer derives a checkpoint by replaying
// stored rows through outbox.Project and outbox.Apply, matching the stored
// outbox byte for byte, exactly as a start does, and writes it; its
// compaction reads the marks. A start (reconciliation) decodes it, checks
// that it lies inside the streams (the digests of the last row of each
// stream it covers) and continues from State; a checkpoint that fails is a
// refusal of its conversation, never a fallback to another starting point.
// participant's Inspect (participantctl verify) also replays from row 0
// and compares.
package checkpoint
