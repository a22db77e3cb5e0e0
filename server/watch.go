package server

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/store"
)

// watchedStore forwards every call to the store the service uses and
// remembers the calls in flight, so that a shutdown that gives up on a
// store that stopped answering (see Server.closeStore) can say which call
// it was stuck in and for how long. A call costs a clock read and a map
// insert and delete under one of watchShards locks, chosen by the call's
// number, so that concurrent calls seldom contend; oldest, called once at
// a shutdown, visits them all.
type watchedStore struct {
	inner store.DurableStore
	next  atomic.Uint64
	shard [watchShards]watchShard
}

// watchShards is how many locks the calls in flight are spread over.
const watchShards = 16

// watchShard holds some of the calls in flight.
type watchShard struct {
	// mu guards inflight.
	mu sync.Mutex
	// +checklocks:mu
	inflight map[uint64]storeCall
	_        [64]byte // keeps neighbouring shards' locks off one cache line
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
	_ store.Sealer       = (*watchedStore)(nil)
)

func watch(inner store.DurableStore) *watchedStore {
	w := &watchedStore{inner: inner}
	for i := range w.shard {
		w.shard[i].inflight = make(map[uint64]storeCall)
	}
	return w
}

// begin records a call and returns its number, for end.
func (w *watchedStore) begin(method, name string) uint64 {
	id := w.next.Add(1)
	sh := &w.shard[id%watchShards]
	c := storeCall{method: method, name: name, start: time.Now()}
	sh.mu.Lock()
	sh.inflight[id] = c
	sh.mu.Unlock()
	return id
}

// end forgets call id once it returned.
func (w *watchedStore) end(id uint64) {
	sh := &w.shard[id%watchShards]
	sh.mu.Lock()
	delete(sh.inflight, id)
	sh.mu.Unlock()
}

// oldest returns the call in flight the longest and how many are in
// flight; ok is false when none is.
func (w *watchedStore) oldest() (c storeCall, n int, ok bool) {
	for i := range w.shard {
		sh := &w.shard[i]
		sh.mu.Lock()
		for _, ic := range sh.inflight {
			if !ok || ic.start.Before(c.start) {
				c, ok = ic, true
			}
		}
		n += len(sh.inflight)
		sh.mu.Unlock()
	}
	return c, n, ok
}

// Inner returns the store w wraps (see store.AsCompactor).
func (w *watchedStore) Inner() store.DurableStore { return w.inner }

// KeepsOrder implements store.Ordered for the store w wraps.
func (w *watchedStore) KeepsOrder() bool { return store.KeepsOrder(w.inner) }

// KeepsOrderWithin implements store.ScopeOrdered for the store w wraps.
func (w *watchedStore) KeepsOrderWithin(names ...string) bool {
	return store.KeepsOrderWithin(w.inner, names...)
}

func (w *watchedStore) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	defer w.end(w.begin("Append", stream))
	return w.inner.Append(stream, payload, expectedSeq)
}

// AppendOwned implements store.Owner for the store w wraps.
func (w *watchedStore) AppendOwned(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	defer w.end(w.begin("Append", stream))
	return store.AppendOwned(w.inner, stream, payload, expectedSeq)
}

func (w *watchedStore) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	defer w.end(w.begin("ReadFrom", stream))
	return w.inner.ReadFrom(stream, offset, limit)
}

func (w *watchedStore) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	defer w.end(w.begin("ReadPage", stream))
	return store.ReadPage(w.inner, stream, offset, limit, maxBytes)
}

// ReadPageBuffered implements store.BufferedPageReader for the store w
// wraps.
func (w *watchedStore) ReadPageBuffered(stream string, offset uint64, limit int, maxBytes int, buf *store.PageBuffer) ([]store.Entry, error) {
	defer w.end(w.begin("ReadPage", stream))
	return store.ReadPageBuffered(w.inner, stream, offset, limit, maxBytes, buf)
}

func (w *watchedStore) Len(stream string) (uint64, error) {
	defer w.end(w.begin("Len", stream))
	return w.inner.Len(stream)
}

func (w *watchedStore) CAS(key string, old, new uint64) error {
	defer w.end(w.begin("CAS", key))
	return w.inner.CAS(key, old, new)
}

func (w *watchedStore) ReadValue(key string) (uint64, error) {
	defer w.end(w.begin("ReadValue", key))
	return w.inner.ReadValue(key)
}

func (w *watchedStore) Scan(prefix string) ([]store.Value, error) {
	defer w.end(w.begin("Scan", prefix))
	return w.inner.Scan(prefix)
}

func (w *watchedStore) Flush() error {
	defer w.end(w.begin("Flush", ""))
	return w.inner.Flush()
}

// FlushTimed implements store.TimedFlusher with the inner store's
// FlushTimed, or its Flush timed whole (store.FlushTimed); watched as a
// "Flush".
func (w *watchedStore) FlushTimed() (store.FlushTiming, error) {
	defer w.end(w.begin("Flush", ""))
	return store.FlushTimed(w.inner)
}

// Seal implements store.Sealer with the inner store's Seal, or its Flush
// when it has none (store.Seal). The seal and its wait are each watched
// as a "Flush": to an operator both are the barrier's flush.
func (w *watchedStore) Seal() (wait func() error, err error) {
	id := w.begin("Flush", "")
	inner, err := store.Seal(w.inner)
	w.end(id)
	if err != nil {
		return nil, err
	}
	return func() error {
		defer w.end(w.begin("Flush", ""))
		return inner()
	}, nil
}

// Close closes the inner store; it is watched like every other call.
func (w *watchedStore) Close() error {
	defer w.end(w.begin("Close", ""))
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
	defer w.end(w.begin("Trim", stream))
	c, err := w.compactor()
	if err != nil {
		return err
	}
	return c.Trim(stream, below)
}

func (w *watchedStore) First(stream string) (uint64, error) {
	defer w.end(w.begin("First", stream))
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
	defer w.end(w.begin("PutBytes", name))
	c, err := w.compactor()
	if err != nil {
		return err
	}
	return c.PutBytes(values)
}

func (w *watchedStore) GetBytes(key string) ([]byte, error) {
	defer w.end(w.begin("GetBytes", key))
	c, err := w.compactor()
	if err != nil {
		return nil, err
	}
	return c.GetBytes(key)
}
