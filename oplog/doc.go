// Package oplog defines the operation log: per conversation, the
// authoritative append-only stream with one row per committed operation, and
// the domain numbers shared by the layers above (conversation, participant,
// generation, seq, token, connection incarnation).
//
// # Layout
//
// Stream `oplog/<conversation>` in the store; entry i is the i-th committed
// operation of the conversation. Entry 0 is always the Genesis row.
//
//	byte 0     schema version (Version, 1)
//	bytes 1..  msgpack array of Row's fields, in declaration order
//
// The encoding is deterministic: the same Row always encodes to the same
// bytes, so that a row re-derived during repair is byte-identical.
//
// # Invariants
//
// A row holds inputs and allocated positions only, never a secret. A row is
// durable before any outbox row derived from it is appended (package
// participant keeps that order).
package oplog
