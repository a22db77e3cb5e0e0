package participant

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// The token index (package tokenindex) lives in the store, so
// deduplication is permanent and its memory is the store's, not the
// heap's. An entry is written (CAS) before its oplog row is appended, in
// the same barrier, so every durable row has a durable entry; a commit that
// failed after the CAS leaves an entry naming a row that does not exist or
// holds something else, so lookups verify the row, and treat a mismatch as
// "never committed".

// tokenWrite is the index entry a commit writes: CAS key from old to the
// committing row's tokenindex.Value.
type tokenWrite struct {
	key string
	old uint64
}

// prior is a committed row found through the token index.
type prior struct {
	idx uint64
	row oplog.Row
	// payloadHash is set when row comes from a receipt (readReceipt): the
	// row's payload is gone, its truncated hash stands in for it.
	payloadHash []byte
}

// lookupToken finds the row that committed token t under key, its index
// key (tokenindex.Key of c, its scope and t), verifying it. It returns the
// committed row (nil if none) and the index write a new commit of t must
// make.
func (s *Service) lookupToken(c ConversationID, applied uint64, key string, match func(*oplog.Row) bool, t Token) (*prior, tokenWrite, error) {
	w := tokenWrite{key: key}
	v, err := s.st.ReadValue(w.key)
	if err != nil {
		return nil, w, err
	}
	w.old = v
	return indexedRow(s.st, c, applied, match, t, w)
}

// indexedRow verifies, in st, the row the index value w.old names for
// token t: it returns the row if it is durable (below applied) and
// committed t, else nil, and w unchanged. The live path and Verify run it
// alike.
func indexedRow(st store.DurableStore, c ConversationID, applied uint64, match func(*oplog.Row) bool, t Token, w tokenWrite) (*prior, tokenWrite, error) {
	idx, ok := tokenindex.Index(w.old)
	if !ok || idx >= applied {
		return nil, w, nil
	}
	entries, err := st.ReadFrom(oplog.Stream(c), idx, 1)
	if errors.Is(err, store.ErrCompacted) {
		// The row is compacted: its receipt, if it had a token, stands in.
		r, rerr := readReceipt(st, c, idx)
		if rerr != nil {
			return nil, w, rerr
		}
		if r == nil {
			// No receipt: "never committed" only if the stream really
			// starts past the row. A short read that says compacted while
			// the row is stored would decide a committed operation again.
			return nil, w, provenCompacted(st, c, idx, err)
		}
		row := r.Row()
		if row.Token != t || !row.HasToken() || !match(&row) {
			return nil, w, nil
		}
		return &prior{idx: idx, row: row, payloadHash: r.PayloadHash}, w, nil
	}
	if err != nil {
		return nil, w, err
	}
	if len(entries) != 1 {
		return nil, w, nil
	}
	row, err := oplog.Decode(entries[0].Payload)
	if err != nil {
		return nil, w, fmt.Errorf("participant: token index names oplog row %d: %w", idx, err)
	}
	if row.Token != t || !row.HasToken() || !match(&row) {
		return nil, w, nil
	}
	return &prior{idx: idx, row: row}, w, nil
}

// provenCompacted returns nil when oplog row idx of c is below the
// stream's first stored entry, as asked of the store afresh (Compactor's
// First), and otherwise an error wrapping readErr, the read that said the
// row was compacted: the caller answers unavailable, never "not
// committed".
func provenCompacted(st store.DurableStore, c ConversationID, idx uint64, readErr error) error {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return fmt.Errorf("participant: oplog row %d of conversation %v read as compacted from a store that does not compact: %w", idx, c, readErr)
	}
	first, err := cs.First(oplog.Stream(c))
	if err != nil {
		return err
	}
	if first <= idx {
		return fmt.Errorf("participant: oplog row %d of conversation %v read as compacted, but the stream starts at %d: %w", idx, c, first, readErr)
	}
	return nil
}

// tokenRef names the token index entry an operation looks up first: enroll
// scope, or participant p's.
type tokenRef struct {
	has    bool
	enroll bool
	p      ParticipantID
	t      Token
}

func (r tokenRef) key(c ConversationID) string {
	if r.enroll {
		return tokenindex.Key(c, tokenindex.Enroll, r.t)
	}
	return tokenindex.Key(c, tokenindex.Participant(r.p), r.t)
}

// prefetchParallelism bounds the token index reads one batch has in
// flight at once (Options.PrefetchTokens).
const prefetchParallelism = 64

// prefetchTokens reads the index values of the tokens tasks will look up,
// concurrently, into b.prefetched, where lookup takes them instead of
// reading each in turn. It reads nothing for fewer than two keys, and skips
// a participant the published state does not hold (lookupParticipant reads
// nothing for it, or, if the batch enrolls it first, reads in turn). A read
// that fails is left out, so that the lookup that needs it reads it again
// and answers unavailable if that fails too, as without prefetching.
//
// The values are those the lookups would have read one by one. Every read
// runs on the goroutine holding the conversation's turn (which waits for
// them), after the state is loaded and before any decision, so before any
// write of this batch: its token CASes come in write, after every
// decision. Nothing else writes this conversation's index entries while
// its turn is held here: the entries are written only by commits of the
// turn's holder, and a node that took the conversation over has fenced
// this one, whose writes then fail whatever it read. Within the batch a
// token staged by an earlier operation still wins (b.tokens is checked
// first), and the row an index value names is verified as before
// (indexedRow).
func (b *batch) prefetchTokens(tasks []*task) {
	var keys []string
	seen := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		if !t.tok.has || !t.tok.enroll && b.live.Member(t.tok.p) == nil {
			continue
		}
		k := t.tok.key(b.cv.id)
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < 2 {
		return
	}
	type read struct {
		v   uint64
		err error
	}
	reads := make([]read, len(keys))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(keys), prefetchParallelism) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				reads[i].v, reads[i].err = b.s.st.ReadValue(keys[i])
			}
		})
	}
	wg.Wait()
	b.prefetched = make(map[string]uint64, len(keys))
	for i, k := range keys {
		if reads[i].err == nil {
			b.prefetched[k] = reads[i].v
		}
	}
}

// The token window (Options.TokenWindow; docs/DESIGN.md, The token
// window) bounds deduplication in time. Every token is then a UUIDv7, so
// it carries the time it was drawn at, and the service can tell a token
// too old to be deduplicated from a new one without remembering it: the
// conversation's token floor (tokenindex.FloorKey, unix ms) says that
// every token whose time is below it may have been forgotten. A token that is not found committed is refused token_expired when its
// time is below the floor or below now minus the window, whichever is
// later, and token_invalid when it is not a UUIDv7 or is more than
// Options.TokenSkew ahead of the clock. Compaction persists a floor before
// it deletes the index entry of a token below it, so a retry of a
// forgotten token is refused, never committed twice, even after the
// clock went back or on a node whose clock is behind: the persisted
// floor, not the clock, is what the forgetting relied on. The floor is
// just past the newest token forgotten, never the clock's now minus the
// window, so that a clock that ran ahead never leaves a floor in the
// future that refuses every fresh token once it is corrected.

// tokenTime returns the unix ms a UUIDv7 token was drawn at, and whether
// t is a UUIDv7 at all (RFC 9562: version 7, variant 10).
func tokenTime(t Token) (int64, bool) {
	if t[6]>>4 != 7 || t[8]>>6 != 0b10 {
		return 0, false
	}
	var ms int64
	for _, b := range t[:6] {
		ms = ms<<8 | int64(b)
	}
	return ms, true
}

// floorTurn returns cv's persisted token floor, read once per reset of
// cv (in cluster mode another node may have moved it meanwhile). The
// caller holds cv's turn.
func (s *Service) floorTurn(cv *conversation) (int64, error) {
	at := cv.resets.Load() + 1
	if cv.tokenFloorAt == at {
		return cv.tokenFloor, nil
	}
	v, err := s.st.ReadValue(tokenindex.FloorKey(cv.id))
	if err != nil {
		return 0, err
	}
	cv.tokenFloor, cv.tokenFloorAt = int64(v), at
	return cv.tokenFloor, nil
}

// admitToken refuses token t of a new operation in cv under the token
// window: token_invalid, token_expired, or nil when t may commit. Without
// a window every token is admitted, except a UUIDv7 below a floor that a
// window persisted earlier (its entry may be gone). The caller holds
// cv's turn and found t not committed.
func (s *Service) admitToken(cv *conversation, t Token) error {
	floor, err := s.floorTurn(cv)
	if err != nil {
		return unavailable("reading the token window", err)
	}
	return s.windowAdmits(floor, t)
}

// windowAdmits is admitToken's check of t against a conversation whose
// persisted floor is floor (0: none). It returns nil or an *Error.
func (s *Service) windowAdmits(floor int64, t Token) error {
	w := s.opts.TokenWindow
	if w <= 0 && floor == 0 {
		return nil
	}
	ms, v7 := tokenTime(t)
	now := s.now().UnixMilli()
	if w > 0 {
		if !v7 {
			return &Error{Code: CodeTokenInvalid, Detail: "under the token window a token must be a UUIDv7"}
		}
		floor = max(floor, now-w.Milliseconds())
	}
	// Below the floor first: a clock that went back must not turn a
	// forgotten token into one "ahead" of it.
	if v7 && ms < floor {
		return &Error{Code: CodeTokenExpired, Oldest: floor,
			Detail: "the token is older than the token window: whether it committed can no longer be told"}
	}
	if newest := now + s.opts.TokenSkew.Milliseconds(); w > 0 && ms > newest {
		return &Error{Code: CodeTokenInvalid, Newest: newest,
			Detail: fmt.Sprintf("the token's time is %v ahead of the server's clock", time.Duration(ms-now)*time.Millisecond)}
	}
	return nil
}
