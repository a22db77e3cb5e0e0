package fence

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"
)

// Options configures a Fences. The zero Options are the defaults.
type Options struct {
	// Logger receives the one thing Fences reports without returning it: a
	// re-issue of an already superseded attempt. Nil means zerolog.Nop().
	Logger *zerolog.Logger
}

// Fences is the registry of the only generations allowed to complete, one
// per execution site, together with the lease gate that holds a completion
// back until its lease is recorded.
//
// K is the execution-site key. It is a type parameter rather than a fixed
// struct so that the package stays a leaf and every caller keys sites by
// its own domain type (participantd uses a (conversation, participant)
// pair) without converting to strings; any comparable type will do, and
// the compiler keeps sites of different registries from being mixed.
//
// Fences is safe for concurrent use. The zero Fences is ready for use and
// logs nothing; New applies Options. A Fences must not be copied after
// first use.
//
// Fences deliberately lives in memory only: a new process starts with an
// empty registry, re-dispatch issues fresh tokens, and so every token from
// before a restart is refused whether it arrives before or after the new
// issue.
type Fences[K comparable] struct {
	log zerolog.Logger

	// leaseWaitHook, when set, runs each time LeaseSettled is about to block.
	// Set only by tests, and only before first use.
	leaseWaitHook func(Token)

	// mu guards current. It is never held together with gateMu.
	mu sync.Mutex
	// current holds the one generation of each site allowed to complete.
	current map[K]generation

	// gateMu guards pending. It is never held together with mu.
	gateMu sync.Mutex
	// pending maps each token whose lease is armed and not yet settled to
	// a channel that is closed when it settles.
	pending map[Token]chan struct{}
}

// generation is every token authorized for one attempt of one execution
// generation of one site.
//
// outstanding holds more than one token in exactly one situation: the same
// attempt was delivered more than once, so two live workers each genuinely
// hold a token minted for the same work. Delivery is at-least-once, so that
// is ordinary rather than exceptional. Either token may be accepted; the
// first accepted completion consumes the whole generation, so the other is
// the duplicate and is refused.
type generation struct {
	// key is the caller's execution-generation discriminator: a different
	// key supersedes the generation whole, whatever the attempts.
	key string
	// attempt is the one-based delivery attempt the tokens were issued for.
	// A higher attempt supersedes; an equal one is a redelivery.
	attempt uint32
	// outstanding are the tokens issued for attempt that have been neither
	// consumed by an accepted completion nor revoked by their issuer.
	outstanding []Token
}

// Accepted is the generation one accepted completion consumed, handed back
// so that a settlement failing afterwards can restore exactly what was
// taken, siblings included, with RestoreIfAbsent. The zero Accepted holds
// nothing and restores nothing.
type Accepted struct {
	gen generation
}

// Attempt returns the one-based delivery attempt whose completion was
// accepted.
func (a Accepted) Attempt() uint32 {
	return a.gen.attempt
}

// GenerationKey returns the generation key the accepted generation was
// issued under.
func (a Accepted) GenerationKey() string {
	return a.gen.key
}

// New returns an empty Fences configured by opts.
func New[K comparable](opts Options) *Fences[K] {
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = *opts.Logger
	}
	return &Fences[K]{log: log.With().Str("component", "fence").Logger()}
}

// Issue authorizes one more delivery of one attempt at site and returns its
// token. generationKey names the execution generation (for participantd,
// IdempotencyKey of the binding); attempt is one-based.
//
// One generation is held per site, and what a call is decides what happens:
//
//   - a different generationKey is a different execution generation: the
//     current generation is superseded whole, whatever its attempt;
//   - a higher attempt of the same generation is a retry: the current
//     attempt's tokens are superseded;
//   - the same attempt of the same generation is a redelivery of work a
//     worker may still be executing, so the new token joins the outstanding
//     set rather than replacing it, and the first accepted completion
//     consumes both.
//
// A re-issue of an attempt that was already superseded registers nothing:
// it is logged with both attempt numbers, and the token it returns is
// refused as a stale generation when presented, which is the truthful
// answer for a worker whose attempt no longer exists.
func (f *Fences[K]) Issue(site K, generationKey string, attempt uint32) Token {
	token := newToken()
	if current, registered := f.issue(site, generationKey, attempt, token); !registered {
		f.log.Warn().
			Str("site", fmt.Sprint(site)).
			Uint32("superseded_attempt", attempt).
			Uint32("current_attempt", current).
			Msg("re-issue of an already superseded attempt registers no generation; its token will be refused as stale")
	}
	return token
}

// issue registers token for attempt of generationKey at site, as Issue
// describes. It reports whether it registered the token and, when it did
// not, the attempt that superseded it.
func (f *Fences[K]) issue(site K, generationKey string, attempt uint32, token Token) (current uint32, registered bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.current[site]
	switch {
	case !ok || cur.key != generationKey || attempt > cur.attempt:
		if f.current == nil {
			f.current = make(map[K]generation)
		}
		f.current[site] = generation{key: generationKey, attempt: attempt, outstanding: []Token{token}}
	case attempt == cur.attempt:
		cur.outstanding = append(cur.outstanding, token)
		f.current[site] = cur
	default:
		return cur.attempt, false
	}
	return attempt, true
}

// Accept consumes the current generation of site when token is one of the
// tokens it still has outstanding, and returns what it consumed.
//
// Accept first waits at LeaseSettled for token, so a completion never
// overtakes its own lease. It then compares and consumes within one
// critical section, so two concurrent completions cannot both become truth:
// the first removes the whole generation, and every later presentation of
// any of its tokens finds no generation at all.
//
// Errors: a *RejectionError with Reason MissingToken for the zero Token,
// NoCurrentGeneration when site has no generation, StaleGeneration when the
// generation does not hold token; or, when ctx ends while the lease is
// pending, an error wrapping ctx.Err(), and nothing is consumed.
func (f *Fences[K]) Accept(ctx context.Context, site K, token Token) (Accepted, error) {
	if token.IsZero() {
		return Accepted{}, reject(MissingToken, site)
	}
	if err := f.LeaseSettled(ctx, token); err != nil {
		return Accepted{}, err
	}
	return f.consume(site, token)
}

// AcceptHeld is Accept for a completion whose own caller holds token's
// lease armed: it consumes the current generation of site when it still
// holds token, without waiting at the lease gate.
//
// It exists for one ordering that the gate cannot see: a caller that armed
// the lease, and writes the completion's record after the lease's record
// in one ordered write whose outcome settles both (participantd's batch,
// which starts a binding and ends it in one commit). The completion cannot
// overtake its lease there, and waiting at the gate would wait on the
// caller itself, which settles the lease only after the write. Any other
// completion must use Accept.
//
// Errors: as Accept's, without the context error; nothing is consumed on
// an error.
func (f *Fences[K]) AcceptHeld(site K, token Token) (Accepted, error) {
	if token.IsZero() {
		return Accepted{}, reject(MissingToken, site)
	}
	return f.consume(site, token)
}

// consume removes site's current generation when it holds token.
func (f *Fences[K]) consume(site K, token Token) (Accepted, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.current[site]
	if !ok {
		return Accepted{}, reject(NoCurrentGeneration, site)
	}
	if !slices.Contains(cur.outstanding, token) {
		return Accepted{}, reject(StaleGeneration, site)
	}
	delete(f.current, site)
	return Accepted{gen: cur}, nil
}

// RestoreIfAbsent puts a consumed generation back after the settlement of
// its accepted completion failed, and reports whether it did.
//
// A generation issued meanwhile always wins: the accepted generation is
// restored only while site has no current generation at all. The restored
// generation carries every sibling token it was consumed with. Restoring
// the zero Accepted does nothing.
func (f *Fences[K]) RestoreIfAbsent(site K, accepted Accepted) bool {
	if len(accepted.gen.outstanding) == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.current[site]; ok {
		return false
	}
	if f.current == nil {
		f.current = make(map[K]generation)
	}
	gen := accepted.gen
	// The registry owns its slices outright: Accept hands its slice away and
	// a restore copies, so an Accepted restored twice shares nothing.
	gen.outstanding = slices.Clone(gen.outstanding)
	f.current[site] = gen
	return true
}

// Revoke withdraws exactly token from site's current generation, and
// nothing else: an issuer that could not hand its token over withdraws its
// own authorization.
//
// It never withdraws a sibling token still held by a live worker of the
// same attempt, and never disturbs a newer retry: a newer attempt already
// replaced the outstanding set, so the old token is absent and Revoke does
// nothing. The generation is dropped once its last token is gone.
func (f *Fences[K]) Revoke(site K, token Token) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.current[site]
	if !ok {
		return
	}
	cur.outstanding = slices.DeleteFunc(cur.outstanding, func(t Token) bool { return t == token })
	if len(cur.outstanding) == 0 {
		delete(f.current, site)
		return
	}
	f.current[site] = cur
}

// RevokeCurrent drops whichever generation site has, if any. Parking a site
// retires it deliberately, so every token of its generation goes with it,
// a redelivery's sibling included.
func (f *Fences[K]) RevokeCurrent(site K) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.current, site)
}
