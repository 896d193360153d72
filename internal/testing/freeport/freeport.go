// Package freeport hands out port numbers for tests' listeners.
//
// A port is picked at random below the kernel's ephemeral range, not by
// binding port 0: a port from that range may be taken by any process's
// outgoing connection or UDP socket between the pick and the listen, and
// a relay that listens on every address with that number then fails to
// bind. Below the range only an explicit bind takes a port.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

// lowest keeps clear of the well-known and commonly configured ports.
const lowest = 10000

var handedOut sync.Map // port -> true

// Pick returns a port free for both TCP and UDP on every address (a relay
// listens on both with one number), never the same twice in a process:
// two listeners of one test given one number collide.
func Pick() (int, error) {
	lo, hi := lowest, ephemeralStart()
	return pick(func() int { return lo + rand.IntN(hi-lo) })
}

func pick(next func() int) (int, error) {
	for range 200 {
		p := next()
		if _, taken := handedOut.Load(p); taken || !free(p) {
			continue
		}
		if _, taken := handedOut.LoadOrStore(p, true); !taken {
			return p, nil
		}
	}
	return 0, errors.New("no port free for both TCP and UDP below the ephemeral range")
}

// free reports whether p can be bound on every address for TCP and UDP.
func free(p int) bool {
	addr := fmt.Sprintf(":%d", p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// ephemeralStart is the first port the kernel hands to sockets bound to
// port 0; the default range starts at 32768.
func ephemeralStart() int {
	start := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 && lo > lowest+1000 {
			start = lo
		}
	}
	return start
}
