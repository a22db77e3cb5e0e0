// Package registry defines the registry: the stream that lists every
// conversation a store holds, so that a start knows which conversations to
// reconcile without scanning the store.
//
// # Layout
//
// Stream `conversations` (Stream) in the store, one entry per registration:
//
//	byte 0      version (Version, 1)
//	bytes 1..8  the conversation id, big-endian
//
// An entry is exactly 9 bytes. Decode refuses any other version with
// ErrUnknownVersion and any other length with ErrCorrupt: a reader that
// skipped an entry it cannot read would not load a conversation that
// exists, so an unreadable registry fails the start instead.
//
// # Writers and readers
//
// Package participant appends a conversation's entry before its genesis
// row, and barrier 1 makes both durable with one flush: a store keeps a
// prefix of its writes across a crash, so no genesis row is durable
// without its entry. A commit that fails after the append leaves an entry
// whose conversation may have no row, and its retry appends a second one:
// readers take each conversation once, at its first entry, and a
// conversation without rows reconciles as empty. participant reads the
// stream at Open and in its offline Inspect; cluster.View, over a cluster
// (which keeps no registry), derives the stream with Encode.
package registry
