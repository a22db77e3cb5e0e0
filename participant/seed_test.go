package participant

// The scenarios of seed 004 (two-barrier crash cuts and pre-publication
// refusal), in Go. Where the seed's server keeps its incarnation across a
// restart, participantd advances it, so each restart also ends the previous
// incarnation's bindings as died/unclean_restart; the tests assert that
// explicitly instead of a bare row count.

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
)

const seedConversation ConversationID = 0xF0_C4

// outboxFaults is the seed's OutboxFaultStore: two switches, one failing
// outbox appends, one failing a flush that would make an outbox append
// durable.
type outboxFaults struct {
	*faultstore.Store
	failAppend, failFlush *faultstore.Switch
}

func newOutboxFaults(inner store.DurableStore) *outboxFaults {
	f := &outboxFaults{
		Store:      faultstore.New(inner),
		failAppend: faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(outbox.StreamPrefix))),
		failFlush:  faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(outbox.StreamPrefix))),
	}
	f.SetRules(f.failAppend, f.failFlush)
	return f
}

func (f *outboxFaults) set(append, flush bool) {
	f.failAppend.Set(append)
	f.failFlush.Set(flush)
}

func enrollWith(t byte) Enroll { return Enroll{Conversation: seedConversation, Token: token(t)} }

// endedByRestart asserts that rows are exactly the died/unclean_restart
// endings of participants ps, in order.
func endedByRestart(t *testing.T, rows []outbox.Row, ps ...ParticipantID) {
	t.Helper()
	if len(rows) != len(ps) {
		t.Fatalf("restart added %d outbox rows, want %d (one died/unclean_restart per binding)", len(rows), len(ps))
	}
	for i, r := range rows {
		rec := r.Records[0]
		if len(r.Records) != 1 || rec.Kind != outbox.KindDied || rec.Cause != oplog.CauseUncleanRestart || rec.Participant != ps[i] {
			t.Fatalf("restart row %d = %+v, want died/unclean_restart of %v", i, r, ps[i])
		}
	}
}

func exerciseSecondBarrierCut(t *testing.T, failAppend, failFlush bool, rowsAfterFault int) {
	ctx := context.Background()
	mem := store.NewMemory()
	faults := newOutboxFaults(mem)
	faults.set(failAppend, failFlush)
	svc := openService(t, faults)
	_, err := svc.Connect(nil).Enroll(ctx, enrollWith(0xC4))
	if !errors.Is(err, ErrInDoubt) {
		t.Fatalf("Enroll with a second-barrier fault = %v, want in_doubt: a fault there must not publish an answer", err)
	}
	if n := oplogLen(t, faults, seedConversation); n != 2 {
		t.Fatalf("oplog rows after the fault = %d, want 2 (genesis and the enrollment)", n)
	}
	if n := len(rawOutbox(t, faults, seedConversation)); n != rowsAfterFault {
		t.Fatalf("outbox rows after the fault = %d, want %d", n, rowsAfterFault)
	}

	svc.Close()
	faults.set(false, false)
	svc = openService(t, faults)
	repaired := decodeOutbox(t, rawOutbox(t, faults, seedConversation))
	if len(repaired) < 1 || repaired[0].Source != 1 || repaired[0].Records[0].Kind != outbox.KindJoined {
		t.Fatalf("outbox after repair = %+v, want the enrollment's joined row first", repaired)
	}
	endedByRestart(t, repaired[1:], 0)
	after := rawOutbox(t, faults, seedConversation)

	svc.Close()
	openService(t, faults)
	if again := rawOutbox(t, faults, seedConversation); !equalRows(again, after) {
		t.Fatalf("a second restart changed the outbox: %d rows, want the %d repaired ones", len(again), len(after))
	}
}

func equalRows(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestPostCommitOutboxAppendFailureRepairsBeforePublication(t *testing.T) {
	exerciseSecondBarrierCut(t, true, false, 0)
}

func TestUncertainOutboxFlushAcceptsExactExistingWithoutDuplicate(t *testing.T) {
	exerciseSecondBarrierCut(t, false, true, 1)
}

// healthyEnrollment enrolls 0xC1 in seedConversation on a fresh memory
// store and closes the service as a crash would, returning the store.
func healthyEnrollment(t *testing.T) *store.Memory {
	mem := store.NewMemory()
	svc := openService(t, mem)
	if _, err := svc.Connect(nil).Enroll(context.Background(), enrollWith(0xC1)); err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	svc.Close()
	mem.Crash()
	return mem
}

// assertContained checks that seedConversation is unloadable with class,
// answers unavailable and publishes nothing, while another conversation
// serves.
func assertContained(t *testing.T, svc *Service, class, reason string) {
	t.Helper()
	unl := svc.Unloadable()
	if len(unl) != 1 || unl[0].Conversation != seedConversation || unl[0].Class != class {
		t.Fatalf("Unloadable() = %+v, want %v with class %s", unl, seedConversation, class)
	}
	if !strings.Contains(unl[0].Reason, reason) {
		t.Fatalf("unloadable reason %q does not say %q", unl[0].Reason, reason)
	}
	w := &wakeCounter{}
	c := svc.Connect(w.wake)
	if _, err := c.Enroll(context.Background(), enrollWith(0xC9)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Enroll in a contained conversation = %v, want unavailable", err)
	}
	if _, err := c.Attach(context.Background(), Attach{Conversation: seedConversation, Token: token(0xCA)}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Attach in a contained conversation = %v, want unavailable", err)
	}
	if c.HasReady() || w.count() != 0 {
		t.Fatalf("a contained conversation published: ready=%v wakes=%d", c.HasReady(), w.count())
	}
	if _, err := c.Enroll(context.Background(), Enroll{Conversation: seedConversation + 1, Token: token(0xCB)}); err != nil {
		t.Fatalf("Enroll in a healthy conversation beside a contained one: %v", err)
	}
}

func TestMalformedUnknownAndMixedOutboxRefusesBeforePublication(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload []byte
		class   string
		reason  string
	}{
		{"mixed", []byte{2}, ClassOutboxMixedVersion, "mixed schema versions"},
		{"malformed", []byte{outbox.Version, 0xc1}, ClassOutboxCorrupt, "corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := healthyEnrollment(t)
			if _, err := mem.Append(outbox.Stream(seedConversation), tc.payload, 1); err != nil {
				t.Fatalf("Append: %v", err)
			}
			if err := mem.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			assertContained(t, openService(t, mem), tc.class, tc.reason)
		})
	}
	t.Run("unknown", func(t *testing.T) {
		mem := store.NewMemory()
		if _, err := mem.Append(registry.Stream, registry.Encode(registry.Entry{Conversation: seedConversation}), 0); err != nil {
			t.Fatal(err)
		}
		genesis, err := oplog.Encode(&oplog.Row{Kind: oplog.KindGenesis})
		must(t, err)
		if _, err := mem.Append(oplog.Stream(seedConversation), genesis, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := mem.Append(outbox.Stream(seedConversation), []byte{9, 0x90}, 0); err != nil {
			t.Fatal(err)
		}
		must(t, mem.Flush())
		assertContained(t, openService(t, mem), ClassOutboxUnknownVersion, "unknown schema version")
	})
}

func TestImpossibleOutboxBoundaryRefusesBeforePublication(t *testing.T) {
	mem := healthyEnrollment(t)
	row, err := outbox.Encode(&outbox.Row{Kind: outbox.AckAdvanced, Source: 99, Participant: 0, Through: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Append(outbox.Stream(seedConversation), row, 1); err != nil {
		t.Fatalf("Append: %v", err)
	}
	must(t, mem.Flush())
	assertContained(t, openService(t, mem), ClassImpossibleBoundary, "impossible future boundary")
}

// expectedSecondEnrollment returns the outbox row a healthy second
// enrollment writes.
func expectedSecondEnrollment(t *testing.T) []byte {
	mem := store.NewMemory()
	svc := openService(t, mem)
	ctx := context.Background()
	if _, err := svc.Connect(nil).Enroll(ctx, enrollWith(0xC1)); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Connect(nil).Enroll(ctx, enrollWith(0xC2)); err != nil {
		t.Fatal(err)
	}
	rows := rawOutbox(t, mem, seedConversation)
	if len(rows) != 2 {
		t.Fatalf("healthy enrollments wrote %d outbox rows, want 2", len(rows))
	}
	return rows[1]
}

func exerciseRepairAndRetry(t *testing.T, failAppend, failFlush bool, rowsAfterFault int, expectedSecond []byte) {
	ctx := context.Background()
	mem := store.NewMemory()
	faults := newOutboxFaults(mem)
	svc := openService(t, faults)
	first, err := svc.Connect(nil).Enroll(ctx, enrollWith(0xC1))
	if err != nil {
		t.Fatalf("first Enroll: %v", err)
	}
	wakes := &wakeCounter{}
	firstConn := svc.Connect(wakes.wake)
	faults.set(failAppend, failFlush)
	exact := enrollWith(0xC2)
	if _, err := svc.Connect(nil).Enroll(ctx, exact); !errors.Is(err, ErrInDoubt) {
		t.Fatalf("Enroll with a barrier-2 fault = %v, want in_doubt, never a fabricated answer", err)
	}
	if firstConn.HasReady() || wakes.count() != 0 {
		t.Fatalf("barrier-2 fault published: ready=%v wakes=%d", firstConn.HasReady(), wakes.count())
	}
	if n := oplogLen(t, faults, seedConversation); n != 3 {
		t.Fatalf("oplog rows = %d, want 3: genesis and both enrollments stay after a barrier-2 failure", n)
	}
	if n := len(rawOutbox(t, faults, seedConversation)); n != rowsAfterFault {
		t.Fatalf("outbox rows after the fault = %d, want %d", n, rowsAfterFault)
	}

	// Restart on the same store, faults off: reconciliation repairs the
	// enrollment's outbox row byte for byte before anything is published.
	svc.Close()
	faults.set(false, false)
	repaired := openService(t, faults)
	payloads := rawOutbox(t, faults, seedConversation)
	if len(payloads) < 2 || !bytes.Equal(payloads[1], expectedSecond) {
		t.Fatalf("repaired outbox row 1 differs from the healthy one:\n got %x\nwant %x", payloads[1], expectedSecond)
	}
	endedByRestart(t, decodeOutbox(t, payloads)[2:], 0, 1)

	// The exact-token retry replays without committing, waking or
	// publishing anything.
	repairedWakes := &wakeCounter{}
	observer := repaired.Connect(repairedWakes.wake)
	retry, err := repaired.Connect(nil).Enroll(ctx, exact)
	if err != nil {
		t.Fatalf("exact-token retry lost its answer: %v", err)
	}
	if retry.Replay != ReplayUnbound || retry.Participant != 1 || retry.Conversation != seedConversation {
		t.Fatalf("retry = %+v, want the replay of participant 1 (unbound: the restart ended its binding)", retry)
	}
	if observer.HasReady() || repairedWakes.count() != 0 {
		t.Fatalf("a replay published: ready=%v wakes=%d", observer.HasReady(), repairedWakes.count())
	}
	if n := len(rawOutbox(t, faults, seedConversation)); n != len(payloads) {
		t.Fatalf("a replay wrote %d outbox rows", n-len(payloads))
	}

	// A committed rebind dispatches the repaired obligation exactly once.
	reboundWakes := &wakeCounter{}
	rebound := repaired.Connect(reboundWakes.wake)
	if rebound.HasReady() || reboundWakes.count() != 0 {
		t.Fatalf("registering a connection published something")
	}
	att, err := rebound.Attach(ctx, Attach{
		Conversation: seedConversation, Participant: first.Participant,
		Generation: first.Generation, Secret: first.Secret, Token: token(0xC3),
	})
	if err != nil {
		t.Fatalf("committed rebind: %v", err)
	}
	if att.Generation != first.Generation+1 || att.Cursor != 0 {
		t.Fatalf("rebind = %+v, want generation %v and cursor 0", att, first.Generation+1)
	}
	if reboundWakes.count() != 1 || observer.HasReady() {
		t.Fatalf("rebind wakes = %d (other connection ready=%v), want exactly one wake of the rebound connection", reboundWakes.count(), observer.HasReady())
	}
	if ready := rebound.TakeReady(); len(ready) != 1 || ready[0] != seedConversation {
		t.Fatalf("rebound inbox = %v, want [%v]", ready, seedConversation)
	}
	ds := drainNext(rebound, seedConversation)
	if len(ds) == 0 || ds[0].Kind != outbox.KindJoined || ds[0].Participant != 1 || ds[0].Seq != 2 {
		t.Fatalf("first delivery after rebind = %+v, want the repaired obligation: joined of participant 1 at seq 2", ds)
	}
	seen := map[Seq]bool{}
	for i, d := range ds {
		if seen[d.Seq] || (i > 0 && d.Seq <= ds[i-1].Seq) || d.Recipient != first.Participant {
			t.Fatalf("deliveries %+v are not each dispatched once in ascending seq to %v", ds, first.Participant)
		}
		seen[d.Seq] = true
	}

	// A restart ends the rebind's binding and changes nothing else; the
	// one after it changes nothing at all.
	afterRebind := rawOutbox(t, faults, seedConversation)
	repaired.Close()
	again := openService(t, faults)
	restarted := rawOutbox(t, faults, seedConversation)
	if !equalRows(restarted[:len(afterRebind)], afterRebind) {
		t.Fatalf("a restart rewrote the outbox")
	}
	endedByRestart(t, decodeOutbox(t, restarted)[len(afterRebind):], first.Participant)
	again.Close()
	openService(t, faults)
	if again := rawOutbox(t, faults, seedConversation); !equalRows(again, restarted) {
		t.Fatalf("a second restart changed the outbox")
	}
}

func TestPostCommitOutboxFailureIsRepairedNotRolledBack(t *testing.T) {
	expected := expectedSecondEnrollment(t)
	t.Run("append", func(t *testing.T) { exerciseRepairAndRetry(t, true, false, 1, expected) })
	t.Run("flush", func(t *testing.T) { exerciseRepairAndRetry(t, false, true, 2, expected) })
}
