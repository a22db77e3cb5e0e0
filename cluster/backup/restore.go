package backup

import (
	"bytes"
	"context"
	"fmt"
	"io"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/store/etcdstore"
)

// RestoreOptions configures Restore. The zero value means the defaults.
type RestoreOptions struct {
	// MaxTxnOps and MaxRequestBytes are the etcd cluster's limits;
	// defaults etcdstore.DefaultMaxTxnOps and DefaultMaxRequestBytes.
	MaxTxnOps       int
	MaxRequestBytes int
	// ReplaceNodeKey lets the backup's node key replace another one the
	// target prefix holds; without it that restore is ErrNodeKeyDiffers.
	ReplaceNodeKey bool
}

// Summary describes a finished restore.
type Summary struct {
	Header Header
	// Keys is how many keys were written; Txns in how many transactions.
	Keys int64
	Txns int
}

// txnReserve is what a transaction needs beside its keys and values.
const txnReserve = 64 << 10

// Restore writes the backup src into the EMPTY prefix (normalized as
// cluster.Start does) of kv. It first reads src whole to check it (Check:
// nothing is written from a damaged file), then refuses a prefix that holds
// any key (ErrNotEmpty) but the node key (NodeKeyKey), then writes the
// entries in transactions within the limits, each creating its keys only
// where absent. The first transaction also creates cluster.RestoringKey,
// and commits only if the prefix is still empty then but for the node key
// it read (no live node, claim or key of any writer); the last deletes the
// marker. Until then no node starts on the prefix, and a node that started
// before the first transaction claims no conversation
// (cluster.ErrRestoring): no node serves a half-restored data set. A
// restore that fails midway leaves the marker: delete the prefix and
// restore again.
//
// A node key the prefix holds is the cluster's identity, which every
// credential and invitation was derived from: kept across a wipe, it makes
// a backup that carries another key (a crafted one, or another cluster's)
// ErrNodeKeyDiffers, with nothing written, unless opts.ReplaceNodeKey. A
// backup with the same key, or none, restores around it.
//
// The keys are written relative to prefix, which need not be the backup's.
func Restore(ctx context.Context, kv clientv3.KV, prefix string, src io.ReadSeeker, opts RestoreOptions) (Summary, error) {
	prefix = cluster.NormalizePrefix(prefix)
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = etcdstore.DefaultMaxTxnOps
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = etcdstore.DefaultMaxRequestBytes
	}
	// One read checks the file whole and finds its node key.
	_, theirs, err := check(src)
	if err != nil {
		return Summary{}, err
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return Summary{}, err
	}
	keyKey := prefix + NodeKeyKey
	resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(1))
	if err != nil {
		return Summary{}, fmt.Errorf("backup: read the target prefix: %w", err)
	}
	var held []byte // the node key the prefix holds, if any
	var heldRev int64
	switch {
	case resp.Count == 1 && string(resp.Kvs[0].Key) == keyKey:
		held, heldRev = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
	case resp.Count > 0:
		return Summary{}, fmt.Errorf("%w: %s holds %d keys; restore only into an empty prefix (or one holding only its node key)", ErrNotEmpty, prefix, resp.Count)
	}
	// keepHeld: the held key stays, and the backup's is not written.
	keepHeld := held != nil
	switch {
	case held == nil || theirs == nil || bytes.Equal(theirs, held):
	case bytes.Equal(nodeKeyBody(theirs), nodeKeyBody(held)):
		// The same key in the other format (one side before checksums):
		// the backup's is written, so that the prefix has one format.
		keepHeld = false
	default:
		if !opts.ReplaceNodeKey {
			return Summary{}, fmt.Errorf("%w: %s holds a node key that differs from the backup's; restoring would void every credential and invitation of that key (allow it explicitly to replace it)", ErrNodeKeyDiffers, prefix)
		}
		keepHeld = false
	}
	br, err := NewReader(src)
	if err != nil {
		return Summary{}, err
	}
	sum := Summary{Header: br.Header()}
	marker := prefix + cluster.RestoringKey
	// The first transaction creates the marker and compares that the
	// whole prefix is still empty, in etcd, at its commit: the count above
	// is only a friendly early refusal. A node that registered (node/),
	// claimed (own/) or wrote anything since, or a second restore racing
	// this one, makes it fail with nothing written; a node that registers
	// after it finds the marker in its claim transactions and claims
	// nothing until the last transaction deletes it.
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithRange(keyKey),
		clientv3.Compare(clientv3.CreateRevision(keyKey+"\x00"), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.Compare(clientv3.ModRevision(keyKey), "=", heldRev),
		clientv3.Compare(clientv3.CreateRevision(marker), "=", 0),
	}
	puts := []clientv3.Op{clientv3.OpPut(marker, cluster.SealRel(cluster.RestoringKey, fmt.Appendf(nil, "restoring a backup at revision %d", sum.Header.Revision)))}
	size := 2*len(marker) + 64
	commit := func() error {
		r, err := kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return fmt.Errorf("backup: restore after %d keys: %w", sum.Keys, err)
		}
		if !r.Succeeded {
			return fmt.Errorf("%w: another writer created keys under %s during the restore (after %d keys)", ErrNotEmpty, prefix, sum.Keys)
		}
		sum.Txns++
		cmps, puts, size = cmps[:0], puts[:0], 0
		return nil
	}
	for {
		e, err := br.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			// Checked above: the file changed since.
			return sum, err
		}
		if cluster.Ephemeral(string(e.Key)) || string(e.Key) == cluster.RestoringKey {
			// A claim is not data (Export leaves claims out), and the
			// marker of a restore that was running at the backup's
			// revision is not this restore's.
			continue
		}
		key := prefix + string(e.Key)
		if key == keyKey && keepHeld {
			continue
		}
		n := 2*len(key) + len(e.Value) + 64
		// Compares outnumber puts in the first transaction (the empty
		// prefix), so they are what the limit is checked on.
		if len(puts) > 0 && (len(cmps)+1 > opts.MaxTxnOps || size+n > opts.MaxRequestBytes-txnReserve) {
			if err := commit(); err != nil {
				return sum, err
			}
		}
		if key == keyKey {
			// Absent (0) or the held key being replaced, as read.
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", heldRev))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		}
		puts = append(puts, clientv3.OpPut(key, string(e.Value)))
		size += n
		sum.Keys++
	}
	if len(puts) > 0 && len(cmps)+1 > opts.MaxTxnOps {
		if err := commit(); err != nil {
			return sum, err
		}
	}
	if sum.Txns == 0 {
		// One transaction in all: it need not create the marker at all,
		// only compare that no other restore did.
		puts = puts[1:]
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(marker), ">", 0))
		puts = append(puts, clientv3.OpDelete(marker))
	}
	if err := commit(); err != nil {
		return sum, err
	}
	return sum, nil
}

// nodeKeyBody returns the node key stored as v: its body when v verifies
// under its checksum, else v as it is (a prefix or backup from before
// checksums).
func nodeKeyBody(v []byte) []byte {
	if body, err := cluster.UnsealRel(NodeKeyKey, v); err == nil {
		return body
	}
	return v
}
