package server

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestPeerLimits_Key(t *testing.T) {
	l := newPeerLimits(Config{})
	for _, tc := range []struct {
		ip      string
		want    string
		limited bool
	}{
		{"192.0.2.7", "192.0.2.7/32", true},
		{"::ffff:192.0.2.7", "192.0.2.7/32", true},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64", true},
		{"2001:db8:1:2:ffff::1", "2001:db8:1:2::/64", true},
		{"127.0.0.1", "", false},
		{"::1", "", false},
	} {
		key, limited := l.key(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 1})
		if limited != tc.limited || (limited && key.String() != tc.want) {
			t.Errorf("key(%s) = %v, %v; want %s, %v", tc.ip, key, limited, tc.want, tc.limited)
		}
	}
	if _, limited := newPeerLimits(Config{LimitLoopback: true}).key(&net.TCPAddr{IP: net.ParseIP("127.0.0.1")}); !limited {
		t.Error("with LimitLoopback, 127.0.0.1 is exempt")
	}
}

// Issue 27: one host with many addresses (16 IPv6 /64s of its /56, or
// extra IPv4 addresses of its /24) is one peer under wider prefixes.
func TestPeerLimits_KeyPrefixes(t *testing.T) {
	l := newPeerLimits(Config{IPv4Prefix: 24, IPv6Prefix: 48, LimitLoopback: true})
	for _, tc := range []struct{ ip, want string }{
		{"192.0.2.7", "192.0.2.0/24"},
		{"192.0.2.200", "192.0.2.0/24"},
		{"::ffff:192.0.2.9", "192.0.2.0/24"},
		{"127.0.0.14", "127.0.0.0/24"},
		{"2001:db8:1:2::1", "2001:db8:1::/48"},
		{"2001:db8:1:ff02::1", "2001:db8:1::/48"},
		{"2001:db8:2::1", "2001:db8:2::/48"},
	} {
		key, limited := l.key(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 1})
		if !limited || key.String() != tc.want {
			t.Errorf("key(%s) = %v, %v; want %s, true", tc.ip, key, limited, tc.want)
		}
	}
}

func TestPeerLimits_AdmitReleaseRateAndSweep(t *testing.T) {
	l := newPeerLimits(Config{MaxConnectionsPerAddress: 2, ConnectionRate: 2})
	key, _ := l.key(&net.TCPAddr{IP: net.ParseIP("192.0.2.7")})
	now := time.Unix(1000, 0)
	steps := []struct {
		at      time.Duration
		release bool
		refused bool
	}{
		{0, false, false},                      // bucket 2 -> 1, open 1
		{0, false, false},                      // bucket 1 -> 0, open 2
		{0, false, true},                       // open 2 = the limit
		{0, true, false},                       // release: open 1
		{0, false, true},                       // bucket empty: the rate refuses
		{500 * time.Millisecond, false, false}, // one token back after 0.5 s at 2/s
	}
	for i, st := range steps {
		at := now.Add(st.at)
		if st.release {
			l.releaseLocked(key, true, &connCount{})
			continue
		}
		if refused := l.admitLocked(key, 0, at) != ""; refused != st.refused {
			t.Fatalf("step %d: refused %v, want %v", i, refused, st.refused)
		}
	}
	l.releaseLocked(key, true, &connCount{})
	l.releaseLocked(key, true, &connCount{})
	l.admitLocked(key, 0, now.Add(time.Hour)) // sweeps, then counts this one
	if len(l.peers) != 1 {
		t.Errorf("after an hour, %d peers kept, want the one admitted now", len(l.peers))
	}
	other, _ := l.key(&net.TCPAddr{IP: net.ParseIP("198.51.100.1")})
	l.admitLocked(other, 0, now.Add(time.Hour+time.Second))
	l.releaseLocked(other, true, &connCount{})
	l.admitLocked(key, 0, now.Add(2*time.Hour)) // the other peer is full again and holds nothing
	if _, ok := l.peers[other]; ok {
		t.Error("a peer holding nothing, its bucket full, survived the sweep")
	}
}

// An address that spent its conversation bucket cannot refill it by
// closing its connections and coming back once its connection bucket is
// full: the sweep keeps a peer until both are full.
func TestPeerLimits_CreationBucketSurvivesReconnects(t *testing.T) {
	l := newPeerLimits(Config{MaxConnectionsPerAddress: 4, ConnectionRate: 10, ConversationRate: 0.001, ConversationBurst: 2})
	key, _ := l.key(&net.TCPAddr{IP: net.ParseIP("192.0.2.7")})
	now := time.Unix(1000, 0)
	if d := l.admitLocked(key, 0, now); d != "" {
		t.Fatalf("admit = %q", d)
	}
	cr := l.creationsLocked(key, true, now)
	for i, want := range []bool{true, true, false} {
		// exhausted says, taking nothing (asked twice), whether take
		// refuses.
		first, second := cr.exhausted(now), cr.exhausted(now)
		if first == want || second == want {
			t.Fatalf("before create %d exhausted = %v then %v, want %v", i, first, second, !want)
		}
		if got := cr.take(now); got != want {
			t.Fatalf("create %d = %v, want %v", i, got, want)
		}
	}
	l.releaseLocked(key, true, &connCount{})
	later := now.Add(time.Minute)
	if d := l.admitLocked(key, 0, later); d != "" {
		t.Fatalf("admit a minute later = %q", d)
	}
	if l.creationsLocked(key, true, later).take(later) {
		t.Error("a reconnect refilled the conversation bucket")
	}
	own := l.creationsLocked(netip.Prefix{}, false, now)
	if own == cr || !own.take(now) || !own.take(now) || own.take(now) {
		t.Error("an exempt connection's own bucket of 2 does not allow exactly two")
	}
}

// Under mutual TLS a connection is among its address's proving until its
// hello is read, then counted under its certificate; a release undoes
// whichever holds, and the sweep forgets a certificate holding nothing.
func TestPeerLimits_CertificateCounts(t *testing.T) {
	l := newPeerLimits(Config{TLSClientCA: "ca.pem", MaxConnections: 100, MaxConnectionsPerAddress: 4, ConnectionRate: 10})
	key, _ := l.key(&net.TCPAddr{IP: net.ParseIP("192.0.2.7")})
	now := time.Unix(1000, 0)
	var early, late connCount
	for _, cnt := range []*connCount{&early, &late} {
		if d := l.admitLocked(key, 0, now); d != "" {
			t.Fatalf("admit = %q", d)
		}
		l.provingLocked(key, cnt)
	}
	if p := l.peers[key]; p.open != 2 || p.proving != 2 {
		t.Fatalf("two admitted: open %d proving %d, want 2 and 2", p.open, p.proving)
	}
	l.releaseLocked(key, true, &early) // gone before its hello
	if d := l.admitCertLocked(key, &late, "cert:a", 1, now); d != "" {
		t.Fatalf("admitCert = %q", d)
	}
	if p, c := l.peers[key], l.certs["cert:a"]; p.open != 1 || p.proving != 0 || c.open != 1 || late.cert != "cert:a" {
		t.Fatalf("after one release and one hello: address open %d proving %d, certificate open %d (%q), want 1, 0, 1", p.open, p.proving, c.open, late.cert)
	}
	l.releaseLocked(key, true, &late)
	if p, c := l.peers[key], l.certs["cert:a"]; p.open != 0 || p.proving != 0 || c.open != 0 || late != (connCount{}) {
		t.Fatalf("after both released: address open %d proving %d, certificate open %d, count %+v, want zeros", p.open, p.proving, c.open, late)
	}
	l.admitLocked(key, 0, now.Add(time.Hour)) // sweeps
	if _, ok := l.certs["cert:a"]; ok {
		t.Error("a certificate holding nothing, its buckets full, survived the sweep")
	}
}
