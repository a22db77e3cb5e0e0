package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// RestoringKey, under the cluster prefix, exists while `participantctl
// restore` is writing a backup into the prefix: Start refuses a prefix that
// has it, and every registration and every claim compares, in its
// transaction, that it is absent (a node that began its start just before
// the restore neither registers nor claims until it ends), so that no node
// serves a half-restored data set.
const RestoringKey = "restoring"

// ErrRestoring reports a prefix that a restore is writing, or that a
// failed restore left half-written.
var ErrRestoring = errors.New("cluster: a restore into this prefix is in progress or was cut")

// NormalizePrefix returns prefix as Start uses it: DefaultPrefix when
// empty, and ending in '/', so that "/pd" does not share keys with "/pd2".
func NormalizePrefix(prefix string) string {
	if prefix == "" {
		prefix = etcdstore.DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return prefix
}

// Ephemeral reports whether key, relative to the cluster prefix, is a claim
// that lives under a node's lease: node/<id> (a live node) and
// own/<conversation> (an ownership). They describe which process serves
// what right now, not the data: backups leave them out, so that a restored
// data set has no owners and every conversation is claimed afresh (and
// reconciled from its stored rows) on its first touch.
func Ephemeral(key string) bool {
	for _, p := range EphemeralPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// EphemeralPrefixes are the key prefixes, relative to the cluster prefix,
// of the keys Ephemeral reports.
var EphemeralPrefixes = []string{"own/", "node/"}

// View is a read-only store.DurableStore over a cluster's whole data set,
// for the offline tools (participant.Inspect): the etcd store of the data
// keys, read through kv, with the service's registry derived from the
// conversations stored (a cluster keeps none), in ascending id order. Writes stage in memory and every
// commit fails: kv must refuse writes (etcdstore.AtRevision, or a backup
// file's contents), which is what makes the view read-only.
//
// A View owns its etcd store (Close closes it), not kv.
type View struct {
	*etcdstore.Store
	kv     clientv3.KV
	prefix string
}

var (
	_ store.DurableStore = (*View)(nil)
	_ store.Compactor    = (*View)(nil)
	_ store.PageReader   = (*View)(nil)
)

// OpenView returns a View of the data set under prefix (normalized as
// Start does) read through kv.
func OpenView(kv clientv3.KV, prefix string) *View {
	prefix = NormalizePrefix(prefix)
	return &View{
		Store:  etcdstore.OpenKV(kv, etcdstore.Options{Prefix: prefix + "d/", Scope: Scope, ScanScope: ScanScope}),
		kv:     kv,
		prefix: prefix,
	}
}

// Nodes returns the id of every node that ever joined the cluster, sorted.
func (v *View) Nodes(ctx context.Context) ([]string, error) {
	from := v.prefix + "ordinal/"
	end := clientv3.GetPrefixRangeEnd(from)
	var ids []string
	for {
		resp, err := v.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1024))
		if err != nil {
			return nil, fmt.Errorf("cluster: list nodes: %w", err)
		}
		for _, kv := range resp.Kvs {
			ids = append(ids, strings.TrimPrefix(string(kv.Key), v.prefix+"ordinal/"))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return ids, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// registry returns one registry entry per conversation that has data, in
// ascending id order: a cluster keeps no registry (a conversation loads on
// its first touch after a claim), so the view derives one from the
// conversation scopes.
func (v *View) registry() ([]store.Entry, error) {
	scopes, err := v.Store.Scopes(context.Background())
	if err != nil {
		return nil, err
	}
	ids := make([]uint64, 0, len(scopes))
	for _, sc := range scopes {
		id, err := strconv.ParseUint(sc, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cluster: scope %q names no conversation", sc)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]store.Entry, len(ids))
	for i, id := range ids {
		out[i] = store.Entry{Seq: uint64(i), Payload: registry.Encode(registry.Entry{Conversation: participant.ConversationID(id)})}
	}
	return out, nil
}

// ReadFrom reads stream name; the service's registry is derived.
func (v *View) ReadFrom(name string, offset uint64, limit int) ([]store.Entry, error) {
	if name != registry.Stream {
		return v.Store.ReadFrom(name, offset, limit)
	}
	all, err := v.registry()
	if err != nil || offset >= uint64(len(all)) {
		return nil, err
	}
	all = all[offset:]
	if limit > 0 && limit < len(all) {
		all = all[:limit]
	}
	return all, nil
}

// Len returns the length of stream name; the registry's is the number of
// conversations stored.
func (v *View) Len(name string) (uint64, error) {
	if name != registry.Stream {
		return v.Store.Len(name)
	}
	all, err := v.registry()
	return uint64(len(all)), err
}

// checkPage is how many keys CheckSums reads at once: each value is at
// most one etcd request, so a page is bounded.
const checkPage = 32

// CheckSums reads every key of the prefix, the data and the cluster's own
// keys, and checks each value's checksum (UnsealRel), so that damage in a
// value the reconciliation does not read (a claim, an ordinal, a value
// of no conversation) is found too. It returns nil, or an error wrapping
// the first *store.ChecksumError (errors.Is store.ErrCorrupt) with how
// many values failed, or a read's error.
func (v *View) CheckSums(ctx context.Context) error {
	from, end := v.prefix, clientv3.GetPrefixRangeEnd(v.prefix)
	var (
		first error
		bad   int
	)
	for {
		resp, err := v.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(checkPage))
		if err != nil {
			return fmt.Errorf("cluster: check the checksums: %w", err)
		}
		for _, kv := range resp.Kvs {
			if _, err := UnsealRel(strings.TrimPrefix(string(kv.Key), v.prefix), kv.Value); err != nil {
				if first == nil {
					first = err
				}
				bad++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if first != nil {
		return fmt.Errorf("cluster: %d values under %s fail their checksums, the first: %w", bad, v.prefix, first)
	}
	return nil
}

// ReadValue reads value key. The service incarnation is per node in a
// cluster (node/<id>/incarnation); the view's is 0.
func (v *View) ReadValue(key string) (uint64, error) {
	if key == participant.IncarnationKey {
		return 0, nil
	}
	return v.Store.ReadValue(key)
}

// checkNotRestoring refuses a prefix that a conversion (ConvertingKey) or
// a restore (RestoringKey) is writing; Convert writes RestoringKey too, so
// that an older binary stays out, and is named first.
func (n *Node) checkNotRestoring(ctx context.Context) error {
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	resp, err := n.cli.Get(cctx, n.key(ConvertingKey), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("cluster: look for a conversion in progress: %w", err)
	}
	if resp.Count > 0 {
		return fmt.Errorf("%w: a conversion of %s is running or was cut (%s exists); run `%s` again to finish it", ErrUnconverted, n.opts.Prefix, n.key(ConvertingKey), convertCommand)
	}
	resp, err = n.cli.Get(cctx, n.key(RestoringKey), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("cluster: look for a restore in progress: %w", err)
	}
	if resp.Count > 0 {
		return fmt.Errorf("%w: %s exists; let the restore finish, or delete the prefix and restore again", ErrRestoring, n.key(RestoringKey))
	}
	return nil
}
