// Package peek lets participant/participanttest look inside a
// participant.Service, which its randomized model test compares with a
// reference model: the state a conversation published, its turn, and the
// secret derivation. Package participant sets the hooks in its init; only
// participant and the packages under it may import this one, so none of it
// is participant's API.
//
// A hook takes the service as any (a *participant.Service), since this
// package is below participant and cannot name its types.
package peek

import (
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

var (
	// State calls f with the state conversation conv of svc published (nil
	// while it is not loaded, as after a failed commit dropped it), under
	// the conversation's read lock; f must not keep st. It reports false,
	// without calling f, when svc holds no such conversation.
	State func(svc any, conv oplog.ConversationID, f func(st *outbox.State)) bool
	// HoldTurn takes the turn of conversation conv of svc (creating the
	// conversation when svc holds none), so that operations on it queue
	// until release. queued reports how many operations wait.
	HoldTurn func(svc any, conv oplog.ConversationID) (queued func() int, release func())
	// TryTurn takes the turn of conversation conv of svc if it is free,
	// without waiting; ok reports whether it did (then release gives it
	// back). False when svc holds no such conversation.
	TryTurn func(svc any, conv oplog.ConversationID) (release func(), ok bool)
	// DeriveSecret is the derivation of a binding's secret from the node
	// key and the conversation's nonce.
	DeriveSecret func(key []byte, nonce [16]byte, c oplog.ConversationID, p oplog.ParticipantID, g oplog.Generation) [32]byte
)
