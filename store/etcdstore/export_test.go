package etcdstore

// ReadRequests returns how many batched read requests the store sent.
func (s *Store) ReadRequests() uint64 { return s.reads.Load() }

// QueuedReads returns how many reads wait for a batch.
func (s *Store) QueuedReads() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return len(s.rqueue)
}
