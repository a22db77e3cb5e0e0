package wire

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestTokenV7_LayoutAndRoundTrip(t *testing.T) {
	for _, c := range []struct {
		ms           int64
		randA        uint16
		randB        uint64
		want         string
		wantMilli    int64
		wantA, wantB uint64
	}{
		{0, 0, 0, "00000000000070008000000000000000", 0, 0, 0},
		{0x0123_4567_89ab, 0xfabc, 0xffff_ffff_ffff_ffff, "0123456789ab7abcbfffffffffffffff", 0x0123_4567_89ab, 0xabc, 1<<62 - 1},
		{MaxTokenMilli + 1, 1, 2, "00000000000070018000000000000002", 0, 1, 2},
	} {
		tok := TokenV7(c.ms, c.randA, c.randB)
		if got := tok.String(); got != c.want {
			t.Errorf("TokenV7(%#x, %#x, %#x) = %s, want %s", c.ms, c.randA, c.randB, got, c.want)
		}
		if tok.IsZero() {
			t.Errorf("TokenV7(%#x, ...) is zero", c.ms)
		}
		ms, ok := tok.UnixMilli()
		if !ok || ms != c.wantMilli {
			t.Errorf("%s.UnixMilli() = %d, %v; want %d, true", tok, ms, ok, c.wantMilli)
		}
		u := uuid.UUID(tok)
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Errorf("%s: uuid version %d variant %v, want 7 and RFC 4122/9562", tok, u.Version(), u.Variant())
		}
	}
}

// UnixMilli reads what an independent UUIDv7 implementation wrote, and
// refuses what is not a v7.
func TestToken_UnixMilli(t *testing.T) {
	before := time.Now().UnixMilli()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixMilli()
	ms, ok := Token(u).UnixMilli()
	if !ok || ms < before || ms > after {
		t.Errorf("uuid.NewV7() %s: UnixMilli = %d, %v; want in [%d, %d], true", u, ms, ok, before, after)
	}
	v4 := uuid.Must(uuid.NewRandom())
	v7 := TokenV7(1, 0, 0)
	badVariant := v7
	badVariant[8] = 0xc0
	for name, tok := range map[string]Token{
		"v4":                    Token(v4),
		"zero":                  {},
		"version 7, variant 11": badVariant,
		"version 6":             func() Token { t := v7; t[6] = 0x60; return t }(),
	} {
		if ms, ok := tok.UnixMilli(); ok {
			t.Errorf("%s %s: UnixMilli = %d, true; want not a v7", name, tok, ms)
		}
	}
}
