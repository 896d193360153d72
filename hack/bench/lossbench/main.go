//go:build linux

// Command lossbench asks seed 002's question, whether a relay chain beats
// plain TCP on a lossy path, on emulated links (network namespaces joined
// by TUN links that delay and drop IP packets, internal/linkemu): the client
// host a and the server host b are joined directly, and also through m1
// and m2 (three links, each with a third of the delay and of the loss, so
// both ways cross the same end-to-end figures). For each link profile it
// measures, directly and through 1 hop (a -> b) and 3 hops (a -> m1 -> m2
// -> b) over each transport:
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
// The warm-up hides what a Tunnel's first flows meet. With -fresh only the
// auto paths run, and after each path's warm Tunnel the relays carry two
// Tunnels that never had a flow: five flows of the echoes on one, then
// five bulk flows on the other, each flow timed, with the transport each
// relay on the way chose for it. By then the links have carried the warm
// Tunnel's echoes, which is how the relays may know what they lose.
//
// The hosts (each namespace) run the TCP congestion control -cc, cubic
// unless told: most hosts do, and this machine's kernel defaults to bbr.
// -hoplink takes name=path pairs, comma-separated, to compare builds in
// one run: each profile runs every build in turn, the order reversed from
// one profile to the next.
//
//	make build && go run ./hack/bench/lossbench -hoplink bin/hoplink -out docs/benchmarks.md   # as root
//	go run ./hack/bench/lossbench -fresh -profiles "no loss,1%" -hoplink before=bin/old,after=bin/hoplink -out docs/benchmarks.md
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
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

var profiles = []profile{
	// What the others are measured against; and what must not change
	// when a relay's choices do.
	{"LAN, no loss", 100 * time.Microsecond, 0},
	{"LAN, 1% loss", 100 * time.Microsecond, 0.01},
	{"LAN, 2% loss", 100 * time.Microsecond, 0.02},
	{"WAN 20 ms, 1% loss", 10 * time.Millisecond, 0.01},
	{"WAN 20 ms, 2% loss", 10 * time.Millisecond, 0.02},
}

// warmUp is the least time each relay path carries echoes before it is
// measured.
const warmUp = 2 * time.Second

const (
	echoPort = 7000
	sinkPort = 7001
)

// onlyPaths is -paths.
var onlyPaths string

// matches says whether name contains one of the comma-separated parts of
// filter, or filter is empty.
func matches(filter, name string) bool {
	return filter == "" || slices.ContainsFunc(strings.Split(filter, ","), func(s string) bool { return strings.Contains(name, s) })
}

// build is a hoplink binary the relays run, and its name in the tables.
type build struct{ name, path string }

func parseBuilds(s string) []build {
	var bs []build
	for _, f := range strings.Split(s, ",") {
		name, path, ok := strings.Cut(f, "=")
		if !ok {
			name, path = filepath.Base(f), f
		}
		bs = append(bs, build{name, path})
	}
	return bs
}

func main() {
	hoplink := flag.String("hoplink", "bin/hoplink", "the hoplink binary the relays run; name=path,... compares builds")
	echoes := flag.Int("echoes", 1000, "sequential echoes of the request/response shape")
	size := flag.Int("size", 1000, "bytes per echo")
	bulk := flag.Duration("bulk", 5*time.Second, "how long each bulk run sends")
	only := flag.String("profiles", "", "run only the profiles whose name contains one of these, comma-separated")
	cc := flag.String("cc", "cubic", "the hosts' TCP congestion control (\"\": the kernel's default)")
	flag.StringVar(&onlyPaths, "paths", "", "run only the relay paths whose name contains one of these, comma-separated")
	fresh := flag.Bool("fresh", false, "only the auto paths, each followed by fresh Tunnels' first five flows")
	out := flag.String("out", "", "Markdown file to write the table into (between the loss or lossfresh markers)")
	flag.Parse()
	builds := parseBuilds(*hoplink)
	var rows []row
	run := 0
	for _, p := range profiles {
		if !matches(*only, p.name) {
			continue
		}
		order := slices.Clone(builds)
		if run%2 == 1 {
			slices.Reverse(order) // neither build always runs on a cooler machine
		}
		run++
		for _, b := range order {
			r, err := runProfile(b, p, *cc, *fresh, *echoes, *size, *bulk)
			if err != nil {
				fmt.Fprintln(os.Stderr, "lossbench:", err)
				os.Exit(1)
			}
			rows = append(rows, r...)
		}
	}
	multi := len(builds) > 1
	table, mark := render(rows, multi, *echoes, *size, *bulk), "loss"
	if *fresh {
		table, mark = renderFresh(rows, *echoes, *size, *bulk), "lossfresh"
	}
	fmt.Print(table)
	if *out != "" {
		if err := writeBetween(*out, mark, table); err != nil {
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
	via          string // the transport the entry relay chose, and why
}

// row is one path's figures; a fresh Tunnel's rows hold one result per
// flow.
type row struct {
	link, cc, build, path string
	kind                  string // "" for the main table; echo, warm or bulk for -fresh
	rs                    []result
}

// freshFlows is how many flows of a fresh Tunnel are timed: a relay that
// waited for its 4th finished flow to learn the Tunnel's shape took the
// 5th as well as a warm Tunnel's.
const freshFlows = 5

func runProfile(b build, p profile, cc string, fresh bool, echoes, size int, bulk time.Duration) ([]row, error) {
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
	if cc != "" {
		// The allowed list is the whole machine's: put back as soon as the
		// namespaces have their default, which stays.
		restore, err := linkemu.AllowCongestionControl([]string{cc})
		if err != nil {
			return nil, err
		}
		for _, node := range nodes {
			if err := node.SetCongestionControl(cc); err != nil {
				restore()
				return nil, err
			}
		}
		restore()
	}
	// What the hosts run, as the kernel says.
	got, err := nodes["a"].Command("sysctl", "-n", "net.ipv4.tcp_congestion_control").Output()
	if err != nil {
		return nil, err
	}
	cc = strings.TrimSpace(string(got))
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
		// Tunnel j of chain i listens on 15000+10i+j: echoes, bulk, and
		// the echoes of a Tunnel that -fresh keeps for its first flows.
		for j, target := range []int{echoPort, sinkPort, echoPort} {
			fmt.Fprintf(&m, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t%d-%d}\nspec: {chain: c%d, listen: {address: 127.0.0.1, port: %d}, target: \"127.0.0.1:%d\"}\n",
				i, j, i, 15000+10*i+j, target)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte(m.String()), 0o644); err != nil {
		return nil, err
	}
	certs := filepath.Join(dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--dir", certs}, {"cert", "issue", "--dir", certs, "a", "m1", "m2", "b"}} {
		if out, err := exec.Command(b.path, args...).CombinedOutput(); err != nil {
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
		cmd := nodes[name].Command(b.path, "relay", "-f", filepath.Join(dir, "m.yaml"), "--name", name, "--certs", certs,
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
	// Wait until every path answers (the fresh Tunnels are left alone).
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
	// Which transport each relay of a path gave a flow: the flows are
	// sequential, so what the relays' counts gained meanwhile.
	metricsOf := map[string]*http.Client{}
	for _, name := range []string{"a", "m1", "m2"} {
		node := nodes[name]
		metricsOf[name] = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(context.Context, string, string) (net.Conn, error) {
				var c net.Conn
				err := node.Do(func() (err error) { c, err = net.DialTimeout("tcp", "127.0.0.1:9464", 5*time.Second); return })
				return c, err
			}}}
	}
	timed := func(relays []string, f func() result) result {
		before := make([]map[string]float64, len(relays))
		for i, name := range relays {
			before[i] = flowsOf(metricsOf[name])
		}
		r := f()
		var vias []string
		for i, name := range relays {
			vias = append(vias, gained(before[i], flowsOf(metricsOf[name])))
		}
		r.via = vias[0]
		if slices.ContainsFunc(vias, func(v string) bool { return v != vias[0] }) {
			for i := range vias {
				vias[i] = relays[i] + ": " + vias[i]
			}
			r.via = strings.Join(vias, "; ")
		}
		return r
	}
	measure := func(echoAddr, sinkAddr string) result {
		r, err := shape(dial, echoAddr, echoes, size)
		if err != nil {
			return result{err: err}
		}
		r.mbps, r.err = send(dial, sinkAddr, bulk)
		return r
	}
	var rows []row
	add := func(name, kind string, rs ...result) {
		for i, r := range rs {
			fmt.Fprintf(os.Stderr, "%s / %s / %s %s %d: first %v total %v bulk %.1f Mbit/s via %s %v\n",
				p.name, b.name, name, kind, i+1, r.first, r.total, r.mbps, r.via, r.err)
		}
		rows = append(rows, row{link: p.name, cc: cc, build: b.name, path: name, kind: kind, rs: rs})
	}
	bAddr := nodes["b"].Addr.String()
	add("direct TCP", "", measure(fmt.Sprintf("%s:%d", bAddr, echoPort), fmt.Sprintf("%s:%d", bAddr, sinkPort)))
	for i, pa := range paths {
		if fresh && pa.transport != "auto" || !matches(onlyPaths, pa.name) {
			continue
		}
		port := func(j int) string { return fmt.Sprintf("127.0.0.1:%d", 15000+10*i+j) }
		// The relays that choose a transport: all but the exit.
		route := strings.Split(strings.Trim(pa.route, "[]"), ", ")
		relays := route[:len(route)-1]
		// The warm-up: a relay knows a Tunnel's shape after 4 flows, and
		// a link's loss after its first losses, which a LAN losing 1%
		// shows within a second or two.
		for n, t0 := 0, time.Now(); n < 4 || time.Since(t0) < warmUp; n++ {
			shape(dial, port(0), 50, size)
		}
		if !fresh {
			add(pa.name, "", measure(port(0), port(1)))
			continue
		}
		warm, err := shape(dial, port(0), echoes, size)
		warm.err = errors.Join(warm.err, err)
		add(pa.name, "warm", warm)
		var rs []result
		for range freshFlows {
			rs = append(rs, timed(relays, func() result {
				r, err := shape(dial, port(2), echoes, size)
				r.err = errors.Join(r.err, err)
				return r
			}))
		}
		add(pa.name, "echo", rs...)
		rs = nil
		for range freshFlows {
			rs = append(rs, timed(relays, func() result {
				var r result
				r.mbps, r.err = send(dial, port(1), bulk)
				return r
			}))
		}
		add(pa.name, "bulk", rs...)
	}
	return rows, nil
}

// flowsOf reads the entry relay's hoplink_link_flows_total, by series.
func flowsOf(c *http.Client) map[string]float64 {
	resp, err := c.Get("http://a/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "hoplink_link_flows_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		fmt.Sscan(line[i+1:], &v)
		m[line[:i]] = v
	}
	return m
}

var label = regexp.MustCompile(`(transport|reason)="([^"]*)"`)

// gained names the series that grew from before to after: "transport
// reason" of each flow the entry opened meanwhile.
func gained(before, after map[string]float64) string {
	var out []string
	for k, v := range after {
		if v <= before[k] {
			continue
		}
		var tr, reason string
		for _, m := range label.FindAllStringSubmatch(k, -1) {
			if m[1] == "transport" {
				tr = m[2]
			} else {
				reason = m[2]
			}
		}
		out = append(out, tr+" "+reason)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
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

func render(rows []row, multi bool, echoes, size int, bulk time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- loss:begin -->\nMeasured %s on this machine by `go run ./hack/bench/lossbench` (as root): %d sequential %d-byte echoes on one connection (seed 002's shape), then one connection sending for %v. Links are emulated in user space (internal/linkemu); the 3-hop path crosses three links with a third of the delay and loss each. Each relay path follows warm-up connections of 50 echoes, at least 4 and for at least 2 s (a relay learns a Tunnel's shape from 4 flows, and a link's loss from the losses it sees). The hosts' TCP congestion control is the clients' and servers' (direct TCP's); the relays' TLS links run bbr.\n\n",
		time.Now().UTC().Format("2006-01-02"), echoes, size, bulk)
	b.WriteString("| link | hosts' CC | path | first echo ms | total ms | total vs direct | bulk Mbit/s | bulk vs direct |\n|---|---|---|---|---|---|---|---|\n")
	var direct result
	for _, r := range rows {
		x := r.rs[0]
		if r.path == "direct TCP" {
			direct = x
		}
		name := r.path
		if multi {
			name += " (" + r.build + ")"
		}
		if x.err != nil {
			name += " (" + x.err.Error() + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %d | %.2fx | %.0f | %.2fx |\n", r.link, r.cc, name,
			float64(x.first.Microseconds())/1000, x.total.Milliseconds(),
			float64(x.total)/float64(max(direct.total, 1)), x.mbps, x.mbps/max(direct.mbps, 0.001))
	}
	b.WriteString("<!-- loss:end -->\n")
	return b.String()
}

// renderFresh is -fresh's table: per link, build and auto path, a warm
// Tunnel's echoes, then each of a fresh Tunnel's first flows, with the
// transport the entry relay gave it.
func renderFresh(rows []row, echoes, size int, bulk time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- lossfresh:begin -->\nMeasured %s on this machine by `go run ./hack/bench/lossbench -fresh` (as root). Per link and build: direct TCP (%d sequential %d-byte echoes, then %v of bulk); then for each auto path, after warm-up connections (50 echoes, at least 4 and for at least 2 s), a warm Tunnel's %d echoes; then a Tunnel that never had a flow carries %d flows of %d echoes each, one after the other, and another %d bulk flows of %v each. Each cell: the flow's total ms (echoes) or Mbit/s (bulk), and the transport and reason the relays chose for it (each relay's, where they differ). The hosts' TCP congestion control is the clients' and servers' (direct TCP's); the relays' TLS links run bbr.\n\n",
		time.Now().UTC().Format("2006-01-02"), echoes, size, bulk, echoes, freshFlows, echoes, freshFlows, bulk)
	b.WriteString("| link | hosts' CC | build | path | Tunnel |")
	for i := range freshFlows {
		fmt.Fprintf(&b, " flow %d |", i+1)
	}
	b.WriteString("\n|---|---|---|---|---|" + strings.Repeat("---|", freshFlows) + "\n")
	cell := func(x result, bulk bool) string {
		s := fmt.Sprintf("%d ms", x.total.Milliseconds())
		if bulk {
			s = fmt.Sprintf("%.0f Mbit/s", x.mbps)
		}
		if x.via != "" {
			s += " (" + x.via + ")"
		}
		if x.err != nil {
			s += " (" + x.err.Error() + ")"
		}
		return s
	}
	for _, r := range rows {
		tunnel := map[string]string{"": "direct: echoes, bulk", "warm": "warm: echoes", "echo": "fresh: echoes", "bulk": "fresh: bulk"}[r.kind]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |", r.link, r.cc, r.build, r.path, tunnel)
		switch r.kind {
		case "":
			fmt.Fprintf(&b, " %s | %s |", cell(r.rs[0], false), cell(r.rs[0], true))
			b.WriteString(strings.Repeat(" |", freshFlows-2))
		case "warm":
			fmt.Fprintf(&b, " %s |", cell(r.rs[0], false))
			b.WriteString(strings.Repeat(" |", freshFlows-1))
		default:
			for _, x := range r.rs {
				fmt.Fprintf(&b, " %s |", cell(x, r.kind == "bulk"))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("<!-- lossfresh:end -->\n")
	return b.String()
}

// writeBetween puts table in place of the one between path's
// <!-- mark:begin --> and <!-- mark:end --> markers.
func writeBetween(path, mark, table string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	marks := regexp.MustCompile(`(?s)<!-- ` + mark + `:begin -->.*?<!-- ` + mark + `:end -->\n?`)
	if !marks.Match(doc) {
		return fmt.Errorf("%s has no <!-- %s:begin --> marker", path, mark)
	}
	return os.WriteFile(path, marks.ReplaceAll(doc, []byte(table)), 0o644)
}
