package client_test

import (
	"testing"

	"github.com/participantd/participantd/client"
)

// A Cluster keeps no per-participant lock for participants it forgot:
// after participants were followed (their node's connection ended, so
// the Cluster attached them again), detached, attached again and left,
// none is left behind.
func TestCluster_Leave_PrunesOpLocks(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	followed := make(chan client.Credential, 64)
	opts := fastClusterOpts
	opts.OnFollow = func(cred client.Credential, err error) {
		if err == nil {
			followed <- cred
		}
	}
	c := dialClusterT(t, []string{srv.addr()}, opts)
	const n = 8
	creds := make([]client.Credential, n)
	for i := range creds {
		cred, err := c.Enroll(ctx, uint64(1+i%2))
		if err != nil {
			t.Fatal(err)
		}
		creds[i] = cred
	}
	srv.dropAll()
	for range n {
		select {
		case <-followed:
		case <-ctx.Done():
			t.Fatal("the participants were not followed to their new binding")
		}
	}
	for i, cred := range creds {
		if i%2 == 0 {
			if _, err := c.Detach(ctx, cred); err != nil {
				t.Fatalf("Detach = %v", err)
			}
			if _, err := c.Attach(ctx, cred); err != nil {
				t.Fatalf("Attach = %v", err)
			}
		}
		if _, err := c.Leave(ctx, cred); err != nil {
			t.Fatalf("Leave = %v", err)
		}
	}
	waitGone(t, ctx, "client.(*Cluster).followLoop")
	if got := c.OpLocks(); got != 0 {
		t.Errorf("%d op locks kept after %d participants left, want 0", got, n)
	}
}
