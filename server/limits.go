package server

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/participantd/participantd/wire"
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
// Above 80 % of MaxConnections, a peer holding a twentieth of them is
// refused first, so that the rest admits the others.
//
// Under mutual TLS (TLSClientCA) the principal is the client certificate's
// identity, as for the shares: once a connection's hello is read, it is
// counted under its certificate, whatever its address (loopback too), and
// the same limits apply to the certificate (admitCertLocked), the
// conversation bucket included. Its address still bounds what it may hold
// (MaxConnectionsPerAddress) and open (ConnectionRate) before anyone has
// proven who it is, but the 80 % rule counts only the address's
// connections that have not said hello yet (proving): so one certificate
// from many addresses is one principal, and the clients behind one NAT
// address are not refused for each other beyond its cap.
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
	// high and small make the 80 % rule: above high of maxConns
	// connections, a principal holding small is refused.
	maxConns    int
	high, small int
	// mtls is set when client certificates are required: they are then
	// the principals.
	mtls bool

	peers map[netip.Prefix]*peer
	// certs are the certificate identities' connections and buckets.
	certs map[string]*peer
	// swept is when entries that hold nothing were last dropped.
	swept time.Time
}

// peer is one address's, or one certificate identity's, open connections
// and buckets.
type peer struct {
	open int
	// proving counts, of an address under mutual TLS, the connections
	// not counted under a certificate yet.
	proving int
	conns   bucket
	creates *creations
}

// connCount is what the peer limits count of one connection, guarded by
// Server.mu: whether it is among its address's proving, and the
// certificate identity it is counted under ("" none).
type connCount struct {
	proving bool
	cert    string
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
		maxConns:   cfg.MaxConnections,
		high:       highWater(cfg.MaxConnections),
		small:      max(1, cfg.MaxConnections/20),
		mtls:       cfg.TLSClientCA != "",
		peers:      make(map[netip.Prefix]*peer),
		certs:      make(map[string]*peer),
	}
}

// highWater is 80 % of maxConns; without a limit (a Config the defaults
// were not applied to) there is none.
func highWater(maxConns int) int {
	if maxConns <= 0 {
		return math.MaxInt
	}
	return maxConns * 8 / 10
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

// admitLocked counts one more connection of key at now, while the server
// holds held, or returns why it is refused. Under mutual TLS the 80 %
// rule weighs only the address's connections that have not said hello.
func (l *peerLimits) admitLocked(key netip.Prefix, held int, now time.Time) string {
	l.sweepLocked(now)
	p := entryLocked(l, l.peers, key, now)
	crowd, which := p.open, ""
	if l.mtls {
		crowd, which = p.proving, " that have not said hello"
	}
	return l.admitPeerLocked(p, "your address", crowd, which, "one address", held, now)
}

// admitPeerLocked counts one more connection of p, an address or a
// certificate identity that refusals call who, at now, while the server
// holds held, or returns why it is refused: above 80 % of the
// connections when crowd (p's connections the rule weighs, which says
// which) is a twentieth of them; at the limit of one principal (whose
// names it); faster than the connection rate.
func (l *peerLimits) admitPeerLocked(p *peer, who string, crowd int, which, whose string, held int, now time.Time) string {
	switch {
	case held >= l.high && crowd >= l.small:
		return fmt.Sprintf("the server holds over 80%% of its %d connections, and %s holds %d%s, a twentieth of them", l.maxConns, who, crowd, which)
	case p.open >= l.perAddress:
		return fmt.Sprintf("%s holds %d connections, the limit of %s", who, p.open, whose)
	case !p.conns.take(now, l.rate, l.burst):
		return fmt.Sprintf("%s opens connections faster than %g a second", who, l.rate)
	}
	p.open++
	return ""
}

// provingLocked counts a connection admitted for key among its address's
// proving, under mutual TLS.
func (l *peerLimits) provingLocked(key netip.Prefix, cnt *connCount) {
	if p := l.peers[key]; l.mtls && p != nil {
		p.proving++
		cnt.proving = true
	}
}

// admitCertLocked counts one more connection of certificate identity id
// at now, once its hello is read, while the server holds held others, or
// returns why it is refused. Either way the connection is no longer among
// its address's proving.
func (l *peerLimits) admitCertLocked(key netip.Prefix, cnt *connCount, id string, held int, now time.Time) string {
	if p := l.peers[key]; cnt.proving && p != nil {
		p.proving--
	}
	cnt.proving = false
	p := entryLocked(l, l.certs, id, now)
	why := l.admitPeerLocked(p, "your client certificate", p.open, "", "one client (max-connections-per-address)", held, now)
	if why == "" {
		cnt.cert = id
	}
	return why
}

// entryLocked returns the entry of k in m, making a fresh one at now.
func entryLocked[K comparable](l *peerLimits, m map[K]*peer, k K, now time.Time) *peer {
	p := m[k]
	if p == nil {
		p = &peer{conns: fillBucket(l.burst, now), creates: newCreations(l.convRate, l.convBurst, now)}
		m[k] = p
	}
	return p
}

// releaseLocked counts one connection closed: of key when limited, and of
// whatever cnt says it is counted under.
func (l *peerLimits) releaseLocked(key netip.Prefix, limited bool, cnt *connCount) {
	if p := l.peers[key]; limited && p != nil {
		p.open--
		if cnt.proving {
			p.proving--
		}
	}
	if p := l.certs[cnt.cert]; cnt.cert != "" && p != nil {
		p.open--
	}
	*cnt = connCount{}
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

// sweepLocked drops, at most once a second, the peers and certificate
// identities that hold no connection and whose buckets are full again:
// they are as if never seen. The maps so hold those with connections
// plus those that connected, or created conversations, within the last
// time their buckets take to fill (convBurst/convRate, ten seconds by
// default).
func (l *peerLimits) sweepLocked(now time.Time) {
	if now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	sweep(l, l.peers, now)
	sweep(l, l.certs, now)
}

func sweep[K comparable](l *peerLimits, m map[K]*peer, now time.Time) {
	for k, p := range m {
		if p.open == 0 && p.conns.level(now, l.rate, l.burst) >= l.burst && p.creates.full(now) {
			delete(m, k)
		}
	}
}

// admitCert counts c under its client certificate's identity once its
// hello is read, under mutual TLS, and gives it the certificate's
// conversation bucket; or returns why it is refused (peerLimits).
func (s *Server) admitCert(c *conn) (wire.Reason, string) {
	if !s.peers.mtls {
		return "", ""
	}
	id := certPrincipal(c.nc)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		return "", ""
	}
	if detail := s.peers.admitCertLocked(c.peer, &c.count, id, len(s.conns)-1, now); detail != "" {
		return wire.ReasonOverloaded, detail
	}
	c.creates = s.peers.certs[id].creates
	return "", ""
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
