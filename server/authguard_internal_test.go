package server

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The guard's answers at chosen instants: no wall clock.
func TestAuthGuard_SlowsEachPrincipalApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newAuthGuard(reg, DefaultIPv4Prefix, DefaultIPv6Prefix)
	guesser, other := netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8:1:2::/64")
	at := time.Unix(1_000_000, 0)
	compared := 0
	for range 300 {
		if ok, wait := g.admit(guesser, "admin", at); !ok {
			if wait <= 0 || wait > AuthFailureInterval {
				t.Fatalf("admit refused with wait %v, want within (0, %v]", wait, AuthFailureInterval)
			}
			continue
		}
		compared++
		g.failed(guesser, "admin", at)
	}
	if compared != AuthFailureBurst {
		t.Errorf("300 wrong guesses at one instant: %d compared, want %d", compared, AuthFailureBurst)
	}
	if got := count(t, reg, "admin", authThrottled); got != 300-AuthFailureBurst {
		t.Errorf("throttled = %v, want %d", got, 300-AuthFailureBurst)
	}
	if got := count(t, reg, "admin", authWrongToken); got != AuthFailureBurst {
		t.Errorf("wrong_token = %v, want %d", got, AuthFailureBurst)
	}
	// Another principal is not slowed by the guesser.
	if ok, _ := g.admit(other, "wire", at); !ok {
		t.Error("another principal was refused")
	}
	// One more attempt an interval later, and only one.
	later := at.Add(AuthFailureInterval)
	if ok, _ := g.admit(guesser, "admin", later.Add(-time.Millisecond)); ok {
		t.Error("admitted before an interval passed")
	}
	if ok, _ := g.admit(guesser, "admin", later); !ok {
		t.Fatal("refused an interval later")
	}
	g.failed(guesser, "admin", later)
	if ok, _ := g.admit(guesser, "admin", later); ok {
		t.Error("admitted twice in one interval")
	}
	// A day of guessing at the best rate the guard allows.
	tries := 0
	for ts := later; ts.Before(later.Add(24 * time.Hour)); ts = ts.Add(time.Second) {
		if ok, _ := g.admit(guesser, "admin", ts); ok {
			tries++
			g.failed(guesser, "admin", ts)
		}
	}
	if max := int(24*time.Hour/AuthFailureInterval) + 1; tries > max {
		t.Errorf("a day of guessing compared %d tokens, want at most %d", tries, max)
	}
}

// The principals remembered are bounded: past the bound, those whose
// allowance is full again are forgotten, and newcomers share one allowance
// rather than growing the map.
func TestAuthGuard_BoundedPrincipals(t *testing.T) {
	g := newAuthGuard(prometheus.NewRegistry(), DefaultIPv4Prefix, DefaultIPv6Prefix)
	g.max = 4
	at := time.Unix(1_000_000, 0)
	for i := range 4 {
		g.failed(netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32), "wire", at)
	}
	for i := range 2 * AuthFailureBurst {
		g.failed(netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 32), "wire", at)
	}
	g.mu.Lock()
	n := len(g.fails)
	g.mu.Unlock()
	if n != 4 {
		t.Fatalf("%d principals remembered, want the bound 4", n)
	}
	if ok, _ := g.admit(netip.MustParsePrefix("198.51.100.200/32"), "wire", at); !ok {
		t.Error("a newcomer with no failure of its own was refused")
	}
	// The newcomers' shared allowance is spent: a newcomer's failures
	// count against it.
	g.failed(netip.MustParsePrefix("198.51.100.201/32"), "wire", at)
	g.mu.Lock()
	spent := g.overflow.TokensAt(at) < 1
	g.mu.Unlock()
	if !spent {
		t.Error("newcomers beyond the bound do not share one allowance")
	}
	// Once the first ones' allowances refill, a sweep forgets them.
	later := at.Add(AuthFailureBurst * AuthFailureInterval)
	g.failed(netip.MustParsePrefix("203.0.113.1/32"), "wire", later)
	g.mu.Lock()
	_, kept := g.fails[netip.MustParsePrefix("203.0.113.1/32")]
	n = len(g.fails)
	g.mu.Unlock()
	if !kept || n != 1 {
		t.Errorf("after the refill: %d principals, the newcomer kept %v; want 1, true", n, kept)
	}
}

func TestAuthGuard_Principal(t *testing.T) {
	g := newAuthGuard(prometheus.NewRegistry(), DefaultIPv4Prefix, DefaultIPv6Prefix)
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}, "127.0.0.1/32"},
		{nil, "invalid Prefix"},
	} {
		if got := g.principal(tc.addr).String(); got != tc.want {
			t.Errorf("principal(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
	// --ipv4-prefix and --ipv6-prefix make one guesser as they make one
	// peer: a /24 and a /48 are one principal each.
	wide := newAuthGuard(prometheus.NewRegistry(), 24, 48)
	for addr, want := range map[string]string{"192.0.2.7": "192.0.2.0/24", "2001:db8:1:2:3:4:5:6": "2001:db8:1::/48"} {
		if got := wide.principal(&net.TCPAddr{IP: net.ParseIP(addr), Port: 1}).String(); got != want {
			t.Errorf("principal(%s) at /24 and /48 = %s, want %s", addr, got, want)
		}
	}
}

// count reads the guard's counter of listener and cause from reg.
func count(t *testing.T, reg *prometheus.Registry, listener, cause string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != MetricAuthFailures {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["listener"] == listener && labels["cause"] == cause {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s{listener=%q,cause=%q} not gathered", MetricAuthFailures, listener, cause)
	return 0
}
