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

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// TestPodCertificateSigner asks the signer for certificates as the kubelet
// does for a podCertificate volume: a sidecar relay's pod gets one naming
// its RelayNode, for its own key; other pods are denied.
func TestPodCertificateSigner(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	create(t, sidecarRelay(ns, "signed"))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + ns}}
	create(t, node)
	t.Cleanup(func() { k8s.Delete(ctx, node) })
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}
	create(t, sa)

	request := func(pod *corev1.Pod) (*certificatesv1.PodCertificateRequest, *ecdsa.PrivateKey) {
		t.Helper()
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err != nil {
			t.Fatal(err)
		}
		pcr := &certificatesv1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: pod.Name + "-"},
			Spec: certificatesv1.PodCertificateRequestSpec{
				SignerName: inject.SignerName, PodName: pod.Name, PodUID: pod.UID,
				ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(node.Name), NodeUID: node.UID,
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
	onNode := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.NodeName, p.Spec.ServiceAccountName = node.Name, sa.Name
		create(t, p)
		return p
	}

	pcr, key := request(onNode(appPod(ns, "signed-1", "signed")))
	if !meta.IsStatusConditionTrue(pcr.Status.Conditions, certificatesv1.PodCertificateRequestConditionTypeIssued) {
		t.Fatalf("a sidecar relay's pod was not issued a certificate: %+v", pcr.Status.Conditions)
	}
	b, _ := pem.Decode([]byte(pcr.Status.CertificateChain))
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadOrCreateCA(ctx, k8s, testCA, false)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	if _, err := pki.NewIdentity("signed", ca.PEM, []byte(pcr.Status.CertificateChain), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		t.Errorf("the issued certificate does not make the pod relay web under the relay CA, with its own key: %v", err)
	}
	if !leaf.NotAfter.Equal(pcr.Status.NotAfter.Time) || !pcr.Status.BeginRefreshAt.After(leaf.NotBefore) {
		t.Errorf("status times %v..%v refresh %v do not match the certificate %v..%v", pcr.Status.NotBefore, pcr.Status.NotAfter, pcr.Status.BeginRefreshAt, leaf.NotBefore, leaf.NotAfter)
	}

	plain := appPod(ns, "plain", "x")
	delete(plain.Labels, LabelRelayNode)
	pcr, _ = request(onNode(plain))
	c := meta.FindStatusCondition(pcr.Status.Conditions, certificatesv1.PodCertificateRequestConditionTypeDenied)
	if c == nil || !strings.Contains(c.Message, "has no hoplink.dev/relaynode label") || pcr.Status.CertificateChain != "" {
		t.Errorf("an unlabelled pod's request: %+v", pcr.Status)
	}
}
