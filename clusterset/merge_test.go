package clusterset

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

var t0 = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

func port(name string, proto corev1.Protocol, n int32) mcsv1beta1.ServicePort {
	return mcsv1beta1.ServicePort{Name: name, Protocol: proto, Port: n}
}

// hello is the conformance suite's service: tcp/42 and udp/42.
func hello(cluster string, created time.Time, edit func(*Export)) *Report {
	e := Export{Namespace: "ns", Name: "hello", Created: metav1.NewTime(created), Type: mcsv1beta1.ClusterSetIP,
		Ports:           []mcsv1beta1.ServicePort{port("tcp", corev1.ProtocolTCP, 42), port("udp", corev1.ProtocolUDP, 42)},
		SessionAffinity: corev1.ServiceAffinityClientIP, Address: "10.96.0.10"}
	if edit != nil {
		edit(&e)
	}
	return &Report{Cluster: cluster, Gateway: "gw-" + cluster, Local: []string{"gw-" + cluster},
		Known: []string{"gw-a", "gw-b"}, Exports: []Export{e}}
}

func TestMergeConflicts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		b         func(*Export)
		ports     []string // name/protocol/port of the import
		serving   [][]string
		conflicts string
	}{
		{name: "identical exports", ports: []string{"tcp/TCP/42", "udp/UDP/42"}, serving: [][]string{{"a", "b"}, {"a", "b"}}},
		{
			// The suite's "union of the constituent service ports": b has tcp/42 and an SCTP port, not udp.
			name: "union of ports", b: func(e *Export) {
				e.Ports = []mcsv1beta1.ServicePort{port("tcp", corev1.ProtocolTCP, 42), port("stcp", corev1.ProtocolSCTP, 142)}
			},
			ports: []string{"tcp/TCP/42", "udp/UDP/42", "stcp/SCTP/142"}, serving: [][]string{{"a", "b"}, {"a"}, {"b"}},
			conflicts: "PortConflict",
		},
		{
			// Same name, another number: the oldest export's port stays, b serves nothing.
			name: "conflicting port", b: func(e *Export) { e.Ports = []mcsv1beta1.ServicePort{port("tcp", corev1.ProtocolTCP, 43)} },
			ports: []string{"tcp/TCP/42", "udp/UDP/42"}, serving: [][]string{{"a"}, {"a"}}, conflicts: "PortConflict",
		},
		{
			name: "another port name", b: func(e *Export) { e.Ports = []mcsv1beta1.ServicePort{port("tcp2", corev1.ProtocolTCP, 4242)} },
			ports: []string{"tcp/TCP/42", "udp/UDP/42", "tcp2/TCP/4242"}, serving: [][]string{{"a"}, {"a"}, {"b"}}, conflicts: "PortConflict",
		},
		{
			// A headless export of a ClusterSetIP service serves none of its ports.
			name: "headless against clusterset IP", b: func(e *Export) { e.Type, e.Address = mcsv1beta1.Headless, "" },
			ports: []string{"tcp/TCP/42", "udp/UDP/42"}, serving: [][]string{{"a"}, {"a"}}, conflicts: "TypeConflict",
		},
		{
			name: "labels and affinity", b: func(e *Export) {
				e.Labels = map[string]string{"x": "1"}
				e.SessionAffinity = corev1.ServiceAffinityNone
			},
			ports: []string{"tcp/TCP/42", "udp/UDP/42"}, serving: [][]string{{"a", "b"}, {"a", "b"}},
			conflicts: "SessionAffinityConflict,LabelsConflict",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// b exports later; the order of the reports decides nothing.
			for _, reports := range [][]*Report{
				{hello("a", t0, nil), hello("b", t0.Add(time.Second), tc.b)},
				{hello("b", t0.Add(time.Second), tc.b), hello("a", t0, nil)},
			} {
				svcs := Merge(reports)
				if len(svcs) != 1 {
					t.Fatalf("%d services", len(svcs))
				}
				s := svcs[0]
				var ports []string
				for _, p := range s.Spec.Ports {
					ports = append(ports, p.Name+"/"+string(p.Protocol)+"/"+strconv.Itoa(int(p.Port)))
				}
				if !slices.Equal(ports, tc.ports) || !slices.EqualFunc(s.Serving, tc.serving, slices.Equal) {
					t.Errorf("ports %v serving %v, want %v %v", ports, s.Serving, tc.ports, tc.serving)
				}
				if s.ConflictReason() != tc.conflicts {
					t.Errorf("conflicts %q (%s), want %q", s.ConflictReason(), s.ConflictMessage, tc.conflicts)
				}
				if tc.conflicts != "" && !strings.Contains(s.ConflictMessage, "cluster a's") {
					t.Errorf("message %q does not say whose export won", s.ConflictMessage)
				}
				if s.Spec.Type != mcsv1beta1.ClusterSetIP || s.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || s.Exporters[0] != "a" {
					t.Errorf("the oldest export did not win: %+v, exporters %v", s.Spec, s.Exporters)
				}
			}
		})
	}
}

func TestMergeTieGoesToTheLowerClusterID(t *testing.T) {
	s := Merge([]*Report{hello("b", t0, func(e *Export) { e.Type, e.Address = mcsv1beta1.Headless, "" }), hello("a", t0, nil)})[0]
	if s.Exporters[0] != "a" || s.Spec.Type != mcsv1beta1.ClusterSetIP {
		t.Errorf("exporters %v type %s", s.Exporters, s.Spec.Type)
	}
}
