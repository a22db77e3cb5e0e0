package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_EtcdMemberLoss: with one of 3 etcd members down (the leader,
// which the nodes send their commits to) the cluster keeps serving and
// loses nothing; with two down nothing can commit, so
// every tell answers in_doubt or unavailable (never success); once the
// members return, the same tokens commit exactly once and service resumes.
// A reader per conversation, which sends nothing but its binding check,
// receives every committed tell once, in seq order, through it all: when
// the nodes lose their leases with the quorum, their connections stay up
// but their bindings are gone, which the binding check finds (moved or
// no_binding), and its Cluster attaches it again on the owner.
//
// Where a phase must succeed, a tell answered in_doubt or unavailable is
// retried with its token (a bounded number of times, within the phase's
// deadline), as a client does: a loaded machine (the race detector on 2
// cores) can time out a commit while etcd elects a leader or the node takes
// a new lease, and the retry replays or commits once, which the oplog
// check at the end verifies.
func TestCluster_EtcdMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("3 etcd members and 2 nodes")
	}
	const convs = 5
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	var seeds []string
	for i := range 2 {
		d := startDaemon(t, server.Config{DrainTimeout: 5 * time.Second, Cluster: server.ClusterConfig{
			Endpoints: etcd.Endpoints(), NodeID: fmt.Sprintf("m%d", i), Prefix: "/ml/", LeaseTTL: 2 * time.Second}})
		seeds = append(seeds, d.srv.Addr().String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := client.DialCluster(ctx, seeds, client.ClusterOptions{
		Options:        client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, DiscardDeliveries: true},
		AttemptTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rd, err := client.DialCluster(ctx, seeds, client.ClusterOptions{
		Options: client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			BindingCheckInterval: 500 * time.Millisecond},
		AttemptTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	read := readRecords(rd)
	creds := make([]client.Credential, convs)
	for c := range convs {
		if creds[c], err = cl.Enroll(ctx, uint64(500+c)); err != nil {
			t.Fatal(err)
		}
		if _, err := rd.Enroll(ctx, uint64(500+c)); err != nil {
			t.Fatal(err)
		}
	}

	// tellAll tells once on every conversation, concurrently, each with
	// the given token, within d; it returns each outcome. With retry, an
	// in_doubt or unavailable answer is retried with the same token, at
	// most maxAttempts times in all.
	const maxAttempts = 20
	type outcome struct {
		payload  string
		tok      client.Token
		err      error
		attempts int
	}
	tellAll := func(phase string, d time.Duration, toks []client.Token, retry bool) []outcome {
		octx, ocancel := context.WithTimeout(ctx, d)
		defer ocancel()
		out := make([]outcome, convs)
		var wg sync.WaitGroup
		for c := range convs {
			wg.Go(func() {
				p := fmt.Sprintf("%s/%d", phase, c)
				tok := client.NewToken()
				if toks != nil {
					tok = toks[c]
				}
				o := outcome{payload: p, tok: tok}
				for {
					o.attempts++
					_, o.err = cl.Tell(octx, creds[c], []byte(p), client.WithToken(tok))
					var ce *client.Error
					if !retry || o.attempts == maxAttempts || octx.Err() != nil || !errors.As(o.err, &ce) ||
						(ce.Code != client.CodeInDoubt && ce.Code != client.CodeUnavailable) {
						break
					}
				}
				out[c] = o
			})
		}
		wg.Wait()
		return out
	}
	var committed []string
	committedIn := make(map[int][]string)
	mustAll := func(phase string, os []outcome) {
		t.Helper()
		for _, o := range os {
			if o.err != nil {
				t.Fatalf("%s: tell %s after %d attempts: %v", phase, o.payload, o.attempts, o.err)
			}
			if o.attempts > 1 {
				t.Logf("%s: tell %s took %d attempts", phase, o.payload, o.attempts)
			}
			committed = append(committed, o.payload)
		}
		for c, o := range os {
			committedIn[c] = append(committedIn[c], o.payload)
		}
	}

	mustAll("all members", tellAll("a", 20*time.Second, nil, true))
	// The first member lost is the leader, which the nodes' commits go to
	// (leader affinity): they must go on through the others.
	first := etcd.Leader()
	if first < 0 {
		first = 0
	}
	second := (first + 1) % etcd.Members()
	etcd.Stop(first)
	mustAll("leader down", tellAll("b", 30*time.Second, nil, true))

	etcd.Stop(second)
	lost := tellAll("c", 4*time.Second, nil, false)
	toks := make([]client.Token, convs)
	for c, o := range lost {
		var ce *client.Error
		switch {
		case o.err == nil:
			t.Fatalf("no quorum: tell %s answered success", o.payload)
		case errors.As(o.err, &ce) && (ce.Code == client.CodeInDoubt || ce.Code == client.CodeUnavailable):
		case errors.Is(o.err, context.DeadlineExceeded):
		default:
			t.Fatalf("no quorum: tell %s = %v, want in_doubt or unavailable", o.payload, o.err)
		}
		toks[c] = o.tok
	}

	if err := etcd.Restart(first); err != nil {
		t.Fatal(err)
	}
	if err := etcd.Restart(second); err != nil {
		t.Fatal(err)
	}
	// The unknown outcomes, retried with their tokens, commit (or replay)
	// exactly once.
	mustAll("members back, retried", tellAll("c", 60*time.Second, toks, true))
	mustAll("members back", tellAll("d", 30*time.Second, nil, true))
	for c := range convs {
		read.awaitConv(t, ctx, uint64(500+c), committedIn[c])
	}
	rd.Close()

	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ro := etcdstore.Open(cli, etcdstore.Options{Prefix: "/ml/d/", Scope: cluster.Scope})
	defer ro.Close()
	told := make(map[string]int)
	for c := range convs {
		entries, err := ro.ReadFrom(oplog.Stream(oplog.ConversationID(500+c)), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			row, err := oplog.Decode(e.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if row.Kind == oplog.KindTell {
				told[string(row.Payload)]++
			}
		}
	}
	for _, p := range committed {
		if told[p] != 1 {
			t.Errorf("answered tell %s is in the oplog %d times, want once", p, told[p])
		}
	}
}
