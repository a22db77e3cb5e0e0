package oplog

import (
	"encoding/hex"
	"fmt"
	"strconv"
)

// ConversationID names a conversation. Clients choose it.
type ConversationID uint64

func (c ConversationID) String() string { return strconv.FormatUint(uint64(c), 10) }

// ParticipantID names a participant within its conversation. The server mints
// them from 0 and never reuses one.
type ParticipantID uint64

func (p ParticipantID) String() string { return "p" + strconv.FormatUint(uint64(p), 10) }

// Generation is a credential's capability generation: 1 at enrollment, one
// more at every attach.
type Generation uint64

func (g Generation) String() string { return "g" + strconv.FormatUint(uint64(g), 10) }

// Seq is a record's delivery seq within its conversation, from 1, gap-free.
// Zero means "no record" (a cursor of 0 acknowledged nothing).
type Seq uint64

func (s Seq) String() string { return "#" + strconv.FormatUint(uint64(s), 10) }

// Token is the 16-byte value a client chooses once per intended operation.
type Token [16]byte

// IsZero reports whether t is all zeros, which the protocol forbids.
func (t Token) IsZero() bool { return t == Token{} }

func (t Token) String() string { return hex.EncodeToString(t[:]) }

// ConnID is a connection incarnation: the server incarnation that accepted
// the connection and the connection's ordinal within it. A binding's epoch is
// (ConnID, Generation).
type ConnID struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`
	Server   uint64
	Ordinal  uint64
}

func (c ConnID) String() string { return fmt.Sprintf("c%d.%d", c.Server, c.Ordinal) }

// IsZero reports whether c names no connection.
func (c ConnID) IsZero() bool { return c.Server == 0 && c.Ordinal == 0 }

// Cause says why a binding ended. The first three end it as `detached`, the
// next three as `died`. CauseEvicted is not an End's: it marks a Leave that
// the operator committed (participantctl evict), which carries no token.
type Cause uint8

// Causes, with their protocol names.
const (
	CauseNone Cause = iota
	CauseClean
	CauseSuperseded
	CauseShutdown
	CauseConnectionLost
	CauseProtocolError
	CauseUncleanRestart
	CauseEvicted
)

var causeNames = [...]string{"", "clean", "superseded", "shutdown", "connection_lost", "protocol_error", "unclean_restart", "evicted"}

// String returns the protocol name of the cause.
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return "cause(" + strconv.Itoa(int(c)) + ")"
}

// Died reports whether a binding ended with this cause is reported as `died`
// rather than `detached`.
func (c Cause) Died() bool {
	return c == CauseConnectionLost || c == CauseProtocolError || c == CauseUncleanRestart
}

// Valid reports whether c is a known, non-empty cause of an End.
func (c Cause) Valid() bool { return c > CauseNone && c <= CauseUncleanRestart }
