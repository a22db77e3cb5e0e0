package participanttest

import (
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/internal/peek"
)

// TryTurn takes the turn of conversation c of svc if nobody holds it, and
// reports whether it did; release gives it back. A fault injected from a
// hook inside an operation uses it to learn whether the operation holds
// the turn (then anything that needs it must run after the operation)
// or not (then it may run now, before the operation goes on).
func TryTurn(svc *participant.Service, c participant.ConversationID) (release func(), ok bool) {
	return peek.TryTurn(svc, c)
}
