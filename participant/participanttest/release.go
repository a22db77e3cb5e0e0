package participanttest

import (
	"context"
	"fmt"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// ReleaseWorkload runs a sender and a deaf recipient (it never
// acknowledges) under a MaxUnackedAge of a minute, with checkpoint and
// compaction passes between tells while a settable clock advances: the
// passes release the records older than the bound, unacknowledged, and
// later trim their rows. Every answered tell goes to log as a replay
// that must still answer its original seq.
func ReleaseWorkload(s store.DurableStore, log *[]Answered) error {
	ctx := context.Background()
	*log = (*log)[:0]
	clk := NewClock(WindowEpoch)
	svc, err := participant.Open(ctx, s, participant.Options{NodeKey: NodeKey, CheckpointRows: 1,
		Retain: time.Second, MaxUnackedAge: time.Minute, Now: clk.Now})
	if err != nil {
		return err
	}
	defer svc.Close()
	cs, cr := svc.Connect(nil), svc.Connect(nil)
	snd, err := cs.Enroll(ctx, participant.Enroll{Conversation: 1, Token: TokenOf(1)})
	if err != nil {
		return err
	}
	if _, err := cr.Enroll(ctx, participant.Enroll{Conversation: 1, Token: TokenOf(2)}); err != nil {
		return err
	}
	if _, err := cs.Ack(ctx, participant.Ack{Conversation: 1, Participant: snd.Participant, Generation: 1, Through: 2}); err != nil {
		return err
	}
	passes := func() error {
		if _, err := svc.CheckpointPass(ctx); err != nil {
			return err
		}
		_, err := svc.CompactPass(ctx)
		return err
	}
	for i := range 6 {
		req := participant.Tell{Conversation: 1, Participant: snd.Participant, Generation: 1,
			Token: TokenOf(byte(0x10 + i)), Payload: []byte{byte(i)}}
		told, err := cs.Tell(ctx, req)
		if err != nil {
			return err
		}
		*log = append(*log, Answered{fmt.Sprintf("tell %d", i), func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
			r, err := c.Tell(ctx, req)
			if err != nil || r.Seq != told.Seq || r.Replay != participant.ReplayCommitted {
				return fmt.Errorf("retry = %+v, %v; want seq %v replayed", r, err, told.Seq)
			}
			return nil
		}})
		clk.Advance(40 * time.Second)
		if err := passes(); err != nil {
			return err
		}
	}
	// Past the retention of the last release's mark.
	clk.Advance(2 * time.Second)
	if err := passes(); err != nil {
		return err
	}
	clk.Advance(2 * time.Second)
	return passes()
}

// releasedRows is how far the completed ReleaseWorkload trims
// conversation 1's oplog: its rows 0-3 (genesis, two enrolls, an ack)
// and the tells at rows 4 on that committed more than MaxUnackedAge
// before its last passes, at least the first three.
const releasedRows = 7

// CheckReleased fails unless the completed ReleaseWorkload's passes
// trimmed conversation 1's oplog past tells its deaf recipient never
// acknowledged.
func CheckReleased(t faultstore.TB, st store.DurableStore) {
	t.Helper()
	cs, ok := store.AsCompactor(st)
	if !ok {
		t.Fatalf("the store %T does not compact", st)
	}
	if first, err := cs.First(oplog.Stream(1)); err != nil || first < releasedRows {
		t.Fatalf("after the completed release workload, conversation 1's first oplog row is %d (%v), want at least %d: unacknowledged tells kept", first, err, releasedRows)
	}
}
