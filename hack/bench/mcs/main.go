// Command mcs measures the Multi-Cluster Services API on the kind e2e's two
// clusters (kept by E2E_KEEP=1 make e2e, or made by make mcs-conformance):
//
//	go run ./hack/bench/mcs latency   # export -> the name answers in B; unexport -> it stops
//	go run ./hack/bench/mcs rr        # first byte and request/response: clusterset IP against a
//	                                  # hand-written Tunnel over the same chain (east2 -> hk)
//	go run ./hack/bench/mcs scale     # N exports in A: until B imports them all and lists
//	                                  # their ways in; the operators' writes and memory
//
// Everything runs in the namespace mcsbench (mcsscale for scale), removed at
// the end; the hand-written Chain and Tunnel go in edge.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

var (
	root    string
	kubectl string
	kindBin string
	appImg  = "hoplink-e2e-app:dev"
	fbImg   = "hoplink-flowbench:dev"
)

type cluster struct{ name, kubeconfig string }

func (c cluster) k(args ...string) (string, error) {
	cmd := exec.Command(kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (c cluster) must(args ...string) string {
	out, err := c.k(args...)
	if err != nil {
		fatal(err)
	}
	return out
}

func (c cluster) apply(ns, yaml string) { c.put("apply", ns, yaml) }

// put runs kubectl VERB -f - (apply, or create for many new objects: one
// request each, not a read and a write).
func (c cluster) put(verb, ns, yaml string) {
	cmd := exec.Command(kubectl, "--kubeconfig", c.kubeconfig, "-n", ns, verb, "-f", "-")
	cmd.Stdin = strings.NewReader(yaml)
	if out, err := cmd.CombinedOutput(); err != nil {
		fatal(fmt.Errorf("apply in %s: %v: %s", c.name, err, out))
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mcs bench:", err)
	os.Exit(1)
}

func main() {
	wd, _ := os.Getwd()
	root = wd
	kubectl = filepath.Join(root, "bin/kind/k8s-1.37.1/kubectl")
	kindBin = filepath.Join(root, "bin/kind/kind-v0.33.0/kind")
	if len(os.Args) < 2 {
		fatal(fmt.Errorf("usage: mcs latency|rr|scale [flags]"))
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	rounds := fs.Int("rounds", 5, "rounds (latency), rounds of each path (rr)")
	n := fs.Int("n", 1000, "exports (scale)")
	fs.Parse(os.Args[2:])
	a, b := clusterOf("hoplink-a"), clusterOf("hoplink-b")
	switch os.Args[1] {
	case "latency":
		latency(a, b, *rounds)
	case "rr":
		rr(a, b, *rounds)
	case "scale":
		scale(a, b, *n)
	default:
		fatal(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

func clusterOf(name string) cluster {
	out, err := exec.Command(kindBin, "get", "kubeconfig", "--name", name).Output()
	if err != nil {
		fatal(fmt.Errorf("cluster %s: %v (keep the e2e's clusters: E2E_KEEP=1 make e2e, or make mcs-conformance)", name, err))
	}
	f := filepath.Join(os.TempDir(), "mcsbench-"+name+".kubeconfig")
	if err := os.WriteFile(f, out, 0o600); err != nil {
		fatal(err)
	}
	return cluster{name, f}
}

func namespace(c cluster, ns string) {
	if _, err := c.k("get", "namespace", ns); err != nil {
		c.must("create", "namespace", ns)
	}
}

const echoApp = `apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - {name: echo, image: hoplink-flowbench:dev, imagePullPolicy: Never, args: [echo, -addr, ":7000"]}
      - {name: web, image: hoplink-e2e-app:dev, imagePullPolicy: Never, args: [serve, ":8080"]}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec: {selector: {app: echo}, ports: [{name: echo, port: 7000}, {name: http, port: 8080}]}
`

// setup builds and loads the flowbench image, and runs the echo service in A.
func setup(a, b cluster) {
	d, _ := os.MkdirTemp("", "fb")
	defer os.RemoveAll(d)
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(d, "flowbench"), "./hack/bench/flowbench")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fatal(fmt.Errorf("build flowbench: %v: %s", err, out))
	}
	imp := exec.Command("bash", "-c", fmt.Sprintf(`tar -C %s -c flowbench | docker import --change 'ENTRYPOINT ["/flowbench"]' - %s`, d, fbImg))
	if out, err := imp.CombinedOutput(); err != nil {
		fatal(fmt.Errorf("flowbench image: %v: %s", err, out))
	}
	for _, c := range []cluster{a, b} {
		if out, err := exec.Command(kindBin, "load", "docker-image", fbImg, appImg, "--name", c.name).CombinedOutput(); err != nil {
			fatal(fmt.Errorf("kind load: %v: %s", err, out))
		}
		namespace(c, "mcsbench")
	}
	a.apply("mcsbench", echoApp)
	a.must("-n", "mcsbench", "rollout", "status", "deployment", "echo", "--timeout", "3m")
}

const export = `apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {name: echo}
`

// latency: a caller in B fetches echo's web port by name every 100 ms; each
// round exports the service in A, waits for B's first answer, unexports it
// and waits for B's first failure.
func latency(a, b cluster, rounds int) {
	setup(a, b)
	defer cleanup(a, b)
	b.apply("mcsbench", `apiVersion: v1
kind: Pod
metadata: {name: caller}
spec:
  containers: [{name: app, image: `+appImg+`, imagePullPolicy: Never,
    args: [get, "http://echo.mcsbench.svc.clusterset.local:8080/", --every, 100ms]}]
`)
	b.must("-n", "mcsbench", "wait", "pod/caller", "--for=condition=Ready", "--timeout", "2m")
	var up, down []time.Duration
	for i := 0; i < rounds; i++ {
		start := time.Now()
		a.apply("mcsbench", export)
		up = append(up, waitLog(b, start, "answer: pod echo-").Sub(start))
		time.Sleep(2 * time.Second)
		start = time.Now()
		a.must("-n", "mcsbench", "delete", "serviceexport", "echo")
		down = append(down, waitLog(b, start, "error: ").Sub(start))
		time.Sleep(2 * time.Second)
		fmt.Printf("round %d: export -> answer in B %.2f s, unexport -> no answer in B %.2f s\n", i+1, up[i].Seconds(), down[i].Seconds())
	}
	fmt.Printf("export -> answer: median %.2f s, max %.2f s; unexport -> gone: median %.2f s, max %.2f s (%d rounds, a fetch every 100 ms)\n",
		median(up).Seconds(), slices.Max(up).Seconds(), median(down).Seconds(), slices.Max(down).Seconds(), rounds)
}

// waitLog waits for the caller's first log line after since with substr,
// and returns its time (the kubelet's timestamp).
func waitLog(b cluster, since time.Time, substr string) time.Time {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		out, _ := b.k("-n", "mcsbench", "logs", "caller", "--timestamps", "--since-time", since.UTC().Format(time.RFC3339))
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			ts, line, _ := strings.Cut(sc.Text(), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err == nil && !at.Before(since) && strings.Contains(line, substr) {
				return at
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	fatal(fmt.Errorf("no %q in the caller's log within 2 minutes", substr))
	return time.Time{}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// The hand-written way over the same relays: a Chain east2 -> hk and a
// Tunnel to echo in A, in both clusters, as docs/multi-cluster.md writes one.
const handTunnel = `apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: bench-b-a}
spec: {entry: east2, exit: hk, route: [east2, hk]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: bench-echo}
spec: {chain: bench-b-a, protocol: tcp, listen: {port: 7099}, target: "echo.mcsbench.svc.cluster.local:7000"}
`

// rr compares time to first byte of new connections and request/response
// latency through the clusterset IP with the same through a hand-written
// Tunnel, from a pod in B, rounds alternating.
func rr(a, b cluster, rounds int) {
	setup(a, b)
	defer cleanup(a, b)
	a.apply("mcsbench", export)
	for _, c := range []cluster{a, b} {
		c.apply("edge", handTunnel)
	}
	paths := []struct{ name, addr string }{
		{"clusterset IP (echo.mcsbench.svc.clusterset.local)", "echo.mcsbench.svc.clusterset.local:7000"},
		{"hand-written Tunnel (bench-echo.edge.svc)", "bench-echo.edge.svc.cluster.local:7099"},
	}
	// Both answer before the rounds.
	for _, p := range paths {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if out, err := flowbench(b, "ttfb", "-addr", p.addr, "-n", "5"); err == nil && strings.Contains(out, "p50_us") {
				break
			} else if time.Now().After(deadline) {
				fatal(fmt.Errorf("%s does not answer: %v %s", p.name, err, out))
			}
			time.Sleep(2 * time.Second)
		}
	}
	results := map[string][]map[string]string{}
	for i := 0; i < rounds; i++ {
		for _, p := range paths {
			ttfb, err := flowbench(b, "ttfb", "-addr", p.addr, "-n", "300")
			if err != nil {
				fatal(err)
			}
			out, err := flowbench(b, "rr", "-addr", p.addr, "-clients", "50", "-duration", "10s", "-think", "50ms")
			if err != nil {
				fatal(err)
			}
			kv := keyValues(ttfb + "\n" + out)
			results[p.name] = append(results[p.name], kv)
			fmt.Printf("round %d %s: %s\n", i+1, p.name, strings.TrimSpace(strings.ReplaceAll(ttfb+" "+out, "\n", " ")))
		}
	}
	fmt.Println()
	fmt.Println("| path | first byte p50 µs | p99 µs | request/response p50 µs | p99 µs | requests |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, p := range paths {
		rs := results[p.name]
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", p.name, spread(rs, "ttfb_p50_us"), spread(rs, "ttfb_p99_us"), spread(rs, "rr_p50_us"), spread(rs, "rr_p99_us"), spread(rs, "rr_count"))
	}
}

// flowbench runs the flowbench image in a pod of B and returns its output.
func flowbench(b cluster, args ...string) (string, error) {
	name := fmt.Sprintf("fb-%d", time.Now().UnixNano()%1e9)
	return b.k(append([]string{"-n", "mcsbench", "run", name, "--rm", "-i", "--restart=Never", "--quiet",
		"--image", fbImg, "--image-pull-policy", "Never", "--"}, args...)...)
}

// keyValues reads flowbench's lines, "NAME key=value ...", as NAME_key.
func keyValues(s string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		for _, kv := range f[min(1, len(f)):] {
			if k, v, ok := strings.Cut(kv, "="); ok {
				out[f[0]+"_"+k] = v
			}
		}
	}
	return out
}

// spread is the range of a key's values over rounds ("a-b", or "a").
func spread(rs []map[string]string, key string) string {
	var vs []float64
	unit := ""
	for _, r := range rs {
		v := r[key]
		num := strings.TrimRight(v, "abcdefghijklmnopqrstuvwxyzµ/")
		unit = strings.TrimPrefix(v, num)
		f, err := strconv.ParseFloat(num, 64)
		if err == nil {
			vs = append(vs, f)
		}
	}
	if len(vs) == 0 {
		return "-"
	}
	sort.Float64s(vs)
	if vs[0] == vs[len(vs)-1] {
		return fmt.Sprintf("%g%s", vs[0], unit)
	}
	return fmt.Sprintf("%g-%g%s", vs[0], vs[len(vs)-1], unit)
}

func cleanup(a, b cluster) {
	for _, c := range []cluster{a, b} {
		c.k("delete", "namespace", "mcsbench", "--wait=false")
		c.k("-n", "edge", "delete", "tunnel", "bench-echo", "--ignore-not-found")
		c.k("-n", "edge", "delete", "chain", "bench-b-a", "--ignore-not-found")
	}
}

// scale exports n selectorless Services from A at once and waits until
// both clusters import them all and B's EndpointSlices list the way to each
// (the Tunnel B gave it, held by A too); then the operators' API writes and
// memory, from their metrics.
func scale(a, b cluster, n int) {
	for _, c := range []cluster{a, b} {
		namespace(c, "mcsscale")
	}
	defer func() {
		for _, c := range []cluster{a, b} {
			c.k("delete", "namespace", "mcsscale", "--wait=false")
		}
	}()
	before := map[string]operatorStats{a.name: stats(a), b.name: stats(b)}
	var y bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&y, "apiVersion: v1\nkind: Service\nmetadata: {name: s%04d}\nspec: {ports: [{name: tcp, port: 80}]}\n---\n", i)
		fmt.Fprintf(&y, "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {name: s%04d}\n---\n", i)
	}
	start := time.Now()
	a.put("create", "mcsscale", y.String())
	applied := time.Since(start)
	fmt.Printf("created %d Services and ServiceExports in A in %.1f s\n", n, applied.Seconds())
	var importsA, importsB, ways time.Duration
	for importsA == 0 || importsB == 0 || ways == 0 {
		if time.Since(start) > 30*time.Minute {
			fatal(fmt.Errorf("not converged in 30 minutes"))
		}
		if importsA == 0 && countImports(a) >= n {
			importsA = time.Since(start)
			fmt.Printf("A imports all %d: %.1f s\n", n, importsA.Seconds())
		}
		if importsB == 0 && countImports(b) >= n {
			importsB = time.Since(start)
			fmt.Printf("B imports all %d: %.1f s\n", n, importsB.Seconds())
		}
		if ways == 0 && countWays(b) >= n {
			ways = time.Since(start)
			fmt.Printf("B lists a ready way to all %d: %.1f s\n", n, ways.Seconds())
		}
		time.Sleep(2 * time.Second)
	}
	time.Sleep(30 * time.Second) // what the operators still write after
	after := map[string]operatorStats{a.name: stats(a), b.name: stats(b)}
	fmt.Println()
	fmt.Printf("| cluster | writes | writes per export | operator RSS before | after |\n|---|---|---|---|---|\n")
	for _, c := range []cluster{a, b} {
		w := after[c.name].writes - before[c.name].writes
		fmt.Printf("| %s | %d | %.1f | %.0f MB | %.0f MB |\n", c.name, w, float64(w)/float64(n), before[c.name].rss/1e6, after[c.name].rss/1e6)
	}
}

func countImports(c cluster) int {
	out, err := c.k("-n", "mcsscale", "get", "serviceimports", "-o", "jsonpath={range .items[*]}{.spec.ips[0]}{\"\\n\"}{end}")
	if err != nil {
		return 0
	}
	k := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			k++
		}
	}
	return k
}

// countWays counts the imports whose EndpointSlice from A lists a ready
// endpoint.
func countWays(c cluster) int {
	out, err := c.k("-n", "mcsscale", "get", "endpointslices", "-l", "multicluster.kubernetes.io/source-cluster=a", "-o", "json")
	if err != nil {
		return 0
	}
	var l struct {
		Items []struct {
			Metadata  struct{ Labels map[string]string }
			Endpoints []struct {
				Conditions struct{ Ready *bool }
			}
		}
	}
	if json.Unmarshal([]byte(out), &l) != nil {
		return 0
	}
	seen := map[string]bool{}
	for _, s := range l.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				seen[s.Metadata.Labels["multicluster.kubernetes.io/service-name"]] = true
			}
		}
	}
	return len(seen)
}

type operatorStats struct {
	writes int
	rss    float64
}

// stats sums the operator pods' API writes (client-go's requests by
// method) and resident memory, read through the API server's pod proxy.
func stats(c cluster) operatorStats {
	var s operatorStats
	pods := strings.Fields(c.must("-n", "hoplink-system", "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "jsonpath={.items[*].metadata.name}"))
	for _, p := range pods {
		out, err := c.k("get", "--raw", "/api/v1/namespaces/hoplink-system/pods/"+p+":8080/proxy/metrics")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(l, "rest_client_requests_total{"):
				if strings.Contains(l, `method="POST"`) || strings.Contains(l, `method="PUT"`) || strings.Contains(l, `method="PATCH"`) || strings.Contains(l, `method="DELETE"`) {
					f := strings.Fields(l)
					v, _ := strconv.ParseFloat(f[len(f)-1], 64)
					s.writes += int(v)
				}
			case strings.HasPrefix(l, "process_resident_memory_bytes "):
				v, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
				s.rss += v
			}
		}
	}
	return s
}
