package participant

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// TestOneCorruptConversationAmongManyIsContained corrupts one conversation
// of many: the service starts, lists exactly that one as unloadable, answers
// unavailable for it without publishing, and every other conversation keeps
// serving with its records intact.
func TestOneCorruptConversationAmongManyIsContained(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc := openService(t, mem)
	const conversations = 40
	const corrupt ConversationID = 17
	creds := map[ConversationID][2]Bound{}
	for conv := ConversationID(1); conv <= conversations; conv++ {
		a, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv))})
		if err != nil {
			t.Fatal(err)
		}
		c := svc.Connect(nil)
		b, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv) + 100)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Tell(ctx, Tell{Conversation: conv, Participant: b.Participant, Generation: 1, Token: token(1), Payload: []byte("before")}); err != nil {
			t.Fatal(err)
		}
		creds[conv] = [2]Bound{a, b}
	}
	mem.Crash()
	// Append a row whose source goes backwards: a corrupt outbox.
	bad, err := outbox.Encode(&outbox.Row{Kind: outbox.AckAdvanced, Source: 2, Participant: 0, Through: 1})
	must(t, err)
	n, err := mem.Len(outbox.Stream(corrupt))
	must(t, err)
	if _, err := mem.Append(outbox.Stream(corrupt), bad, n); err != nil {
		t.Fatal(err)
	}
	must(t, mem.Flush())

	svc = openService(t, mem)
	unl := svc.Unloadable()
	if len(unl) != 1 || unl[0].Conversation != corrupt || unl[0].Class != ClassOutboxCorrupt {
		t.Fatalf("Unloadable() = %+v, want only %v as %s", unl, corrupt, ClassOutboxCorrupt)
	}
	w := &wakeCounter{}
	c := svc.Connect(w.wake)
	a := creds[corrupt][0]
	if _, err := c.Attach(ctx, Attach{Conversation: corrupt, Participant: a.Participant, Generation: 1, Secret: a.Secret, Token: token(9)}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Attach in the corrupt conversation = %v, want unavailable", err)
	}
	if w.count() != 0 || c.HasReady() {
		t.Fatalf("the corrupt conversation published")
	}
	for conv := ConversationID(1); conv <= conversations; conv++ {
		if conv == corrupt {
			continue
		}
		a := creds[conv][0]
		ca := svc.Connect(nil)
		if _, err := ca.Attach(ctx, Attach{Conversation: conv, Participant: a.Participant, Generation: 1, Secret: a.Secret, Token: token(9)}); err != nil {
			t.Fatalf("Attach in healthy conversation %v: %v", conv, err)
		}
		ds := drainNext(ca, conv)
		if len(ds) == 0 || ds[1].Kind != outbox.KindRecord || string(ds[1].Payload) != "before" {
			t.Fatalf("healthy conversation %v offered %+v, want its records", conv, ds)
		}
	}
}

// TestAnUnreadableRegistryIsFatalAtStart: without the registry the service
// cannot know which conversations exist, so it must not serve.
func TestAnUnreadableRegistryIsFatalAtStart(t *testing.T) {
	mem := store.NewMemory()
	if _, err := mem.Append(registry.Stream, []byte{0xff, 1}, 0); err != nil {
		t.Fatal(err)
	}
	must(t, mem.Flush())
	if _, err := Open(context.Background(), mem, Options{NodeKey: testKey}); err == nil {
		t.Fatalf("Open with an unreadable registry succeeded")
	}
}

type recordingObserver struct {
	mu sync.Mutex
	// +checklocks:mu
	outcomes []string
}

func (o *recordingObserver) Operation(op, outcome string, _ time.Duration) {
	o.mu.Lock()
	o.outcomes = append(o.outcomes, op+":"+outcome)
	o.mu.Unlock()
}

// TestTheObserverTellsReplaysAndNoopsFromCommits: metrics count commits,
// so a replay or a no-op ack must not look like one.
func TestTheObserverTellsReplaysAndNoopsFromCommits(t *testing.T) {
	ctx := context.Background()
	obs := &recordingObserver{}
	svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	c := svc.Connect(nil)
	a := mustEnroll(t, c, 1, 1)
	tell := Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: token(2)}
	c.Tell(ctx, tell)
	c.Tell(ctx, tell)
	c.Ack(ctx, Ack{Conversation: 1, Participant: a.Participant, Generation: 1, Through: 0})
	c.Tell(ctx, Tell{Conversation: 1, Participant: 9, Generation: 1, Token: token(3)})
	want := []string{"enroll:ok", "tell:ok", "tell:replay", "ack:noop", "tell:unknown_participant"}
	if diff := cmp.Diff(want, obs.outcomes); diff != "" {
		t.Fatalf("observed outcomes (-want +got):\n%s", diff)
	}
}

// corruptValues is a store whose ReadValue of the keys in bad reports them
// damaged, as a value whose checksum fails does.
type corruptValues struct {
	store.DurableStore
	mu sync.Mutex
	// +checklocks:mu
	bad map[string]bool
}

func (c *corruptValues) ReadValue(key string) (uint64, error) {
	c.mu.Lock()
	bad := c.bad[key]
	c.mu.Unlock()
	if bad {
		return 0, &store.ChecksumError{File: "test", Key: key, What: "checksum 00000000 stored, 00000001 computed"}
	}
	return c.DurableStore.ReadValue(key)
}

// A token index entry found damaged by a loaded conversation's lookup is
// not taken for "never committed": the operation is refused unavailable,
// and the conversation is contained as store_corrupt from then on, while
// the others keep serving.
func TestDamagedTokenEntryContainsALoadedConversation(t *testing.T) {
	ctx := context.Background()
	st := &corruptValues{DurableStore: store.NewMemory(), bad: map[string]bool{}}
	svc := openService(t, st)
	conns := map[ConversationID]*Conn{}
	bound := map[ConversationID]Bound{}
	for conv := ConversationID(1); conv <= 2; conv++ {
		conns[conv] = svc.Connect(nil)
		bound[conv] = mustEnroll(t, conns[conv], conv, byte(conv))
	}
	st.mu.Lock()
	st.bad[tokenindex.Key(1, tokenindex.Participant(bound[1].Participant), token(7))] = true
	st.mu.Unlock()
	_, err := conns[1].Tell(ctx, Tell{Conversation: 1, Participant: bound[1].Participant, Generation: bound[1].Generation, Token: token(7), Payload: []byte("x")})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Tell whose token entry is damaged = %v, want unavailable", err)
	}
	if unl := svc.Unloadable(); len(unl) != 1 || unl[0].Conversation != 1 || unl[0].Class != ClassStoreCorrupt {
		t.Fatalf("Unloadable() = %+v, want conversation 1 as %s", unl, ClassStoreCorrupt)
	}
	_, err = conns[1].Tell(ctx, Tell{Conversation: 1, Participant: bound[1].Participant, Generation: bound[1].Generation, Token: token(8), Payload: []byte("y")})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Tell in the contained conversation = %v, want unavailable", err)
	}
	if _, err := conns[2].Tell(ctx, Tell{Conversation: 2, Participant: bound[2].Participant, Generation: bound[2].Generation, Token: token(7), Payload: []byte("z")}); err != nil {
		t.Fatalf("Tell in the other conversation = %v", err)
	}
}
