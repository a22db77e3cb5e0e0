package participant

// Stats is a snapshot of what a Service holds, for metrics.
type Stats struct {
	// Conversations is how many conversations the service knows of:
	// loaded, not loaded yet, dropped after a failed commit, or unloadable.
	Conversations int
	// Loaded is how many of them have their reconciled state in memory.
	Loaded int
	// Connections is how many Conns are open (not yet ended).
	Connections int
	// Bindings is how many bindings those connections hold.
	Bindings int
}

// Stats returns a snapshot of the service's contents. It visits every
// conversation and connection, each under its own lock briefly, so it
// costs O(conversations + connections): call it per scrape, not per
// operation.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	convs := make([]*conversation, 0, len(s.convs))
	for _, cv := range s.convs {
		convs = append(convs, cv)
	}
	conns := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	st := Stats{Conversations: len(convs)}
	for _, cv := range convs {
		cv.mu.RLock()
		if cv.state != nil {
			st.Loaded++
		}
		cv.mu.RUnlock()
	}
	for _, c := range conns {
		c.mu.Lock()
		if !c.ended {
			st.Connections++
			st.Bindings += len(c.bindings)
		}
		c.mu.Unlock()
	}
	return st
}
