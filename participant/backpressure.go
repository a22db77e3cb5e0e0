package participant

import (
	"sync/atomic"

	"github.com/participantd/participantd/outbox"
)

// Backpressure on retained records (docs/DESIGN.md, Publication). Payload
// bytes of the records a recipient has yet to acknowledge are bounded by
// eviction (backlog.go), but each retained record keeps its metadata in
// memory (a slot of an outbox.Retention, about 20 bytes of heap); so the number of retained
// records is bounded too, by refusing the operations that add records and
// can wait (enroll, tell, attach) with backlog_full, before anything is
// written. What settles or ends (ack, detach, leave, a connection's end)
// is never refused: it is what drains the backlog.
//
// Two limits apply, each with a soft threshold and a hard ceiling:
//
//   - per conversation, MaxBacklogRecords: a conversation retaining that
//     many records is refused;
//   - per service, BacklogRecords, the budget: past it, a conversation is
//     refused when it retains half or more of the headroom left below the
//     ceiling, a quarter past the budget. A conversation whose recipients
//     acknowledge promptly retains a handful of records and keeps
//     committing; the conversations behind deaf members, which retain the
//     most, are the ones refused. Each further deaf conversation gets at
//     most a third of what headroom is left, so it takes many of them
//     (some twenty, with the defaults, before one retaining ten records is
//     refused) to reach the ceiling, where everything that adds records is
//     refused: the last resort that bounds memory whatever the clients do.
//
// An attach of a participant that has records waiting for it is admitted
// past both soft thresholds: attaching is how those records get delivered
// and acknowledged, so refusing it could hold the backlog forever. It is
// refused only at the ceilings (an eighth past the conversation's limit,
// a quarter past the budget), so that a participant re-attaching in a loop
// without acknowledging cannot grow the backlog without bound either.
//
// The refusal is decided on the batch's working state, so records staged
// earlier in the same batch count. The service's total is the published
// states' plus this batch's: batches of other conversations committing at
// the same moment may each pass the budget by what they stage (at most
// maxBatch operations, two records each). Endings and leaves, never
// refused, add at most two records per participant past a limit.

// Defaults of the backlog limits.
const (
	// DefaultMaxBacklogRecords caps the records one conversation retains.
	DefaultMaxBacklogRecords = 1 << 16
	// DefaultBacklogRecords is the service's budget of retained records:
	// at about 20 bytes of heap each (BENCHMARKS.md; up to 48 where
	// every record is a run of its own), 256 Ki records are some 5 to
	// 12 MiB, and the hard ceiling a quarter more.
	DefaultBacklogRecords = 1 << 18
)

// backlogLimits are the limits on retained records.
type backlogLimits struct {
	// conversation is the soft limit of one conversation, budget the
	// service's.
	conversation, budget int64
}

// Scopes of a backlog_full refusal, for metrics.
const (
	backlogScopeConversation = "conversation"
	backlogScopeServer       = "server"
)

// admit decides whether an operation adding records may commit in a
// conversation that retains held records (this batch's staged ones
// included), while the service retains total. catchUp marks an attach of
// a participant with records waiting for it. It returns nil, or
// backlog_full and the scope of the limit that refused.
func (l backlogLimits) admit(held, total int64, catchUp bool) (*Error, string) {
	ceiling := l.budget + l.budget/4
	switch {
	case held >= l.conversation+l.conversation/8,
		held >= l.conversation && !catchUp:
		e := refuse(CodeBacklogFull, "the conversation retains %d records that a recipient has yet to acknowledge; nothing was done, retry later with the same token", held)
		e.Limit = uint64(l.conversation)
		return e, backlogScopeConversation
	case total >= ceiling,
		total >= l.budget && !catchUp && 2*held >= ceiling-total:
		e := refuse(CodeBacklogFull, "the server retains %d records awaiting acknowledgement, %d of them in this conversation; nothing was done, retry later with the same token", total, held)
		e.Limit = uint64(l.budget)
		return e, backlogScopeServer
	}
	return nil, ""
}

// backlogRefusals counts backlog_full refusals by scope.
type backlogRefusals struct {
	conversation atomic.Int64
	server       atomic.Int64
	client       atomic.Int64
}

func (r *backlogRefusals) add(scope string) {
	switch scope {
	case backlogScopeConversation:
		r.conversation.Add(1)
	case backlogScopeClient:
		r.client.Add(1)
	default:
		r.server.Add(1)
	}
}

// admitRecords runs the backlog check for an operation of b that adds
// records, from a connection acting for sh (nil: nobody); see admit and
// admitShare. catchUp, nil for operations that never catch up, says
// whether it is the attach of a participant with records waiting; it is
// asked only when a threshold refuses (a catch-up only relaxes them),
// since it may scan the retained records. It is the last check before the
// commit (docs/PROTOCOL.md, Order of checks); when it admits, the
// conversation is charged to sh if it was charged to nobody.
func (b *batch) admitRecords(sh *share, catchUp func() bool) *Error {
	bl := b.s.backlog
	held := int64(b.st.Records.Len())
	records, published := b.published()
	total := records + held - published
	asked, caught := false, false
	catching := func() bool {
		if catchUp != nil && !asked {
			asked, caught = true, catchUp()
		}
		return caught
	}
	e, scope := bl.limits.admit(held, total, false)
	if e != nil && catching() {
		e, scope = bl.limits.admit(held, total, true)
	}
	if e == nil {
		scope = backlogScopeClient
		if e = b.admitShare(sh, held, published, total, false); e != nil && e.Code == CodeBacklogFull && catching() {
			e = b.admitShare(sh, held, published, total, true)
		}
	}
	if e != nil {
		if e.Code == CodeBacklogFull {
			bl.refusals.add(scope)
		}
		return e
	}
	b.charge(sh)
	return nil
}

// waiting reports whether st retains a record addressed to p after its
// cursor: what an attach of p would deliver.
func waiting(st *outbox.State, p ParticipantID) bool {
	m := st.Member(p)
	if m == nil {
		return false
	}
	_, ok := st.Next(p, m.Cursor)
	return ok
}
