package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/participantd/participantd/store"
)

// watchedStore forwards every call to the store the service uses and
// remembers the calls in flight, so that a shutdown that gives up on a
// store that stopped answering (see Server.closeStore) can say which call
// it was stuck in and for how long. It costs one short critical section per
// call, next to a store call that takes a lock or a transaction itself.
type watchedStore struct {
	inner store.DurableStore

	// mu guards the fields below.
	mu       sync.Mutex
	next     uint64
	inflight map[uint64]storeCall
}

// storeCall is one call in flight.
type storeCall struct {
	method string // "Flush", "Append", ...
	name   string // the stream or key, "" for Flush
	start  time.Time
}

// String is the method and, if any, its stream or key: `Flush`,
// `Append "oplog/1"`.
func (c storeCall) String() string {
	if c.name == "" {
		return c.method
	}
	return fmt.Sprintf("%s %q", c.method, c.name)
}

var (
	_ store.DurableStore = (*watchedStore)(nil)
	_ store.PageReader   = (*watchedStore)(nil)
	_ store.Compactor    = (*watchedStore)(nil)
)

func watch(inner store.DurableStore) *watchedStore {
	return &watchedStore{inner: inner, inflight: make(map[uint64]storeCall)}
}

// begin records a call and returns the function that forgets it.
func (w *watchedStore) begin(method, name string) func() {
	w.mu.Lock()
	id := w.next
	w.next++
	w.inflight[id] = storeCall{method: method, name: name, start: time.Now()}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.inflight, id)
		w.mu.Unlock()
	}
}

// oldest returns the call in flight the longest and how many are in
// flight; ok is false when none is.
func (w *watchedStore) oldest() (c storeCall, n int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ic := range w.inflight {
		if !ok || ic.start.Before(c.start) {
			c, ok = ic, true
		}
	}
	return c, len(w.inflight), ok
}

// Inner returns the store w wraps (see store.AsCompactor).
func (w *watchedStore) Inner() store.DurableStore { return w.inner }

func (w *watchedStore) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	defer w.begin("Append", stream)()
	return w.inner.Append(stream, payload, expectedSeq)
}

func (w *watchedStore) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	defer w.begin("ReadFrom", stream)()
	return w.inner.ReadFrom(stream, offset, limit)
}

func (w *watchedStore) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	defer w.begin("ReadPage", stream)()
	return store.ReadPage(w.inner, stream, offset, limit, maxBytes)
}

func (w *watchedStore) Len(stream string) (uint64, error) {
	defer w.begin("Len", stream)()
	return w.inner.Len(stream)
}

func (w *watchedStore) CAS(key string, old, new uint64) error {
	defer w.begin("CAS", key)()
	return w.inner.CAS(key, old, new)
}

func (w *watchedStore) ReadValue(key string) (uint64, error) {
	defer w.begin("ReadValue", key)()
	return w.inner.ReadValue(key)
}

func (w *watchedStore) Scan(prefix string) ([]store.Value, error) {
	defer w.begin("Scan", prefix)()
	return w.inner.Scan(prefix)
}

func (w *watchedStore) Flush() error {
	defer w.begin("Flush", "")()
	return w.inner.Flush()
}

// Close closes the inner store; it is watched like every other call.
func (w *watchedStore) Close() error {
	defer w.begin("Close", "")()
	return w.inner.Close()
}

// compactor is the inner store's Compactor; store.AsCompactor keeps the
// service from calling the methods below over a store without one.
func (w *watchedStore) compactor() (store.Compactor, error) {
	if c, ok := w.inner.(store.Compactor); ok {
		return c, nil
	}
	return nil, store.ErrUnsupported
}

func (w *watchedStore) Trim(stream string, below uint64) error {
	defer w.begin("Trim", stream)()
	c, err := w.compactor()
	if err != nil {
		return err
	}
	return c.Trim(stream, below)
}

func (w *watchedStore) First(stream string) (uint64, error) {
	defer w.begin("First", stream)()
	c, err := w.compactor()
	if err != nil {
		return 0, err
	}
	return c.First(stream)
}

func (w *watchedStore) PutBytes(values []store.Bytes) error {
	name := ""
	if len(values) > 0 {
		name = values[0].Key
	}
	defer w.begin("PutBytes", name)()
	c, err := w.compactor()
	if err != nil {
		return err
	}
	return c.PutBytes(values)
}

func (w *watchedStore) GetBytes(key string) ([]byte, error) {
	defer w.begin("GetBytes", key)()
	c, err := w.compactor()
	if err != nil {
		return nil, err
	}
	return c.GetBytes(key)
}
