// operator-scale measures the operator at scale against a real API server
// (envtest's kube-apiserver and etcd): it creates RelayNodes (some of them
// sidecar relays, with labelled pods), Chains and Tunnels, waits until every
// one is Ready, and reports the time, the CPU and memory of the operator and
// of the API server, and the API writes in a steady state. Hollow relays
// watch what real relays watch (relay/kube's View, the same selectors) and
// relay nothing: what each receives is counted, and how long a Chain edit
// takes to reach its relays. No kubelet or controller-manager runs here, so
// stand-ins report the relay DaemonSets' and the sidecar pods' readiness and
// write the sidecar Services' EndpointSlices, as those would.
//
//	make build && KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go run ./hack/bench/operator-scale -size small
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/manifest"
)

// size is one run's numbers of objects.
type size struct {
	name string // the -size, with any flags that changed it

	relays, sidecarRelays, pods, chains, tunnels, hollow int
}

// sizes: full is issue 31's; small runs in a few minutes.
var sizes = map[string]size{
	"full":  {relays: 1000, sidecarRelays: 500, pods: 5000, chains: 10000, tunnels: 10000, hollow: 200},
	"small": {relays: 100, sidecarRelays: 50, pods: 500, chains: 1000, tunnels: 1000, hollow: 50},
}

func main() {
	ctrllog.SetLogger(logr.Discard()) // the hollow relays' caches log through it
	sizeName := flag.String("size", "small", "small or full; the flags below override its numbers")
	relays := flag.Int("relays", 0, "RelayNodes, sidecar ones included")
	sidecarRelays := flag.Int("sidecar-relays", 0, "of those, sidecar RelayNodes")
	pods := flag.Int("pods", 0, "sidecar pods, spread over the sidecar RelayNodes")
	chains := flag.Int("chains", 0, "Chains (routes of three relays)")
	tunnels := flag.Int("tunnels", 0, "Tunnels, spread over the Chains")
	hollow := flag.Int("hollow", 0, "hollow relays (a sample of the relays, the edited Chain's among them)")
	steady := flag.Duration("steady", time.Minute, "how long steady-state writes are counted")
	bin := flag.String("bin", "bin/hoplink", "hoplink binary to run as the operator")
	out := flag.String("out", "docs/benchmarks.md", "file whose operator-scale-SIZE section is replaced (empty: print only)")
	qps := flag.String("qps", "", "the operator's --kube-api-qps (empty: its default)")
	profileDir := flag.String("profile", "", "save CPU profiles of kube-apiserver (and of the operator, with OPERATOR_PPROF=ADDR) into this directory, from the first create")
	profileSecs := flag.Int("profile-seconds", 60, "how long the -profile profiles run")
	flag.Parse()
	sz, ok := sizes[*sizeName]
	if !ok {
		log.Fatalf("-size %q: small or full", *sizeName)
	}
	custom := false
	sz.name = *sizeName
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "size" && f.Name != "bin" && f.Name != "out" && f.Name != "profile" && f.Name != "profile-seconds" {
			if f.Name != "qps" {
				sz.name += " -" + f.Name + " " + f.Value.String()
			}
		}
		p := map[string]*int{"relays": &sz.relays, "sidecar-relays": &sz.sidecarRelays, "pods": &sz.pods,
			"chains": &sz.chains, "tunnels": &sz.tunnels, "hollow": &sz.hollow}[f.Name]
		if p != nil {
			*p = *map[string]*int{"relays": relays, "sidecar-relays": sidecarRelays, "pods": pods,
				"chains": chains, "tunnels": tunnels, "hollow": hollow}[f.Name]
			custom = true
		}
	})
	section := "operator-scale-" + *sizeName
	if custom {
		section = "" // a size of its own is printed, not written over a named one
	}
	prof := profiling{dir: *profileDir, seconds: *profileSecs}
	if err := run(sz, *steady, *bin, *qps, *out, section, prof); err != nil {
		log.Fatal(err)
	}
}

const ns = "scale"

// profiling says where to save CPU profiles ("": none) and for how long.
type profiling struct {
	dir     string
	seconds int
}

func run(sz size, steady time.Duration, bin, qps, out, section string, prof profiling) error {
	env := &envtest.Environment{CRDDirectoryPaths: []string{"config/crd/bases"}, ErrorIfCRDPathMissing: true}
	// Every Tunnel has a Service: envtest's default range (a /24) holds 254.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("envtest (set KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)): %w", err)
	}
	defer env.Stop()
	// Interrupted, it stops the API server and etcd it started, which
	// would outlive it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		env.Stop()
		os.Exit(1)
	}()
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
		// Relays on their nodes' network, as by default: the namespace allows it.
		labels := map[string]string{"hoplink.dev/privileged-relays": "true"}
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: labels}}); err != nil {
			return err
		}
	}
	apiserver, etcd := children("kube-apiserver"), children("etcd")
	metricsAddr := "127.0.0.1:18980"
	args := []string{"operator", "--kubeconfig", kubeconfig, "--namespace", "hoplink-system", "--relay-image", "hoplink:bench",
		"--metrics-addr", metricsAddr, "--health-probe-addr", "0", "--log-level", "error"}
	operatorPprof := os.Getenv("OPERATOR_PPROF")
	if operatorPprof != "" {
		args = append(args, "--pprof-addr", operatorPprof)
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
	watched, err := watchCache(ctx, cfg)
	if err != nil {
		return err
	}
	go standInKubelet(ctx, c, watched)
	go standInSlices(ctx, c, watched)
	time.Sleep(2 * time.Second) // the operator's caches sync
	writes0, err := operatorWrites(metricsAddr)
	if err != nil {
		return err
	}
	bd0, _ := breakdown(metricsAddr)
	lim0 := limits(metricsAddr)
	procs := map[string]int{"operator": op.Process.Pid, "kube-apiserver": apiserver, "etcd": etcd, "bench": os.Getpid()}
	cpu0 := cpuAll(procs)
	load0 := loadAverage()

	start := time.Now()
	profiles(ctx, cfg, operatorPprof, prof.dir, prof.seconds)
	name := func(i int) string {
		i %= sz.relays
		if i < sz.sidecarRelays {
			return fmt.Sprintf("s%04d", i)
		}
		return fmt.Sprintf("r%04d", i)
	}
	// Each kind in parallel, as an apply of many objects would send them:
	// one request at a time, 26,000 objects took 526 s of the time to
	// Ready, and that measured the load generator, not the operator.
	if err := parallel(sz.relays, func(i int) error {
		rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name(i)}}
		if i < sz.sidecarRelays {
			rn.Spec.Sidecar = &v1alpha1.RelaySidecar{}
		}
		return c.Create(ctx, rn)
	}); err != nil {
		return err
	}
	if err := parallel(sz.pods, func(i int) error {
		return createSidecarPod(ctx, c, name(i%max(sz.sidecarRelays, 1)), i)
	}); err != nil {
		return err
	}
	chainRelays := func(i int) []string {
		entry, mid, exit := name(i), name(i*7+3), name(i*13+5)
		if mid == entry || mid == exit || exit == entry {
			entry, mid, exit = name(i), name(i+1), name(i+2)
		}
		return []string{entry, mid, exit}
	}
	if err := parallel(sz.chains, func(i int) error {
		r := chainRelays(i)
		return c.Create(ctx, &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("c%05d", i)},
			Spec: v1alpha1.ChainSpec{Entry: r[0], Exit: r[2], Via: []string{r[1]}, Route: r}})
	}); err != nil {
		return err
	}
	if err := parallel(sz.tunnels, func(i int) error {
		return c.Create(ctx, &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("t%05d", i)},
			Spec: v1alpha1.TunnelSpec{Chain: fmt.Sprintf("c%05d", i%sz.chains), Listen: &v1alpha1.TunnelListen{Port: int32(10000 + i%50000)}, Target: "backend:80"}})
	}); err != nil {
		return err
	}
	created := time.Since(start)
	log.Printf("created in %.1f s", created.Seconds())
	var readyAt time.Duration
	for deadline := time.Now().Add(40 * time.Minute); ; time.Sleep(5 * time.Second) {
		r, ch, tn, why, err := countReady(ctx, watched)
		if err != nil {
			return err
		}
		log.Printf("%.0f s: Ready %d/%d relays, %d/%d chains, %d/%d tunnels (%s); load %s", time.Since(start).Seconds(), r, sz.relays, ch, sz.chains, tn, sz.tunnels, why, loadAverage())
		if r == sz.relays && ch == sz.chains && tn == sz.tunnels {
			readyAt = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not Ready after 40 minutes: %d/%d relays, %d/%d chains, %d/%d tunnels", r, sz.relays, ch, sz.chains, tn, sz.tunnels)
		}
	}
	cpuReady := cpuAll(procs)
	loadReady := loadAverage()
	rss, hwm := memory(op.Process.Pid)
	writes1, _ := operatorWrites(metricsAddr)
	bd1, _ := breakdown(metricsAddr)
	lim1 := limits(metricsAddr)

	// Hollow relays: the edited Chain's, the relay it gains, and a sample.
	edited := "c00000"
	joining := name(sz.relays / 2)
	if slices.Contains(chainRelays(0), joining) {
		joining = name(sz.relays/2 + 1)
	}
	sample := append(chainRelays(0), joining)
	for i := 0; len(sample) < sz.hollow && i < sz.relays; i++ {
		if n := name(i * 7919 % sz.relays); !slices.Contains(sample, n) {
			sample = append(sample, n)
		}
	}
	hollowStart := time.Now()
	hs, err := startHollow(ctx, cfg, sample, ns+"/"+edited)
	if err != nil {
		return err
	}
	log.Printf("%d hollow relays synced in %.1f s", len(hs), time.Since(hollowStart).Seconds())

	// Steady: nothing changes, and the writes are counted.
	time.Sleep(10 * time.Second) // late requeues settle
	api0, err := apiWrites(ctx, cfg)
	if err != nil {
		return err
	}
	opW0, _ := operatorWrites(metricsAddr)
	bdS0, _ := breakdown(metricsAddr)
	cpuS0 := cpuAll(procs)
	time.Sleep(steady)
	api1, _ := apiWrites(ctx, cfg)
	opW1, _ := operatorWrites(metricsAddr)
	bdS1, _ := breakdown(metricsAddr)
	cpuS1 := cpuAll(procs)
	perMin := func(n float64) float64 { return n / steady.Minutes() }

	// What each hollow relay received, from its start to the steady state's end.
	var rows []hollowRow
	for _, h := range hs {
		rows = append(rows, h.row(ctx))
	}

	// A Chain edit: the relay joins Chain edited; then leaves it.
	before := chainRelays(0)
	after := []string{before[0], before[1], joining, before[2]}
	join, err := editLatency(ctx, c, hs, edited, after, append(slices.Clone(before), joining))
	if err != nil {
		return err
	}
	leave, err := editLatency(ctx, c, hs, edited, before, append(slices.Clone(before), joining))
	if err != nil {
		return err
	}

	report := formatReport(sz, qps, created, readyAt, [2]string{load0, loadReady}, [2][3]float64{lim0, lim1}, cpu0, cpuReady, cpuS0, cpuS1, rss, hwm, writes1-writes0,
		perMin(float64(api1.total-api0.total)), perMin(float64(api1.leases-api0.leases)), perMin(float64(opW1-opW0)),
		steady, rows, joining, edited, join, leave, time.Since(hollowStart), [4]map[string]float64{bd0, bd1, bdS0, bdS1})
	if section != "" {
		report = "<!-- " + section + ":begin -->\n" + report + "<!-- " + section + ":end -->\n"
	}
	fmt.Print(report)
	if out != "" && section != "" {
		return replaceSection(out, section, report)
	}
	return nil
}

// creators is how many requests the load generator has in flight.
const creators = 16

// parallel runs create(0..n-1) on creators goroutines and returns the
// first error.
func parallel(n int, create func(i int) error) error {
	var next atomic.Int64
	errs := make([]error, creators)
	var wg sync.WaitGroup
	for w := range creators {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := create(i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// createSidecarPod makes a pod labelled for sidecar RelayNode relay with a
// ready injected relay, as the webhook and a kubelet would.
func createSidecarPod(ctx context.Context, c client.Client, relay string, i int) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-pod-%05d", relay, i),
		Labels: map[string]string{controllers.LabelRelayNode: relay}, Annotations: map[string]string{annotationVersion: "bench"}},
		Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: sidecarName, Image: "hoplink:bench"}},
			Containers: []corev1.Container{{Name: "app", Image: "app:bench"}}}}
	if err := c.Create(ctx, pod); err != nil {
		return err
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&255, i&255),
		Conditions:            []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		InitContainerStatuses: []corev1.ContainerStatus{{Name: sidecarName, Ready: true}}}
	return c.Status().Update(ctx, pod)
}

// editLatency sets Chain name's route to route and returns, for each
// hollow relay of want, how long until it acted on the new route.
func editLatency(ctx context.Context, c client.Client, hs []*hollow, name string, route, want []string) (map[string]time.Duration, error) {
	edit := time.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ch v1alpha1.Chain
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ch); err != nil {
			return err
		}
		ch.Spec.Route, ch.Spec.Via = route, route[1:len(route)-1]
		return c.Update(ctx, &ch)
	})
	if err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	for deadline := time.Now().Add(2 * time.Minute); len(out) < len(want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return out, fmt.Errorf("after 2 minutes only %v acted on the edit of Chain %s", out, name)
		}
		for _, h := range hs {
			if _, done := out[h.name]; done || !slices.Contains(want, h.name) {
				continue
			}
			// A relay the route names acts on it; one that left, when
			// the Chain is no longer its own.
			if at, ok := h.tookRoute(route, edit); ok {
				out[h.name] = at.Sub(edit)
			}
		}
	}
	return out, nil
}

// limits is limiterWait's figures, zeros when the operator says none.
func limits(addr string) [3]float64 {
	s, r, w, _ := limiterWait(addr)
	return [3]float64{s, r, w}
}

// countReady counts the Ready objects, and says why one is not.
func countReady(ctx context.Context, c client.Reader) (relays, chains, tunnels int, why string, err error) {
	var rl v1alpha1.RelayNodeList
	var cl v1alpha1.ChainList
	var tl v1alpha1.TunnelList
	for _, l := range []client.ObjectList{&rl, &cl, &tl} {
		if err = c.List(ctx, l, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
			return
		}
	}
	count := func(name string, conds []metav1.Condition, n *int) {
		if meta.IsStatusConditionTrue(conds, "Ready") {
			*n++
		} else if why == "" {
			why = name + ": no Ready condition"
			if c := meta.FindStatusCondition(conds, "Ready"); c != nil {
				why = name + ": " + c.Message
			}
		}
	}
	for _, o := range rl.Items {
		count(o.Name, o.Status.Conditions, &relays)
	}
	for _, o := range cl.Items {
		// A Chain counts once its relays act on it too: Ready is
		// written before the member labels settle (joining, then
		// joined joinDelay later), and counting it then left those
		// writes to a "steady state" after Ready.
		if p := unsettled(&o); p != "" {
			if why == "" {
				why = o.Name + ": " + p
			}
			continue
		}
		count(o.Name, o.Status.Conditions, &chains)
	}
	for _, o := range tl.Items {
		count(o.Name, o.Status.Conditions, &tunnels)
	}
	return
}

// unsettled says what is left of publishing a Chain to its relays: every
// relay its spec names labelled joined, no other; "" when nothing is.
func unsettled(ch *v1alpha1.Chain) string {
	named := manifest.Named(ch)
	n := 0
	for k, v := range ch.Labels {
		relay, ok := strings.CutPrefix(k, v1alpha1.LabelMemberPrefix)
		if !ok || relay == "" {
			continue
		}
		n++
		switch {
		case !slices.Contains(named, relay):
			return "relay " + relay + " still labelled, leaving"
		case v == v1alpha1.MemberJoining:
			return "relay " + relay + " joining"
		}
	}
	if n != len(named) {
		return "member labels not written yet"
	}
	return ""
}

// formatReport is the Markdown table of one run.
func formatReport(sz size, qps string, created, readyAt time.Duration, load [2]string, lim [2][3]float64, cpu0, cpuReady, cpuS0, cpuS1 map[string]float64, rss, hwm float64,
	readyWrites int, apiPerMin, leasesPerMin, opPerMin float64, steady time.Duration, rows []hollowRow, joinName, editedName string, join, leave map[string]time.Duration, hollowFor time.Duration, bd [4]map[string]float64) string {
	var b strings.Builder
	flags := ""
	if qps != "" {
		flags = " -qps " + qps
	}
	fmt.Fprintf(&b, "Measured %s on this machine (%d cores, shared), by `go run ./hack/bench/operator-scale -size %s%s`: envtest's kube-apiserver and etcd, the operator, the stand-ins and %d hollow relays on the same cores.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), sz.name, flags, len(rows))
	objects := sz.relays + sz.pods + sz.chains + sz.tunnels
	b.WriteString("| what | figure |\n|---|---|\n")
	fmt.Fprintf(&b, "| objects created | %d RelayNodes (%d sidecar), %d sidecar pods, %d Chains, %d Tunnels (%d), in %.1f s |\n",
		sz.relays, sz.sidecarRelays, sz.pods, sz.chains, sz.tunnels, objects, created.Seconds())
	fmt.Fprintf(&b, "| all Ready, from the first create (Chains: and their member labels settled) | %.1f s |\n", readyAt.Seconds())
	fmt.Fprintf(&b, "| the host's load average (1, 5, 15 min) at the first create; at Ready | %s; %s |\n", load[0], load[1])
	fmt.Fprintf(&b, "| CPU seconds to reach Ready: operator, kube-apiserver, etcd; the bench (load generator, stand-ins, its watches) | %.0f, %.0f, %.0f; %.0f |\n",
		cpuReady["operator"]-cpu0["operator"], cpuReady["kube-apiserver"]-cpu0["kube-apiserver"], cpuReady["etcd"]-cpu0["etcd"], cpuReady["bench"]-cpu0["bench"])
	if w := float64(readyWrites); w > 0 {
		fmt.Fprintf(&b, "| kube-apiserver CPU per operator write (all it served, divided) | %.1f ms |\n", 1000*(cpuReady["kube-apiserver"]-cpu0["kube-apiserver"])/w)
	}
	fmt.Fprintf(&b, "| operator RSS when all Ready (peak) | %.0f MiB (%.0f MiB) |\n", rss, hwm)
	fmt.Fprintf(&b, "| operator API writes to reach Ready | %d (%.1f per object) |\n", readyWrites, float64(readyWrites)/float64(objects))
	fmt.Fprintf(&b, "| operator requests' wait for its own rate limit (`--kube-api-qps`) to reach Ready: in all; requests that waited over 25 ms | %.1f s; %.0f of %.0f |\n",
		lim[1][0]-lim[0][0], lim[1][2]-lim[0][2], lim[1][1]-lim[0][1])
	fmt.Fprintf(&b, "| steady state (%s, after Ready): API server writes a minute, all clients, leases aside | %.1f (leases: %.1f) |\n", steady, apiPerMin-leasesPerMin, leasesPerMin)
	fmt.Fprintf(&b, "| &nbsp; by resource and verb | %s |\n", diffLine(bd[0], bd[1], false, 1))
	fmt.Fprintf(&b, "| reconciles to reach Ready, by controller and result | %s |\n", diffLine(bd[0], bd[1], true, 1))
	fmt.Fprintf(&b, "| steady state: operator writes a minute | %.1f |\n", opPerMin)
	fmt.Fprintf(&b, "| &nbsp; by resource and verb, a minute | %s |\n", diffLine(bd[2], bd[3], false, steady.Minutes()))
	fmt.Fprintf(&b, "| &nbsp; reconciles a minute, by controller and result | %s |\n", diffLine(bd[2], bd[3], true, steady.Minutes()))
	fmt.Fprintf(&b, "| steady state: CPU used a second: operator, kube-apiserver, etcd | %.2f, %.2f, %.2f |\n",
		(cpuS1["operator"]-cpuS0["operator"])/steady.Seconds(), (cpuS1["kube-apiserver"]-cpuS0["kube-apiserver"])/steady.Seconds(), (cpuS1["etcd"]-cpuS0["etcd"])/steady.Seconds())
	sort.Slice(rows, func(i, j int) bool { return rows[i].objs < rows[j].objs })
	pick := func(q float64) hollowRow { return rows[min(len(rows)-1, int(q*float64(len(rows))))] }
	fmt.Fprintf(&b, "| hollow relays: what each received in its first %.0f s (list, watch and a steady state) | |\n", hollowFor.Seconds())
	for _, q := range []struct {
		name string
		q    float64
	}{{"least", 0}, {"median", 0.5}, {"most", 1}} {
		r := pick(q.q)
		fmt.Fprintf(&b, "| &nbsp; %s: relay %s, in %d Chains | %.1f KiB of objects (%.1f KiB with API discovery), %d watch events; caches %d Chains, %d Tunnels, %d RelayNodes, %d EndpointSlices |\n",
			q.name, r.name, r.chains, float64(r.objs)/1024, float64(r.bytes)/1024, r.events, r.cached["Chain"], r.cached["Tunnel"], r.cached["RelayNode"], r.cached["EndpointSlice"])
	}
	var per []float64
	for _, r := range rows {
		if r.chains > 0 {
			per = append(per, float64(r.objs)/float64(r.chains))
		}
	}
	slices.Sort(per)
	if len(per) > 0 {
		fmt.Fprintf(&b, "| &nbsp; bytes of objects received per Chain a relay is in (median; max) | %.1f KiB; %.1f KiB |\n", per[len(per)/2]/1024, per[len(per)-1]/1024)
	}
	fmt.Fprintf(&b, "| relay %s joins Chain %s: until each of its relays acts on the edit (the joining one first; the others after joinDelay, 2 s) | %s |\n", joinName, editedName, latencies(join))
	fmt.Fprintf(&b, "| it leaves again: until each acts (the leaving one keeps the Chain for joinDelay) | %s |\n", latencies(leave))
	return b.String()
}

func latencies(m map[string]time.Duration) string {
	var parts []string
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %.2f s", n, m[n].Seconds()))
	}
	return strings.Join(parts, ", ")
}
