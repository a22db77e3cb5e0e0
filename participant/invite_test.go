package participant

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
)

func TestCheckInvite(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	valid, err := MintInvite(testKey, 7, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	otherKey := bytes.Repeat([]byte{1}, NodeKeySize)
	forOther, _ := MintInvite(otherKey, 7, now, now.Add(time.Hour))
	tampered := bytes.Clone(valid)
	tampered[len(tampered)-1] ^= 1
	extended := bytes.Clone(valid)
	extended[16]++ // a later expiry under the same MAC
	for _, tc := range []struct {
		name string
		conv ConversationID
		at   time.Time
		inv  []byte
		want Code
	}{
		{"valid", 7, now, valid, ""},
		{"valid until the last millisecond", 7, now.Add(time.Hour - time.Millisecond), valid, ""},
		{"missing", 7, now, nil, CodeInviteRequired},
		{"expired", 7, now.Add(time.Hour), valid, CodeInviteInvalid},
		{"another conversation", 8, now, valid, CodeInviteInvalid},
		{"another node key", 7, now, forOther, CodeInviteInvalid},
		{"tampered MAC", 7, now, tampered, CodeInviteInvalid},
		{"tampered expiry", 7, now, extended, CodeInviteInvalid},
		{"truncated", 7, now, valid[:InviteSize-1], CodeInviteInvalid},
		{"unknown version", 7, now, append([]byte{2}, valid[1:]...), CodeInviteInvalid},
	} {
		var got Code
		if e := checkInvite(testKey, tc.conv, tc.at, tc.inv); e != nil {
			got = e.Code
		}
		if got != tc.want {
			t.Errorf("%s: checkInvite = %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, err := MintInvite(testKey, 7, now, now); !errors.Is(err, ErrInviteExpiry) {
		t.Errorf("MintInvite with expiry now = %v, want ErrInviteExpiry", err)
	}
	parsed, err := ParseInvite(InviteText(valid))
	if err != nil || !bytes.Equal(parsed, valid) {
		t.Errorf("ParseInvite(InviteText(inv)) = %x, %v, want %x", parsed, err, valid)
	}
	for _, bad := range []string{"", "!!", InviteText(valid[:20])} {
		if _, err := ParseInvite(bad); !errors.Is(err, ErrInviteText) {
			t.Errorf("ParseInvite(%q) = %v, want ErrInviteText", bad, err)
		}
	}
}

// Under EnrollInvite an enroll without an invitation, or with one to
// another conversation, is refused and commits nothing; one with a valid
// invitation enrolls. Its retry must present the invitation again (the
// answer holds the secret, which the token alone must not give away), and
// replays with it even once the invitation expired: it is checked at the
// commit's time.
func TestEnrollInvitePolicy(t *testing.T) {
	ctx := context.Background()
	var nowMs atomic.Int64
	nowMs.Store(time.Now().UnixMilli())
	now := time.UnixMilli(nowMs.Load())
	svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, EnrollPolicy: EnrollInvite, Now: func() time.Time { return time.UnixMilli(nowMs.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	c := svc.Connect(nil)
	inv, err := MintInvite(testKey, 1, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	forOther, err := MintInvite(testKey, 2, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)}); !errors.Is(err, &Error{Code: CodeInviteRequired}) {
		t.Fatalf("Enroll without an invitation = %v, want invite_required", err)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(2), Invite: inv}); !errors.Is(err, &Error{Code: CodeInviteInvalid}) {
		t.Fatalf("Enroll into conversation 2 with an invitation to 1 = %v, want invite_invalid", err)
	}
	if got := svc.existing(2); got != nil && got.registered.Load() {
		t.Fatal("a refused enroll registered its conversation")
	}
	b, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(3), Invite: inv})
	if err != nil {
		t.Fatalf("Enroll with a valid invitation = %v", err)
	}
	other := svc.Connect(nil)
	for _, tc := range []struct {
		name   string
		invite []byte
		want   Code
	}{
		{"no invitation", nil, CodeInviteRequired},
		{"an invitation to another conversation", forOther, CodeInviteInvalid},
	} {
		if r, err := other.Enroll(ctx, Enroll{Conversation: 1, Token: token(3), Invite: tc.invite}); !errors.Is(err, &Error{Code: tc.want}) {
			t.Fatalf("retry of the enroll with %s = %+v, %v, want %s", tc.name, r, err, tc.want)
		}
	}
	nowMs.Add((2 * time.Hour).Milliseconds())
	r, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(3), Invite: inv})
	if err != nil || r.Replay != ReplayBound {
		t.Fatalf("retry of the enroll with its expired invitation = %+v, %v, want a bound replay", r, err)
	}
	if diff := cmp.Diff(b.Secret, r.Secret); diff != "" {
		t.Errorf("replayed secret differs (-first +replay):\n%s", diff)
	}

	open, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(1), Invite: []byte("ignored")}); err != nil {
		t.Fatalf("Enroll under EnrollOpen with a junk invitation = %v, want it ignored", err)
	}
	if _, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, EnrollPolicy: "closed"}); err == nil {
		t.Fatal("Open with an unknown enroll policy succeeded")
	}
}
