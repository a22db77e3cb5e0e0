package server

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// The token window's refusals carry their bound in the extra the protocol
// names: oldest for token_expired, newest for token_invalid of a token
// ahead of the clock, none for one that is not a UUIDv7.
func TestErrorAnswer_TokenWindowExtras(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want *wire.Error
	}{
		{"expired", &participant.Error{Code: participant.CodeTokenExpired, Detail: "d", Oldest: 1767225600000},
			&wire.Error{ID: 7, Code: wire.CodeTokenExpired, Detail: "d", Oldest: ptr(uint64(1767225600000))}},
		{"expired, wrapped", fmt.Errorf("op: %w", &participant.Error{Code: participant.CodeTokenExpired, Oldest: 5}),
			&wire.Error{ID: 7, Code: wire.CodeTokenExpired, Oldest: ptr(uint64(5))}},
		{"ahead of the clock", &participant.Error{Code: participant.CodeTokenInvalid, Detail: "d", Newest: 1767225660000},
			&wire.Error{ID: 7, Code: wire.CodeTokenInvalid, Detail: "d", Newest: ptr(uint64(1767225660000))}},
		{"not a UUIDv7", &participant.Error{Code: participant.CodeTokenInvalid, Detail: "d"},
			&wire.Error{ID: 7, Code: wire.CodeTokenInvalid, Detail: "d"}},
	} {
		if diff := cmp.Diff(c.want, errorAnswer(7, c.err)); diff != "" {
			t.Errorf("%s: errorAnswer (-want +got):\n%s", c.name, diff)
		}
	}
}
