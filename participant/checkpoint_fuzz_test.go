package participant

import (
	"bytes"
	"errors"
	"testing"

	"github.com/participantd/participantd/outbox"
)

func checkpointSeed(t testing.TB) []byte {
	ck := &checkpoint{Conversation: 9, Index: 3, Produced: 2, LastSeq: 2,
		Members: []ckMember{{Generation: 1, Cursor: 2}, {Generation: 2, Bound: true, Conn: ConnID{Server: 1, Ordinal: 2}, BindingSource: 2}},
		Records: []ckRecord{{Record: outbox.Record{Seq: 2, Kind: outbox.KindRecord, Participant: 1, Recipients: []ParticipantID{0}}, Oplog: 2, Outbox: 1}},
		Marks:   []mark{{At: 5, Oplog: 1, Outbox: 1}}}
	b, err := encodeCheckpoint(ck)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkpointInvitesSeed is checkpointSeed's checkpoint with invitation
// uses: version 3.
func checkpointInvitesSeed(t testing.TB) []byte {
	ck, err := decodeCheckpoint(checkpointSeed(t))
	if err != nil {
		t.Fatal(err)
	}
	ck.Invites = []ckInvite{{ID: 3, Uses: 1}, {ID: 9, Uses: 2}}
	b, err := encodeCheckpoint(ck)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecodeCheckpoint: a stored checkpoint never panics the decoder; what
// decodes is well formed and re-encodes to exactly its bytes.
func FuzzDecodeCheckpoint(f *testing.F) {
	seed := checkpointSeed(f)
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{checkpointVersion})
	f.Add(checkpointInvitesSeed(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		ck, err := decodeCheckpoint(b)
		if err != nil {
			if !errors.Is(err, errCheckpointCorrupt) {
				t.Fatalf("decodeCheckpoint error %v does not wrap errCheckpointCorrupt", err)
			}
			return
		}
		again, err := encodeCheckpoint(ck)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded checkpoint re-encodes to %x, %v; stored %x", again, err, b)
		}
	})
}
