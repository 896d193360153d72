package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A Tunnel waits for its Chain, then gets a Service in front of its entry
// relay's port, and loses it with the Chain.
func TestTunnelConditions(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	// Relay names are unique across namespaces (they are certificate
	// names), so this test has its own.
	ch := chain(ns, "east", "t-hk", "t-sea", "t-la")
	create(t, ch)
	tn := tunnel(ns, "web", "east", 8080)
	create(t, tn)
	waitReason(t, tn, "ChainNotReady")

	for i, rn := range relayNodes(t, ns, 7700, "t-hk", "t-sea", "t-la") {
		runRelayPod(t, rn, fmt.Sprintf("192.0.2.%d", 20+i))
	}
	waitReason(t, tn, "Ready")
	if tn.Status.Address != "web."+ns+".svc:8080" {
		t.Errorf("address %q", tn.Status.Address)
	}
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Selector[LabelRelayNode] != "t-hk" || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP || !metav1.IsControlledBy(&svc, tn) {
		t.Errorf("Service does not front the entry relay's port: %+v", svc.Spec)
	}
	// The entry listens on every address: clients of both families where
	// the cluster has them (this API server has one).
	if p := svc.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicyPreferDualStack || len(svc.Spec.ClusterIPs) == 0 {
		t.Errorf("Service's family policy %v, cluster IPs %v; want PreferDualStack", p, svc.Spec.ClusterIPs)
	}

	loop := tunnel(ns, "local-only", "east", 8081)
	loop.Spec.Listen.Address = "127.0.0.1"
	create(t, loop)
	waitReason(t, loop, "LoopbackListen")

	// The chain goes away: the Tunnel says so and its Service goes too.
	if err := k8s.Delete(ctx, ch); err != nil {
		t.Fatal(err)
	}
	waitReason(t, tn, "ChainNotFound")
	eventually(t, "Service deleted", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&svc), &svc); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
}

// A Tunnel entering at a sidecar relay has no Service: apps in the pods
// dial their own sidecar. With no spec.listen.address it listens on both
// of the pod's loopbacks, which its status says as localhost:PORT; an
// address it names is the one.
func TestSidecarEntryTunnelAddress(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	create(t, sidecarRelay(ns, "se-web"))
	create(t, chain(ns, "from-web", "se-web", "se-la"))
	both := tunnel(ns, "both", "from-web", 9000)
	create(t, both)
	v4 := tunnel(ns, "v4", "from-web", 9001)
	v4.Spec.Listen.Address = "127.0.0.1"
	create(t, v4)
	for tn, want := range map[*v1alpha1.Tunnel]string{both: "localhost:9000", v4: "127.0.0.1:9001"} {
		eventually(t, "Tunnel "+tn.Name+"'s address", func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), tn); err != nil {
				return err
			}
			if tn.Status.Address != want {
				return fmt.Errorf("status.address %q, want %q", tn.Status.Address, want)
			}
			return nil
		})
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), &corev1.Service{}); !apierrors.IsNotFound(err) {
			t.Errorf("Tunnel %s of a sidecar entry has a Service (err %v)", tn.Name, err)
		}
	}
}

func TestTunnelDoesNotTakeOverAForeignService(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 5432}}}})
	create(t, chain(ns, "c", "hk"))
	tn := tunnel(ns, "db", "c", 5432)
	create(t, tn)
	waitReason(t, tn, "ServiceConflict")
}

// A tun Tunnel needs its entry relay (and, in packet mode, its exit) to
// open devices: RelayNode spec.tun grants the pods that, and nothing else,
// and the Tunnel names the relays that lack it.
func TestTunTunnelsNeedRelaysWithTUN(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	relays := relayNodes(t, ns, 7600, "tun-hk", "tun-la")
	hk, la := relays[0], relays[1]
	runRelayPod(t, hk, "192.0.2.30")
	runRelayPod(t, la, "192.0.2.31")
	create(t, chain(ns, "c", "tun-hk", "tun-la"))
	flow, packet := tunTunnel(ns, "flow", "c", v1alpha1.TunFlow), tunTunnel(ns, "packet", "c", v1alpha1.TunPacket)
	create(t, flow)
	create(t, packet)
	for _, tc := range []struct {
		tn        *v1alpha1.Tunnel
		says      string
		otherwise string
	}{
		{flow, `RelayNode "tun-hk" may not open TUN devices: set spec.tun: true`, "flow mode"},
		{packet, `"tun-hk", "tun-la"`, "packet mode must name entry and exit"},
	} {
		if c := waitReason(t, tc.tn, "TUNNotAllowed"); !strings.Contains(c.Message, tc.says) {
			t.Errorf("%s: %s", tc.otherwise, c.Message)
		}
	}

	dsKey := types.NamespacedName{Namespace: ns, Name: RelayObjectName("tun-hk")}
	podOf := func() (corev1.PodSpec, error) {
		var ds appsv1.DaemonSet
		err := k8s.Get(ctx, dsKey, &ds)
		return ds.Spec.Template.Spec, err
	}
	unprivileged := func(p corev1.PodSpec) error {
		sc := p.Containers[0].SecurityContext
		if !*sc.RunAsNonRoot || len(sc.Capabilities.Add) != 0 || len(p.Volumes) != 0 || len(p.Containers[0].VolumeMounts) != 0 {
			return fmt.Errorf("privileges without spec.tun: %+v, volumes %v", sc, p.Volumes)
		}
		return nil
	}
	if p, err := podOf(); err != nil || unprivileged(p) != nil {
		t.Fatalf("relay without spec.tun: %v %v", err, unprivileged(p))
	}

	setTUN := func(rn *v1alpha1.RelayNode, on bool) {
		t.Helper()
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			t.Fatal(err)
		}
		rn.Spec.TUN = on
		if err := k8s.Update(ctx, rn); err != nil {
			t.Fatal(err)
		}
	}
	setTUN(hk, true)
	eventually(t, "relay pods with CAP_NET_ADMIN and /dev/net/tun", func() error {
		p, err := podOf()
		if err != nil {
			return err
		}
		sc := p.Containers[0].SecurityContext
		if *sc.RunAsUser != 0 || len(sc.Capabilities.Add) != 1 || sc.Capabilities.Add[0] != "NET_ADMIN" || len(sc.Capabilities.Drop) != 1 || *sc.AllowPrivilegeEscalation {
			return fmt.Errorf("security context %+v", sc)
		}
		if len(p.Volumes) != 1 || p.Volumes[0].HostPath == nil || p.Volumes[0].HostPath.Path != "/dev/net/tun" ||
			*p.Volumes[0].HostPath.Type != corev1.HostPathCharDev || p.Containers[0].VolumeMounts[0].MountPath != "/dev/net/tun" {
			return fmt.Errorf("volumes %+v mounts %+v", p.Volumes, p.Containers[0].VolumeMounts)
		}
		return nil
	})
	waitReason(t, flow, "Ready")
	if c := waitReason(t, packet, "TUNNotAllowed"); strings.Contains(c.Message, "tun-hk") || !strings.Contains(c.Message, "tun-la") {
		t.Errorf("packet mode with only the entry allowed: %s", c.Message)
	}
	setTUN(la, true)
	waitReason(t, packet, "Ready")

	// Turned off again: the pods lose the privileges.
	setTUN(hk, false)
	eventually(t, "relay pods unprivileged again", func() error {
		p, err := podOf()
		if err != nil {
			return err
		}
		return unprivileged(p)
	})
	waitReason(t, flow, "TUNNotAllowed")
}
