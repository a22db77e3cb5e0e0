// Package outbox defines the outbox: per conversation, the derived
// append-only stream of delivery obligations (`produced` rows: records with
// their seq and recipients) and cursor advances (`ack_advanced` rows), and
// the pure projection that derives it from the oplog.
//
// # Layout
//
// Stream `outbox/<conversation>` in the store:
//
//	byte 0     schema version (Version, 1); one version for the whole stream
//	bytes 1..  msgpack array of Row's fields, in declaration order
//
//	oplog row   outbox rows
//	genesis     none
//	enroll      produced{joined}
//	attach      produced{attached}, or produced{detached/superseded, attached}
//	tell        produced{record}        (the payload stays in the oplog row)
//	ack         ack_advanced{participant, through}
//	detach      produced{detached/clean}
//	leave       produced{left}
//	end         produced{died/<cause>} or produced{detached/<cause>}
//
// # Invariants
//
// The outbox rows of oplog row i are Project(state before i, row i): a pure
// function, deterministic down to the bytes. Every outbox row names its
// source oplog row, sources strictly increase, and no outbox row may name an
// oplog row that does not exist (an "impossible future boundary"). An
// outbox row is appended only after its oplog row is durable.
//
// State is the conversation the projection runs over; package participant
// keeps one per loaded conversation and advances it with Apply, live and
// during replay alike. Apply never writes a retained record in place, so a
// Clone can advance while the original is read; after every row it
// reclaims the leading records every recipient acknowledged. Evict, the
// only in-place writer, drops the oldest payloads from memory and marks
// their records Evicted: their payload is read back from oplog row Source.
package outbox
