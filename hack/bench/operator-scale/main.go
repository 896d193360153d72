// operator-scale measures the operator at scale against a real API server
// (envtest's kube-apiserver and etcd): it creates RelayNodes, Chains and
// Tunnels, waits until every one is Ready, and reports the time, the
// operator process's memory and the API writes it made, then touches every
// RelayNode without changing what it means and counts the writes again (the
// right answer is none). No kubelet runs here, so a stand-in reports one
// ready pod per relay DaemonSet, as the DaemonSet controller would.
//
//	KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go run ./hack/bench/operator-scale
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
)

func main() {
	relays := flag.Int("relays", 200, "RelayNodes")
	chains := flag.Int("chains", 1000, "Chains (routes of three relays)")
	tunnels := flag.Int("tunnels", 2000, "Tunnels, spread over the Chains")
	bin := flag.String("bin", "bin/hoplink", "hoplink binary to run as the operator")
	out := flag.String("out", "docs/benchmarks.md", "file whose operator-scale section is replaced (empty: print only)")
	qps := flag.String("qps", "", "the operator's --kube-api-qps (empty: its default)")
	flag.Parse()
	if err := run(*relays, *chains, *tunnels, *bin, *qps, *out); err != nil {
		log.Fatal(err)
	}
}

const ns = "scale"

func run(nRelays, nChains, nTunnels int, bin, qps, out string) error {
	env := &envtest.Environment{CRDDirectoryPaths: []string{"config/crd/bases"}, ErrorIfCRDPathMissing: true}
	// Every Tunnel has a Service: envtest's default range (a /24) holds 254.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("envtest (set KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)): %w", err)
	}
	defer env.Stop()
	cfg.QPS, cfg.Burst = 1000, 2000 // the load generator, not the operator
	user, err := env.AddUser(envtest.User{Name: "bench", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, _ := user.KubeConfig()
	dir, _ := os.MkdirTemp("", "operator-scale")
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kubeconfig, kc, 0o600)
	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range []string{"hoplink-system", ns} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			return err
		}
	}
	metricsAddr := "127.0.0.1:18980"
	args := []string{"operator", "--kubeconfig", kubeconfig, "--namespace", "hoplink-system", "--relay-image", "hoplink:bench",
		"--metrics-addr", metricsAddr, "--health-probe-addr", "0", "--log-level", "error"}
	if p := os.Getenv("OPERATOR_PPROF"); p != "" {
		args = append(args, "--pprof-addr", p)
	}
	if qps != "" {
		args = append(args, "--kube-api-qps", qps)
	}
	op := exec.Command(bin, args...)
	op.Stdout, op.Stderr = os.Stderr, os.Stderr
	op.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := op.Start(); err != nil {
		return err
	}
	defer func() { op.Process.Signal(syscall.SIGTERM); op.Wait() }()
	go standInKubelet(ctx, c)
	time.Sleep(2 * time.Second) // the operator's caches sync
	writes0, err := operatorWrites(metricsAddr)
	if err != nil {
		return err
	}

	start := time.Now()
	name := func(i int) string { return fmt.Sprintf("r%03d", i%nRelays) }
	for i := range nRelays {
		if err := c.Create(ctx, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name(i)}}); err != nil {
			return err
		}
	}
	for i := range nChains {
		entry, mid, exit := name(i), name(i*7+3), name(i*13+5)
		if mid == entry || mid == exit || exit == entry {
			entry, mid, exit = name(i), name(i+1), name(i+2)
		}
		ch := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("c%04d", i)},
			Spec: v1alpha1.ChainSpec{Entry: entry, Exit: exit, Via: []string{mid}, Route: []string{entry, mid, exit}}}
		if err := c.Create(ctx, ch); err != nil {
			return err
		}
	}
	for i := range nTunnels {
		t := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("t%04d", i)},
			Spec: v1alpha1.TunnelSpec{Chain: fmt.Sprintf("c%04d", i%nChains), Listen: &v1alpha1.TunnelListen{Port: int32(10000 + i)}, Target: "backend:80"}}
		if err := c.Create(ctx, t); err != nil {
			return err
		}
	}
	created := time.Since(start)
	var readyAt time.Duration
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(2 * time.Second) {
		r, ch, tn, err := countReady(ctx, c)
		if err != nil {
			return err
		}
		if r == nRelays && ch == nChains && tn == nTunnels {
			readyAt = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not Ready after 10 minutes: %d/%d relays, %d/%d chains, %d/%d tunnels", r, nRelays, ch, nChains, tn, nTunnels)
		}
	}
	rss, hwm := memory(op.Process.Pid)
	time.Sleep(5 * time.Second) // late requeues settle
	writes1, _ := operatorWrites(metricsAddr)

	// Touch every RelayNode: a reconcile each, and nothing to change.
	for i := range nRelays {
		var rn v1alpha1.RelayNode
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name(i)}, &rn); err != nil {
			return err
		}
		rn.Annotations = map[string]string{"bench/touched": "1"}
		if err := c.Update(ctx, &rn); err != nil {
			return err
		}
	}
	time.Sleep(10 * time.Second)
	writes2, _ := operatorWrites(metricsAddr)

	objects := nRelays + nChains + nTunnels
	table := fmt.Sprintf(`<!-- operator-scale:begin -->
Measured %s on this machine (%d cores), by `+"`go run ./hack/bench/operator-scale%s`"+` (envtest kube-apiserver and etcd
on the same cores; a stand-in reports one ready pod per relay DaemonSet).

| what | figure |
|---|---|
| objects created | %d RelayNodes, %d Chains, %d Tunnels (%d), in %.1f s |
| all Ready, from the first create | %.1f s |
| operator RSS when all Ready (peak) | %.0f MiB (%.0f MiB) |
| operator API writes to reach Ready | %d (%.1f per object; a RelayNode makes 5 objects and its status) |
| operator API writes after touching every RelayNode (%d reconciles, nothing to change) | %d |
<!-- operator-scale:end -->
`, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), map[bool]string{true: "", false: " -qps " + qps}[qps == ""], nRelays, nChains, nTunnels, objects, created.Seconds(),
		readyAt.Seconds(), rss, hwm, writes1-writes0, float64(writes1-writes0)/float64(objects), nRelays, writes2-writes1)
	fmt.Print(table)
	if out != "" {
		return replaceSection(out, "operator-scale", table)
	}
	return nil
}

// standInKubelet marks every relay DaemonSet as having one ready pod, and
// makes that pod, as the DaemonSet controller and a kubelet would.
func standInKubelet(ctx context.Context, c client.Client) {
	done := map[string]bool{}
	for ctx.Err() == nil {
		var dss appsv1.DaemonSetList
		if err := c.List(ctx, &dss, client.InNamespace(ns)); err == nil {
			for i := range dss.Items {
				ds := &dss.Items[i]
				if done[ds.Name] {
					continue
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ds.Name + "-0", Labels: ds.Spec.Template.Labels},
					Spec: *ds.Spec.Template.Spec.DeepCopy()}
				if err := c.Create(ctx, pod); err != nil && !strings.Contains(err.Error(), "already exists") {
					continue
				}
				pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.244.0.1",
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
				if c.Status().Update(ctx, pod) != nil {
					continue
				}
				ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
				if c.Status().Update(ctx, ds) == nil {
					done[ds.Name] = true
				}
			}
		}
		// Listing 200 DaemonSets costs the shared API server; poll gently.
		time.Sleep(time.Second)
	}
}

func countReady(ctx context.Context, c client.Client) (relays, chains, tunnels int, err error) {
	var rl v1alpha1.RelayNodeList
	var cl v1alpha1.ChainList
	var tl v1alpha1.TunnelList
	for _, l := range []client.ObjectList{&rl, &cl, &tl} {
		if err = c.List(ctx, l, client.InNamespace(ns)); err != nil {
			return
		}
	}
	for _, o := range rl.Items {
		if meta.IsStatusConditionTrue(o.Status.Conditions, "Ready") {
			relays++
		}
	}
	for _, o := range cl.Items {
		if meta.IsStatusConditionTrue(o.Status.Conditions, "Ready") {
			chains++
		}
	}
	for _, o := range tl.Items {
		if meta.IsStatusConditionTrue(o.Status.Conditions, "Ready") {
			tunnels++
		}
	}
	return
}

var writeLine = regexp.MustCompile(`^rest_client_requests_total\{.*method="(POST|PUT|PATCH|DELETE)".*\} (\S+)$`)

// operatorWrites sums the operator's own count of write requests (client-go's
// rest_client_requests_total), so the load generator's writes are not in it.
func operatorWrites(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := writeLine.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			total += int(v)
		}
	}
	return total, sc.Err()
}

// memory returns a process's resident and peak resident memory in MiB.
func memory(pid int) (rss, hwm float64) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmRSS:":
				rss = kb / 1024
			case "VmHWM:":
				hwm = kb / 1024
			}
		}
	}
	return
}

// replaceSection swaps the text between <!-- NAME:begin --> and <!-- NAME:end -->.
func replaceSection(file, name, section string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s := string(data)
	b, e := strings.Index(s, "<!-- "+name+":begin -->"), strings.Index(s, "<!-- "+name+":end -->")
	if b < 0 || e < 0 {
		return fmt.Errorf("%s has no %s markers", file, name)
	}
	e += len("<!-- " + name + ":end -->\n")
	return os.WriteFile(file, []byte(s[:b]+section+s[e:]), 0o644)
}
