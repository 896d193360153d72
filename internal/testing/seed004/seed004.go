//go:build linux

// Package seed004 builds the network of seed 004 on emulated links, for the
// scenario test and the route benchmark: traffic enters in Hong Kong and
// leaves in US-East, either directly (a slow path) or through relays in
// Seattle and Los Angeles, with the report's round trips: hk-seattle
// 152 ms, hk-la 152, seattle-la 32, la-useast 69, hk-useast 299. Four
// `hoplink relay` processes run in four network namespaces joined by
// internal/linkemu links, as on four hosts. The target, an echo server, sits
// beside the exit in useast, as the report's target sat 69 ms from Los
// Angeles.
package seed004

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
)

// Relays of the network, entry first.
var Relays = []string{"hk", "seattle", "la", "useast"}

// Links are the network's links with their round trips.
var Links = []struct {
	A, B string
	RTT  time.Duration
}{
	{"hk", "seattle", 152 * time.Millisecond},
	{"hk", "la", 152 * time.Millisecond},
	{"seattle", "la", 32 * time.Millisecond},
	{"la", "useast", 69 * time.Millisecond},
	{"hk", "useast", 299 * time.Millisecond},
}

// Addresses clients on hk use: the Tunnels of the three chains, and the
// target itself for the direct path.
const (
	StaticAddr = "127.0.0.1:15000" // chain static: hk -> seattle -> la -> useast, as the report's chain
	SumAddr    = "127.0.0.1:15001" // chain sum
	PipeAddr   = "127.0.0.1:15002" // chain pipe
	TargetPort = 7000
)

// Chain keys.
const (
	Static = "default/static"
	Sum    = "default/sum"
	Pipe   = "default/pipe"
)

const manifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {endpoints: ["HK:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: seattle}
spec: {endpoints: ["SEATTLE:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {endpoints: ["LA:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: useast}
spec: {endpoints: ["USEAST:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: static}
spec: {entry: hk, exit: useast, via: [seattle, la], route: [hk, seattle, la, useast]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: sum}
spec: {entry: hk, exit: useast, via: [seattle, la], mode: sum, probe: {interval: INTERVAL}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: pipe}
spec: {entry: hk, exit: useast, via: [seattle, la], mode: pipe, probe: {interval: INTERVAL}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: static}
spec: {chain: static, listen: {address: 127.0.0.1, port: 15000}, target: "127.0.0.1:7000"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: sum}
spec: {chain: sum, listen: {address: 127.0.0.1, port: 15001}, target: "127.0.0.1:7000"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pipe}
spec: {chain: pipe, listen: {address: 127.0.0.1, port: 15002}, target: "127.0.0.1:7000"}
`

// Options say how to build the network.
type Options struct {
	// Hoplink is the hoplink binary the relays run.
	Hoplink string
	// Dir holds manifests, certificates and the relays' logs.
	Dir string
	// Prefix names the namespaces; unique per process.
	Prefix string
	// Interval is the routed chains' probe interval.
	Interval time.Duration
}

// Network is the running network.
type Network struct {
	Net    *linkemu.Net
	Nodes  map[string]*linkemu.Node
	Links  map[string]*linkemu.Link // "hk-la"
	relays map[string]*exec.Cmd
	logs   []*os.File
	echo   net.Listener
}

// Start builds the namespaces and links, the target, and the relays.
func Start(o Options) (_ *Network, err error) {
	ln, err := linkemu.NewNet(o.Prefix)
	if err != nil {
		return nil, err
	}
	n := &Network{Net: ln, Nodes: map[string]*linkemu.Node{}, Links: map[string]*linkemu.Link{}, relays: map[string]*exec.Cmd{}}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	for _, name := range Relays {
		if n.Nodes[name], err = ln.AddNode(name); err != nil {
			return nil, err
		}
	}
	for _, l := range Links {
		if n.Links[l.A+"-"+l.B], err = ln.Connect(n.Nodes[l.A], n.Nodes[l.B], linkemu.Params{Delay: l.RTT / 2}); err != nil {
			return nil, err
		}
	}
	m := strings.NewReplacer("HK", n.Nodes["hk"].Addr.String(), "SEATTLE", n.Nodes["seattle"].Addr.String(),
		"LA", n.Nodes["la"].Addr.String(), "USEAST", n.Nodes["useast"].Addr.String(), "INTERVAL", o.Interval.String()).Replace(manifests)
	if err := os.WriteFile(filepath.Join(o.Dir, "seed004.yaml"), []byte(m), 0o644); err != nil {
		return nil, err
	}
	certs := filepath.Join(o.Dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--certs", certs}, append([]string{"cert", "issue", "--certs", certs}, Relays...)} {
		if out, err := exec.Command(o.Hoplink, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("hoplink %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if err := n.Nodes["useast"].Do(func() (err error) { n.echo, err = net.Listen("tcp", fmt.Sprintf(":%d", TargetPort)); return }); err != nil {
		return nil, err
	}
	go serveEcho(n.echo)
	for _, name := range Relays {
		if err := n.StartRelay(o, name); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// StartRelay starts (or restarts) one relay process.
func (n *Network) StartRelay(o Options, name string) error {
	out, err := os.OpenFile(n.LogFile(o.Dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.logs = append(n.logs, out)
	cmd := n.Nodes[name].Command(o.Hoplink, "relay", "-f", filepath.Join(o.Dir, "seed004.yaml"), "--name", name,
		"--certs", filepath.Join(o.Dir, "certs"), "--metrics-addr", "127.0.0.1:9464")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	n.relays[name] = cmd
	return nil
}

// LogFile is where a relay's log goes.
func (n *Network) LogFile(dir, relay string) string { return filepath.Join(dir, relay+".log") }

// Relay is a relay's process.
func (n *Network) Relay(name string) *os.Process { return n.relays[name].Process }

// Close stops the relays and the target and removes the namespaces.
func (n *Network) Close() error {
	for _, cmd := range n.relays {
		cmd.Process.Kill()
		cmd.Wait()
	}
	if n.echo != nil {
		n.echo.Close()
	}
	for _, f := range n.logs {
		f.Close()
	}
	return n.Net.Close()
}

func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

// TargetAddr is the target's address as hk reaches it over the direct link.
func (n *Network) TargetAddr() string {
	return fmt.Sprintf("%s:%d", n.Nodes["useast"].Addr, TargetPort)
}

// Dial connects from a node, as a program on that host would.
func (n *Network) Dial(node, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Nodes[node].Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, 5*time.Second); return })
	return c, err
}

// Metrics reads a relay's /metrics from inside its namespace.
func (n *Network) Metrics(relay string) (string, error) {
	client := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return n.Dial(relay, addr) },
	}}
	resp, err := client.Get("http://127.0.0.1:9464/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Route is the route a relay exports for a chain (hoplink_chain_route_info),
// or "" when it exports none.
func (n *Network) Route(relay, chain string) string {
	m, _ := n.Metrics(relay)
	sc := bufio.NewScanner(strings.NewReader(m))
	prefix := fmt.Sprintf(`hoplink_chain_route_info{chain=%q,relay=%q,route="`, chain, relay)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok && strings.HasSuffix(rest, `"} 1`) {
			return strings.TrimSuffix(rest, `"} 1`)
		}
	}
	return ""
}

// WaitRoute polls a relay's metrics until it exports want for chain, and
// returns how long that took.
func (n *Network) WaitRoute(relay, chain, want string, within time.Duration) (time.Duration, error) {
	start := time.Now()
	for time.Since(start) < within {
		if n.Route(relay, chain) == want {
			return time.Since(start), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("%s: route of %s is %q after %v; want %q", relay, chain, n.Route(relay, chain), within, want)
}

// Load is request/response traffic: clients that each keep one connection
// and send a request, wait for the whole answer, pause, and repeat, as the
// report's simulated users did.
type Load struct {
	Clients int
	// Requests each client sends; when zero, clients run for Duration.
	Requests int
	Duration time.Duration
	Think    time.Duration // pause between a client's requests
	Size     int           // bytes of a request and of its answer; 64 when zero
}

// Run runs the load against addr from hk and returns every round trip,
// sorted, and how many clients failed (could not connect, or lost their
// connection).
func (n *Network) Run(addr string, l Load) (rtts []time.Duration, failed int) {
	size := l.Size
	if size == 0 {
		size = 64
	}
	type result struct {
		rtts []time.Duration
		err  error
	}
	results := make(chan result, l.Clients)
	stop := time.Now().Add(l.Duration)
	for i := range l.Clients {
		go func() {
			// Spread the first requests over one think time.
			if l.Clients > 1 {
				time.Sleep(l.Think * time.Duration(i) / time.Duration(l.Clients))
			}
			var r result
			defer func() { results <- r }()
			c, err := n.Dial("hk", addr)
			if err != nil {
				r.err = err
				return
			}
			defer c.Close()
			buf := make([]byte, size)
			for k := 0; l.Requests > 0 && k < l.Requests || l.Requests == 0 && time.Now().Before(stop); k++ {
				start := time.Now()
				c.SetDeadline(start.Add(30 * time.Second))
				if _, err := c.Write(buf); err != nil {
					r.err = err
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					r.err = err
					return
				}
				r.rtts = append(r.rtts, time.Since(start))
				if l.Think > 0 {
					time.Sleep(l.Think)
				}
			}
		}()
	}
	for range l.Clients {
		r := <-results
		rtts = append(rtts, r.rtts...)
		if r.err != nil {
			failed++
		}
	}
	slices.Sort(rtts)
	return rtts, failed
}

// Quantile of sorted round trips.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
