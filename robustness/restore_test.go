package robustness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
)

// restorePrefix is where the restore nemesis writes the run's backup.
const restorePrefix = "/restored/"

// raceEnd is the key the restore check writes after the race, under the
// restored prefix as a watch sees it, outside it as the nodes do.
const raceEnd = restorePrefix + "../robustness-race-end"

// slowNet is the latency each way of the restore's and r1's connections
// to etcd during the race.
const slowNet = 50 * time.Millisecond

// replaysAfterRestore is how many answered tells per writer are resent
// through the restored data set's node.
const replaysAfterRestore = 5

// checkRestore is the last nemesis: it backs the data set up, then
// restores it into a fresh prefix WHILE a new node starts on that prefix
// (the restore race: whichever wins, no node may serve a half-restored
// data set), and checks that the restored data set holds the backed-up
// logs and that answered tells, resent with their tokens through the new
// node, replay their seqs.
func checkRestore(ctx context.Context, seed uint64, h *harness, hist *history, tl *timeline, logs map[uint64]*convLog, convs []uint64, writers []*writer) []Violation {
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

	// The restore reaches etcd through a proxy, and r1 through its own,
	// both slowed down: a slow network stretches the steps of each side
	// (the restore's empty check and first transaction; r1's start check
	// and registration) to a hundred milliseconds and more, and the seed draws
	// how far apart the two start, so that some seeds interleave them.
	nd := h.newNode("r1")
	rp := h.proxy("restore-etcd", hostOf(h.etcd.Endpoints()[0]))
	defer rp.Stop()
	slowed := append([]*toxiproxy.Proxy{rp}, nd.toEtcd...)
	for _, p := range slowed {
		if err := slowProxy(p, slowNet); err != nil {
			return fail("%v", err)
		}
	}
	rcli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + rp.Listen}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fail("restore client: %v", err)
	}
	defer rcli.Close()
	restore := func() (backup.Summary, error) {
		return backup.Restore(ctx, rcli.KV, restorePrefix, bytes.NewReader(file.Bytes()), backup.RestoreOptions{})
	}

	// etcd's own history of the prefix during the race: who wrote what,
	// in what order.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	rev, err := h.cli.Get(ctx, "robustness-revision")
	if err != nil {
		return fail("read etcd's revision: %v", err)
	}
	watched := make(chan []*clientv3.Event, 1)
	watch := h.cli.Watch(clientv3.WithRequireLeader(wctx), restorePrefix, clientv3.WithPrefix(), clientv3.WithRev(rev.Header.Revision+1))
	go func() {
		var evs []*clientv3.Event
		defer func() { watched <- evs }()
		for wr := range watch {
			for _, ev := range wr.Events {
				if string(ev.Kv.Key) == raceEnd {
					return
				}
				evs = append(evs, ev)
			}
		}
	}()

	started := make(chan error, 1)
	go func() { started <- nd.startOn(restorePrefix) }()
	delay := time.Duration(rand.New(rand.NewPCG(seed, 0x7265)).Int64N(int64(600 * time.Millisecond)))
	pause(ctx, delay)
	// While the restore writes, a client tries to attach a writer's
	// participant through r1 over and over: no attempt may be answered
	// before the restore ends (a half-restored conversation).
	probeCtx, stopProbe := context.WithCancel(ctx)
	probed := make(chan string, 1)
	go func() { probed <- probeRestoring(probeCtx, nd.front.Listen, writers) }()
	tl.add(hist, "restore into %s starts %v after node r1's start (over a network %v slower each way)", restorePrefix, delay.Round(time.Millisecond), slowNet)
	sum, err := restore()
	stopProbe()
	if served := <-probed; served != "" {
		vs = append(vs, Violation{InvRestore, fmt.Sprintf("node r1 served a conversation while the restore was writing: %s", served)})
	}
	startErr := <-started
	tl.add(hist, "restore: %d keys in %d transactions, %v; node r1: %v", sum.Keys, sum.Txns, err, startErr)
	// Everything the race wrote is in etcd by now; one more key marks the
	// end of what the watch must deliver.
	if _, err := h.cli.Put(ctx, raceEnd, ""); err != nil {
		return fail("%v", err)
	}
	select {
	case evs := <-watched:
		vs = append(vs, checkRace(evs)...)
	case <-time.After(readyWait):
		vs = append(vs, Violation{InvRestore, "etcd's watch of the restored prefix did not deliver the race's events"})
	}
	stopWatch()
	if _, err := h.cli.Delete(ctx, raceEnd); err != nil {
		return fail("%v", err)
	}
	for _, p := range slowed {
		p.Toxics.ResetToxics(ctx)
	}
	if errors.Is(err, backup.ErrNotEmpty) {
		// r1 registered first: the restore must have written nothing.
		// Clear the prefix and restore with no node running.
		nd.kill()
		if _, err := h.cli.Delete(ctx, restorePrefix, clientv3.WithPrefix()); err != nil {
			return fail("clear %s: %v", restorePrefix, err)
		}
		sum, err = restore()
		tl.add(hist, "restore again, with no node running: %d keys in %d transactions, %v", sum.Keys, sum.Txns, err)
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
			switch {
			case err == nil && seq != s.seq:
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s: %q (token %s) answered seq %d before the backup, seq %d when resent after the restore",
					w.name, s.payload, s.tok, s.seq, seq)})
			case err != nil && !errors.Is(err, client.ErrTokenExpired):
				// A committed token replays until the token window
				// passed; nothing else excuses it.
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s: %q (token %s) answered seq %d before the backup; resent after the restore: %v",
					w.name, s.payload, s.tok, s.seq, err)})
			}
		}
	}
	tl.add(hist, "restore checked")
	return vs
}

// checkRace judges etcd's history of the restored prefix during the race
// (in revision order): the restore's first write (the marker) must find no
// live node registered under the prefix, and no node may register (node/)
// or claim a conversation (own/) while the marker exists.
func checkRace(evs []*clientv3.Event) []Violation {
	var vs []Violation
	live := map[string]int64{} // node key -> revision registered
	restoring := false
	for _, ev := range evs {
		key := strings.TrimPrefix(string(ev.Kv.Key), restorePrefix)
		put := ev.Type == clientv3.EventTypePut
		switch {
		case key == cluster.RestoringKey && put && ev.IsCreate():
			restoring = true
			for n, at := range live {
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("the restore began (revision %d) on a prefix where %s had registered (revision %d)", ev.Kv.ModRevision, n, at)})
			}
		case key == cluster.RestoringKey && !put:
			restoring = false
		case strings.HasPrefix(key, "node/") && put:
			live[key] = ev.Kv.ModRevision
			if restoring {
				vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s registered at revision %d while the restore was writing", key, ev.Kv.ModRevision)})
			}
		case strings.HasPrefix(key, "node/"):
			delete(live, key)
		case strings.HasPrefix(key, "own/") && put && restoring:
			vs = append(vs, Violation{InvRestore, fmt.Sprintf("%s claimed at revision %d while the restore was writing: a node served a half-restored conversation", key, ev.Kv.ModRevision)})
		}
	}
	return vs
}

// probeRestoring attaches the writers' participants through the node at
// addr, one short attempt after another, until ctx ends; it returns what
// was answered, or "" if nothing was.
func probeRestoring(ctx context.Context, addr string, writers []*writer) string {
	var cl *client.Cluster
	defer func() {
		if cl != nil {
			cl.Close()
		}
	}()
	for ctx.Err() == nil {
		if cl == nil {
			dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			c, err := client.DialCluster(dctx, []string{addr}, client.ClusterOptions{
				Options: client.Options{ClientName: "robustness-probe", DiscardDeliveries: true}})
			cancel()
			if err != nil {
				pause(ctx, 20*time.Millisecond)
				continue
			}
			cl = c
		}
		for _, w := range writers {
			cred, ok := w.cl.Credential(w.conv, w.cred.Participant)
			if !ok {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			got, err := cl.Attach(actx, cred)
			cancel()
			if err == nil && ctx.Err() == nil {
				return fmt.Sprintf("attach %v answered %v", cred, got)
			}
		}
		pause(ctx, 20*time.Millisecond)
	}
	return ""
}

// slowProxy delays every byte through p by d, both ways.
func slowProxy(p *toxiproxy.Proxy, d time.Duration) error {
	for _, stream := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name":"slow-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, d.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			return fmt.Errorf("slow %s: %w", p.Name, err)
		}
	}
	return nil
}

func hostOf(endpoint string) string { return strings.TrimPrefix(endpoint, "http://") }

func lastSeq(l *convLog) uint64 {
	if l == nil || len(l.records) == 0 {
		return 0
	}
	return uint64(l.records[len(l.records)-1].Seq)
}
