package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/internal/cli"
)

func init() {
	register(&command{
		name:     "convert-etcd",
		synopsis: "seal every value of a cluster written before checksums (offline)",
		usage: `--etcd-endpoints URLS [--etcd-prefix P]

Converts the cluster data set under the etcd prefix P, written by a
participantd before etcd values carried checksums, to the format this
version serves: every value is rewritten sealed with a CRC-32C of its key
and bytes, then P/format is written. A node of this version refuses a
prefix without P/format, naming this command. Stop every node first and
wait for their leases to end: the conversion refuses a prefix with a node
registered or a claim held. While it runs, P/restoring and P/converting
exist, so that no node (of this version or an older one) starts on P.
It is safe to cut anywhere and to run again: it resumes from the last key
it recorded, and on a converted prefix it does nothing. Then it verifies
P as verify --etcd-endpoints does. A converted prefix cannot be served by
an older participantd (it refuses to start); roll back through a backup
taken before the conversion. TLS and auth: the --etcd-* flags of
participantd.`,
		run: runConvertEtcd,
	})
}

func runConvertEtcd(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["convert-etcd"])
	etcd := addEtcdFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if !etcd.set() {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--etcd-endpoints is required")}
	}
	cc := etcd.config(e)
	c, err := cc.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	sum, err := cluster.Convert(ctx, c.KV, cc.Prefix, cluster.ConvertOptions{})
	if err != nil {
		return err
	}
	if sum.Already {
		fmt.Fprintf(e.stdout, "%s is already format %d: nothing to convert; verifying\n", cc.Prefix, cluster.FormatVersion)
	} else {
		fmt.Fprintf(e.stdout, "converted %s to format %d: %d values sealed, %d found sealed, in %d transactions; verifying\n",
			cc.Prefix, cluster.FormatVersion, sum.Sealed, sum.Verified, sum.Txns)
	}
	return runVerify(ctx, e, etcdArgs(cc))
}
