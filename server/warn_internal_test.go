package server

import (
	"bytes"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
)

func TestOpenAdmissionWarning(t *testing.T) {
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7420}
	loop6 := &net.TCPAddr{IP: net.IPv6loopback, Port: 7420}
	all := &net.TCPAddr{IP: net.IPv4zero, Port: 7420}
	public := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 7420}
	for _, tc := range []struct {
		name   string
		cfg    Config
		addr   net.Addr
		warned bool
	}{
		{"open on loopback", Config{EnrollPolicy: participant.EnrollOpen}, loop, false},
		{"open on IPv6 loopback", Config{EnrollPolicy: participant.EnrollOpen}, loop6, false},
		{"open on every interface", Config{EnrollPolicy: participant.EnrollOpen}, all, true},
		{"open on a public address", Config{EnrollPolicy: participant.EnrollOpen}, public, true},
		{"open with an auth token", Config{EnrollPolicy: participant.EnrollOpen, AuthToken: "t"}, all, false},
		{"invite", Config{EnrollPolicy: participant.EnrollInvite}, all, false},
	} {
		if got := openAdmission(tc.cfg, tc.addr); got != tc.warned {
			t.Errorf("%s: openAdmission = %v, want %v", tc.name, got, tc.warned)
		}
	}
}

// addrListener is a listener that is never accepted from, at addr.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }

// TestWarnOpenAdmission_EachListener: a WebSocket listener beyond loopback
// is as open as a TCP one, and warns by its name.
func TestWarnOpenAdmission_EachListener(t *testing.T) {
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7420}
	all := &net.TCPAddr{IP: net.IPv4zero, Port: 7422}
	var buf bytes.Buffer
	warnOpenAdmission(zerolog.New(&buf), Config{EnrollPolicy: participant.EnrollOpen}, []listener{
		{"wire", addrListener{addr: loop}, false},
		{"WebSocket", addrListener{addr: all}, true},
	})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"listener":"WebSocket"`) || !strings.Contains(lines[0], `"level":"warn"`) {
		t.Fatalf("warnings = %q, want one, for the WebSocket listener", buf.String())
	}
}

func TestClusterConfig_Plaintext(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ClusterConfig
		want []string
	}{
		{"http", ClusterConfig{Endpoints: []string{"http://etcd:2379"}}, []string{"http://etcd:2379"}},
		{"HTTP with a CA still plain", ClusterConfig{Endpoints: []string{"HTTP://etcd:2379"}, CA: "ca.pem"}, []string{"HTTP://etcd:2379"}},
		{"https", ClusterConfig{Endpoints: []string{"https://etcd:2379"}}, nil},
		{"no scheme, no TLS", ClusterConfig{Endpoints: []string{"etcd:2379"}}, []string{"etcd:2379"}},
		{"no scheme with a CA", ClusterConfig{Endpoints: []string{"etcd:2379"}, CA: "ca.pem"}, nil},
		{"unix socket", ClusterConfig{Endpoints: []string{"unix://etcd.sock"}}, nil},
		{"mixed", ClusterConfig{Endpoints: []string{"https://a:2379", "http://b:2379"}}, []string{"http://b:2379"}},
	} {
		if got := tc.cfg.plaintext(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: plaintext = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestWarnPlaintextEtcd(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ClusterConfig
		want []string
	}{
		{"TLS", ClusterConfig{Endpoints: []string{"https://etcd:2379"}, Password: "p"}, nil},
		{"plain", ClusterConfig{Endpoints: []string{"http://etcd:2379"}}, []string{"etcd endpoints without TLS"}},
		{"plain with a password", ClusterConfig{Endpoints: []string{"http://etcd:2379"}, Username: "u", Password: "p"}, []string{"etcd endpoints without TLS", "etcd password goes to endpoints without TLS"}},
	} {
		var buf bytes.Buffer
		warnPlaintextEtcd(zerolog.New(&buf), tc.cfg)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(tc.want) == 0 {
			if buf.Len() != 0 {
				t.Errorf("%s: warned %q", tc.name, buf.String())
			}
			continue
		}
		if len(lines) != len(tc.want) {
			t.Errorf("%s: logged %q, want %d warnings", tc.name, buf.String(), len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(lines[i], w) || !strings.Contains(lines[i], `"level":"warn"`) || strings.Contains(lines[i], `"p"`) {
				t.Errorf("%s: line %d = %s, want a warning containing %q and no password", tc.name, i, lines[i], w)
			}
		}
	}
}
