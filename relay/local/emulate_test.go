package local

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
)

// Mistakes in the annotation fail at start, naming the RelayNode, the
// annotation and what is wrong.
func TestEmulatedLinksRefuseMistakes(t *testing.T) {
	relays := func(hk, la string) string {
		return fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk, annotations: {%s: %q}}
spec: {listen: {port: 17401}, endpoints: ["127.0.0.1:17401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la, annotations: {%s: %q}}
spec: {listen: {port: 17402}, endpoints: ["127.0.0.1:17402"]}
`, AnnotationRTT, hk, AnnotationRTT, la)
	}
	for _, tc := range []struct{ hk, la, want string }{
		{"la=40ms", "", ""},
		{"la", "", `RelayNode "hk": metadata.annotations[hoplink.dev/local-rtt]: "la": want RELAY=ROUND_TRIP`},
		{"la=fast", "", `"la=fast": want RELAY=ROUND_TRIP`},
		{"la=-1ms", "", `"la=-1ms": want RELAY=ROUND_TRIP`},
		{"lax=4ms", "", `"lax=4ms": unknown RelayNode "lax" (known: hk, la); did you mean "la"?`},
		{"hk=4ms", "", `"hk=4ms": a relay has no link to itself`},
		{"la=4ms", "hk=5ms", `RelayNode "la": metadata.annotations[hoplink.dev/local-rtt]: "hk=5ms": the link hk-la is given on RelayNode "hk" already`},
	} {
		set, err := manifest.Parse("relays.yaml", []byte(relays(tc.hk, tc.la)))
		if err != nil {
			t.Fatal(err)
		}
		links, err := EmulatedLinks(set)
		switch {
		case tc.want == "" && (err != nil || len(links) != 1 || links[0] != Link{A: "hk", B: "la", RTT: 40 * time.Millisecond}):
			t.Errorf("%q: links %+v, err %v", tc.hk, links, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("hk %q, la %q: %v; want an error with %s", tc.hk, tc.la, err, tc.want)
		}
	}
}

// Relays whose links are emulated measure the round trips the annotations
// give, and route by them: a sum chain that starts on the direct route
// keeps it over a detour cheaper by less than the switch threshold, and
// its entry's status says why.
func TestEmulatedLinksRouteAndKeep(t *testing.T) {
	const rtt = 10 * time.Millisecond
	ports := map[string]int{"hk": testutil.FreePort(t), "seattle": testutil.FreePort(t), "la": testutil.FreePort(t)}
	var b strings.Builder
	for _, r := range []struct{ name, links string }{{"hk", "la=10ms, seattle=3.5ms"}, {"seattle", "la=3.5ms"}, {"la", ""}} {
		p := ports[r.name]
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s, annotations: {%s: %q}}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n",
			r.name, AnnotationRTT, r.links, p, p)
	}
	b.WriteString("---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: hk, exit: la, via: [seattle], mode: sum, route: [hk, la], probe: {interval: 500ms}, hysteresis: {rounds: 10, min: 5ms}}\n")
	set, err := manifest.Parse("emulated.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(set, relay.Config{Metrics: metrics.New(prometheus.NewRegistry()), Log: testutil.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	roots, err := pki.ParseRoots(n.CA.PEM)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := n.CA.IssueObserver(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	admin := adminapi.NewClient(roots, func() (*tls.Certificate, error) { return &cert, nil })

	// The first rounds may see the detour cheaper by more than the margin
	// or not cheaper at all (the host's own delays come on top, and on a
	// busy machine they are tens of milliseconds); the figures settle
	// within seconds. The detour is 3 ms cheaper, below a 5 ms threshold,
	// so each link may take up to 3 ms more than it should before the
	// detour stops being cheaper; a detour must win ten rounds in a row to
	// replace the route, so that a noisy start cannot move the chain.
	kept := func(st *adminapi.Status) bool {
		return len(st.Chains) == 1 && strings.Join(st.Chains[0].Route, ",") == "hk,la" &&
			strings.HasPrefix(st.Chains[0].Kept, "kept: candidate hk,seattle,la is ") &&
			strings.HasSuffix(st.Chains[0].Kept, " cheaper, below the 5ms / 5% switch threshold")
	}
	var last *adminapi.Status
	deadline := time.Now().Add(30 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := admin.Status(ctx, "hk", fmt.Sprintf("127.0.0.1:%d", ports["hk"]))
		cancel()
		if err != nil {
			continue
		}
		last = st
		if kept(st) || len(st.Chains) == 1 && strings.Join(st.Chains[0].Route, ",") != "hk,la" {
			break
		}
	}
	if last == nil || !kept(last) {
		t.Fatalf("hk's status never said why the chain keeps hk,la: %+v", last)
	}
	// The links measure at least their emulated round trips, not the
	// loopback's fraction of a millisecond.
	for _, p := range last.Peers {
		want := map[string]time.Duration{"la": rtt, "seattle": rtt * 35 / 100}[p.Name]
		if !p.Up || p.RTT.D() < want {
			t.Errorf("link hk -> %s: up %v, round trip %v; want at least %v", p.Name, p.Up, p.RTT.D(), want)
		}
	}
}

// Each direction of an emulated link takes half its round trip, over UDP
// (QUIC) and TCP (TLS) alike, at the one address the dialer is given.
func TestEmulatedLinkDelaysBothWays(t *testing.T) {
	const rtt = 30 * time.Millisecond
	echo := testutil.EchoServer(t)
	udpEcho, err := net.ListenPacket("udp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer udpEcho.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := udpEcho.ReadFrom(buf)
			if err != nil {
				return
			}
			udpEcho.WriteTo(buf[:n], from)
		}
	}()
	set, err := manifest.Parse("two.yaml", []byte(fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: 17401}, endpoints: ["127.0.0.1:17401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: 17402}, endpoints: [%q]}
`, echo)))
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulate(set, []Link{{A: "a", B: "b", RTT: rtt}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	eps := e.endpoints["a"]["b"]
	if len(eps) != 1 || eps[0] == echo {
		t.Fatalf("a dials b at %v, want one proxy in front of %s", eps, echo)
	}
	for _, network := range []string{"tcp", "udp"} {
		c, err := net.DialTimeout(network, eps[0], 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		best := time.Hour
		for range 5 {
			start := time.Now()
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
				t.Fatalf("%s: %v", network, err)
			}
			best = min(best, time.Since(start))
		}
		c.Close()
		// The best of five: a busy host only adds to a round trip.
		if best < rtt || best >= 2*rtt {
			t.Errorf("%s round trip through the emulated link: %v, want %v and less than %v", network, best, rtt, 2*rtt)
		}
	}
}
