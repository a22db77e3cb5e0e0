package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
)

// TestNode_Owner_NamesTheOwnerWithoutClaiming: before anyone touched a
// conversation no node owns it, and asking does not claim it; once node a
// serves it, a reads itself as the owner and b reads a, with a's wire
// address and health URL; once a releases it, nobody owns it again.
func TestNode_Owner_NamesTheOwnerWithoutClaiming(t *testing.T) {
	ctx := context.Background()
	pfx := prefix()
	start := func(id string) *member {
		n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: id, Advertise: id + ":7000",
			AdvertiseHealth: "http://" + id + ":7001", Prefix: pfx, LeaseTTL: 5 * time.Second})
		if err != nil {
			t.Fatalf("Start(%s): %v", id, err)
		}
		key, err := n.NodeKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		svc, err := participant.Open(ctx, n.Store(), participant.Options{NodeKey: key, Ownership: n})
		if err != nil {
			t.Fatal(err)
		}
		n.OnLost(svc.Forget)
		t.Cleanup(func() {
			svc.Close()
			n.Close()
		})
		return &member{node: n, svc: svc}
	}
	a, b := start("a"), start("b")

	owner := func(m *member) cluster.Owner {
		t.Helper()
		o, err := m.node.Owner(ctx, 31)
		if err != nil {
			t.Fatalf("Owner(31) on %s: %v", m.node.ID(), err)
		}
		return o
	}
	if o := owner(b); o != (cluster.Owner{}) {
		t.Fatalf("Owner(31) before any touch = %+v, want none", o)
	}
	if o := owner(b); o != (cluster.Owner{}) {
		t.Fatalf("Owner(31) asked twice = %+v, want none: asking must not claim", o)
	}
	if _, err := a.svc.Connect(func() {}).Enroll(ctx, participant.Enroll{Conversation: 31, Token: tok('o', 1)}); err != nil {
		t.Fatalf("Enroll on a: %v", err)
	}
	want := cluster.Owner{Node: "a", Addr: "a:7000", Health: "http://a:7001"}
	if diff := cmp.Diff(want, owner(b)); diff != "" {
		t.Errorf("Owner(31) on b (-want +got):\n%s", diff)
	}
	want.Self = true
	if diff := cmp.Diff(want, owner(a)); diff != "" {
		t.Errorf("Owner(31) on a (-want +got):\n%s", diff)
	}
	if err := a.node.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if o := owner(b); o != (cluster.Owner{}) {
		t.Errorf("Owner(31) after a released it = %+v, want none", o)
	}
}
