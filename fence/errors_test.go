package fence_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/fence"
)

// Each reason is its own sentinel and no other, through any wrapping, and
// the message names the site when it is known.
func TestRejectionErrorUnwrapsToExactlyItsSentinel(t *testing.T) {
	sentinels := []error{fence.ErrMissingToken, fence.ErrNoCurrentGeneration, fence.ErrStaleGeneration}
	tests := []struct {
		reason   fence.Reason
		sentinel error
		text     string
		msg      string
	}{
		{fence.MissingToken, fence.ErrMissingToken, "missing_token", "fence: missing token (site {1 2})"},
		{fence.NoCurrentGeneration, fence.ErrNoCurrentGeneration, "no_current_generation", "fence: no current generation (site {1 2})"},
		{fence.StaleGeneration, fence.ErrStaleGeneration, "stale_generation", "fence: stale generation (site {1 2})"},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			err := fmt.Errorf("ending binding: %w", &fence.RejectionError{Reason: tt.reason, Site: site{1, 2}})
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == tt.sentinel; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, s, got, want)
				}
			}
			if got := tt.reason.String(); got != tt.text {
				t.Errorf("Reason.String() = %q, want %q", got, tt.text)
			}
			var rej *fence.RejectionError
			if !errors.As(err, &rej) {
				t.Fatalf("errors.As(%v, *RejectionError) = false, want true", err)
			}
			if got := rej.Error(); got != tt.msg {
				t.Errorf("Error() = %q, want %q", got, tt.msg)
			}
		})
	}
}

// A refusal with no site says only its reason.
func TestARejectionWithoutASiteNamesOnlyItsReason(t *testing.T) {
	_, err := fence.ParseToken("")
	if diff := cmp.Diff("fence: missing token", err.Error()); diff != "" {
		t.Fatalf("ParseToken(\"\") error (-want +got):\n%s", diff)
	}
}

// A token survives the trip to the wire and back unchanged, and fresh tokens
// are distinct.
func TestATokenRoundTripsThroughItsWireForm(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 6, participant: 1}
	tok := f.Issue(s, runKey(s, 1), 1)
	if tok.IsZero() {
		t.Fatal("Issue returned the zero Token")
	}
	back, err := fence.ParseToken(tok.String())
	if err != nil {
		t.Fatalf("ParseToken(%q) = %v, want nil", tok, err)
	}
	if back != tok {
		t.Fatalf("ParseToken(%q) = %q, want the same token", tok, back)
	}
	if other := f.Issue(s, runKey(s, 1), 1); other == tok {
		t.Fatalf("two issues returned the same token %q", tok)
	}
	accept(t, f, s, back)
}
