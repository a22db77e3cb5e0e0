package server

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// peerLimits bounds what one peer address may hold and open: at most
// MaxConnectionsPerAddress connections at once, new ones at ConnectionRate
// a second (a token bucket of one second's worth, at least one), and new
// conversations at ConversationRate a second (a bucket of
// ConversationBurst). A peer is its address's prefix: an IPv4 /IPv4Prefix
// (each address by default), an IPv6 /IPv6Prefix (a /64 by default, what
// one host is usually given). Loopback peers are exempt unless LimitLoopback: they are this
// machine, or a proxy in front of it that makes every client look local;
// each of their connections gets a conversation bucket of its own instead.
//
// Its methods ending in Locked need Server.mu held.
type peerLimits struct {
	perAddress int
	rate       float64
	burst      float64
	loopback   bool
	// v4 and v6 are the prefix lengths of one peer.
	v4 int
	v6 int
	// convRate and convBurst pace the conversations a peer creates.
	convRate  float64
	convBurst float64

	peers map[netip.Prefix]*peer
	// swept is when entries that hold nothing were last dropped.
	swept time.Time
}

// peer is one address's open connections and buckets.
type peer struct {
	open    int
	conns   bucket
	creates *creations
}

// bucket is a token bucket, brought up to date when it is used.
type bucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

// fillBucket returns a bucket that is full at now.
func fillBucket(burst float64, now time.Time) bucket { return bucket{tokens: burst, at: now} }

// creations is a bucket of conversation creations: one address's, shared
// by its connections, or one exempt connection's own. The service takes
// from it while deciding an enroll, under the conversation's turn, so it
// has a mutex of its own, a leaf: Server.mu is never taken there.
type creations struct {
	// rate and burst are fixed at creation. One name per field:
	// checklocks matches annotations to fields by position, which a line
	// declaring two fields shifts.
	rate  float64 // +checklocksignore: read-only
	burst float64 // +checklocksignore: read-only
	// mu guards b.
	mu sync.Mutex
	// +checklocks:mu
	b bucket
}

func newCreations(rate, burst float64, now time.Time) *creations {
	return &creations{rate: rate, burst: burst, b: fillBucket(burst, now)}
}

// take takes one creation at now, reporting whether there was one.
func (c *creations) take(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.take(now, c.rate, c.burst)
}

// exhausted reports whether the bucket has no creation left at now,
// taking nothing.
func (c *creations) exhausted(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.level(now, c.rate, c.burst) < 1
}

// full reports whether the bucket is full at now.
func (c *creations) full(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.level(now, c.rate, c.burst) >= c.burst
}

// level returns the tokens b holds at now.
func (b *bucket) level(now time.Time, rate, burst float64) float64 {
	return min(burst, b.tokens+max(0, now.Sub(b.at).Seconds())*rate)
}

// take takes a token at now, reporting whether there was one.
func (b *bucket) take(now time.Time, rate, burst float64) bool {
	b.tokens, b.at = b.level(now, rate, burst), now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func newPeerLimits(cfg Config) *peerLimits {
	return &peerLimits{
		perAddress: cfg.MaxConnectionsPerAddress,
		rate:       cfg.ConnectionRate,
		burst:      max(1, cfg.ConnectionRate),
		loopback:   cfg.LimitLoopback,
		v4:         cmp.Or(cfg.IPv4Prefix, DefaultIPv4Prefix),
		v6:         cmp.Or(cfg.IPv6Prefix, DefaultIPv6Prefix),
		convRate:   cfg.ConversationRate,
		convBurst:  float64(max(1, cfg.ConversationBurst)),
		peers:      make(map[netip.Prefix]*peer),
	}
}

// key returns the limits' key of a remote address, and whether the limits
// apply to it.
func (l *peerLimits) key(addr net.Addr) (netip.Prefix, bool) {
	ip, ok := tcpIP(addr)
	if !ok || ip.IsLoopback() && !l.loopback {
		return netip.Prefix{}, false
	}
	return ipPrefix(ip, l.v4, l.v6), true
}

// tcpIP returns the IP of a TCP address (an IPv4-mapped IPv6 one as IPv4),
// and false for any other address.
func tcpIP(addr net.Addr) (netip.Addr, bool) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	return ip.Unmap(), ok
}

// ipPrefix returns ip's prefix of v4 bits if it is IPv4, of v6 bits if
// IPv6.
func ipPrefix(ip netip.Addr, v4, v6 int) netip.Prefix {
	bits := v4
	if ip.Is6() {
		bits = v6
	}
	p, _ := ip.Prefix(bits)
	return p
}

// admitLocked counts one more connection of key at now, or returns why it
// is refused.
func (l *peerLimits) admitLocked(key netip.Prefix, now time.Time) string {
	l.sweepLocked(now)
	p := l.peers[key]
	if p == nil {
		p = &peer{conns: fillBucket(l.burst, now), creates: newCreations(l.convRate, l.convBurst, now)}
		l.peers[key] = p
	}
	switch {
	case p.open >= l.perAddress:
		return fmt.Sprintf("your address holds %d connections, the limit of one address", p.open)
	case !p.conns.take(now, l.rate, l.burst):
		return fmt.Sprintf("your address opens connections faster than %g a second", l.rate)
	}
	p.open++
	return ""
}

// openLocked returns the connections key holds.
func (l *peerLimits) openLocked(key netip.Prefix) int {
	if p := l.peers[key]; p != nil {
		return p.open
	}
	return 0
}

// releaseLocked counts one connection of key closed.
func (l *peerLimits) releaseLocked(key netip.Prefix) {
	if p := l.peers[key]; p != nil {
		p.open--
	}
}

// creationsLocked returns the conversation bucket of a connection of key
// admitted at now: its address's when limited (admitLocked made the
// entry), else one of its own.
func (l *peerLimits) creationsLocked(key netip.Prefix, limited bool, now time.Time) *creations {
	if p := l.peers[key]; limited && p != nil {
		return p.creates
	}
	return newCreations(l.convRate, l.convBurst, now)
}

// sweepLocked drops, at most once a second, the peers that hold no
// connection and whose buckets are full again: they are as if never seen.
// The map so holds the peers with connections plus those that connected,
// or created conversations, within the last time their buckets take to
// fill (convBurst/convRate, ten seconds by default).
func (l *peerLimits) sweepLocked(now time.Time) {
	if now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	for k, p := range l.peers {
		if p.open == 0 && p.conns.level(now, l.rate, l.burst) >= l.burst && p.creates.full(now) {
			delete(l.peers, k)
		}
	}
}

// logLimiter lets one log line through per interval and counts the ones
// it held back, for events a peer can cause at will (a wrong admin token).
type logLimiter struct {
	// mu guards last and held.
	mu sync.Mutex
	// +checklocks:mu
	last time.Time
	// +checklocks:mu
	held int
}

// allow reports whether a line may be logged at now, and how many were
// held back since the last one.
func (l *logLimiter) allow(now time.Time, interval time.Duration) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < interval {
		l.held++
		return false, 0
	}
	held := l.held
	l.last, l.held = now, 0
	return true, held
}
