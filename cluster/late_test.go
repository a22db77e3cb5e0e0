package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_LateCommitAfterAnUnknownOutcomeCannotApply: a pipelined
// [attach, tell] commits in one transaction whose outcome is unknown (both
// answered in_doubt); the retried tell is then decided from etcd, without
// the attach (a definitive refusal), and only afterwards does the lost
// transaction reach etcd. It must be refused: a definitive answer is never
// contradicted by a commit that lands later. The node settles the
// conversation (a write of its claim key that every earlier transaction's
// compare fails against) before it reconciles.
func TestCluster_LateCommitAfterAnUnknownOutcomeCannotApply(t *testing.T) {
	const conv = participant.ConversationID(44)
	pfx := prefix()
	cli := newClient(t)
	hold := etcdtest.HoldLate(cli.KV)
	cli.KV = hold
	a := startMemberOn(t, cli, pfx, "a", 5*time.Second, participant.Options{})
	ctx := context.Background()

	c1, c2 := a.svc.Connect(func() {}), a.svc.Connect(func() {})
	b, err := c1.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(0x44, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Detach(ctx, participant.Detach{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: tok(0x44, 2)}); err != nil {
		t.Fatal(err)
	}

	hold.Arm(pfx + "d/c/" + conv.String() + "/")
	att := c2.StartAttach(ctx, participant.Attach{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: tok(0x44, 3)})
	tell := participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation + 1, Token: tok(0x44, 4), Payload: []byte("late")}
	told := c2.StartTell(ctx, tell)
	if _, err := att.Wait(); !errors.Is(err, participant.ErrInDoubt) {
		t.Fatalf("attach whose commit's outcome is unknown = %v, want in_doubt", err)
	}
	if _, err := told.Wait(); !errors.Is(err, participant.ErrInDoubt) {
		t.Fatalf("tell whose commit's outcome is unknown = %v, want in_doubt", err)
	}

	_, err = c2.Tell(ctx, tell)
	var pe *participant.Error
	if !errors.As(err, &pe) || pe.Code == participant.CodeInDoubt || pe.Code == participant.CodeUnavailable {
		t.Fatalf("retried tell, decided from etcd without the attach = %v, want a definitive refusal", err)
	}
	if hold.Apply(t) {
		t.Fatalf("the lost transaction committed after the retry was refused %s", pe.Code)
	}
	st := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer st.Close()
	n, err := st.Len(oplog.Stream(conv))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.ReadFrom(oplog.Stream(conv), 0, int(n))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rows {
		if row, err := oplog.Decode(e.Payload); err == nil && row.Kind == oplog.KindTell {
			t.Fatalf("oplog row %d is a tell: the refused tell committed", e.Seq)
		}
	}
}
