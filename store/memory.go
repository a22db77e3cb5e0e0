package store

import (
	"sort"
	"strings"
	"sync"
)

// Memory is an in-memory DurableStore for tests. Flush marks writes durable
// without any I/O; Crash throws away every write no Flush covered, which is
// what a process crash does to a real store, so crash semantics can be tested
// without a disk.
type Memory struct {
	// mu guards every field below.
	mu sync.Mutex
	// streams holds every entry, flushed or not.
	streams map[string][][]byte
	// flushed is, per stream, how many leading entries are durable.
	flushed map[string]int
	// values holds current values; durable holds the flushed ones.
	values  map[string]uint64
	durable map[string]uint64
	// dirtyStreams and dirtyValues name what changed since the last Flush.
	dirtyStreams map[string]struct{}
	dirtyValues  map[string]struct{}
	closed       bool
	stats        Stats
}

var (
	_ DurableStore = (*Memory)(nil)
	_ PageReader   = (*Memory)(nil)
)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		streams:      make(map[string][][]byte),
		flushed:      make(map[string]int),
		values:       make(map[string]uint64),
		durable:      make(map[string]uint64),
		dirtyStreams: make(map[string]struct{}),
		dirtyValues:  make(map[string]struct{}),
	}
}

// Append implements DurableStore.
func (m *Memory) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	if err := checkWrite(stream, len(payload)); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	actual := uint64(len(m.streams[stream]))
	if actual != expectedSeq {
		return 0, &SequenceConflictError{Stream: stream, Expected: expectedSeq, Actual: actual}
	}
	m.streams[stream] = append(m.streams[stream], append([]byte(nil), payload...))
	m.dirtyStreams[stream] = struct{}{}
	m.stats.Appends++
	return actual, nil
}

// ReadFrom implements DurableStore.
func (m *Memory) ReadFrom(stream string, offset uint64, limit int) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	entries := m.streams[stream]
	if offset >= uint64(len(entries)) {
		return nil, nil
	}
	end := uint64(len(entries))
	if limit > 0 && offset+uint64(limit) < end {
		end = offset + uint64(limit)
	}
	out := make([]Entry, 0, end-offset)
	for seq := offset; seq < end; seq++ {
		out = append(out, Entry{Seq: seq, Payload: append([]byte(nil), entries[seq]...)})
	}
	return out, nil
}

// ReadPage implements PageReader.
func (m *Memory) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	entries := m.streams[stream]
	if offset >= uint64(len(entries)) {
		return nil, nil
	}
	end := uint64(len(entries))
	if limit > 0 && offset+uint64(limit) < end {
		end = offset + uint64(limit)
	}
	window := entries[offset:end]
	n := pageEnd(func(i int) int { return len(window[i]) }, len(window), maxBytes)
	out := make([]Entry, 0, n)
	for i := range n {
		out = append(out, Entry{Seq: offset + uint64(i), Payload: append([]byte(nil), window[i]...)})
	}
	return out, nil
}

// Len implements DurableStore.
func (m *Memory) Len(stream string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	return uint64(len(m.streams[stream])), nil
}

// CAS implements DurableStore.
func (m *Memory) CAS(key string, old, new uint64) error {
	if err := checkWrite(key, 0); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if actual := m.values[key]; actual != old {
		return &CASConflictError{Key: key, Expected: old, Actual: actual}
	}
	if new == 0 {
		delete(m.values, key)
	} else {
		m.values[key] = new
	}
	m.dirtyValues[key] = struct{}{}
	m.stats.CASWrites++
	return nil
}

// ReadValue implements DurableStore.
func (m *Memory) ReadValue(key string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	return m.values[key], nil
}

// Scan implements DurableStore.
func (m *Memory) Scan(prefix string) ([]Value, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	var out []Value
	for k, v := range m.values {
		if strings.HasPrefix(k, prefix) {
			out = append(out, Value{Key: k, Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Flush implements DurableStore: everything written so far becomes durable.
func (m *Memory) Flush() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.stats.Flushes++
	if len(m.dirtyStreams) > 0 || len(m.dirtyValues) > 0 {
		m.stats.Commits++
	}
	for s := range m.dirtyStreams {
		m.flushed[s] = len(m.streams[s])
	}
	for k := range m.dirtyValues {
		if v, ok := m.values[k]; ok {
			m.durable[k] = v
		} else {
			delete(m.durable, k)
		}
	}
	clear(m.dirtyStreams)
	clear(m.dirtyValues)
	return nil
}

// Crash discards every write that no Flush covered, as a process crash
// would, and reopens the store if it was closed. What remains is exactly
// what a restarted process would find.
func (m *Memory) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.discardLocked()
	m.closed = false
}

// discardLocked drops every write that no Flush covered. m.mu must be held.
func (m *Memory) discardLocked() {
	for s := range m.dirtyStreams {
		n := m.flushed[s]
		if n == 0 {
			delete(m.streams, s)
			delete(m.flushed, s)
			continue
		}
		m.streams[s] = m.streams[s][:n:n]
	}
	for k := range m.dirtyValues {
		if v, ok := m.durable[k]; ok {
			m.values[k] = v
		} else {
			delete(m.values, k)
		}
	}
	clear(m.dirtyStreams)
	clear(m.dirtyValues)
}

// Close implements DurableStore. Unflushed writes are discarded as in Crash;
// the memory itself is kept, so Crash reopens the store for a test that
// models a restart.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	// Discarding and closing under one lock hold keeps a write racing
	// Close from surviving it.
	m.discardLocked()
	m.closed = true
	return nil
}

// Stats returns the store's counters. It never fails, even after Close.
func (m *Memory) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}
