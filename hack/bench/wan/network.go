//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
)

// geography is the shape of the network: the client's host and the
// target's host joined by a direct link, and by a chain of legs through
// middle hosts.
type geography struct {
	names  []string        // hosts: the client's (the entry relay's) first, the target's (the exit's) last
	direct time.Duration   // round trip of the direct link
	legs   []time.Duration // round trips of the chain's legs, from the client's host on
	rate   int64           // bits per second, each link and direction; 0: unlimited
	queue  time.Duration   // a link's buffer, in time at its rate
	jitter time.Duration   // added to each packet's one-way delay, uniformly in [0, jitter)
	// shortShare is the share of the loss on legs shorter than the longest
	// one: the long links (the direct one, the longest leg) carry it whole.
	shortShare float64
}

// losses returns, for a loss figure, the loss of the direct link and of each
// leg, per direction.
func (g geography) losses(loss float64) (direct float64, legs []float64) {
	longest := slices.Max(g.legs)
	for _, l := range g.legs {
		if l == longest {
			legs = append(legs, loss)
		} else {
			legs = append(legs, loss*g.shortShare)
		}
	}
	return loss, legs
}

func (g geography) params(rtt time.Duration, loss float64) linkemu.Params {
	return linkemu.Params{Delay: rtt / 2, Jitter: g.jitter, Loss: loss, Rate: g.rate, Queue: g.queue}
}

// Ports on the target's host, and where the entry's Tunnels listen.
const (
	echoPort   = 7000
	sinkPort   = 7001
	tunnelBase = 15000
	metrics    = "127.0.0.1:9464"
)

// network is one build of the geography: namespaces, links, the target's
// servers and a relay per host.
type network struct {
	g      geography
	n      *linkemu.Net
	nodes  []*linkemu.Node
	direct *linkemu.Link
	legs   []*linkemu.Link
	dir    string
	lns    []net.Listener
	sink   *sinkServer
	udp    *udpReceiver // nil without -udp
	tag    string       // the run's congestion control and loss, naming kept logs
	procs  []*exec.Cmd
	logs   []*os.File
	closed sync.Once
}

// build makes the network with every host's TCP on cc, loss as the
// geography splits it, and relays for the relay paths among ps; with UDP
// rates, a UDP receiver on the target's host and UDP Tunnels to it.
func build(hoplink string, g geography, cc string, loss float64, ps []path, u udpOptions) (nw *network, err error) {
	dir, err := os.MkdirTemp("", "wanbench")
	if err != nil {
		return nil, err
	}
	ln, err := linkemu.NewNet(fmt.Sprintf("wan%d", os.Getpid()%100000))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	nw = &network{g: g, n: ln, dir: dir, sink: newSinkServer()}
	defer func() {
		if err != nil {
			nw.close()
		}
	}()
	for _, name := range g.names {
		node, err := ln.AddNode(name)
		if err != nil {
			return nw, err
		}
		// Before any socket opens: a socket takes its namespace's default.
		if err := node.SetCongestionControl(cc); err != nil {
			return nw, err
		}
		if sendMax > 0 {
			// A namespace's own tcp_wmem, as a host (sysctl) or a pod
			// (securityContext.sysctls) would set it.
			v := fmt.Sprintf("net.ipv4.tcp_wmem=4096 16384 %d", sendMax)
			if out, err := node.Command("sysctl", "-qw", v).CombinedOutput(); err != nil {
				return nw, fmt.Errorf("%s: %s: %v: %s", node.NS, v, err, strings.TrimSpace(string(out)))
			}
		}
		nw.nodes = append(nw.nodes, node)
	}
	directLoss, legLoss := g.losses(loss)
	first, last := nw.nodes[0], nw.nodes[len(nw.nodes)-1]
	if nw.direct, err = ln.Connect(first, last, g.params(g.direct, directLoss)); err != nil {
		return nw, err
	}
	for i, rtt := range g.legs {
		l, err := ln.Connect(nw.nodes[i], nw.nodes[i+1], g.params(rtt, legLoss[i]))
		if err != nil {
			return nw, err
		}
		nw.legs = append(nw.legs, l)
	}
	for port, serve := range map[int]func(net.Conn){echoPort: echo, sinkPort: nw.sink.serve} {
		var l net.Listener
		if err := last.Do(func() (err error) { l, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return }); err != nil {
			return nw, err
		}
		nw.lns = append(nw.lns, l)
		go accept(l, serve)
	}
	if len(u.rates) > 0 {
		if nw.udp, err = listenUDP(last); err != nil {
			return nw, err
		}
	}
	if !slices.ContainsFunc(ps, func(p path) bool { return p.hops > 0 }) {
		return nw, nil
	}
	for i, p := range ps {
		// The servers listen on every address of the target's host.
		if p.tun {
			if out, err := last.Command("ip", "addr", "add", tunTarget(i).String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
				return nw, fmt.Errorf("%s: %v: %s", last.NS, err, strings.TrimSpace(string(out)))
			}
		}
	}
	if err := nw.startRelays(hoplink, ps, u); err != nil {
		return nw, err
	}
	for i, p := range ps {
		if p.hops == 0 {
			continue
		}
		if err := nw.waitPath(nw.pathAddr(i, p, echoPort), 90*time.Second); err != nil {
			return nw, fmt.Errorf("%s: %w", p, err)
		}
	}
	return nw, nil
}

// tunnelAddr is where the entry listens for path i's Tunnel to target port.
func tunnelAddr(i, port int) string {
	return fmt.Sprintf("127.0.0.1:%d", tunnelBase+10*i+port-echoPort)
}

// tunTarget is the target's address that path i's tun Tunnel routes: one
// of its own on the target's host, which the client's host reaches only
// through the device, so no byte of the path takes the direct link.
func tunTarget(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(i), 1}) }

// pathAddr is what the client dials for path i's target port.
func (nw *network) pathAddr(i int, p path, port int) string {
	switch {
	case p.hops == 0:
		return nw.targetAddr(port)
	case p.tun:
		return netip.AddrPortFrom(tunTarget(i), uint16(port)).String()
	}
	return tunnelAddr(i, port)
}

// manifests are the relays, and a Chain per relay path of ps with its
// Tunnels: a TCP Tunnel per target port, or one flow-mode tun Tunnel that
// carries both, as one would carry a site's traffic; with UDP rates, on
// the paths that are not tun, a UDP Tunnel to the UDP receiver too
// (udp.mode u.mode, when set).
func manifests(nodes []*linkemu.Node, ps []path, u udpOptions) string {
	var m strings.Builder
	names := make([]string, len(nodes))
	for i, node := range nodes {
		names[i] = node.Name
		fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {port: 7401}, endpoints: [\"%s:7401\"]}\n---\n",
			node.Name, node.Addr)
	}
	entry, exit, via := names[0], names[len(names)-1], names[1:len(names)-1]
	for i, p := range ps {
		if p.hops == 0 {
			continue
		}
		route := []string{entry, exit}
		if p.hops > 1 {
			route = names
		}
		fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c%d}\nspec: {entry: %s, exit: %s, via: [%s], route: [%s], transport: %s}\n---\n",
			i, entry, exit, strings.Join(via, ", "), strings.Join(route, ", "), p.transport)
		if p.tun {
			fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t%d}\nspec: {chain: c%d, protocol: tun, tun: {name: hlw%d, address: 10.200.%d.1/24, routes: [%s/24], mode: flow}}\n---\n",
				i, i, i, i, netip.PrefixFrom(tunTarget(i), 24).Masked().Addr())
			continue
		}
		for _, port := range []int{echoPort, sinkPort} {
			fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t%d-%d}\nspec: {chain: c%d, listen: {address: 127.0.0.1, port: %d}, target: \"127.0.0.1:%d\"}\n---\n",
				i, port, i, tunnelBase+10*i+port-echoPort, port)
		}
		if len(u.rates) > 0 {
			mode := ""
			if u.mode != "" {
				mode = ", udp: {mode: " + u.mode + "}"
			}
			fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c%d, protocol: udp, listen: {address: 127.0.0.1, port: %d}, target: \"127.0.0.1:%d\"%s}\n---\n",
				udpTunnel(i), i, tunnelBase+10*i+udpPort-echoPort, udpPort, mode)
		}
	}
	return m.String()
}

// udpTunnel names path i's UDP Tunnel.
func udpTunnel(i int) string { return fmt.Sprintf("t%d-udp", i) }

func (nw *network) startRelays(hoplink string, ps []path, u udpOptions) error {
	names := nw.g.names
	file := filepath.Join(nw.dir, "m.yaml")
	if err := os.WriteFile(file, []byte(manifests(nw.nodes, ps, u)), 0o644); err != nil {
		return err
	}
	certs := filepath.Join(nw.dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--dir", certs}, append([]string{"cert", "issue", "--dir", certs}, names...)} {
		if out, err := exec.Command(hoplink, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("hoplink %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, node := range nw.nodes {
		logf, err := os.Create(filepath.Join(nw.dir, node.Name+".log"))
		if err != nil {
			return err
		}
		nw.logs = append(nw.logs, logf)
		cmd := node.Command(hoplink, "relay", "-f", file, "--name", node.Name, "--certs", certs,
			"--metrics-addr", metrics, "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		// The relays die with this process, however it ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return err
		}
		nw.procs = append(nw.procs, cmd)
	}
	return nil
}

// waitPath waits until one echo crosses a relay path.
func (nw *network) waitPath(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		r := echoShape(nw.dial, addr, 1, 10, 15*time.Second)
		if r.err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no echo within %v: %v (relay logs in %s)", within, r.err, nw.dir)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// dial connects from the client's host.
func (nw *network) dial(addr string) (net.Conn, error) {
	return dialFrom(nw.nodes[0], addr, 30*time.Second)
}

func dialFrom(node *linkemu.Node, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := node.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, timeout); return })
	return c, err
}

// node is the host of that name.
func (nw *network) node(name string) *linkemu.Node {
	for _, n := range nw.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// targetAddr is the target's port over the direct link.
func (nw *network) targetAddr(port int) string {
	return fmt.Sprintf("%s:%d", nw.nodes[len(nw.nodes)-1].Addr, port)
}

// metricsOf reads a relay's /metrics from inside its namespace.
func (nw *network) metricsOf(node *linkemu.Node) (string, error) {
	client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return dialFrom(node, metrics, 5*time.Second) },
	}}
	resp, err := client.Get("http://" + metrics + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// linkStats says what the emulator did on each link: packets sent, lost
// and dropped at a full queue, both directions together.
func (nw *network) linkStats() string {
	var b strings.Builder
	add := func(name string, l *linkemu.Link) {
		ab, ba := l.Stats()
		sent, lost, over := ab.Sent+ba.Sent, ab.Lost+ba.Lost, ab.Overflow+ba.Overflow
		fmt.Fprintf(&b, " %s: %d sent, %.2f%% lost, %d over the queue;", name, sent, 100*float64(lost)/float64(max(sent+lost+over, 1)), over)
	}
	names := nw.g.names
	add(names[0]+"-"+names[len(names)-1], nw.direct)
	for i, l := range nw.legs {
		add(names[i]+"-"+names[i+1], l)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// close stops the relays and servers and removes the namespaces; it is
// safe to call from a signal handler while the bench runs.
func (nw *network) close() error {
	var err error
	nw.closed.Do(func() {
		for _, c := range nw.procs {
			c.Process.Kill()
			c.Wait()
		}
		for _, l := range nw.lns {
			l.Close()
		}
		nw.sink.closeAll()
		if nw.udp != nil {
			nw.udp.c.Close()
		}
		for _, f := range nw.logs {
			f.Close()
			if keepLogs != "" {
				// A failed flow's reason is in its relays' warnings,
				// which would go with the network.
				b, _ := os.ReadFile(f.Name())
				os.WriteFile(filepath.Join(keepLogs, nw.tag+"-"+filepath.Base(f.Name())), b, 0o644)
			}
		}
		err = errors.Join(nw.n.Close(), os.RemoveAll(nw.dir))
	})
	return err
}

func accept(ln net.Listener, serve func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go serve(c)
	}
}

func echo(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
}
