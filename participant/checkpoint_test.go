package participant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// rowCounter is a memory store that counts the oplog entries readers take.
type rowCounter struct {
	*store.Memory

	mu sync.Mutex
	// +checklocks:mu
	read map[string]int
}

func (r *rowCounter) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	page, err := r.Memory.ReadPage(stream, offset, limit, maxBytes)
	r.mu.Lock()
	r.read[stream] += len(page)
	r.mu.Unlock()
	return page, err
}

func (r *rowCounter) reset() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.read
	r.read = map[string]int{}
	return old
}

// history is a conversation built through the service: a sender, a reader
// that acknowledged all but the last `unacked` tells, the tells as sent,
// and what the reader must still be offered.
type history struct {
	sender, reader Bound
	tells          []Tell
	pending        []string
}

func buildHistory(t *testing.T, svc *Service, conv ConversationID, tells, unacked int) history {
	t.Helper()
	return buildHistoryTokens(t, svc, conv, tells, unacked, func(n int) Token {
		if n < 2 {
			return token(byte(n + 1))
		}
		return benchToken(uint64(conv), uint64(n-2))
	})
}

// buildHistoryTokens is buildHistory with the tokens tok draws: n 0 and 1
// for the sender's and the reader's enrolls, 2+i for tell i.
func buildHistoryTokens(t *testing.T, svc *Service, conv ConversationID, tells, unacked int, tok func(n int) Token) history {
	t.Helper()
	ctx := context.Background()
	cs, cr := svc.Connect(nil), svc.Connect(nil)
	var h history
	var err error
	h.sender, err = cs.Enroll(ctx, Enroll{Conversation: conv, Token: tok(0)})
	must(t, err)
	h.reader, err = cr.Enroll(ctx, Enroll{Conversation: conv, Token: tok(1)})
	must(t, err)
	_, err = cs.Ack(ctx, Ack{Conversation: conv, Participant: h.sender.Participant, Generation: 1, Through: 2})
	must(t, err)
	for i := range tells {
		body := fmt.Sprintf("tell %d of %v", i, conv)
		req := Tell{Conversation: conv, Participant: h.sender.Participant, Generation: 1, Token: tok(2 + i), Payload: []byte(body)}
		told, err := cs.Tell(ctx, req)
		must(t, err)
		h.tells = append(h.tells, req)
		if i < tells-unacked {
			_, err := cr.Ack(ctx, Ack{Conversation: conv, Participant: h.reader.Participant, Generation: 1, Through: told.Seq})
			must(t, err)
		} else {
			h.pending = append(h.pending, body)
		}
	}
	return h
}

var stateOpts = cmp.Options{
	cmpopts.IgnoreUnexported(outbox.State{}, outbox.Record{}, oplog.ConnID{}),
	// The retained records, their recipients and payloads are behind
	// methods.
	cmp.Transformer("retained", func(rs outbox.Retention) []retainedView {
		var out []retainedView
		for _, r := range rs.All() {
			out = append(out, retainedView{r.Record(), r.Source, r.Payload(), r.PayloadLen(), r.Evicted})
		}
		return out
	}),
	cmpopts.EquateEmpty(),
}

// retainedView is an outbox.Retained with every field exported.
type retainedView struct {
	Record     outbox.Record
	Source     uint64
	Payload    []byte
	PayloadLen int
	Evicted    bool
}

// TestCheckpoint_StartReplaysOnlyTheRowsAfterIt checkpoints a conversation
// with unacknowledged records, adds rows, and reconciles: the state equals
// the one a replay from row 0 builds (payloads included), while only the
// rows after the checkpoint (and those holding unacknowledged payloads)
// are read. After a restart the reader is offered exactly its pending
// records.
func TestCheckpoint_StartReplaysOnlyTheRowsAfterIt(t *testing.T) {
	ctx := context.Background()
	rc := &rowCounter{Memory: store.NewMemory(), read: map[string]int{}}
	svc, err := Open(ctx, rc, Options{NodeKey: testKey, CheckpointRows: 16})
	must(t, err)
	h := buildHistory(t, svc, 1, 200, 5)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	// Rows after the checkpoint: three more tells, unacknowledged.
	cs := svc.Connect(nil)
	sender, err := cs.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: 1, Secret: h.sender.Secret, Token: token(0x77)})
	must(t, err)
	for i := range 3 {
		body := fmt.Sprintf("after %d", i)
		_, err := cs.Tell(ctx, Tell{Conversation: 1, Participant: sender.Participant, Generation: sender.Generation, Token: benchToken(99, uint64(i)), Payload: []byte(body)})
		must(t, err)
		h.pending = append(h.pending, body)
	}
	must(t, svc.Close())

	ck, err := loadCheckpoint(rc, 1)
	if err != nil || ck == nil {
		t.Fatalf("loadCheckpoint(1) = %v, %v, want a checkpoint", ck, err)
	}
	p := pages{budget: newByteBudget(1 << 30), bytes: DefaultReadPageBytes}
	rc.reset()
	fromCk, err := reconcile(ctx, rc, 1, p)
	must(t, err)
	read := rc.reset()[oplog.Stream(1)]
	total := oplogLen(t, rc.Memory, 1)
	if after := int(total - ck.Index); read > after+1+5 {
		t.Errorf("reconcile from the checkpoint read %d oplog rows; %d follow the checkpoint, 5 hold pending payloads", read, after)
	}
	cs2 := rc.Memory
	must(t, cs2.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: nil}}))
	fromZero, err := reconcile(ctx, rc, 1, p)
	must(t, err)
	if read := rc.reset()[oplog.Stream(1)]; read != int(total) {
		t.Errorf("reconcile without a checkpoint read %d oplog rows, want all %d", read, total)
	}
	if diff := cmp.Diff(fromZero.State, fromCk.State, stateOpts); diff != "" {
		t.Fatalf("state from the checkpoint differs from the replay from row 0 (-zero +checkpoint):\n%s", diff)
	}
	if fromZero.Stored != fromCk.Stored || len(fromCk.Repairs) != 0 {
		t.Fatalf("reconcile from the checkpoint: stored %d repairs %d, from row 0 stored %d", fromCk.Stored, len(fromCk.Repairs), fromZero.Stored)
	}

	// Put it back and restart: the reader gets exactly what it has not
	// acknowledged.
	enc, err := checkpoint.Encode(ck)
	must(t, err)
	must(t, cs2.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
	must(t, cs2.Flush())
	svc = openService(t, rc)
	cr := svc.Connect(nil)
	_, err = cr.Attach(ctx, Attach{Conversation: 1, Participant: h.reader.Participant, Generation: 1, Secret: h.reader.Secret, Token: token(0x78)})
	must(t, err)
	var got []string
	for _, d := range drainNext(cr, 1) {
		if d.Kind == outbox.KindRecord {
			got = append(got, string(d.Payload))
		}
	}
	if diff := cmp.Diff(h.pending, got); diff != "" {
		t.Fatalf("records offered after a restart from the checkpoint (-want +got):\n%s", diff)
	}
}

// TestCheckpointPass_BudgetSplitsAndResumes gives a pass fewer rows than a
// conversation is behind: it checkpoints part of the way, the next pass
// resumes from there, and the result equals one derivation from row 0.
func TestCheckpointPass_BudgetSplitsAndResumes(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 8, CheckpointPassRows: 100})
	must(t, err)
	defer svc.Close()
	buildHistory(t, svc, 1, 120, 3) // about 245 rows
	total := oplogLen(t, mem, 1)
	var indices []uint64
	for range 5 {
		n, err := svc.CheckpointPass(ctx)
		must(t, err)
		if n == 0 {
			break
		}
		ck, err := loadCheckpoint(mem, 1)
		must(t, err)
		indices = append(indices, ck.Index)
	}
	if want := []uint64{100, 200, total}; !cmp.Equal(indices, want) {
		t.Fatalf("checkpoint indices over passes = %v, want %v", indices, want)
	}
	ck, err := loadCheckpoint(mem, 1)
	must(t, err)
	p := pages{budget: newByteBudget(1 << 30), bytes: DefaultReadPageBytes}
	whole, err := deriveCheckpoint(ctx, mem, 1, p, nil, total, time.Now(), DefaultRetain)
	must(t, err)
	ck.Marks, whole.Marks = nil, nil
	a, _ := checkpoint.Encode(ck)
	b, _ := checkpoint.Encode(whole)
	if !bytes.Equal(a, b) {
		t.Fatal("checkpoint built in three passes differs from one derived from row 0")
	}
}

// TestDerive_PayloadBytesCountsOnlyHeldPayloads derives a checkpoint of a
// history with records nobody acknowledged and checks the derivation's
// own state: it drops every payload as it applies the row (a checkpoint
// names rows, it does not hold them), so it must count none of them. It
// counted every one it had dropped, a state that lied about what it held
// to whoever would reuse it.
func TestDerive_PayloadBytesCountsOnlyHeldPayloads(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey})
	must(t, err)
	defer svc.Close()
	buildHistory(t, svc, 1, 40, 3)
	p := pages{budget: newByteBudget(1 << 30), bytes: DefaultReadPageBytes}
	_, rb, err := derive(ctx, mem, 1, p, nil, oplogLen(t, mem, 1), time.Now(), DefaultRetain)
	must(t, err)
	if rb.state.Records.Len() == 0 {
		t.Fatal("the history retains no records: nothing to check")
	}
	var held int64
	for _, r := range rb.state.Records.All() {
		held += int64(len(r.Payload()))
	}
	if held != 0 || rb.state.PayloadBytes != held {
		t.Fatalf("derivation holds %d payload bytes and counts %d, want 0 and 0", held, rb.state.PayloadBytes)
	}
}

// TestCheckpoint_BadCheckpointIsARefusal damages checkpoints in the ways a
// disk, an operator or a bug could, and checks that each conversation is
// contained with the right class while the others serve: never a silent
// fallback to a replay from another starting point.
func TestCheckpoint_BadCheckpointIsARefusal(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		damage func(t *testing.T, mem *store.Memory, good []byte)
		class  string
	}{
		{"flipped bit", func(t *testing.T, mem *store.Memory, good []byte) {
			bad := bytes.Clone(good)
			bad[len(bad)/2] ^= 0x10
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: bad}}))
		}, ClassCheckpointCorrupt},
		{"unknown version", func(t *testing.T, mem *store.Memory, good []byte) {
			bad := bytes.Clone(good)
			bad[0] = 9
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: bad}}))
		}, ClassCheckpointCorrupt},
		{"truncated", func(t *testing.T, mem *store.Memory, good []byte) {
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: good[:3]}}))
		}, ClassCheckpointCorrupt},
		{"another conversation's checkpoint", func(t *testing.T, mem *store.Memory, good []byte) {
			other, err := mem.GetBytes(checkpoint.Key(2))
			must(t, err)
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: other}}))
		}, ClassCheckpointMismatch},
		{"past the oplog", func(t *testing.T, mem *store.Memory, good []byte) {
			ck, err := checkpoint.Decode(good)
			must(t, err)
			ck.Index += 1000
			enc, err := checkpoint.Encode(ck)
			must(t, err)
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
		}, ClassCheckpointMismatch},
		{"oplog compacted, checkpoint gone", func(t *testing.T, mem *store.Memory, good []byte) {
			must(t, mem.Trim(oplog.Stream(1), 3))
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: nil}}))
		}, ClassCheckpointMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := store.NewMemory()
			svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1})
			must(t, err)
			buildHistory(t, svc, 1, 20, 2)
			buildHistory(t, svc, 2, 10, 0)
			if n, err := svc.CheckpointPass(ctx); err != nil || n != 2 {
				t.Fatalf("CheckpointPass() = %d, %v, want 2, nil", n, err)
			}
			must(t, svc.Close())
			good, err := mem.GetBytes(checkpoint.Key(1))
			must(t, err)
			tt.damage(t, mem, good)
			must(t, mem.Flush())

			svc = openService(t, mem)
			unl := svc.Unloadable()
			if len(unl) != 1 || unl[0].Conversation != 1 || unl[0].Class != tt.class {
				t.Fatalf("Unloadable() = %+v, want conversation 1 as %s", unl, tt.class)
			}
			c := svc.Connect(nil)
			_, err = c.Enroll(ctx, Enroll{Conversation: 1, Token: token(0x99)})
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeUnavailable {
				t.Fatalf("Enroll in the refused conversation = %v, want unavailable", err)
			}
			if _, err := c.Enroll(ctx, Enroll{Conversation: 2, Token: token(0x99)}); err != nil {
				t.Fatalf("Enroll in the healthy conversation: %v", err)
			}
		})
	}
}

// TestInspect_ReplaysACheckpointFromRowZero stores a checkpoint that is
// well formed and matches its streams' digests but lies about a cursor: a
// start cannot tell without replaying, and Inspect (participantctl verify)
// replays and refuses it.
func TestInspect_ReplaysACheckpointFromRowZero(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1})
	must(t, err)
	buildHistory(t, svc, 1, 20, 2)
	buildHistory(t, svc, 2, 5, 1)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 2 {
		t.Fatalf("CheckpointPass() = %d, %v, want 2, nil", n, err)
	}
	must(t, svc.Close())
	reports, err := Inspect(mem)
	must(t, err)
	for _, r := range reports {
		if r.Refused != nil {
			t.Fatalf("Inspect refused %v before any damage: %+v", r.Conversation, r.Refused)
		}
	}
	good, err := mem.GetBytes(checkpoint.Key(1))
	must(t, err)
	ck, err := checkpoint.Decode(good)
	must(t, err)
	ck.Members[1].Cursor--
	enc, err := checkpoint.Encode(ck)
	must(t, err)
	must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
	reports, err = Inspect(mem)
	must(t, err)
	for _, r := range reports {
		switch {
		case r.Conversation == 1 && (r.Refused == nil || r.Refused.Class != ClassCheckpointMismatch):
			t.Fatalf("Inspect(1) refused = %+v, want %s", r.Refused, ClassCheckpointMismatch)
		case r.Conversation == 2 && r.Refused != nil:
			t.Fatalf("Inspect(2) refused = %+v, want served", r.Refused)
		}
	}
}

// TestCheckpointer_RunsInTheBackgroundUntilClose starts the background
// checkpointer and waits for it to write; Close stops it (goleak checks
// the package).
func TestCheckpointer_RunsInTheBackgroundUntilClose(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1, CheckpointInterval: time.Millisecond})
	must(t, err)
	defer svc.Close()
	buildHistory(t, svc, 1, 3, 0)
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if ck, err := loadCheckpoint(mem, 1); err == nil && ck != nil && ck.Index == oplogLen(t, mem, 1) {
			return
		}
		select {
		case <-deadline.C:
			t.Fatal("the background checkpointer wrote no checkpoint of the whole conversation in 30 s")
		case <-tick.C:
		}
	}
}

// boundedValues is a memory store whose byte values are bounded, as etcd's
// request size bounds the etcd store's.
type boundedValues struct {
	*store.Memory
	max int
}

func (b *boundedValues) PutBytes(values []store.Bytes) error {
	for _, v := range values {
		if len(v.Value) > b.max {
			return fmt.Errorf("value %q of %d bytes: %w", v.Key, len(v.Value), store.ErrTooLarge)
		}
	}
	return b.Memory.PutBytes(values)
}

// TestCheckpointPass_AnOversizedCheckpointHoldsBackOnlyItsConversation: a
// checkpoint the store cannot take (too many members for one value) is
// skipped and logged; the other conversations' checkpoints of the same
// pass are written.
func TestCheckpointPass_AnOversizedCheckpointHoldsBackOnlyItsConversation(t *testing.T) {
	ctx := context.Background()
	bv := &boundedValues{Memory: store.NewMemory(), max: 2048}
	svc, err := Open(ctx, bv, Options{NodeKey: testKey, CheckpointRows: 1})
	must(t, err)
	buildHistory(t, svc, 1, 10, 0) // small: two members
	for i := range 80 {            // large: 80 members
		_, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 2, Token: benchToken(2, uint64(i))})
		must(t, err)
	}
	n, err := svc.CheckpointPass(ctx)
	if err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1 (conversation 1), nil", n, err)
	}
	if ck, err := loadCheckpoint(bv, 1); err != nil || ck == nil {
		t.Fatalf("checkpoint of 1 = %v, %v, want written", ck, err)
	}
	if ck, err := loadCheckpoint(bv, 2); err != nil || ck != nil {
		t.Fatalf("checkpoint of 2 = %v, %v, want none (too large)", ck, err)
	}
}

// TestCheckpoint_SizeDoesNotGrowWithTheRetainedRecords: a checkpoint
// names where its conversation's retained records are stored instead of
// holding a copy of each, so that a recipient that never acknowledges
// costs a checkpoint, its derivation and every pass that reads it the same
// whatever it was sent. Two conversations of 200 tells, one retaining 8
// records and one 190, must have checkpoints of the same size, within
// what their marks may differ by; and both must load back to the state a
// replay from row 0 builds.
func TestCheckpoint_SizeDoesNotGrowWithTheRetainedRecords(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 16})
	must(t, err)
	buildHistory(t, svc, 1, 200, 8)
	buildHistory(t, svc, 2, 200, 190)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 2 {
		t.Fatalf("CheckpointPass() = %d, %v, want 2, nil", n, err)
	}
	must(t, svc.Close())
	size := map[ConversationID]int{}
	for _, c := range []ConversationID{1, 2} {
		b, err := mem.GetBytes(checkpoint.Key(c))
		if err != nil || b == nil {
			t.Fatalf("GetBytes(checkpoint of %v) = %x, %v", c, b, err)
		}
		size[c] = len(b)
	}
	if slack := 2 * 32; size[2] > size[1]+slack {
		t.Errorf("checkpoint retaining 190 records is %d bytes, retaining 8 is %d: want within %d bytes", size[2], size[1], slack)
	}
	p := pages{budget: newByteBudget(1 << 30), bytes: DefaultReadPageBytes}
	for _, c := range []ConversationID{1, 2} {
		fromCk, err := reconcile(ctx, mem, c, p)
		must(t, err)
		if got, want := fromCk.State.Records.Len(), map[ConversationID]int{1: 8, 2: 190}[c]; got != want {
			t.Errorf("conversation %v loads %d retained records from its checkpoint, want %d", c, got, want)
		}
		ck, err := mem.GetBytes(checkpoint.Key(c))
		must(t, err)
		must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(c), Value: nil}}))
		fromZero, err := reconcile(ctx, mem, c, p)
		must(t, err)
		must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(c), Value: ck}}))
		if diff := cmp.Diff(fromZero.State, fromCk.State, stateOpts); diff != "" {
			t.Fatalf("conversation %v: state from the checkpoint differs from the replay from row 0 (-zero +checkpoint):\n%s", c, diff)
		}
	}
}
