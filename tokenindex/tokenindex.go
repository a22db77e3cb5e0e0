package tokenindex

import (
	"encoding/hex"
	"strconv"

	"github.com/participantd/participantd/oplog"
)

// Prefix starts every key of the token index.
const Prefix = "token/"

// Scope is the part of a conversation's index a token is kept in: enroll
// tokens in Enroll, every other in its participant's.
type Scope string

// Enroll is the scope of enroll tokens, which have no participant yet.
const Enroll Scope = "e"

// Participant is participant p's scope.
func Participant(p oplog.ParticipantID) Scope {
	return Scope(strconv.FormatUint(uint64(p), 10))
}

// Key is the key of token t in scope s of conversation c.
//
// It builds the key in one buffer, which a lookup's is (one per operation
// that carries a token): Prefix, c in decimal, "/", s, "/", and t in lower
// case hex, as c.String() and t.String() give them.
func Key(c oplog.ConversationID, s Scope, t oplog.Token) string {
	var buf [keyBuf]byte
	b := append(buf[:0], Prefix...)
	b = strconv.AppendUint(b, uint64(c), 10)
	b = append(b, '/')
	b = append(b, s...)
	b = append(b, '/')
	b = hex.AppendEncode(b, t[:])
	return string(b)
}

// keyBuf holds a key whose scope is a participant's: Prefix, two
// uint64s in decimal, two slashes, and a token in hex.
const keyBuf = len(Prefix) + 20 + 1 + 20 + 1 + 2*len(oplog.Token{})

// RowKey is the key of the entry of row, a token-bearing oplog row of
// conversation c.
func RowKey(c oplog.ConversationID, row *oplog.Row) string {
	if row.Kind == oplog.KindEnroll {
		return Key(c, Enroll, row.Token)
	}
	return Key(c, Participant(row.Participant), row.Token)
}

// FloorKey is the key of conversation c's token floor.
func FloorKey(c oplog.ConversationID) string {
	return Prefix + c.String() + "/window"
}

// ChargeKey is the key of the principal conversation c is charged to
// (package participant, share.go): beside its index, so that it is in the
// conversation's scope and goes with it.
func ChargeKey(c oplog.ConversationID) string {
	return Prefix + c.String() + "/charge"
}

// ConversationPrefix starts every key of conversation c here: its
// entries, its floor and its charge.
func ConversationPrefix(c oplog.ConversationID) string {
	return Prefix + c.String() + "/"
}

// Value is the value of an entry naming oplog row idx.
func Value(idx uint64) uint64 { return idx + 1 }

// Index returns the oplog row an entry's value v names, and false when v
// names none (0: no entry, or one compaction deleted).
func Index(v uint64) (uint64, bool) {
	if v == 0 {
		return 0, false
	}
	return v - 1, true
}
