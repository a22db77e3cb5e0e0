// Package wire is the participantd wire protocol, version 1 (docs/PROTOCOL.md):
// the frame codec and one Go type per message, in both directions. It is a
// leaf: it imports nothing of the project, only the standard library.
//
// # Frames
//
// A connection carries frames in both directions:
//
//	offset  size     field
//	0       4        length: uint32, big-endian
//	4       length   body: one msgpack map with string keys
//
// A Reader refuses a header announcing more than its limit (DefaultMaxFrame,
// 1 MiB, unless configured) from the header alone, before reading or
// allocating any of the body, with a *FrameTooLargeError carrying the
// announced length. Below the limit it still allocates only as the bytes
// arrive, so a peer that announces 1 MiB and sends 10 bytes costs 4 KiB. A
// Writer hands each frame, header and body, to one Write call.
//
// # Messages
//
// Key "t" names the type. Requests carry "id" (except hello); answers echo
// it; pushes have none.
//
//	client → server   Go type    server → client                   Go type
//	hello             *Hello     welcome | rejected                *Welcome | *Rejected
//	enroll            *Enroll    enrolled                          *Enrolled
//	attach            *Attach    attached                          *Attached
//	tell              *Tell      told                              *Told
//	ack               *Ack       acked                             *Acked
//	detach            *Detach    detached                          *Detached
//	leave             *Leave     left                              *Left
//	ping              *Ping      pong                              *Pong
//	bye               *Bye       (none; the server closes)
//	                             error (answers any request)       *Error
//	                             delivery (push)                   *Delivery
//	                             compacted (push)                  *Compacted
//	                             bye (push: reason, no id)         *ServerBye
//
// Since bye means different things in the two directions, there are two
// decoders: DecodeRequest reads what a client sends, DecodeServerMessage
// what a server sends. Encode, AppendEncode, AppendFrame and
// Writer.WriteMessage encode any message. Encoding is deterministic: "t",
// then "id", then the fields in the order of docs/PROTOCOL.md's tables, then the
// optional fields that are present, each integer, string, bin, array and map
// header in its most compact form. The golden frames in testdata/wire pin
// the bytes.
//
// Optional fields are pointers (nil: absent), except Delivery.Payload, where
// nil is absent and a non-nil empty slice is a present empty bin. On decode,
// an optional field whose value is msgpack nil reads as absent. Integers are
// accepted in any msgpack integer encoding whose value is not negative.
// Byte fields (token, secret, payload) must be bin; strings must be str.
// Unknown keys are ignored; when a key occurs twice, the last one counts.
//
// # Decoding untrusted bytes
//
// Before anything is decoded, a structural walker checks the whole body: one
// map, string keys, every declared length (str, bin, ext, array, map)
// within the bytes actually left, nothing after the map. It is iterative and
// keeps one counter of values still owed, which must never exceed the bytes
// left, so a 16-byte body claiming a 4 GiB bin or a map of 2^32-1 entries is
// refused at once, and nesting depth costs neither stack nor memory (hence
// no depth cap: values nested under unknown keys are skipped, as the
// protocol requires, however deep). No decoding allocation is larger than
// the body (a hello's versions at most 8x their encoded size).
//
// # Errors
//
//	error                     connection        server answer
//	*FrameTooLargeError       closes            rejected{reason:"frame_too_large"}
//	DecodeError, Malformed    closes            rejected{reason:"malformed"}
//	DecodeError, BadRequest   stays open        {t:"error", id, code:"bad_request", detail}
//
// Malformed (errors.Is ErrMalformed): an empty body, not a map, a non-string
// key, a declared length past the end, trailing bytes, no string "t", or a
// request other than hello without an unsigned integer "id". BadRequest
// (errors.Is ErrBadRequest): an unknown "t", or a field missing, of the
// wrong type or of the wrong length (a token of 15 bytes or all zero, a
// secret of 31); DecodeError.ID and HasID carry the id to answer with.
//
// What stays with the server: before welcome, a frame that decodes to
// anything but *Hello is hello_required, including a Malformed error whose
// Type is set (a valid map lacking only the id), while a Malformed error
// with an empty Type is malformed; a hello BadRequest (HasID false: hello has
// no id) can only be answered with rejected, malformed; after welcome, a
// *Hello is malformed (a second hello).
//
// # Ownership
//
// Reader.ReadFrame returns a body that aliases the Reader's buffer and is
// valid until the next ReadFrame. Decoded messages never alias the body:
// strings and payloads are copies, tokens and secrets are arrays. Writers
// do not retain what they are given. Buffers up to 64 KiB are reused between
// frames; bigger ones are dropped after use.
//
// # Concurrency
//
// Reader and Writer are for one goroutine at a time. Conn pairs them over a
// net.Conn: one reader goroutine, and any number of writers, each frame
// written whole under a lock.
package wire
