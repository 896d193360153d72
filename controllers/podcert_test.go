package controllers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// kubelet stands in for the kubelet of one node, which envtest does not
// run: it places pods on its node and asks the signer for their
// certificates as it does for a podCertificate volume.
type kubelet struct {
	t    *testing.T
	node *corev1.Node
}

func newKubelet(t *testing.T, name string) *kubelet {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	create(t, node)
	t.Cleanup(func() { k8s.Delete(context.Background(), node) })
	return &kubelet{t: t, node: node}
}

// run creates p on the node, with the service account "web" of its
// namespace.
func (k *kubelet) run(p *corev1.Pod) *corev1.Pod {
	k.t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: "web"}}
	if err := k8s.Create(context.Background(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		k.t.Fatal(err)
	}
	p.Spec.NodeName, p.Spec.ServiceAccountName = k.node.Name, sa.Name
	create(k.t, p)
	return p
}

// ask requests a certificate for pod's new key, as the kubelet does, and
// waits for the signer's answer.
func (k *kubelet) ask(pod *corev1.Pod) (*certificatesv1.PodCertificateRequest, *ecdsa.PrivateKey) {
	t := k.t
	t.Helper()
	ctx := context.Background()
	var sa corev1.ServiceAccount
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Spec.ServiceAccountName}, &sa); err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	pcr := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: pod.Name + "-"},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: inject.SignerName, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(k.node.Name), NodeUID: k.node.UID,
			StubPKCS10Request: csr,
		},
	}
	create(t, pcr)
	eventually(t, "the signer answers", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pcr), pcr); err != nil {
			return err
		}
		if !decided(pcr) {
			return fmt.Errorf("no answer yet: %+v", pcr.Status)
		}
		return nil
	})
	return pcr, key
}

// issuedFor checks that pcr was issued a certificate that makes its pod
// relay under the relay CA with key, and returns the certificate.
func issuedFor(t *testing.T, pcr *certificatesv1.PodCertificateRequest, key *ecdsa.PrivateKey, relay string) *x509.Certificate {
	t.Helper()
	if !meta.IsStatusConditionTrue(pcr.Status.Conditions, certificatesv1.PodCertificateRequestConditionTypeIssued) {
		t.Fatalf("pod %s/%s was not issued a certificate for %q: %+v", pcr.Namespace, pcr.Spec.PodName, relay, pcr.Status.Conditions)
	}
	b, _ := pem.Decode([]byte(pcr.Status.CertificateChain))
	if b == nil {
		t.Fatalf("no certificate in %q", pcr.Status.CertificateChain)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadOrCreateCA(context.Background(), k8s, testCA, false)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	if _, err := pki.NewIdentity(relay, ca.PEM, []byte(pcr.Status.CertificateChain), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		t.Errorf("the issued certificate does not make the pod relay %s under the relay CA, with its own key: %v", relay, err)
	}
	return leaf
}

// TestPodCertificateSigner asks the signer for certificates as the kubelet
// does for a podCertificate volume: a sidecar relay's pod gets one naming
// its RelayNode, for its own key.
func TestPodCertificateSigner(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	create(t, sidecarRelay(ns, "signed"))
	k := newKubelet(t, "node-"+ns)

	pcr, key := k.ask(k.run(appPod(ns, "signed-1", "signed")))
	leaf := issuedFor(t, pcr, key, "signed")
	// Its namespace too, which peers check.
	if gotNS, relay, ok, err := pki.RelayOf(leaf); err != nil || !ok || gotNS != ns || relay != "signed" {
		t.Errorf("pod certificate URIs %v: want %s (err %v)", leaf.URIs, pki.RelayURI(ns, "signed"), err)
	}
	if !leaf.NotAfter.Equal(pcr.Status.NotAfter.Time) || !pcr.Status.BeginRefreshAt.After(leaf.NotBefore) {
		t.Errorf("status times %v..%v refresh %v do not match the certificate %v..%v", pcr.Status.NotBefore, pcr.Status.NotAfter, pcr.Status.BeginRefreshAt, leaf.NotBefore, leaf.NotAfter)
	}
}

// TestPodCertificateSignerLendsNoName: relays trust a peer by the relay
// name in its certificate, so a pod gets a certificate only for the relay
// it is entitled to be: a sidecar RelayNode of its own namespace that it is
// labelled for, and that holds its name. A sidecar RelayNode of the same
// name in a second namespace lost the name to the first (NameConflict), and
// its pods must not become the first's relay.
func TestPodCertificateSignerLendsNoName(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	a, b, c := namespace(t), namespace(t), namespace(t)
	k := newKubelet(t, "node-"+a)

	owner := sidecarRelay(a, "pc-twin")
	create(t, owner)
	waitReason(t, owner, ReasonNoPods)
	// Creation times have whole seconds: a later second makes a's the
	// older whatever the namespaces' names.
	time.Sleep(time.Until(owner.CreationTimestamp.Add(time.Second)))
	twin := sidecarRelay(b, "pc-twin")
	create(t, twin)
	if cond := waitReason(t, twin, ReasonNameConflict); !strings.Contains(cond.Message, a) {
		t.Fatalf("b's RelayNode lost its name, but not to a: %s", cond.Message)
	}
	ext := relayNode(a, "pc-external", func(r *v1alpha1.RelayNode) { r.Spec.External, r.Spec.Endpoints = true, []string{"203.0.113.7:7401"} })
	create(t, ext)

	pcr, key := k.ask(k.run(appPod(a, "owner", "pc-twin")))
	issuedFor(t, pcr, key, "pc-twin")

	// A pod created with the label would wait for ever for a certificate
	// and a Secret it cannot have: the webhook refuses it, naming the fix.
	err := k8s.Create(ctx, appPod(b, "born-borrower", "pc-twin"))
	if want := fmt.Sprintf("RelayNode %s/pc-twin does not hold its name: RelayNode %q of namespace %q", b, "pc-twin", a); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "rename it") {
		t.Errorf("creating a pod labelled for b's RelayNode: %v, want an error saying %q and the fix", err, want)
	}

	// Pods are labelled after creation, as whoever may update pods can:
	// the webhook sees creations only, so the signer decides alone.
	labelled := func(ns, name, relay string, labels map[string]string) *corev1.Pod {
		p := appPod(ns, name, relay)
		delete(p.Labels, LabelRelayNode)
		k.run(p)
		if relay == "" && labels == nil {
			return p
		}
		orig := p.DeepCopy()
		if relay != "" {
			p.Labels[LabelRelayNode] = relay
		}
		for l, v := range labels {
			p.Labels[l] = v
		}
		if err := k8s.Patch(ctx, p, client.MergeFrom(orig)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		reason  string
		message []string
	}{
		{"a pod of the RelayNode that lost the name", labelled(b, "borrower", "pc-twin", nil),
			ReasonNameConflict, []string{fmt.Sprintf("RelayNode %s/pc-twin", b), fmt.Sprintf("namespace %q", a), "rename"}},
		{"a pod of a namespace without the RelayNode", labelled(c, "stranger", "pc-twin", nil),
			ReasonNotASidecarRelay, []string{fmt.Sprintf("no RelayNode %q in namespace %s", "pc-twin", c)}},
		{"an unlabelled pod", labelled(a, "plain", "", nil),
			ReasonNotASidecarRelay, []string{"has no hoplink.dev/relaynode label"}},
		{"a pod of a RelayNode not in sidecar mode", labelled(a, "not-sidecar", "pc-external", nil),
			ReasonNotASidecarRelay, []string{fmt.Sprintf("RelayNode %s/pc-external is not in sidecar mode", a), "spec.sidecar"}},
		{"a pod labelled as the operator's own relay", labelled(a, "relay-pod", "pc-twin", map[string]string{labelManagedBy: managerName}),
			ReasonNotASidecarRelay, []string{"the operator's own"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &kubelet{t: t, node: k.node}
			pcr, _ := k.ask(tc.pod)
			c := meta.FindStatusCondition(pcr.Status.Conditions, certificatesv1.PodCertificateRequestConditionTypeDenied)
			if c == nil || c.Status != metav1.ConditionTrue || pcr.Status.CertificateChain != "" {
				t.Fatalf("pod %s/%s was not denied: %+v", tc.pod.Namespace, tc.pod.Name, pcr.Status)
			}
			if c.Reason != tc.reason {
				t.Errorf("reason %s, want %s (%s)", c.Reason, tc.reason, c.Message)
			}
			for _, m := range tc.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not say %q", c.Message, m)
				}
			}
		})
	}
}

// The signer follows the relay policy: a pod labelled for a sidecar
// RelayNode whose image the operator does not run (labelled after its
// creation, which the webhook never sees, or injected before the policy
// refused it) gets no certificate (before: issued).
func TestPodCertificateSignerFollowsThePolicy(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	k := newKubelet(t, "node-"+ns)
	rn := sidecarRelay(ns, "pc-evil", func(r *v1alpha1.RelayNode) { r.Spec.Image = "evil.example/relay:1" })
	create(t, rn)
	waitReason(t, rn, ReasonImageNotAllowed)
	p := appPod(ns, "later", "pc-evil")
	delete(p.Labels, LabelRelayNode)
	k.run(p)
	orig := p.DeepCopy()
	p.Labels[LabelRelayNode] = "pc-evil"
	if err := k8s.Patch(ctx, p, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	pcr, _ := k.ask(p)
	c := meta.FindStatusCondition(pcr.Status.Conditions, certificatesv1.PodCertificateRequestConditionTypeDenied)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonImageNotAllowed || !strings.Contains(c.Message, `spec.image "evil.example/relay:1"`) {
		t.Fatalf("the pod of a refused RelayNode: %+v", pcr.Status.Conditions)
	}
}
