package stage

import (
	"sync"

	"github.com/participantd/participantd/store"
)

// Stream is what Streams needs of an engine's state of one stream, whose
// fields the engine's mutex guards.
type Stream interface {
	// LenLocked returns the stream's length, staged entries included: the
	// seq the next Append must expect.
	LenLocked() uint64
	// StageLocked stages payload as the entry at LenLocked.
	StageLocked(payload []byte)
}

// Streams is the staging of an engine's streams: a state per stream used
// since Open, loaded from the engine's durable state on first use (so Len
// is O(1) afterwards), and the streams with entries staged since the last
// commit began. A state is never removed, so each stream has one owner.
// Its fields are guarded by the engine's mutex.
type Streams[S Stream] struct {
	all   map[string]S
	dirty map[string]S
}

// NewStreams returns a staging with no stream.
func NewStreams[S Stream]() *Streams[S] {
	return &Streams[S]{all: make(map[string]S), dirty: make(map[string]S)}
}

// Get returns the state of name, loading it with load, while mu (the
// engine's mutex) is released, the first time the stream is used. A
// stream not used since Open has nothing in memory, so no commit can
// change what load reads while mu is released; if another caller loads it
// first, that state wins. usable is the engine's check that it may still
// serve; it runs, with mu held, before every look. Get is called with mu
// held and returns with it held, error or not; load's error is returned
// as is.
func (ss *Streams[S]) Get(mu sync.Locker, name string, usable func() error, load func(name string) (S, error)) (S, error) {
	return ss.get(mu, name, usable, load, true)
}

// Peek is Get for a caller that only reads the state: a stream that load
// finds empty is not kept, so that asking about streams that do not exist
// (a hostile client naming conversations at random) leaves nothing in
// memory. An empty stream gains a state of its own through Get, before
// anything is staged in it; until then every Peek loads it again. The
// state Peek returns for an empty stream is the caller's to read, never
// to stage into.
func (ss *Streams[S]) Peek(mu sync.Locker, name string, usable func() error, load func(name string) (S, error)) (S, error) {
	// A stream load finds empty had nothing staged while mu was released
	// (that takes a state in all), and only a stream in all has entries a
	// checkpoint can move to the durable state: load's answer still holds.
	return ss.get(mu, name, usable, load, false)
}

// get is Get, and Peek when keepEmpty is false.
func (ss *Streams[S]) get(mu sync.Locker, name string, usable func() error, load func(name string) (S, error), keepEmpty bool) (S, error) {
	var none S
	for {
		if err := usable(); err != nil {
			return none, err
		}
		if st, ok := ss.all[name]; ok {
			return st, nil
		}
		mu.Unlock()
		st, err := load(name)
		mu.Lock()
		if err != nil {
			return none, err
		}
		// Another caller may have loaded the stream meanwhile (that state
		// wins), and Close may have run and released the states: the
		// loop's checks come first.
		if _, ok := ss.all[name]; ok {
			continue
		}
		if err := usable(); err != nil {
			return none, err
		}
		if keepEmpty || st.LenLocked() > 0 {
			ss.all[name] = st
		}
		return st, nil
	}
}

// LookupLocked returns the state of name when the stream was used since
// Open.
func (ss *Streams[S]) LookupLocked(name string) (S, bool) {
	st, ok := ss.all[name]
	return st, ok
}

// AppendLocked stages payload as the next entry of st, the state of
// stream name, if that entry's seq is expectedSeq, and returns the seq;
// otherwise it stages nothing and returns a *store.SequenceConflictError.
// The caller passes a payload it will not modify.
func (ss *Streams[S]) AppendLocked(name string, st S, payload []byte, expectedSeq uint64) (uint64, error) {
	actual := st.LenLocked()
	if actual != expectedSeq {
		return 0, &store.SequenceConflictError{Stream: name, Expected: expectedSeq, Actual: actual}
	}
	st.StageLocked(payload)
	ss.dirty[name] = st
	return actual, nil
}

// CountLocked returns how many streams have a state in memory.
func (ss *Streams[S]) CountLocked() int { return len(ss.all) }

// DirtyLocked reports whether any stream has entries staged.
func (ss *Streams[S]) DirtyLocked() bool { return len(ss.dirty) > 0 }

// TakeDirtyLocked calls take with every stream that has entries staged,
// for a commit to take them, and forgets them: entries staged from now on
// mark their streams for the next commit.
func (ss *Streams[S]) TakeDirtyLocked(take func(name string, st S)) {
	for name, st := range ss.dirty {
		take(name, st)
	}
	clear(ss.dirty)
}

// DirtyCountLocked returns how many streams have entries staged.
func (ss *Streams[S]) DirtyCountLocked() int { return len(ss.dirty) }

// ReleaseLocked drops every state, at Close.
func (ss *Streams[S]) ReleaseLocked() { ss.all, ss.dirty = nil, nil }
