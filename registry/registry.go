package registry

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/participantd/participantd/oplog"
)

// Stream is the name of the registry stream.
const Stream = "conversations"

// Version is the version byte of an entry.
const Version byte = 1

// entryLen is the length of an entry of Version.
const entryLen = 1 + 8

// Errors of Decode.
var (
	// ErrUnknownVersion: the entry's version byte is not one this build
	// reads.
	ErrUnknownVersion = errors.New("registry: unknown entry version")
	// ErrCorrupt: the entry is not what its version says it is.
	ErrCorrupt = errors.New("registry: entry corrupt")
)

// Entry is one registry entry: Conversation is registered.
type Entry struct {
	Conversation oplog.ConversationID
}

// Encode returns the stored form of e, in a new slice the caller owns.
func Encode(e Entry) []byte {
	b := make([]byte, 0, entryLen)
	b = append(b, Version)
	return binary.BigEndian.AppendUint64(b, uint64(e.Conversation))
}

// Decode parses a stored entry. It returns an error wrapping
// ErrUnknownVersion for a version it does not know and ErrCorrupt for an
// entry of the wrong length; it keeps no reference to b.
func Decode(b []byte) (Entry, error) {
	switch {
	case len(b) == 0:
		return Entry{}, fmt.Errorf("%w: empty", ErrCorrupt)
	case b[0] != Version:
		return Entry{}, fmt.Errorf("%w: %d", ErrUnknownVersion, b[0])
	case len(b) != entryLen:
		return Entry{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(b), entryLen)
	}
	return Entry{Conversation: oplog.ConversationID(binary.BigEndian.Uint64(b[1:]))}, nil
}
