package participant

import (
	"context"
	"errors"
	"testing"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// TestEvict_ReclaimsAndSurvivesARestart: evicting a deaf member commits a
// token-less leave with cause evicted that reclaims what only it held; the
// store then reconciles at the next Open to the same state, and Inspect
// (verify) finds nothing wrong with a leave that has no token. A token
// that happens to be zero finds no evicted leave to replay. Drop retires
// the rest.
func TestEvict_ReclaimsAndSurvivesARestart(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	svc, err := Open(ctx, st, Options{NodeKey: testKey})
	must(t, err)
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	rx := mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	for n := range uint64(5) {
		if _, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: seqToken(n, 1)}); err != nil {
			t.Fatalf("tell: %v", err)
		}
	}
	if got := svc.Backlog().Records; got < 5 {
		t.Fatalf("retained %d records before the eviction, want at least 5", got)
	}
	ended, err := svc.Evict(ctx, 1, rx.Participant)
	if err != nil {
		t.Fatalf("Evict = %v", err)
	}
	// The sender's left record stays until it acknowledges it.
	if got := svc.Backlog().Records; got != 1 {
		t.Errorf("retained %d records after evicting the deaf member, want 1 (its left record)", got)
	}
	var pe *Error
	if _, err := svc.Evict(ctx, 1, rx.Participant); !errors.As(err, &pe) || pe.Code != CodeRetired {
		t.Errorf("Evict again = %v, want retired", err)
	}
	if _, err := svc.Evict(ctx, 2, 0); !errors.As(err, &pe) || pe.Code != CodeUnknownParticipant {
		t.Errorf("Evict in a conversation that does not exist = %v, want unknown_participant", err)
	}
	if _, err := deaf.Leave(ctx, Leave{Conversation: 1, Participant: rx.Participant, Generation: rx.Generation, Secret: rx.Secret, Token: Token{}}); !errors.As(err, &pe) || pe.Code != CodeRetired {
		t.Errorf("the evicted participant's leave with a zero token = %v, want retired, not a replay of the eviction", err)
	}
	svc.Close()

	svc, err = Open(ctx, st, Options{NodeKey: testKey})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	reports, err := Inspect(st)
	if err != nil || len(reports) != 1 || reports[0].Refused != nil {
		t.Fatalf("Inspect = %+v, %v; want one conversation, not refused", reports, err)
	}
	if ps := reports[0].Participants; len(ps) != 2 || !ps[rx.Participant].Retired || ps[tx.Participant].Retired {
		t.Errorf("after a restart the participants are %+v, want %v retired only", ps, rx.Participant)
	}
	cv := svc.existing(1)
	st1 := cv.loaded()
	rec, ok := st1.Record(ended.Seq)
	if !ok || rec.Kind != outbox.KindLeft || rec.Cause != oplog.CauseEvicted {
		t.Errorf("record %v after a restart = %+v, want left with cause evicted", ended.Seq, rec)
	}

	dropped, err := svc.Drop(ctx, 1)
	if err != nil || len(dropped) != 1 || dropped[0].Participant != tx.Participant {
		t.Fatalf("Drop = %+v, %v; want the sender evicted", dropped, err)
	}
	if got := svc.Backlog().Records; got != 0 {
		t.Errorf("retained %d records after the drop, want 0", got)
	}
}
