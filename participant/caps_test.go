package participant

import "testing"

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
