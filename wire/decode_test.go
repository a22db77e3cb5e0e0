package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Tiny msgpack builders for hand-made bodies.

func mpMap(n int, parts ...[]byte) []byte {
	return append(appendMapHeader(nil, n), bytes.Join(parts, nil)...)
}
func mpS(s string) []byte          { return appendStr(nil, s) }
func mpU(v uint64) []byte          { return appendUint(nil, v) }
func mpB(p []byte) []byte          { return appendBin(nil, p) }
func raw(b ...byte) []byte         { return b }
func kv(k string, v []byte) []byte { return append(mpS(k), v...) }

func tok(t Token) []byte  { return mpB(t[:]) }
func zeros(n int) []byte  { return make([]byte, n) }
func filled(n int) []byte { return bytes.Repeat([]byte{7}, n) }

// tellBody is a valid tell with id 5 and any replacements of its fields.
func tellBody(override map[string][]byte) []byte {
	fields := []struct {
		k string
		v []byte
	}{
		{"t", mpS("tell")}, {"id", mpU(5)}, {"conversation", mpU(42)}, {"participant", mpU(0)},
		{"generation", mpU(1)}, {"token", tok(testToken(3))}, {"payload", mpB([]byte("hi"))},
	}
	var parts [][]byte
	for _, f := range fields {
		v, ok := override[f.k]
		if !ok {
			v = f.v
		}
		if v == nil { // nil removes the field
			continue
		}
		parts = append(parts, kv(f.k, v))
	}
	return mpMap(len(parts), parts...)
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func TestDecodeRequest_Errors(t *testing.T) {
	tests := []struct {
		name  string
		body  []byte
		class Class
		id    uint64 // for BadRequest
		hasID bool
		typ   string
		field string
	}{
		{name: "empty body", body: nil, class: Malformed},
		{name: "garbage", body: raw(0xc1, 0xff, 0x00), class: Malformed},
		{name: "garbage ascii", body: []byte("GET / HTTP/1.1\r\n\r\n"), class: Malformed},
		{name: "not a map", body: raw(0x91, 0x01), class: Malformed},
		{name: "a string", body: mpS("t"), class: Malformed},
		{name: "map16 truncated header", body: raw(0xde, 0x00), class: Malformed},
		{name: "non-string key", body: mpMap(3, mpU(1), mpS("x"), kv("t", mpS("ping")), kv("id", mpU(1))), class: Malformed},
		{name: "bin key", body: mpMap(2, mpB([]byte("t")), mpS("ping"), kv("id", mpU(1))), class: Malformed},
		{name: "no t", body: mpMap(1, kv("id", mpU(1))), class: Malformed},
		{name: "t not a string", body: mpMap(2, kv("t", mpU(1)), kv("id", mpU(1))), class: Malformed},
		{name: "t is bin", body: mpMap(2, kv("t", mpB([]byte("ping"))), kv("id", mpU(1))), class: Malformed},
		{name: "trailing bytes", body: append(Encode(&Ping{ID: 1}), 0x00), class: Malformed},
		{name: "two maps", body: append(Encode(&Ping{ID: 1}), Encode(&Ping{ID: 2})...), class: Malformed},
		{name: "map32 of 2^32-1 entries", body: append(raw(0xdf), append(be32(0xffffffff), kv("t", mpS("ping"))...)...), class: Malformed},
		{name: "map16 claims more than present", body: append(raw(0xde, 0x00, 0x03), kv("t", mpS("ping"))...), class: Malformed},
		{name: "fixmap claims more than present", body: raw(0x83, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g'), class: Malformed},
		{name: "bin32 claims 4 GiB", body: mpMap(3, kv("t", mpS("ping")), kv("id", mpU(1)), mpS("x"), raw(0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3)), class: Malformed},
		{name: "str32 claims 2 GiB", body: mpMap(2, kv("t", mpS("ping")), kv("id", raw(0xdb, 0x80, 0, 0, 0))), class: Malformed},
		{name: "str8 claims past end", body: mpMap(1, mpS("t"), raw(0xd9, 0x10, 'p')), class: Malformed},
		{name: "array32 of 2^32-1", body: mpMap(2, kv("t", mpS("ping")), kv("x", append(raw(0xdd), be32(0xffffffff)...))), class: Malformed},
		{name: "nested map claims more", body: mpMap(2, kv("t", mpS("ping")), kv("x", raw(0x8f, 0x01))), class: Malformed},
		{name: "ext32 claims past end", body: mpMap(2, kv("t", mpS("ping")), kv("x", append(raw(0xc9), be32(100)...))), class: Malformed},
		{name: "truncated uint64", body: mpMap(1, kv("t", raw(0xcf, 0, 0))), class: Malformed},
		{name: "truncated length of bin16", body: mpMap(1, kv("t", raw(0xc5, 0))), class: Malformed},
		{name: "deep nesting never closed", body: mpMap(1, kv("t", bytes.Repeat([]byte{0x91}, 1000))), class: Malformed},
		{name: "missing id", body: tellBody(map[string][]byte{"id": nil}), class: Malformed, typ: "tell", field: "id"},
		{name: "id is a string", body: tellBody(map[string][]byte{"id": mpS("5")}), class: Malformed, typ: "tell", field: "id"},
		{name: "id is negative", body: tellBody(map[string][]byte{"id": raw(0xff)}), class: Malformed, typ: "tell", field: "id"},
		{name: "id is nil", body: tellBody(map[string][]byte{"id": raw(0xc0)}), class: Malformed, typ: "tell", field: "id"},
		{name: "id is a float", body: tellBody(map[string][]byte{"id": raw(0xca, 0x3f, 0x80, 0, 0)}), class: Malformed, typ: "tell", field: "id"},
		{name: "ping without id", body: mpMap(1, kv("t", mpS("ping"))), class: Malformed, typ: "ping", field: "id"},
		{name: "bye without id", body: mpMap(1, kv("t", mpS("bye"))), class: Malformed, typ: "bye", field: "id"},
		{name: "unknown t without id", body: mpMap(1, kv("t", mpS("frobnicate"))), class: Malformed, typ: "frobnicate", field: "id"},

		{name: "unknown t", body: mpMap(2, kv("t", mpS("frobnicate")), kv("id", mpU(9))), class: BadRequest, id: 9, hasID: true, typ: "frobnicate", field: "t"},
		{name: "server type as request", body: mpMap(2, kv("t", mpS("welcome")), kv("id", mpU(9))), class: BadRequest, id: 9, hasID: true, typ: "welcome", field: "t"},
		{name: "15-byte token", body: tellBody(map[string][]byte{"token": mpB(filled(15))}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "token"},
		{name: "17-byte token", body: tellBody(map[string][]byte{"token": mpB(filled(17))}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "token"},
		{name: "all-zero token", body: tellBody(map[string][]byte{"token": mpB(zeros(16))}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "token"},
		{name: "token as str", body: tellBody(map[string][]byte{"token": mpS(string(filled(16)))}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "token"},
		{name: "missing token", body: tellBody(map[string][]byte{"token": nil}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "token"},
		{name: "missing payload", body: tellBody(map[string][]byte{"payload": nil}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "payload"},
		{name: "payload as str", body: tellBody(map[string][]byte{"payload": mpS("hi")}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "payload"},
		{name: "payload nil", body: tellBody(map[string][]byte{"payload": raw(0xc0)}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "payload"},
		{name: "conversation negative int8", body: tellBody(map[string][]byte{"conversation": raw(0xd0, 0xff)}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "conversation"},
		{name: "conversation negative int64", body: tellBody(map[string][]byte{"conversation": raw(0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0)}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "conversation"},
		{name: "conversation a string", body: tellBody(map[string][]byte{"conversation": mpS("42")}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "conversation"},
		{name: "generation a bool", body: tellBody(map[string][]byte{"generation": raw(0xc3)}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "generation"},
		{name: "participant missing", body: tellBody(map[string][]byte{"participant": nil}), class: BadRequest, id: 5, hasID: true, typ: "tell", field: "participant"},
		{name: "31-byte secret", body: mpMap(7, kv("t", mpS("attach")), kv("id", mpU(2)), kv("conversation", mpU(1)), kv("participant", mpU(1)), kv("generation", mpU(1)), kv("secret", mpB(filled(31))), kv("token", tok(testToken(1)))), class: BadRequest, id: 2, hasID: true, typ: "attach", field: "secret"},
		{name: "leave without secret", body: mpMap(6, kv("t", mpS("leave")), kv("id", mpU(2)), kv("conversation", mpU(1)), kv("participant", mpU(1)), kv("generation", mpU(1)), kv("token", tok(testToken(1)))), class: BadRequest, id: 2, hasID: true, typ: "leave", field: "secret"},
		{name: "ack through float", body: mpMap(6, kv("t", mpS("ack")), kv("id", mpU(4)), kv("conversation", mpU(1)), kv("participant", mpU(1)), kv("generation", mpU(1)), kv("through", raw(0xcb, 0, 0, 0, 0, 0, 0, 0, 0))), class: BadRequest, id: 4, hasID: true, typ: "ack", field: "through"},
		{name: "enroll without conversation", body: mpMap(3, kv("t", mpS("enroll")), kv("id", mpU(1)), kv("token", tok(testToken(1)))), class: BadRequest, id: 1, hasID: true, typ: "enroll", field: "conversation"},
		{name: "hello without versions", body: mpMap(1, kv("t", mpS("hello"))), class: BadRequest, typ: "hello", field: "versions"},
		{name: "hello versions not an array", body: mpMap(2, kv("t", mpS("hello")), kv("versions", mpU(1))), class: BadRequest, typ: "hello", field: "versions"},
		{name: "hello versions of strings", body: mpMap(2, kv("t", mpS("hello")), kv("versions", raw(0x91, 0xa1, '1'))), class: BadRequest, typ: "hello", field: "versions"},
		{name: "hello auth not a string", body: mpMap(3, kv("t", mpS("hello")), kv("versions", raw(0x91, 0x01)), kv("auth", mpU(1))), class: BadRequest, typ: "hello", field: "auth"},
		{name: "duplicate key, last one bad", body: mpMap(3, kv("t", mpS("ping")), kv("id", mpU(1)), kv("t", mpS("pong"))), class: BadRequest, id: 1, hasID: true, typ: "pong", field: "t"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeRequest(tc.body)
			if err == nil {
				t.Fatalf("DecodeRequest(%x) = %#v, want a %v error", tc.body, m, tc.class)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeRequest error %v (%T), want a *DecodeError", err, err)
			}
			want := ErrMalformed
			if tc.class == BadRequest {
				want = ErrBadRequest
			}
			if !errors.Is(err, want) {
				t.Errorf("errors.Is(%v, %v) = false", err, want)
			}
			got := DecodeError{Class: de.Class, ID: de.ID, HasID: de.HasID, Type: de.Type, Field: de.Field}
			wantErr := DecodeError{Class: tc.class, ID: tc.id, HasID: tc.hasID, Type: tc.typ, Field: tc.field}
			if diff := cmp.Diff(wantErr, got); diff != "" {
				t.Errorf("DecodeRequest error %v mismatch (-want +got):\n%s", err, diff)
			}
			if de.Detail == "" {
				t.Errorf("DecodeRequest error %v has no detail", err)
			}
		})
	}
}

func TestDecodeRequest_Accepts(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 100000), 0x01) // [[[...[1]...]]], 100000 deep
	want := &Tell{ID: 5, Conversation: 42, Participant: 0, Generation: 1, Token: testToken(3), Payload: []byte("hi")}
	tests := []struct {
		name string
		body []byte
		want Message
	}{
		{"canonical", tellBody(nil), want},
		{"unknown keys ignored", mpMap(9, tellBody(nil)[1:], kv("zzz", mpS("x")), kv("cursor", mpS("not a uint, but not a tell field"))), want},
		{"deeply nested unknown key", mpMap(8, tellBody(nil)[1:], kv("deep", deep)), want},
		{"unknown ext value", mpMap(8, tellBody(nil)[1:], kv("x", raw(0xd6, 0xff, 1, 2, 3, 4))), want},
		{"key order free", mpMap(7, kv("payload", mpB([]byte("hi"))), kv("token", tok(testToken(3))), kv("generation", mpU(1)), kv("participant", mpU(0)), kv("conversation", mpU(42)), kv("id", mpU(5)), kv("t", mpS("tell"))), want},
		{"uint8 conversation", tellBody(map[string][]byte{"conversation": raw(0xcc, 42)}), want},
		{"uint16 conversation", tellBody(map[string][]byte{"conversation": raw(0xcd, 0, 42)}), want},
		{"uint32 conversation", tellBody(map[string][]byte{"conversation": raw(0xce, 0, 0, 0, 42)}), want},
		{"uint64 conversation", tellBody(map[string][]byte{"conversation": raw(0xcf, 0, 0, 0, 0, 0, 0, 0, 42)}), want},
		{"int8 conversation", tellBody(map[string][]byte{"conversation": raw(0xd0, 42)}), want},
		{"int16 conversation", tellBody(map[string][]byte{"conversation": raw(0xd1, 0, 42)}), want},
		{"int32 conversation", tellBody(map[string][]byte{"conversation": raw(0xd2, 0, 0, 0, 42)}), want},
		{"int64 conversation", tellBody(map[string][]byte{"conversation": raw(0xd3, 0, 0, 0, 0, 0, 0, 0, 42)}), want},
		{"bin16 payload", tellBody(map[string][]byte{"payload": raw(0xc5, 0, 2, 'h', 'i')}), want},
		{"bin32 payload", tellBody(map[string][]byte{"payload": raw(0xc6, 0, 0, 0, 2, 'h', 'i')}), want},
		{"str8 type", tellBody(map[string][]byte{"t": raw(0xd9, 4, 't', 'e', 'l', 'l')}), want},
		{"max uint64 id", tellBody(map[string][]byte{"id": raw(0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)}),
			&Tell{ID: 1<<64 - 1, Conversation: 42, Generation: 1, Token: testToken(3), Payload: []byte("hi")}},
		{"empty payload", tellBody(map[string][]byte{"payload": mpB(nil)}),
			&Tell{ID: 5, Conversation: 42, Generation: 1, Token: testToken(3), Payload: []byte{}}},
		{"duplicate key, last wins", mpMap(8, tellBody(nil)[1:], kv("conversation", mpU(43))),
			&Tell{ID: 5, Conversation: 43, Generation: 1, Token: testToken(3), Payload: []byte("hi")}},
		{"hello with id is still hello", mpMap(3, kv("t", mpS("hello")), kv("id", mpS("ignored")), kv("versions", raw(0x92, 0x01, 0x02))),
			&Hello{Versions: []uint64{1, 2}}},
		{"hello nil optional fields", mpMap(4, kv("t", mpS("hello")), kv("versions", raw(0x90)), kv("auth", raw(0xc0)), kv("client", raw(0xc0))),
			&Hello{Versions: []uint64{}}},
		{"ping with extra fields", mpMap(3, kv("t", mpS("ping")), kv("id", mpU(7)), kv("token", mpS("ignored"))), &Ping{ID: 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeRequest(tc.body)
			if err != nil {
				t.Fatalf("DecodeRequest(%.64x) error: %v", tc.body, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DecodeRequest mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRequest_DoesNotAliasBody(t *testing.T) {
	body := tellBody(nil)
	m, err := DecodeRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 0
	}
	if got := m.(*Tell).Payload; string(got) != "hi" {
		t.Fatalf("Payload after overwriting the body = %q, want %q", got, "hi")
	}
}

func TestDecodeServerMessage_Errors(t *testing.T) {
	tests := []struct {
		name  string
		body  []byte
		class Class
		field string
	}{
		{"empty", nil, Malformed, ""},
		{"trailing bytes", append(Encode(&Pong{ID: 1}), 0xc0), Malformed, ""},
		{"told without id", mpMap(3, kv("t", mpS("told")), kv("conversation", mpU(1)), kv("seq", mpU(2))), Malformed, "id"},
		{"unknown type", mpMap(1, kv("t", mpS("gossip"))), BadRequest, "t"},
		{"client bye shape", mpMap(2, kv("t", mpS("bye")), kv("id", mpU(1))), BadRequest, "reason"},
		{"delivery without recipient", mpMap(6, kv("t", mpS("delivery")), kv("conversation", mpU(1)), kv("seq", mpU(2)), kv("kind", mpS("joined")), kv("participant", mpU(0)), kv("x", mpU(0))), BadRequest, "recipient"},
		{"delivery payload as str", mpMap(7, kv("t", mpS("delivery")), kv("conversation", mpU(1)), kv("recipient", mpU(1)), kv("seq", mpU(2)), kv("kind", mpS("record")), kv("participant", mpU(0)), kv("payload", mpS("hi"))), BadRequest, "payload"},
		{"enrolled 31-byte secret", mpMap(8, kv("t", mpS("enrolled")), kv("id", mpU(1)), kv("conversation", mpU(1)), kv("participant", mpU(0)), kv("generation", mpU(1)), kv("secret", mpB(filled(31))), kv("cursor", mpU(0)), kv("receipt_expires_at", mpU(1))), BadRequest, "secret"},
		{"error cursor not a uint", mpMap(5, kv("t", mpS("error")), kv("id", mpU(1)), kv("code", mpS("ack_gap")), kv("detail", mpS("")), kv("cursor", mpS("3"))), BadRequest, "cursor"},
		{"welcome without max_record_bytes", mpMap(6, kv("t", mpS("welcome")), kv("version", mpU(1)), kv("server", mpS("x")), kv("incarnation", mpU(3)), kv("connection", mpU(1)), kv("max_frame", mpU(1<<20))), BadRequest, "max_record_bytes"},
		{"welcome token_window not a uint", mpMap(8, kv("t", mpS("welcome")), kv("version", mpU(1)), kv("server", mpS("x")), kv("incarnation", mpU(3)), kv("connection", mpU(1)), kv("max_frame", mpU(1<<20)), kv("max_record_bytes", mpU(1<<16)), kv("token_window", mpS("1h"))), BadRequest, "token_window"},
		{"welcome token_skew negative", mpMap(8, kv("t", mpS("welcome")), kv("version", mpU(1)), kv("server", mpS("x")), kv("incarnation", mpU(3)), kv("connection", mpU(1)), kv("max_frame", mpU(1<<20)), kv("max_record_bytes", mpU(1<<16)), kv("token_skew", raw(0xff))), BadRequest, "token_skew"},
		{"acked noop not a bool", mpMap(6, kv("t", mpS("acked")), kv("id", mpU(1)), kv("conversation", mpU(1)), kv("participant", mpU(0)), kv("cursor", mpU(0)), kv("noop", mpU(1))), BadRequest, "noop"},
		{"rejected without detail", mpMap(2, kv("t", mpS("rejected")), kv("reason", mpS("malformed"))), BadRequest, "detail"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeServerMessage(tc.body)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeServerMessage(%x) = %#v, %v; want a *DecodeError", tc.body, m, err)
			}
			if de.Class != tc.class || de.Field != tc.field {
				t.Errorf("DecodeServerMessage error %v: class %v field %q, want %v %q", err, de.Class, de.Field, tc.class, tc.field)
			}
		})
	}
}

func TestDecodeServerMessage_OptionalFields(t *testing.T) {
	tests := []struct {
		name string
		body []byte
		want Message
	}{
		{"nil extras are absent", mpMap(6, kv("t", mpS("error")), kv("id", mpU(1)), kv("code", mpS("ack_gap")), kv("detail", mpS("d")), kv("cursor", raw(0xc0)), kv("reason", raw(0xc0))),
			&Error{ID: 1, Code: CodeAckGap, Detail: "d"}},
		{"delivery with empty payload", mpMap(7, kv("t", mpS("delivery")), kv("conversation", mpU(1)), kv("recipient", mpU(1)), kv("seq", mpU(2)), kv("kind", mpS("record")), kv("participant", mpU(0)), kv("payload", mpB(nil))),
			&Delivery{Conversation: 1, Recipient: 1, Seq: 2, Kind: KindRecord, Payload: []byte{}}},
		{"delivery of an unknown kind", mpMap(6, kv("t", mpS("delivery")), kv("conversation", mpU(1)), kv("recipient", mpU(1)), kv("seq", mpU(2)), kv("kind", mpS("renamed")), kv("participant", mpU(0))),
			&Delivery{Conversation: 1, Recipient: 1, Seq: 2, Kind: "renamed"}},
		{"unknown replay value kept", mpMap(5, kv("t", mpS("told")), kv("id", mpU(1)), kv("conversation", mpU(1)), kv("seq", mpU(2)), kv("replay", mpS("maybe"))),
			&Told{ID: 1, Conversation: 1, Seq: 2, Replay: new(Replay("maybe"))}},
		{"welcome with nil token window is without one", mpMap(9, kv("t", mpS("welcome")), kv("version", mpU(1)), kv("server", mpS("x")), kv("incarnation", mpU(3)), kv("connection", mpU(1)), kv("max_frame", mpU(1<<20)), kv("max_record_bytes", mpU(1<<16)), kv("token_window", raw(0xc0)), kv("token_skew", raw(0xc0))),
			&Welcome{Version: 1, Server: "x", Incarnation: 3, Connection: 1, MaxFrame: 1 << 20, MaxRecordBytes: 1 << 16}},
		{"welcome with a zero token window", mpMap(9, kv("t", mpS("welcome")), kv("version", mpU(1)), kv("server", mpS("x")), kv("incarnation", mpU(3)), kv("connection", mpU(1)), kv("max_frame", mpU(1<<20)), kv("max_record_bytes", mpU(1<<16)), kv("token_window", mpU(0)), kv("token_skew", mpU(60000))),
			&Welcome{Version: 1, Server: "x", Incarnation: 3, Connection: 1, MaxFrame: 1 << 20, MaxRecordBytes: 1 << 16, TokenWindow: new(uint64(0)), TokenSkew: new(uint64(60000))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeServerMessage(tc.body)
			if err != nil {
				t.Fatalf("DecodeServerMessage error: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
			if !bytes.Equal(Encode(got), Encode(tc.want)) {
				t.Errorf("re-encoding differs")
			}
		})
	}
}

func TestEncode_CompactIntegers(t *testing.T) {
	tests := []struct {
		v    uint64
		want []byte
	}{
		{0, raw(0x00)}, {127, raw(0x7f)}, {128, raw(0xcc, 0x80)}, {255, raw(0xcc, 0xff)},
		{256, raw(0xcd, 0x01, 0x00)}, {65535, raw(0xcd, 0xff, 0xff)}, {65536, raw(0xce, 0, 1, 0, 0)},
		{1<<32 - 1, raw(0xce, 0xff, 0xff, 0xff, 0xff)}, {1 << 32, raw(0xcf, 0, 0, 0, 1, 0, 0, 0, 0)},
	}
	for _, tc := range tests {
		if got := appendUint(nil, tc.v); !bytes.Equal(got, tc.want) {
			t.Errorf("appendUint(%d) = %x, want %x", tc.v, got, tc.want)
		}
	}
}

func TestEncode_LongValuesRoundTrip(t *testing.T) {
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536, 70000} {
		s := string(filled(n))
		msgs := []Message{
			&Tell{ID: 1, Token: testToken(1), Payload: filled(n)},
			&Error{ID: 1, Code: CodeBadRequest, Detail: s, Reason: &s},
			&Hello{Versions: make([]uint64, min(n, MaxVersions)), Auth: &s},
		}
		for _, m := range msgs {
			dec := DecodeServerMessage
			if _, ok := m.(*Error); !ok {
				dec = DecodeRequest
			}
			got, err := dec(Encode(m))
			if err != nil {
				t.Fatalf("decode(Encode(%s of %d)) error: %v", m.Type(), n, err)
			}
			if diff := cmp.Diff(m, got); diff != "" {
				t.Fatalf("round trip of %s of %d (-want +got):\n%s", m.Type(), n, diff)
			}
		}
	}
}

func TestID(t *testing.T) {
	for _, tc := range goldenCases() {
		id, ok := ID(tc.msg)
		_, noID := map[string]bool{TypeHello: true, TypeWelcome: true, TypeRejected: true, TypeDelivery: true, TypeCompacted: true}[tc.msg.Type()]
		if _, sb := tc.msg.(*ServerBye); sb {
			noID = true
		}
		if ok == noID {
			t.Errorf("ID(%s) ok = %v, want %v", tc.name, ok, !noID)
		}
		if ok && id == 0 {
			t.Errorf("ID(%s) = 0, want the golden id", tc.name)
		}
	}
}

// TestDecodeRequest_HelloVersionsAreBounded: a frame of fixints must not
// decode into eight times its size.
func TestDecodeRequest_HelloVersionsAreBounded(t *testing.T) {
	versions := make([]uint64, MaxVersions+1)
	for i := range versions {
		versions[i] = 1
	}
	_, err := DecodeRequest(Encode(&Hello{Versions: versions}))
	var de *DecodeError
	if !errors.As(err, &de) || de.Field != "versions" {
		t.Fatalf("DecodeRequest(hello with %d versions) = %v, want a field error on versions", len(versions), err)
	}
	if _, err := DecodeRequest(Encode(&Hello{Versions: versions[:MaxVersions]})); err != nil {
		t.Fatalf("DecodeRequest(hello with %d versions) = %v, want it accepted", MaxVersions, err)
	}
}

// enroll.invite is optional, copied out of the body, and bounded: a longer
// one is a bad_request on its field, with the id known.
func TestDecodeRequest_EnrollInvite(t *testing.T) {
	m, err := DecodeRequest(Encode(&Enroll{ID: 3, Conversation: 1, Token: testToken(1)}))
	if err != nil || m.(*Enroll).Invite != nil {
		t.Fatalf("enroll without invite = %#v, %v, want Invite nil", m, err)
	}
	inv := bytes.Repeat([]byte{7}, MaxInvite)
	body := Encode(&Enroll{ID: 3, Conversation: 1, Token: testToken(1), Invite: inv})
	m, err = DecodeRequest(body)
	if err != nil || !bytes.Equal(m.(*Enroll).Invite, inv) {
		t.Fatalf("enroll with a %d-byte invite = %#v, %v", MaxInvite, m, err)
	}
	clear(body)
	if !bytes.Equal(m.(*Enroll).Invite, inv) {
		t.Fatal("the decoded invite aliases the body")
	}
	_, err = DecodeRequest(Encode(&Enroll{ID: 3, Conversation: 1, Token: testToken(1), Invite: append(inv, 7)}))
	var de *DecodeError
	if !errors.As(err, &de) || de.Field != "invite" || de.Class != BadRequest || !de.HasID || de.ID != 3 {
		t.Fatalf("enroll with a %d-byte invite = %v, want bad_request on invite with id 3", MaxInvite+1, err)
	}
}
