// Package participanttest holds test drivers of package participant that
// run over any store.DurableStore, so that the packages of other stores
// (cluster, for etcd) can run them over their store too without
// package participant importing those stores.
//
// It holds two drivers. Model is the randomized model test: it feeds the
// same random operations to a service and to a reference model written
// from docs/PROTOCOL.md (model_ref.go), with crash-restarts, in_doubt
// faults and, by seed, a clock fault model (a steady clock; a clock that
// steps forward past the token window and the receipts' lifetime, back
// to the true time and an hour behind it, a restart being a node with a
// skewed clock; the same under a token window, with checkpoint and
// compaction passes forgetting tokens while the clock is wrong, and
// UUIDv7 tokens drawn on clients' clocks a little ahead of the true
// time), and compares every answer, the records the service retains with
// their recipients, every delivery and every wake. It is white-box where
// the comparison needs it (a conversation's published state, its turn to
// queue a pipelined batch, the secret derivation), through the hooks of
// participant/internal/peek, which no package outside participant/ can
// import.
//
// The crash-cut loop: CutWorkload drives every operation kind
// through one service, CutLoop cuts it at store operation 0, 1, 2, ... in
// turn through a faultstore, crashes the store (what was staged and not
// flushed is lost, as in a process crash), reopens it and checks the
// contract with CheckInvariants (and CheckCompacted after the run the cut
// did not reach).
//
// The invariants checked after every crash:
//
//	| invariant                                     | how                          |
//	|-----------------------------------------------|------------------------------|
//	| nothing becomes unloadable                    | Service.Unloadable is empty  |
//	| outbox = projection of the oplog, no repair   | participant.Inspect          |
//	| checkpoints are what a replay derives         | participant.Inspect          |
//	| record seqs without gap or duplicate          | CheckRecords                 |
//	| each binding ends at most once, after it began| CheckRecords                 |
//	| every answered operation replays its answer   | the Answered checks          |
//
// A faultstore.Backend says how to make a store and how to crash it: a memory store
// drops what was not flushed; an etcd store is closed without flushing
// and reopened on the same prefix. participant's tests run both drivers
// over memory stores (package participant_test, since this package
// imports participant); package cluster's tests run them over etcd.
package participanttest
