package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Hooks decide what the calls through a KV made by Hook do. A nil hook
// passes its calls through. A hook may be called from several goroutines
// at once: what it keeps, it guards (Trigger does).
type Hooks struct {
	// Txn decides what a transaction's Commit does, and Commit returns
	// what it returns: t.Send() runs the transaction; returning without
	// it withholds the transaction (t.Fail refuses or loses it); calling
	// t.Send() and then returning an error applies it with its answer
	// lost. It may also block first (on a gate, or on ctx, the
	// transaction's context), or record what it is shown.
	Txn func(ctx context.Context, t *Txn) (*clientv3.TxnResponse, error)
	// Get decides what a Get does, as Txn decides a transaction's
	// Commit: g.Send() runs it.
	Get func(ctx context.Context, g *Get) (*clientv3.GetResponse, error)
}

// Hook returns kv with its transactions' commits and its Gets decided by
// h; every other call (Put, Delete, Do, Compact) passes through.
func Hook(kv clientv3.KV, h Hooks) clientv3.KV { return &hooked{KV: kv, h: h} }

type hooked struct {
	clientv3.KV
	h Hooks
}

func (k *hooked) Txn(ctx context.Context) clientv3.Txn {
	if k.h.Txn == nil {
		return k.KV.Txn(ctx)
	}
	return &Txn{ctx: ctx, txn: k.KV.Txn(ctx), hook: k.h.Txn}
}

func (k *hooked) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if k.h.Get == nil {
		return k.KV.Get(ctx, key, opts...)
	}
	return k.h.Get(ctx, &Get{Key: key, Opts: opts, ctx: ctx, kv: k.KV})
}

// Txn is a transaction as the code under test built it, shown to
// Hooks.Txn at its Commit. The hook must not modify its slices, which
// alias the caller's operations.
type Txn struct {
	// Cmps, Thens and Elses are the arguments of If, Then and Else.
	Cmps  []clientv3.Cmp
	Thens []clientv3.Op
	Elses []clientv3.Op

	ctx context.Context
	// txn is the wrapped KV's transaction, built as the caller builds
	// this one, so that it panics on a misuse as clientv3's does.
	txn  clientv3.Txn
	hook func(context.Context, *Txn) (*clientv3.TxnResponse, error)
}

// If implements clientv3.Txn.
func (t *Txn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Cmps, t.txn = append(t.Cmps, cs...), t.txn.If(cs...)
	return t
}

// Then implements clientv3.Txn.
func (t *Txn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Thens, t.txn = append(t.Thens, ops...), t.txn.Then(ops...)
	return t
}

// Else implements clientv3.Txn.
func (t *Txn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Elses, t.txn = append(t.Elses, ops...), t.txn.Else(ops...)
	return t
}

// Commit implements clientv3.Txn: it returns what the hook returns.
func (t *Txn) Commit() (*clientv3.TxnResponse, error) { return t.hook(t.ctx, t) }

// Send sends t to the wrapped KV and returns its answer. Call it once.
func (t *Txn) Send() (*clientv3.TxnResponse, error) { return t.txn.Commit() }

// Has reports whether an operation of t's Thens matches.
func (t *Txn) Has(match func(clientv3.Op) bool) bool {
	for _, op := range t.Thens {
		if match(op) {
			return true
		}
	}
	return false
}

// Writes reports whether t's Thens put or delete a key.
func (t *Txn) Writes() bool {
	return t.Has(func(op clientv3.Op) bool { return op.IsPut() || op.IsDelete() })
}

// ReadOnly reports whether t is a batch of reads: Gets alone, no compare
// and no Else.
func (t *Txn) ReadOnly() bool {
	return len(t.Cmps) == 0 && len(t.Elses) == 0 && !t.Has(func(op clientv3.Op) bool { return !op.IsGet() })
}

// Fault is how Txn.Fail fails a transaction.
type Fault int

const (
	// Refused: not sent; answered as etcd answers a transaction whose
	// compare failed (Succeeded false, no error), so that the caller
	// knows that nothing applied.
	Refused Fault = iota
	// Lost: not sent; failed as a timeout fails it
	// (context.DeadlineExceeded), so that the caller cannot know that
	// nothing applied.
	Lost
	// LostApplied: sent, and when etcd answers, failed as Lost is: it
	// applied, and the caller cannot know it.
	LostApplied
)

func (f Fault) String() string {
	return [...]string{"refused", "unknown outcome, not applied", "unknown outcome, applied"}[f]
}

// ErrInjected is wrapped, beside context.DeadlineExceeded, by the errors
// of the faults Lost and LostApplied.
var ErrInjected = errors.New("etcdtest: injected fault")

// Fail ends t as f says, for a hook to return. When f is LostApplied and
// the wrapped KV fails the transaction, Fail returns that error.
func (t *Txn) Fail(f Fault) (*clientv3.TxnResponse, error) {
	switch f {
	case Refused:
		return &clientv3.TxnResponse{Succeeded: false}, nil
	case LostApplied:
		if _, err := t.Send(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: %w", context.DeadlineExceeded, ErrInjected)
}

// Get is a Get as the code under test called it, shown to Hooks.Get. The
// hook must not modify Opts, the caller's.
type Get struct {
	Key  string
	Opts []clientv3.OpOption

	ctx context.Context
	kv  clientv3.KV
}

// Send sends g to the wrapped KV and returns its answer.
func (g *Get) Send() (*clientv3.GetResponse, error) { return g.kv.Get(g.ctx, g.Key, g.Opts...) }

// Trigger picks one call among those a hook counts: the at-th after Arm.
// Its zero value is disarmed. It is safe for concurrent use.
type Trigger struct {
	// mu guards the fields below.
	mu sync.Mutex
	// at is the count at which Hit fires, 0 for none.
	at    int
	seen  int
	fired bool
}

// Arm makes the n-th next call of Hit, counting from 1, the one that
// fires; n = 0 disarms.
func (tr *Trigger) Arm(n int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.at = 0
	if n > 0 {
		tr.at = tr.seen + n
	}
}

// Hit counts one call and reports whether it is the one armed for.
func (tr *Trigger) Hit() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seen++
	fire := tr.seen == tr.at
	tr.fired = tr.fired || fire
	return fire
}

// Fired reports whether a call of Hit fired.
func (tr *Trigger) Fired() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.fired
}

// Seen returns how many calls Hit counted.
func (tr *Trigger) Seen() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.seen
}

var _ clientv3.Txn = (*Txn)(nil)
