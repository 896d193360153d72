package observe

import (
	"context"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/printable"
	"github.com/hoplink/hoplink/manifest"
)

// Object is what the API says of one hoplink object: its Ready condition.
type Object struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"` // namespace/name
	Ready   string `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// FromCluster reads the RelayNodes, Chains and Tunnels of namespace ns as
// manifests (each relay at the endpoints its status publishes, a sidecar
// RelayNode at its ready pods) and what their Ready conditions say.
func FromCluster(ctx context.Context, c client.Reader, ns string) (*manifest.Set, []Object, error) {
	var rl v1alpha1.RelayNodeList
	var cl v1alpha1.ChainList
	var tl v1alpha1.TunnelList
	for _, l := range []client.ObjectList{&rl, &cl, &tl} {
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			return nil, nil, err
		}
	}
	var objs []Object
	add := func(kind string, m metav1.ObjectMeta, conds []metav1.Condition) {
		o := Object{Kind: kind, Name: manifest.Key(m.Namespace, m.Name), Ready: "Unknown"}
		if r := meta.FindStatusCondition(conds, "Ready"); r != nil {
			// Whoever may write status may write anything here.
			o.Ready, o.Reason, o.Message = printable.String(string(r.Status)), printable.String(r.Reason), printable.String(r.Message)
		}
		objs = append(objs, o)
	}
	relays := make([]v1alpha1.RelayNode, len(rl.Items))
	for i := range rl.Items {
		r := &rl.Items[i]
		add("RelayNode", r.ObjectMeta, r.Status.Conditions)
		var eps discoveryv1.EndpointSliceList
		if r.Spec.IsSidecar() {
			if err := c.List(ctx, &eps, client.InNamespace(ns),
				client.MatchingLabels{discoveryv1.LabelServiceName: v1alpha1.RelayObjectName(r.Name)}); err != nil {
				return nil, nil, fmt.Errorf("the endpoints of sidecar RelayNode %s: %w", r.Name, err)
			}
		}
		relays[i] = manifest.Dialed(r, eps.Items)
	}
	for _, ch := range cl.Items {
		add("Chain", ch.ObjectMeta, ch.Status.Conditions)
	}
	for _, t := range tl.Items {
		add("Tunnel", t.ObjectMeta, t.Status.Conditions)
	}
	set, _ := manifest.FromObjects(relays, cl.Items, tl.Items)
	return set, objs, nil
}

// WithAPI adds what the API says to a report gathered from the relays:
// an object not Ready is something not ready too.
func (r *Report) WithAPI(objs []Object) {
	r.API = objs
	for _, o := range objs {
		if o.Ready != "True" {
			r.NotReady = append(r.NotReady, fmt.Sprintf("%s %s: Ready=%s %s: %s", o.Kind, o.Name, o.Ready, o.Reason, o.Message))
		}
	}
	r.Ready = len(r.NotReady) == 0
}
