package participant

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

func TestService_Stats_CountsConversationsConnectionsBindings(t *testing.T) {
	ctx := context.Background()
	svc := openService(t, store.NewMemory())
	if diff := cmp.Diff(Stats{}, svc.Stats()); diff != "" {
		t.Errorf("empty service Stats (-want +got):\n%s", diff)
	}
	var w wakeCounter
	a, b := svc.Connect(w.wake), svc.Connect(w.wake)
	for i, c := range []struct {
		conn *Conn
		conv ConversationID
	}{{a, 1}, {a, 2}, {b, 1}} {
		if _, err := c.conn.Enroll(ctx, Enroll{Conversation: c.conv, Token: token(byte(i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	want := Stats{Conversations: 2, Loaded: 2, Connections: 2, Bindings: 3}
	if diff := cmp.Diff(want, svc.Stats()); diff != "" {
		t.Errorf("Stats after three enrolls (-want +got):\n%s", diff)
	}
	if err := a.End(ctx, oplog.CauseClean); err != nil {
		t.Fatal(err)
	}
	want = Stats{Conversations: 2, Loaded: 2, Connections: 1, Bindings: 1}
	if diff := cmp.Diff(want, svc.Stats()); diff != "" {
		t.Errorf("Stats after one connection ended (-want +got):\n%s", diff)
	}
}
