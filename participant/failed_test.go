package participant

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// A flush that fails the store (ENOSPC, EIO) answers the operation
// in_doubt, closes StoreFailed, makes Failed report the failure, and every
// later write is refused.
func TestAFailedFlushMakesTheStoreFailureVisible(t *testing.T) {
	for _, cause := range []error{syscall.ENOSPC, syscall.EIO} {
		t.Run(cause.Error(), func(t *testing.T) {
			ctx := context.Background()
			fs := faultstore.New(store.NewMemory())
			svc := openService(t, fs)
			c := svc.Connect(nil)
			b, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-svc.StoreFailed():
				t.Fatal("StoreFailed closed before any failure")
			default:
			}
			if err := svc.Failed(); err != nil {
				t.Fatalf("Failed before any failure = %v, want nil", err)
			}
			fs.SetFatalCause(cause)
			fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Fatal)))
			_, err = c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("x")})
			if !errors.Is(err, &Error{Code: CodeInDoubt}) {
				t.Fatalf("Tell with a failing flush = %v, want in_doubt", err)
			}
			select {
			case <-svc.StoreFailed():
			default:
				t.Fatal("StoreFailed not closed after the store failed")
			}
			if err := svc.Failed(); !errors.Is(err, store.ErrFailed) || !errors.Is(err, cause) {
				t.Fatalf("Failed = %v, want store.ErrFailed and %v", err, cause)
			}
			_, err = c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(3), Payload: []byte("y")})
			if !errors.Is(err, &Error{Code: CodeUnavailable}) {
				t.Fatalf("Tell after the failure = %v, want unavailable", err)
			}
		})
	}
}

// A refusal or a transient (non-sticky) storage fault does not count as a
// failed store.
func TestATransientFaultIsNotAFailedStore(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	svc := openService(t, fs)
	c := svc.Connect(nil)
	fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Fail)))
	if _, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)}); err == nil {
		t.Fatal("Enroll with a failing flush succeeded")
	}
	if _, err := c.Tell(ctx, Tell{Conversation: 1, Participant: 7, Generation: 1, Token: token(2)}); err == nil {
		t.Fatal("Tell of an unknown participant succeeded")
	}
	if err := svc.Failed(); err != nil {
		t.Fatalf("Failed after a transient fault = %v, want nil", err)
	}
}

// Open fails when the store fails while reconciliation commits (here the
// unclean-restart end of a binding the previous process left).
func TestOpenFailsWhenTheStoreFailsDuringReconciliation(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(1)}); err != nil {
		t.Fatal(err)
	}
	svc.Close()
	mem.Crash()

	fs := faultstore.New(mem)
	fs.SetFatalCause(syscall.ENOSPC)
	fs.SetRules(faultstore.When(faultstore.Fatal, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("oplog/")))
	svc, err = Open(ctx, fs, Options{NodeKey: testKey})
	if err == nil {
		svc.Close()
		t.Fatal("Open on a store that fails while reconciling succeeded")
	}
	if !errors.Is(err, store.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open = %v, want store.ErrFailed and ENOSPC", err)
	}
}
