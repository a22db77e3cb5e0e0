package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/participantd/participantd/fence"
)

// site is the execution site the tests fence, shaped as participantd's.
type site struct {
	conversation uint64
	participant  uint64
}

// runKey is the generation key of site in execution generation run.
func runKey(s site, run uint64) string {
	return fence.IdempotencyKey("binding", s.conversation, s.participant, run)
}

// accept is Accept with a background context, failing t on any error.
func accept(t *testing.T, f *fence.Fences[site], s site, tok fence.Token) fence.Accepted {
	t.Helper()
	a, err := f.Accept(context.Background(), s, tok)
	if err != nil {
		t.Fatalf("Accept(%v, %s) = %v, want nil", s, tok, err)
	}
	return a
}

// wantRejection fails t unless err is a *RejectionError of reason that
// errors.Is the sentinel want.
func wantRejection(t *testing.T, err error, want error, reason fence.Reason, why string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", why, err, want)
	}
	var rej *fence.RejectionError
	if !errors.As(err, &rej) {
		t.Fatalf("%s: err = %#v, want a *fence.RejectionError", why, err)
	}
	if rej.Reason != reason {
		t.Fatalf("%s: Reason = %v, want %v", why, rej.Reason, reason)
	}
}
