package etcdstore

import clientv3 "go.etcd.io/etcd/client/v3"

// OpenKV opens a Store on kv, so that tests can interpose on its requests.
func OpenKV(kv clientv3.KV, opts Options) *Store { return open(kv, opts) }

// ReadRequests returns how many batched read requests the store sent.
func (s *Store) ReadRequests() uint64 { return s.reads.Load() }

// QueuedReads returns how many reads wait for a batch.
func (s *Store) QueuedReads() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return len(s.rqueue)
}
