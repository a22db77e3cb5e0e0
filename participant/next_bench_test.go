package participant

import (
	"context"
	"testing"
)

// BenchmarkConn_Next is the pump's read of a binding's next delivery, paid
// once per pushed record: the records are in memory, so it measures the
// locks and the lookup, not the store.
func BenchmarkConn_Next(b *testing.B) {
	svc, _ := openBenchService(b)
	ctx := context.Background()
	sender, recipient := svc.Connect(nil), svc.Connect(nil)
	s, err := sender.Enroll(ctx, Enroll{Conversation: 1, Token: benchToken(0, 0)})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := recipient.Enroll(ctx, Enroll{Conversation: 1, Token: benchToken(1, 0)}); err != nil {
		b.Fatal(err)
	}
	calls := make([]*Call[Told], 256)
	for i := range calls {
		calls[i] = sender.StartTell(ctx, Tell{Conversation: 1, Participant: s.Participant, Generation: s.Generation,
			Token: benchToken(0, uint64(i+1)), Payload: []byte("x")})
	}
	for _, c := range calls {
		if _, err := c.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if _, ok := recipient.Next(1); !ok {
			recipient.SetOfferedForTest(1, Offered{}) // the backlog again
		}
	}
}
