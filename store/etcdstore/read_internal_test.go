package etcdstore

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// noKV fails the test on any request.
type noKV struct {
	clientv3.KV
	t *testing.T
}

func (k noKV) Txn(context.Context) clientv3.Txn {
	k.t.Error("a request was sent for an empty queue")
	return nil
}

// TestSendReads_EmptyQueueGivesTheTurnBack: a caller whose read another
// sender took along (both held a turn) finds the queue empty; it sends
// nothing and gives its turn back, so turns are never lost.
func TestSendReads_EmptyQueueGivesTheTurnBack(t *testing.T) {
	s := open(noKV{t: t}, nil, Options{})
	defer s.Close()
	s.rmu.Lock()
	s.ractive = 1
	s.rmu.Unlock()
	s.sendReads()
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.ractive != 0 {
		t.Fatalf("turns in use after an empty send = %d, want 0", s.ractive)
	}
}
