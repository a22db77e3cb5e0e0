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
	// FormatVersion is the format this build writes: every value sealed,
	// each commit's entries of a stream one key (etcdstore's runs,
	// layout 2).
	FormatVersion = 2
	// FormatPerEntry is the format before runs: every value sealed, one
	// key per stream entry and a length key per stream (etcdstore's
	// layout 1). This build reads it (the store reads either layout), and
	// a node's start moves a cluster of it to FormatVersion while no node
	// is registered (upgradeFormat), so that no older node ever meets a
	// run it would misread.
	FormatPerEntry = 1
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
// FormatVersion, FormatPerEntry or an empty prefix, ErrUnconverted (naming the
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
	_, err := readFormatVersion(ctx, kv, prefix)
	return err
}

// readFormatVersion is readFormat that also returns the version read.
func readFormatVersion(ctx context.Context, kv clientv3.KV, prefix string) (int, error) {
	version := 0
	format := func() (bool, error) {
		resp, err := kv.Get(ctx, prefix+FormatKey)
		if err != nil {
			return false, fmt.Errorf("cluster: read the format key: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return false, nil
		}
		v, err := parseFormat(resp.Kvs[0].Value)
		if err != nil {
			return true, fmt.Errorf("%s: %w", prefix, err)
		}
		version = v
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
		return version, err
	}
	if n, err := count(prefix + ConvertingKey); err != nil || n > 0 {
		if err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: a conversion of %s was cut (%s%s exists); run `%s` again to finish it", ErrUnconverted, prefix, prefix, ConvertingKey, convertCommand)
	}
	keys, err := count(prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	if keys == 0 {
		return 0, errEmptyPrefix
	}
	if n, err := count(prefix + RestoringKey); err != nil || n > 0 {
		if err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s%s exists; let the restore finish, or delete the prefix and restore again", ErrRestoring, prefix, RestoringKey)
	}
	if ok, err := format(); ok || err != nil {
		return version, err
	}
	return 0, fmt.Errorf("%w: %s holds %d keys and no %s key; stop every node, wait for their leases to end, and run `%s --etcd-prefix %s` (see docs/operations.md, Upgrading)",
		ErrUnconverted, prefix, keys, FormatKey, convertCommand, prefix)
}

// ParseFormat checks raw, a value of FormatKey: nil for a format this
// build reads (FormatVersion, FormatPerEntry), ErrNewerFormat, or a
// *store.ChecksumError. The version's decimal digits are read before the
// seal is checked, so that a newer format is named as such even if it
// seals otherwise.
func ParseFormat(raw []byte) error {
	_, err := parseFormat(raw)
	return err
}

// parseFormat is ParseFormat that also returns the version.
func parseFormat(raw []byte) (int, error) {
	i := 0
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i < 9 {
		i++
	}
	if v, err := strconv.Atoi(string(raw[:i])); err == nil && v > FormatVersion {
		return 0, fmt.Errorf("%w: its %s key says format %d, this build reads format %d; run a participantd of that version or later", ErrNewerFormat, FormatKey, v, FormatVersion)
	}
	body, err := UnsealRel(FormatKey, raw)
	if err != nil {
		return 0, fmt.Errorf("cluster: the format key: %w", err)
	}
	switch string(body) {
	case strconv.Itoa(FormatVersion):
		return FormatVersion, nil
	case strconv.Itoa(FormatPerEntry):
		return FormatPerEntry, nil
	}
	return 0, fmt.Errorf("%w: its %s key holds %q, this build reads formats %d and %d", ErrNewerFormat, FormatKey, body, FormatPerEntry, FormatVersion)
}

// ensureFormat makes sure the cluster prefix has this build's format: it
// moves a cluster of FormatPerEntry to FormatVersion (upgradeFormat); it
// creates a new cluster's format key (with its ordinal counter at 0, so
// that an older binary, which parses the counter as bare decimal, refuses
// the cluster at its start instead of writing bare values into it) in one
// transaction that compares the prefix still empty, and refuses a prefix
// that holds keys without a format key, or a newer format.
func (n *Node) ensureFormat(ctx context.Context) error {
	for range 3 {
		cctx, cancel := n.ctx(ctx)
		v, err := readFormatVersion(cctx, n.cli, n.opts.Prefix)
		cancel()
		if err == nil && v == FormatPerEntry {
			if err := n.upgradeFormat(ctx); err != nil {
				return err
			}
			continue
		}
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

// upgradeFormat moves a cluster of FormatPerEntry to FormatVersion: the
// data stays as it is (the store reads layout 1 entries as runs of one),
// only the format key changes, in one transaction that compares it as
// read and no node registered, no claim held and no restore running, so
// that no node of an older version is serving the prefix (its writes of
// one key per entry and of stream lengths would fork a stream this
// node writes as runs), and none starts after (it refuses the newer
// format). A refusal because nodes are registered is ErrLiveNodes.
func (n *Node) upgradeFormat(ctx context.Context) error {
	fk := n.key(FormatKey)
	old := n.seal(fk, []byte(strconv.Itoa(FormatPerEntry)))
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	r, err := n.cli.Txn(cctx).If(
		clientv3.Compare(clientv3.Value(fk), "=", old),
		clientv3.Compare(clientv3.CreateRevision(n.key("node/")), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(n.key("own/")), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(n.key(RestoringKey)), "=", 0),
	).Then(clientv3.OpPut(fk, n.seal(fk, []byte(strconv.Itoa(FormatVersion))))).Else(
		clientv3.OpGet(n.key("node/"), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(n.key("own/"), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return fmt.Errorf("cluster: upgrade the format key from %d to %d: %w", FormatPerEntry, FormatVersion, err)
	}
	if r.Succeeded {
		n.log.Info().Int("from", FormatPerEntry).Int("format", FormatVersion).Msg("upgraded the cluster's format")
		return nil
	}
	nodes, owns := r.Responses[0].GetResponseRange().Count, r.Responses[1].GetResponseRange().Count
	if nodes+owns > 0 {
		return fmt.Errorf("%w: %s has format %d, which this version moves to %d only while no node runs, and holds %d live-node and %d ownership keys; stop every node, wait for their leases to end (--lease-ttl), and start again (see docs/operations.md, Upgrading)",
			ErrLiveNodes, n.opts.Prefix, FormatPerEntry, FormatVersion, nodes, owns)
	}
	// The format key changed, or a restore runs: read it again.
	return nil
}
