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
)

// DefaultPageBytes is about how many bytes one range read of Export
// fetches.
const DefaultPageBytes = 4 << 20

// Options configures Export. The zero value means the defaults.
type Options struct {
	// Revision is the etcd revision to read at; 0 means the current one.
	Revision int64
	// PageBytes is about how many bytes one range read fetches (sized
	// from the average key and value read so far); default
	// DefaultPageBytes.
	PageBytes int
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
	if opts.PageBytes <= 0 {
		opts.PageBytes = DefaultPageBytes
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	rev := opts.Revision
	withRev := func(o ...clientv3.OpOption) []clientv3.OpOption {
		if rev > 0 {
			o = append(o, clientv3.WithRev(rev))
		}
		return o
	}
	// The count of every key and of the ephemeral ones, at one revision:
	// the first read fixes it when none was given.
	resp, err := kv.Get(ctx, prefix, withRev(clientv3.WithRange(end), clientv3.WithCountOnly())...)
	if err != nil {
		return Header{}, exportErr(err)
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	keys := resp.Count
	for _, sub := range []string{"own/", "node/"} {
		r, err := kv.Get(ctx, prefix+sub, withRev(clientv3.WithPrefix(), clientv3.WithCountOnly())...)
		if err != nil {
			return Header{}, exportErr(err)
		}
		keys -= r.Count
	}
	h := Header{Format: FormatVersion, Prefix: prefix, Revision: rev, Keys: keys, Created: opts.Now().UnixNano()}
	bw, err := NewWriter(w, h)
	if err != nil {
		return Header{}, err
	}
	from, limit, seen, seenBytes := prefix, int64(64), int64(0), int64(0)
	for {
		resp, err := kv.Get(ctx, from, withRev(clientv3.WithRange(end), clientv3.WithLimit(limit))...)
		if err != nil {
			return Header{}, exportErr(err)
		}
		for _, e := range resp.Kvs {
			seen++
			seenBytes += int64(len(e.Key) + len(e.Value))
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
		// The next page holds about PageBytes at the average size so far.
		limit = max(1, min(int64(opts.PageBytes)/max(1, seenBytes/seen), 4096))
	}
	return h, bw.Close()
}

func exportErr(err error) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("%w (%v): take the backup again, or keep more history (etcd --auto-compaction-retention)", ErrCompacted, err)
	}
	return fmt.Errorf("backup: read etcd: %w", err)
}
