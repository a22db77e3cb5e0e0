package participant

import (
	"context"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant/internal/peek"
)

// The hooks of participanttest's model test (see package peek).
func init() {
	peek.State = func(svc any, conv oplog.ConversationID, f func(st *outbox.State)) bool {
		cv := svc.(*Service).existing(conv)
		if cv == nil {
			return false
		}
		cv.mu.RLock()
		defer cv.mu.RUnlock()
		f(cv.state)
		return true
	}
	peek.HoldTurn = func(svc any, conv oplog.ConversationID) (func() int, func()) {
		cv := svc.(*Service).conversation(conv)
		_ = cv.acquire(context.Background()) // fails only with its context
		queued := func() int {
			cv.qmu.Lock()
			defer cv.qmu.Unlock()
			return len(cv.queue)
		}
		return queued, func() { <-cv.turn }
	}
	peek.TryTurn = func(svc any, conv oplog.ConversationID) (func(), bool) {
		cv := svc.(*Service).existing(conv)
		if cv == nil {
			return nil, false
		}
		select {
		case cv.turn <- struct{}{}:
		default:
			return nil, false
		}
		if !cv.idle() {
			<-cv.turn
			return nil, false
		}
		return func() { <-cv.turn }, true
	}
	peek.DeriveSecret = func(key []byte, nonce [16]byte, c oplog.ConversationID, p oplog.ParticipantID, g oplog.Generation) [32]byte {
		return deriveSecret(key, nonce, c, p, g)
	}
}
