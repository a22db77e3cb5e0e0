package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/tokenindex"
)

// buildData makes a data directory whose store holds conversations 1 and 2,
// each with two participants and a record, through the service, then lets
// damage write to the store before it is closed.
func buildData(t *testing.T, damage func(st *boltstore.Store)) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, storeFile), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := participant.Open(ctx, st, participant.Options{NodeKey: make([]byte, participant.NodeKeySize)})
	if err != nil {
		t.Fatal(err)
	}
	conn := svc.Connect(nil)
	other := svc.Connect(nil)
	for conv := participant.ConversationID(1); conv <= 2; conv++ {
		a, err := conn.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participant.Token{byte(conv), 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participant.Token{byte(conv), 2}}); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Tell(ctx, participant.Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation,
			Token: participant.Token{byte(conv), 3}, Payload: []byte("hi")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if damage != nil {
		damage(st)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerify_CleanStore_OK(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, nil)
	before := snapshot(t, dir)
	out := mustCtl(t, ctx, "verify", "--data", dir)
	if out != "conversation 1: ok\nconversation 2: ok\n" {
		t.Errorf("verify = %q", out)
	}
	out = mustCtl(t, ctx, "inspect", "--data", dir)
	for _, want := range []string{"conversation 1: oplog 4 rows, outbox 3 rows, last seq 3", "participant 0: generation 1 cursor 0 bound"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect = %q, want %q in it", out, want)
		}
	}
	if after := snapshot(t, dir); after != before {
		t.Errorf("store after verify and inspect = %s, want %s unchanged", after, before)
	}
}

// snapshot is the sha256 of every file of dir, by name: what the offline
// tools must leave byte for byte as they found it.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var s strings.Builder
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&s, "%s=%x ", e.Name(), sha256.Sum256(raw))
	}
	return s.String()
}

func TestVerify_CorruptOutboxRow_RefusedExit1(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, func(st *boltstore.Store) {
		n, err := st.Len(outbox.Stream(2))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append(outbox.Stream(2), []byte{outbox.Version, 0xc1, 0xff}, n); err != nil {
			t.Fatal(err)
		}
		if err := st.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	out, errs, code := ctl(ctx, "", "verify", "--data", dir)
	if code != 1 {
		t.Errorf("verify = exit %d, want 1", code)
	}
	if !strings.Contains(out, "conversation 1: ok\n") || !strings.Contains(out, "conversation 2: refused "+participant.ClassOutboxCorrupt) {
		t.Errorf("verify = %q, want 1 ok and 2 refused %s", out, participant.ClassOutboxCorrupt)
	}
	if !strings.Contains(errs, "1 of 2 conversations refused") {
		t.Errorf("verify stderr = %q", errs)
	}
	out = mustCtl(t, ctx, "inspect", "--data", dir)
	if !strings.Contains(out, "UNLOADABLE "+participant.ClassOutboxCorrupt) {
		t.Errorf("inspect = %q, want conversation 2 unloadable", out)
	}
}

func TestVerify_MissingOutboxSuffix_WouldRepair(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, func(st *boltstore.Store) {
		// A later oplog row whose outbox rows never got written: copy of
		// conversation 1's history into conversation 3 without its outbox
		// (with its token index, which every commit writes first).
		oplogRows, err := readStream(st, "oplog/1")
		if err != nil {
			t.Fatal(err)
		}
		reg, _ := st.Len(registry.Stream)
		if _, err := st.Append(registry.Stream, registry.Encode(registry.Entry{Conversation: 3}), reg); err != nil {
			t.Fatal(err)
		}
		for i, b := range oplogRows {
			row, err := oplog.Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if row.Kind.HasToken() {
				if err := st.CAS(tokenindex.RowKey(3, &row), 0, tokenindex.Value(uint64(i))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := st.Append("oplog/3", b, uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	out, _, code := ctl(ctx, "", "verify", "--data", dir, "--json")
	if code != 0 || !strings.Contains(out, `{"conversation":3,"status":"repair","repair_rows":3}`) {
		t.Errorf("verify = %d, %q; want conversation 3 to repair 3 rows", code, out)
	}
}

func TestOffline_NoStore_Fails(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	if _, errs, code := ctl(ctx, "", "verify", "--data", dir); code != 1 || !strings.Contains(errs, "no store") {
		t.Errorf("verify on an empty dir = %d, %q", code, errs)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("verify created %d files in an empty data directory", len(entries))
	}
}

// readStream returns every payload of stream.
func readStream(st store.DurableStore, stream string) ([][]byte, error) {
	entries, err := st.ReadFrom(stream, 0, 0)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(entries))
	for i, e := range entries {
		out[i] = e.Payload
	}
	return out, nil
}

func TestOffline_EmptyStore_FailsAndCreatesNothing(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, storeFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	for _, cmd := range []string{"verify", "inspect"} {
		if _, errs, code := ctl(ctx, "", cmd, "--data", dir); code != 1 || !strings.Contains(errs, "no store") {
			t.Errorf("%s on a 0-byte store = %d, %q; want exit 1, no store", cmd, code, errs)
		}
	}
	if after := snapshot(t, dir); after != before {
		t.Errorf("data directory after verify and inspect = %s, want %s", after, before)
	}
}

func TestVerify_DamagedStore_ReportsExit1(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"truncated to half", func(t *testing.T, path string) {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, fi.Size()/2/4096*4096); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta pages flipped", func(t *testing.T, path string) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			raw[16+8] ^= 0xff      // page 0's page size
			raw[4096+16+8] ^= 0xff // page 1's
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			dir := buildData(t, nil)
			path := filepath.Join(dir, storeFile)
			tc.damage(t, path)
			before := snapshot(t, dir)
			for _, cmd := range []string{"verify", "inspect"} {
				_, errs, code := ctl(ctx, "", cmd, "--data", dir)
				if code != 1 || !strings.Contains(errs, path) || !strings.Contains(errs, "damaged") || !strings.Contains(errs, "backup") {
					t.Errorf("%s = exit %d, %q; want 1 and a message naming %s and what to do", cmd, code, errs, path)
				}
			}
			if after := snapshot(t, dir); after != before {
				t.Errorf("verify changed a damaged data directory")
			}
		})
	}
}

// TestVerify_CorruptBranchPage_ReportsExit1 damages the branch pages of a
// store big enough to have them: verify reads them, reports the damage and
// exits 1 instead of crashing in bbolt.
func TestVerify_CorruptBranchPage_ReportsExit1(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, func(st *boltstore.Store) {
		pad := strings.Repeat("p", 200)
		for i := uint64(0); i < 2000; i++ {
			if _, err := st.Append("pad", []byte(pad), i); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	path := filepath.Join(dir, storeFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	n := 0
	for id := 2; (id+1)*ps <= len(raw); id++ {
		p := raw[id*ps : (id+1)*ps]
		if binary.LittleEndian.Uint64(p) != uint64(id) || binary.LittleEndian.Uint16(p[8:]) != 0x01 {
			continue // not a branch page
		}
		for i := 0; i < int(binary.LittleEndian.Uint16(p[10:])); i++ {
			binary.LittleEndian.PutUint64(p[16+16*i+8:], 1<<40) // child page id past the file
		}
		n++
	}
	if n == 0 {
		t.Fatal("no branch page to corrupt")
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := ctl(ctx, "", "verify", "--data", dir)
	if code != 1 || !strings.Contains(errs, path) || !strings.Contains(errs, "damaged") {
		t.Errorf("verify = exit %d, %q; want 1 and the damage named", code, errs)
	}
}

// TestVerify_TokenIndexMissing_RefusedAndInspectShowsTheFloor deletes the
// token index entry of conversation 1's tell (a random token, which no
// window forgets) and persists a token floor for conversation 2: verify
// refuses 1 token_index_missing and exits 1; inspect prints 2's floor, in
// text and in JSON.
func TestVerify_TokenIndexMissing_RefusedAndInspectShowsTheFloor(t *testing.T) {
	ctx := testCtx(t)
	floor := time.UnixMilli(1_700_000_000_123).UTC()
	dir := buildData(t, func(st *boltstore.Store) {
		key := tokenindex.Key(1, tokenindex.Participant(0), participant.Token{1, 3})
		v, err := st.ReadValue(key)
		if err != nil || v == 0 {
			t.Fatalf("ReadValue(%s) = %d, %v; want the tell's entry", key, v, err)
		}
		if err := st.CAS(key, v, 0); err != nil {
			t.Fatal(err)
		}
		if err := st.CAS(tokenindex.FloorKey(2), 0, uint64(floor.UnixMilli())); err != nil {
			t.Fatal(err)
		}
		if err := st.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	out, _, code := ctl(ctx, "", "verify", "--data", dir)
	if code != 1 || !strings.Contains(out, "conversation 1: refused "+participant.ClassTokenIndexMissing+": oplog row 3 ") ||
		!strings.Contains(out, "conversation 2: ok\n") {
		t.Errorf("verify = %d, %q; want exit 1, conversation 1 refused %s naming oplog row 3, 2 ok", code, out, participant.ClassTokenIndexMissing)
	}
	out = mustCtl(t, ctx, "inspect", "--data", dir)
	if want := "conversation 2: oplog 4 rows, outbox 3 rows, last seq 3\n  token floor 2023-11-14T22:13:20.123Z "; !strings.Contains(out, want) {
		t.Errorf("inspect = %q, want %q in it", out, want)
	}
	if strings.Count(out, "token floor") != 1 {
		t.Errorf("inspect = %q, want one token floor (conversation 1 has none)", out)
	}
	var rep inspectReport
	if err := json.Unmarshal([]byte(mustCtl(t, ctx, "inspect", "--data", dir, "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	var floors []time.Time
	for _, c := range rep.Conversations {
		floors = append(floors, c.TokenFloor)
	}
	if diff := cmp.Diff([]time.Time{{}, floor}, floors); diff != "" {
		t.Errorf("inspect --json token floors of conversations 1, 2 (-want +got):\n%s", diff)
	}
}

// TestVerify_FlippedPayloadBit_NamesTheValue flips one bit of a told
// payload in the data file: every page and key is in place, and only the
// value's checksum tells. verify and inspect exit 1 naming the file and
// the stream entry, and change nothing.
func TestVerify_FlippedPayloadBit_NamesTheValue(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, nil)
	path := filepath.Join(dir, storeFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The file holds each conversation's told "hi" once in a page in use,
	// and may hold stale copies in pages bbolt freed (a copy-on-write
	// B+tree leaves the old page behind): which comes first in the file
	// depends on page allocation. Flip each occurrence in turn: a flip in
	// a live value is refused naming it, one in a freed page is harmless,
	// and the two live payloads must both be found.
	caught := 0
	for at := 0; ; at += 2 {
		i := strings.Index(string(raw[at:]), "hi")
		if i < 0 {
			break
		}
		at += i
		flipped := append([]byte(nil), raw...)
		flipped[at] ^= 0x20
		if err := os.WriteFile(path, flipped, 0o600); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, dir)
		if _, _, code := ctl(ctx, "", "verify", "--data", dir); code == 0 {
			continue // a stale copy in a freed page
		}
		caught++
		for _, cmd := range []string{"verify", "inspect"} {
			_, errs, code := ctl(ctx, "", cmd, "--data", dir)
			if code != 1 || !strings.Contains(errs, path) || !strings.Contains(errs, "streams/") || !strings.Contains(errs, "checksum") {
				t.Errorf("flip at %d: %s = exit %d, %q; want 1 and the damaged stream entry named", at, cmd, code, errs)
			}
		}
		if after := snapshot(t, dir); after != before {
			t.Errorf("verify and inspect changed the data directory")
		}
	}
	if caught != 2 {
		t.Errorf("%d flips refused, want the two live payloads (one per conversation)", caught)
	}
}
