package etcdtest

import (
	"context"
	"errors"
	"slices"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// countKV counts the transactions and Gets that reach it; each succeeds.
type countKV struct {
	clientv3.KV
	txns, gets int
}

func (k *countKV) Txn(context.Context) clientv3.Txn { return &countTxn{k: k} }

func (k *countKV) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.gets++
	return &clientv3.GetResponse{}, nil
}

type countTxn struct{ k *countKV }

func (t *countTxn) If(...clientv3.Cmp) clientv3.Txn  { return t }
func (t *countTxn) Then(...clientv3.Op) clientv3.Txn { return t }
func (t *countTxn) Else(...clientv3.Op) clientv3.Txn { return t }

func (t *countTxn) Commit() (*clientv3.TxnResponse, error) {
	t.k.txns++
	return &clientv3.TxnResponse{Succeeded: true}, nil
}

// TestHook_FaultsSendWhatTheySay: each Fault answers as it says and
// reaches the wrapped KV only when it applies; the hook is shown the
// transaction as it was built, and a KV without hooks passes through.
func TestHook_FaultsSendWhatTheySay(t *testing.T) {
	for _, tc := range []struct {
		fault     Fault
		succeeded bool
		lost      bool
		sent      int
	}{
		{Refused, false, false, 0},
		{Lost, false, true, 0},
		{LostApplied, false, true, 1},
	} {
		base := &countKV{}
		var shown *Txn
		kv := Hook(base, Hooks{Txn: func(_ context.Context, txn *Txn) (*clientv3.TxnResponse, error) {
			shown = txn
			return txn.Fail(tc.fault)
		}})
		resp, err := kv.Txn(context.Background()).
			If(clientv3.Compare(clientv3.Version("k"), "=", 0)).
			Then(clientv3.OpPut("k", "v")).
			Else(clientv3.OpGet("k")).
			Commit()
		if lost := errors.Is(err, context.DeadlineExceeded) && errors.Is(err, ErrInjected); lost != tc.lost {
			t.Errorf("%v: Commit = %v, want lost %v", tc.fault, err, tc.lost)
		}
		if err == nil && resp.Succeeded != tc.succeeded {
			t.Errorf("%v: Succeeded = %v, want %v", tc.fault, resp.Succeeded, tc.succeeded)
		}
		if base.txns != tc.sent {
			t.Errorf("%v: %d transactions sent, want %d", tc.fault, base.txns, tc.sent)
		}
		if len(shown.Cmps) != 1 || len(shown.Thens) != 1 || len(shown.Elses) != 1 || !shown.Writes() || shown.ReadOnly() {
			t.Errorf("%v: hook shown %+v, want the compare, the put and the get", tc.fault, shown)
		}
	}

	base := &countKV{}
	kv := Hook(base, Hooks{})
	if _, err := kv.Txn(context.Background()).Then(clientv3.OpGet("k")).Commit(); err != nil || base.txns != 1 {
		t.Errorf("pass-through Commit = %v, %d sent, want nil, 1", err, base.txns)
	}
	if _, err := kv.Get(context.Background(), "k"); err != nil || base.gets != 1 {
		t.Errorf("pass-through Get = %v, %d sent, want nil, 1", err, base.gets)
	}
}

// TestTrigger_FiresOnceAtTheArmedCount: a trigger fires on the n-th hit
// after Arm(n), once, and never while disarmed.
func TestTrigger_FiresOnceAtTheArmedCount(t *testing.T) {
	var tr Trigger
	for i := range 3 {
		if tr.Hit() {
			t.Fatalf("disarmed Hit %d fired", i)
		}
	}
	tr.Arm(2)
	var got []bool
	for range 4 {
		got = append(got, tr.Hit())
	}
	if want := []bool{false, true, false, false}; !slices.Equal(got, want) {
		t.Fatalf("hits after Arm(2) = %v, want %v", got, want)
	}
	if !tr.Fired() || tr.Seen() != 7 {
		t.Fatalf("Fired, Seen = %v, %d, want true, 7", tr.Fired(), tr.Seen())
	}
	tr.Arm(1)
	tr.Arm(0)
	if tr.Hit() {
		t.Fatal("Hit after Arm(0) fired")
	}
}
