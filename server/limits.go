package server

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// peerLimits bounds what one peer address may hold and open: at most
// MaxConnectionsPerAddress connections at once, and new ones at
// ConnectionRate a second (a token bucket of one second's worth, at least
// one). An IPv6 peer is its /64, what one host is usually given. Loopback
// peers are exempt unless LimitLoopback: they are this machine, or a proxy
// in front of it that makes every client look local.
//
// Its methods ending in Locked need Server.mu held.
type peerLimits struct {
	perAddress int
	rate       float64
	burst      float64
	loopback   bool

	peers map[netip.Prefix]*peer
	// swept is when entries that hold nothing were last dropped.
	swept time.Time
}

// peer is one address's open connections and connection bucket.
type peer struct {
	open   int
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

func newPeerLimits(cfg Config) *peerLimits {
	return &peerLimits{
		perAddress: cfg.MaxConnectionsPerAddress,
		rate:       cfg.ConnectionRate,
		burst:      max(1, cfg.ConnectionRate),
		loopback:   cfg.LimitLoopback,
		peers:      make(map[netip.Prefix]*peer),
	}
}

// key returns the limits' key of a remote address, and whether the limits
// apply to it.
func (l *peerLimits) key(addr net.Addr) (netip.Prefix, bool) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	if ip.IsLoopback() && !l.loopback {
		return netip.Prefix{}, false
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p, true
}

// admitLocked counts one more connection of key at now, or returns why it
// is refused.
func (l *peerLimits) admitLocked(key netip.Prefix, now time.Time) string {
	l.sweepLocked(now)
	p := l.peers[key]
	if p == nil {
		p = &peer{tokens: l.burst, at: now}
		l.peers[key] = p
	}
	p.tokens = min(l.burst, p.tokens+now.Sub(p.at).Seconds()*l.rate)
	p.at = now
	switch {
	case p.open >= l.perAddress:
		return fmt.Sprintf("your address holds %d connections, the limit of one address", p.open)
	case p.tokens < 1:
		return fmt.Sprintf("your address opens connections faster than %g a second", l.rate)
	}
	p.tokens--
	p.open++
	return ""
}

// releaseLocked counts one connection of key closed.
func (l *peerLimits) releaseLocked(key netip.Prefix) {
	if p := l.peers[key]; p != nil {
		p.open--
	}
}

// sweepLocked drops, at most once a second, the peers that hold no
// connection and whose bucket is full again: they are as if never seen.
// The map so holds the peers with connections plus those that connected
// within the last burst/rate seconds.
func (l *peerLimits) sweepLocked(now time.Time) {
	if now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	for k, p := range l.peers {
		if p.open == 0 && p.tokens+now.Sub(p.at).Seconds()*l.rate >= l.burst {
			delete(l.peers, k)
		}
	}
}

// logLimiter lets one log line through per interval and counts the ones
// it held back, for events a peer can cause at will (a wrong admin token).
type logLimiter struct {
	// mu guards last and held.
	mu   sync.Mutex
	last time.Time
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
