//go:build linux

package linkemu

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Net is a set of network namespaces joined by emulated links. A link is a
// pair of TUN devices, one in each namespace, and this process moves the IP
// packets between them through a shaped pipe in each direction. The
// kernels' own TCP, UDP and ICMP cross it: loss makes TCP retransmit and
// QUIC detect it, a rate limit builds a queue, as on a real long link. Only
// namespaces joined by a link can reach each other. It needs root.
type Net struct {
	prefix string

	mu     sync.Mutex
	nodes  []*Node
	links  []*Link
	closed bool
}

// Node is one namespace of a Net, standing for one host.
type Node struct {
	Name string
	// NS is the network namespace's name (ip netns).
	NS string
	// Addr is the host's address, on its loopback device, reachable from
	// every node it has a link to.
	Addr netip.Addr
}

// Link is an emulated link between two nodes.
type Link struct {
	A, B   *Node
	ab, ba *pipe
	files  []*os.File
}

// NewNet prepares an empty network. Namespace names start with prefix,
// which should be unique to the process (tests run in parallel packages).
func NewNet(prefix string) (*Net, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("linkemu: network namespaces and TUN devices need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("linkemu: the ip command is missing (Debian package iproute2)")
	}
	return &Net{prefix: prefix}, nil
}

// AddNode makes a namespace with its loopback up and the node's address.
// Nodes are numbered in the order they are added: 10.213.0.1, .2, ...
func (n *Net) AddNode(name string) (*Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.nodes) >= 250 {
		return nil, errors.New("linkemu: at most 250 nodes")
	}
	node := &Node{Name: name, NS: n.prefix + "-" + name, Addr: netip.AddrFrom4([4]byte{10, 213, 0, byte(len(n.nodes) + 1)})}
	if err := ip("netns", "add", node.NS); err != nil {
		return nil, err
	}
	n.nodes = append(n.nodes, node)
	if err := ip("-n", node.NS, "link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	return node, ip("-n", node.NS, "addr", "add", node.Addr.String()+"/32", "dev", "lo")
}

// Connect joins two nodes with a link shaped by p in each direction.
func (n *Net) Connect(a, b *Node, p Params) (*Link, error) {
	l := &Link{A: a, B: b}
	ta, err := l.end(a, b)
	if err != nil {
		l.close()
		return nil, err
	}
	tb, err := l.end(b, a)
	if err != nil {
		l.close()
		return nil, err
	}
	l.ab = newPipe(p, func(pkt []byte) { tb.Write(pkt) })
	l.ba = newPipe(p, func(pkt []byte) { ta.Write(pkt) })
	go forward(ta, l.ab)
	go forward(tb, l.ba)
	n.mu.Lock()
	n.links = append(n.links, l)
	n.mu.Unlock()
	return l, nil
}

// end makes the TUN device in self's namespace that leads to peer, and the
// route to the peer's address through it.
func (l *Link) end(self, peer *Node) (*os.File, error) {
	dev := ifName(peer.Name)
	var f *os.File
	err := self.Do(func() error {
		var err error
		f, err = openTUN(dev)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("linkemu: TUN %s in %s: %w", dev, self.NS, err)
	}
	l.files = append(l.files, f)
	for _, args := range [][]string{
		{"-n", self.NS, "link", "set", "dev", dev, "mtu", "1500", "addrgenmode", "none", "up"},
		{"-n", self.NS, "route", "add", peer.Addr.String() + "/32", "dev", dev, "src", self.Addr.String()},
	} {
		if err := ip(args...); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// ifName names the device that leads to a peer: at most 15 bytes.
func ifName(peer string) string {
	name := "to-" + peer
	if len(name) > 15 {
		name = name[:15]
	}
	return name
}

// Stats are what each direction did with its packets so far: A to B, then
// B to A.
func (l *Link) Stats() (ab, ba Stats) { return l.ab.s.stats(), l.ba.s.stats() }

// Set shapes both directions of the link, for packets from now on.
func (l *Link) Set(p Params) { l.SetDirections(p, p) }

// SetDirections shapes A to B and B to A apart.
func (l *Link) SetDirections(ab, ba Params) {
	l.ab.s.set(ab)
	l.ba.s.set(ba)
}

func (l *Link) close() {
	for _, f := range l.files {
		f.Close()
	}
	if l.ab != nil {
		l.ab.close()
		l.ba.close()
	}
}

// forward reads packets from a TUN device into a pipe until the device
// closes.
func forward(f *os.File, p *pipe) {
	buf := make([]byte, 65536)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		p.push(buf[:n])
	}
}

// Close stops every link and deletes the namespaces, with the TUN devices
// in them.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	for _, l := range n.links {
		l.close()
	}
	var errs []error
	for _, node := range n.nodes {
		errs = append(errs, ip("netns", "del", node.NS))
	}
	return errors.Join(errs...)
}

// Command runs a program inside the node's namespace.
func (node *Node) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", node.NS, name}, args...)...)
}

// Do runs f on a thread inside the node's namespace. Sockets f opens stay
// in the namespace after the thread leaves it, so a test can dial or
// listen as the node and use the socket anywhere.
func (node *Node) Do(f func() error) error {
	errc := make(chan error, 1)
	// A fresh goroutine: if the thread cannot return to its namespace it
	// stays locked and dies with the goroutine, instead of serving others.
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", node.NS))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", node.NS, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leaving %s: %w", node.NS, err))
			return // the thread stays locked and exits with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// openTUN creates a TUN device (IP packets, no packet information header)
// in the calling thread's namespace.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	// Non-blocking, so reads park on Go's poller and Close ends them.
	return os.NewFile(uintptr(fd), "tun:"+name), nil
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
