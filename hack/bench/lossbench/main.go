//go:build linux

// Command lossbench asks seed 002's question, whether a relay chain beats
// plain TCP on a lossy path, on emulated links (network namespaces joined
// by TUN links that delay and drop IP packets, internal/linkemu): the client
// host a and the server host b are joined directly, and also through m1
// and m2 (three links, each with a third of the delay and of the loss, so
// both ways cross the same end-to-end figures). For each link profile it
// measures, directly and through 1 hop (a -> b) and 3 hops (a -> m1 -> m2
// -> b) over each transport, on LAN links (long links, rate-limited, with
// the hosts' congestion control an input, are hack/bench/wan's):
//
//   - seed 002's request/response shape: one connection, 1,000 sequential
//     1,000-byte echoes; the first echo's time (with the connect) and the
//     total;
//   - bulk: one connection sending for a few seconds, the goodput.
//
// The relays are `hoplink relay` processes, one per namespace. Each relay
// path first carries warm-up connections of 50 echoes (at least 4, for at
// least 2 s), as a relay that has run a while has seen: under transport auto a relay learns a
// Tunnel's shape from its first 4 flows, and every relay learns which
// links lose packets (and sends lone packets twice on them) from the
// losses it sees.
//
//	make build && go run ./hack/bench/lossbench -hoplink bin/hoplink -out docs/benchmarks.md   # as root
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
)

type profile struct {
	name  string
	delay time.Duration // one way, end to end
	loss  float64       // end to end, per direction
}

// profiles are LAN links; long links are hack/bench/wan's.
var profiles = []profile{
	{"LAN, 1% loss", 100 * time.Microsecond, 0.01},
	{"LAN, 2% loss", 100 * time.Microsecond, 0.02},
}

// warmUp is the least time each relay path carries echoes before it is
// measured.
const warmUp = 2 * time.Second

const (
	echoPort = 7000
	sinkPort = 7001
)

func main() {
	hoplink := flag.String("hoplink", "bin/hoplink", "the hoplink binary the relays run")
	echoes := flag.Int("echoes", 1000, "sequential echoes of the request/response shape")
	size := flag.Int("size", 1000, "bytes per echo")
	bulk := flag.Duration("bulk", 5*time.Second, "how long each bulk run sends")
	only := flag.String("profiles", "", "run only the profiles whose name contains this")
	out := flag.String("out", "", "Markdown file to write the table into (between the loss markers)")
	flag.Parse()
	var rows []string
	for _, p := range profiles {
		if *only != "" && !strings.Contains(p.name, *only) {
			continue
		}
		r, err := runProfile(*hoplink, p, *echoes, *size, *bulk)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lossbench:", err)
			os.Exit(1)
		}
		rows = append(rows, r...)
	}
	table := render(rows, *echoes, *size, *bulk)
	fmt.Print(table)
	if *out != "" {
		if err := writeBetween(*out, table); err != nil {
			fmt.Fprintln(os.Stderr, "lossbench:", err)
			os.Exit(1)
		}
	}
}

const manifests = `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: 7401}, endpoints: ["A:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m1}
spec: {listen: {port: 7401}, endpoints: ["M1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m2}
spec: {listen: {port: 7401}, endpoints: ["M2:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: 7401}, endpoints: ["B:7401"]}
`

// paths of each profile: name, chain route, transport.
var paths = []struct{ name, route, transport string }{
	{"1 hop, quic", "[a, b]", "quic"},
	{"1 hop, tls", "[a, b]", "tls"},
	{"1 hop, auto", "[a, b]", "auto"},
	{"3 hops, quic", "[a, m1, m2, b]", "quic"},
	{"3 hops, tls", "[a, m1, m2, b]", "tls"},
	{"3 hops, auto", "[a, m1, m2, b]", "auto"},
}

type result struct {
	first, total time.Duration
	mbps         float64
	err          error
}

func runProfile(hoplink string, p profile, echoes, size int, bulk time.Duration) ([]string, error) {
	dir, err := os.MkdirTemp("", "lossbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	n, err := linkemu.NewNet(fmt.Sprintf("lb%d", os.Getpid()%100000))
	if err != nil {
		return nil, err
	}
	defer n.Close()
	// Interrupted, it still removes its namespaces (the relays die with
	// this process: Pdeathsig).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sig:
			n.Close()
			os.RemoveAll(dir)
			os.Exit(130)
		case <-done:
		}
	}()
	nodes := map[string]*linkemu.Node{}
	for _, name := range []string{"a", "m1", "m2", "b"} {
		if nodes[name], err = n.AddNode(name); err != nil {
			return nil, err
		}
	}
	whole := linkemu.Params{Delay: p.delay, Loss: p.loss}
	third := linkemu.Params{Delay: p.delay / 3, Loss: 1 - math.Pow(1-p.loss, 1.0/3)}
	for _, l := range []struct {
		a, b string
		p    linkemu.Params
	}{{"a", "b", whole}, {"a", "m1", third}, {"m1", "m2", third}, {"m2", "b", third}} {
		if _, err := n.Connect(nodes[l.a], nodes[l.b], l.p); err != nil {
			return nil, err
		}
	}
	var m strings.Builder
	m.WriteString(strings.NewReplacer("A:", nodes["a"].Addr.String()+":", "M1:", nodes["m1"].Addr.String()+":",
		"M2:", nodes["m2"].Addr.String()+":", "B:", nodes["b"].Addr.String()+":").Replace(manifests))
	for i, pa := range paths {
		fmt.Fprintf(&m, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c%d}\nspec: {entry: a, exit: b, via: [m1, m2], route: %s, transport: %s}\n",
			i, pa.route, pa.transport)
		for j, target := range []int{echoPort, sinkPort} {
			fmt.Fprintf(&m, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t%d-%d}\nspec: {chain: c%d, listen: {address: 127.0.0.1, port: %d}, target: \"127.0.0.1:%d\"}\n",
				i, j, i, 15000+10*i+j, target)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte(m.String()), 0o644); err != nil {
		return nil, err
	}
	certs := filepath.Join(dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--dir", certs}, {"cert", "issue", "--dir", certs, "a", "m1", "m2", "b"}} {
		if out, err := exec.Command(hoplink, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("hoplink %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// The echo and sink servers on b, for its relay and for direct clients.
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for port, serve := range map[int]func(net.Conn){echoPort: echo, sinkPort: sink} {
		var ln net.Listener
		if err := nodes["b"].Do(func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return }); err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		go accept(ln, serve)
	}
	var procs []*exec.Cmd
	defer func() {
		for _, c := range procs {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for _, name := range []string{"a", "m1", "m2", "b"} {
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		defer logf.Close()
		cmd := nodes[name].Command(hoplink, "relay", "-f", filepath.Join(dir, "m.yaml"), "--name", name, "--certs", certs,
			"--metrics-addr", "127.0.0.1:9464", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
	}
	dial := func(addr string) (net.Conn, error) {
		var c net.Conn
		err := nodes["a"].Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, 10*time.Second); return })
		return c, err
	}
	// Wait until every path answers.
	for i := range paths {
		addr := fmt.Sprintf("127.0.0.1:%d", 15000+10*i)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := shape(dial, addr, 1, 10); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s: path %q never answered", p.name, paths[i].name)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	measure := func(echoAddr, sinkAddr string) result {
		r, err := shape(dial, echoAddr, echoes, size)
		if err != nil {
			return result{err: err}
		}
		r.mbps, r.err = send(dial, sinkAddr, bulk)
		return r
	}
	// The hosts' TCP congestion control: each namespace's default, which
	// it took from this machine's when it was made.
	cc, err := nodes["a"].Command("sysctl", "-n", "net.ipv4.tcp_congestion_control").Output()
	if err != nil {
		return nil, fmt.Errorf("congestion control of %s: %w", nodes["a"].NS, err)
	}
	var rows []string
	row := func(name string, r result) {
		fmt.Fprintf(os.Stderr, "%s / %s: first %v total %v bulk %.1f Mbit/s %v\n", p.name, name, r.first, r.total, r.mbps, r.err)
		rows = append(rows, fmt.Sprintf("%s|%s|%d|%d|%.1f|%v|%s", p.name, name, r.first.Microseconds(), r.total.Milliseconds(), r.mbps, r.err, strings.TrimSpace(string(cc))))
	}
	b := nodes["b"].Addr.String()
	row("direct TCP", measure(fmt.Sprintf("%s:%d", b, echoPort), fmt.Sprintf("%s:%d", b, sinkPort)))
	for i, pa := range paths {
		echoAddr, sinkAddr := fmt.Sprintf("127.0.0.1:%d", 15000+10*i), fmt.Sprintf("127.0.0.1:%d", 15000+10*i+1)
		// The warm-up: a relay knows a Tunnel's shape after 4 flows, and
		// a link's loss after its first losses, which a LAN losing 1%
		// shows within a second or two.
		for n, t0 := 0, time.Now(); n < 4 || time.Since(t0) < warmUp; n++ {
			shape(dial, echoAddr, 50, size)
		}
		row(pa.name, measure(echoAddr, sinkAddr))
	}
	return rows, nil
}

// shape runs seed 002's client: connect, then n sequential echoes of size
// bytes; first is the connect plus the first echo.
func shape(dial func(string) (net.Conn, error), addr string, n, size int) (result, error) {
	start := time.Now()
	c, err := dial(addr)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Minute))
	msg := bytes.Repeat([]byte{'x'}, size)
	buf := make([]byte, size)
	var r result
	for i := range n {
		if _, err := c.Write(msg); err != nil {
			return r, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return r, fmt.Errorf("echo %d: %w", i, err)
		}
		if i == 0 {
			r.first = time.Since(start)
		}
	}
	r.total = time.Since(start)
	return r, nil
}

// send writes for d and returns the goodput the sink acknowledged (it
// answers with the byte count when the sender half-closes).
func send(dial func(string) (net.Conn, error), addr string, d time.Duration) (float64, error) {
	c, err := dial(addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d + 2*time.Minute))
	buf := make([]byte, 64<<10)
	start := time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	c.(*net.TCPConn).CloseWrite()
	var got int64
	if _, err := fmt.Fscan(c, &got); err != nil {
		return 0, fmt.Errorf("sink's count: %w", err)
	}
	return float64(got) * 8 / time.Since(start).Seconds() / 1e6, nil
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

func sink(c net.Conn) {
	defer c.Close()
	n, _ := io.Copy(io.Discard, c)
	fmt.Fprintf(c, "%d\n", n)
}

func render(rows []string, echoes, size int, bulk time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- loss:begin -->\nMeasured %s on this machine by `go run ./hack/bench/lossbench` (as root): %d sequential %d-byte echoes on one connection (seed 002's shape), then one connection sending for %v. Links are emulated in user space (internal/linkemu); the 3-hop path crosses three links with a third of the delay and loss each. Hosts' CC is the TCP congestion control of every host (the namespaces', taken from this machine's default); long links are hack/bench/wan's. Each relay path follows warm-up connections of 50 echoes, at least 4 and for at least 2 s (a relay learns a Tunnel's shape from 4 flows, and a link's loss from the losses it sees).\n\n",
		time.Now().UTC().Format("2006-01-02"), echoes, size, bulk)
	b.WriteString("| link | hosts' CC | path | first echo ms | total ms | total vs direct | bulk Mbit/s | bulk vs direct |\n|---|---|---|---|---|---|---|---|\n")
	var direct [2]float64
	for _, r := range rows {
		f := strings.Split(r, "|")
		var first, total, mbps float64
		fmt.Sscan(f[2], &first)
		fmt.Sscan(f[3], &total)
		fmt.Sscan(f[4], &mbps)
		if f[1] == "direct TCP" {
			direct = [2]float64{total, mbps}
		}
		errNote := ""
		if f[5] != "<nil>" {
			errNote = " (" + f[5] + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s | %.1f | %.0f | %.2fx | %.0f | %.2fx |\n", f[0], f[6], f[1], errNote, first/1000, total, total/max(direct[0], 1), mbps, mbps/max(direct[1], 0.001))
	}
	b.WriteString("<!-- loss:end -->\n")
	return b.String()
}

var markers = regexp.MustCompile(`(?s)<!-- loss:begin -->.*?<!-- loss:end -->\n?`)

func writeBetween(path, table string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !markers.Match(doc) {
		return fmt.Errorf("%s has no <!-- loss:begin --> marker", path)
	}
	return os.WriteFile(path, markers.ReplaceAll(doc, []byte(table)), 0o644)
}
