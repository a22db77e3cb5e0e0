package faultstore

import (
	"fmt"
	"strings"
)

// OpKind classifies an operation. Several DurableStore methods share a kind
// where a fault means the same thing to the caller (every read is a Read).
type OpKind uint8

const (
	// OpAppend is an Append.
	OpAppend OpKind = iota + 1
	// OpFlush is a Flush.
	OpFlush
	// OpRead is a ReadFrom, ReadPage, Len, ReadValue, First or GetBytes.
	OpRead
	// OpCAS is a CAS.
	OpCAS
	// OpScan is a Scan.
	OpScan
	// OpTrim is a Trim.
	OpTrim
	// OpPutBytes is a PutBytes.
	OpPutBytes
)

// String returns the kind's lowercase name, "append" for OpAppend.
func (k OpKind) String() string {
	switch k {
	case OpAppend:
		return "append"
	case OpFlush:
		return "flush"
	case OpRead:
		return "read"
	case OpCAS:
		return "cas"
	case OpScan:
		return "scan"
	case OpTrim:
		return "trim"
	case OpPutBytes:
		return "put_bytes"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one counted call on a Store, as rules and observers see it.
type Op struct {
	// Index is the op's 0-based position among every counted call made on
	// the Store, in the order the calls were admitted.
	Index uint64
	// Kind is what the call does.
	Kind OpKind
	// Name is the stream of an Append, ReadFrom, ReadPage, Len, Trim or
	// First, the key of a CAS, ReadValue or GetBytes, the prefix of a Scan,
	// the first key of a PutBytes, and empty for a Flush.
	Name string
	// Pending is set for a Flush only: the streams, sorted and without
	// duplicates, that an Append reached since the last Flush that made
	// writes durable. These are the streams this flush would make durable,
	// so a rule can single out "a flush that covers an outbox append". A
	// Store cannot see its inner store crash: wrap a crashed store in a
	// new Store, as a restarted process would. Rules and observers must
	// not modify Pending.
	Pending []string
}

// String formats the op for failure messages: `#3 append "outbox/1"`, or
// `#4 flush [outbox/1 oplog/1]`.
func (op Op) String() string {
	if op.Kind == OpFlush {
		return fmt.Sprintf("#%d flush [%s]", op.Index, strings.Join(op.Pending, " "))
	}
	return fmt.Sprintf("#%d %s %q", op.Index, op.Kind, op.Name)
}

// Action is what a rule decides to do to an op.
type Action uint8

const (
	// None lets the op through to the inner store untouched.
	None Action = iota
	// Fail does not perform the op and returns an *Error wrapping
	// ErrInjected: the caller may rely on nothing having happened.
	Fail
	// Uncertain performs the op on the inner store and then returns an
	// *Error wrapping ErrInjected, so the caller cannot tell that it
	// happened: an append that landed, a flush that made data durable.
	Uncertain
	// Cut kills the simulated process at this op: the op is not performed,
	// and it and every later op return an *Error wrapping ErrCut.
	Cut
	// Fatal fails the store at this op, as a failed fsync or a full disk
	// fails a real one: the op is not performed, and it and every later op
	// return an *Error wrapping store.ErrFailed and the Store's fatal cause
	// (SetFatalCause; syscall.EIO by default). Unlike Cut the process lives
	// on, facing a store that refuses everything until it is reopened.
	Fatal
	// Hang holds the op before it reaches the inner store until Release,
	// as a dead disk or a hung NFS mount holds an fsync; then it runs as
	// if no rule had fired (None). A Store released already lets a Hang
	// op through at once, so that a test's cleanup frees every op for
	// good. The op is counted when admitted, so ops admitted later get
	// later indices even when they finish first.
	Hang
	// FlushFirst flushes the inner store and then performs the op as
	// None would: another writer's Flush made everything staged durable
	// just before this op, as a group commit that took the first of two
	// writes alone would. Over a store that keeps its writes' order
	// (store.Ordered), that is how a write becomes durable without one
	// made after it. The inner flush is not an op (no index, no rule, no
	// observer); it empties Pending. If it fails, the op is not performed
	// and its error is returned.
	FlushFirst
)

// String returns the action's lowercase name, "fail" for Fail.
func (a Action) String() string {
	switch a {
	case None:
		return "none"
	case Fail:
		return "fail"
	case Uncertain:
		return "uncertain"
	case Cut:
		return "cut"
	case Fatal:
		return "fatal"
	case Hang:
		return "hang"
	case FlushFirst:
		return "flush_first"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}
