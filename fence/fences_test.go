package fence_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/fence"
)

// The first attempt's token is refused once a genuine retry attempt has been
// issued, by the attempt discriminator alone.
func TestIssuingARetryRejectsTheStaleGeneration(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 3}
	stale := f.Issue(s, runKey(s, 1), 1)
	current := f.Issue(s, runKey(s, 1), 2)

	_, err := f.Accept(context.Background(), s, stale)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration, "attempt 1 after attempt 2 was issued")
	accept(t, f, s, current)
}

// An accepted generation is consumed: presenting the same token again finds
// no generation at all.
func TestAnAcceptedGenerationIsConsumedExactlyOnce(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 4}
	tok := f.Issue(s, runKey(s, 1), 1)

	accept(t, f, s, tok)
	_, err := f.Accept(context.Background(), s, tok)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "the same token a second time")
}

// Revoking a superseded attempt's token never disturbs the retry that
// replaced it. The same-attempt sibling case is owned by
// TestTheAllStreamsClosedRevokeCannotOrphanARedeliveredSibling.
func TestRevokingAnOldGenerationDoesNotRemoveItsReplacement(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 6}
	old := f.Issue(s, runKey(s, 1), 1)
	replacement := f.Issue(s, runKey(s, 1), 2)

	f.Revoke(s, old)
	accept(t, f, s, replacement)
}

// An empty token off the wire, from a peer that predates fencing, is a typed
// refusal, not a token that matches nothing.
func TestAnEmptyWireTokenIsATypedRefusal(t *testing.T) {
	tok, err := fence.ParseToken("")
	wantRejection(t, err, fence.ErrMissingToken, fence.MissingToken, `ParseToken("")`)
	if !tok.IsZero() {
		t.Fatalf(`ParseToken("") token = %q, want the zero Token`, tok)
	}

	// The zero Token is the same absence when handed straight to Accept.
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 9}
	f.Issue(s, runKey(s, 1), 1)
	_, err = f.Accept(context.Background(), s, fence.Token{})
	wantRejection(t, err, fence.ErrMissingToken, fence.MissingToken, "Accept(zero Token)")
	if got := fence.Outstanding(f, s); got != 1 {
		t.Fatalf("Outstanding after a missing token = %d, want 1 (untouched)", got)
	}
}

// A token from before a restart is refused by the registry of the new
// process, which starts empty and re-issues fresh tokens.
func TestAPreRecoveryGenerationIsRejectedAfterRecovery(t *testing.T) {
	s := site{conversation: 1, participant: 5}
	beforeRecovery := fence.New[site](fence.Options{})
	stale := beforeRecovery.Issue(s, runKey(s, 1), 1)

	var afterRecovery fence.Fences[site] // the zero Fences is ready for use
	_, err := afterRecovery.Accept(context.Background(), s, stale)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "pre-recovery token before re-issue")

	current := afterRecovery.Issue(s, runKey(s, 1), 1)
	_, err = afterRecovery.Accept(context.Background(), s, stale)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration, "pre-recovery token after re-issue")
	accept(t, &afterRecovery, s, current)
}

// A redelivery between delivery and completion does not orphan the finished
// result.
//
// Delivery is at-least-once, so work a live worker is finishing can be
// delivered a second time at the same attempt. The first worker still holds
// the first token and its result is real: it is accepted. The redelivery's
// token is then the duplicate, refused because the first acceptance consumed
// the whole generation. A registry that replaced the token on every issue
// would throw the finished result away as a stale generation.
func TestARedeliveryOfTheSameAttemptDoesNotOrphanTheFirstWorker(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 11}

	first := f.Issue(s, runKey(s, 1), 1)
	// The redelivery: the same attempt of the same generation, issued again.
	second := f.Issue(s, runKey(s, 1), 1)

	if _, err := f.Accept(context.Background(), s, first); err != nil {
		t.Fatalf("Accept(first) = %v, want nil: the worker that held the first delivery finished the work; its result must be accepted", err)
	}
	_, err := f.Accept(context.Background(), s, second)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration,
		"the first accepted completion must consume every outstanding token of the site, so the redelivery is the duplicate")
}

// The revoke an issuer makes when it finds every stream closed cannot orphan
// a sibling still held by a live worker.
//
// The interleaving: attempt A is delivered and held, the redelivery B is
// issued for the same attempt, every candidate stream is then found closed,
// so B revokes its own token. Had that removed the site's only entry, A's
// completion would read NoCurrentGeneration.
func TestTheAllStreamsClosedRevokeCannotOrphanARedeliveredSibling(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 12}

	delivered := f.Issue(s, runKey(s, 1), 1)
	redelivery := f.Issue(s, runKey(s, 1), 1)

	// Every candidate stream was closed, so the redelivery withdraws the
	// authorization it minted, and only that one.
	f.Revoke(s, redelivery)

	if _, err := f.Accept(context.Background(), s, delivered); err != nil {
		t.Fatalf("Accept(delivered) = %v, want nil: the sibling token the first worker holds must survive the redelivery's own revoke", err)
	}
	_, err := f.Accept(context.Background(), s, redelivery)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "a revoked token must never become truth")
}

// Revoking the last outstanding token drops the generation, and a revoked
// token is refused even while its sibling keeps the generation alive.
func TestRevokingTheLastTokenDropsTheGeneration(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 19}
	a := f.Issue(s, runKey(s, 1), 1)
	b := f.Issue(s, runKey(s, 1), 1)

	f.Revoke(s, a)
	_, err := f.Accept(context.Background(), s, a)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration, "a revoked token beside a live sibling")
	if got := fence.Outstanding(f, s); got != 1 {
		t.Fatalf("Outstanding after revoking one of two = %d, want 1", got)
	}
	f.Revoke(s, b)
	if got := fence.Outstanding(f, s); got != -1 {
		t.Fatalf("Outstanding after revoking both = %d, want -1 (no generation)", got)
	}
	f.Revoke(s, b) // revoking at a site with no generation does nothing
}

// A superseded attempt is still refused once a retry is issued: a
// regression pin that must stay green through any change to how siblings
// join a generation.
func TestASupersededAttemptIsStillRefusedAfterARetryIsIssued(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 13}

	earlier := f.Issue(s, runKey(s, 1), 1)
	current := f.Issue(s, runKey(s, 1), 2)

	_, err := f.Accept(context.Background(), s, earlier)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration,
		"a stale worker can never be recorded as truth: attempt 1 was superseded by attempt 2")
	accept(t, f, s, current)
}

// The execution-generation boundary is still refused across with identical
// attempt numbers on both sides.
//
// A new execution generation (for participantd, a new binding) gets a new
// generation key, and that key is the only discriminator separating these
// two attempt-1 tokens; acceptance by held generation would be blind to the
// case if the key were not used.
func TestASupersededExecutionGenerationIsStillRefusedAtTheSameAttempt(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 14}

	oldRun := f.Issue(s, runKey(s, 1), 1)
	newRun := f.Issue(s, runKey(s, 2), 1)

	_, err := f.Accept(context.Background(), s, oldRun)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration,
		"the superseded generation's worker holds attempt 1 of a generation that no longer exists")
	accept(t, f, s, newRun)
}

// A settlement that fails after acceptance restores the whole generation,
// siblings included, so the true resolver, whichever token it holds, is not
// refused with NoCurrentGeneration.
func TestARestoredGenerationCarriesItsRedeliveredSiblingBack(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 15}

	delivered := f.Issue(s, runKey(s, 1), 1)
	redelivery := f.Issue(s, runKey(s, 1), 1)

	accepted := accept(t, f, s, delivered)
	if got := accepted.Attempt(); got != 1 {
		t.Fatalf("Accepted.Attempt() = %d, want 1", got)
	}
	if got, want := accepted.GenerationKey(), runKey(s, 1); got != want {
		t.Fatalf("Accepted.GenerationKey() = %q, want %q", got, want)
	}
	if !f.RestoreIfAbsent(s, accepted) {
		t.Fatal("RestoreIfAbsent into an empty site = false, want true")
	}

	// The true resolver presents the sibling token and is accepted.
	accept(t, f, s, redelivery)
}

// A restore never overwrites a generation issued while the settlement was in
// flight: a concurrently issued newer generation always wins.
func TestARestoreNeverDisplacesANewerGeneration(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 16}

	first := f.Issue(s, runKey(s, 1), 1)
	accepted := accept(t, f, s, first)
	retry := f.Issue(s, runKey(s, 1), 2)

	if f.RestoreIfAbsent(s, accepted) {
		t.Fatal("RestoreIfAbsent over a newer generation = true, want false")
	}
	_, err := f.Accept(context.Background(), s, first)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration,
		"the restore must not displace the retry that was issued meanwhile")
	accept(t, f, s, retry)
}

// Restoring the zero Accepted registers nothing, so a site cannot be given
// a generation without tokens.
func TestRestoringTheZeroAcceptedDoesNothing(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 20}
	if f.RestoreIfAbsent(s, fence.Accepted{}) {
		t.Fatal("RestoreIfAbsent(zero Accepted) = true, want false")
	}
	if got := fence.Outstanding(f, s); got != -1 {
		t.Fatalf("Outstanding = %d, want -1 (no generation)", got)
	}
}

// A re-issue of an already superseded attempt registers nothing: it cannot
// resurrect the attempt the caller has moved past, the token it hands back
// is refused when presented, and the re-issue is logged with both attempts.
func TestReIssuingASupersededAttemptRegistersNoGeneration(t *testing.T) {
	var logs bytes.Buffer
	logger := zerolog.New(&logs)
	f := fence.New[site](fence.Options{Logger: &logger})
	s := site{conversation: 1, participant: 17}

	current := f.Issue(s, runKey(s, 1), 2)
	outOfOrder := f.Issue(s, runKey(s, 1), 1)

	_, err := f.Accept(context.Background(), s, outOfOrder)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration,
		"an out-of-order re-issue of a superseded attempt must not become acceptable")
	accept(t, f, s, current)

	for _, want := range []string{`"component":"fence"`, `"superseded_attempt":1`, `"current_attempt":2`, `"level":"warn"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log = %s, want it to contain %s", logs.String(), want)
		}
	}
}

// Two workers holding sibling tokens for one redelivered attempt: exactly
// one becomes truth. The set of tokens that may be first is wider; how many
// may be first is not.
func TestOnlyOneOfTwoSiblingTokensCanEverBecomeTruth(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 1, participant: 18}

	first := f.Issue(s, runKey(s, 1), 1)
	second := f.Issue(s, runKey(s, 1), 1)

	accepted := 0
	for _, tok := range []fence.Token{second, first} {
		if _, err := f.Accept(context.Background(), s, tok); err == nil {
			accepted++
		}
	}
	if accepted != 1 {
		t.Fatalf("accepted completions = %d, want exactly 1 for a redelivered attempt", accepted)
	}
}

// Parking a site retires it deliberately: every token of its generation
// goes, the redelivery's sibling included, other sites keep theirs, and a
// later issue starts afresh.
func TestParkingASiteRevokesEveryTokenOfItsGenerationSiblingsIncluded(t *testing.T) {
	f := fence.New[site](fence.Options{})
	parked := site{conversation: 2, participant: 1}
	other := site{conversation: 2, participant: 2}
	delivered := f.Issue(parked, runKey(parked, 1), 1)
	redelivery := f.Issue(parked, runKey(parked, 1), 1)
	untouched := f.Issue(other, runKey(other, 1), 1)

	f.RevokeCurrent(parked)
	for _, tok := range []fence.Token{delivered, redelivery} {
		_, err := f.Accept(context.Background(), parked, tok)
		wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "a token of a parked site")
	}
	accept(t, f, other, untouched)

	f.RevokeCurrent(parked) // parking an empty site does nothing
	fresh := f.Issue(parked, runKey(parked, 1), 1)
	accept(t, f, parked, fresh)
}

// Sites are independent: accepting at one never consumes another's
// generation, even one issued under the same generation key.
func TestSitesAreFencedIndependently(t *testing.T) {
	f := fence.New[site](fence.Options{})
	a := site{conversation: 3, participant: 1}
	b := site{conversation: 3, participant: 2}
	ta := f.Issue(a, "same", 1)
	tb := f.Issue(b, "same", 1)

	_, err := f.Accept(context.Background(), a, tb)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration, "another site's token")
	accept(t, f, a, ta)
	accept(t, f, b, tb)
}
