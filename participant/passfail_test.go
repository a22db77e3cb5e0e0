package participant

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
)

// victim is a faultstore rule that picks the first conversation a pass
// reaches by an op of one of kinds on a name starting with prefix, and
// then decides action for every such op of that conversation while it is
// on: whatever order the pass visits the conversations in, the first it
// works on is the one that fails.
type victim struct {
	prefix string
	kinds  []faultstore.OpKind
	action faultstore.Action

	mu sync.Mutex
	// +checklocks:mu
	conv string
	// +checklocks:mu
	off bool
}

// conversationOf returns the conversation id that follows prefix in name
// ("oplog/7", "receipt/7/<index>"), "" when name does not start with it.
func conversationOf(prefix, name string) string {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

func (v *victim) Decide(op faultstore.Op) faultstore.Action {
	if !faultstore.Kind(v.kinds...)(op) {
		return faultstore.None
	}
	c := conversationOf(v.prefix, op.Name)
	if c == "" {
		return faultstore.None
	}
	v.mu.Lock()
	if v.conv == "" {
		v.conv = c
	}
	hit := !v.off && c == v.conv
	v.mu.Unlock()
	if !hit {
		return faultstore.None
	}
	return v.action
}

// id returns the conversation picked; it fails t when none was.
func (v *victim) id(t *testing.T) ConversationID {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	n, err := strconv.ParseUint(v.conv, 10, 64)
	if err != nil {
		t.Fatalf("no conversation was picked to fail (%q)", v.conv)
	}
	return ConversationID(n)
}

// heal lets every later op of the victim through.
func (v *victim) heal() {
	v.mu.Lock()
	v.off = true
	v.mu.Unlock()
}

// passConversations is how many conversations the pass tests build.
const passConversations = 8

// openPassService opens a service over st with a test clock, every
// conversation due for a checkpoint after one row, and builds
// passConversations conversations of 10 acknowledged tells each.
func openPassService(t *testing.T, st store.DurableStore) (*Service, *clock) {
	t.Helper()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	for c := ConversationID(1); c <= passConversations; c++ {
		buildHistory(t, svc, c, 10, 0)
	}
	return svc, clk
}

// checkpointed reports whether c has a checkpoint of every row it holds.
func checkpointed(t *testing.T, st store.DurableStore, c ConversationID) bool {
	t.Helper()
	ck, err := loadCheckpoint(st, c)
	must(t, err)
	return ck != nil && ck.Index == oplogLen(t, st, c)
}

// TestCheckpointPass_AFailingConversationDoesNotStopThePass: one
// conversation whose rows cannot be read (a transient store error) fails
// its own checkpoint only: the pass checkpoints every other conversation,
// whichever it reaches first, and reports the failure; once the reads
// work again a later pass checkpoints it too.
func TestCheckpointPass_AFailingConversationDoesNotStopThePass(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, _ := openPassService(t, fs)
	v := &victim{prefix: "oplog/", kinds: []faultstore.OpKind{faultstore.OpRead}, action: faultstore.Fail}
	fs.SetRules(v)
	n, err := svc.CheckpointPass(ctx)
	bad := v.id(t)
	if !errors.Is(err, faultstore.ErrInjected) || n != passConversations-1 {
		t.Fatalf("CheckpointPass with conversation %v unreadable = %d, %v; want the other %d written and the fault reported", bad, n, err, passConversations-1)
	}
	for c := ConversationID(1); c <= passConversations; c++ {
		if got := checkpointed(t, mem, c); got != (c != bad) {
			t.Errorf("conversation %v checkpointed = %v, want %v", c, got, c != bad)
		}
	}
	v.heal()
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass once %v reads again = %d, %v; want it written", bad, n, err)
	}
	if !checkpointed(t, mem, bad) {
		t.Errorf("conversation %v not checkpointed once its rows read", bad)
	}
}

// damagedReads is a memory store whose reads of one conversation's oplog,
// once damaged, fail their checksum, as a flipped bit in the data file
// does; the conversation damaged is the first whose oplog a pass reads.
type damagedReads struct {
	*store.Memory
	mu sync.Mutex
	// +checklocks:mu
	armed bool
	// +checklocks:mu
	stream string
}

// arm makes the next oplog read pick the damaged conversation.
func (d *damagedReads) arm() {
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
}

func (d *damagedReads) damaged(stream string) bool {
	if !strings.HasPrefix(stream, "oplog/") {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed && d.stream == "" {
		d.stream = stream
	}
	return stream == d.stream
}

func (d *damagedReads) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	if d.damaged(stream) {
		return nil, &store.ChecksumError{File: "test", Key: stream, What: "checksum 00000000 stored, 00000001 computed"}
	}
	return d.Memory.ReadPage(stream, offset, limit, maxBytes)
}

func (d *damagedReads) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	if d.damaged(stream) {
		return nil, &store.ChecksumError{File: "test", Key: stream, What: "checksum 00000000 stored, 00000001 computed"}
	}
	return d.Memory.ReadFrom(stream, offset, limit)
}

// TestCheckpointPass_ADamagedConversationIsContained: a conversation whose
// stored rows fail their checksum is contained as store_corrupt by the
// pass that meets the damage, as a lookup that meets it contains it; every
// other conversation is checkpointed by the same pass, and later passes
// pass over the contained one without failing.
func TestCheckpointPass_ADamagedConversationIsContained(t *testing.T) {
	ctx := context.Background()
	d := &damagedReads{Memory: store.NewMemory()}
	svc, _ := openPassService(t, d)
	d.arm()
	n, err := svc.CheckpointPass(ctx)
	d.mu.Lock()
	stream := d.stream
	d.mu.Unlock()
	id, perr := strconv.ParseUint(strings.TrimPrefix(stream, "oplog/"), 10, 64)
	must(t, perr)
	bad := ConversationID(id)
	if !errors.Is(err, store.ErrCorrupt) || n != passConversations-1 {
		t.Fatalf("CheckpointPass with conversation %v damaged = %d, %v; want the other %d written and the damage reported", bad, n, err, passConversations-1)
	}
	for c := ConversationID(1); c <= passConversations; c++ {
		if got := checkpointed(t, d.Memory, c); got != (c != bad) {
			t.Errorf("conversation %v checkpointed = %v, want %v", c, got, c != bad)
		}
	}
	if unl := svc.Unloadable(); len(unl) != 1 || unl[0].Conversation != bad || unl[0].Class != ClassStoreCorrupt {
		t.Fatalf("Unloadable() = %+v, want conversation %v as %s", unl, bad, ClassStoreCorrupt)
	}
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 0 {
		t.Fatalf("the next CheckpointPass = %d, %v; want nothing written and no failure", n, err)
	}
}

// TestCompactPass_AFailingConversationDoesNotStopThePass: one
// conversation whose receipts cannot be written (a failed write) fails
// its own compaction only: the pass compacts every other conversation,
// whichever it reaches first, trims nothing of the failing one, and
// reports the failure; once writes work again a later pass compacts it.
func TestCompactPass_AFailingConversationDoesNotStopThePass(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, clk := openPassService(t, fs)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != passConversations {
		t.Fatalf("CheckpointPass() = %d, %v, want %d, nil", n, err, passConversations)
	}
	clk.advance(2 * time.Minute)
	v := &victim{prefix: receipt.KeyPrefix, kinds: []faultstore.OpKind{faultstore.OpPutBytes}, action: faultstore.Fail}
	fs.SetRules(v)
	got, err := svc.CompactPass(ctx)
	bad := v.id(t)
	if !errors.Is(err, faultstore.ErrInjected) || got.Conversations != passConversations-1 {
		t.Fatalf("CompactPass with conversation %v's receipts failing = %+v, %v; want the other %d compacted and the fault reported", bad, got, err, passConversations-1)
	}
	for c := ConversationID(1); c <= passConversations; c++ {
		if trimmed := firstOf(t, mem, oplog.Stream(c)) > 0; trimmed != (c != bad) {
			t.Errorf("conversation %v compacted = %v, want %v", c, trimmed, c != bad)
		}
	}
	v.heal()
	if got, err := svc.CompactPass(ctx); err != nil || got.Conversations != 1 {
		t.Fatalf("CompactPass once %v's writes work = %+v, %v; want it compacted", bad, got, err)
	}
	if firstOf(t, mem, oplog.Stream(bad)) == 0 {
		t.Errorf("conversation %v not compacted once its writes work", bad)
	}
}

// TestCompactPass_ADamagedCheckpointIsContained: a conversation whose
// checkpoint fails its checksum is contained as store_corrupt by the
// compaction pass, which compacts every other conversation and, later,
// passes over the contained one without failing.
func TestCompactPass_ADamagedCheckpointIsContained(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	cv := &corruptBytes{Memory: mem}
	svc, clk := openPassService(t, cv)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != passConversations {
		t.Fatalf("CheckpointPass() = %d, %v, want %d, nil", n, err, passConversations)
	}
	clk.advance(2 * time.Minute)
	cv.arm()
	got, err := svc.CompactPass(ctx)
	bad := cv.id(t)
	if !errors.Is(err, store.ErrCorrupt) || got.Conversations != passConversations-1 {
		t.Fatalf("CompactPass with conversation %v's checkpoint damaged = %+v, %v; want the other %d compacted and the damage reported", bad, got, err, passConversations-1)
	}
	if unl := svc.Unloadable(); len(unl) != 1 || unl[0].Conversation != bad || unl[0].Class != ClassStoreCorrupt {
		t.Fatalf("Unloadable() = %+v, want conversation %v as %s", unl, bad, ClassStoreCorrupt)
	}
	for c := ConversationID(1); c <= passConversations; c++ {
		if trimmed := firstOf(t, mem, oplog.Stream(c)) > 0; trimmed != (c != bad) {
			t.Errorf("conversation %v compacted = %v, want %v", c, trimmed, c != bad)
		}
	}
	if got, err := svc.CompactPass(ctx); err != nil || got.Conversations != 0 {
		t.Fatalf("the next CompactPass = %+v, %v; want nothing compacted and no failure", got, err)
	}
}

// corruptBytes is a memory store whose checkpoint of one conversation,
// once armed, fails its checksum: the first checkpoint read after arm.
type corruptBytes struct {
	*store.Memory
	mu sync.Mutex
	// +checklocks:mu
	armed bool
	// +checklocks:mu
	key string
}

func (c *corruptBytes) arm() {
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
}

func (c *corruptBytes) id(t *testing.T) ConversationID {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := strconv.ParseUint(strings.TrimPrefix(c.key, checkpoint.KeyPrefix), 10, 64)
	if err != nil {
		t.Fatalf("no checkpoint was damaged (%q)", c.key)
	}
	return ConversationID(n)
}

func (c *corruptBytes) GetBytes(key string) ([]byte, error) {
	if strings.HasPrefix(key, checkpoint.KeyPrefix) {
		c.mu.Lock()
		if c.armed && c.key == "" {
			c.key = key
		}
		bad := key == c.key
		c.mu.Unlock()
		if bad {
			return nil, &store.ChecksumError{File: "test", Key: key, What: "checksum 00000000 stored, 00000001 computed"}
		}
	}
	return c.Memory.GetBytes(key)
}

// TestCheckpointPass_AFailingConversationIsRetriedWithBackoff: a
// conversation whose checkpoint keeps failing is retried by the next pass,
// then only after a backoff that grows with each failure in a row, each
// failure counted; its first success ends the backoff, so that its next
// failure is retried by the next pass again.
func TestCheckpointPass_AFailingConversationIsRetriedWithBackoff(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, clk := openPassService(t, fs)
	v := &victim{prefix: "oplog/", kinds: []faultstore.OpKind{faultstore.OpRead}, action: faultstore.Fail}
	fs.SetRules(v)
	failures := func() uint64 { return svc.Lifecycle().ConversationFailures[StepCheckpoint] }
	pass := func(what string, wantN int, wantFailed bool, wantFailures uint64) {
		t.Helper()
		n, err := svc.CheckpointPass(ctx)
		if n != wantN || (err != nil) != wantFailed || failures() != wantFailures {
			t.Fatalf("%s: CheckpointPass() = %d, %v with %d failures counted; want %d written, failed %v, %d failures",
				what, n, err, failures(), wantN, wantFailed, wantFailures)
		}
		if wantFailed && !errors.Is(err, faultstore.ErrInjected) {
			t.Fatalf("%s: CheckpointPass() = %v, want the injected fault", what, err)
		}
	}
	pass("the first failure", passConversations-1, true, 1)
	bad := v.id(t)
	pass("the next pass, at once", 0, true, 2)
	pass("a pass within the backoff", 0, false, 2)
	// The second failure's backoff is at most one CheckpointInterval, the
	// third's two.
	clk.advance(DefaultCheckpointInterval)
	pass("a pass after the second backoff", 0, true, 3)
	clk.advance(DefaultCheckpointInterval - time.Millisecond)
	pass("a pass within the third backoff", 0, false, 3)
	v.heal()
	clk.advance(maxStepBackoff)
	pass("a pass once the conversation reads", 1, false, 3)
	if !checkpointed(t, mem, bad) {
		t.Fatalf("conversation %v not checkpointed once its rows read", bad)
	}
	// A success ended the backoff: the next failure is the first in a row.
	buildHistory(t, svc, passConversations+1, 1, 0)
	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Name(oplog.Stream(bad))))
	c := svc.Connect(nil)
	if _, err := c.Enroll(ctx, Enroll{Conversation: bad, Token: token(0x77)}); err != nil {
		t.Fatal(err)
	}
	pass("a failure after a success", 1, true, 4)
	pass("the next pass, at once, again", 0, true, 5)
}

// TestCheckpointer_AFailingConversationDoesNotStopTheCompaction: the
// background checkpointer, whose checkpoint pass keeps failing one
// conversation (its checkpoint's write refused), still runs the compaction
// pass after it: every other conversation is checkpointed and compacted.
func TestCheckpointer_AFailingConversationDoesNotStopTheCompaction(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	const bad ConversationID = 3
	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpPutBytes), faultstore.Name(checkpoint.Key(bad))))
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now, CheckpointInterval: time.Millisecond})
	must(t, err)
	defer svc.Close()
	for c := ConversationID(1); c <= passConversations; c++ {
		buildHistory(t, svc, c, 10, 0)
	}
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	await := func(what string, done func(c ConversationID) bool) {
		t.Helper()
		for {
			all := true
			for c := ConversationID(1); c <= passConversations; c++ {
				if c != bad && !done(c) {
					all = false
				}
			}
			if all {
				return
			}
			select {
			case <-deadline.C:
				t.Fatalf("the background checkpointer left a conversation other than %v not %s in 30 s", bad, what)
			case <-tick.C:
			}
		}
	}
	await("checkpointed", func(c ConversationID) bool { return checkpointed(t, mem, c) })
	clk.advance(2 * time.Minute)
	await("compacted", func(c ConversationID) bool { return firstOf(t, mem, oplog.Stream(c)) > 0 })
	if ck, err := loadCheckpoint(mem, bad); err != nil || ck != nil {
		t.Fatalf("checkpoint of %v = %v, %v; want none (its write refused)", bad, ck, err)
	}
}
