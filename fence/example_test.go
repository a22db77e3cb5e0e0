package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/fence"
)

// Example shows how participantd fences the endings of one binding: the
// attach arms the lease gate until its row is durable, a detach and a lost
// connection race to end the binding, and only the first ending is recorded.
func Example() {
	type participantSite struct{ conversation, participant uint64 }
	f := fence.New[participantSite](fence.Options{})
	ctx := context.Background()
	s := participantSite{conversation: 42, participant: 0}

	// attach: one generation per binding, keyed by the binding's epoch
	// (server incarnation, connection ordinal, capability generation).
	binding := f.Issue(s, fence.IdempotencyKey("binding", s.conversation, s.participant, 1, 7, 2), 1)
	f.ArmLease(binding)    // the attach row is being appended
	f.SettleLease(binding) // both barriers returned: the attach is durable

	// detach arrives first and ends the binding.
	ended, err := f.Accept(ctx, s, binding)
	fmt.Println("detach:", err)

	// Its barrier fails, so the binding is given back...
	fmt.Println("restored:", f.RestoreIfAbsent(s, ended))

	// ...and the connection loss that follows is the one ending recorded.
	_, err = f.Accept(ctx, s, binding)
	fmt.Println("connection lost:", err)

	// Any further ending of the same binding is refused.
	_, err = f.Accept(ctx, s, binding)
	fmt.Println("late detach refused:", errors.Is(err, fence.ErrNoCurrentGeneration))
	// Output:
	// detach: <nil>
	// restored: true
	// connection lost: <nil>
	// late detach refused: true
}
