package participant

import (
	"context"
	"fmt"
	"testing"

	"github.com/participantd/participantd/store"
)

// BenchmarkCheckpointPass_DeafRecipient derives and writes one checkpoint
// of a conversation whose recipient never acknowledges, retaining the
// given number of records, CheckpointRows (64) rows after the previous
// checkpoint. B/op is what one pass allocates: flat in the records
// retained but for the replay's own state (its records without payloads;
// the outbox rows of a stream of tells are one span of positions).
func BenchmarkCheckpointPass_DeafRecipient(b *testing.B) {
	for _, retained := range []int{1 << 10, 1 << 14} {
		b.Run(fmt.Sprintf("retained=%d", retained), func(b *testing.B) {
			ctx := context.Background()
			svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, CheckpointRows: 64, MaxBacklogRecords: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { svc.Close() })
			deaf, sender := svc.Connect(nil), svc.Connect(nil)
			mustEnroll(b, deaf, 1, 1)
			tx := mustEnroll(b, sender, 1, 2)
			n := 0
			tell := func(k int) {
				for range k {
					n++
					if _, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation,
						Token: benchToken(5, uint64(n)), Payload: []byte("sixteen bytes...")}); err != nil {
						b.Fatal(err)
					}
				}
			}
			tell(retained)
			if _, err := svc.CheckpointPass(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tell(64)
				b.StartTimer()
				if w, err := svc.CheckpointPass(ctx); err != nil || w != 1 {
					b.Fatalf("CheckpointPass() = %d, %v, want 1", w, err)
				}
			}
		})
	}
}
