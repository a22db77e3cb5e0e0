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
	asJSON := fs.Bool("json", false, "print the result as one JSON object (prefix, format, sealed, found_sealed, txns, already), then verify's JSON lines")
	if err := cli.ParseFlags(fs, args); err != nil {
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
	if err := printConvert(e, *asJSON, cc.Prefix, sum); err != nil {
		return err
	}
	return runVerify(ctx, e, verifyArgs(*asJSON, etcdArgs(cc)...))
}

// convertResult is the first line convert-etcd --json prints; verify
// --json's line per conversation follows.
type convertResult struct {
	Result      string `json:"result"` // "converted"
	Prefix      string `json:"prefix"`
	Format      int    `json:"format"`
	Already     bool   `json:"already"`      // the prefix was converted before: nothing written
	Sealed      int64  `json:"sealed"`       // values rewritten with their checksum
	FoundSealed int64  `json:"found_sealed"` // values that carried one already (a resumed run)
	Txns        int    `json:"txns"`
}

// printConvert prints what a conversion of prefix did.
func printConvert(e *env, asJSON bool, prefix string, sum cluster.ConvertSummary) error {
	line := fmt.Sprintf("converted %s to format %d: %d values sealed, %d found sealed, in %d transactions; verifying",
		prefix, sum.Format, sum.Sealed, sum.Verified, sum.Txns)
	if sum.Already {
		line = fmt.Sprintf("%s is already format %d: nothing to convert; verifying", prefix, sum.Format)
	}
	return printResult(e, asJSON, line, convertResult{Result: "converted", Prefix: prefix, Format: sum.Format,
		Already: sum.Already, Sealed: sum.Sealed, FoundSealed: sum.Verified, Txns: sum.Txns})
}
