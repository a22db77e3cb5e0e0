// Package heapgoal keeps the Go collector's heap goal from following the
// highest live heap of a single collection.
//
// The runtime sets its next heap goal from the live heap the last
// collection marked: about twice it at GOGC=100. A server whose live heap
// is a sum of fixed budgets (the log's rows until a checkpoint, a
// checkpoint's pages, connections' outbound frames, requests in flight)
// has a stationary live heap: the same median however long it runs, and
// peaks where several budgets happen to be at their tops at once. The
// process's resident memory follows the highest goal it ever reached, so a
// run ten times longer, meeting more of those coincidences, ends with more
// memory though it holds nothing more. That is memory that grows with the
// volume served, not with what the server keeps.
//
// A Follower sets the runtime's soft memory limit after every collection
// from the recent past rather than the last collection alone:
//
//	limit = max(Factor × median live heap of the last Window collections,
//	            Growth × the last collection's live heap)
//	        + the runtime's memory outside the heap (stacks, metadata)
//
// capped by the operator's own limit (GOMEMLIMIT). At the median the
// limit sits above the runtime's own goal and changes nothing; a
// collection whose live heap peaks up to Factor/Growth times the median
// no longer raises the goal with it, the limit holds it. A live heap that
// grows for real is followed at once up to Growth times its last value,
// and by the median within Window/2 collections: a limit the live heap
// outgrows makes the collector run more often (the runtime caps that at
// half the CPU), never fail an allocation.
package heapgoal
