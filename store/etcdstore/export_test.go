package etcdstore

// ReadRequests returns how many batched read requests the store sent.
func (s *Store) ReadRequests() uint64 { return s.reads.Load() }

// QueuedReads returns how many reads wait for a batch.
func (s *Store) QueuedReads() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return len(s.rqueue)
}

// LeaderEndpoint returns the endpoint commits go to with leader affinity,
// "" while they go through the client given to Open.
func (s *Store) LeaderEndpoint() string {
	if s.leader == nil {
		return ""
	}
	if p := s.leader.cur.Load(); p != nil {
		return p.endpoint
	}
	return ""
}

// LeaderTxns returns how many transactions went through the leader's client.
func (s *Store) LeaderTxns() uint64 {
	if s.leader == nil {
		return 0
	}
	return s.leader.txns.Load()
}

// CaughtUpReads returns how many read batches were sent again
// linearizably because the member had not reached their revision.
func (s *Store) CaughtUpReads() uint64 { return s.caughtUp.Load() }

// Settles returns how many settles the store made.
func (s *Store) Settles() uint64 { return s.settles.Load() }

// LoadWaits returns how many loads of a fenced scope waited for a commit
// taken before the scope's reset.
func (s *Store) LoadWaits() uint64 { return s.loadWaits.Load() }

// MemoryReads returns how many value reads a scope's filter answered
// absent without etcd.
func (s *Store) MemoryReads() uint64 { return s.memReads.Load() }

// SealRunBody returns body sealed as a run (tag 0x02) under rel, so that
// tests can build runs whose structure is wrong under a valid sum.
func SealRunBody(rel string, body []byte) string {
	return string(appendSealed(nil, rel, body, runTag))
}
