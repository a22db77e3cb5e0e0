package participant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// TestCaps_LeftParticipantsFreeTheirSlot: MaxParticipants counts the
// members who have not left, so a participant who left frees its slot for
// the next enroll, after a restart too; its committed answers still replay
// by token, and the new participant gets a new id.
func TestCaps_LeftParticipantsFreeTheirSlot(t *testing.T) {
	e := newSemEnv(t, Options{MaxParticipants: 2})
	c1, c2, c3, c4 := e.conn(), e.conn(), e.conn(), e.conn()
	aEnroll := Enroll{Conversation: 1, Token: e.tok()}
	a, err := c1.Enroll(e.ctx, aEnroll)
	if err != nil {
		t.Fatalf("Enroll(a) = %v", err)
	}
	e.enroll(c2, 1)
	_, err = c3.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "third Enroll with MaxParticipants 2", err, semWant{code: CodeCapacityExceeded, limit: 2})

	aLeave := Leave{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: e.tok()}
	left, err := c1.Leave(e.ctx, aLeave)
	if err != nil {
		t.Fatalf("Leave(a) = %v", err)
	}
	c := e.enroll(c3, 1)
	if c.Participant != 2 {
		t.Errorf("Enroll after a left = %v, want the new id p2", c.Participant)
	}
	_, err = c4.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "Enroll with two members who have not left", err, semWant{code: CodeCapacityExceeded, limit: 2})

	e.restart()
	c1, c4 = e.conn(), e.conn()
	_, err = c4.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "Enroll after a restart with two members who have not left", err, semWant{code: CodeCapacityExceeded, limit: 2})
	wantA := a
	wantA.Replay = ReplayUnbound
	if got, err := c1.Enroll(e.ctx, aEnroll); err != nil || got != wantA {
		t.Errorf("Enroll replay of the participant who left = %+v, %v, want %+v", got, err, wantA)
	}
	wantLeft := left
	wantLeft.Replay = ReplayCommitted
	if got, err := c4.Leave(e.ctx, aLeave); err != nil || got != wantLeft {
		t.Errorf("Leave replay = %+v, %v, want %+v", got, err, wantLeft)
	}
}

// TestCaps_MintedIDsAreBounded: enroll-and-leave churn frees every slot,
// but each participant keeps its id and its state, so a conversation mints
// at most mintedPerSlot × MaxParticipants ids.
func TestCaps_MintedIDsAreBounded(t *testing.T) {
	e := newSemEnv(t, Options{MaxParticipants: 1})
	c := e.conn()
	for range mintedPerSlot {
		e.leave(c, e.enroll(c, 1))
	}
	_, err := c.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "Enroll past the minted ids", err, semWant{code: CodeCapacityExceeded, limit: mintedPerSlot})
}

// inviteEnv is a semEnv under the invite policy with an invitation to
// conversation 1 that admits uses enrolls.
func inviteEnv(t *testing.T, uses uint32) (*semEnv, []byte) {
	t.Helper()
	e := newSemEnv(t, Options{EnrollPolicy: EnrollInvite, CheckpointRows: 1})
	now := e.clock.Now()
	inv, err := MintInviteUses(semKey, 1, now, now.Add(time.Hour), uses)
	if err != nil {
		t.Fatal(err)
	}
	return e, inv
}

// TestCaps_InviteUseCount: an invitation minted with a use count admits
// that many enrolls and no more, after a restart and from a checkpoint
// too; a retry of an admitted enroll replays it and spends nothing; an
// invitation without a use count (version 1) still admits any number.
func TestCaps_InviteUseCount(t *testing.T) {
	e, inv := inviteEnv(t, 2)
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	first := Enroll{Conversation: 1, Token: e.tok(), Invite: inv}
	a, err := c1.Enroll(e.ctx, first)
	if err != nil {
		t.Fatalf("first Enroll = %v", err)
	}
	wantA := a
	wantA.Replay = ReplayBound
	for range 3 {
		if got, err := c1.Enroll(e.ctx, first); err != nil || got != wantA {
			t.Fatalf("retried Enroll = %+v, %v, want the replay %+v", got, err, wantA)
		}
	}
	if _, err := c2.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: inv}); err != nil {
		t.Fatalf("second Enroll = %v", err)
	}
	_, err = c3.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: inv})
	semCheckErr(t, "third Enroll with a two-use invitation", err, semWant{code: CodeInviteInvalid})

	e.restart()
	_, err = e.conn().Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: inv})
	semCheckErr(t, "Enroll after a restart", err, semWant{code: CodeInviteInvalid})
	if n, err := e.svc.CheckpointPass(e.ctx); err != nil || n == 0 {
		t.Fatalf("CheckpointPass = %d, %v, want a checkpoint", n, err)
	}
	e.restart()
	_, err = e.conn().Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: inv})
	semCheckErr(t, "Enroll after a restart from the checkpoint", err, semWant{code: CodeInviteInvalid})

	unlimited, err := MintInvite(semKey, 1, e.clock.Now(), e.clock.Now().Add(time.Hour))
	if err != nil || len(unlimited) != InviteSize {
		t.Fatalf("MintInvite = %d bytes, %v, want the version 1 size %d", len(unlimited), err, InviteSize)
	}
	for range 3 {
		if _, err := e.conn().Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: unlimited}); err != nil {
			t.Fatalf("Enroll with a version 1 invitation = %v", err)
		}
	}
}

// TestCaps_InviteUseCountInOneBatch: enrolls decided together in one
// batch see each other's uses.
func TestCaps_InviteUseCountInOneBatch(t *testing.T) {
	e, inv := inviteEnv(t, 1)
	calls := make([]*Call[Bound], 4)
	for i := range calls {
		calls[i] = e.conn().StartEnroll(e.ctx, Enroll{Conversation: 1, Token: e.tok(), Invite: inv})
	}
	admitted := 0
	for _, c := range calls {
		if _, err := c.Wait(); err == nil {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("%d pipelined enrolls with a one-use invitation admitted %d, want 1", len(calls), admitted)
	}
}

// TestCrashCut_InviteUses cuts enrolls with a two-use invitation at every
// store operation; after the restart the same three tokens are retried in
// order: whatever the cut left, the first two are admitted (fresh or
// replayed) and the third is refused, so a crash spends a use exactly when
// its enroll committed.
func TestCrashCut_InviteUses(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	inv, err := MintInviteUses(semKey, 1, now, now.Add(time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{NodeKey: semKey, EnrollPolicy: EnrollInvite, Now: func() time.Time { return now }}
	toks := []Token{{1, 1}, {2, 2}, {3, 3}}
	enrollAll := func(svc *Service) []error {
		errs := make([]error, len(toks))
		for i, tok := range toks {
			_, errs[i] = svc.Connect(nil).Enroll(context.Background(), Enroll{Conversation: 1, Token: tok, Invite: inv})
		}
		return errs
	}
	faultstore.CutLoop{
		Workload: func(s *faultstore.Store) error {
			svc, err := Open(context.Background(), s, opts)
			if err != nil {
				return err
			}
			defer svc.Close()
			enrollAll(svc)
			return nil
		},
		Check: func(t faultstore.TB, st store.DurableStore, run faultstore.CutRun) {
			svc, err := Open(context.Background(), st, opts)
			if err != nil {
				t.Fatalf("Open after the cut: %v", err)
			}
			defer svc.Close()
			errs := enrollAll(svc)
			var pe *Error
			if errs[0] != nil || errs[1] != nil || !errors.As(errs[2], &pe) || pe.Code != CodeInviteInvalid {
				t.Errorf("enrolls retried after the cut = %v, want two admitted and invite_invalid", errs)
			}
		},
	}.Run(t)
}
