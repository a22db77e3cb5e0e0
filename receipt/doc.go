// Package receipt defines receipts: what stands in for a token-bearing
// oplog row once compaction removed it, exactly what a replay of the row's
// token answers or checks, kept forever (docs/DESIGN.md, Replays after
// compaction).
//
// # Layout
//
// Version 2 (Version2), written since receipts were made compact:
//
//	key   receipt/<conversation>/<oplog index, 8 bytes big-endian>  (Key)
//	value 2 | kind (1 byte) | token (16 bytes) | uvarint participant |
//	      uvarint generation | uvarint seq | uvarint cursor |
//	      varint commit time (unix ms) | a tell's payload SHA-256
//	      truncated to HashLen bytes (absent for other kinds) |
//	      CRC-32C (Castagnoli) of everything before it, 4 bytes big-endian
//	      about 50 bytes for a tell
//
// Version 1 (Version1), written before and still read:
//
//	key   receipt/<conversation>/<oplog index, 20 decimal digits>   (KeyV1)
//	value 1 | msgpack array {kind, participant, generation, token, seq,
//	      cursor, commit time, payload hash (empty for other kinds)}
//
// Receipts are keyed by the row's index, as the token index names rows;
// the fixed-width index keeps a conversation's receipts in insertion
// order, so the store packs them densely.
//
// # Invariants
//
// Each version has one encoding of a receipt, and Decode accepts exactly
// it (known version, every varint minimal, the msgpack body canonical,
// nothing left over, the CRC matching): anything else is ErrCorrupt. A
// tell's receipt carries a payload hash of HashLen bytes and no other
// kind's does.
//
// # Writers and readers
//
// Package participant's compaction writes the receipt of every
// token-bearing row (version 2), and makes them durable before it trims
// the rows, so a compacted row without a receipt carried no token. A token
// lookup whose index entry names a compacted row reads the receipt there
// (the version 2 key, then the version 1 key) and verifies it as it would
// the row; one that does not decode is answered unavailable, never "not
// committed", since a damaged token would otherwise let its retry commit
// twice.
package receipt
