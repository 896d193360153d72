package relay

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
)

// The relay's status names the Tunnels it held to a limit, from its own
// counters: flows refused past spec.limits.maxFlows (or past the relay's
// share for one Tunnel, named as such), datagrams dropped and time paced
// over spec.limits.rateMbps; when each last grew, and the limit then.
func TestStatusNamesTheLimitsThatHeld(t *testing.T) {
	e, m := testEnv(t, twoRelays+`
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: held, namespace: default}
spec: {chain: static, listen: {port: 8080}, target: "10.0.0.1:80", limits: {maxFlows: 2, rateMbps: 20}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: free, namespace: default}
spec: {chain: static, listen: {port: 8081}, target: "10.0.0.1:80"}
`)
	host := netip.MustParseAddr("192.0.2.1")
	other := netip.MustParseAddr("192.0.2.2")
	var w limitWatch
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	if got := w.look(e, e.manifests(), t0); len(got) != 0 {
		t.Fatalf("held before anything was refused: %+v", got)
	}
	// maxFlows 2; the relay's share for one Tunnel 3, for one host 2.
	e.flows = newQuota(100, 3, 2)
	for range 3 {
		e.acquire("default/held", host)
	}
	// The relay's share for one Tunnel (3) holds the one without limits;
	// two hosts, as the share per host is 2.
	for _, h := range []netip.Addr{host, host, other, other} {
		e.acquire("default/free", h)
	}
	// Another relay's counters, in the same registry, are not this one's.
	m.FlowErrors.WithLabelValues("la", "default/held", adminapi.LimitFlows).Add(5)
	got := w.look(e, e.manifests(), t0)
	want := map[string]adminapi.LimitHit{
		"default/held": {Tunnel: "default/held", Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=2", Count: 1, At: t0},
		"default/free": {Tunnel: "default/free", Reason: adminapi.LimitFlows, Limit: "--max-flows-per-tunnel=3", Count: 1, At: t0},
	}
	if len(got) != len(want) {
		t.Fatalf("hits %+v, want %+v", got, want)
	}
	for _, h := range got {
		if h != want[h.Tunnel] {
			t.Errorf("hit %+v, want %+v", h, want[h.Tunnel])
		}
	}

	// Nothing grew: the hits keep the time they last did.
	t1 := t0.Add(time.Minute)
	for _, h := range w.look(e, e.manifests(), t1) {
		if !h.At.Equal(t0) {
			t.Errorf("a count that did not grow moved its time: %+v", h)
		}
	}
	// Datagrams dropped and TCP time paced over the rate, latest first.
	m.UDPDropped.WithLabelValues("hk", "default/held", adminapi.LimitRateDrop).Add(7)
	m.RateWaited.WithLabelValues("hk", "default/held", "up").Add(0.5)
	m.RateWaited.WithLabelValues("hk", "default/held", "down").Add(0.25)
	got = w.look(e, e.manifests(), t1)
	if len(got) != 4 || !got[0].At.Equal(t1) || !got[1].At.Equal(t1) {
		t.Fatalf("hits %+v", got)
	}
	for _, h := range got[:2] {
		switch {
		case h.Reason == adminapi.LimitRateDrop && h.Count == 7 && h.Limit == "spec.limits.rateMbps=20":
		case h.Reason == adminapi.LimitRateWait && h.Count == 0.75 && h.Limit == "spec.limits.rateMbps=20":
		default:
			t.Errorf("hit %+v", h)
		}
	}
}
