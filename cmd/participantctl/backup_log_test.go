package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// told is one acknowledged tell.
type told struct {
	tok     client.Token
	payload string
	seq     uint64
}

// TestBackupRestore_LogEngineWhileTellsContinue backs up a participantd on
// the log-first store while a client keeps telling, restores the copy into
// an empty directory (verified), serves it on the log-first store again,
// and retries every tell acknowledged before the backup began: each comes
// back with its original seq.
func TestBackupRestore_LogEngineWhileTellsContinue(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	srv := servertest.Start(t, server.Config{DataDir: data, AdminToken: "s3cret", Engine: server.EngineLog})
	c, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cred, err := c.Enroll(ctx, 7)
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}

	const total = 120
	var mu sync.Mutex
	var acked []told
	quarter, stop := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for i := range total {
			select {
			case <-stop:
				return
			default:
			}
			tok := client.NewToken()
			payload := fmt.Sprintf("tell %d", i)
			seq, err := c.Tell(ctx, cred, []byte(payload), client.WithToken(tok))
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			acked = append(acked, told{tok, payload, seq})
			mu.Unlock()
			if i == total/4 {
				close(quarter)
			}
		}
	}()
	select {
	case <-quarter:
	case err := <-errc:
		t.Fatalf("tell: %v", err)
	}
	mu.Lock()
	before := append([]told(nil), acked...)
	mu.Unlock()
	out := filepath.Join(work, "backup.db")
	mustCtl(t, ctx, "backup", "--health", srv.HealthAddr().String(), "--admin-token", "s3cret", "--out", out)
	close(stop)
	if err := <-errc; err != nil {
		t.Fatalf("tell: %v", err)
	}

	restored := filepath.Join(work, "restored")
	key := filepath.Join(data, participant.NodeKeyFile)
	// A hot backup is a crash-consistent cut: a tell in flight may have
	// passed its oplog barrier and not yet its outbox barrier, which the
	// restored server's reconciliation repairs at start, byte for byte.
	// Both are a verified copy; anything else is not.
	got := mustCtl(t, ctx, "restore", "--from", out, "--node-key", key, "--data", restored)
	if !strings.Contains(got, "conversation 7: ok") && !strings.Contains(got, "conversation 7: would repair 1 outbox rows") {
		t.Fatalf("restore = %q, want conversation 7 verified ok or repairable", got)
	}
	srv2 := servertest.Start(t, server.Config{DataDir: restored, Engine: server.EngineLog})
	c2, err := client.Dial(ctx, srv2.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for _, w := range before {
		seq, err := c2.Tell(ctx, cred, []byte(w.payload), client.WithToken(w.tok))
		if err != nil || seq != w.seq {
			t.Fatalf("%q retried on the restored server = seq %d, %v; want the original seq %d", w.payload, seq, err, w.seq)
		}
	}
	t.Logf("%d tells acknowledged before the backup, all in it", len(before))
}
