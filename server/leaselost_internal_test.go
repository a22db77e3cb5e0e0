package server

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// A lost lease says bye{lease_lost} to a connection that may hold a
// binding the client was told of, or may have been: an enroll answered
// in_doubt (its binding possibly stored, not published) whose
// conversation has not loaded since. Without the bye a client that then
// only reads waited for deliveries that never came; a connection that
// holds nothing is left alone.
func TestConn_LeaseLostSaysByeToAConnectionWithABindingInDoubt(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	svc, err := participant.Open(ctx, fs, participant.Options{NodeKey: make([]byte, participant.NodeKeySize)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{1}}); err != nil {
		t.Fatal(err)
	}
	// The next enroll's oplog append fails (in doubt), and so does every
	// read of its conversation, so that no reload settles it.
	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend, faultstore.OpRead), faultstore.Prefix("oplog/")))
	inDoubt, idle := svc.Connect(nil), svc.Connect(nil)
	_, err = inDoubt.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{2}})
	if !errors.Is(err, &participant.Error{Code: participant.CodeInDoubt}) {
		t.Fatalf("Enroll with a failing oplog append = %v, want in_doubt", err)
	}
	for _, tc := range []struct {
		name string
		pc   *participant.Conn
		bye  bool
	}{{"an enroll in doubt", inDoubt, true}, {"nothing", idle, false}} {
		nc, peer := net.Pipe()
		defer nc.Close()
		defer peer.Close()
		c := &conn{nc: nc}
		c.served.Store(tc.pc)
		c.requestLeaseLost()
		if got := c.leaseLost.Load(); got != tc.bye {
			t.Errorf("a lost lease on a connection holding %s: bye = %v, want %v", tc.name, got, tc.bye)
		}
	}
}
