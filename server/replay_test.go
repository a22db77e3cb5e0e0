package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestReplay_EnrollTokenAloneGivesNothing is issue 18's probe: under the
// invite policy, a peer that learned only a committed enroll's token
// replays it on another connection without the invitation (or with one
// to another conversation). It must get a typed refusal and nothing else:
// not the participant's secret, so no attach that would supersede the
// victim, and no row written. The victim's retry, which carries its
// invitation again, still replays.
func TestReplay_EnrollTokenAloneGivesNothing(t *testing.T) {
	h := start(t, server.Config{EnrollPolicy: participant.EnrollInvite})
	key, err := participant.LoadOrCreateNodeKey(h.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	const conv, other = 21, 22
	now := time.Now()
	invite := func(c uint64) []byte {
		inv, err := participant.MintInvite(key, participant.ConversationID(c), now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}

	victim := h.dial()
	tok := token()
	a := victim.call(&wire.Enroll{ID: victim.id(), Conversation: conv, Token: tok, Invite: invite(conv)})
	e, ok := a.(*wire.Enrolled)
	if !ok {
		t.Fatalf("enroll answered %#v", a)
	}
	cr := cred{conv, e.Participant, e.Generation, e.Secret}
	before := victim.tell(cr, "before the probe").Seq

	probe := h.dial()
	for _, tc := range []struct {
		name   string
		invite []byte
		want   wire.Code
	}{
		{"no invitation", nil, wire.CodeInviteRequired},
		{"invitation to another conversation", invite(other), wire.CodeInviteInvalid},
		{"junk invitation", make([]byte, participant.InviteSize), wire.CodeInviteInvalid},
	} {
		a := probe.call(&wire.Enroll{ID: probe.id(), Conversation: conv, Token: tok, Invite: tc.invite})
		if r, ok := a.(*wire.Error); !ok || r.Code != tc.want {
			t.Fatalf("%s: replay answered %#v, want error %s", tc.name, a, tc.want)
		}
	}
	// On the old code the probe went on to attach with the secret its
	// replay returned, superseding the victim for good; the loop above
	// fails first if a replay returns it. Without it, the probe's attach
	// is refused.
	if a := probe.call(&wire.Attach{ID: probe.id(), Conversation: conv, Participant: cr.p, Generation: cr.gen, Token: token()}); !isError(a, wire.CodeStaleAuthority) {
		t.Fatalf("attach without the secret answered %#v, want stale_authority", a)
	}

	// Nothing was written: the victim's next record follows its last.
	if got := victim.tell(cr, "after the probe").Seq; got != before+1 {
		t.Fatalf("tell after the probe got seq %d, want %d: the probe wrote", got, before+1)
	}
	retry := h.dial()
	a = retry.call(&wire.Enroll{ID: retry.id(), Conversation: conv, Token: tok, Invite: invite(conv)})
	if r, ok := a.(*wire.Enrolled); !ok || r.Replay == nil || r.Participant != cr.p || r.Secret != cr.secret {
		t.Fatalf("retry with the invitation answered %#v, want the replayed credential", a)
	}
	victim.attach(cr)
}

func isError(m wire.Message, c wire.Code) bool {
	e, ok := m.(*wire.Error)
	return ok && e.Code == c
}
