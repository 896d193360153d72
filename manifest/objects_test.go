package manifest

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

func TestFromObjectsLeavesOutBadObjectsAndDependents(t *testing.T) {
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: "net"} }
	relays := []v1alpha1.RelayNode{
		{ObjectMeta: meta("hk"), Spec: v1alpha1.RelayNodeSpec{Endpoints: []string{"10.0.0.1:7401"}}},
		{ObjectMeta: meta("la"), Spec: v1alpha1.RelayNodeSpec{Endpoints: []string{"10.0.0.2:7401"}}},
		// A bad endpoint: left out, and what depends on it.
		{ObjectMeta: meta("sea"), Spec: v1alpha1.RelayNodeSpec{Endpoints: []string{"no-port"}}},
		// No endpoints while none of its pods runs: unreachable for now,
		// but neither it nor its chains are mistakes.
		{ObjectMeta: meta("tokyo")},
	}
	chains := []v1alpha1.Chain{
		{ObjectMeta: meta("good"), Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "la", Route: []string{"hk", "la"}}},
		{ObjectMeta: meta("via-sea"), Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "sea", Route: []string{"hk", "sea"}}},
		{ObjectMeta: meta("to-tokyo"), Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "tokyo", Route: []string{"hk", "tokyo"}}},
		{ObjectMeta: meta("routed"), Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "la", Via: []string{"tokyo"}, Mode: v1alpha1.ModeSum}},
	}
	tunnels := []v1alpha1.Tunnel{
		{ObjectMeta: meta("web"), Spec: v1alpha1.TunnelSpec{Chain: "good", Listen: &v1alpha1.TunnelListen{Port: 8080}, Target: "web:80"}},
		{ObjectMeta: meta("db"), Spec: v1alpha1.TunnelSpec{Chain: "via-sea", Listen: &v1alpha1.TunnelListen{Port: 5432}, Target: "db:5432"}},
		{ObjectMeta: meta("clash"), Spec: v1alpha1.TunnelSpec{Chain: "good", Listen: &v1alpha1.TunnelListen{Port: 8080}, Target: "x:1"}},
	}
	set, problems := FromObjects(relays, chains, tunnels)
	if set.Tunnel("net/web") == nil || set.Chain("net/good") == nil || set.Relay("hk") == nil ||
		set.Relay("tokyo") == nil || set.Chain("net/to-tokyo") == nil || set.Chain("net/routed") == nil {
		t.Fatalf("good objects left out: %v", problems)
	}
	for _, gone := range []bool{set.Relay("sea") != nil, set.Chain("net/via-sea") != nil, set.Tunnel("net/db") != nil, set.Tunnel("net/clash") != nil} {
		if gone {
			t.Fatalf("a bad object or a dependent stayed: relays=%d chains=%d tunnels=%d", len(set.Relays), len(set.Chains), len(set.Tunnels))
		}
	}
	all := strings.Join(func() (s []string) {
		for _, p := range problems {
			s = append(s, p.Error())
		}
		return
	}(), "\n")
	for _, want := range []string{`RelayNode "sea": spec.endpoints`, `Tunnel "net/db": spec.chain`, `Tunnel "net/clash": spec.listen`} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not mention %s:\n%s", want, all)
		}
	}
	if relays[3].Namespace != "net" || len(relays[3].Spec.Endpoints) != 0 || relays[0].Spec.Listen.Port != 0 {
		t.Error("FromObjects changed its input")
	}
}

// Local mode and standalone relays say which fields they leave to a
// cluster's operator.
func TestClusterOnly(t *testing.T) {
	s, err := Parse("x.yaml", []byte(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: 17501}, endpoints: ["127.0.0.1:17501"], nodeSelector: {zone: east}, image: relay:1}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: 17502}, endpoints: ["127.0.0.1:17502"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := s.ClusterOnly()
	if len(got) != 1 || got[0] != "RelayNode a: spec.nodeSelector, spec.image" {
		t.Fatalf("ClusterOnly() = %q", got)
	}
}

// A RelayNode is trusted by name only once the operator issued its
// certificate, and not while it is marked NameConflict, even with the
// expiry of a certificate it had before it lost the name.
func TestHeldNames(t *testing.T) {
	issued := &metav1.Time{}
	ready := func(reason string) []metav1.Condition {
		return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: reason, Message: "RelayNode \"y\" already exists in namespace \"b\""}}
	}
	rn := func(name string, st v1alpha1.RelayNodeStatus) v1alpha1.RelayNode {
		return v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "a"}, Spec: v1alpha1.RelayNodeSpec{External: true}, Status: st}
	}
	in := []v1alpha1.RelayNode{
		rn("holds", v1alpha1.RelayNodeStatus{CertificateNotAfter: issued, Conditions: ready("RelaysNotReady")}),
		rn("external", v1alpha1.RelayNodeStatus{CertificateNotAfter: issued, Conditions: ready("External")}),
		rn("new", v1alpha1.RelayNodeStatus{}),
		rn("lost", v1alpha1.RelayNodeStatus{Conditions: ready(v1alpha1.ReasonNameConflict)}),
		rn("lost-later", v1alpha1.RelayNodeStatus{CertificateNotAfter: issued, Conditions: ready(v1alpha1.ReasonNameConflict)}),
	}
	kept, problems := HeldNames(in)
	var names []string
	for _, r := range kept {
		names = append(names, r.Name)
	}
	if strings.Join(names, ",") != "holds,external" {
		t.Errorf("kept %v, want holds and external", names)
	}
	if len(problems) != 3 {
		t.Fatalf("problems %v, want one for each of new, lost, lost-later", problems)
	}
	for i, want := range []string{`RelayNode "new": status.certificateNotAfter: not set`, `RelayNode "lost": status: Ready is NameConflict`, `RelayNode "lost-later": status: Ready is NameConflict`} {
		if got := problems[i].Error(); !strings.Contains(got, want) || !strings.Contains(got, "namespace") {
			t.Errorf("problem %d = %q, want it to say %q and the namespace", i, got, want)
		}
	}
}

// Objects gives back what FromObjects takes, as copies: a caller edits
// them without touching the Set.
func TestObjectsRoundTrip(t *testing.T) {
	set, err := Parse("m.yaml", []byte(relays+chain+tunnel))
	if err != nil {
		t.Fatal(err)
	}
	rs, cs, ts := set.Objects()
	if len(rs) != len(set.Relays) || len(cs) != len(set.Chains) || len(ts) != len(set.Tunnels) || len(ts) == 0 {
		t.Fatalf("objects %d/%d/%d of a set of %d/%d/%d", len(rs), len(cs), len(ts), len(set.Relays), len(set.Chains), len(set.Tunnels))
	}
	ts[0].Spec.Target = "edited:1"
	if set.Tunnels[0].Spec.Target == "edited:1" {
		t.Fatal("an edit of the objects reached the Set")
	}
	again, problems := FromObjects(rs, cs, ts)
	if len(problems) > 0 || again.Tunnel(Key(ts[0].Namespace, ts[0].Name)).Spec.Target != "edited:1" {
		t.Fatalf("rebuilt: %v", problems)
	}
}
