package logfirst_test

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// streamLen returns stream's length in s.
func streamLen(t *testing.T, s store.DurableStore, stream string) uint64 {
	t.Helper()
	n, err := s.Len(stream)
	if err != nil {
		t.Fatalf("Len(%s): %v", stream, err)
	}
	return n
}

// A write made after Seal returns goes to a later log record than the
// sealed ones, even when Seal returned before they were durable: with the
// sealed write's record being written, the later write is staged, the
// sealed record made durable, and the power cut at the next log write.
// After the crash the sealed write is there and the later one is not. A
// Seal that returned before its record was taken would let the later
// write into the sealed record, and it would survive.
func TestSeal_LaterWritesGoToALaterRecord(t *testing.T) {
	ffs, dir, opts, s := openOnFaultFS(t)
	if _, err := s.Append("a", []byte("a0"), 0); err != nil {
		t.Fatal(err)
	}
	// The first log sync blocks until released: a record in flight.
	blocked, release := make(chan struct{}), make(chan struct{})
	first := true
	walDir := filepath.Join(dir, logfirst.WALDir)
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		if first && op.Kind == faultfs.OpSync && filepath.Dir(op.Path) == walDir {
			first = false
			close(blocked)
			<-release
		}
		return faultfs.None
	})
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush() }()
	<-blocked
	if _, err := s.Append("a", []byte("a1"), 1); err != nil {
		t.Fatal(err)
	}
	type sealed struct {
		wait func() error
		err  error
	}
	sealedc := make(chan sealed, 1)
	go func() {
		wait, err := s.Seal()
		if err == nil {
			// Made as soon as the seal returns, while a record may
			// still be in flight.
			_, err = s.Append("b", []byte("b0"), 0)
		}
		sealedc <- sealed{wait, err}
	}()
	// The seal has joined the record after the one in flight once it is
	// counted (the count and the join are one critical section); it may
	// not return before that record is taken, which waits for release.
	for s.Stats().Flushes < 2 {
		runtime.Gosched()
	}
	select {
	case <-sealedc:
		t.Fatal("Seal returned while the record before its own was still being written")
	default:
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
	}
	sd := <-sealedc
	if sd.err != nil {
		t.Fatalf("Seal, then Append: %v", sd.err)
	}
	if err := sd.wait(); err != nil {
		t.Fatalf("Seal's wait: %v", err)
	}
	// The power is cut at the next op: the record that would carry b.
	ffs.SetRule(func(faultfs.Op) faultfs.Action { return faultfs.Cut })
	if err := s.Flush(); err == nil {
		t.Fatal("Flush after the power cut = nil, want an error")
	}
	logfirst.Abandon(s)
	if err := ffs.Crash(nil); err != nil {
		t.Fatalf("Crash: %v", err)
	}
	ffs.SetRule(nil)
	r, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open after the power cut: %v", err)
	}
	defer r.Close()
	if n := streamLen(t, r, "a"); n != 2 {
		t.Errorf("after the power cut Len(a) = %d, want 2 (both sealed writes durable)", n)
	}
	if n := streamLen(t, r, "b"); n != 0 {
		t.Errorf("after the power cut Len(b) = %d, want 0: b was made after the seal and went to the sealed record", n)
	}
}

// Seal with nothing staged and no record in flight waits for nothing; a
// Seal that writes its record itself and fails returns the failure, and
// on a failed store Seal returns the sticky error at once; after Close,
// store.ErrClosed.
func TestSeal_NothingStagedFailedAndClosed(t *testing.T) {
	ffs, _, _, s := openOnFaultFS(t)
	wait, err := s.Seal()
	if err != nil {
		t.Fatalf("Seal on an idle store = %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Seal's wait on an idle store = %v", err)
	}
	if _, err := s.Append("a", []byte("a0"), 0); err != nil {
		t.Fatal(err)
	}
	ffs.SetRule(func(faultfs.Op) faultfs.Action { return faultfs.Fail })
	if _, err := s.Seal(); err == nil {
		t.Fatal("Seal whose record fails = nil error, want the failure")
	}
	if _, err := s.Seal(); !errors.Is(err, store.ErrFailed) {
		t.Fatalf("Seal after a failure = %v, want store.ErrFailed", err)
	}
	ffs.SetRule(nil)
	s.Close()

	_, _, _, c := openOnFaultFS(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Seal(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Seal after Close = %v, want store.ErrClosed", err)
	}
}
