package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/etcdstore"
)

// TestCluster_TokenWindowFloorFailsOver: node a, under a token window,
// compacts a conversation and forgets its old tokens; node b, whose clock
// is an hour behind a's, claims the conversation: the floor a persisted
// (in the conversation's fenced scope) still refuses every forgotten
// token token_expired, where b's clock alone would have let them commit
// again; b refuses even tokens drawn at its own clock while that clock is
// below the floor, and commits new ones once it is right.
//
// In the lagging variant, b is 90 s behind a (its clock alone would admit
// the forgotten tokens), and b's reads of the floor reach a member frozen
// before a's compaction while its other reads reach an up-to-date one,
// where the forgotten tokens' index entries are gone: b must still read
// the floor a persisted, not the member's older one.
func TestCluster_TokenWindowFloorFailsOver(t *testing.T) {
	for _, lagging := range []bool{false, true} {
		t.Run(fmt.Sprintf("lagging=%v", lagging), func(t *testing.T) { tokenWindowFloorFailsOver(t, lagging) })
	}
}

func tokenWindowFloorFailsOver(t *testing.T, lagging bool) {
	const (
		conv  = participant.ConversationID(31)
		tells = 20
	)
	pfx := prefix()
	clkA := participanttest.NewClock(time.UnixMilli(1_700_000_000_000))
	optsA := participant.Options{CheckpointRows: 1, Retain: time.Second, TokenWindow: time.Minute, TokenSkew: time.Second, Now: clkA.Now}
	a := startMemberWith(t, pfx, "a", time.Second, optsA)
	ctx := context.Background()

	ca, cr := a.svc.Connect(func() {}), a.svc.Connect(func() {})
	sender, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.V7Token(clkA.Now(), 1)})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := cr.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.V7Token(clkA.Now(), 2)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Ack(ctx, participant.Ack{Conversation: conv, Participant: sender.Participant, Generation: sender.Generation, Through: 2}); err != nil {
		t.Fatal(err)
	}
	var reqs []participant.Tell
	for i := range tells {
		req := participant.Tell{Conversation: conv, Participant: sender.Participant, Generation: sender.Generation,
			Token: participanttest.V7Token(clkA.Now(), uint64(10+i)), Payload: []byte(fmt.Sprintf("tell %d", i))}
		told, err := ca.Tell(ctx, req)
		if err != nil {
			t.Fatalf("tell %d: %v", i, err)
		}
		if _, err := cr.Ack(ctx, participant.Ack{Conversation: conv, Participant: reader.Participant, Generation: reader.Generation, Through: told.Seq}); err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
		reqs = append(reqs, req)
	}
	if _, err := a.svc.CheckpointPass(ctx); err != nil {
		t.Fatal(err)
	}
	clkA.Advance(2 * time.Minute)
	beforeCompaction, err := shared.Client.Get(ctx, pfx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.svc.CompactPass(ctx)
	if err != nil || got.Forgotten != tells+2 || got.Receipts != 0 {
		t.Fatalf("CompactPass on a = %+v, %v, want %d tokens forgotten and no receipt", got, err, tells+2)
	}
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	// oplogLen reads the committed length from etcd, with a store of its
	// own each time (a store caches what it read).
	oplogLen := func(t *testing.T, c participant.ConversationID) uint64 {
		t.Helper()
		st := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx + "d/", Scope: cluster.Scope})
		defer st.Close()
		n, err := st.Len(oplog.Stream(c))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if first, err := ro.First(oplog.Stream(conv)); err != nil || first == 0 {
		t.Fatalf("First(oplog) read back = %d, %v, want the old rows trimmed", first, err)
	}

	// Failover to b, an hour behind: now-window there is far below every
	// forgotten token.
	a.node.PauseKeepAlive()
	waitDeleted(t, pfx+"own/"+conv.String())
	behind := time.Hour
	if lagging {
		// Close enough that b's clock alone admits the forgotten tokens:
		// only the floor refuses them.
		behind = 90 * time.Second
	}
	clkB := participanttest.NewClock(clkA.Now().Add(-behind))
	optsB := optsA
	optsB.Now = clkB.Now
	cli := shared.Client
	if lagging {
		lcli, lag, err := shared.LaggingClient(1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lcli.Close() })
		lag.Freeze(beforeCompaction.Header.Revision, func(key string) bool { return strings.HasSuffix(key, "/window") })
		cli = lcli
	}
	b := startMemberOn(t, cli, pfx, "b", 5*time.Second, optsB)
	cb := b.svc.Connect(func() {})
	retry := func(i int) {
		t.Helper()
		_, err := cb.Tell(ctx, reqs[i])
		var pe *participant.Error
		if !errors.As(err, &pe) || pe.Code != participant.CodeTokenExpired {
			t.Fatalf("retry of forgotten tell %d on b = %v, want token_expired", i, err)
		}
	}
	// The first retry loads the conversation on b, which ends a's
	// bindings (two rows); the rows after that are the ones to keep.
	retry(0)
	rows := oplogLen(t, conv)
	for i := range reqs {
		retry(i)
	}
	if n := oplogLen(t, conv); n != rows {
		t.Fatalf("oplog length after the retries on b = %d, want %d: a forgotten token committed again", n, rows)
	}
	att := participant.Attach{Conversation: conv, Participant: sender.Participant,
		Generation: sender.Generation, Secret: sender.Secret, Token: participanttest.V7Token(clkB.Now(), 99)}
	if !lagging {
		// An hour behind, even a token drawn at b's clock is below the
		// floor (just past the newest forgotten token): b refuses rather
		// than guess, until its clock is right. Ninety seconds behind
		// (lagging), b's clock is already past the floor.
		_, err = cb.Attach(ctx, att)
		var pe *participant.Error
		if !errors.As(err, &pe) || pe.Code != participant.CodeTokenExpired {
			t.Fatalf("attach on b with a token drawn at its clock, below the floor = %v, want token_expired", err)
		}
		clkB.Advance(behind)
		att.Token = participanttest.V7Token(clkB.Now(), 99)
	}
	sb, err := cb.Attach(ctx, att)
	if err != nil {
		t.Fatalf("sender's Attach on b with a token above the floor: %v", err)
	}
	if _, err := cb.Tell(ctx, participant.Tell{Conversation: conv, Participant: sb.Participant, Generation: sb.Generation,
		Token: participanttest.V7Token(clkB.Now(), 100), Payload: []byte("after failover")}); err != nil {
		t.Fatalf("new tell on b = %v", err)
	}
}
