package participant

import "sync"

// slots counts the conversations of the store against MaxConversations:
// those registered, plus those a decided first enroll is committing.
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

// release gives back a slot whose conversation was not registered.
func (q *slots) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n--
}
