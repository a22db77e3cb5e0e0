package server

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/participantd/participantd/wire"
)

// Guessing a token is slowed per principal: each peer address (an IPv6
// /64, loopback included: another local user is a principal too) may
// present a wrong auth or admin token AuthFailureBurst times, then one
// more time every AuthFailureInterval; past that its attempts are refused
// before the token is compared until its allowance refills. At these
// values a principal tries at most 10 tokens a minute, 14,400 a day:
// nothing against 128 bits, and a storm of refusals stands out in
// MetricAuthFailures. A principal sharing the address of a guesser is
// refused with it while it lasts, which its detail says.
const (
	// AuthFailureBurst is the wrong tokens a principal may present before
	// it is slowed.
	AuthFailureBurst = 10
	// AuthFailureInterval is how often, once slowed, a principal may try
	// again.
	AuthFailureInterval = 6 * time.Second
	// authGuardPrincipals bounds the principals remembered; past it the
	// ones that did not fail lately are forgotten, and if none is, new
	// ones share one allowance (a guesser with more addresses than this
	// slows itself and the other newcomers alike, not the known ones).
	authGuardPrincipals = 16384
)

// MetricAuthFailures counts refused auth and admin token attempts by
// listener (wire, ws, admin) and cause: wrong_token (compared, and wrong
// or missing) or throttled (refused uncompared, the principal being over
// its allowance).
const MetricAuthFailures = "participantd_auth_failures_total"

// The causes of MetricAuthFailures.
const (
	authWrongToken = "wrong_token"
	authThrottled  = "throttled"
)

// authGuard slows the guessing of a token per principal
// (AuthFailureBurst, AuthFailureInterval) and counts the failures.
type authGuard struct {
	max      int // +checklocksignore: read-only (tests lower it before use)
	failures *prometheus.CounterVec
	// v4 and v6 are the prefix lengths of one principal, declared apart:
	// after a line naming two fields, checklocks puts the annotations
	// below on the wrong fields.
	v4 int
	v6 int

	// mu guards fails, overflow and swept.
	mu sync.Mutex
	// fails is each principal's allowance of failures; a principal with
	// no entry has its whole allowance.
	// +checklocks:mu
	fails map[netip.Prefix]*rate.Limiter
	// overflow is the allowance shared by the principals beyond max.
	// +checklocks:mu
	overflow *rate.Limiter
	// swept is when fails was last swept of full allowances.
	// +checklocks:mu
	swept time.Time
}

// newAuthGuard returns a guard whose principals are the addresses of one
// /v4 or /v6 prefix, the peers of --ipv4-prefix and --ipv6-prefix, so that
// the prefixes that make one peer for the shares and the per-address
// limits make one guesser too.
func newAuthGuard(reg prometheus.Registerer, v4, v6 int) *authGuard {
	g := &authGuard{
		max: authGuardPrincipals,
		v4:  v4,
		v6:  v6,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricAuthFailures,
			Help: "Refused auth and admin token attempts, by listener (wire, ws, admin) and cause (wrong_token: compared and wrong or missing; throttled: refused uncompared, the peer address being over its allowance of failures).",
		}, []string{"listener", "cause"}),
		fails: make(map[netip.Prefix]*rate.Limiter),
	}
	g.overflow = newAuthLimiter()
	for _, l := range []string{"wire", "ws", "admin"} {
		for _, c := range []string{authWrongToken, authThrottled} {
			g.failures.WithLabelValues(l, c)
		}
	}
	reg.MustRegister(g.failures)
	return g
}

// newAuthLimiter returns a principal's full allowance of failures.
func newAuthLimiter() *rate.Limiter {
	return rate.NewLimiter(rate.Every(AuthFailureInterval), AuthFailureBurst)
}

// principal is the guard's key of a remote address: its peerLimits key
// (its /v4 or /v6 prefix), loopback included. An address that is not TCP
// (a pipe in tests) is the zero key, one principal for all of them.
func (g *authGuard) principal(addr net.Addr) netip.Prefix {
	ip, ok := tcpIP(addr)
	if !ok {
		return netip.Prefix{}
	}
	return ipPrefix(ip, g.v4, g.v6)
}

// admit reports whether principal may present a token at now, and if not,
// how long until it may; a refusal is counted as throttled on listener.
func (g *authGuard) admit(principal netip.Prefix, listener string, now time.Time) (bool, time.Duration) {
	g.mu.Lock()
	lim := g.limiterLocked(principal, now, false)
	var wait time.Duration
	if lim != nil {
		if tokens := lim.TokensAt(now); tokens < 1 {
			wait = time.Duration((1 - tokens) * float64(AuthFailureInterval))
		}
	}
	g.mu.Unlock()
	if lim == nil || wait == 0 {
		return true, 0
	}
	g.failures.WithLabelValues(listener, authThrottled).Inc()
	return false, wait
}

// failed records that principal presented a wrong or missing token on
// listener at now.
func (g *authGuard) failed(principal netip.Prefix, listener string, now time.Time) {
	g.mu.Lock()
	g.limiterLocked(principal, now, true).AllowN(now, 1)
	g.mu.Unlock()
	g.failures.WithLabelValues(listener, authWrongToken).Inc()
}

// limiterLocked returns principal's allowance, nil when it has none
// recorded and !create. Past max principals it sweeps the ones whose
// allowance is full (at most once an interval), and if none is, hands out
// the shared overflow allowance.
//
// +checklocks:g.mu
func (g *authGuard) limiterLocked(principal netip.Prefix, now time.Time, create bool) *rate.Limiter {
	if lim, ok := g.fails[principal]; ok {
		return lim
	}
	if !create {
		return nil
	}
	if len(g.fails) >= g.max && now.Sub(g.swept) >= AuthFailureInterval {
		g.swept = now
		for p, lim := range g.fails {
			if lim.TokensAt(now) >= AuthFailureBurst {
				delete(g.fails, p)
			}
		}
	}
	if len(g.fails) >= g.max {
		return g.overflow
	}
	lim := newAuthLimiter()
	g.fails[principal] = lim
	return lim
}

// checkAuth decides hello.auth of a connection from addr on the wire or
// WebSocket listener: "" when no auth token is set or it is presented,
// else the rejection's reason and detail. A peer over its allowance of
// failures is refused before the token is compared.
func (s *Server) checkAuth(addr net.Addr, ws bool, auth *string) (wire.Reason, string) {
	want := s.cfg.AuthToken
	if want == "" {
		return "", ""
	}
	listener := "wire"
	if ws {
		listener = "ws"
	}
	principal, now := s.auth.principal(addr), time.Now()
	if ok, wait := s.auth.admit(principal, listener, now); !ok {
		return wire.ReasonAuthFailed, fmt.Sprintf("too many wrong auth tokens from this address: try again in %v", wait.Round(time.Second))
	}
	if auth == nil || !tokenEqual(*auth, want) {
		s.auth.failed(principal, listener, now)
		return wire.ReasonAuthFailed, "wrong or missing auth token"
	}
	return "", ""
}

// isWS reports whether nc is a WebSocket connection.
func isWS(nc net.Conn) bool {
	_, ok := nc.(*wsConn)
	return ok
}
