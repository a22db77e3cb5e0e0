package participant

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// The token index lives in the store, so deduplication is permanent and its
// memory is the store's, not the heap's:
//
//	value token/<conversation>/e/<hex token>            enroll tokens
//	value token/<conversation>/<participant>/<hex token> every other token
//	  = 1 + index of the oplog row that committed the token
//
// An index entry is written (CAS) before its oplog row is appended, in the
// same barrier, so every durable row has a durable entry. The reverse does
// not hold: a commit that failed after the CAS leaves an entry pointing at a
// row that does not exist or holds something else. Lookups therefore verify
// the row, and treat a mismatch as "never committed".

const enrollScope = "e"

func tokenKey(c ConversationID, scope string, t Token) string {
	return "token/" + c.String() + "/" + scope + "/" + t.String()
}

func participantScope(p ParticipantID) string {
	return strconv.FormatUint(uint64(p), 10)
}

// tokenWrite is the index entry a commit writes: CAS key from old to the
// committing row's index + 1.
type tokenWrite struct {
	key string
	old uint64
}

// prior is a committed row found through the token index.
type prior struct {
	idx uint64
	row oplog.Row
	// payloadHash is set when row comes from a receipt (receipt.go): the
	// row's payload is gone, its truncated hash stands in for it.
	payloadHash []byte
}

// lookupToken finds the row that committed token t in scope, verifying it.
// It returns the committed row (nil if none) and the index write a new
// commit of t must make.
func (s *Service) lookupToken(c ConversationID, applied uint64, scope string, match func(*oplog.Row) bool, t Token) (*prior, tokenWrite, error) {
	w := tokenWrite{key: tokenKey(c, scope, t)}
	v, err := s.st.ReadValue(w.key)
	if err != nil {
		return nil, w, err
	}
	w.old = v
	if v == 0 || v-1 >= applied {
		return nil, w, nil
	}
	entries, err := s.st.ReadFrom(oplog.Stream(c), v-1, 1)
	if errors.Is(err, store.ErrCompacted) {
		// The row is compacted: its receipt, if it had a token, stands in.
		r, err := readReceipt(s.st, c, v-1)
		if err != nil || r == nil {
			return nil, w, err
		}
		row := r.row()
		if row.Token != t || !row.Kind.HasToken() || !match(&row) {
			return nil, w, nil
		}
		return &prior{idx: v - 1, row: row, payloadHash: r.PayloadHash}, w, nil
	}
	if err != nil {
		return nil, w, err
	}
	if len(entries) != 1 {
		return nil, w, nil
	}
	row, err := oplog.Decode(entries[0].Payload)
	if err != nil {
		return nil, w, fmt.Errorf("participant: token index names oplog row %d: %w", v-1, err)
	}
	if row.Token != t || !row.Kind.HasToken() || !match(&row) {
		return nil, w, nil
	}
	return &prior{idx: v - 1, row: row}, w, nil
}
