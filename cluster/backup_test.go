package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// TestCluster_BackupUnderLoadRestoresEveryAnsweredTell: clients tell on
// four conversations through one node while a backup streams from it.
// Every tell answered before the backup was asked for is in the backup
// exactly once; the backup restores into a fresh prefix that verifies
// clean; a new node serves it, a retried token of the backup's time
// replays its original seq (it commits nothing), and new tells commit.
func TestCluster_BackupUnderLoadRestoresEveryAnsweredTell(t *testing.T) {
	const (
		convs   = 4
		senders = 2
		warmup  = 8 // answered tells per conversation before the backup
	)
	p := prefix()
	a := startDaemon(t, server.Config{AdminToken: "tok", Cluster: server.ClusterConfig{
		Endpoints: shared.Endpoints(), NodeID: "a", Prefix: p, LeaseTTL: 2 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.DialCluster(ctx, []string{a.srv.Addr().String()}, client.ClusterOptions{
		Options: client.Options{DiscardDeliveries: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	creds := make([]client.Credential, convs)
	for c := range creds {
		if creds[c], err = cl.Enroll(ctx, uint64(500+c)); err != nil {
			t.Fatal(err)
		}
	}

	type answer struct {
		conv    int
		payload string
		tok     client.Token
		seq     uint64
	}
	var (
		mu       sync.Mutex
		answered []answer
		firstErr error
	)
	stop := make(chan struct{})
	warm := make(chan struct{}, convs*senders)
	var wg sync.WaitGroup
	for c := range convs {
		for g := range senders {
			wg.Go(func() {
				for i := 0; ; i++ {
					if i == warmup/senders {
						warm <- struct{}{}
					}
					select {
					case <-stop:
						return
					default:
					}
					pl := fmt.Sprintf("c%d/g%d/%d", c, g, i)
					tok := client.NewToken()
					seq, err := cl.Tell(ctx, creds[c], []byte(pl), client.WithToken(tok))
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = fmt.Errorf("tell %s: %w", pl, err)
					}
					if err == nil {
						answered = append(answered, answer{c, pl, tok, seq})
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	}
	for range convs * senders {
		<-warm
	}
	mu.Lock()
	before := append([]answer(nil), answered...)
	mu.Unlock()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.srv.HealthAddr().String()+"/admin/backup", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	file, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("backup: %s, %v", resp.Status, err)
	}
	close(stop)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	mu.Lock()
	total := len(answered)
	mu.Unlock()

	snap, err := backup.Load(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	h := snap.Header()
	t.Logf("backup of %d bytes, %d keys at revision %d; %d tells answered before it was asked for, %d in all", len(file), h.Keys, h.Revision, len(before), total)
	inBackup := cluster.OpenView(snap, h.Prefix)
	defer inBackup.Close()
	checkTold(t, inBackup, before, func(a answer) (int, string) { return a.conv, a.payload })

	// Restore into a fresh prefix: it verifies clean, with no owner.
	q := prefix()
	if _, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(file), backup.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	verifyClean(t, ctx, q, convs)
	if r, err := shared.Client.Get(ctx, q+"own/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("restored prefix has %v ownerships (%v), want none", r.Count, err)
	}

	// A new node serves the restored prefix: retried tokens replay their
	// original seq, new tells commit.
	b := startDaemon(t, server.Config{Cluster: server.ClusterConfig{
		Endpoints: shared.Endpoints(), NodeID: "b", Prefix: q, LeaseTTL: 2 * time.Second}})
	cl2, err := client.DialCluster(ctx, []string{b.srv.Addr().String()}, client.ClusterOptions{
		Options: client.Options{DiscardDeliveries: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	for i, ans := range before {
		if i%3 != 0 {
			continue
		}
		seq, err := cl2.Tell(ctx, creds[ans.conv], []byte(ans.payload), client.WithToken(ans.tok))
		if err != nil || seq != ans.seq {
			t.Fatalf("retried tell %s on the restored prefix = %d, %v; want its original seq %d", ans.payload, seq, err, ans.seq)
		}
	}
	for c := range convs {
		if _, err := cl2.Tell(ctx, creds[c], []byte("after restore")); err != nil {
			t.Fatalf("new tell on conversation %d of the restored prefix: %v", 500+c, err)
		}
	}
	resp2, err := shared.Client.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	live := cluster.OpenView(etcdstore.AtRevision(shared.Client.KV, resp2.Header.Revision), q)
	defer live.Close()
	checkTold(t, live, before, func(a answer) (int, string) { return a.conv, a.payload })
}

// checkTold fails unless every answer's payload is told exactly once in
// its conversation's oplog in st.
func checkTold[A any](t *testing.T, st store.DurableStore, answers []A, of func(A) (int, string)) {
	t.Helper()
	told := make(map[int]map[string]int)
	for _, a := range answers {
		c, pl := of(a)
		if told[c] == nil {
			entries, err := st.ReadFrom(oplog.Stream(oplog.ConversationID(500+c)), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			told[c] = make(map[string]int)
			for _, e := range entries {
				row, err := oplog.Decode(e.Payload)
				if err != nil {
					t.Fatalf("conversation %d row %d: %v", 500+c, e.Seq, err)
				}
				if row.Kind == oplog.KindTell {
					told[c][string(row.Payload)]++
				}
			}
		}
		if n := told[c][pl]; n != 1 {
			t.Errorf("conversation %d: tell %s answered before the backup is there %d times, want once", 500+c, pl, n)
		}
	}
}

// verifyClean runs the offline tools' reconciliation on prefix q at the
// current revision: every conversation loads, nothing refused, and the
// read changes no revision.
func verifyClean(t *testing.T, ctx context.Context, q string, convs int) {
	t.Helper()
	resp, err := shared.Client.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	v := cluster.OpenView(etcdstore.AtRevision(shared.Client.KV, resp.Header.Revision), q)
	defer v.Close()
	reports, err := participant.Inspect(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != convs {
		t.Fatalf("verify found %d conversations, want %d", len(reports), convs)
	}
	for _, r := range reports {
		if r.Refused != nil {
			t.Errorf("conversation %d refused: %s: %s", r.Conversation, r.Refused.Class, r.Refused.Reason)
		}
	}
	after, err := shared.Client.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != resp.Header.Revision {
		t.Fatalf("verify moved the etcd revision from %d to %d", resp.Header.Revision, after.Header.Revision)
	}
}
