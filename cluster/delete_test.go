package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
)

// TestCluster_MaxConversationsCountsWhatTheNodeCreates (security item 6,
// left open last round): a node's --max-conversations counts the
// conversations it creates, although a first touch claims each one afresh
// (a fresh claim registers the entry, and used to take no slot), and the
// conversations another node created that it loads.
func TestCluster_MaxConversationsCountsWhatTheNodeCreates(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	b := startMemberOn(t, shared.Client, pfx, "b", lossTTL, participant.Options{})
	if _, err := b.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 50, Token: tok(7, 50)}); err != nil {
		t.Fatalf("enroll on b = %v", err)
	}
	b.svc.Close()
	b.node.Close() // b's claims end with its lease: a may take 50 over
	a := startMemberOn(t, shared.Client, pfx, "a", lossTTL, participant.Options{MaxConversations: 3})
	for i := range 2 {
		if _, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: participant.ConversationID(1 + i), Token: tok(8, i)}); err != nil {
			t.Fatalf("enroll %d = %v", i, err)
		}
	}
	// b's conversation, loaded here, is served and takes the third slot.
	if _, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 50, Token: tok(8, 50)}); err != nil {
		t.Fatalf("enroll into b's conversation on a = %v", err)
	}
	_, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 3, Token: tok(8, 3)})
	if !errors.Is(err, &participant.Error{Code: participant.CodeCapacityExceeded}) {
		t.Fatalf("a fourth conversation = %v, want capacity_exceeded", err)
	}
}

// TestCluster_DeletedConversationLetsItsClaimGo (security item 6d): the
// owner deletes a conversation every participant left, through its claim,
// then deletes the claim and frees the slot; another node then answers a
// request on it retired, with nothing of it to load but its last rows.
func TestCluster_DeletedConversationLetsItsClaimGo(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	var mu sync.Mutex
	now := time.UnixMilli(1_700_000_000_000)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	opts := participant.Options{MaxConversations: 1, Retain: time.Minute, Now: clock}
	a := startMemberOn(t, shared.Client, pfx, "a", lossTTL, opts)
	b := startMemberOn(t, shared.Client, pfx, "b", lossTTL, opts)
	ca, cb := a.svc.Connect(nil), a.svc.Connect(nil)
	x, err := ca.Enroll(ctx, participant.Enroll{Conversation: 7, Token: tok(9, 1)})
	if err != nil {
		t.Fatal(err)
	}
	y, err := cb.Enroll(ctx, participant.Enroll{Conversation: 7, Token: tok(9, 2)})
	if err != nil {
		t.Fatal(err)
	}
	leave := participant.Leave{Conversation: 7, Participant: x.Participant, Generation: x.Generation, Secret: x.Secret, Token: tok(9, 3)}
	if _, err := ca.Leave(ctx, leave); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Leave(ctx, participant.Leave{Conversation: 7, Participant: y.Participant, Generation: y.Generation, Secret: y.Secret, Token: tok(9, 4)}); err != nil {
		t.Fatal(err)
	}
	owned := a.node.Stats().Owned
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	got, err := a.svc.CompactPass(ctx)
	if err != nil || got.Deleted != 1 {
		t.Fatalf("CompactPass = %+v, %v; want conversation 7 deleted", got, err)
	}
	if o := a.node.Stats().Owned; o != owned-1 {
		t.Errorf("a owns %d conversations after the deletion, want %d", o, owned-1)
	}
	if r, err := shared.Client.Get(ctx, pfx+"own/7", clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("the deleted conversation's claim: %d keys (%v), want none", r.Count, err)
	}
	// Its slot is free on a.
	if _, err := a.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 8, Token: tok(9, 5)}); err != nil {
		t.Errorf("a new conversation on a after the deletion = %v", err)
	}
	// b claims it, finds it deleted, and refuses.
	_, err = b.svc.Connect(nil).Leave(ctx, leave)
	if !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
		t.Errorf("the retried leave on b = %v, want retired", err)
	}
	_, err = b.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 7, Token: tok(9, 6)})
	if !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
		t.Errorf("an enroll into the deleted id on b = %v, want retired", err)
	}
	// The deleted conversation takes no slot of b's: b can still create one.
	if _, err := b.svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 9, Token: tok(9, 7)}); err != nil {
		t.Errorf("a new conversation on b after touching the deleted one = %v", err)
	}
}
