package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
)

const committed = "../../charts/hoplink/dashboards/hoplink.json"

// The chart ships what the code says.
func TestDashboardIsGenerated(t *testing.T) {
	want, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go run ./hack/dashboards", committed)
	}
}

// queries lists every PromQL expression of a dashboard: panel targets and
// annotations.
func queries(t *testing.T, b []byte) map[string]string {
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out[fmt.Sprintf("panel %q, query %d", p.Title, i+1)] = tg.Expr
		}
	}
	for _, a := range d.Annotations.List {
		out[fmt.Sprintf("annotation %q", a.Name)] = a.Expr
	}
	return out
}

// Every query of the dashboard returns data from a real Prometheus that
// scrapes a real local network of relays carrying traffic: a static chain, a
// routed one, and a Tunnel whose target refuses connections.
func TestDashboardQueriesReturnData(t *testing.T) {
	if testing.Short() {
		// skip-ok: -short leaves out what starts processes, in CI too.
		t.Skip("-short: starts relays and Prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		gate.Missing(t, "no prometheus binary: apt-get install prometheus (CI does)")
	}
	b, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	qs := queries(t, b)
	if len(qs) < 10 {
		t.Fatalf("only %d queries found in the dashboard", len(qs))
	}

	dir := t.TempDir()
	bin := procs.Hoplink(t)
	echo := testutil.EchoServer(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	ports := []int{testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)}
	// Peers reach la through a link emulator, so that the test can make
	// the routed chain change its route: hk -> la starts 40 ms slower
	// than hk -> seattle -> la, and turns faster once Prometheus has seen
	// the first route.
	toLA, err := linkemu.NewUDPProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", ports[2]), linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	defer toLA.Close()
	hk, seattle := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	slow := linkemu.Params{Delay: 20 * time.Millisecond}
	toLA.SetFrom(hk, slow, slow)
	tunnelPorts := []int{testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)}
	udpEcho := udpEchoServer(t)
	udpPort := testutil.FreePort(t)
	manifests := fmt.Sprintf(`
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %[1]d}, endpoints: ["127.0.0.1:%[1]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: seattle}
spec: {listen: {address: 127.0.0.1, port: %[2]d}, endpoints: ["127.0.0.1:%[2]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[3]d}, endpoints: [%[8]q]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: static}
spec: {entry: hk, exit: la, via: [seattle], route: [hk, seattle, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fastest}
spec: {entry: hk, exit: la, via: [seattle], mode: sum, probe: {interval: 1s}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: echo}
spec: {chain: static, protocol: tcp, listen: {address: 127.0.0.1, port: %[4]d}, target: %[7]q}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: echo-fast}
spec: {chain: fastest, protocol: tcp, listen: {address: 127.0.0.1, port: %[5]d}, target: %[7]q}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: refused}
spec: {chain: static, protocol: tcp, listen: {address: 127.0.0.1, port: %[6]d}, target: "127.0.0.1:1"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: echo-udp}
spec: {chain: static, protocol: udp, listen: {address: 127.0.0.1, port: %[9]d}, target: %[10]q, udp: {maxSessions: 1}}
`, ports[0], ports[1], ports[2], tunnelPorts[0], tunnelPorts[1], tunnelPorts[2], echo, toLA.Addr(), udpPort, udpEcho)
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}

	// Prometheus first, so that it sees the routed chain's first route
	// as a change.
	promAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n- job_name: hoplink\n  static_configs: [{targets: [%q]}]\n", metricsAddr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, dir, "prometheus", prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+promAddr)
	waitFor(t, 30*time.Second, "prometheus ready", func() error {
		r, err := http.Get("http://" + promAddr + "/-/ready")
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			return fmt.Errorf("status %d", r.StatusCode)
		}
		return nil
	})
	exited := start(t, dir, "hoplink", bin, "local", "-f", dir, "--metrics-addr", metricsAddr)
	began := time.Now()

	// Traffic for the rates and histograms, until the test ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			for _, p := range tunnelPorts {
				exchange(fmt.Sprintf("127.0.0.1:%d", p))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	// Two UDP clients through a Tunnel of one session: one session open,
	// the other's datagrams dropped (session_limit).
	for range 2 {
		c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", udpPort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			for ctx.Err() == nil {
				c.Write([]byte("ping"))
				time.Sleep(200 * time.Millisecond)
			}
		}()
	}

	waitFor(t, 30*time.Second, "prometheus to see the first route", func() error {
		if n, err := promQuery(promAddr, `hoplink_chain_route_info{route="hk,seattle,la",chain="default/fastest"}`); err != nil || n == 0 {
			return fmt.Errorf("not yet (%v)", err)
		}
		return nil
	})
	toLA.SetFrom(hk, linkemu.Params{}, linkemu.Params{})
	toLA.SetFrom(seattle, slow, slow)

	// Each variable is at All (.*), as the dashboard opens; the series
	// each variable's values come from are there too.
	for _, v := range templateVars {
		series := strings.TrimSuffix(strings.TrimPrefix(v.query, "label_values("), ")")
		qs["variable $"+v.name] = series[:strings.LastIndex(series, ",")]
	}
	missing := map[string]string{}
	for name, expr := range qs {
		missing[name] = atAll.Replace(expr)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(missing) > 0 && time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "hoplink.log"))
			t.Fatalf("hoplink local exited:\n%s", log)
		default:
		}
		for name, expr := range missing {
			n, err := promQuery(promAddr, expr)
			if err != nil {
				t.Fatalf("%s: %s: %v", name, expr, err)
			}
			if n > 0 {
				delete(missing, name)
			}
		}
		time.Sleep(time.Second)
	}
	for name, expr := range missing {
		t.Errorf("%s returned no data within 60 s: %s", name, expr)
	}
	// For the picture in docs: HOPLINK_DASHBOARD_DUMP=FILE keeps the
	// network running for a few minutes more, moving the routed chain
	// back and forth, and writes what every panel shows.
	if out := os.Getenv("HOPLINK_DASHBOARD_DUMP"); out != "" && !t.Failed() {
		for i := range 6 {
			time.Sleep(30 * time.Second)
			if i%2 == 0 {
				toLA.SetFrom(hk, slow, slow)
				toLA.SetFrom(seattle, linkemu.Params{}, linkemu.Params{})
			} else {
				toLA.SetFrom(hk, linkemu.Params{}, linkemu.Params{})
				toLA.SetFrom(seattle, slow, slow)
			}
		}
		time.Sleep(30 * time.Second)
		dumpRanges(t, promAddr, b, began, time.Now(), out)
	}
	if t.Failed() {
		log, _ := os.ReadFile(filepath.Join(dir, "hoplink.log"))
		t.Logf("hoplink log:\n%s", log)
	}
}

// atAll is a query as Grafana sends it with every variable at All: rates
// need two samples in their window, and $__rate_interval becomes 15s here,
// as it would with a 1s scrape interval.
var atAll = strings.NewReplacer("$__rate_interval", "15s", "$namespace", ".*", "$chain", ".*", "$tunnel", ".*", "$relay", ".*")

// promQuery evaluates expr now and returns how many series answer.
func promQuery(addr, expr string) (int, error) {
	r, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer r.Body.Close()
	var res struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
		return 0, err
	}
	if res.Status != "success" {
		return 0, fmt.Errorf("prometheus: %s", res.Error)
	}
	return len(res.Data.Result), nil
}

// start runs a process until the test ends; the channel closes if it exits
// before.
func start(t *testing.T, dir, name string, argv ...string) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	return done
}

func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// exchange sends a line through a tunnel and reads what comes back, if
// anything (the refused Tunnel's flows end at once).
func exchange(addr string) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write([]byte("ping\n"))
	buf := make([]byte, 5)
	io.ReadFull(c, buf)
}

// udpEchoServer answers every datagram with itself until the test ends.
func udpEchoServer(t *testing.T) string {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	}()
	return c.LocalAddr().String()
}
