// Package participanttest holds test drivers of package participant that
// run over any store.DurableStore, so that the packages of other stores
// (store/etcdstore, cluster) can run them over their store too without
// package participant importing those stores.
//
// It holds the crash-cut loop: CutWorkload drives every operation kind
// through one service, CutLoop cuts it at store operation 0, 1, 2, ... in
// turn through a faultstore, crashes the store (what was staged and not
// flushed is lost, as in a process crash), reopens it and checks the
// contract with CheckCut.
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
// Only the exported API of participant is used here: the package imports
// participant, and participant's own tests use it from package
// participant_test.
package participanttest
