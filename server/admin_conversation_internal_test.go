package server

import (
	"net"
	"strconv"
	"testing"
)

// TestServer_HealthURL_ListenerAddressOrAdvertisedHost: a node advertises
// its health listener's own address when it is bound to one, and the
// advertised wire host with the listener's port when it listens on every
// address; https when the listener serves TLS; nothing when the advertised
// address has no host to borrow.
func TestServer_HealthURL_ListenerAddressOrAdvertisedHost(t *testing.T) {
	listen := func(addr string) net.Listener {
		t.Helper()
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	port := func(ln net.Listener) string { return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) }
	loop, all := listen("127.0.0.1:0"), listen("0.0.0.0:0")
	for _, tc := range []struct {
		name      string
		ln        net.Listener
		tls       bool
		advertise string
		want      string
	}{
		{"bound to an address", loop, false, "node1.example:7420", "http://127.0.0.1:" + port(loop)},
		{"every address", all, false, "node1.example:7420", "http://node1.example:" + port(all)},
		{"every address, TLS", all, true, "node1.example:7420", "https://node1.example:" + port(all)},
		{"every address, IPv6 advertised", all, false, "[fd00::1]:7420", "http://[fd00::1]:" + port(all)},
		{"every address, no advertised host", all, false, ":7420", ""},
	} {
		s := &Server{hln: tc.ln}
		if tc.tls {
			s.healthTLS = &certs{}
		}
		if got := s.healthURL(tc.advertise); got != tc.want {
			t.Errorf("%s: healthURL(%q) = %q, want %q", tc.name, tc.advertise, got, tc.want)
		}
	}
}
