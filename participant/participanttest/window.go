package participanttest

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// V7Token returns a UUIDv7 token drawn at t (RFC 9562: t's unix ms, version
// 7, variant 10), its random part n.
func V7Token(t time.Time, n uint64) participant.Token {
	var tk participant.Token
	binary.BigEndian.PutUint64(tk[8:], n)
	stampV7(&tk, t.UnixMilli())
	return tk
}

// stampV7 makes tk a UUIDv7 drawn at ms, unix milliseconds: it sets the
// time, the version (7, and byte 6's low bits 0) and the variant (10),
// and keeps the other bits.
func stampV7(tk *participant.Token, ms int64) {
	for i := range 6 {
		tk[i] = byte(ms >> (8 * (5 - i)))
	}
	tk[6] = 0x70
	tk[8] = 0x80 | tk[8]&0x3f
}

// Clock is a settable clock for participant.Options.Now, safe for
// concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d (back when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// WindowEpoch is the time WindowWorkload's clock starts at.
var WindowEpoch = time.UnixMilli(1_700_000_000_000)

// WindowWorkload drives a service under a token window of one minute
// over s, on a clock it advances twenty seconds a tell, with checkpoint
// and compaction passes between tells, so that its first tokens age out
// of the window and compaction forgets them (raising the token floor
// first) while later ones are still deduplicated; then its clock steps
// ten minutes ahead for one pair of passes and back, and a last tell with
// a fresh token must commit. Every answered tell is
// in *log; its Check accepts the original answer replayed or
// token_expired (a forgotten token), never a new commit. Like
// CutWorkload it stops at the first failure and closes the service
// before it returns.
func WindowWorkload(s store.DurableStore, log *[]Answered) error {
	ctx := context.Background()
	*log = (*log)[:0]
	clk := NewClock(WindowEpoch)
	p, err := openPair(ctx, s, participant.Options{NodeKey: NodeKey, CheckpointRows: 1,
		Retain: time.Second, TokenWindow: time.Minute, TokenSkew: time.Second, Now: clk.Now}, func(n uint64) participant.Token { return V7Token(clk.Now(), n) })
	if err != nil {
		return err
	}
	defer p.svc.Close()
	tell := func(i int) error {
		req := participant.Tell{Conversation: 1, Participant: p.snd.Participant, Generation: 1,
			Token: V7Token(clk.Now(), uint64(10+i)), Payload: []byte{byte(i)}}
		told, err := p.cs.Tell(ctx, req)
		if err != nil {
			return err
		}
		*log = append(*log, toldAnswered(fmt.Sprintf("tell %d", i), req, told, true))
		_, err = p.cr.Ack(ctx, participant.Ack{Conversation: 1, Participant: p.rcv.Participant, Generation: 1, Through: told.Seq})
		return err
	}
	for i := range 6 {
		if err := tell(i); err != nil {
			return err
		}
		clk.Advance(20 * time.Second)
		if i%2 == 1 {
			if err := passes(ctx, p.svc); err != nil {
				return err
			}
		}
	}
	// The clock steps ten minutes ahead, past the window, for one pair of
	// passes, and is corrected: the floor they persist is the forgotten
	// tokens' time, not the wrong clock's, so a fresh token commits.
	clk.Advance(10 * time.Minute)
	if err := passes(ctx, p.svc); err != nil {
		return err
	}
	clk.Advance(-10 * time.Minute)
	if err := tell(6); err != nil {
		return fmt.Errorf("a fresh tell after the clock was corrected: %w", err)
	}
	return nil
}

// CheckForgotten fails unless st holds what the completed
// WindowWorkload's passes wrote: conversation 1's token floor, and its
// oplog trimmed.
func CheckForgotten(t faultstore.TB, st store.DurableStore) {
	t.Helper()
	if v, err := st.ReadValue(tokenindex.FloorKey(1)); err != nil || v == 0 {
		t.Fatalf("after the completed window workload, conversation 1 has no token floor (%d, %v)", v, err)
	}
	if firstOplogRow(t, st) == 0 {
		t.Fatalf("after the completed window workload, conversation 1 was not compacted (first row 0)")
	}
}
