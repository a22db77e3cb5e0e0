package backup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store/etcdstore"
)

// errUnsupported reports a read a Snapshot does not serve (a range stream).
var errUnsupported = errors.New("backup: not supported by a backup file's view")

// Snapshot is a backup file's contents as a read-only clientv3.KV: keys
// are the header's prefix plus each entry's key, every read is served at
// the header's revision, and every write fails with etcdstore.ErrReadOnly.
// It is what the offline tools read a backup through (cluster.OpenView),
// so that a backup is verified by the same code as a live data set,
// without etcd. It holds the whole data set in memory.
type Snapshot struct {
	hdr  Header
	kvs  []*mvccpb.KeyValue
	keys [][]byte // kvs' keys, for the binary searches
}

var _ clientv3.KV = (*Snapshot)(nil)

// Load reads and checks the whole backup r.
func Load(r io.Reader) (*Snapshot, error) {
	br, err := NewReader(r)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{hdr: br.Header()}
	for {
		e, err := br.Next()
		if err == io.EOF {
			return s, nil
		}
		if err != nil {
			return nil, err
		}
		key := append([]byte(s.hdr.Prefix), e.Key...)
		s.kvs = append(s.kvs, &mvccpb.KeyValue{Key: key, Value: e.Value, CreateRevision: s.hdr.Revision, ModRevision: s.hdr.Revision, Version: 1})
		s.keys = append(s.keys, key)
	}
}

// Header returns the backup's header.
func (s *Snapshot) Header() Header { return s.hdr }

// Get serves a range read from the backup: one key, or [key, end) with
// WithRange or WithPrefix, limited, keys only or count only, in key order.
// A sorted read is served as the one sort the store asks for, the last
// key of a range (descending by key, limited to one: a stream's last run,
// the run holding a seq); clientv3 does not expose an op's sort, so any
// other sorted read is not served, nor is a revision other than the
// backup's.
func (s *Snapshot) Get(_ context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	if rev := op.Rev(); rev != 0 && rev != s.hdr.Revision {
		return nil, errUnsupported
	}
	descend := op.IsSortSet()
	if descend && (op.Limit() != 1 || op.IsCountOnly()) {
		return nil, errUnsupported
	}
	from := op.KeyBytes()
	end := op.RangeBytes()
	lo := sort.Search(len(s.keys), func(i int) bool { return bytes.Compare(s.keys[i], from) >= 0 })
	hi := lo
	switch {
	case len(end) == 0:
		if lo < len(s.keys) && bytes.Equal(s.keys[lo], from) {
			hi = lo + 1
		}
	case len(end) == 1 && end[0] == 0:
		hi = len(s.keys)
	default:
		hi = sort.Search(len(s.keys), func(i int) bool { return bytes.Compare(s.keys[i], end) >= 0 })
	}
	hi = max(hi, lo)
	resp := &clientv3.GetResponse{Header: &pb.ResponseHeader{Revision: s.hdr.Revision}, Count: int64(hi - lo)}
	if op.IsCountOnly() {
		return resp, nil
	}
	n := hi - lo
	if l := op.Limit(); l > 0 && int64(n) > l {
		n, resp.More = int(l), true
	}
	sel := s.kvs[lo : lo+n]
	if descend {
		sel = slices.Clone(s.kvs[hi-n : hi])
		slices.Reverse(sel)
	}
	for _, kv := range sel {
		c := &mvccpb.KeyValue{Key: bytes.Clone(kv.Key), Value: bytes.Clone(kv.Value), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version}
		if op.IsKeysOnly() {
			c.Value = nil
		}
		resp.Kvs = append(resp.Kvs, c)
	}
	return resp, nil
}

// GetStream is not served.
func (s *Snapshot) GetStream(context.Context, string, ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	return nil, errUnsupported
}

// Put fails with etcdstore.ErrReadOnly.
func (s *Snapshot) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return nil, etcdstore.ErrReadOnly
}

// Delete fails with etcdstore.ErrReadOnly.
func (s *Snapshot) Delete(context.Context, string, ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return nil, etcdstore.ErrReadOnly
}

// Compact fails with etcdstore.ErrReadOnly.
func (s *Snapshot) Compact(context.Context, int64, ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return nil, etcdstore.ErrReadOnly
}

// Do fails: a write with etcdstore.ErrReadOnly, a read as not served.
func (s *Snapshot) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if !op.IsGet() {
		return clientv3.OpResponse{}, etcdstore.ErrReadOnly
	}
	return clientv3.OpResponse{}, errUnsupported
}

// Txn returns a transaction whose Commit fails with etcdstore.ErrReadOnly.
func (s *Snapshot) Txn(ctx context.Context) clientv3.Txn {
	return etcdstore.AtRevision(s, s.hdr.Revision).Txn(ctx)
}
