package wire

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden frames in testdata/wire")

const goldenDir = "../testdata/wire"

func testToken(seed byte) Token {
	var t Token
	for i := range t {
		t[i] = seed + byte(i)
	}
	return t
}

func testSecret(seed byte) Secret {
	var s Secret
	for i := range s {
		s[i] = seed ^ byte(i*7)
	}
	return s
}

// goldenCase is one golden frame: the message, which decoder reads it, and
// the file holding its exact frame bytes.
type goldenCase struct {
	name    string // file name without .bin
	request bool   // decoded by DecodeRequest, else DecodeServerMessage
	msg     Message
}

func goldenCases() []goldenCase {
	return []goldenCase{
		{"client_hello", true, &Hello{Versions: []uint64{1}}},
		{"client_hello_full", true, &Hello{Versions: []uint64{1, 2}, Auth: new("s3cret"), Client: new("participantctl 0.1.0")}},
		{"client_enroll", true, &Enroll{ID: 1, Conversation: 42, Token: testToken(1)}},
		{"client_enroll_invite", true, &Enroll{ID: 1, Conversation: 42, Token: testToken(1), Invite: bytes.Repeat([]byte{0x1e}, 49)}},
		{"client_attach", true, &Attach{ID: 2, Conversation: 42, Participant: 7, Generation: 3, Secret: testSecret(9), Token: testToken(2)}},
		{"client_tell", true, &Tell{ID: 3, Conversation: 42, Participant: 0, Generation: 1, Token: testToken(3), Payload: []byte("hi")}},
		{"client_ack", true, &Ack{ID: 4, Conversation: 42, Participant: 0, Generation: 1, Through: 300}},
		{"client_detach", true, &Detach{ID: 5, Conversation: 42, Participant: 0, Generation: 1, Token: testToken(5)}},
		{"client_leave", true, &Leave{ID: 6, Conversation: 42, Participant: 0, Generation: 2, Secret: testSecret(6), Token: testToken(6)}},
		{"client_ping", true, &Ping{ID: 7}},
		{"client_bye", true, &Bye{ID: 8}},

		{"server_welcome", false, &Welcome{Version: 1, Server: "participantd 0.1.0", Incarnation: 3, Connection: 1, MaxFrame: DefaultMaxFrame, MaxRecordBytes: 65536}},
		{"server_rejected", false, &Rejected{Reason: ReasonFrameTooLarge, Detail: "frame of 2147483648 bytes exceeds the limit of 1048576"}},
		{"server_enrolled", false, &Enrolled{ID: 1, Conversation: 42, Participant: 0, Generation: 1, Secret: testSecret(1), Cursor: 0, ReceiptExpiresAt: 1767225600000}},
		{"server_enrolled_replay_bound", false, &Enrolled{ID: 1, Conversation: 42, Participant: 0, Generation: 1, Secret: testSecret(1), ReceiptExpiresAt: 1767225600000, Replay: new(ReplayBound)}},
		{"server_attached", false, &Attached{ID: 2, Conversation: 42, Participant: 7, Generation: 4, Secret: testSecret(2), Cursor: 17, ReceiptExpiresAt: 1767225600000}},
		{"server_attached_replay_unbound", false, &Attached{ID: 2, Conversation: 42, Participant: 7, Generation: 4, Secret: testSecret(2), Cursor: 17, ReceiptExpiresAt: 1767225600000, Replay: new(ReplayUnbound)}},
		{"server_told", false, &Told{ID: 3, Conversation: 42, Seq: 2}},
		{"server_told_replay", false, &Told{ID: 3, Conversation: 42, Seq: 2, Replay: new(ReplayCommitted)}},
		{"server_acked", false, &Acked{ID: 4, Conversation: 42, Participant: 0, Cursor: 300}},
		{"server_acked_noop", false, &Acked{ID: 4, Conversation: 42, Participant: 0, Cursor: 300, Noop: true}},
		{"server_detached", false, &Detached{ID: 5, Conversation: 42, Participant: 0, Seq: 301}},
		{"server_detached_replay", false, &Detached{ID: 5, Conversation: 42, Participant: 0, Seq: 301, Replay: new(ReplayCommitted)}},
		{"server_left", false, &Left{ID: 6, Conversation: 42, Participant: 0, Seq: 302}},
		{"server_left_replay", false, &Left{ID: 6, Conversation: 42, Participant: 0, Seq: 302, Replay: new(ReplayCommitted)}},
		{"server_pong", false, &Pong{ID: 7}},
		{"server_error", false, &Error{ID: 9, Code: CodeBadRequest, Detail: `field "token": 15 bytes, want 16`}},
		{"server_error_stale_authority", false, &Error{ID: 9, Code: CodeStaleAuthority, Detail: "not the current generation", Generation: new(uint64(5))}},
		{"server_error_stale_authority_secret", false, &Error{ID: 9, Code: CodeStaleAuthority, Detail: "secret does not verify"}},
		{"server_error_ack_gap", false, &Error{ID: 9, Code: CodeAckGap, Detail: "no record 99 for this participant", Cursor: new(uint64(12))}},
		{"server_error_invite_required", false, &Error{ID: 9, Code: CodeInviteRequired, Detail: "enrolling into conversation 42 needs an invitation"}},
		{"server_error_invite_invalid", false, &Error{ID: 9, Code: CodeInviteInvalid, Detail: "the invitation does not verify for conversation 42"}},
		{"server_error_too_large", false, &Error{ID: 9, Code: CodeTooLarge, Detail: "payload too large", Limit: new(uint64(65536))}},
		{"server_error_backlog_full", false, &Error{ID: 3, Code: CodeBacklogFull, Detail: "backlog full", Limit: new(uint64(100000))}},
		{"server_error_receipt_expired", false, &Error{ID: 9, Code: CodeReceiptExpired, Detail: "receipt expired", Participant: new(uint64(7)), Generation: new(uint64(6)), Reason: new(ExpiredSuperseded)}},
		{"server_delivery_record", false, &Delivery{Conversation: 42, Recipient: 1, Seq: 2, Kind: KindRecord, Participant: 0, Payload: []byte("hi")}},
		{"server_delivery_joined", false, &Delivery{Conversation: 42, Recipient: 0, Seq: 3, Kind: KindJoined, Participant: 1}},
		{"server_delivery_attached", false, &Delivery{Conversation: 42, Recipient: 1, Seq: 5, Kind: KindAttached, Participant: 0}},
		{"server_delivery_detached", false, &Delivery{Conversation: 42, Recipient: 1, Seq: 4, Kind: KindDetached, Participant: 0, Cause: new(CauseSuperseded)}},
		{"server_delivery_died", false, &Delivery{Conversation: 42, Recipient: 1, Seq: 6, Kind: KindDied, Participant: 0, Cause: new(CauseConnectionLost)}},
		{"server_delivery_left", false, &Delivery{Conversation: 42, Recipient: 1, Seq: 7, Kind: KindLeft, Participant: 0}},
		{"server_bye", false, &ServerBye{Reason: ByeShutdown}},
		{"server_welcome_cluster", false, &Welcome{Version: 1, Server: "participantd 0.1.0", Incarnation: 1<<40 | 3, Connection: 1, MaxFrame: DefaultMaxFrame, MaxRecordBytes: 65536, Node: "node-a"}},
		{"server_welcome_token_window", false, &Welcome{Version: 1, Server: "participantd 0.1.0", Incarnation: 3, Connection: 1, MaxFrame: DefaultMaxFrame, MaxRecordBytes: 65536, TokenWindow: new(uint64(3600000)), TokenSkew: new(uint64(60000))}},
		{"server_error_moved", false, &Error{ID: 9, Code: CodeMoved, Detail: "conversation 42 is owned by node \"node-b\"", Owner: new("127.0.0.1:7402")}},
		{"server_error_moved_no_owner", false, &Error{ID: 9, Code: CodeMoved, Detail: "no node owns conversation 42"}},
		{"server_compacted", false, &Compacted{Conversation: 42, Recipient: 1, First: 300}},
		{"server_error_compacted", false, &Error{ID: 4, Code: CodeCompacted, Detail: "records below #300 were compacted", First: new(uint64(300))}},
		{"server_error_token_expired", false, &Error{ID: 3, Code: CodeTokenExpired, Detail: "token older than the token window", Oldest: new(uint64(1767225600000))}},
		{"server_error_token_invalid", false, &Error{ID: 3, Code: CodeTokenInvalid, Detail: "token ahead of the server's clock", Newest: new(uint64(1767225660000))}},
		{"server_error_token_invalid_not_v7", false, &Error{ID: 3, Code: CodeTokenInvalid, Detail: "token is not a UUIDv7"}},
	}
}

func decodeFor(request bool) func([]byte) (Message, error) {
	if request {
		return DecodeRequest
	}
	return DecodeServerMessage
}

// TestGolden checks that every message encodes to its golden frame byte for
// byte, and that the golden frame decodes back to the message. Run with
// -update to rewrite the frames after a deliberate change.
func TestGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(goldenDir, tc.name+".bin")
			frame := AppendFrame(nil, tc.msg)
			if *update {
				if err := os.MkdirAll(goldenDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, frame, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("reading golden frame (run with -update to create it): %v", err)
			}
			if !bytes.Equal(frame, want) {
				t.Fatalf("AppendFrame(%s) =\n%x\nwant (golden)\n%x", tc.name, frame, want)
			}
			body, err := NewReader(bytes.NewReader(want), 0).ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame(golden) error: %v", err)
			}
			got, err := decodeFor(tc.request)(body)
			if err != nil {
				t.Fatalf("decode(golden) error: %v", err)
			}
			if diff := cmp.Diff(tc.msg, got); diff != "" {
				t.Fatalf("decode(golden) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGolden_AllTypes keeps the golden set complete: every message type of
// both directions has at least one golden frame.
func TestGolden_AllTypes(t *testing.T) {
	seen := map[string]bool{}
	for _, tc := range goldenCases() {
		dir := "server"
		if tc.request {
			dir = "client"
		}
		seen[dir+" "+tc.msg.Type()] = true
	}
	for _, typ := range requestTypes {
		if !seen["client "+typ] {
			t.Errorf("no golden frame for request %q", typ)
		}
	}
	for _, typ := range serverTypes {
		if !seen["server "+typ] {
			t.Errorf("no golden frame for server message %q", typ)
		}
	}
}
