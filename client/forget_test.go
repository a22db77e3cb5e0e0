package client_test

import (
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// A plain Client that forgets a participant (its re-attachment was refused
// moved) forgets the attach of it that was in doubt too: a later Attach
// starts a new intent, so the token the caller supplies is the one sent.
func TestClient_ForgottenParticipant_DropsPendingAttach(t *testing.T) {
	srv := newFakeServer(t)
	reconnected := make(chan struct{}, 1)
	c := dialT(t, srv, client.Options{OnReconnect: func(client.Welcome) { reconnected <- struct{}{} }})
	ctx := testCtx(t)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatalf("Enroll = %v", err)
	}

	var attaches []wire.Token // guarded by srv.mu, which the hook runs with
	srv.mu.Lock()
	srv.refusal = wire.Error{Code: wire.CodeMoved, Detail: "scripted"}
	srv.mu.Unlock()
	srv.setHook(func(_ *fconn, m wire.Message) action {
		a, ok := m.(*wire.Attach)
		if !ok {
			return pass
		}
		attaches = append(attaches, a.Token)
		if len(attaches) == 1 {
			return refuse
		}
		return pass
	})
	srv.dropAll()
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("no reconnect")
	}
	if _, held := c.Credential(cred.Conversation, cred.Participant); held {
		t.Fatal("Credential: the participant whose re-attach was refused moved is still held")
	}

	supplied := client.NewToken()
	if _, err := c.Attach(ctx, cred, client.WithToken(supplied)); err != nil {
		t.Fatalf("Attach = %v", err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(attaches) != 2 {
		t.Fatalf("the server saw %d attaches, want 2", len(attaches))
	}
	if attaches[1] != supplied {
		t.Fatalf("Attach(WithToken(%v)) sent token %v (the forgotten attach's: %v)", supplied, attaches[1], attaches[0])
	}
}
