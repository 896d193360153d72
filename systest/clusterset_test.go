package systest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// serviceIP is the cluster IP the exported Service gets: from the API
// servers' service range (clusterSetRange), added to the host's loopback
// for the test, where kube-proxy would make it reachable.
// gatewayIP is where the gateway relays' pods are, for the EndpointSlices
// (which take no loopback address): another address of the loopback, where
// the relays' Tunnel listeners bind too (every address).
const (
	clusterSetRange = "198.18.7.0/24"
	serviceIP       = "198.18.7.50"
	gatewayIP       = "198.19.7.2"
)

// TestClusterSetServices runs the Multi-Cluster Services API between two
// clusters (an API server and an operator in multicluster mode each, one
// CA) whose gateway relays are real relay processes: a Service exported in
// A becomes a ServiceImport in both, what A exports reaches B through the
// relays' admin API alone (each cluster knows the other only as an external
// RelayNode), and a connection to the listen port B's EndpointSlice names
// crosses gw-b -> gw-a to the Service in A. Then a conflicting export in B,
// a namespace B lacks, and the unexports.
func TestClusterSetServices(t *testing.T) {
	requireNetns(t) // root: the Service's cluster IP goes on the loopback
	bin := procs.Hoplink(t)
	ctx := context.Background()
	for _, ip := range []string{serviceIP, gatewayIP} {
		if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v: %s", ip, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "addr", "del", ip+"/32", "dev", "lo").Run() })
	}

	a := cluster.Start(t, "a", clusterSetRange)
	b := cluster.Start(t, "b", clusterSetRange)
	a.Operator(t, bin, "--mcs-gateway", "edge/gw-a", "--cluster-id", "a", "--mcs-ports", "21100-21199")
	var ca corev1.Secret
	testutil.WaitFor(t, "cluster A's CA", func() error {
		return a.K8s.Get(ctx, types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}, &ca)
	})
	cluster.Create(t, b.K8s, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "hoplink-ca-from-a"}, Type: ca.Type, Data: ca.Data})

	ports := map[string]int{"gw-a": testutil.FreePort(t), "gw-b": testutil.FreePort(t)}
	home := map[string]*cluster.Cluster{"gw-a": a, "gw-b": b}
	for _, c := range []*cluster.Cluster{a, b} {
		for _, name := range []string{"gw-a", "gw-b"} {
			cluster.Create(t, c.K8s, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: name}, Spec: v1alpha1.RelayNodeSpec{
				Listen:    v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(ports[name])},
				Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", ports[name])},
				External:  home[name] != c,
			}})
		}
		gatewayPod(t, c, map[*cluster.Cluster]string{a: "gw-a", b: "gw-b"}[c])
		for _, ns := range []string{"demo"} {
			cluster.Create(t, c.K8s, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
	}
	b.Operator(t, bin, "--ca-secret", "hoplink-ca-from-a", "--mcs-gateway", "edge/gw-b", "--cluster-id", "b", "--mcs-ports", "21200-21299")
	a.Relay(t, bin, "gw-a")
	b.Relay(t, bin, "gw-b")

	// The Service in A, its endpoint (what the EndpointSlice controller would
	// write), and what listens at its cluster IP (what kube-proxy would reach).
	ln, err := net.Listen("tcp", serviceIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go testutil.ServeSinkThenSource(ln)
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}, Spec: corev1.ServiceSpec{
		ClusterIP: serviceIP, Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}}}
	cluster.Create(t, a.K8s, web)
	cluster.Create(t, a.K8s, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}})

	exported := time.Now()
	cluster.Create(t, a.K8s, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}})
	var listen int32
	testutil.WaitFor(t, "B's EndpointSlice of web: gw-b at the listen port of the Tunnel to A", func() error {
		var l discoveryv1.EndpointSliceList
		if err := b.K8s.List(ctx, &l, client.InNamespace("demo"), client.MatchingLabels{mcsv1beta1.LabelServiceName: "web", mcsv1beta1.LabelSourceCluster: "a"}); err != nil {
			return err
		}
		for _, s := range l.Items {
			if len(s.Ports) == 1 && len(s.Endpoints) == 1 && s.Endpoints[0].Addresses[0] == gatewayIP && ptr.Deref(s.Endpoints[0].Conditions.Ready, false) {
				listen = ptr.Deref(s.Ports[0].Port, 0)
				return nil
			}
		}
		return fmt.Errorf("slices %+v", l.Items)
	})
	t.Logf("B lists the way to A's web %s after the export", time.Since(exported).Round(time.Millisecond))
	addr := net.JoinHostPort(gatewayIP, strconv.Itoa(int(listen)))
	testutil.WaitFor(t, "1 MiB to A's web through gw-b -> gw-a, from "+addr, func() error {
		return testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }, 1<<20)
	})
	t.Logf("and carries a flow %s after the export", time.Since(exported).Round(time.Millisecond))

	for _, c := range []*cluster.Cluster{a, b} {
		si := serviceImport(t, c, "demo", "web")
		var derived corev1.Service
		if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "demo", Name: clusterset.DerivedName("web")}, &derived); err != nil {
			t.Fatalf("cluster %s: the Service of the clusterset IP: %v", c.Name, err)
		}
		if si.Spec.Type != mcsv1beta1.ClusterSetIP || !slices.Equal(si.Spec.IPs, derived.Spec.ClusterIPs) || len(si.Spec.Ports) != 1 ||
			si.Spec.Ports[0].Port != 8080 || len(si.Status.Clusters) != 1 || si.Status.Clusters[0].Cluster != "a" {
			t.Errorf("cluster %s: ServiceImport %+v %+v, derived IPs %v", c.Name, si.Spec, si.Status, derived.Spec.ClusterIPs)
		}
	}
	waitExportConditions(t, a, "demo", "web", "Valid=True Valid", "Ready=True Exported", "Conflict=False NoConflicts")

	// B exports web too, with a port of another name: both exports say
	// Conflict, the import has both ports, each served by its own cluster.
	cluster.Create(t, b.K8s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "admin", Port: 9090, Protocol: corev1.ProtocolTCP}}}})
	cluster.Create(t, b.K8s, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}})
	for _, c := range []*cluster.Cluster{a, b} {
		waitExportConditions(t, c, "demo", "web", "Conflict=True PortConflict")
		testutil.WaitFor(t, "cluster "+c.Name+": the union of the ports", func() error {
			si := serviceImport(t, c, "demo", "web")
			if len(si.Spec.Ports) != 2 || len(si.Status.Clusters) != 2 {
				return fmt.Errorf("%+v %+v", si.Spec.Ports, si.Status.Clusters)
			}
			return nil
		})
	}

	// An export from a namespace B lacks: imported in A alone, and A's
	// export says so with the fix.
	cluster.Create(t, a.K8s, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-a"}})
	cluster.Create(t, a.K8s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "only-a", Name: "db"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Port: 5432}}}})
	cluster.Create(t, a.K8s, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "only-a", Name: "db"}})
	waitExportConditions(t, a, "only-a", "db", `not in b, which have no namespace "only-a": create it there`)
	serviceImport(t, a, "only-a", "db")

	// The last export goes, and so do the imports, in both clusters.
	for _, c := range []*cluster.Cluster{a, b} {
		if err := c.K8s.Delete(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*cluster.Cluster{a, b} {
		testutil.WaitFor(t, "cluster "+c.Name+": the ServiceImport gone", func() error {
			var si mcsv1beta1.ServiceImport
			if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "demo", Name: "web"}, &si); err == nil {
				return fmt.Errorf("still there")
			}
			return nil
		})
	}
}

// serviceImport waits for a ServiceImport and returns it.
func serviceImport(t *testing.T, c *cluster.Cluster, ns, name string) *mcsv1beta1.ServiceImport {
	t.Helper()
	var si mcsv1beta1.ServiceImport
	testutil.WaitFor(t, fmt.Sprintf("cluster %s: ServiceImport %s/%s", c.Name, ns, name), func() error {
		return c.K8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &si)
	})
	return &si
}

// waitExportConditions waits until a ServiceExport's conditions, each as
// "Type=Status Reason: message", hold every one of want.
func waitExportConditions(t *testing.T, c *cluster.Cluster, ns, name string, want ...string) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("cluster %s: ServiceExport %s/%s says %q", c.Name, ns, name, want), func() error {
		var se mcsv1beta1.ServiceExport
		if err := c.K8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &se); err != nil {
			return err
		}
		var got []string
		for _, t := range []mcsv1beta1.ServiceExportConditionType{mcsv1beta1.ServiceExportConditionValid, mcsv1beta1.ServiceExportConditionReady, mcsv1beta1.ServiceExportConditionConflict} {
			if cond := meta.FindStatusCondition(se.Status.Conditions, string(t)); cond != nil {
				got = append(got, fmt.Sprintf("%s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message))
			}
		}
		all := strings.Join(got, "\n")
		for _, w := range want {
			if !strings.Contains(all, w) {
				return fmt.Errorf("no %q in\n%s", w, all)
			}
		}
		return nil
	})
}

// TestClusterSetFailover: clusters a and b export web, cluster c calls it.
// c's links to a's gateway are shorter (a 20 ms round trip, emulated in
// front of a's endpoints as c knows them, against 60 ms to b's), so c's
// EndpointSlices send its clients to a and keep b's way standing by; when
// a's relay dies, c's clients go to b. The test reports how long that took.
func TestClusterSetFailover(t *testing.T) {
	requireNetns(t)
	bin := procs.Hoplink(t)
	ctx := context.Background()
	ips := map[string]string{"a": "198.18.7.60", "b": "198.18.8.60"}
	for _, ip := range []string{ips["a"], ips["b"], gatewayIP} {
		if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v: %s", ip, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "addr", "del", ip+"/32", "dev", "lo").Run() })
	}
	clusters := map[string]*cluster.Cluster{
		"a": cluster.Start(t, "a", "198.18.7.0/24"),
		"b": cluster.Start(t, "b", "198.18.8.0/24"),
		"c": cluster.Start(t, "c", "198.18.9.0/24"),
	}
	ports := map[string]int{}
	for _, n := range []string{"a", "b", "c"} {
		ports[n] = testutil.FreePort(t)
	}
	// Links that delay each way, in front of the endpoints a cluster knows
	// another's relay at: c - a 10 ms, c - b and a - b 30 ms (so the way
	// to b through a is no shorter).
	delay := map[[2]string]time.Duration{{"c", "a"}: 10 * time.Millisecond, {"c", "b"}: 30 * time.Millisecond,
		{"a", "b"}: 30 * time.Millisecond, {"b", "a"}: 30 * time.Millisecond}
	for cn, c := range clusters {
		for _, n := range []string{"a", "b", "c"} {
			ep := fmt.Sprintf("127.0.0.1:%d", ports[n])
			if d := delay[[2]string{cn, n}]; d > 0 {
				ep = emulatedEndpoint(t, ep, d)
			}
			cluster.Create(t, c.K8s, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "gw-" + n}, Spec: v1alpha1.RelayNodeSpec{
				Listen: v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(ports[n])}, Endpoints: []string{ep}, External: n != cn}})
		}
		gatewayPod(t, c, "gw-"+cn)
		cluster.Create(t, c.K8s, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}})
	}
	a := clusters["a"]
	a.Operator(t, bin, "--mcs-gateway", "edge/gw-a", "--cluster-id", "a", "--mcs-ports", "21100-21199")
	var ca corev1.Secret
	testutil.WaitFor(t, "cluster a's CA", func() error {
		return a.K8s.Get(ctx, types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}, &ca)
	})
	relays := map[string]*exec.Cmd{}
	for i, n := range []string{"b", "c"} {
		c := clusters[n]
		cluster.Create(t, c.K8s, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "hoplink-ca-from-a"}, Type: ca.Type, Data: ca.Data})
		c.Operator(t, bin, "--ca-secret", "hoplink-ca-from-a", "--mcs-gateway", "edge/gw-"+n, "--cluster-id", n, "--mcs-ports", fmt.Sprintf("%d-%d", 21200+100*i, 21299+100*i))
	}
	for n, c := range clusters {
		relays[n] = c.Relay(t, bin, "gw-"+n)
	}
	// web in a and in b: each answers with its cluster's name.
	for _, n := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", ips[n]+":8080")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go testutil.Serve(ln, func(c *net.TCPConn) { c.Write([]byte(n + "\n")) })
		c := clusters[n]
		cluster.Create(t, c.K8s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}, Spec: corev1.ServiceSpec{
			ClusterIP: ips[n], Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}}})
		cluster.Create(t, c.K8s, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}})
	}

	// c's clients: a while both are there, b once a's relay is gone.
	cc := clusters["c"]
	waitActive := func(want string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		deadline := start.Add(within)
		for {
			port, err := activeWay(cc, "web")
			if err == nil && port.cluster == want {
				if answer, err := ask(net.JoinHostPort(gatewayIP, strconv.Itoa(int(port.port)))); err == nil && answer == want {
					return time.Since(start)
				}
			}
			if time.Now().After(deadline) {
				var chains v1alpha1.ChainList
				cc.K8s.List(ctx, &chains, client.InNamespace("edge"))
				for _, ch := range chains.Items {
					t.Logf("c's Chain %s: route %v latency %+v", ch.Name, ch.Status.Route, ch.Status.Latency)
				}
				t.Fatalf("c's clients do not reach cluster %s within %s: the way is %+v (%v)", want, within, port, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitActive("a", time.Minute)
	// Once both ways are there and measured, b's stands by.
	testutil.WaitFor(t, "b's way in c, standing by", func() error {
		var l discoveryv1.EndpointSliceList
		if err := cc.K8s.List(ctx, &l, client.InNamespace("demo"), client.MatchingLabels{mcsv1beta1.LabelSourceCluster: "b"}); err != nil {
			return err
		}
		if len(l.Items) != 1 || len(l.Items[0].Endpoints) != 1 || ptr.Deref(l.Items[0].Endpoints[0].Conditions.Ready, true) {
			return fmt.Errorf("%+v", l.Items)
		}
		return nil
	})
	if w, err := activeWay(cc, "web"); err != nil || w.cluster != "a" {
		t.Fatalf("c's clients go to %+v (%v), want a: the nearer", w, err)
	}
	relays["a"].Process.Kill()
	took := waitActive("b", time.Minute)
	t.Logf("a's gateway relay killed: c's clients reached b %s later", took.Round(100*time.Millisecond))
}

// emulatedEndpoint puts a link that delays each way by oneWay in front of a
// relay's endpoint (QUIC and TLS share its port), and returns its address.
func emulatedEndpoint(t *testing.T, endpoint string, oneWay time.Duration) string {
	t.Helper()
	p := linkemu.Params{Delay: oneWay}
	for range 20 {
		u, err := linkemu.NewUDPProxy("127.0.0.1:0", endpoint, p)
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(u.Addr())
		tp, err := linkemu.NewTCPProxy("127.0.0.1:"+port, endpoint, p)
		if err != nil {
			u.Close()
			continue
		}
		t.Cleanup(func() { u.Close(); tp.Close() })
		return "127.0.0.1:" + port
	}
	t.Fatal("no port free for both UDP and TCP")
	return ""
}

// gatewayPod is what the kubelet would show of a gateway relay's pod: the
// relay process is what runs.
func gatewayPod(t *testing.T, c *cluster.Cluster, relay string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: relay + "-pod", Labels: map[string]string{v1alpha1.LabelRelayNode: relay}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "relay", Image: "hoplink:test"}}}}
	cluster.Create(t, c.K8s, pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: gatewayIP, PodIPs: []corev1.PodIP{{IP: gatewayIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.K8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

type way struct {
	cluster string
	port    int32
}

// activeWay is the one ready way to a service's first port in c's
// EndpointSlices, as kube-proxy would pick.
func activeWay(c *cluster.Cluster, name string) (way, error) {
	var l discoveryv1.EndpointSliceList
	if err := c.K8s.List(context.Background(), &l, client.InNamespace("demo"), client.MatchingLabels{mcsv1beta1.LabelServiceName: name}); err != nil {
		return way{}, err
	}
	var ready []way
	for _, s := range l.Items {
		if len(s.Endpoints) > 0 && len(s.Ports) > 0 && ptr.Deref(s.Endpoints[0].Conditions.Ready, false) {
			ready = append(ready, way{s.Labels[mcsv1beta1.LabelSourceCluster], ptr.Deref(s.Ports[0].Port, 0)})
		}
	}
	if len(ready) != 1 {
		return way{}, fmt.Errorf("ready ways %+v", ready)
	}
	return ready[0], nil
}

// ask reads the first line a connection to addr answers.
func ask(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 16)
	n, err := c.Read(b)
	return strings.TrimSpace(string(b[:n])), err
}
