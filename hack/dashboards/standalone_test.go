package main

import (
	"encoding/json"
	"fmt"
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

// standalone is three relays, each its own process with its own /metrics
// as in production (local mode runs them in one process, which shares what
// they know and cannot lose one relay alone), scraped by a real Prometheus.
type standalone struct {
	dir, bin, promAddr string
	relays             map[string]*exec.Cmd
	toLA, toSeattle    *linkemu.UDPProxy
	hk, seattle        string
}

// probeInterval is the routed chain's: links are measured this often.
const probeInterval = time.Second

func startStandalone(t *testing.T) *standalone {
	t.Helper()
	if testing.Short() {
		// skip-ok: -short leaves out what starts processes, in CI too.
		t.Skip("-short: starts relays and Prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		gate.Missing(t, "no prometheus binary: apt-get install prometheus (CI does)")
	}
	s := &standalone{dir: t.TempDir(), relays: map[string]*exec.Cmd{}}
	s.bin = procs.Hoplink(t)
	ports := []int{testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)}
	// As in TestDashboardQueriesReturnData: peers reach la through a link
	// emulator, hk -> la slower than hk -> seattle -> la until turned.
	s.toLA, err = linkemu.NewUDPProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", ports[2]), linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.toLA.Close() })
	s.toSeattle, err = linkemu.NewUDPProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", ports[1]), linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.toSeattle.Close() })
	s.hk, s.seattle = fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	slow := linkemu.Params{Delay: 20 * time.Millisecond}
	s.toLA.SetFrom(s.hk, slow, slow)
	tunnelPort := testutil.FreePort(t)
	manifests := fmt.Sprintf(`
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %[1]d}, endpoints: ["127.0.0.1:%[1]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: seattle}
spec: {listen: {address: 127.0.0.1, port: %[2]d}, endpoints: [%[8]q]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[3]d}, endpoints: [%[4]q]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fastest}
spec: {entry: hk, exit: la, via: [seattle], mode: sum, probe: {interval: %[7]s}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: echo-fast}
spec: {chain: fastest, protocol: tcp, listen: {address: 127.0.0.1, port: %[5]d}, target: %[6]q}
`, ports[0], ports[1], ports[2], s.toLA.Addr(), tunnelPort, testutil.EchoServer(t), probeInterval, s.toSeattle.Addr())
	if err := os.WriteFile(filepath.Join(s.dir, "net.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(s.dir, "certs")
	for _, argv := range [][]string{{"cert", "ca", "--certs", certs}, {"cert", "issue", "--certs", certs, "hk", "seattle", "la"}} {
		if out, err := exec.Command(s.bin, argv...).CombinedOutput(); err != nil {
			t.Fatalf("hoplink %s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}

	var targets []string
	metricsAddr := map[string]string{}
	for _, r := range []string{"hk", "seattle", "la"} {
		metricsAddr[r] = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
		targets = append(targets, fmt.Sprintf("%q", metricsAddr[r]))
	}
	s.promAddr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n- job_name: hoplink\n  static_configs: [{targets: [%s]}]\n", strings.Join(targets, ", "))
	if err := os.WriteFile(filepath.Join(s.dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, s.dir, "prometheus", prom, "--config.file="+filepath.Join(s.dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(s.dir, "tsdb"), "--web.listen-address="+s.promAddr)
	waitFor(t, 30*time.Second, "prometheus ready", func() error {
		r, err := http.Get("http://" + s.promAddr + "/-/ready")
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			return fmt.Errorf("status %d", r.StatusCode)
		}
		return nil
	})
	for _, r := range []string{"hk", "seattle", "la"} {
		logf, err := os.Create(filepath.Join(s.dir, r+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(s.bin, "relay", "-f", filepath.Join(s.dir, "net.yaml"), "--name", r, "--certs", certs, "--metrics-addr", metricsAddr[r])
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s.relays[r] = cmd
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			logf.Close()
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for r := range s.relays {
				log, _ := os.ReadFile(filepath.Join(s.dir, r+".log"))
				t.Logf("%s log:\n%s", r, log)
			}
		}
	})
	// Flows through the routed chain, so that the relays on its route
	// learn it.
	go func() {
		for {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-t.Context().Done():
				return
			}
			exchange(fmt.Sprintf("127.0.0.1:%d", tunnelPort))
		}
	}()
	return s
}

// partitionSeattle waits until the routed chain runs through seattle and
// seattle knows it, then cuts hk from seattle and waits until Prometheus has
// seen the entry move the chain to hk -> la. seattle, which the entry can no
// longer tell, keeps the route it knew.
func (s *standalone) partitionSeattle(t *testing.T) {
	t.Helper()
	s.wait(t, 30*time.Second, `hoplink_chain_route_info{relay="hk",route="hk,seattle,la",chain="default/fastest"}`)
	s.wait(t, 30*time.Second, `hoplink_chain_route_info{relay="seattle",route="hk,seattle,la",chain="default/fastest"}`)
	cut := linkemu.Params{Loss: 1}
	s.toSeattle.SetFrom(s.hk, cut, cut)
	s.wait(t, 30*time.Second, `hoplink_chain_route_info{relay="hk",route="hk,la",chain="default/fastest"}`)
}

func (s *standalone) wait(t *testing.T, d time.Duration, expr string) {
	t.Helper()
	waitFor(t, d, expr, func() error {
		if n, err := promQuery(s.promAddr, expr); err != nil || n == 0 {
			return fmt.Errorf("not yet (%v)", err)
		}
		return nil
	})
}

// panelQueries are the queries of the committed dashboard's panel title, in
// refId order.
func panelQueries(t *testing.T, title string) []string {
	t.Helper()
	b, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	qs := queries(t, b)
	var out []string
	for i := 1; ; i++ {
		e, ok := qs[fmt.Sprintf("panel %q, query %d", title, i)]
		if !ok {
			break
		}
		out = append(out, atAll.Replace(e))
	}
	if len(out) == 0 {
		t.Fatalf("no panel %q", title)
	}
	return out
}

// The "Current routes" table lists each chain once, with the route its
// entry takes, although a relay that the old route crossed, cut from the
// entry, still exports the route it last learned.
func TestCurrentRoutesOnePerChain(t *testing.T) {
	s := startStandalone(t)
	s.partitionSeattle(t)
	s.wait(t, 10*time.Second, `hoplink_chain_route_info{relay="seattle",route="hk,seattle,la",chain="default/fastest"}`)
	expr := panelQueries(t, "Current routes")[0]
	waitFor(t, 10*time.Second, "current routes", func() error {
		rows, err := promRows(s.promAddr, expr)
		if err != nil {
			return err
		}
		var routes []string
		for _, r := range rows {
			if r["chain"] == "default/fastest" {
				routes = append(routes, r["route"])
			}
		}
		if len(routes) != 1 || routes[0] != "hk,la" {
			all, _ := promRows(s.promAddr, "hoplink_chain_route_info")
			return fmt.Errorf("default/fastest: routes %q, want only hk,la (every relay's: %v)", routes, all)
		}
		return nil
	})
}

// promRows evaluates expr now and returns each series' labels and value.
func promRows(addr, expr string) ([]map[string]string, error) {
	r, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	var res struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
		return nil, err
	}
	if res.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", res.Error)
	}
	var out []map[string]string
	for _, s := range res.Data.Result {
		row := map[string]string{}
		for k, v := range s.Metric {
			row[k] = v
		}
		row[""] = fmt.Sprint(s.Value[1]) // the value, under a name no label has
		out = append(out, row)
	}
	return out, nil
}
