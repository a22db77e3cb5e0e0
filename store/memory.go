package store

import (
	"fmt"
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
	// first holds, per trimmed stream, the seq of its first stored entry;
	// firstDurable the flushed ones. Entries below firstDurable are nil,
	// entries between it and first are kept until a Flush, so a crash can
	// bring them back.
	first        map[string]uint64
	firstDurable map[string]uint64
	// bytes holds current byte values; bytesDurable the flushed ones.
	bytes        map[string][]byte
	bytesDurable map[string][]byte
	// dirtyStreams, dirtyValues, dirtyTrims and dirtyBytes name what
	// changed since the last Flush.
	dirtyStreams map[string]struct{}
	dirtyValues  map[string]struct{}
	dirtyTrims   map[string]struct{}
	dirtyBytes   map[string]struct{}
	closed       bool
	stats        Stats
}

var (
	_ DurableStore = (*Memory)(nil)
	_ PageReader   = (*Memory)(nil)
	_ Compactor    = (*Memory)(nil)
)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		streams:      make(map[string][][]byte),
		flushed:      make(map[string]int),
		values:       make(map[string]uint64),
		durable:      make(map[string]uint64),
		first:        make(map[string]uint64),
		firstDurable: make(map[string]uint64),
		bytes:        make(map[string][]byte),
		bytesDurable: make(map[string][]byte),
		dirtyStreams: make(map[string]struct{}),
		dirtyValues:  make(map[string]struct{}),
		dirtyTrims:   make(map[string]struct{}),
		dirtyBytes:   make(map[string]struct{}),
	}
}

// Append implements DurableStore.
func (m *Memory) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	if err := CheckWrite(stream, len(payload)); err != nil {
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

// ReadFrom implements DurableStore: ReadPage without a byte bound.
func (m *Memory) ReadFrom(stream string, offset uint64, limit int) ([]Entry, error) {
	return m.ReadPage(stream, offset, limit, 0)
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
	if first := m.first[stream]; offset < first {
		return nil, &CompactedError{Stream: stream, Offset: offset, First: first}
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
	if err := CheckWrite(key, 0); err != nil {
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
	if len(m.dirtyStreams) > 0 || len(m.dirtyValues) > 0 || len(m.dirtyTrims) > 0 || len(m.dirtyBytes) > 0 {
		m.stats.Commits++
	}
	for s := range m.dirtyTrims {
		first := m.first[s]
		clear(m.streams[s][m.firstDurable[s]:first])
		m.firstDurable[s] = first
	}
	for k := range m.dirtyBytes {
		if v, ok := m.bytes[k]; ok {
			m.bytesDurable[k] = v
		} else {
			delete(m.bytesDurable, k)
		}
	}
	clear(m.dirtyTrims)
	clear(m.dirtyBytes)
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

// KeepsOrder implements Ordered: a Flush makes every write made so far
// durable at once, and Crash keeps exactly what the last one covered, a
// prefix of the writes in their order.
func (m *Memory) KeepsOrder() bool { return true }

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
	for s := range m.dirtyTrims {
		if f, ok := m.firstDurable[s]; ok {
			m.first[s] = f
		} else {
			delete(m.first, s)
		}
	}
	for k := range m.dirtyBytes {
		if v, ok := m.bytesDurable[k]; ok {
			m.bytes[k] = v
		} else {
			delete(m.bytes, k)
		}
	}
	clear(m.dirtyStreams)
	clear(m.dirtyValues)
	clear(m.dirtyTrims)
	clear(m.dirtyBytes)
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

// Trim implements Compactor. The trimmed entries are released at the next
// Flush; until then a Crash brings them back.
func (m *Memory) Trim(stream string, below uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if below <= m.first[stream] {
		return nil
	}
	if flushed := uint64(m.flushed[stream]); below >= flushed {
		return fmt.Errorf("trim %q below %d with %d flushed entries: %w", stream, below, flushed, ErrTrimRange)
	}
	m.first[stream] = below
	m.dirtyTrims[stream] = struct{}{}
	return nil
}

// First implements Compactor.
func (m *Memory) First(stream string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	return m.first[stream], nil
}

// PutBytes implements Compactor.
func (m *Memory) PutBytes(values []Bytes) error {
	if err := CheckBytes(values); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	for _, v := range values {
		if len(v.Value) == 0 {
			delete(m.bytes, v.Key)
		} else {
			m.bytes[v.Key] = append([]byte(nil), v.Value...)
		}
		m.dirtyBytes[v.Key] = struct{}{}
	}
	return nil
}

// GetBytes implements Compactor.
func (m *Memory) GetBytes(key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if v, ok := m.bytes[key]; ok {
		return append([]byte(nil), v...), nil
	}
	return nil, nil
}
