package systest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/observe"
)

// TestOperatorAndKubeRelays runs `hoplink operator` and four `hoplink relay
// --kube` processes (standing in for the relay pods, since no kubelet runs
// here) against a real API server, applies config/samples, and sends TCP
// through the chain; then it deletes the Tunnel and adds another, and the
// relays follow without a restart.
func TestOperatorAndKubeRelays(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	c := cluster.Start(t, "a")
	cfg, k8s, dir := c.Cfg, c.K8s, c.Dir
	ctx := context.Background()
	const ns = "edge"
	bin := procs.Hoplink(t)
	running := map[string]*exec.Cmd{}
	start := func(name string, args ...string) { running[name] = c.Run(t, bin, name, args...) }
	operator := c.Operator(t, bin, "--log-level", "debug")

	// The samples as a user would apply them, made to run on one host: each
	// relay on its own loopback port, published as spec.endpoints.
	set := readSamples(t, "../config/samples")
	echoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoLn.Close()
	go testutil.ServeSinkThenSource(echoLn)
	for _, rn := range set.Relays {
		port := testutil.FreePort(t)
		rn.Namespace, rn.Spec.Listen.Address, rn.Spec.Listen.Port = ns, "127.0.0.1", int32(port)
		rn.Spec.Endpoints = []string{fmt.Sprintf("127.0.0.1:%d", port)}
		cluster.Create(t, k8s, rn)
	}
	for _, c := range set.Chains {
		c.Namespace = ns
		cluster.Create(t, k8s, c)
	}
	web := set.Tunnels[0]
	web.Namespace, web.Spec.Listen.Address, web.Spec.Target = ns, "127.0.0.1", echoLn.Addr().String()
	web.Spec.Listen.Port = int32(testutil.FreePort(t))
	cluster.Create(t, k8s, web)
	// Each relay runs as its own ServiceAccount, so the Role the operator
	// wrote is what it gets, as in a pod.
	laMetrics := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	for _, rn := range set.Relays {
		relayConfig := cluster.RelayKubeconfig(t, cfg, dir, ns, v1alpha1.RelayObjectName(rn.Name))
		args := []string{"relay", "--kube", "--name", rn.Name, "--namespace", ns, "--kubeconfig", relayConfig, "--log-level", "debug"}
		if rn.Name == "la" {
			args = append(args, "--metrics-addr", laMetrics)
		}
		start("relay-"+rn.Name, args...)
	}

	webAddr := fmt.Sprintf("127.0.0.1:%d", web.Spec.Listen.Port)
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", webAddr, 5*time.Second) }
	testutil.WaitFor(t, "8 MiB through hk -> seattle -> la -> useast", func() error { return testutil.TCPExchange(dial, 8<<20) })
	checkKubeStatus(t, bin, c.Kubeconfig, ns, len(set.Relays))

	for _, rn := range set.Relays {
		var ds appsv1.DaemonSet
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RelayObjectName(rn.Name)}, &ds); err != nil {
			t.Errorf("operator made no DaemonSet for %s: %v", rn.Name, err)
		}
	}
	var svc corev1.Service
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "web"}, &svc); err != nil {
		t.Errorf("operator made no Service for Tunnel web: %v", err)
	}

	// Deleting the Tunnel closes its listener on the entry relay.
	if err := k8s.Delete(ctx, web); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "Tunnel listener closed", func() error {
		c, err := net.DialTimeout("tcp", webAddr, time.Second)
		if err == nil {
			c.Close()
			return errors.New("still accepting")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		return nil
	})

	// A new Tunnel opens on the running relays.
	api := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api"}, Spec: v1alpha1.TunnelSpec{
		Chain: "to-east", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(testutil.FreePort(t))}, Target: echoLn.Addr().String(),
	}}
	cluster.Create(t, k8s, api)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", api.Spec.Listen.Port)
	testutil.WaitFor(t, "new Tunnel carries traffic", func() error {
		return testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", apiAddr, 5*time.Second) }, 1<<20)
	})

	// A relay joins a chain while flows cross it: la, which knew nothing of
	// chain short (its relays watch only their own chains), gets it with
	// its Tunnel before hk routes through it, and no flow fails.
	short := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "short"}, Spec: v1alpha1.ChainSpec{
		Entry: "hk", Exit: "useast", Route: []string{"hk", "useast"}}}
	cluster.Create(t, k8s, short)
	shortTunnel := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "short"}, Spec: v1alpha1.TunnelSpec{
		Chain: "short", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(testutil.FreePort(t))}, Target: echoLn.Addr().String(),
	}}
	cluster.Create(t, k8s, shortTunnel)
	shortDial := func() (net.Conn, error) {
		return net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", shortTunnel.Spec.Listen.Port), 5*time.Second)
	}
	testutil.WaitFor(t, "chain short carries traffic", func() error { return testutil.TCPExchange(shortDial, 64<<10) })
	laKnows := func(want string) error {
		m, err := httpGet("http://" + laMetrics + "/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(m, want) {
			return fmt.Errorf("la's metrics lack %s", want)
		}
		return nil
	}
	if laKnows(`chain="edge/short"`) == nil {
		t.Error("la knows chain short, which it is no member of")
	}
	stopFlows := make(chan struct{})
	flowErrs := make(chan error, 1)
	go func() {
		var errs []error
		for n := 0; ; n++ {
			select {
			case <-stopFlows:
				flowErrs <- errors.Join(errs...)
				return
			default:
			}
			if err := testutil.TCPExchange(shortDial, 16<<10); err != nil {
				errs = append(errs, fmt.Errorf("flow %d: %w", n, err))
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(short), short); err != nil {
		t.Fatal(err)
	}
	short.Spec.Via, short.Spec.Route = []string{"la"}, []string{"hk", "la", "useast"}
	if err := k8s.Update(ctx, short); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "la carries chain short's flows", func() error {
		return laKnows(`hoplink_tunnel_flows_total{relay="la",role="middle",tunnel="edge/short"}`)
	})
	time.Sleep(time.Second)
	close(stopFlows)
	if err := <-flowErrs; err != nil {
		t.Errorf("flows failed while la joined chain short: %v", err)
	}

	// A Tunnel whose port another process holds on the entry's host: the
	// relay serves the others, and the operator says which relay and port
	// in the Tunnel's conditions, from the relay's own report.
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	takenPort := holder.Addr().(*net.TCPAddr).Port
	taken := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"}, Spec: v1alpha1.TunnelSpec{
		Chain: "to-east", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(takenPort)}, Target: echoLn.Addr().String(),
	}}
	cluster.Create(t, k8s, taken)
	testutil.WaitFor(t, "the taken port in the Tunnel's conditions", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(taken), taken); err != nil {
			return err
		}
		l := meta.FindStatusCondition(taken.Status.Conditions, "Listening")
		r := meta.FindStatusCondition(taken.Status.Conditions, "Ready")
		if l == nil || r == nil || l.Status != metav1.ConditionFalse || r.Status != metav1.ConditionFalse ||
			!strings.Contains(l.Message, "relay hk") || !strings.Contains(l.Message, fmt.Sprintf("127.0.0.1:%d", takenPort)) ||
			!strings.Contains(l.Message, "address already in use") {
			return fmt.Errorf("conditions %+v", taken.Status.Conditions)
		}
		return nil
	})
	t.Logf("the Tunnel's Listening condition: %s", meta.FindStatusCondition(taken.Status.Conditions, "Listening").Message)
	var evs corev1.EventList
	if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool { return e.Reason == "ListenFailed" && e.InvolvedObject.Name == "taken" }) {
		t.Error("no ListenFailed Event on the Tunnel")
	}
	// The other Tunnels of hk go on.
	if err := testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", apiAddr, 5*time.Second) }, 1<<20); err != nil {
		t.Fatalf("another Tunnel of the relay with a taken port: %v", err)
	}
	holder.Close()
	testutil.WaitFor(t, "the Tunnel listens once its port is free", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(taken), taken); err != nil {
			return err
		}
		if l := meta.FindStatusCondition(taken.Status.Conditions, "Listening"); l == nil || l.Status != metav1.ConditionTrue {
			return fmt.Errorf("conditions %+v", taken.Status.Conditions)
		}
		return nil
	})

	// A sum chain over the same relays: the operator measures them through
	// their admin API and writes the route; the relays take it from the
	// Chain's status and carry the Tunnel's flows on it.
	fast := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fast"}, Spec: v1alpha1.ChainSpec{
		Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}, Mode: v1alpha1.ModeSum,
		Probe: &v1alpha1.ProbeSpec{Interval: &metav1.Duration{Duration: 500 * time.Millisecond}},
	}}
	cluster.Create(t, k8s, fast)
	routed := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "routed"}, Spec: v1alpha1.TunnelSpec{
		Chain: "fast", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(testutil.FreePort(t))}, Target: echoLn.Addr().String(),
	}}
	cluster.Create(t, k8s, routed)
	testutil.WaitFor(t, "the route controller routes the sum chain", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(fast), fast); err != nil {
			return err
		}
		if len(fast.Status.Route) < 2 || fast.Status.Latency == nil || fast.Status.Latency.Measured == nil {
			return fmt.Errorf("status %+v", fast.Status)
		}
		return nil
	})
	status, _ := yaml.Marshal(fast.Status)
	t.Logf("sum chain routed; its status:\n%s", status)
	routedAddr := fmt.Sprintf("127.0.0.1:%d", routed.Spec.Listen.Port)
	testutil.WaitFor(t, "the routed chain carries traffic", func() error {
		return testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", routedAddr, 5*time.Second) }, 1<<20)
	})

	// With the operator stopped, the relays keep routing: when the route in
	// status crosses a relay that died, the entry takes the best candidate
	// of the status that avoids it, without waiting for the operator.
	operator.Process.Signal(syscall.SIGTERM)
	procs.Wait(operator)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(fast), fast); err != nil {
		t.Fatal(err)
	}
	fast.Status.Route = []string{"hk", "seattle", "useast"}
	fast.Status.Candidates = []v1alpha1.RouteCandidate{{Route: []string{"hk", "seattle", "useast"}}, {Route: []string{"hk", "la", "useast"}}}
	if err := k8s.Status().Update(ctx, fast); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the relays see the status
	running["relay-seattle"].Process.Kill()
	killed := time.Now()
	var err2 error
	for time.Since(killed) < 8*time.Second {
		if err2 = testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", routedAddr, 5*time.Second) }, 1<<20); err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Fatalf("with the operator down and seattle dead, the routed chain carries nothing: %v", err2)
	}
	t.Logf("with the operator down, flows took a stand-in route %v after seattle died", time.Since(killed))
	for i := range 3 {
		if err := testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", routedAddr, 5*time.Second) }, 1<<20); err != nil {
			t.Fatalf("flow %d on the stand-in route: %v", i, err)
		}
	}
}

// checkKubeStatus runs `hoplink status --kube` and `probe --kube` against
// a cluster with its operator and relays running: every relay answers the
// observer certificate issued from the cluster's CA, the objects' Ready
// conditions are listed, and the chain is probed hop by hop.
func checkKubeStatus(t *testing.T, bin, kubeconfig, ns string, relays int) {
	t.Helper()
	args := []string{"--kube", "--kubeconfig", kubeconfig, "--namespace", ns, "-o", "json"}
	var r observe.Report
	testutil.WaitFor(t, "status --kube: every relay answers", func() error {
		out, _ := exec.Command(bin, append([]string{"status"}, args...)...).CombinedOutput()
		// The report, between what the command logs before it and the
		// error it ends with when not everything is ready.
		i, j := strings.Index(string(out), "{"), strings.LastIndex(string(out), "}")
		if i < 0 || j < i {
			return fmt.Errorf("no report: %s", out)
		}
		r = observe.Report{}
		if err := json.Unmarshal(out[i:j+1], &r); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		answered := 0
		for _, rl := range r.Relays {
			if rl.Status != nil && rl.Status.Ready {
				answered++
			}
		}
		if answered != relays || len(r.API) == 0 {
			return fmt.Errorf("%d of %d relays answered ready; api %v; not ready: %v", answered, relays, r.API, r.NotReady)
		}
		return nil
	})
	kinds := map[string]bool{}
	for _, o := range r.API {
		kinds[o.Kind] = true
	}
	if !kinds["RelayNode"] || !kinds["Chain"] || !kinds["Tunnel"] {
		t.Errorf("status --kube lists %v", r.API)
	}
	// As a kubectl plugin (kubectl runs kubectl-hoplink), --kube is implied.
	plugin := filepath.Join(t.TempDir(), "kubectl-hoplink")
	if err := os.Symlink(bin, plugin); err != nil {
		t.Fatal(err)
	}
	// (It exits 1 while anything is not ready, as status does.)
	if out, err := exec.Command(plugin, "status", "--kubeconfig", kubeconfig, "--namespace", ns).CombinedOutput(); !strings.Contains(string(out), "OBJECT") ||
		err != nil && !strings.Contains(string(out), "not ready") {
		t.Errorf("kubectl-hoplink status: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, append([]string{"probe", "to-east"}, args...)...).CombinedOutput()
	var p observe.Probe
	if err != nil || json.Unmarshal(out, &p) != nil || len(p.Hops) == 0 {
		t.Fatalf("probe --kube: %v\n%s", err, out)
	}
	for _, h := range p.Hops {
		if h.Err != "" || h.RTT <= 0 {
			t.Errorf("probe --kube: hop %+v", h)
		}
	}
}

// samples are the objects of config/samples, as kubectl would send them.
type samples struct {
	Relays  []*v1alpha1.RelayNode
	Chains  []*v1alpha1.Chain
	Tunnels []*v1alpha1.Tunnel
}

func readSamples(t *testing.T, dir string) *samples {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "hoplink_*.yaml"))
	s := &samples{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var tm metav1.TypeMeta
			json.Unmarshal(raw, &tm)
			var obj any
			switch tm.Kind {
			case "RelayNode":
				o := &v1alpha1.RelayNode{}
				s.Relays, obj = append(s.Relays, o), o
			case "Chain":
				o := &v1alpha1.Chain{}
				s.Chains, obj = append(s.Chains, o), o
			case "Tunnel":
				o := &v1alpha1.Tunnel{}
				s.Tunnels, obj = append(s.Tunnels, o), o
			default:
				t.Fatalf("%s: unexpected kind %q", f, tm.Kind)
			}
			if err := json.Unmarshal(raw, obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
	}
	if len(s.Relays) != 4 || len(s.Chains) != 1 || len(s.Tunnels) != 1 {
		t.Fatalf("samples: %d relays, %d chains, %d tunnels; want the seed 004 topology (4, 1, 1)", len(s.Relays), len(s.Chains), len(s.Tunnels))
	}
	return s
}

// httpGet returns a page's body.
func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
