// Package freeport picks loopback TCP ports for a process that binds them
// later: a test's daemon, an etcd member, a development cluster.
//
// A port found free by binding "127.0.0.1:0" comes from the kernel's
// ephemeral range, the range every outgoing connection takes its local
// port from as well. Between the pick and the bind, a connection of any
// process on the machine (a proxy dialing etcd, the node started just
// before) can take it, and the daemon then exits with "address already
// in use": a failure that depends on the machine's traffic. Ports below
// the ephemeral range are never given out by the kernel; only a process
// that names one can take it. So Ports picks there, at random, checks
// each by binding it, and never hands out the same port twice in one
// process. Where the range cannot be read or leaves no room below it,
// it falls back to the kernel's choice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// rangeFile holds the kernel's ephemeral port range on Linux.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowest is the lowest port picked: ports below it are the conventional
// homes of services that a machine may run.
const lowest = 10000

// minRoom is the fewest ports below the ephemeral range that Ports picks
// among; with fewer, it leaves the choice to the kernel.
const minRoom = 2000

// tries bounds the random picks for one port before Ports gives up.
const tries = 200

var (
	mu     sync.Mutex
	handed = map[int]bool{} // every port this process was given
)

// Addr returns "127.0.0.1:port" for one port, as Ports picks it.
func Addr() (string, error) {
	ps, err := Ports(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ps[0])), nil
}

// Ports returns n distinct loopback ports that were free a moment ago,
// below the kernel's ephemeral range where it can (the package comment
// says why).
func Ports(n int) ([]int, error) {
	hi, ok := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	out := make([]int, 0, n)
	for range n {
		var p int
		var err error
		if ok && hi-lowest >= minRoom {
			p, err = pickBelow(hi)
		} else {
			p, err = pickKernel()
		}
		if err != nil {
			return nil, err
		}
		handed[p] = true
		out = append(out, p)
	}
	return out, nil
}

// pickBelow picks a free port in [lowest, hi) that this process has not
// handed out yet.
func pickBelow(hi int) (int, error) {
	for range tries {
		p := lowest + rand.IntN(hi-lowest)
		if handed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // taken
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("freeport: no free port in [%d, %d) after %d tries", lowest, hi, tries)
}

// pickKernel lets the kernel choose, skipping the ports handed out.
func pickKernel() (int, error) {
	for range tries {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("freeport: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handed[p] {
			return p, nil
		}
	}
	return 0, fmt.Errorf("freeport: the kernel gave only ports already handed out, %d times", tries)
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range,
// and false where it cannot be read.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, false
	}
	return parseLow(b)
}

// parseLow reads the low end of rangeFile's "low<TAB>high" line.
func parseLow(b []byte) (int, bool) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= 0 || lo > 65535 {
		return 0, false
	}
	return lo, true
}
