// Package tokenindex defines the token index: the store's record of which
// oplog row committed each token, so that deduplication is permanent and
// its memory is the store's, not the heap's, and the token floor that
// bounds it in time under a token window.
//
// # Layout
//
// Values of the store (uint64s), under keys of the conversation:
//
//	key                                        value
//	token/<conversation>/e/<hex token>         Value(i): oplog row i committed
//	                                           the enroll token
//	token/<conversation>/<participant>/<hex>   Value(i), for every other token,
//	                                           by its participant
//	token/<conversation>/window                the token floor, unix ms: a
//	                                           token whose time is below it
//	                                           may have been forgotten
//
// A value is the row's index plus one, so that 0, the value of a key never
// written, names no row (Index). Every key starts with
// `token/<conversation>/`: the cluster maps a conversation's keys to one
// scope by that (cluster.Scope). Scopes are "e" or a decimal participant,
// so no token key is the floor's key.
//
// # Writers and readers
//
// Package participant writes an entry (CAS from the value it read) in the
// barrier of the oplog row that commits the token, before the row, so every
// durable row has a durable entry. The reverse does not hold: a commit that
// failed after the CAS leaves an entry naming a row that does not exist or
// holds something else, so a lookup verifies the row it names (or its
// receipt, package receipt, once compaction removed it) and reads a
// mismatch as "never committed". Compaction, under a token window,
// persists a floor before it deletes (CAS to 0) the entries of tokens below
// it, so a retry of a forgotten token is refused token_expired, never
// committed twice. participant's Inspect (participantctl verify) reads
// every stored row's entry and the floor.
package tokenindex
