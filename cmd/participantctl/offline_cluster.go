package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore"
)

// The offline tools also read a cluster's data set, either live in etcd or
// from a cluster backup file. Both go through cluster.View, a read-only
// store over the etcd layout, so participant.Inspect runs on it exactly as
// on a data directory:
//
//   - live: every read is pinned at the etcd revision current when the
//     tool starts (etcdstore.AtRevision), so the report is one consistent
//     state of a cluster that keeps serving, and every write is refused
//     before it reaches etcd;
//   - a backup file: its entries, checked whole (count and checksum),
//     served from memory at the backup's revision.

// etcdPasswordEnv gives --etcd-password, as it does for participantd, so
// that the password need not appear in a process listing.
const etcdPasswordEnv = "PARTICIPANTD_ETCD_PASSWORD"

// etcdFlags are participantd's etcd connection flags, same names and
// meanings, resolved into the server's own ClusterConfig (whose Client the
// daemon uses too).
type etcdFlags struct {
	endpoints, prefix, ca, cert, key, user, password, sealKey *string
}

func addEtcdFlags(fs *pflag.FlagSet) *etcdFlags {
	return &etcdFlags{
		endpoints: fs.String("etcd-endpoints", "", "comma-separated etcd client URLs of a cluster's data set"),
		prefix:    fs.String("etcd-prefix", etcdstore.DefaultPrefix, "etcd key prefix of the data set"),
		ca:        fs.String("etcd-ca", "", "PEM CA file verifying the etcd servers (TLS to etcd)"),
		cert:      fs.String("etcd-cert", "", "PEM client certificate for etcd (with etcd-key)"),
		key:       fs.String("etcd-key", "", "PEM private key of etcd-cert"),
		user:      fs.String("etcd-username", "", "etcd user (with etcd-password)"),
		password:  fs.String("etcd-password", "", "etcd password (default $"+etcdPasswordEnv+")"),
		sealKey:   fs.String("etcd-secret-key-file", "", "the key file the nodes seal the cluster secret with (participantd --etcd-secret-key-file)"),
	}
}

// set reports whether --etcd-endpoints was given.
func (f *etcdFlags) set() bool { return strings.TrimSpace(*f.endpoints) != "" }

// config resolves the flags.
func (f *etcdFlags) config(e *env) server.ClusterConfig {
	c := server.ClusterConfig{
		Prefix: cluster.NormalizePrefix(*f.prefix),
		CA:     *f.ca, Cert: *f.cert, Key: *f.key,
		Username: *f.user, Password: *f.password,
		SealKeyFile: *f.sealKey,
	}
	if c.Password == "" && e.getenv != nil {
		c.Password = e.getenv(etcdPasswordEnv)
	}
	c.Endpoints = server.ParseEndpoints(*f.endpoints)
	return c
}

// source is where an offline tool reads: a data directory, a cluster's
// etcd prefix, or a cluster backup file.
type source struct {
	dir  *string
	etcd *etcdFlags
	from *string
}

func addSourceFlags(fs *pflag.FlagSet) *source {
	return &source{
		dir:  addDataFlag(fs),
		etcd: addEtcdFlags(fs),
		from: fs.String("from", "", "a cluster backup file (participantctl backup against a cluster node)"),
	}
}

// check refuses more than one source.
func (s *source) check(fs *pflag.FlagSet) error {
	data := false
	fs.Visit(func(f *pflag.Flag) { data = data || f.Name == "data" })
	n := 0
	for _, b := range []bool{data, s.etcd.set(), *s.from != ""} {
		if b {
			n++
		}
	}
	if n > 1 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("give one of --data, --etcd-endpoints and --from")}
	}
	return nil
}

// clusterInfo describes the cluster data set an offline tool read.
type clusterInfo struct {
	Prefix   string   `json:"prefix"`
	Revision int64    `json:"etcd_revision"`
	Nodes    []string `json:"nodes"`
	// Backup is the backup file read, when not live etcd.
	Backup string `json:"backup,omitempty"`
}

// inspectSource reconciles the source in dry run. In cluster mode the
// incarnation is 0 (each node has its own) and info describes the data set.
func inspectSource(ctx context.Context, e *env, s *source) (incarnation uint64, info *clusterInfo, reports []participant.Report, err error) {
	switch {
	case s.etcd.set():
		info, reports, err = inspectEtcd(ctx, s.etcd.config(e))
	case *s.from != "":
		info, reports, err = inspectBackup(ctx, *s.from)
	default:
		incarnation, reports, err = inspectData(*s.dir)
	}
	return incarnation, info, reports, err
}

// inspectEtcd reads the live data set of cc at the current revision,
// without writing anything.
func inspectEtcd(ctx context.Context, cc server.ClusterConfig) (*clusterInfo, []participant.Report, error) {
	cli, err := cc.Client()
	if err != nil {
		return nil, nil, err
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, cc.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, nil, fmt.Errorf("read %s from etcd: %w", cc.Prefix, err)
	}
	if resp.Count == 0 {
		return nil, nil, fmt.Errorf("no data under etcd prefix %s (check --etcd-prefix)", cc.Prefix)
	}
	info := &clusterInfo{Prefix: cc.Prefix, Revision: resp.Header.Revision}
	info, reports, err := inspectView(ctx, etcdstore.AtRevision(cli.KV, info.Revision), info)
	if errors.Is(err, rpctypes.ErrCompacted) {
		err = fmt.Errorf("etcd compacted revision %d while it was read; run again: %w", resp.Header.Revision, err)
	}
	return info, reports, err
}

// inspectBackup reads a cluster backup file, checked whole first.
func inspectBackup(ctx context.Context, path string) (*clusterInfo, []participant.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	snap, err := backup.Load(f)
	if errors.Is(err, backup.ErrNotBackup) {
		return nil, nil, fmt.Errorf("%s: %w (a single-node backup is a data file: restore it with restore --data, then verify --data)", path, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	h := snap.Header()
	return inspectView(ctx, snap, &clusterInfo{Prefix: h.Prefix, Revision: h.Revision, Backup: path})
}

// inspectView runs participant.Inspect on the cluster view of kv, which
// must refuse writes.
func inspectView(ctx context.Context, kv clientv3.KV, info *clusterInfo) (*clusterInfo, []participant.Report, error) {
	if err := cluster.CheckFormat(ctx, kv, info.Prefix); err != nil {
		return nil, nil, err
	}
	v := cluster.OpenView(kv, info.Prefix)
	defer v.Close()
	if err := v.CheckSums(ctx); err != nil {
		return nil, nil, err
	}
	nodes, err := v.Nodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	info.Nodes = nodes
	if info.Nodes == nil {
		info.Nodes = []string{}
	}
	reports, err := participant.Inspect(v)
	return info, reports, err
}
