package etcdstore_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// TestStore_UnknownOutcomeFailsItsScopes: with etcd unreachable a commit's
// outcome is unknown; the scopes it carried fail (ErrUnknownOutcome,
// sticky), nothing claims success, and once etcd is back a Reset reads the
// truth from etcd: here the unreachable commit wrote nothing, and the seq
// it would have taken is free again, without a gap.
func TestStore_UnknownOutcomeFailsItsScopes(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, Timeout: 500 * time.Millisecond}
	s := open(t, o)
	mustAppend(t, s, "a/log", "e0", 0)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Len("b/log"); err != nil { // b's lengths are known before etcd goes
		t.Fatal(err)
	}

	shared.Stop(0)
	restarted := false
	defer func() {
		if !restarted {
			shared.Restart(0)
		}
	}()
	mustAppend(t, s, "a/log", "e1", 1)
	mustAppend(t, s, "b/log", "b0", 0)
	err := s.FlushScopes("a")
	if !errors.Is(err, etcdstore.ErrUnknownOutcome) || !errors.Is(err, store.ErrFailed) {
		t.Fatalf("FlushScopes(a) with etcd down = %v, want ErrUnknownOutcome wrapping store.ErrFailed", err)
	}
	if err := s.FlushScopes("b"); !errors.Is(err, etcdstore.ErrUnknownOutcome) {
		t.Fatalf("FlushScopes(b), in the same transaction = %v, want ErrUnknownOutcome", err)
	}
	if _, err := s.Append("a/log", []byte("x"), 1); !errors.Is(err, etcdstore.ErrUnknownOutcome) {
		t.Fatalf("Append after the unknown outcome = %v, want the sticky error", err)
	}

	if err := shared.Restart(0); err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	restarted = true
	s.Reset("a")
	if got := readAll(t, s, "a/log"); fmt.Sprint(got) != "[e0]" {
		t.Fatalf("a/log after Reset = %v, want [e0]", got)
	}
	mustAppend(t, s, "a/log", "e1", 1)
	if err := s.FlushScopes("a"); err != nil {
		t.Fatalf("FlushScopes(a) with etcd back = %v", err)
	}
	if got := readAll(t, open(t, etcdstore.Options{Prefix: o.Prefix, Scope: byFirstSegment}), "a/log"); fmt.Sprint(got) != "[e0 e1]" {
		t.Fatalf("a/log read back = %v, want [e0 e1]", got)
	}
}
