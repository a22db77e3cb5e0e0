package participanttest

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// pair is conversation 1 of a service: a sender, which acknowledged both
// enrollments' records, and a recipient, each on a connection of its own.
// WindowWorkload and ReleaseWorkload drive one.
type pair struct {
	svc      *participant.Service
	cs, cr   *participant.Conn
	snd, rcv participant.Bound
}

// openPair opens a service over s with opts and enrolls a pair in it, the
// sender with token tok(1), the recipient with tok(2). The caller closes
// the service; when openPair fails, it closed it.
func openPair(ctx context.Context, s store.DurableStore, opts participant.Options, tok func(n uint64) participant.Token) (*pair, error) {
	svc, err := participant.Open(ctx, s, opts)
	if err != nil {
		return nil, err
	}
	p := &pair{svc: svc, cs: svc.Connect(nil), cr: svc.Connect(nil)}
	p.snd, err = p.cs.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(1)})
	if err == nil {
		p.rcv, err = p.cr.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(2)})
	}
	if err == nil {
		_, err = p.cs.Ack(ctx, participant.Ack{Conversation: 1, Participant: p.snd.Participant, Generation: 1, Through: 2})
	}
	if err != nil {
		svc.Close()
		return nil, err
	}
	return p, nil
}

// passes runs a checkpoint pass, then a compaction pass, as svc's
// background checkpointer does: also after a checkpoint pass that failed
// some conversations alone (*participant.PassFailures), whose error is
// then returned with the compaction's.
func passes(ctx context.Context, svc *participant.Service) error {
	_, err := svc.CheckpointPass(ctx)
	if pf := (*participant.PassFailures)(nil); err != nil && !errors.As(err, &pf) {
		return err
	}
	_, cerr := svc.CompactPass(ctx)
	return errors.Join(err, cerr)
}

// toldAnswered is the Answered of req, a tell answered told: its retry
// must replay told's seq; when forgettable (its token may be forgotten
// under a token window) it may instead be refused token_expired, but
// never commit again.
func toldAnswered(what string, req participant.Tell, told participant.Told, forgettable bool) Answered {
	return Answered{what, func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
		r, err := c.Tell(ctx, req)
		if forgettable && errors.Is(err, participant.ErrTokenExpired) {
			return nil
		}
		if err != nil || r.Seq != told.Seq || r.Replay != participant.ReplayCommitted {
			want := "replayed"
			if forgettable {
				want += ", or token_expired"
			}
			return fmt.Errorf("retry = %+v, %v; want seq %v %s", r, err, told.Seq, want)
		}
		return nil
	}}
}

// firstOplogRow returns the first oplog row conversation 1 still stores in
// st, failing t when st does not compact or the read fails.
func firstOplogRow(t faultstore.TB, st store.DurableStore) uint64 {
	t.Helper()
	cs, ok := store.AsCompactor(st)
	if !ok {
		t.Fatalf("the store %T does not compact", st)
	}
	first, err := cs.First(oplog.Stream(1))
	if err != nil {
		t.Fatalf("the first oplog row of conversation 1: %v", err)
	}
	return first
}
