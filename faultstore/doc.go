// Package faultstore wraps a store.DurableStore to inject faults and crash
// cuts, so that tests can prove what participantd does when storage fails
// or the process dies between two barriers. It is modelled on pebble's
// vfs/errorfs: every call is a counted operation, rules decide per
// operation, and a crash-cut loop (CutLoop) kills a workload at operation
// 0, 1, 2, ... until a run completes.
//
// # Operations
//
// Every call except Close is an Op with a 0-based Index counted across all
// calls, a Kind and a Name:
//
//	method                      kind       name
//	Append                      OpAppend   stream
//	ReadFrom, ReadPage, Len     OpRead     stream
//	ReadValue, GetBytes         OpRead     key
//	First                       OpRead     stream
//	CAS                         OpCAS      key
//	Scan                        OpScan     prefix
//	Trim                        OpTrim     stream
//	PutBytes                    OpPutBytes first key ("" for none)
//	Flush                       OpFlush    "" (Pending: streams appended since the last durable flush)
//
// Close is not an operation: it is not counted, no rule sees it, and it
// reaches the inner store even after a cut, since closing discards
// unflushed writes as a crash does and a test must be able to release the
// inner store before reopening it.
//
// # Faults
//
// Rules are consulted in order and the first action other than None
// applies:
//
//	action      inner store sees         caller sees
//	None        the call                 the inner result
//	Fail        nothing                  an *Error wrapping ErrInjected
//	Uncertain   the call                 an *Error wrapping ErrInjected
//	Cut         nothing, then nothing    an *Error wrapping ErrCut, for this
//	            for every later op       and every later op
//	Fatal       nothing, then nothing    an *Error wrapping store.ErrFailed
//	            for every later op       and the fatal cause, for this and
//	                                     every later op
//	Hang        the call, once released  the inner result, once released
//	FlushFirst  a Flush, then the call   the inner result (a failed Flush's
//	                                     error, and no call, if it failed)
//
// Fail is "definitely not applied" and Uncertain "maybe applied" (it was):
// an Uncertain append has landed, an Uncertain flush made every earlier
// write durable. If the inner call of an Uncertain op fails, its own error
// is returned, since nothing happened. Fatal is a real store's sticky
// failure (a failed fsync, a full disk: SetFatalCause picks the cause): the
// process lives on and must notice that the store refuses everything. Hang
// is a store that stops answering (a dead disk, a hung NFS mount): the op
// waits, outside the Store's lock, until Release, so that a test can prove
// a shutdown is bounded however long a flush takes; Hung tells it when an
// op is stuck, and its cleanup calls Release so that nothing leaks.
// FlushFirst is another writer's group commit landing just before the op:
// over a store that keeps its writes' order, a rule that flushes before
// every outbox append makes the oplog rows durable without their outbox
// rows, the gap a crash then leaves for reconciliation to repair.
//
// Store implements store.Compactor whatever it wraps; over an inner store
// without it, the Compactor methods return store.ErrUnsupported. It
// implements store.Ordered with the inner store's answer, unless
// SetUnordered hides it, and store.Sealer whatever it wraps: a Seal is an
// OpFlush, and over a store that does not seal it is the inner Flush.
//
// # Crash cuts
//
// A Cut is the death of the process at that op. Op indices and decisions
// are made in one order under the Store's lock, so no op admitted after the
// cut op reaches the inner store; ops admitted before it may still be in
// flight and complete. After the workload returns, the test calls Crash on
// the inner *store.Memory, which keeps exactly what a Flush made durable
// before the cut, and reopens whatever it needs on top of it, wrapping the
// crashed store in a new Store if it wants more faults: a Store cannot see
// its inner store crash, so an old one would still list the lost appends
// as pending. CutLoop automates all of that for every cut point of a
// workload (or every Stride-th), over memory stores or any Backend that can
// make and crash a store; participanttest.CutLoop is this loop with the
// service's workloads and invariants.
//
// # Rules
//
// A Rule is built from predicates (Kind, Prefix, Name, Index, And, Or, Not)
// with When, or with the shorthands OnIndex, OnKind and OnPrefix; First,
// Once and Switch compose rules. Prefix matches an op's name, and a flush
// when any of its Pending streams has the prefix, so the two fault switches
// of seed 004 (an outbox append that fails, a flush covering an outbox
// append that fails) are one line each:
//
//	fs := faultstore.New(store.NewMemory())
//	failAppend := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("outbox/")))
//	failFlush := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("outbox/")))
//	fs.SetRules(failAppend, failFlush)
//	failFlush.Set(true) // from now on, a flush covering an outbox append fails
//
// Wrap a rule in Once to fire it a single time.
//
// Rules run under the Store's lock and must be quick and must not call the
// Store. SetRules, AddRule, SetObserver and Switch.Set are safe to call
// while other goroutines use the Store.
package faultstore
