package participant

import (
	"context"
	"testing"

	"github.com/participantd/participantd/store"
)

var testKey = make([]byte, NodeKeySize)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	c1 := svc.Connect(nil)
	c2 := svc.Connect(nil)
	a, err := c1.Enroll(ctx, Enroll{Conversation: 7, Token: Token{1}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c2.Enroll(ctx, Enroll{Conversation: 7, Token: Token{2}})
	if err != nil {
		t.Fatal(err)
	}
	told, err := c1.Tell(ctx, Tell{Conversation: 7, Participant: a.Participant, Generation: 1, Token: Token{3}, Payload: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a=%+v b=%+v told=%+v", a.Participant, b.Participant, told)
	d, ok := c2.Next(7, Offered{})
	t.Logf("next c2: %+v %v ready=%v", d, ok, c2.TakeReady())
	d, ok = c1.Next(7, Offered{})
	t.Logf("next c1: %+v %v", d, ok)
	ack, err := c2.Ack(ctx, Ack{Conversation: 7, Participant: b.Participant, Generation: 1, Through: told.Seq})
	t.Logf("ack %+v %v", ack, err)
	r, err := c1.Tell(ctx, Tell{Conversation: 7, Participant: a.Participant, Generation: 1, Token: Token{3}, Payload: []byte("hi")})
	t.Logf("replay %+v %v", r, err)
	mem.Crash()
	svc2, err := Open(ctx, mem, Options{NodeKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	c3 := svc2.Connect(nil)
	at, err := c3.Attach(ctx, Attach{Conversation: 7, Participant: a.Participant, Generation: 1, Secret: a.Secret, Token: Token{4}})
	t.Logf("attach %+v %v", at, err)
	for off := (Offered{}); ; {
		d, ok := c3.Next(7, off)
		if !ok {
			break
		}
		t.Logf("deliver %+v", d)
		off = Offered{Epoch: d.Epoch, Through: d.Seq}
	}
	r, err = c3.Tell(ctx, Tell{Conversation: 7, Participant: a.Participant, Generation: 1, Token: Token{3}, Payload: []byte("hi")})
	t.Logf("replay after restart %+v %v", r, err)
	r2, err := c3.Enroll(ctx, Enroll{Conversation: 7, Token: Token{1}})
	t.Logf("enroll replay after restart %+v %v", r2, err)
}
