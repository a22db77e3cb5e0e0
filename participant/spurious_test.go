package participant

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// spuriousCompacted is a faultstore that, while armed, answers every read
// of one stream past its first entry with store.ErrCompacted though the
// stream still holds it: a short read, as a storage bug or a damaged
// index could give.
type spuriousCompacted struct {
	*faultstore.Store
	stream string
	armed  atomic.Bool
}

func (s *spuriousCompacted) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	if s.armed.Load() && stream == s.stream && offset > 0 {
		return nil, &store.CompactedError{Stream: stream, Offset: offset, First: offset + 1}
	}
	return s.Store.ReadFrom(stream, offset, limit)
}

// A retry whose token index names a committed row that a read reports
// compacted, with no receipt, while the stream still holds that row, is
// answered unavailable: it is not "never committed", which would decide
// the operation again. Once reads are right again the retry replays the
// original answer.
func TestRetry_ASpuriousCompactedReadIsUnavailableNotANewCommit(t *testing.T) {
	ctx := context.Background()
	st := &spuriousCompacted{Store: faultstore.New(store.NewMemory()), stream: oplog.Stream(1)}
	svc := openService(t, st)
	c := svc.Connect(nil)
	b, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	tell := Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("transfer 100 to alice")}
	first, err := c.Tell(ctx, tell)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.Len(oplog.Stream(1))
	if err != nil {
		t.Fatal(err)
	}
	st.armed.Store(true)
	if got, err := c.Tell(ctx, tell); !errors.Is(err, &Error{Code: CodeUnavailable}) {
		t.Fatalf("retry under a spurious compacted read = %+v, %v; want unavailable", got, err)
	}
	st.armed.Store(false)
	if n, err := st.Len(oplog.Stream(1)); err != nil || n != rows {
		t.Fatalf("oplog after the refused retry holds %d rows (%v), want %d: the operation was decided again", n, err, rows)
	}
	got, err := c.Tell(ctx, tell)
	if err != nil || got.Seq != first.Seq {
		t.Fatalf("retry once reads are right = %+v, %v; want the original seq %v", got, err, first.Seq)
	}
}
