package controllers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/pki"
)

// The certificate the operator writes into a relay's Secret names the
// relay's namespace (spiffe://hoplink/ns/NS/relay/NAME) and holds for
// days: a copied key is good for a week at most, and only where its
// namespace's relays are.
func TestRelayCertificatesNameTheirNamespaceAndLastDays(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "weekly", external("203.0.113.9:7401"))
	create(t, rn)
	var secret corev1.Secret
	eventually(t, "certificate Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName("weekly")}, &secret)
	})
	leaf := pemLeaf(t, secret.Data["tls.crt"])
	gotNS, relay, ok, err := pki.RelayOf(leaf)
	if err != nil || !ok || gotNS != ns || relay != "weekly" {
		t.Errorf("certificate URIs %v: want %s (err %v)", leaf.URIs, pki.RelayURI(ns, "weekly"), err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > pki.ClusterRelayValidity+2*time.Hour {
		t.Errorf("relay certificate valid for %s, want at most %s", life, pki.ClusterRelayValidity)
	}
	waitReason(t, rn, ReasonExternal)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
		t.Fatal(err)
	}
	if rn.Status.CertificateNotAfter == nil || !rn.Status.CertificateNotAfter.Time.Equal(leaf.NotAfter) {
		t.Errorf("status.certificateNotAfter %v, certificate's %v", rn.Status.CertificateNotAfter, leaf.NotAfter)
	}
}

func pemLeaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatalf("no PEM certificate in %q", certPEM)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// Where pod certificates serve (the suite's API server serves
// PodCertificateRequests), a sidecar RelayNode's Secret holds the CA its
// relays trust and no key: each pod has its own, made by its kubelet. A
// Secret with a key (an older operator's, or Secret mode's) is replaced.
func TestPodCertificateSidecarsGetNoKey(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := sidecarRelay(ns, "keyless")
	create(t, rn)
	key := types.NamespacedName{Namespace: ns, Name: RelayObjectName("keyless")}
	trustOnly := func() error {
		var s corev1.Secret
		if err := k8s.Get(ctx, key, &s); err != nil {
			return err
		}
		if _, ok := s.Data["tls.key"]; ok || s.Data["tls.crt"] != nil {
			return fmt.Errorf("Secret %s holds a key and certificate (type %s)", key.Name, s.Type)
		}
		if len(s.Data["ca.crt"]) == 0 {
			return fmt.Errorf("Secret %s lacks ca.crt", key.Name)
		}
		return nil
	}
	eventually(t, "a Secret with the CA alone", trustOnly)
	eventually(t, "status.certificateNotAfter (the name is confirmed)", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			return err
		}
		if na := rn.Status.CertificateNotAfter; na == nil || time.Until(na.Time) > podCertLifetime+time.Minute {
			return fmt.Errorf("status.certificateNotAfter %v", na)
		}
		return nil
	})

	// An older operator's Secret, with a year-long key for the sidecar's
	// name: put back in place of the operator's until it sticks.
	c, k, err := mustCA(t).Issue("keyless")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Secret with a key in place", func() error {
		old := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, Labels: relayLabels("keyless")},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": []byte("x")}}
		if err := controllerutil.SetControllerReference(rn, old, k8s.Scheme()); err != nil {
			return err
		}
		if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: old.ObjectMeta}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return k8s.Create(ctx, old)
	})
	eventually(t, "the key removed", trustOnly)

	// Out of sidecar mode, the relays run as a DaemonSet and read their
	// key and certificate from the Secret again.
	eventually(t, "RelayNode out of sidecar mode", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			return err
		}
		rn.Spec.Sidecar = nil
		return k8s.Update(ctx, rn)
	})
	eventually(t, "a Secret with a key and certificate of the relay's namespace", func() error {
		var s corev1.Secret
		if err := k8s.Get(ctx, key, &s); err != nil {
			return err
		}
		if _, err := pki.NewIdentity("keyless", s.Data["ca.crt"], s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
			return err
		}
		if gotNS, _, ok, _ := pki.RelayOf(pemLeaf(t, s.Data["tls.crt"])); !ok || gotNS != ns {
			return fmt.Errorf("certificate of namespace %q", gotNS)
		}
		return nil
	})
}

func mustCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := LoadOrCreateCA(context.Background(), k8s, testCA, false)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// staleCache lists RelayNodes as a cache that has not seen those of one
// namespace yet, and no Chains (the test makes none; the API server has
// not the cache's index of them).
type staleCache struct {
	client.Client
	unseen string
}

func (c staleCache) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if _, ok := l.(*v1alpha1.ChainList); ok {
		return nil
	}
	if err := c.Client.List(ctx, l, opts...); err != nil {
		return err
	}
	if rl, ok := l.(*v1alpha1.RelayNodeList); ok {
		kept := rl.Items[:0]
		for _, r := range rl.Items {
			if r.Namespace != c.unseen {
				kept = append(kept, r)
			}
		}
		rl.Items = kept
	}
	return nil
}

// Who holds a name is asked of the API server, as the signer and the
// webhook ask it: a reconciler whose cache has not seen the holder yet
// must not write a key for the name into the newcomer's Secret.
func TestNameHolderIsAskedOfTheAPIServer(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	holderNS, newNS := namespace(t), namespace(t)
	holder := relayNode(holderNS, "contested", external("203.0.113.10:7401"))
	create(t, holder)
	waitReason(t, holder, ReasonExternal)
	// A second apart at least: two of one second both lose the name.
	time.Sleep(time.Until(holder.CreationTimestamp.Add(1100 * time.Millisecond)))
	newcomer := relayNode(newNS, "contested", external("203.0.113.11:7401"))
	create(t, newcomer)

	r := &RelayNodeReconciler{Client: staleCache{Client: k8s, unseen: holderNS}, Reader: k8s, Scheme: k8s.Scheme(), CA: mustCA(t),
		RenewBefore: pki.ClusterRelayValidity / 3}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(newcomer)}); err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: newNS, Name: RelayObjectName("contested")}, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("the newcomer got a Secret for a name %s holds (err %v)", holderNS, err)
	}
	waitReason(t, newcomer, ReasonNameConflict)
}
