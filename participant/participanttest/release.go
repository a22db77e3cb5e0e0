package participanttest

import (
	"context"
	"fmt"
	"time"

	"github.com/participantd/participantd/faultstore"
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
	p, err := openPair(ctx, s, participant.Options{NodeKey: NodeKey, CheckpointRows: 1,
		Retain: time.Second, MaxUnackedAge: time.Minute, Now: clk.Now}, func(n uint64) participant.Token { return TokenOf(byte(n)) })
	if err != nil {
		return err
	}
	defer p.svc.Close()
	for i := range 6 {
		req := participant.Tell{Conversation: 1, Participant: p.snd.Participant, Generation: 1,
			Token: TokenOf(byte(0x10 + i)), Payload: []byte{byte(i)}}
		told, err := p.cs.Tell(ctx, req)
		if err != nil {
			return err
		}
		*log = append(*log, toldAnswered(fmt.Sprintf("tell %d", i), req, told, false))
		clk.Advance(40 * time.Second)
		if err := passes(ctx, p.svc); err != nil {
			return err
		}
	}
	// Past the retention of the last release's mark.
	clk.Advance(2 * time.Second)
	if err := passes(ctx, p.svc); err != nil {
		return err
	}
	clk.Advance(2 * time.Second)
	return passes(ctx, p.svc)
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
	if first := firstOplogRow(t, st); first < releasedRows {
		t.Fatalf("after the completed release workload, conversation 1's first oplog row is %d, want at least %d: unacknowledged tells kept", first, releasedRows)
	}
}
