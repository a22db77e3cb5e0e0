package etcdstore

import (
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestLeaderConn_RetiredClosedWhenIdle: a client switched away from while a
// call runs on it takes no new call and is closed only once that call
// ended, so a leader switch fails no commit in flight.
func TestLeaderConn_RetiredClosedWhenIdle(t *testing.T) {
	// Nothing listens there; New does not wait for a connection.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	main, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer main.Close()
	l := &leaderConn{main: main, wake: make(chan struct{}, 1)}
	p := &pinned{cli: cli, endpoint: "127.0.0.1:1"}
	l.cur.Store(p)
	p.users.Add(2) // two calls in flight, as acquire counts them

	l.release(p, errors.New("leader changed")) // one fails; the other runs on
	if l.cur.Load() != nil {
		t.Fatal("a failed call left the client pinned")
	}
	if kv, got := l.acquire(); got != nil || kv != main.KV {
		t.Fatal("a retired client took a new call")
	}
	if len(l.wake) != 1 {
		t.Error("a failed call did not ask for a discovery")
	}
	l.closeRetired()
	if cli.Ctx().Err() != nil {
		t.Fatal("closed while a call runs on it")
	}
	l.release(p, nil)
	l.closeRetired()
	if cli.Ctx().Err() == nil {
		t.Fatal("not closed once idle")
	}
	if n := l.retiredLen(); n != 0 {
		t.Errorf("%d retired clients left", n)
	}
}
