package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/store/etcdstore"
)

// DefaultPageBytes is about how many bytes one range read of Export
// fetches.
const DefaultPageBytes = 4 << 20

// DefaultMaxPageKeys caps one range read of Export: with etcd's largest
// request (1.5 MiB) per value, a read holds at most about 96 MiB even when
// large values follow small ones.
const DefaultMaxPageKeys = 64

// Options configures Export. The zero value means the defaults.
type Options struct {
	// Revision is the etcd revision to read at; 0 means the current one.
	Revision int64
	// PageBytes is about how many bytes one range read fetches, sized
	// from the largest key and value read so far; default
	// DefaultPageBytes.
	PageBytes int
	// MaxPageKeys caps the keys of one range read; default
	// DefaultMaxPageKeys. A read holds at most MaxPageKeys entries of the
	// largest size etcd accepts, whatever came before them.
	MaxPageKeys int
	// Timeout bounds each etcd read; default etcdstore.DefaultTimeout.
	Timeout time.Duration
	// Now stamps Header.Created; default time.Now.
	Now func() time.Time
}

// Export writes a backup of every key under prefix (normalized as
// cluster.Start does), except the ephemeral claims, to w: every key read
// at one revision, in pages, each entry written as it is read. It returns
// the header. A revision that etcd compacted before or during the read
// fails with ErrCompacted; what was written to w is then not a backup (it
// has no trailer).
func Export(ctx context.Context, kv clientv3.KV, prefix string, w io.Writer, opts Options) (Header, error) {
	prefix = cluster.NormalizePrefix(prefix)
	end := clientv3.GetPrefixRangeEnd(prefix)
	rev := opts.Revision
	if opts.PageBytes <= 0 {
		opts.PageBytes = DefaultPageBytes
	}
	if opts.MaxPageKeys <= 0 {
		opts.MaxPageKeys = DefaultMaxPageKeys
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Timeout <= 0 {
		opts.Timeout = etcdstore.DefaultTimeout
	}
	get := func(key string, o ...clientv3.OpOption) (*clientv3.GetResponse, error) {
		if rev > 0 {
			o = append(o, clientv3.WithRev(rev))
		}
		cctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		resp, err := kv.Get(cctx, key, o...)
		if err != nil {
			return nil, exportErr(err)
		}
		return resp, nil
	}
	// The count of every key and of the ephemeral ones, at one revision:
	// the first read fixes it when none was given.
	resp, err := get(prefix, clientv3.WithRange(end), clientv3.WithCountOnly())
	if err != nil {
		return Header{}, err
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	keys := resp.Count
	for _, sub := range cluster.EphemeralPrefixes {
		r, err := get(prefix+sub, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return Header{}, err
		}
		keys -= r.Count
	}
	h := Header{Format: FormatVersion, Prefix: prefix, Revision: rev, Keys: keys, Created: opts.Now().UnixNano()}
	bw, err := NewWriter(w, h)
	if err != nil {
		return Header{}, err
	}
	// A page asks for as many keys as fit PageBytes at the largest entry
	// seen so far (at first: at the largest etcd accepts), and never more
	// than MaxPageKeys.
	largest := int64(etcdstore.DefaultMaxRequestBytes)
	limit := func() int64 { return max(1, min(int64(opts.PageBytes)/largest, int64(opts.MaxPageKeys))) }
	from, seen := prefix, false
	for {
		resp, err := get(from, clientv3.WithRange(end), clientv3.WithLimit(limit()))
		if err != nil {
			return Header{}, err
		}
		for _, e := range resp.Kvs {
			if n := int64(len(e.Key) + len(e.Value)); !seen || n > largest {
				largest, seen = max(n, 1), true
			}
			rel := e.Key[len(prefix):]
			if cluster.Ephemeral(string(rel)) {
				continue
			}
			if err := bw.Add(rel, e.Value); err != nil {
				return Header{}, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return h, bw.Close()
}

func exportErr(err error) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("%w (%v): take the backup again, or keep more history (etcd --auto-compaction-retention)", ErrCompacted, err)
	}
	return fmt.Errorf("backup: read etcd: %w", err)
}
