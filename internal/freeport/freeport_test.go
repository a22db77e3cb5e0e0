package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPorts_DistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	first, err := Ports(40)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Ports(40)
	if err != nil {
		t.Fatal(err)
	}
	lo, ok := ephemeralLow()
	below := ok && lo-lowest >= minRoom
	seen := map[int]bool{}
	for _, p := range append(first, second...) {
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		if below && (p < lowest || p >= lo) {
			t.Errorf("port %d outside [%d, %d), below the ephemeral range", p, lowest, lo)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}

func TestPorts_SkipAPortTakenSinceItWasFree(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok || lo-lowest < minRoom {
		t.Skip("no room below the ephemeral range on this machine")
	}
	// Hold nine ports in ten of a span and pick in it: every pick must be
	// one of the ports left (200 tries miss every free one with a
	// probability of 0.9^200, about 1e-9).
	held := map[int]net.Listener{}
	for p := lowest; p < lowest+minRoom; p++ {
		if p%10 == 0 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			held[p] = l
		}
	}
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	mu.Lock()
	defer mu.Unlock()
	for range 20 {
		p, err := pickBelow(lowest + minRoom)
		if err != nil {
			t.Fatal(err)
		}
		if held[p] != nil {
			t.Fatalf("picked %d, which a listener holds", p)
		}
		handed[p] = true
	}
}

func TestParseLow(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"32768\t60999\n", 32768, true},
		{"1024 65535", 1024, true},
		{"", 0, false},
		{"32768", 0, false},
		{"x 60999", 0, false},
		{"0 60999", 0, false},
		{"70000 80000", 0, false},
	} {
		got, ok := parseLow([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("parseLow(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
