package fence

import "github.com/google/uuid"

// Token is opaque proof that its holder owns one issued generation of one
// site. It is minted at random by Issue, travels to the worker (for
// participantd: the connection holding a binding) as its String form, and
// comes back through ParseToken. Tokens are comparable; the zero Token is
// no token and is refused with MissingToken.
type Token struct {
	s string
}

// newToken mints a fresh random token (a version 4 UUID in its text form).
func newToken() Token {
	return Token{s: uuid.NewString()}
}

// ParseToken turns a token echoed back over the wire into a Token without
// assigning any meaning to its contents: any non-empty value is a candidate,
// and only the Fences that issued it can say whether it is current.
//
// An empty value is refused with a *RejectionError of Reason MissingToken
// (errors.Is ErrMissingToken) and no site; a caller that knows the site
// should say so when it reports the refusal.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, reject(MissingToken, nil)
	}
	return Token{s: s}, nil
}

// String returns the token's wire form: the value ParseToken accepts back.
// The zero Token's form is the empty string.
func (t Token) String() string {
	return t.s
}

// IsZero reports whether t is the zero Token, which stands for no token.
func (t Token) IsZero() bool {
	return t.s == ""
}
