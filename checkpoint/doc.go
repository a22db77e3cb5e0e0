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
//	byte 0        version: Version1, Version2 or Version3
//	bytes 1..n-4  msgpack body, deterministic:
//	                Version1  Checkpoint as an array
//	                Version2  [Checkpoint, Released]
//	                Version3  [Checkpoint, Released, Invites]
//	last 4 bytes  CRC-32C (Castagnoli) of the body, big-endian
//
// Encode writes the oldest version that holds the checkpoint: Version1
// when no member waits for a compacted notice (no Released), byte for
// byte as before releases existed; Version2 when no invitation with a use
// count admitted an enroll (no Invites), byte for byte as before use
// counts existed; Version3 otherwise.
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
