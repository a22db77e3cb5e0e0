package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestTail_FollowsItsConversationToTheNewOwner: a tail of a conversation
// whose owner drains (bye, ownership released) keeps printing: it follows
// the conversation to the other node by itself and prints every record
// told, before and after, once and in order, and says it followed.
func TestTail_FollowsItsConversationToTheNewOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("an embedded etcd and 2 nodes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	node := func(id string) *servertest.Server {
		return servertest.Start(t, server.Config{DataDir: t.TempDir(), DrainTimeout: 5 * time.Second,
			Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: "/tail/", LeaseTTL: 2 * time.Second}})
	}
	a, b := node("a"), node("b")
	dir := t.TempDir()
	reader, writer := filepath.Join(dir, "r.json"), filepath.Join(dir, "w.json")
	// Enrolled through a alone, so that a owns the conversation.
	mustCtl(t, ctx, "enroll", "--addr", a.Addr().String(), "--conversation", "9", "--creds", reader)
	mustCtl(t, ctx, "enroll", "--addr", a.Addr().String(), "--conversation", "9", "--creds", writer)
	addrs := a.Addr().String() + "," + b.Addr().String()

	// The tail sends nothing but its binding check (--no-ack), which
	// cannot reach the drained node: only following brings it to b.
	out := &lines{ch: make(chan string, 16)}
	var errs syncBuffer
	done := make(chan int, 1)
	go func() {
		e := &env{stdin: strings.NewReader(""), stdout: out, stderr: &errs, getenv: func(string) string { return "" }}
		done <- run(ctx, e, []string{"tail", "--addr", addrs, "--creds", reader, "--records-only", "--no-ack", "--count", "4"})
	}()
	mustCtl(t, ctx, "tell", "--addr", addrs, "--creds", writer, "one")
	mustCtl(t, ctx, "tell", "--addr", addrs, "--creds", writer, "two")
	var got []string
	next := func() {
		t.Helper()
		select {
		case line := <-out.ch:
			_, text, _ := strings.Cut(line, ": ")
			got = append(got, text)
		case <-ctx.Done():
			t.Fatalf("tail printed %q, then nothing\nstderr:\n%s", got, errs.String())
		}
	}
	next()
	next()
	if err := a.Stop(); err != nil {
		t.Fatalf("drain of a = %v", err)
	}
	mustCtl(t, ctx, "tell", "--addr", addrs, "--creds", writer, "three")
	mustCtl(t, ctx, "tell", "--addr", addrs, "--creds", writer, "four")

	next()
	next()
	code := <-done
	if want := []string{"one", "two", "three", "four"}; code != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tail across the drain of its conversation's owner = exit %d, records %q, want exit 0 and %q\nstderr:\n%s",
			code, got, want, errs.String())
	}
	if !strings.Contains(errs.String(), "following conversation 9 to its owner") {
		t.Errorf("tail's standard error does not say it followed the conversation:\n%s", errs.String())
	}
}

// lines is a writer that hands each complete line written to ch.
type lines struct {
	mu      sync.Mutex
	partial []byte
	ch      chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.ch <- string(l.partial[:i])
		l.partial = l.partial[i+1:]
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
