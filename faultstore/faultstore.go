package faultstore

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/participantd/participantd/store"
)

// Sentinel errors. Every error the Store injects is an *Error that unwraps
// to exactly one of them, except a Fatal one, which unwraps to
// store.ErrFailed and its cause.
var (
	// ErrInjected reports a Fail or Uncertain fault: the op failed on
	// purpose, and for Uncertain it was performed all the same.
	ErrInjected = errors.New("faultstore: injected fault")
	// ErrCut reports an op at or after the cut: the simulated process is
	// dead and the op was not performed.
	ErrCut = errors.New("faultstore: cut")
)

// Error is the error a Store returns for an injected fault.
type Error struct {
	// Op is the op that failed.
	Op Op
	// Action is Fail, Uncertain, Cut or Fatal.
	Action Action
	// CutAt is, for Cut, the index of the op the process died at, and for
	// Fatal the index of the op the store failed at; it is Op.Index for
	// that op itself and smaller for every op after it.
	CutAt uint64
	// Cause is, for Fatal, the error the store failed with.
	Cause error
}

// Error states the op, the fault, and whether the op was performed.
func (e *Error) Error() string {
	switch e.Action {
	case Uncertain:
		return fmt.Sprintf("%v: %s performed, reported as failed", ErrInjected, e.Op)
	case Cut:
		if e.Op.Index == e.CutAt {
			return fmt.Sprintf("%v: process died at %s", ErrCut, e.Op)
		}
		return fmt.Sprintf("%v: %s not performed, process died at #%d", ErrCut, e.Op, e.CutAt)
	case Fatal:
		return fmt.Sprintf("%v: %s not performed, store failed at #%d: %v", store.ErrFailed, e.Op, e.CutAt, e.Cause)
	}
	return fmt.Sprintf("%v: %s not performed", ErrInjected, e.Op)
}

// Unwrap returns ErrCut for a cut, store.ErrFailed and the cause for a
// fatal fault, and ErrInjected otherwise.
func (e *Error) Unwrap() []error {
	switch e.Action {
	case Cut:
		return []error{ErrCut}
	case Fatal:
		return []error{store.ErrFailed, e.Cause}
	}
	return []error{ErrInjected}
}

// Observer is told about every counted op once it has finished: the action
// that was applied (None when no rule fired, Cut for every op at or after
// the cut) and the error returned to the caller. It is called without any
// lock held, possibly from many goroutines at once.
type Observer func(op Op, action Action, err error)

// Store is a store.DurableStore that forwards to an inner store and injects
// the faults its rules decide. It is safe for concurrent use.
//
// Every method returns the inner store's results and errors unchanged when
// no fault applies, and an *Error (zero values besides) for an injected
// one. Returned slices come from the inner store and belong to the caller.
type Store struct {
	inner    store.DurableStore
	observer atomic.Pointer[Observer]
	// unordered hides the inner store's store.Ordered (SetUnordered).
	unordered atomic.Bool

	// mu guards every field below. It is also held while the rules decide,
	// so that op indices, decisions and the cut follow one order: an op
	// admitted after the cut op can never reach the inner store.
	mu sync.Mutex
	// next is the index the next admitted op gets.
	next  uint64
	rules []Rule
	// cut is set once an op was cut; cutAt is that op's index.
	cut   bool
	cutAt uint64
	// failed is set once a Fatal op failed the store; failedAt is that
	// op's index. fatalCause is what a Fatal op fails with.
	failed     bool
	failedAt   uint64
	fatalCause error
	// pending is the set of streams an Append reached since the last Flush
	// that made writes durable.
	pending map[string]struct{}
	// hanging counts the ops held by a Hang now; hung is closed when the
	// first one starts to hang.
	hanging int
	hung    chan struct{}
	// release is closed by Release: every Hang op, held or later, goes on.
	release  chan struct{}
	released bool
}

var (
	_ store.DurableStore = (*Store)(nil)
	_ store.PageReader   = (*Store)(nil)
	_ store.Compactor    = (*Store)(nil)
	_ store.Ordered      = (*Store)(nil)
	_ store.Sealer       = (*Store)(nil)
)

// New returns a Store wrapping inner, with no rules: until rules are set it
// forwards every call unchanged and only counts.
func New(inner store.DurableStore) *Store {
	return &Store{inner: inner, pending: make(map[string]struct{}), hung: make(chan struct{}), release: make(chan struct{})}
}

// Release lets every op a Hang holds go on to the inner store, and every
// later Hang op through at once. Calling it again does nothing.
func (s *Store) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.released {
		s.released = true
		close(s.release)
	}
}

// Hung returns a channel closed once an op starts to hang (a Hang that
// fired before Release), so a test can wait for the stuck op without
// polling.
func (s *Store) Hung() <-chan struct{} { return s.hung }

// Hanging returns how many ops a Hang holds now.
func (s *Store) Hanging() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hanging
}

// hold blocks a Hang op until Release.
func (s *Store) hold() {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return
	}
	if s.hanging++; s.hanging == 1 {
		select {
		case <-s.hung:
		default:
			close(s.hung)
		}
	}
	s.mu.Unlock()
	<-s.release
	s.mu.Lock()
	s.hanging--
	s.mu.Unlock()
}

// SetRules replaces the rules. For each op the rules are consulted in
// order and the first action other than None applies. See Rule for what a
// rule may do.
func (s *Store) SetRules(rules ...Rule) {
	rules = slices.Clone(rules)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = rules
}

// AddRule adds rule after the existing rules.
func (s *Store) AddRule(rule Rule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = append(s.rules, rule)
}

// SetObserver installs o, replacing any previous observer; nil removes it.
func (s *Store) SetObserver(o Observer) {
	if o == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&o)
}

// SetFatalCause sets the error a Fatal op fails the store with, such as
// syscall.ENOSPC; nil restores the default, syscall.EIO. A store that
// already failed keeps its cause.
func (s *Store) SetFatalCause(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fatalCause = err
}

// Ops returns how many ops were admitted so far, cut or not: the index the
// next op will get.
func (s *Store) Ops() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// CutAt returns the index of the op the process died at, and whether a cut
// happened at all.
func (s *Store) CutAt() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cutAt, s.cut
}

// admission is one admitted op and the decision about it.
type admission struct {
	op     Op
	action Action
	cutAt  uint64
	cause  error
	// taken is, for a Flush, the pending set it took over; it goes back
	// into pending unless the flush makes writes durable.
	taken map[string]struct{}
}

// admit gives the op its index and decides its action.
func (s *Store) admit(kind OpKind, name string) admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	ad := admission{op: Op{Index: s.next, Kind: kind, Name: name}}
	s.next++
	if s.cut {
		ad.action, ad.cutAt = Cut, s.cutAt
		return ad
	}
	if s.failed {
		ad.action, ad.cutAt, ad.cause = Fatal, s.failedAt, s.fatalCause
		return ad
	}
	if kind == OpFlush {
		ad.taken = s.pending
		s.pending = make(map[string]struct{})
		ad.op.Pending = make([]string, 0, len(ad.taken))
		for stream := range ad.taken {
			ad.op.Pending = append(ad.op.Pending, stream)
		}
		slices.Sort(ad.op.Pending)
	}
	for _, r := range s.rules {
		if ad.action = r.Decide(ad.op); ad.action != None {
			break
		}
	}
	switch ad.action {
	case Cut:
		s.cut, s.cutAt = true, ad.op.Index
		ad.cutAt = ad.op.Index
	case Fatal:
		if s.fatalCause == nil {
			s.fatalCause = syscall.EIO
		}
		s.failed, s.failedAt = true, ad.op.Index
		ad.cutAt, ad.cause = ad.op.Index, s.fatalCause
	}
	return ad
}

// err returns the injected error for ad.
func (ad *admission) err() error {
	return &Error{Op: ad.op, Action: ad.action, CutAt: ad.cutAt, Cause: ad.cause}
}

// run performs ad with f unless the action forbids it, then reports to the
// observer. An Uncertain op whose inner call failed returns the inner error:
// it did not happen, so there is nothing to be uncertain about.
func run[T any](s *Store, ad admission, f func() (T, error)) (T, error) {
	var v T
	var err error
	switch ad.action {
	case Fail, Cut, Fatal:
		err = ad.err()
	case Hang:
		s.hold()
		v, err = f()
	case FlushFirst:
		if err = s.flushInner(); err == nil {
			v, err = f()
		}
	default:
		v, err = f()
		if err == nil && ad.action == Uncertain {
			var zero T
			v, err = zero, ad.err()
		}
	}
	if o := s.observer.Load(); o != nil {
		(*o)(ad.op, ad.action, err)
	}
	return v, err
}

// Append implements store.DurableStore. It is an OpAppend named stream.
// Besides the inner store's errors it returns an *Error for an injected
// fault; an Uncertain append has landed at expectedSeq.
func (s *Store) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	return run(s, s.admit(OpAppend, stream), func() (uint64, error) {
		seq, err := s.inner.Append(stream, payload, expectedSeq)
		if err == nil {
			s.addPending(stream)
		}
		return seq, err
	})
}

// AppendOwned implements store.Owner: Append, handing payload to the
// inner store through store.AppendOwned.
func (s *Store) AppendOwned(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	return run(s, s.admit(OpAppend, stream), func() (uint64, error) {
		seq, err := store.AppendOwned(s.inner, stream, payload, expectedSeq)
		if err == nil {
			s.addPending(stream)
		}
		return seq, err
	})
}

// ReadFrom implements store.DurableStore. It is an OpRead named stream.
// The returned entries are the inner store's, owned by the caller.
func (s *Store) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	return run(s, s.admit(OpRead, stream), func() ([]store.Entry, error) {
		return s.inner.ReadFrom(stream, offset, limit)
	})
}

// Len implements store.DurableStore. It is an OpRead named stream.
func (s *Store) Len(stream string) (uint64, error) {
	return run(s, s.admit(OpRead, stream), func() (uint64, error) {
		return s.inner.Len(stream)
	})
}

// CAS implements store.DurableStore. It is an OpCAS named key. An
// Uncertain CAS has set the value.
func (s *Store) CAS(key string, old, new uint64) error {
	_, err := run(s, s.admit(OpCAS, key), func() (struct{}, error) {
		return struct{}{}, s.inner.CAS(key, old, new)
	})
	return err
}

// ReadValue implements store.DurableStore. It is an OpRead named key.
func (s *Store) ReadValue(key string) (uint64, error) {
	return run(s, s.admit(OpRead, key), func() (uint64, error) {
		return s.inner.ReadValue(key)
	})
}

// Scan implements store.DurableStore. It is an OpScan named prefix. The
// returned values are the inner store's, owned by the caller.
func (s *Store) Scan(prefix string) ([]store.Value, error) {
	return run(s, s.admit(OpScan, prefix), func() ([]store.Value, error) {
		return s.inner.Scan(prefix)
	})
}

// Flush implements store.DurableStore. It is an OpFlush whose Pending lists
// the streams appended since the last flush that made writes durable. A
// failed or cut flush leaves those streams pending for the next one; an
// Uncertain flush has made every earlier write durable.
func (s *Store) Flush() error {
	ad := s.admit(OpFlush, "")
	var durable bool
	_, err := run(s, ad, func() (struct{}, error) {
		err := s.inner.Flush()
		durable = err == nil
		return struct{}{}, err
	})
	if !durable {
		s.restorePending(ad.taken)
	}
	return err
}

// Seal implements store.Sealer. It is an OpFlush, as Flush is: it covers
// the streams appended since the last flush or seal, and rules see it as
// they see a Flush. It reaches the inner store through store.Seal (the
// inner Seal, or Flush). An injected fault is returned at once: nothing
// performed for Fail, Cut and Fatal; for Uncertain the inner seal was
// performed, and its outcome is not waited for. Streams whose seal was not
// made durable stay pending, as after a failed Flush.
func (s *Store) Seal() (wait func() error, err error) {
	ad := s.admit(OpFlush, "")
	inner, err := run(s, ad, func() (func() error, error) { return store.Seal(s.inner) })
	if err != nil {
		s.restorePending(ad.taken)
		return nil, err
	}
	return func() error {
		err := inner()
		if err != nil {
			s.restorePending(ad.taken)
		}
		return err
	}, nil
}

// Close implements store.DurableStore. Close is not an op: it is not
// counted, no rule sees it, and it reaches the inner store even after the
// cut, because closing discards unflushed writes exactly as a crash does
// and a test must be able to release the inner store before reopening it.
func (s *Store) Close() error {
	return s.inner.Close()
}

// addPending records an append that reached the inner store.
func (s *Store) addPending(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[stream] = struct{}{}
}

// restorePending puts back the streams a flush took over but did not make
// durable, so the next flush still covers them.
func (s *Store) restorePending(taken map[string]struct{}) {
	if len(taken) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for stream := range taken {
		s.pending[stream] = struct{}{}
	}
}

// ReadPage implements store.PageReader. It is an OpRead named stream, and
// reaches the inner store through store.ReadPage, so a Store over a store
// without PageReader falls back as that store would.
func (s *Store) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	return run(s, s.admit(OpRead, stream), func() ([]store.Entry, error) {
		return store.ReadPage(s.inner, stream, offset, limit, maxBytes)
	})
}

// ReadPageBuffered implements store.BufferedPageReader: ReadPage into
// buf, through store.ReadPageBuffered on the inner store.
func (s *Store) ReadPageBuffered(stream string, offset uint64, limit int, maxBytes int, buf *store.PageBuffer) ([]store.Entry, error) {
	return run(s, s.admit(OpRead, stream), func() ([]store.Entry, error) {
		return store.ReadPageBuffered(s.inner, stream, offset, limit, maxBytes, buf)
	})
}

// flushInner is FlushFirst's flush: every write that reached the inner
// store is made durable, so nothing is pending any more.
func (s *Store) flushInner() error {
	if err := s.inner.Flush(); err != nil {
		return err
	}
	s.mu.Lock()
	clear(s.pending)
	s.mu.Unlock()
	return nil
}

// KeepsOrder implements store.Ordered: the inner store's answer, or false
// after SetUnordered(true). Faults keep the order: a cut or a failure
// performs nothing, and Uncertain and FlushFirst ops are ops of the inner
// store.
func (s *Store) KeepsOrder() bool {
	return !s.unordered.Load() && store.KeepsOrder(s.inner)
}

// KeepsOrderWithin implements store.ScopeOrdered: the inner store's
// answer, or false after SetUnordered(true).
func (s *Store) KeepsOrderWithin(names ...string) bool {
	return !s.unordered.Load() && store.KeepsOrderWithin(s.inner, names...)
}

// SetUnordered makes KeepsOrder and KeepsOrderWithin answer false (true)
// or the inner store's answer again (false), so that a test can run a caller's path for
// stores that do not keep their writes' order over a memory store that
// does.
func (s *Store) SetUnordered(unordered bool) { s.unordered.Store(unordered) }

// Inner returns the store s wraps (see store.AsCompactor).
func (s *Store) Inner() store.DurableStore { return s.inner }

// compactor returns the inner store's Compactor, or ErrUnsupported.
func (s *Store) compactor() (store.Compactor, error) {
	if c, ok := s.inner.(store.Compactor); ok {
		return c, nil
	}
	return nil, store.ErrUnsupported
}

// Trim implements store.Compactor. It is an OpTrim named stream. An
// Uncertain trim has trimmed. Over an inner store without Compactor it
// returns store.ErrUnsupported.
func (s *Store) Trim(stream string, below uint64) error {
	_, err := run(s, s.admit(OpTrim, stream), func() (struct{}, error) {
		c, err := s.compactor()
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, c.Trim(stream, below)
	})
	return err
}

// First implements store.Compactor. It is an OpRead named stream.
func (s *Store) First(stream string) (uint64, error) {
	return run(s, s.admit(OpRead, stream), func() (uint64, error) {
		c, err := s.compactor()
		if err != nil {
			return 0, err
		}
		return c.First(stream)
	})
}

// PutBytes implements store.Compactor. It is an OpPutBytes named by its
// first key. An Uncertain PutBytes has written every value.
func (s *Store) PutBytes(values []store.Bytes) error {
	name := ""
	if len(values) > 0 {
		name = values[0].Key
	}
	_, err := run(s, s.admit(OpPutBytes, name), func() (struct{}, error) {
		c, err := s.compactor()
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, c.PutBytes(values)
	})
	return err
}

// GetBytes implements store.Compactor. It is an OpRead named key.
func (s *Store) GetBytes(key string) ([]byte, error) {
	return run(s, s.admit(OpRead, key), func() ([]byte, error) {
		c, err := s.compactor()
		if err != nil {
			return nil, err
		}
		return c.GetBytes(key)
	})
}
