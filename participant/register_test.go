package participant

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
)

// TestEnrollIntoANewConversationFlushesTwice: the registry entry rides
// barrier 1 with the genesis row (the store keeps a prefix of writes, so
// the row is never durable without it), so a first enroll costs the two
// barriers of any operation, not a third flush of its own.
func TestEnrollIntoANewConversationFlushesTwice(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	cs := &countingStore{DurableStore: mem}
	svc := openService(t, cs)
	c := svc.Connect(nil)
	for conv := ConversationID(1); conv <= 3; conv++ {
		cs.mu.Lock()
		before := cs.flushes
		cs.mu.Unlock()
		if _, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv))}); err != nil {
			t.Fatalf("Enroll(%v): %v", conv, err)
		}
		cs.mu.Lock()
		flushes := cs.flushes - before
		cs.mu.Unlock()
		if flushes != 2 {
			t.Fatalf("Enroll into new conversation %v made %d flushes, want 2", conv, flushes)
		}
	}
	// The registry holds each conversation once, durably.
	mem.Crash()
	regs, err := readRegistry(mem)
	if err != nil {
		t.Fatalf("readRegistry: %v", err)
	}
	if len(regs) != 3 {
		t.Fatalf("registry after a crash = %v, want 3 conversations", regs)
	}
}

// registryApart is a store that keeps the order of each conversation's
// writes but not that of the registry's with them, as the etcd store
// laid out in scopes does (store.ScopeOrdered: the registry in the
// global scope): a new conversation's first batch flushes its registry
// entry before its rows (batch.write).
type registryApart struct{ *faultstore.Store }

func (registryApart) KeepsOrder() bool { return false }

func (registryApart) KeepsOrderWithin(names ...string) bool {
	return !slices.Contains(names, registry.Stream)
}

// TestRegister_AFailedRegistryFlushLeavesTheConversationUnregistered
// fails the flush of a new conversation's registry entry, which its first
// batch makes before its rows on a store that does not keep the
// registry's order with the conversation's, and retries in the same
// process. The enroll is answered unavailable and nothing of it is
// durable: the conversation is not registered (Status knows nothing of
// it, and memory keeps no entry of it, as for any enroll that created
// nothing). It was marked registered before the flush, so it stayed
// listed and held, and a retry skipped the registry, relying on the
// entry whose flush had failed: here the flush of the conversation's
// reload made that entry durable before the retry's rows (the check
// below passed), and on the etcd store a failed global scope fails the
// service, so no retry commits; a store that dropped a failed flush's
// writes and went on would have kept the retry's rows without an entry.
// Now the retry registers again, durable before its rows (a second entry
// of one conversation is read once), and after a crash the enroll
// replays.
func TestRegister_AFailedRegistryFlushLeavesTheConversationUnregistered(t *testing.T) {
	ctx := context.Background()
	const conv = 5
	req := Enroll{Conversation: conv, Token: token(1)}
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	failReg := faultstore.NewSwitch(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(registry.Stream))))
	fs.SetRules(failReg)
	// The observer follows whether the registry has an append no flush
	// made durable yet when an oplog row of conv is appended.
	var (
		mu      sync.Mutex
		ops     []string
		bad     string
		pending bool
	)
	fs.SetObserver(func(op faultstore.Op, _ faultstore.Action, err error) {
		mu.Lock()
		defer mu.Unlock()
		ops = append(ops, op.String())
		switch {
		case err != nil:
		case op.Kind == faultstore.OpAppend && op.Name == registry.Stream:
			pending = true
		case op.Kind == faultstore.OpFlush && slices.Contains(op.Pending, registry.Stream):
			pending = false
		case op.Kind == faultstore.OpAppend && op.Name == oplog.Stream(conv) && pending && bad == "":
			bad = op.String()
		}
	})
	svc := openService(t, registryApart{fs})
	c := svc.Connect(nil)

	failReg.Set(true)
	if _, err := c.Enroll(ctx, req); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Enroll whose registry flush failed = %v, want unavailable", err)
	}
	svc.waitReloads()
	if st, ok := svc.Status(conv); ok {
		t.Errorf("after the failed registry flush, Status(%v) = %+v, want no such conversation", conv, st)
	}
	if svc.existing(conv) != nil {
		t.Errorf("after the failed registry flush, memory holds an entry of conversation %v", conv)
	}

	// The retry: its registry entry is durable before its first row.
	mu.Lock()
	ops = nil
	mu.Unlock()
	bound, err := c.Enroll(ctx, req)
	fs.SetObserver(nil)
	if err != nil {
		t.Fatalf("the retry in the same process = %v", err)
	}
	mu.Lock()
	if bad != "" {
		t.Errorf("the retry appended %s while its registry entry was not durable; its ops: %v", bad, ops)
	}
	mu.Unlock()

	svc.Close()
	mem.Crash()
	regs, err := readRegistry(mem)
	if err != nil || !slices.Contains(regs, conv) {
		t.Fatalf("registry after a crash = %v, %v; want conversation %v", regs, err, conv)
	}
	svc = openService(t, mem)
	again, err := svc.Connect(nil).Enroll(ctx, req)
	if err != nil || again.Participant != bound.Participant || again.Generation != bound.Generation || again.Secret != bound.Secret {
		t.Fatalf("the enroll after a crash = %+v, %v, want %+v replayed", again, err, bound)
	}
}
