package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// lagSeed is the seed of the lagging member of this file's tests; their
// calls are sequential, so it makes one schedule of stale answers.
const lagSeed = 17

// openFenced opens a store on kv (a lagging member, a hold-back wrapper)
// whose scope "a" is fenced by a fresh claim of key pfx+"own/a".
func openFenced(t *testing.T, kv clientv3.KV, pfx string) *etcdstore.Store {
	t.Helper()
	s := etcdstore.OpenKV(kv, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment, RequireFence: true})
	t.Cleanup(func() { s.Close() })
	key := pfx + "own/a"
	deleteKey(t, key)
	s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	return s
}

// TestStore_FencedReadSeesOwnCommitThroughALaggingMember: a value the store
// committed is never read back older, though some serializable reads
// reach a member frozen behind the commit (the index entry of a committed
// attach or tell, read again for its retry). Such a member refuses the
// read pinned at the scope's revision, and the store reads linearizably.
func TestStore_FencedReadSeesOwnCommitThroughALaggingMember(t *testing.T) {
	lag := etcdtest.Lag(shared.Client.KV, lagSeed)
	s := openFenced(t, lag, prefix())
	for i := range 40 {
		key := fmt.Sprintf("a/token/%d", i)
		if err := s.CAS(key, 0, uint64(i+1)); err != nil {
			t.Fatalf("CAS(%s) = %v", key, err)
		}
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush() = %v", err)
		}
		if v, err := s.ReadValue(key); err != nil || v != uint64(i+1) {
			t.Fatalf("ReadValue(%s) after its commit = %d, %v, want %d (lagging member: %d stale, %d refused)",
				key, v, err, i+1, lag.Stale(), lag.Refused())
		}
	}
	if lag.Refused() == 0 {
		t.Fatalf("the lagging member refused no read: the test proves nothing")
	}
	t.Logf("lagging member: %d reads answered stale, %d refused; %d batches read again linearizably", lag.Stale(), lag.Refused(), s.CaughtUpReads())
}

// TestStore_FencedReadAfterAClaimSeesThePreviousOwner: a store that claims
// a scope reads no value older than what the previous owner committed
// before the claim (the token floor a compaction raised, an index entry),
// though a member frozen before those commits answers some of its reads.
func TestStore_FencedReadAfterAClaimSeesThePreviousOwner(t *testing.T) {
	pfx := prefix()
	lag := etcdtest.Lag(shared.Client.KV, lagSeed)
	for i := range 20 {
		prev := openFenced(t, lag, pfx)
		if err := prev.CAS("a/token/window", uint64(i), uint64(i+1)); err != nil {
			t.Fatalf("CAS(window, %d, %d) = %v", i, i+1, err)
		}
		if err := prev.Flush(); err != nil {
			t.Fatalf("Flush() = %v", err)
		}
		prev.Close()
		next := openFenced(t, lag, pfx)
		if v, err := next.ReadValue("a/token/window"); err != nil || v != uint64(i+1) {
			t.Fatalf("claim %d: ReadValue(window) = %d, %v, want %d (lagging member: %d stale, %d refused)",
				i, v, err, i+1, lag.Stale(), lag.Refused())
		}
		next.Close()
	}
	if lag.Refused() == 0 {
		t.Fatalf("the lagging member refused no read: the test proves nothing")
	}
}

// TestStore_LateTransactionAfterUnknownOutcomeCannotCommit: a commit whose
// outcome is unknown may still apply in etcd at any later time. After the
// reset, the store settles the scope before reading it, so the late
// transaction either applied before (and the reload sees it) or is
// refused: what the store reconciles from is final, and a request decided
// on it (a retry answered no_binding, a seq given to the next append) is
// never contradicted by a commit that lands afterwards.
func TestStore_LateTransactionAfterUnknownOutcomeCannotCommit(t *testing.T) {
	for _, before := range []bool{false, true} {
		t.Run(fmt.Sprintf("appliedBeforeReset=%v", before), func(t *testing.T) {
			pfx := prefix()
			late := etcdtest.HoldLate(shared.Client.KV)
			s := openFenced(t, late, pfx)
			mustAppend(t, s, "a/log", "e0", 0)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}

			late.Arm(s.ScopePrefix("a"))
			mustAppend(t, s, "a/log", "late", 1)
			if err := s.CAS("a/token", 0, 1); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); !errors.Is(err, etcdstore.ErrUnknownOutcome) {
				t.Fatalf("Flush() with the transaction held back = %v, want ErrUnknownOutcome", err)
			}
			if before && !late.Apply(t) {
				t.Fatal("the held transaction, applied before the reset, was refused")
			}
			s.Reset("a")
			want, wantTok := "[e0]", uint64(0)
			if before {
				want, wantTok = "[e0 late]", 1
			}
			if got := readAll(t, s, "a/log"); fmt.Sprint(got) != want {
				t.Fatalf("a/log after the reset = %v, want %s", got, want)
			}
			if v, err := s.ReadValue("a/token"); err != nil || v != wantTok {
				t.Fatalf("ReadValue(a/token) after the reset = %d, %v, want %d", v, err, wantTok)
			}
			if !before && late.Apply(t) {
				t.Fatal("the held transaction committed after the store reconciled from etcd without it")
			}
			if s.Settles() != 1 {
				t.Fatalf("%d settles, want 1", s.Settles())
			}
			// The store goes on from what it read, under its settled fence.
			n, err := s.Len("a/log")
			if err != nil {
				t.Fatal(err)
			}
			mustAppend(t, s, "a/log", "next", n)
			if err := s.Flush(); err != nil {
				t.Fatalf("Flush() after the settle = %v", err)
			}
			fresh := open(t, etcdstore.Options{Prefix: pfx, Scope: byFirstSegment})
			if got, want := fmt.Sprint(readAll(t, fresh, "a/log")), want[:len(want)-1]+" next]"; got != want {
				t.Fatalf("a/log read back = %v, want %s", got, want)
			}
		})
	}
}

// TestStore_SettleOfALostClaimFencesTheScope: when the claim is gone by
// the time the store settles, nothing is written and the scope fails with
// ErrFenced (the node claims afresh).
func TestStore_SettleOfALostClaimFencesTheScope(t *testing.T) {
	pfx := prefix()
	late := etcdtest.HoldLate(shared.Client.KV)
	s := openFenced(t, late, pfx)
	late.Arm(s.ScopePrefix("a"))
	mustAppend(t, s, "a/log", "e0", 0)
	if err := s.Flush(); !errors.Is(err, etcdstore.ErrUnknownOutcome) {
		t.Fatalf("Flush() = %v, want ErrUnknownOutcome", err)
	}
	deleteKey(t, pfx+"own/a")
	s.Reset("a")
	if _, err := s.Len("a/log"); !errors.Is(err, etcdstore.ErrFenced) || !errors.Is(err, store.ErrFailed) {
		t.Fatalf("Len after the claim was lost = %v, want ErrFenced", err)
	}
	if late.Apply(t) {
		t.Fatal("the held transaction committed without its claim")
	}
}

// TestStore_PinnedReadPastCompactionReadsLinearizably: etcd compacted the
// revision a fenced scope's reads are pinned at (the scope idle while
// others write); the read goes linearizable and answers the current value.
func TestStore_PinnedReadPastCompactionReadsLinearizably(t *testing.T) {
	c, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx := context.Background()
	s := etcdstore.Open(cli, etcdstore.Options{Scope: byFirstSegment, RequireFence: true})
	t.Cleanup(func() { s.Close() })
	claim, err := cli.Put(ctx, "own/a", "owner")
	if err != nil {
		t.Fatal(err)
	}
	s.SetFence("a", etcdstore.Fence{Key: "own/a", CreateRevision: claim.Header.Revision})
	if err := s.CAS("a/token", 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	var last int64
	for i := range 3 {
		resp, err := cli.Put(ctx, fmt.Sprintf("elsewhere/%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if v, err := s.ReadValue("a/token"); err != nil || v != 7 {
		t.Fatalf("ReadValue(a/token) past compaction = %d, %v, want 7", v, err)
	}
	if s.CaughtUpReads() != 1 {
		t.Fatalf("%d reads sent again, want 1 (linearizably)", s.CaughtUpReads())
	}
}

// TestLag_AnswersAsAMemberBehind checks the fault model itself: a frozen
// member answers unpinned serializable reads at its revision (header
// included), refuses reads pinned past it as future revisions, answers
// reads pinned at or before it, and leaves linearizable reads and reads of
// other keys to an up-to-date member.
func TestLag_AnswersAsAMemberBehind(t *testing.T) {
	ctx := context.Background()
	pfx := prefix()
	lag := etcdtest.Lag(shared.Client.KV, 1)
	old, err := lag.Put(ctx, pfx+"k", "old")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := lag.Put(ctx, pfx+"k", "new")
	if err != nil {
		t.Fatal(err)
	}
	lag.Freeze(old.Header.Revision, func(key string) bool { return key == pfx+"k" })

	get := func(opts ...clientv3.OpOption) (string, int64, error) {
		t.Helper()
		resp, err := lag.Get(ctx, pfx+"k", opts...)
		if err != nil {
			return "", 0, err
		}
		return string(resp.Kvs[0].Value), resp.Header.Revision, nil
	}
	if v, rev, err := get(clientv3.WithSerializable()); err != nil || v != "old" || rev != old.Header.Revision {
		t.Fatalf("serializable Get = %q at %d, %v, want \"old\" at %d", v, rev, err, old.Header.Revision)
	}
	if _, _, err := get(clientv3.WithSerializable(), clientv3.WithRev(cur.Header.Revision)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("serializable Get pinned past the member = %v, want ErrFutureRev", err)
	}
	if v, _, err := get(clientv3.WithSerializable(), clientv3.WithRev(old.Header.Revision)); err != nil || v != "old" {
		t.Fatalf("serializable Get pinned at the member = %q, %v, want \"old\"", v, err)
	}
	if v, _, err := get(); err != nil || v != "new" {
		t.Fatalf("linearizable Get = %q, %v, want \"new\"", v, err)
	}
	resp, err := lag.Txn(ctx).Then(clientv3.OpGet(pfx+"k", clientv3.WithSerializable(), clientv3.WithRev(cur.Header.Revision))).Commit()
	if !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("read-only transaction pinned past the member = %v, %v, want ErrFutureRev", resp, err)
	}
	resp, err = lag.Txn(ctx).Then(clientv3.OpGet(pfx+"k", clientv3.WithSerializable())).Commit()
	if err != nil || string(resp.Responses[0].GetResponseRange().Kvs[0].Value) != "old" {
		t.Fatalf("read-only transaction = %v, %v, want \"old\"", resp, err)
	}
	lag.Thaw()
	if v, _, err := get(clientv3.WithSerializable()); err != nil || v != "new" {
		t.Fatalf("serializable Get after Thaw with the member in step = %q, %v, want \"new\"", v, err)
	}
	if lag.Stale() != 2 || lag.Refused() != 2 {
		t.Fatalf("Stale, Refused = %d, %d, want 2, 2", lag.Stale(), lag.Refused())
	}
}
