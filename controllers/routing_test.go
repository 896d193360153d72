package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
)

// emulatedRelay is a relay of this process behind a link emulator: its
// endpoint is a UDP proxy (QUIC from peers, delayed per peer) and a TCP
// proxy (the admin API, undelayed) on one port number.
type emulatedRelay struct {
	name   string
	listen string // the relay's own address
	udp    *linkemu.UDPProxy
}

func proxyPair(t *testing.T, target string) *linkemu.UDPProxy {
	t.Helper()
	for range 50 {
		u, err := linkemu.NewUDPProxy("127.0.0.1:0", target, linkemu.Params{Loss: 1})
		if err != nil {
			t.Fatal(err)
		}
		tp, err := linkemu.NewTCPProxy(u.Addr(), target, linkemu.Params{})
		if err != nil {
			u.Close()
			continue
		}
		t.Cleanup(func() { u.Close(); tp.Close() })
		return u
	}
	t.Fatal("no port free for both UDP and TCP")
	return nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

// TestRouteControllerWritesStatusAndEvents runs three relays in this
// process (hk, la, useast, external RelayNodes named r* since relay names
// are cluster-wide and other tests hold these) with emulated links (one-way hk-la 5 ms, la-useast
// 5 ms, hk-useast 25 ms) and a sum Chain over them. The operator's route
// controller measures them over their admin API and writes the route
// (hk -> la -> useast, 20 ms), its latency, the candidates and an Event;
// when hk-la degrades it moves the chain to hk -> useast (50 ms).
func TestRouteControllerWritesStatusAndEvents(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	var secret corev1.Secret
	if err := k8s.Get(ctx, testCA, &secret); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(secret.Data[keyCert], secret.Data[keyKey])
	if err != nil {
		t.Fatal(err)
	}
	relays := map[string]*emulatedRelay{}
	var nodes []v1alpha1.RelayNode
	for _, name := range []string{"rhk", "rla", "ruseast"} {
		listen := freeAddr(t)
		r := &emulatedRelay{name: name, listen: listen, udp: proxyPair(t, listen)}
		relays[name] = r
		host, port, _ := net.SplitHostPort(listen)
		var p int32
		fmt.Sscan(port, &p)
		// External: these relays run in this process, not in pods.
		rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.RelayNodeSpec{Listen: v1alpha1.RelayListen{Address: host, Port: p}, Endpoints: []string{r.udp.Addr()}, External: true}}
		create(t, rn)
		nodes = append(nodes, *rn)
	}
	setLink := func(a, b string, oneWay time.Duration) {
		p := linkemu.Params{Delay: oneWay}
		relays[b].udp.SetFrom(relays[a].listen, p, p)
		relays[a].udp.SetFrom(relays[b].listen, p, p)
	}
	setLink("rhk", "rla", 5*time.Millisecond)
	setLink("rla", "ruseast", 5*time.Millisecond)
	setLink("rhk", "ruseast", 25*time.Millisecond)

	chain := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fast"}, Spec: v1alpha1.ChainSpec{
		Entry: "rhk", Exit: "ruseast", Via: []string{"rla"}, Mode: v1alpha1.ModeSum,
		Probe: &v1alpha1.ProbeSpec{Interval: &metav1.Duration{Duration: 400 * time.Millisecond}},
	}}
	create(t, chain)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(chain), chain); err != nil {
		t.Fatal(err)
	}
	set, problems := manifest.FromObjects(nodes, []v1alpha1.Chain{*chain}, nil)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	for name := range relays {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(relay.Config{Name: name, Manifests: set, Identity: id, Metrics: metrics.New(prometheus.NewRegistry()), Log: log})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
	}

	key := client.ObjectKeyFromObject(chain)
	waitStatus := func(what string, ok func(*v1alpha1.ChainStatus) error) *v1alpha1.ChainStatus {
		t.Helper()
		var ch v1alpha1.Chain
		eventually(t, what, func() error {
			if err := k8s.Get(ctx, key, &ch); err != nil {
				return err
			}
			return ok(&ch.Status)
		})
		return &ch.Status
	}
	routeIs := func(want ...string) func(*v1alpha1.ChainStatus) error {
		return func(s *v1alpha1.ChainStatus) error {
			if !slices.Equal(s.Route, want) {
				return fmt.Errorf("status.route %v, want %v", s.Route, want)
			}
			return nil
		}
	}
	// The status holds the figures of the round that wrote it, at least
	// the emulated 20 ms (a busy host adds to them, never takes away), and
	// both candidates once both are measured.
	st := waitStatus("route hk -> la -> useast, measured, with both candidates", func(s *v1alpha1.ChainStatus) error {
		if err := routeIs("rhk", "rla", "ruseast")(s); err != nil {
			return err
		}
		if s.Latency == nil || s.Latency.Estimated == nil || s.Latency.Measured == nil {
			return fmt.Errorf("status.latency %+v: want estimated and measured", s.Latency)
		}
		if len(s.Candidates) != 2 {
			return fmt.Errorf("candidates %+v: want hk,la,useast then hk,useast", s.Candidates)
		}
		return nil
	})
	if e, m := st.Latency.Estimated.Duration, st.Latency.Measured.Duration; e < 20*time.Millisecond || m < 20*time.Millisecond {
		t.Errorf("latency estimated %v, measured %v of a 20 ms route: below its links' delays", e, m)
	}
	if !slices.Equal(st.Candidates[1].Route, []string{"rhk", "ruseast"}) {
		t.Errorf("candidates %+v: want hk,la,useast then hk,useast", st.Candidates)
	}
	// Each round's figures, on relays instrumented by the race detector:
	// near 20 ms, with room for a busy host. A round that a stall of the
	// shared host lengthened is followed by another within the wait.
	eventually(t, "a round's latency near 20 ms", func() error {
		e, m := chainLatency(t, ns+"/fast", "estimated"), chainLatency(t, ns+"/fast", "measured")
		if e < 20*time.Millisecond || e > 40*time.Millisecond || m < 20*time.Millisecond || m > 45*time.Millisecond {
			return fmt.Errorf("estimated %v, measured %v of a 20 ms route", e, m)
		}
		return nil
	})
	if st.RouteChanges < 1 || st.LastRouteChange == nil {
		t.Errorf("routeChanges %d, lastRouteChange %v after the first route", st.RouteChanges, st.LastRouteChange)
	}
	changes := st.RouteChanges
	waitEvent(t, ns, "fast", "RouteChanged", "route rhk,rla,ruseast")
	waitStatus("Ready with the routed route", func(s *v1alpha1.ChainStatus) error {
		for _, c := range s.Conditions {
			if c.Type == conditionReady && strings.Contains(c.Message, "rhk -> rla -> ruseast") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", s.Conditions)
	})

	// Nothing changes: the status is not rewritten every round.
	var before v1alpha1.Chain
	k8s.Get(ctx, key, &before)
	waitJoined(t, &before)
	time.Sleep(5 * 400 * time.Millisecond)
	var after v1alpha1.Chain
	k8s.Get(ctx, key, &after)
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("status rewritten while nothing changed: %+v -> %+v", before.Status.Latency, after.Status.Latency)
	}

	// hk-la degrades: hk -> la -> useast costs 90 ms, hk -> useast 50.
	setLink("rhk", "rla", 40*time.Millisecond)
	st = waitStatus("route hk -> useast", routeIs("rhk", "ruseast"))
	if st.RouteChanges != changes+1 {
		t.Errorf("routeChanges %d after one more change (was %d)", st.RouteChanges, changes)
	}
	waitEvent(t, ns, "fast", "RouteChanged", "route rhk,ruseast")
}

func waitEvent(t *testing.T, ns, chain, reason, note string) {
	t.Helper()
	eventually(t, "Event "+reason+" "+note, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Name == chain && e.Reason == reason && strings.Contains(e.Note, note) {
				return nil
			}
			seen = append(seen, e.Reason+": "+e.Note)
		}
		return fmt.Errorf("events: %v", seen)
	})
}

// TestAdminAPIIsTheOperatorsAlone: a relay's admin API answers the
// operator's certificate and turns away a relay's, though both come from
// the CA.
func TestAdminAPIIsTheOperatorsAlone(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	listen := freeAddr(t)
	host, port, _ := net.SplitHostPort(listen)
	var p int32
	fmt.Sscan(port, &p)
	set, problems := manifest.FromObjects([]v1alpha1.RelayNode{
		{ObjectMeta: metav1.ObjectMeta{Name: "la"}, Spec: v1alpha1.RelayNodeSpec{Listen: v1alpha1.RelayListen{Address: host, Port: p}, Endpoints: []string{listen}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hk"}, Spec: v1alpha1.RelayNodeSpec{Listen: v1alpha1.RelayListen{Address: host, Port: 1}}},
	}, []v1alpha1.Chain{{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "la", Mode: v1alpha1.ModeSum}}}, nil)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	id, _ := ca.Identity("la")
	r, err := relay.New(relay.Config{Name: "la", Manifests: set, Identity: id, Metrics: metrics.New(prometheus.NewRegistry()),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	admin := newRelayAdmin(nil, ca)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	get := func(c *tls.Config) (string, error) {
		conn, err := tls.Dial("tcp", listen, c)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/links?chain=default/c HTTP/1.0\r\nHost: la\r\n\r\n")
		b, err := io.ReadAll(conn)
		return string(b), err
	}
	out, err := get(pki.AdminClientConfig(roots, admin.certificate, "la"))
	if err != nil || !strings.Contains(out, `"relay":"la"`) {
		t.Fatalf("operator: %v\n%s", err, out)
	}
	hk, _ := ca.Identity("hk")
	impostor := pki.AdminClientConfig(roots, func() (*tls.Certificate, error) { return hk.Certificate(), nil }, "la")
	if out, err := get(impostor); err == nil && strings.Contains(out, "200 OK") {
		t.Fatalf("a relay's certificate read the admin API:\n%s", out)
	}
}
