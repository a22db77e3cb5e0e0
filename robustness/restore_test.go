package robustness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster/backup"
)

// restorePrefix is where the restore nemesis writes the run's backup.
const restorePrefix = "/restored/"

// replaysAfterRestore is how many answered tells per writer are resent
// through the restored data set's node.
const replaysAfterRestore = 5

// checkRestore is the last nemesis: it backs the data set up, then
// restores it into a fresh prefix WHILE a new node starts on that prefix
// (the restore race: whichever wins, no node may serve a half-restored
// data set), and checks that the restored data set holds the backed-up
// logs and that answered tells, resent with their tokens through the new
// node, replay their seqs.
func checkRestore(ctx context.Context, h *harness, hist *history, tl *timeline, logs map[uint64]*convLog, convs []uint64, writers []*writer) []Violation {
	var vs []Violation
	fail := func(format string, args ...any) []Violation {
		return append(vs, Violation{InvRestore, fmt.Sprintf(format, args...)})
	}
	var file bytes.Buffer
	hdr, err := backup.Export(ctx, h.cli.KV, h.prefix, &file, backup.Options{})
	if err != nil {
		return fail("backup: %v", err)
	}
	tl.add(hist, "backup at revision %d: %d keys, %d bytes", hdr.Revision, hdr.Keys, file.Len())

	nd := h.newNode("r1")
	started := make(chan error, 1)
	go func() { started <- nd.startOn(restorePrefix) }()
	restore := func() (backup.Summary, error) {
		return backup.Restore(ctx, h.cli.KV, restorePrefix, bytes.NewReader(file.Bytes()), backup.RestoreOptions{MaxTxnOps: 16})
	}
	sum, err := restore()
	startErr := <-started
	tl.add(hist, "restore racing node r1's start: restore %+v, %v; r1: %v", sum, err, startErr)
	if errors.Is(err, backup.ErrNotEmpty) {
		// r1 registered first: the restore must have written nothing.
		// Clear the prefix and restore with no node running.
		nd.kill()
		if _, err := h.cli.Delete(ctx, restorePrefix, clientv3.WithPrefix()); err != nil {
			return fail("clear %s: %v", restorePrefix, err)
		}
		sum, err = restore()
		tl.add(hist, "restore again, alone: %+v, %v", sum, err)
		startErr = errors.New("killed to restore again")
	}
	if err != nil {
		return fail("restore: %v", err)
	}
	if startErr != nil {
		// r1 refused the prefix while the marker was there (or was
		// killed above): it starts now.
		if err := nd.startOn(restorePrefix); err != nil {
			return fail("node r1 does not start on the restored prefix: %v", err)
		}
	}

	restored, rvs, err := readLogs(ctx, h.cli, restorePrefix, convs)
	if err != nil {
		return fail("read the restored logs: %v", err)
	}
	vs = append(vs, rvs...)
	for _, c := range convs {
		src, dst := logs[c], restored[c]
		if len(dst.tells) < len(src.tells) || len(dst.records) < len(src.records) {
			vs = append(vs, Violation{InvRestore, fmt.Sprintf("conversation %d: restored %d tells and %d records of the backup's %d and %d",
				c, len(dst.tells), len(dst.records), len(src.tells), len(src.records))})
			continue
		}
		for i, t := range src.tells {
			if dst.tells[i] != t {
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("conversation %d: restored tell %+v where the backup has %+v", c, dst.tells[i], t)})
				break
			}
		}
	}

	// Resend answered tells through r1 alone, on their participants'
	// latest credentials (the restore ended their bindings), one client
	// per writer (a connection binds one participant per conversation).
	for _, w := range writers {
		cred, ok := w.cl.Credential(w.conv, w.cred.Participant)
		if !ok || !w.bound {
			continue
		}
		cl, err := client.DialCluster(ctx, []string{nd.front.Listen}, client.ClusterOptions{
			Options: client.Options{ClientName: "robustness-restore", DiscardDeliveries: true}})
		if err != nil {
			return fail("dial r1: %v", err)
		}
		defer cl.Close()
		if _, err := cl.Attach(ctx, cred); err != nil {
			vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s: attach %v on the restored data set: %v", w.name, cred, err)})
			continue
		}
		n := 0
		for _, s := range w.tokens {
			if s.cred.Participant != cred.Participant || s.seq > lastSeq(logs[w.conv]) {
				continue
			}
			if n++; n > replaysAfterRestore {
				break
			}
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			seq, err := cl.Tell(cctx, cred, []byte(s.payload), client.WithToken(s.tok))
			cancel()
			if outcomeOf(err) == Answered && seq != s.seq {
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s: %q (token %s) answered seq %d before the backup, seq %d when resent after the restore",
					w.name, s.payload, s.tok, s.seq, seq)})
			}
		}
	}
	tl.add(hist, "restore checked")
	return vs
}

func lastSeq(l *convLog) uint64 {
	if l == nil || len(l.records) == 0 {
		return 0
	}
	return uint64(l.records[len(l.records)-1].Seq)
}
