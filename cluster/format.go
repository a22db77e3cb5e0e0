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

// The format of a cluster's values. Every value under the cluster prefix is
// sealed (etcdstore.Seal: its body, a tag byte and a CRC-32C of the key and
// body), the data under d/ relative to d/ (the etcd store's own root), the
// cluster's own keys relative to the prefix. FormatKey, written when the
// cluster is created, says so; a cluster without it was written by a
// version before sums and is converted offline (Convert) before a node of
// this version serves it, so that no node ever mixes sealed and bare
// values.
const (
	// FormatKey, under the cluster prefix, holds the format version in
	// decimal, sealed. It is created with the cluster (Start on an empty
	// prefix) or by the last transaction of Convert.
	FormatKey = "format"
	// ConvertingKey exists while Convert rewrites the prefix: it holds
	// the last key (relative to the prefix) converted, sealed.
	ConvertingKey = "converting"
	// FormatVersion is the format this build writes and reads.
	FormatVersion = 1
	// DataPrefix is the prefix, relative to the cluster prefix, of the
	// etcd store's keys (the data).
	DataPrefix = "d/"
	// convertCommand is what an operator runs on a cluster without a
	// format key.
	convertCommand = "participantctl convert-etcd"
)

// Format errors. Start and the offline tools refuse a prefix for either.
var (
	// ErrUnconverted reports a cluster prefix that holds keys but no
	// FormatKey: a data set written by a version before checksums, or one
	// whose conversion was cut. It is converted offline (Convert) first.
	ErrUnconverted = errors.New("cluster: the data set in etcd predates checksums and must be converted")
	// ErrNewerFormat reports a FormatKey of a version this build does not
	// know: a newer participantd wrote the cluster.
	ErrNewerFormat = errors.New("cluster: the data set in etcd has a newer format")
)

// SealRel returns body sealed as it is stored at rel, a key relative to the
// cluster prefix: the data (under DataPrefix) relative to the etcd store's
// root, every other key relative to the prefix.
func SealRel(rel string, body []byte) string {
	if d, ok := strings.CutPrefix(rel, DataPrefix); ok {
		return etcdstore.Seal(d, body)
	}
	return etcdstore.Seal(rel, body)
}

// UnsealRel returns the body of sealed, the value stored at rel (relative
// to the cluster prefix), or a *store.ChecksumError (errors.Is
// store.ErrCorrupt). The body is a sub-slice of sealed.
func UnsealRel(rel string, sealed []byte) ([]byte, error) {
	if d, ok := strings.CutPrefix(rel, DataPrefix); ok {
		return etcdstore.Unseal(DataPrefix, d, sealed)
	}
	return etcdstore.Unseal("", rel, sealed)
}

// seal returns body sealed as stored at key, a key of the cluster prefix.
func (n *Node) seal(key string, body []byte) string {
	return SealRel(strings.TrimPrefix(key, n.opts.Prefix), body)
}

// unseal returns the body of the value stored at key (a key of the cluster
// prefix), or a *store.ChecksumError.
func (n *Node) unseal(key string, sealed []byte) ([]byte, error) {
	return UnsealRel(strings.TrimPrefix(key, n.opts.Prefix), sealed)
}

// errEmptyPrefix is readFormat's answer for a prefix that holds nothing:
// a new cluster.
var errEmptyPrefix = errors.New("cluster: empty prefix")

// CheckFormat reports whether the data set under prefix (normalized as
// Start does), read through kv, has the format this build reads: nil for
// FormatVersion or for an empty prefix, ErrUnconverted (naming the
// conversion command) for keys without a format key or a conversion cut,
// ErrNewerFormat, or a *store.ChecksumError for a damaged format key.
func CheckFormat(ctx context.Context, kv clientv3.KV, prefix string) error {
	err := readFormat(ctx, kv, NormalizePrefix(prefix))
	if errors.Is(err, errEmptyPrefix) {
		return nil
	}
	return err
}

// readFormat is CheckFormat, with errEmptyPrefix for an empty prefix.
//
// A restore writes the format key among its keys while its marker exists
// (created with its first keys, deleted with its last), so keys found
// without a format key are a restore's when the marker is there after
// they were counted, or else the format key is there once it ends; only
// keys with neither are a data set before checksums.
func readFormat(ctx context.Context, kv clientv3.KV, prefix string) error {
	format := func() (bool, error) {
		resp, err := kv.Get(ctx, prefix+FormatKey)
		if err != nil {
			return false, fmt.Errorf("cluster: read the format key: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return false, nil
		}
		if err := ParseFormat(resp.Kvs[0].Value); err != nil {
			return true, fmt.Errorf("%s: %w", prefix, err)
		}
		return true, nil
	}
	count := func(key string, opts ...clientv3.OpOption) (int64, error) {
		resp, err := kv.Get(ctx, key, append(opts, clientv3.WithCountOnly())...)
		if err != nil {
			return 0, fmt.Errorf("cluster: read the format key: %w", err)
		}
		return resp.Count, nil
	}
	if ok, err := format(); ok || err != nil {
		return err
	}
	if n, err := count(prefix + ConvertingKey); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: a conversion of %s was cut (%s%s exists); run `%s` again to finish it", ErrUnconverted, prefix, prefix, ConvertingKey, convertCommand)
	}
	keys, err := count(prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	if keys == 0 {
		return errEmptyPrefix
	}
	if n, err := count(prefix + RestoringKey); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: %s%s exists; let the restore finish, or delete the prefix and restore again", ErrRestoring, prefix, RestoringKey)
	}
	if ok, err := format(); ok || err != nil {
		return err
	}
	return fmt.Errorf("%w: %s holds %d keys and no %s key; stop every node, wait for their leases to end, and run `%s --etcd-prefix %s` (see docs/operations.md, Upgrading)",
		ErrUnconverted, prefix, keys, FormatKey, convertCommand, prefix)
}

// ParseFormat checks raw, a value of FormatKey: nil for FormatVersion,
// ErrNewerFormat, or a *store.ChecksumError. The version's decimal digits
// are read before the seal is checked, so that a newer format is named as
// such even if it seals otherwise.
func ParseFormat(raw []byte) error {
	i := 0
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i < 9 {
		i++
	}
	if v, err := strconv.Atoi(string(raw[:i])); err == nil && v > FormatVersion {
		return fmt.Errorf("%w: its %s key says format %d, this build reads format %d; run a participantd of that version or later", ErrNewerFormat, FormatKey, v, FormatVersion)
	}
	body, err := UnsealRel(FormatKey, raw)
	if err != nil {
		return fmt.Errorf("cluster: the format key: %w", err)
	}
	if string(body) != strconv.Itoa(FormatVersion) {
		return fmt.Errorf("%w: its %s key holds %q, this build reads format %d", ErrNewerFormat, FormatKey, body, FormatVersion)
	}
	return nil
}

// ensureFormat makes sure the cluster prefix has this build's format: it
// creates a new cluster's format key (with its ordinal counter at 0, so
// that an older binary, which parses the counter as bare decimal, refuses
// the cluster at its start instead of writing bare values into it) in one
// transaction that compares the prefix still empty, and refuses a prefix
// that holds keys without a format key, or a newer format.
func (n *Node) ensureFormat(ctx context.Context) error {
	for range 3 {
		cctx, cancel := n.ctx(ctx)
		err := readFormat(cctx, n.cli, n.opts.Prefix)
		cancel()
		if !errors.Is(err, errEmptyPrefix) {
			return err
		}
		fk, ok := n.key(FormatKey), n.key("ordinals")
		cctx, cancel = n.ctx(ctx)
		resp, err := n.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(n.opts.Prefix), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(fk, n.seal(fk, []byte(strconv.Itoa(FormatVersion)))), clientv3.OpPut(ok, n.seal(ok, []byte("0")))).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("cluster: create the format key: %w", err)
		}
		if resp.Succeeded {
			n.log.Info().Int("format", FormatVersion).Msg("created the cluster's format key")
			return nil
		}
		// Another node (or writer) got in first: read what it wrote.
	}
	return errors.New("cluster: create the format key: the prefix keeps changing")
}
