package participant_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// TestBitFlip_TellPayloadInTheCheckpointFile_NeverServed tells "transfer
// 100 to alice" on a log-first store, closes it (the tell is checkpointed
// into participantd.db), and flips the one bit that makes each stored copy
// of the payload read "transfer 900 to alice", one copy per run. The
// damaged copy must never be served: the conversation is contained as
// unloadable at the next start, and the offline verification refuses it.
func TestBitFlip_TellPayloadInTheCheckpointFile_NeverServed(t *testing.T) {
	ctx := context.Background()
	want := []byte("transfer 100 to alice")
	flipped := []byte("transfer 900 to alice") // '1' ^ 0x08 == '9'
	key := make([]byte, participant.NodeKeySize)

	build := func(t *testing.T) (dir string, recipient participant.Bound) {
		dir = t.TempDir()
		st, err := logfirst.Open(dir, logfirst.Options{})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key})
		if err != nil {
			t.Fatal(err)
		}
		tc := svc.Connect(nil)
		teller, err := tc.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{1}})
		if err != nil {
			t.Fatal(err)
		}
		if recipient, err = svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{2}}); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.Tell(ctx, participant.Tell{Conversation: 1, Participant: teller.Participant,
			Generation: teller.Generation, Token: participant.Token{3}, Payload: want}); err != nil {
			t.Fatal(err)
		}
		if err := svc.Close(); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return dir, recipient
	}

	dir, _ := build(t)
	raw, err := os.ReadFile(filepath.Join(dir, logfirst.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	copies := bytes.Count(raw, want)
	if copies == 0 {
		t.Fatalf("%s holds no copy of %q: the tell was not checkpointed", logfirst.DBFile, want)
	}
	for i := range copies {
		dir, recipient := build(t)
		path := filepath.Join(dir, logfirst.DBFile)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		at := 0
		for range i + 1 {
			at += bytes.Index(raw[at:], want) + 1
		}
		at--
		raw[at+len("transfer ")] ^= 0x08
		if !bytes.Equal(raw[at:at+len(flipped)], flipped) {
			t.Fatalf("flip = %q, want %q", raw[at:at+len(flipped)], flipped)
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}

		_, reports, err := offline.Inspect(dir, offline.Options{})
		switch {
		case err != nil && !errors.Is(err, store.ErrCorrupt):
			t.Errorf("copy %d: verify = %v, want the damage refused (store.ErrCorrupt)", i, err)
		case err == nil && (len(reports) != 1 || reports[0].Refused == nil):
			t.Errorf("copy %d: verify = %+v, want the damage refused", i, reports)
		}

		st, err := logfirst.Open(dir, logfirst.Options{})
		if err != nil {
			continue // refused at open: never served
		}
		svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key})
		if err != nil {
			st.Close()
			continue
		}
		c := svc.Connect(nil)
		_, aerr := c.Attach(ctx, participant.Attach{Conversation: 1, Participant: recipient.Participant,
			Generation: recipient.Generation, Secret: recipient.Secret, Token: participant.Token{4}})
		for {
			d, ok := c.Next(1)
			if !ok {
				break
			}
			if d.Kind == outbox.KindRecord && !bytes.Equal(d.Payload, want) {
				t.Errorf("copy %d: served %q, acknowledged as %q", i, d.Payload, want)
			}
		}
		if aerr == nil {
			t.Errorf("copy %d: Attach after the flip succeeded, want the conversation contained", i)
		} else if !errors.Is(aerr, participant.ErrUnavailable) {
			t.Errorf("copy %d: Attach after the flip = %v, want unavailable", i, aerr)
		}
		unl := svc.Unloadable()
		if len(unl) != 1 || !strings.Contains(unl[0].Class, "corrupt") {
			t.Errorf("copy %d: Unloadable() = %+v, want conversation 1 contained with a corruption class", i, unl)
		}
		svc.Close()
		st.Close()
	}
}
