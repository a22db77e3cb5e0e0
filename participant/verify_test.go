package participant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// inspectOne runs Inspect on st and returns the report of conversation c.
func inspectOne(t *testing.T, st store.DurableStore, c ConversationID) Report {
	t.Helper()
	reports, err := Inspect(st)
	must(t, err)
	for _, r := range reports {
		if r.Conversation == c {
			return r
		}
	}
	t.Fatalf("Inspect reports %+v, no conversation %v", reports, c)
	return Report{}
}

// tellMore tells n records in conv on c as b, a binding c holds, with
// UUIDv7 tokens drawn at the clock, and returns the requests.
func tellMore(t *testing.T, c *Conn, clk *clock, conv ConversationID, b Bound, n int, seed uint64) []Tell {
	t.Helper()
	var out []Tell
	for i := range n {
		req := Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation,
			Token: v7Token(clk.Now().UnixMilli(), seed+uint64(i)), Payload: []byte(fmt.Sprintf("more %d", i))}
		_, err := c.Tell(context.Background(), req)
		must(t, err)
		out = append(out, req)
	}
	return out
}

// TestInspect_TokenIndex_HealthyConversationsPass: a conversation with
// and without a token window, before and after compaction, with rows told
// after it, has every stored row's token indexed or forgotten below the
// floor; Inspect reports no finding, and the persisted floor.
func TestInspect_TokenIndex_HealthyConversationsPass(t *testing.T) {
	for _, window := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("window %v", window), func(t *testing.T) {
			ctx := context.Background()
			clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
			mem := store.NewMemory()
			opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, TokenWindow: window, TokenSkew: 10 * time.Second, Now: clk.Now}
			svc, err := Open(ctx, mem, opts)
			must(t, err)
			defer svc.Close()
			cs, cr := svc.Connect(nil), svc.Connect(nil)
			now := clk.Now().UnixMilli()
			snd, err := cs.Enroll(ctx, Enroll{Conversation: 1, Token: v7Token(now, 1)})
			must(t, err)
			rcv, err := cr.Enroll(ctx, Enroll{Conversation: 1, Token: v7Token(now, 2)})
			must(t, err)
			_, err = cs.Ack(ctx, Ack{Conversation: 1, Participant: snd.Participant, Generation: 1, Through: 2})
			must(t, err)
			tellMore(t, cs, clk, 1, snd, 20, 100)
			_, err = cr.Ack(ctx, Ack{Conversation: 1, Participant: rcv.Participant, Generation: 1, Through: 22})
			must(t, err)
			if r := inspectOne(t, mem, 1); r.Refused != nil || !r.TokenFloor.IsZero() {
				t.Fatalf("Inspect before compaction = refused %+v, floor %v; want served, no floor", r.Refused, r.TokenFloor)
			}
			_, err = svc.CheckpointPass(ctx)
			must(t, err)
			clk.advance(2 * time.Minute)
			got, err := svc.CompactPass(ctx)
			must(t, err)
			if got.OplogRows == 0 || (window > 0) != (got.Forgotten > 0) {
				t.Fatalf("CompactPass() = %+v, want rows trimmed, tokens forgotten only under the window", got)
			}
			var wantFloor time.Time
			if window > 0 {
				// Just past the newest token forgotten: every token
				// was drawn at the start.
				wantFloor = time.UnixMilli(now + 1).UTC()
			}
			// Rows told after the compaction are stored, above the floor.
			tellMore(t, cs, clk, 1, snd, 5, 500)
			r := inspectOne(t, mem, 1)
			if r.Refused != nil || !r.TokenFloor.Equal(wantFloor) {
				t.Fatalf("Inspect after compaction = refused %+v, floor %v; want served, floor %v", r.Refused, r.TokenFloor, wantFloor)
			}
		})
	}
}

// TestInspect_TokenIndex_MissingEntryIsAFinding damages the index entry of
// a stored tell, one whose token the window did not forget: Inspect
// refuses the conversation token_index_missing, naming the row.
func TestInspect_TokenIndex_MissingEntryIsAFinding(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, TokenWindow: time.Minute, TokenSkew: 10 * time.Second, Now: clk.Now}
	// build returns a store whose conversation 1 holds 10 tells with
	// random tokens (from before the window was set), then under the
	// window 10 more and a compaction, then 5 tells above any floor; and
	// the keys of a stored random token and a stored
	// token above the floor.
	build := func(t *testing.T) (mem *store.Memory, random, above string) {
		mem = store.NewMemory()
		plain := opts
		plain.TokenWindow = 0
		svc, err := Open(ctx, mem, plain)
		must(t, err)
		h := buildHistory(t, svc, 1, 10, 3)
		must(t, svc.Close())
		svc, err = Open(ctx, mem, opts)
		must(t, err)
		defer svc.Close()
		cs := svc.Connect(nil)
		snd, err := cs.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: 1, Secret: h.sender.Secret, Token: v7Token(clk.Now().UnixMilli(), 1)})
		must(t, err)
		tellMore(t, cs, clk, 1, snd, 10, 100)
		_, err = svc.CheckpointPass(ctx)
		must(t, err)
		clk.advance(2 * time.Minute)
		_, err = svc.CompactPass(ctx)
		must(t, err)
		// The pinned rows keep every UUIDv7 token: no floor is needed,
		// and every token is above it.
		if r := inspectOne(t, mem, 1); r.Refused != nil {
			t.Fatalf("Inspect of the undamaged store = refused %+v; want served", r.Refused)
		}
		more := tellMore(t, cs, clk, 1, snd, 5, 200)
		// The 3 unacknowledged tells pin the random tokens' rows.
		random = tokenindex.Key(1, tokenindex.Participant(h.sender.Participant), benchToken(1, 9))
		above = tokenindex.Key(1, tokenindex.Participant(h.sender.Participant), more[2].Token)
		return mem, random, above
	}
	tests := []struct {
		name   string
		key    func(random, above string) string
		damage func(v uint64) uint64 // the entry's new value
	}{
		{"random token, entry deleted", func(r, _ string) string { return r }, func(uint64) uint64 { return 0 }},
		{"UUIDv7 above the floor, entry deleted", func(_, a string) string { return a }, func(uint64) uint64 { return 0 }},
		{"UUIDv7 above the floor, entry names the row before", func(_, a string) string { return a }, func(v uint64) uint64 { return v - 1 }},
		{"random token, entry names a row past the end", func(r, _ string) string { return r }, func(uint64) uint64 { return 1 << 40 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem, random, above := build(t)
			key := tt.key(random, above)
			v, err := mem.ReadValue(key)
			must(t, err)
			if v == 0 {
				t.Fatalf("the entry %s is absent before the damage", key)
			}
			if first := firstOf(t, mem, oplog.Stream(1)); v-1 < first {
				t.Fatalf("the row %d of %s is trimmed (first %d): the test needs it stored", v-1, key, first)
			}
			must(t, mem.CAS(key, v, tt.damage(v)))
			r := inspectOne(t, mem, 1)
			if r.Refused == nil || r.Refused.Class != ClassTokenIndexMissing {
				t.Fatalf("Inspect after damaging %s = refused %+v, want %s", key, r.Refused, ClassTokenIndexMissing)
			}
			if want := fmt.Sprintf("oplog row %d ", v-1); !strings.Contains(r.Refused.Reason, want) {
				t.Fatalf("reason %q does not name %q", r.Refused.Reason, want)
			}
			if tok := key[strings.LastIndexByte(key, '/')+1:]; !strings.Contains(r.Refused.Reason, tok) {
				t.Fatalf("reason %q does not name the token %s", r.Refused.Reason, tok)
			}
		})
	}
}

// trimFails is a store whose trims fail: a compaction over it stops after
// it forgot tokens and before it trimmed their rows, the state a crash
// there leaves.
type trimFails struct{ *store.Memory }

var errTrim = errors.New("test: trim fails")

func (trimFails) Trim(string, uint64) error { return errTrim }

// TestInspect_TokenIndex_ForgottenBelowTheFloorWhileStoredIsNoFinding:
// compaction under the window persisted the floor and deleted the entries
// of the tokens below it, then stopped before the trim. The rows are
// still stored without entries, which a retry refuses token_expired: not
// a finding. With the floor moved below their tokens (damage), it is.
func TestInspect_TokenIndex_ForgottenBelowTheFloorWhileStoredIsNoFinding(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	svc, err := Open(ctx, trimFails{mem}, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute,
		TokenWindow: time.Minute, TokenSkew: 10 * time.Second, Now: clk.Now})
	must(t, err)
	defer svc.Close()
	tells := windowHistory(t, svc, clk, 1, 10)
	_, err = svc.CheckpointPass(ctx)
	must(t, err)
	clk.advance(2 * time.Minute)
	if _, err := svc.CompactPass(ctx); !errors.Is(err, errTrim) {
		t.Fatalf("CompactPass() = %v, want the trim's failure", err)
	}
	if first := firstOf(t, mem, oplog.Stream(1)); first != 0 {
		t.Fatalf("oplog first = %d after a failed trim, want 0", first)
	}
	for _, req := range tells {
		if v, err := mem.ReadValue(tokenindex.Key(1, tokenindex.Participant(req.Participant), req.Token)); err != nil || v != 0 {
			t.Fatalf("the entry of a token below the floor = %d, %v, want deleted", v, err)
		}
	}
	floor, err := mem.ReadValue(tokenindex.FloorKey(1))
	must(t, err)
	r := inspectOne(t, mem, 1)
	if want := time.UnixMilli(int64(floor)).UTC(); r.Refused != nil || floor == 0 || !r.TokenFloor.Equal(want) {
		t.Fatalf("Inspect = refused %+v, floor %v; want served, floor %v", r.Refused, r.TokenFloor, want)
	}
	// A floor that does not cover the forgotten tokens is damage.
	ms, _ := tokenTime(tells[0].Token)
	must(t, mem.CAS(tokenindex.FloorKey(1), floor, uint64(ms)))
	if r := inspectOne(t, mem, 1); r.Refused == nil || r.Refused.Class != ClassTokenIndexMissing {
		t.Fatalf("Inspect with the floor at the first tell's token = refused %+v, want %s", r.Refused, ClassTokenIndexMissing)
	}
}

// TestInspect_TokenIndex_ReportsTheFirstFindingAcrossBatches damages two
// entries past the first batch of entries checkTokens reads at once:
// Inspect names the lower row.
func TestInspect_TokenIndex_ReportsTheFirstFindingAcrossBatches(t *testing.T) {
	mem := store.NewMemory()
	svc := openService(t, mem)
	h := buildHistory(t, svc, 1, tokenCheckRows+100, 0)
	must(t, svc.Close())
	var want uint64
	for _, i := range []uint64{tokenCheckRows + 90, tokenCheckRows + 50} {
		key := tokenindex.Key(1, tokenindex.Participant(h.sender.Participant), benchToken(1, i))
		v, err := mem.ReadValue(key)
		must(t, err)
		must(t, mem.CAS(key, v, 0))
		want = v - 1
	}
	r := inspectOne(t, mem, 1)
	if r.Refused == nil || r.Refused.Class != ClassTokenIndexMissing || !strings.Contains(r.Refused.Reason, fmt.Sprintf("oplog row %d ", want)) {
		t.Fatalf("Inspect = refused %+v, want %s naming oplog row %d", r.Refused, ClassTokenIndexMissing, want)
	}
}
