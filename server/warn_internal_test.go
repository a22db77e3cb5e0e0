package server

import (
	"net"
	"testing"

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
