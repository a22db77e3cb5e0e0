package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store/etcdstore"
)

// ErrLiveNodes reports a Convert refused because nodes are registered or
// hold claims under the prefix (node/<id>, own/<c>): the conversion is
// offline. Stop every node and wait for their leases to end.
var ErrLiveNodes = errors.New("cluster: nodes are registered under the prefix")

// ConvertOptions configures Convert. The zero value means the defaults.
type ConvertOptions struct {
	// MaxTxnOps and MaxRequestBytes are the etcd cluster's limits;
	// defaults etcdstore.DefaultMaxTxnOps and DefaultMaxRequestBytes.
	MaxTxnOps       int
	MaxRequestBytes int
}

// ConvertSummary describes a finished Convert.
type ConvertSummary struct {
	// Already is set when the prefix had a format key before the call
	// (FormatVersion, or FormatPerEntry, which a node's start moves on):
	// nothing was written.
	Already bool
	// Format is the format the prefix has after the call.
	Format int
	// Sealed counts the values this call sealed, Verified those found
	// sealed already (a value restored from a checksummed backup, or
	// sealed by a conversion whose progress a cut lost), and Txns the
	// transactions it committed.
	Sealed, Verified int64
	Txns             int
}

// convertReserve is what a conversion transaction needs beside its values.
const convertReserve = 64 << 10

// Convert rewrites a cluster prefix written before checksums (no
// FormatKey) into FormatVersion: every value sealed under its key, then
// the format key written. It is offline: it refuses a prefix with a node
// registered or a claim held (ErrLiveNodes), a restore's marker, or a
// newer format, and while it runs the prefix holds RestoringKey (so that
// an older binary neither starts nor claims) and ConvertingKey (so that
// this version's Start refuses with a message naming the conversion).
//
// It is resumable and safe to cut at any point: every transaction seals
// a run of keys in key order and records the last one in ConvertingKey,
// comparing that key's revision as read (a second Convert racing this one
// fails instead of interleaving) and each value's revision (a value
// changed since it was read is not overwritten); a run cut anywhere is
// continued by the next call from the last key recorded. A value that
// already verifies under its key is left as it is, so a prefix is never
// sealed twice. The last transaction deletes both markers and writes the
// format key (with an ordinal counter at 0 if the prefix had none, which
// an older binary cannot parse). On a prefix that has FormatVersion it
// does nothing (Already).
func Convert(ctx context.Context, kv clientv3.KV, prefix string, opts ConvertOptions) (ConvertSummary, error) {
	prefix = NormalizePrefix(prefix)
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = etcdstore.DefaultMaxTxnOps
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = etcdstore.DefaultMaxRequestBytes
	}
	var sum ConvertSummary
	fk, ck := prefix+FormatKey, prefix+ConvertingKey
	resp, err := kv.Txn(ctx).Then(clientv3.OpGet(fk), clientv3.OpGet(ck), clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return sum, fmt.Errorf("cluster: convert: read %s: %w", prefix, err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		v, err := parseFormat(kvs[0].Value)
		if err != nil {
			return sum, fmt.Errorf("cluster: convert %s: %w", prefix, err)
		}
		sum.Already, sum.Format = true, v
		return sum, nil
	}
	sum.Format = FormatVersion
	if resp.Responses[2].GetResponseRange().Count == 0 {
		return sum, fmt.Errorf("cluster: convert: nothing under %s (check the prefix; a new cluster needs no conversion)", prefix)
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
		if err := beginConvert(ctx, kv, prefix); err != nil {
			return sum, err
		}
		sum.Txns++
	}
	for {
		resp, err := kv.Get(ctx, ck)
		if err != nil {
			return sum, fmt.Errorf("cluster: convert: read %s: %w", ck, err)
		}
		if len(resp.Kvs) == 0 {
			return sum, fmt.Errorf("cluster: convert: %s vanished: another conversion finished or a writer removed it", ck)
		}
		last, err := UnsealRel(ConvertingKey, resp.Kvs[0].Value)
		if err != nil {
			return sum, fmt.Errorf("cluster: convert: %w", err)
		}
		progress := resp.Kvs[0].ModRevision
		from := prefix
		if len(last) > 0 {
			from = prefix + string(last) + "\x00"
		}
		page, err := kv.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(int64(opts.MaxTxnOps)))
		if err != nil {
			return sum, fmt.Errorf("cluster: convert: read after %q: %w", last, err)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ck), "=", progress)}
		var puts []clientv3.Op
		size, sealed, verified, upTo := 0, 0, 0, ""
		for _, e := range page.Kvs {
			rel := strings.TrimPrefix(string(e.Key), prefix)
			n := 2*len(e.Key) + len(e.Value) + etcdstore.SealOverhead + 64
			if upTo != "" && (len(cmps)+2 > opts.MaxTxnOps || size+n > opts.MaxRequestBytes-convertReserve) {
				break
			}
			upTo = rel
			switch {
			case rel == ConvertingKey || rel == RestoringKey:
				// The markers of this conversion, written sealed.
			case Ephemeral(rel):
				return sum, fmt.Errorf("%w: %s appeared during the conversion", ErrLiveNodes, e.Key)
			default:
				if _, err := UnsealRel(rel, e.Value); err == nil {
					verified++
					continue
				}
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(e.Key)), "=", e.ModRevision))
				puts = append(puts, clientv3.OpPut(string(e.Key), SealRel(rel, e.Value)))
				size += n
				sealed++
			}
		}
		if upTo == "" {
			break
		}
		puts = append(puts, clientv3.OpPut(ck, SealRel(ConvertingKey, []byte(upTo))))
		r, err := kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return sum, fmt.Errorf("cluster: convert: seal up to %q: %w (run again to resume)", upTo, err)
		}
		if !r.Succeeded {
			return sum, fmt.Errorf("cluster: convert: %s changed while converting (another conversion, or a writer); nothing of this step was written (run again to resume)", prefix)
		}
		sum.Txns++
		sum.Sealed += int64(sealed)
		sum.Verified += int64(verified)
	}
	if err := finishConvert(ctx, kv, prefix); err != nil {
		return sum, err
	}
	sum.Txns++
	return sum, nil
}

// beginConvert creates the conversion's markers, comparing that no node is
// registered, no claim held, no restore or conversion running and no
// format key written.
func beginConvert(ctx context.Context, kv clientv3.KV, prefix string) error {
	fk, ck, rk := prefix+FormatKey, prefix+ConvertingKey, prefix+RestoringKey
	r, err := kv.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(prefix+"node/"), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(prefix+"own/"), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(rk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ck), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(fk), "=", 0),
	).Then(
		clientv3.OpPut(ck, SealRel(ConvertingKey, nil)),
		clientv3.OpPut(rk, SealRel(RestoringKey, fmt.Appendf(nil, "converting to format %d", FormatVersion))),
	).Commit()
	if err != nil {
		return fmt.Errorf("cluster: convert: begin: %w (run again)", err)
	}
	if r.Succeeded {
		return nil
	}
	resp, err := kv.Txn(ctx).Then(
		clientv3.OpGet(prefix+"node/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(prefix+"own/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(rk, clientv3.WithCountOnly()),
	).Commit()
	switch {
	case err != nil:
		return fmt.Errorf("cluster: convert: begin: %w", err)
	case resp.Responses[0].GetResponseRange().Count+resp.Responses[1].GetResponseRange().Count > 0:
		return fmt.Errorf("%w: %s holds %d live-node and %d ownership keys; stop every node, wait for their leases to end (--lease-ttl), and run again",
			ErrLiveNodes, prefix, resp.Responses[0].GetResponseRange().Count, resp.Responses[1].GetResponseRange().Count)
	case resp.Responses[2].GetResponseRange().Count > 0:
		return fmt.Errorf("%w: %s exists; let the restore finish, or delete the prefix and restore again", ErrRestoring, rk)
	}
	return fmt.Errorf("cluster: convert: %s changed while the conversion began (another conversion?); run again", prefix)
}

// finishConvert writes the format key and deletes the markers, in one
// transaction that compares the progress key as read.
func finishConvert(ctx context.Context, kv clientv3.KV, prefix string) error {
	fk, ck, rk, ok := prefix+FormatKey, prefix+ConvertingKey, prefix+RestoringKey, prefix+"ordinals"
	resp, err := kv.Txn(ctx).Then(clientv3.OpGet(ck, clientv3.WithKeysOnly()), clientv3.OpGet(ok, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return fmt.Errorf("cluster: convert: finish: %w (run again)", err)
	}
	prog := resp.Responses[0].GetResponseRange().Kvs
	if len(prog) == 0 {
		return fmt.Errorf("cluster: convert: %s vanished before the last step", ck)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ck), "=", prog[0].ModRevision)}
	puts := []clientv3.Op{
		clientv3.OpDelete(ck), clientv3.OpDelete(rk),
		clientv3.OpPut(fk, SealRel(FormatKey, []byte(strconv.Itoa(FormatVersion)))),
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(ok), "=", 0))
		puts = append(puts, clientv3.OpPut(ok, SealRel("ordinals", []byte("0"))))
	}
	r, err := kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return fmt.Errorf("cluster: convert: finish: %w (run again)", err)
	}
	if !r.Succeeded {
		return fmt.Errorf("cluster: convert: %s changed before the last step (another conversion?); run again", prefix)
	}
	return nil
}
