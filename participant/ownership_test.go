package participant

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// fakeOwnership grants what its owner map says, and counts flushes.
type fakeOwnership struct {
	st store.DurableStore

	mu sync.Mutex
	// +checklocks:mu
	owner map[ConversationID]string // "" or absent: this node
	// +checklocks:mu
	fresh map[ConversationID]bool // next grant is fresh
	// +checklocks:mu
	exists  map[ConversationID]bool
	flushed map[ConversationID]int
}

func newFakeOwnership(st store.DurableStore) *fakeOwnership {
	return &fakeOwnership{st: st, owner: map[ConversationID]string{}, fresh: map[ConversationID]bool{},
		exists: map[ConversationID]bool{}, flushed: map[ConversationID]int{}}
}

func (f *fakeOwnership) Acquire(_ context.Context, c ConversationID) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o := f.owner[c]; o != "" {
		return false, &Error{Code: CodeMoved, Owner: o}
	}
	fresh := f.fresh[c]
	f.fresh[c] = false
	return fresh, nil
}

func (f *fakeOwnership) Flush(c ConversationID) error {
	f.mu.Lock()
	f.flushed[c]++
	f.mu.Unlock()
	return f.st.Flush()
}

func (f *fakeOwnership) Holds(c ConversationID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owner[c] == ""
}

func (f *fakeOwnership) Exists(_ context.Context, c ConversationID) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exists[c], nil
}

func openOwned(t *testing.T, st store.DurableStore, own Ownership) *Service {
	t.Helper()
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, Ownership: own})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc
}

// TestOwnership_MovedAnswersWithOwnerAndCommitsNothing: a conversation the
// Ownership says is elsewhere is answered moved{owner}, even for a replay,
// and nothing is written; barriers go through Ownership.Flush.
func TestOwnership_MovedAnswersWithOwnerAndCommitsNothing(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	own := newFakeOwnership(st)
	svc := openOwned(t, st, own)
	c := svc.Connect(func() {})
	if _, err := c.Enroll(ctx, Enroll{Conversation: 5, Token: token(1)}); err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if own.flushed[5] < 2 {
		t.Fatalf("Ownership.Flush(5) called %d times, want both barriers through it", own.flushed[5])
	}
	before := oplogLen(t, st, 5)
	own.mu.Lock()
	own.owner[5] = "10.0.0.2:7420"
	own.mu.Unlock()
	_, err := c.Enroll(ctx, Enroll{Conversation: 5, Token: token(1)})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeMoved || pe.Owner != "10.0.0.2:7420" || !errors.Is(err, ErrMoved) {
		t.Fatalf("Enroll replay on a moved conversation = %v, want moved{10.0.0.2:7420}", err)
	}
	if _, err := c.Tell(ctx, Tell{Conversation: 5, Participant: 0, Generation: 1, Token: token(2)}); !errors.Is(err, ErrMoved) {
		t.Fatalf("Tell = %v, want moved", err)
	}
	if got := oplogLen(t, st, 5); got != before {
		t.Fatalf("oplog length = %d after moved answers, want %d", got, before)
	}
}

// TestOwnership_FreshGrantReconcilesFromTheStore: two services share one
// store as two nodes share etcd. B has never seen the conversation: Exists
// routes the request, the fresh grant makes B reconcile it, ending A's
// binding as died/unclean_restart (A's connection is of another
// incarnation), and B serves A's credential.
func TestOwnership_FreshGrantReconcilesFromTheStore(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	ownA, ownB := newFakeOwnership(st), newFakeOwnership(st)
	a := openOwned(t, st, ownA)
	b := openOwned(t, st, ownB)
	ca := a.Connect(func() {})
	bound, err := ca.Enroll(ctx, Enroll{Conversation: 9, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	cb := b.Connect(func() {})
	att := Attach{Conversation: 9, Participant: bound.Participant, Generation: bound.Generation, Secret: bound.Secret, Token: token(2)}
	if _, err := cb.Attach(ctx, att); !errors.Is(err, ErrUnknownParticipant) {
		t.Fatalf("Attach on b before Exists = %v, want unknown_participant", err)
	}
	ownB.mu.Lock()
	ownB.exists[9], ownB.fresh[9] = true, true
	ownB.mu.Unlock()
	ownA.mu.Lock()
	ownA.owner[9] = "b"
	ownA.mu.Unlock()
	rebound, err := cb.Attach(ctx, att)
	if err != nil {
		t.Fatalf("Attach on b after the claim: %v", err)
	}
	if rebound.Generation != bound.Generation+1 {
		t.Fatalf("generation = %d, want %d", rebound.Generation, bound.Generation+1)
	}
	entries, err := st.ReadFrom(oplog.Stream(9), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []oplog.Kind
	for _, e := range entries {
		row, err := oplog.Decode(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, row.Kind)
	}
	want := []oplog.Kind{oplog.KindGenesis, oplog.KindEnroll, oplog.KindEnd, oplog.KindAttach}
	if len(kinds) != len(want) {
		t.Fatalf("oplog kinds = %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("oplog kinds = %v, want %v", kinds, want)
		}
	}
}

// TestOwnership_AdoptedEntryOutlivesAnEnrollsUnpin: an operation that
// adopted an entry (the conversation exists elsewhere) holds it pinned, so
// the unpin of an enroll on the same, still unregistered, entry does not
// forget it under the operation: the operation's fresh grant would then
// register a forgotten entry, and the next request would make a second
// entry, and a second turn, for the same conversation.
func TestOwnership_AdoptedEntryOutlivesAnEnrollsUnpin(t *testing.T) {
	st := store.NewMemory()
	own := newFakeOwnership(st)
	svc := openOwned(t, st, own)
	own.mu.Lock()
	own.exists[9] = true
	own.mu.Unlock()
	held, err := svc.adopt(context.Background(), 9)
	if err != nil || held == nil {
		t.Fatalf("adopt = %v, %v", held, err)
	}
	enroll := svc.pin(9)
	svc.unpin(enroll)
	if got := svc.existing(9); got != held {
		t.Fatalf("after an enroll's unpin the entry is %p, want the adopted %p: forgotten under the operation holding it", got, held)
	}
	svc.unpin(held)
	if got := svc.existing(9); got != nil {
		t.Fatalf("after the last unpin of an unregistered entry it is still there")
	}
}
