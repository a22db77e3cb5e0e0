package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// buildData makes a data directory whose store holds conversations 1 and 2,
// each with two participants and a record, through the service, then lets
// damage write to the store before it is closed.
func buildData(t *testing.T, damage func(st *store.Bolt)) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, storeFile), store.Options{})
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

// snapshot describes what the offline tools must not change: the
// incarnation and every stream's content. (store.Open itself commits an
// empty layout transaction, so the file's bytes are not a fair measure.)
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, storeFile), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inc, _ := st.ReadValue(participant.IncarnationKey)
	s := fmt.Sprintf("incarnation=%d", inc)
	for _, stream := range []string{participant.RegistryStream, "oplog/1", "outbox/1", "oplog/2", "outbox/2"} {
		rows, err := readStream(st, stream)
		if err != nil {
			t.Fatal(err)
		}
		s += fmt.Sprintf(" %s=%x", stream, rows)
	}
	return s
}

func TestVerify_CorruptOutboxRow_RefusedExit1(t *testing.T) {
	ctx := testCtx(t)
	dir := buildData(t, func(st *store.Bolt) {
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
	dir := buildData(t, func(st *store.Bolt) {
		// A later oplog row whose outbox rows never got written: copy of
		// conversation 1's history into conversation 3 without its outbox.
		oplogRows, err := readStream(st, "oplog/1")
		if err != nil {
			t.Fatal(err)
		}
		reg, _ := st.Len(participant.RegistryStream)
		if _, err := st.Append(participant.RegistryStream, []byte{registryVersion, 0, 0, 0, 0, 0, 0, 0, 3}, reg); err != nil {
			t.Fatal(err)
		}
		for i, b := range oplogRows {
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

// registryVersion is the version byte of a registry entry.
const registryVersion = 1
