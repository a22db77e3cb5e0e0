package participant

import (
	"sync"

	"github.com/participantd/participantd/outbox"
)

// slots counts the conversations of the service against MaxConversations:
// those it holds an entry of that are stored (conversation.counted), plus
// those a decided first enroll is committing. A deleted conversation gives
// its slot back.
type slots struct {
	max int // +checklocksignore: read-only, not guarded by mu

	// mu guards n.
	mu sync.Mutex
	// +checklocks:mu
	n int
}

// reserve takes a slot, or refuses with capacity_exceeded when all are
// taken.
func (q *slots) reserve() *Error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.fullLocked(); e != nil {
		return e
	}
	q.n++
	return nil
}

// full refuses with capacity_exceeded, as reserve would, when every slot
// is taken; it takes none.
func (q *slots) full() *Error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fullLocked()
}

// fullLocked is full's refusal; q.mu is held.
//
// +checklocks:q.mu
func (q *slots) fullLocked() *Error {
	if q.n < q.max {
		return nil
	}
	e := refuse(CodeCapacityExceeded, "the server holds %d conversations", q.n)
	e.Limit = uint64(q.max)
	return e
}

// count returns the slots taken.
func (q *slots) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// add takes a slot without refusing: for a conversation found stored
// (another node created it), which is served whatever the count.
func (q *slots) add() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
}

// release gives back a slot: of a conversation whose genesis did not
// commit, or that was deleted.
func (q *slots) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n--
}

// countLoaded gives cv, just loaded with state st, a slot when it is
// stored and held none: another node created it (cluster mode). The
// caller holds cv's turn.
func (s *Service) countLoaded(cv *conversation, st *outbox.State) {
	if !cv.counted && st.Applied > 0 {
		cv.counted = true
		s.conversationSlots.add()
	}
}
