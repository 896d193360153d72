package controllers

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// webhookCaller posts AdmissionReviews straight to the operator's webhook,
// as any pod that reaches its port can, presenting cert (none: nil).
func webhookCaller(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	var sec corev1.Secret
	if err := k8s.Get(context.Background(), testWebhookSecret, &sec); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(sec.Data["ca.crt"])
	c := &tls.Config{RootCAs: roots}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c, MaxIdleConnsPerHost: 32}}
}

// clientCert is a client certificate for name from ca.
func clientCert(t *testing.T, ca *pki.CA, name string) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// review posts one AdmissionReview for a pod of ns labelled for relay and
// returns the answer.
func review(c *http.Client, ns, relay string) (*admissionv1.AdmissionResponse, error) {
	pod := appPod(ns, "p", relay)
	raw, _ := json.Marshal(pod)
	ar := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("u-" + relay), Namespace: ns, Operation: admissionv1.Create,
			Kind:   metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Object: runtime.RawExtension{Raw: raw}}}
	body, _ := json.Marshal(ar)
	resp, err := c.Post("https://"+webhookAddr+inject.Path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil || out.Response == nil {
		return nil, fmt.Errorf("answer %q: %v", b, err)
	}
	return out.Response, nil
}

// TestWebhookTakesOnlyTheAPIServer: the API server presents the client
// certificate its admission configuration gives it (the suite's), and the
// webhook answers it; a pod that posts reviews to the webhook's port
// without that certificate, with one of another CA, or with one of the CA
// for another name is refused at the handshake.
func TestWebhookTakesOnlyTheAPIServer(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	web := "callers-web"
	create(t, sidecarRelay(ns, web))
	pod := appPod(ns, "through-the-api-server", web)
	create(t, pod)
	if len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("the API server's review was not answered with a sidecar: %v", pod.Spec.InitContainers)
	}
	other, err := pki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		cert *tls.Certificate
	}{
		{"no certificate", nil},
		{"another CA's certificate", clientCert(t, other, testAPIServerClient)},
		{"the CA's certificate for another name", clientCert(t, webhookClientCA, "system:node:kind-worker")},
	} {
		if resp, err := review(webhookCaller(t, c.cert), ns, web); err == nil {
			t.Errorf("%s: answered (allowed %v, %d bytes of patch)", c.what, resp.Allowed, len(resp.Patch))
		}
	}
	resp, err := review(webhookCaller(t, clientCert(t, webhookClientCA, testAPIServerClient)), ns, web)
	if err != nil || !resp.Allowed || len(resp.Patch) == 0 {
		t.Errorf("the API server's certificate: %+v, %v", resp, err)
	}
}
