package participant

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// backlog accounts for the records of every published state: the sums of
// their lengths and payload bytes, in memory and evicted; and it knows
// which conversations hold payloads in memory, to choose what to evict.
//
// Eviction keeps the payloads in memory within budget: when a conversation
// gives up its turn with the service past it, the conversations holding
// the most payload bytes (whose turn is free) drop their oldest ones, down
// to seven eighths of the budget so that eviction does not run at every
// commit. A conversation whose turn is never free (a busy one) is evicted
// by its own commits once the service is a quarter past the budget: that
// is the hard bound.
//
// Each conversation also has a window: at every commit, a conversation
// holding more than window payload bytes drops its oldest ones from memory
// down to it. The payloads a recipient that never reads is sent past the
// window are thus never kept: they live in the oplog and are read back
// when delivered, so that such a recipient costs its window whatever the
// volume sent to it, and one deaf conversation cannot take the budget the
// others use. Recipients that keep up acknowledge long before their
// conversation holds a window, and are pushed from memory.
type backlog struct {
	budget  int64
	window  int64
	records atomic.Int64
	bytes   atomic.Int64
	evicted atomic.Int64
	// evictions counts the payload bytes ever evicted.
	evictions atomic.Int64
	// holding counts the published states retaining at least one record.
	holding atomic.Int64
	// limits bound the records, refusals counts what they refused (see
	// backpressure.go).
	limits   backlogLimits
	refusals backlogRefusals

	// mu guards holders. It is a leaf: nothing is taken while holding it.
	mu sync.Mutex
	// holders maps each conversation whose published state holds payload
	// bytes in memory to that number.
	// +checklocks:mu
	holders map[*conversation]int64
}

func newBacklog(budget, window int64, limits backlogLimits) *backlog {
	return &backlog{budget: budget, window: window, limits: limits, holders: make(map[*conversation]int64)}
}

// evictCandidates is how many of the largest holders one trim tries.
const evictCandidates = 8

// setStateLocked publishes st (nil: not loaded) as cv's state and moves the
// service's backlog account from the old state to st; when st holds more
// than the conversation's window, or the service is past its hard bound,
// it drops st's oldest payloads from memory. The
// caller holds cv's turn and cv.mu for writing, and st is no longer
// advanced by anyone else: Evict writes records in place.
//
// +checklocks:cv.mu
func (cv *conversation) setStateLocked(st *outbox.State) { cv.swapStateLocked(st, true) }

// swapStateLocked is setStateLocked, but with evict false it drops no
// payload from st: a later batch shares st's records (pipelined), and
// its own install evicts. The caller holds cv.mu for writing, and either
// cv's turn or a batch in flight that handed it on (pipeline.go).
//
// +checklocks:cv.mu
func (cv *conversation) swapStateLocked(st *outbox.State, evict bool) {
	bl := cv.backlog
	sh := cv.share.Load()
	if old := cv.state; old != nil {
		bl.records.Add(-int64(old.Records.Len()))
		if sh != nil {
			sh.records.Add(-int64(old.Records.Len()))
		}
		if old.Records.Len() > 0 {
			bl.holding.Add(-1)
		}
		bl.bytes.Add(-old.PayloadBytes)
		bl.evicted.Add(-old.EvictedBytes)
	}
	cv.state = st
	if st != nil {
		bl.records.Add(int64(st.Records.Len()))
		if sh != nil {
			sh.records.Add(int64(st.Records.Len()))
		}
		if st.Records.Len() > 0 {
			bl.holding.Add(1)
		}
		bl.bytes.Add(st.PayloadBytes)
		bl.evicted.Add(st.EvictedBytes)
		if evict {
			if need := bl.excess(st.PayloadBytes, bl.bytes.Load()); need > 0 {
				cv.evictLocked(need)
				return
			}
		}
	}
	bl.hold(cv, st)
}

// excess returns how many of its oldest payload bytes a conversation's
// state holding payload bytes is to drop from memory at a commit, the
// service holding total (that state's included, or the published state
// it shares its records with): those past the conversation's window
// and, when the service is still past its hard bound without them, as
// many more as bring it down to the budget. An install and a state about
// to be cloned (evictSharedLocked) both evict by it.
func (bl *backlog) excess(payload, total int64) int64 {
	need := max(payload-bl.window, 0)
	if over := total - need - (bl.budget + bl.budget/4); over > 0 {
		need += over + bl.budget/4
	}
	return need
}

// evictLocked drops up to need bytes of cv's oldest payloads from memory
// and returns how many it dropped. The caller holds cv's turn and cv.mu for
// writing.
//
// +checklocks:cv.mu
func (cv *conversation) evictLocked(need int64) int64 {
	st := cv.state
	if st == nil {
		return 0
	}
	freed := st.Evict(need)
	cv.backlog.bytes.Add(-freed)
	cv.backlog.evicted.Add(freed)
	cv.backlog.evictions.Add(freed)
	cv.backlog.hold(cv, st)
	return freed
}

// evictSharedLocked drops st's oldest payloads past the conversation's
// window, and past the service's hard bound, by the rule an install
// evicts by (excess), from st, the working state of cv's batch in flight
// (published or about to be), before the next batch clones it
// (pipeline.go). st shares its records with the published state, whose
// readers hold cv.mu: the caller holds cv's turn and cv.mu for writing.
// An unpublished st is accounted for at its install.
//
// +checklocks:cv.mu
func (cv *conversation) evictSharedLocked(st *outbox.State) {
	bl := cv.backlog
	need := bl.excess(st.PayloadBytes, bl.bytes.Load())
	if need <= 0 {
		return
	}
	if cv.state == st {
		cv.evictLocked(need) // published: its account moves too
		return
	}
	bl.evictions.Add(st.Evict(need))
}

// hold records the payload bytes cv's published state st holds.
func (bl *backlog) hold(cv *conversation, st *outbox.State) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if st == nil || st.PayloadBytes == 0 {
		delete(bl.holders, cv)
		return
	}
	bl.holders[cv] = st.PayloadBytes
}

// largest returns up to n holders, the largest first.
func (bl *backlog) largest(n int) []*conversation {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	type holder struct {
		cv    *conversation
		bytes int64
	}
	top := make([]holder, 0, n+1)
	for cv, b := range bl.holders {
		i := len(top)
		for i > 0 && top[i-1].bytes < b {
			i--
		}
		if i >= n {
			continue
		}
		top = append(top, holder{})
		copy(top[i+1:], top[i:])
		top[i] = holder{cv, b}
		top = top[:min(len(top), n)]
	}
	out := make([]*conversation, len(top))
	for i, h := range top {
		out[i] = h.cv
	}
	return out
}

// trimBacklog evicts payloads when the service is past its budget, from
// the largest holders whose turn is free. The caller holds no turn and no
// lock: it takes the victims' turns without waiting, so it can neither
// deadlock nor stall behind a busy conversation.
func (s *Service) trimBacklog() {
	bl := s.backlog
	need := bl.bytes.Load() - bl.budget
	if need <= 0 {
		return
	}
	need += bl.budget / 8
	for _, cv := range bl.largest(evictCandidates) {
		select {
		case cv.turn <- struct{}{}:
		default:
			continue // busy: its own commits evict it past the hard bound
		}
		if !cv.idle() {
			// A batch in flight shares the published records
			// (pipeline.go): busy too.
			<-cv.turn
			continue
		}
		cv.mu.Lock()
		need -= cv.evictLocked(need)
		cv.mu.Unlock()
		<-cv.turn
		if need <= 0 {
			return
		}
	}
}

// Backlog returns the records the service keeps for delivery and their
// payload bytes, in memory and read back from the oplog on demand.
func (s *Service) Backlog() Backlog {
	b := s.backlog
	return Backlog{Records: b.records.Load(), Conversations: b.holding.Load(), MemoryBytes: b.bytes.Load(), EvictedBytes: b.evicted.Load(),
		EvictedTotal: b.evictions.Load(), ConversationRefusals: b.refusals.conversation.Load(), ServerRefusals: b.refusals.server.Load(),
		ClientRefusals: b.refusals.client.Load()}
}

// readPayload reads the payload of record seq back from oplog row source
// of conversation conv. The returned slice is the caller's.
func (s *Service) readPayload(conv ConversationID, source uint64, seq Seq) ([]byte, error) {
	entries, err := s.st.ReadFrom(oplog.Stream(conv), source, 1)
	if err != nil {
		return nil, fmt.Errorf("participant: read oplog row %d: %w", source, err)
	}
	if len(entries) != 1 {
		return nil, fmt.Errorf("%w: oplog row %d of record %v is missing", ErrEvictedPayload, source, seq)
	}
	row, err := oplog.Decode(entries[0].Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: oplog row %d: %v", ErrEvictedPayload, source, err)
	}
	if row.Kind != oplog.KindTell || row.Seq != seq {
		return nil, fmt.Errorf("%w: oplog row %d is %v %v, want tell %v", ErrEvictedPayload, source, row.Kind, row.Seq, seq)
	}
	return row.Payload, nil
}

// ErrEvictedPayload reports an oplog row that does not hold the payload a
// retained record was evicted from: the stored oplog changed under a live
// conversation.
var ErrEvictedPayload = errors.New("participant: evicted payload not found in the oplog")
