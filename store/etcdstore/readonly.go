package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrReadOnly reports a write (Put, Delete, Txn, Compact, or a Do of one)
// through a KV made by AtRevision. Nothing is sent to etcd.
var ErrReadOnly = errors.New("etcdstore: read-only view")

// AtRevision returns a clientv3.KV that serves every Get of kv at revision
// rev, and refuses every write with ErrReadOnly without sending it: the
// view of the offline tools, which must see one consistent state of a live
// data set and must change nothing. A Get whose revision etcd has
// compacted away fails with rpctypes.ErrCompacted.
func AtRevision(kv clientv3.KV, rev int64) clientv3.KV { return pinnedKV{kv: kv, rev: rev} }

type pinnedKV struct {
	kv  clientv3.KV
	rev int64
}

func (p pinnedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	opts = append(opts[:len(opts):len(opts)], clientv3.WithRev(p.rev))
	return p.kv.Get(ctx, key, opts...)
}

func (p pinnedKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	opts = append(opts[:len(opts):len(opts)], clientv3.WithRev(p.rev))
	return p.kv.GetStream(ctx, key, opts...)
}

func (p pinnedKV) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return nil, ErrReadOnly
}

func (p pinnedKV) Delete(context.Context, string, ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return nil, ErrReadOnly
}

func (p pinnedKV) Compact(context.Context, int64, ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return nil, ErrReadOnly
}

func (p pinnedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if !op.IsGet() {
		return clientv3.OpResponse{}, ErrReadOnly
	}
	resp, err := p.Get(ctx, string(op.KeyBytes()), getOptions(op)...)
	if err != nil {
		return clientv3.OpResponse{}, err
	}
	return resp.OpResponse(), nil
}

func (p pinnedKV) Txn(context.Context) clientv3.Txn { return refusedTxn{} }

// OpAtRevision returns Get op op read at revision rev instead, with the
// options of op that the store's reads use (getOptions): what a member
// behind the cluster answers op with, for a test's model of one.
func OpAtRevision(op clientv3.Op, rev int64) clientv3.Op {
	return clientv3.OpGet(string(op.KeyBytes()), append(getOptions(op), clientv3.WithRev(rev))...)
}

// getOptions rebuilds the options of a Get op that the store's reads use:
// range, limit, keys or count only, serializable (sorting and revision
// filters are not carried over; the store does not use them).
func getOptions(op clientv3.Op) []clientv3.OpOption {
	var opts []clientv3.OpOption
	if end := op.RangeBytes(); len(end) > 0 {
		opts = append(opts, clientv3.WithRange(string(end)))
	}
	if op.Limit() > 0 {
		opts = append(opts, clientv3.WithLimit(op.Limit()))
	}
	if op.IsKeysOnly() {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	if op.IsCountOnly() {
		opts = append(opts, clientv3.WithCountOnly())
	}
	if op.IsSerializable() {
		opts = append(opts, clientv3.WithSerializable())
	}
	return opts
}

// refusedTxn is the Txn of a read-only view: Commit fails with ErrReadOnly.
type refusedTxn struct{}

func (t refusedTxn) If(...clientv3.Cmp) clientv3.Txn        { return t }
func (t refusedTxn) Then(...clientv3.Op) clientv3.Txn       { return t }
func (t refusedTxn) Else(...clientv3.Op) clientv3.Txn       { return t }
func (t refusedTxn) Commit() (*clientv3.TxnResponse, error) { return nil, ErrReadOnly }

// OpenKV is Open on a bare clientv3.KV (AtRevision, a backup file's
// contents, or a test's interposer): the Store reads and writes through kv
// only.
func OpenKV(kv clientv3.KV, opts Options) *Store { return open(kv, nil, opts) }

// Scopes returns every non-global scope that has at least one key, in key
// order, reading one key per scope (each read skips past the scope's whole
// range), so that listing costs one round trip per scope, not per key.
func (s *Store) Scopes(ctx context.Context) ([]string, error) {
	base := s.lay.prefix + "c/"
	from, end := base, clientv3.GetPrefixRangeEnd(base)
	var out []string
	for {
		resp, err := s.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			return nil, fmt.Errorf("etcdstore: list scopes: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return out, nil
		}
		rest := string(resp.Kvs[0].Key[len(base):])
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			return nil, fmt.Errorf("%w: key %q is in no scope", ErrCorrupt, resp.Kvs[0].Key)
		}
		out = append(out, rest[:i])
		from = clientv3.GetPrefixRangeEnd(s.lay.base(rest[:i]))
	}
}
