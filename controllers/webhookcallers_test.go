package controllers

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hoplink/hoplink/api/v1alpha1"
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

// TestWebhookReadsTheCache: a review costs the operator no request to the
// API server, so a flood of them cannot spend the operator's rate limit
// (which the signer and the reconcilers wait on) nor wait on it: the
// property that keeps a legitimate admission fast under a flood
// (hack/bench/webhookflood has the figures).
func TestWebhookReadsTheCache(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	web, tun := "cache-web", "cache-tun"
	create(t, sidecarRelay(ns, web))
	create(t, sidecarRelay(ns, tun, func(rn *v1alpha1.RelayNode) { rn.Spec.TUN = true }))
	c := webhookCaller(t, clientCert(t, webhookClientCA, testAPIServerClient))
	eventually(t, "the webhook sees the RelayNodes", func() error {
		for _, name := range []string{web, tun} {
			resp, err := review(c, ns, name)
			if err != nil {
				return err
			}
			if !resp.Allowed || len(resp.Patch) == 0 {
				return fmt.Errorf("%s: %+v", name, resp.Result)
			}
		}
		return nil
	})
	// The RelayNode reconciler's own requests (it reads the namespace for
	// the relay policy) end before the flood starts.
	quiet(t, ns)
	_, mark := apiRequests.since(0)
	const n, par = 300, 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += par {
				// The RelayNodes of the namespace (one with a TUN device,
				// which reads the namespace), and a few it does not have.
				name := []string{web, tun}[i%2]
				if i%50 == 0 {
					name = "cache-nobody"
				}
				if _, err := review(c, ns, name); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reqs, _ := apiRequests.since(mark)
	var asked []string
	for _, r := range reqs {
		if strings.Contains(r.query, "watch=true") {
			continue
		}
		if strings.Contains(r.path, "/relaynodes") || r.path == "/api/v1/namespaces/"+ns {
			asked = append(asked, r.method+" "+r.path+"?"+r.query)
		}
	}
	if len(asked) > 0 {
		t.Errorf("%d reviews asked the API server %d times, e.g. %v", n, len(asked), asked[:min(5, len(asked))])
	}
}

// quiet waits until the operator has made no request about namespace ns
// for a second.
func quiet(t *testing.T, ns string) {
	t.Helper()
	_, mark := apiRequests.since(0)
	last := time.Now()
	for deadline := time.Now().Add(20 * time.Second); time.Since(last) < time.Second; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the operator is still busy with namespace %s", ns)
		}
		reqs, n := apiRequests.since(mark)
		mark = n
		for _, r := range reqs {
			if strings.Contains(r.path, "/namespaces/"+ns) && !strings.Contains(r.query, "watch=true") {
				last = time.Now()
			}
		}
	}
}

// TestSignerHasItsOwnClient: the pod certificate signer reads and writes
// through a client of its own (its own rate limiter and connections),
// which its user agent shows: what spends the rest of the operator's
// requests leaves the signer its own, and the other way round.
func TestSignerHasItsOwnClient(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	create(t, sidecarRelay(ns, "own-client"))
	k := newKubelet(t, "node-"+ns)
	_, mark := apiRequests.since(0)
	pcr, key := k.ask(k.run(appPod(ns, "signed-1", "own-client")))
	issuedFor(t, pcr, key, "own-client")
	reqs, _ := apiRequests.since(mark)
	var signer, other []string
	for _, r := range reqs {
		what := r.method + " " + r.path + " (" + r.agent + ")"
		switch {
		case r.path == "/api/v1/namespaces/"+ns+"/pods/signed-1" || strings.HasSuffix(r.path, "/podcertificaterequests/"+pcr.Name+"/status"):
			if r.agent == signerUserAgent {
				signer = append(signer, what)
			} else {
				other = append(other, what)
			}
		case r.agent == signerUserAgent && strings.Contains(r.query, "watch=true"):
			other = append(other, what+": the signer's client watches")
		}
	}
	if len(signer) == 0 || len(other) > 0 {
		t.Errorf("the signer's requests %v; others' %v", signer, other)
	}
}

// TestWebhookHoldsAFloodingCaller: one address posting reviews as fast as
// it can is held to its allowance (answered 429 past it), while the API
// server, calling from another address, has its own: a pod created
// through it during the flood gets its sidecar.
func TestWebhookHoldsAFloodingCaller(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	web := "flood-web"
	create(t, sidecarRelay(ns, web))
	flooder := webhookCaller(t, clientCert(t, webhookClientCA, testAPIServerClient))
	// The suite's API server calls from 127.0.0.1; the flood comes from
	// another address of the loopback.
	tr := flooder.Transport.(*http.Transport)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	tr.MaxIdleConnsPerHost = 192 // one connection per sender, as a flood keeps them
	eventually(t, "the webhook sees the RelayNode", func() error { _, err := review(flooder, ns, web); return err })

	// More senders than the allowance lets wait within its hold (100 a
	// second for 1 s): fewer would only be paced.
	const par, each = 192, 4
	var refused, answered atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				select {
				case <-stop:
					return
				default:
				}
				_, err := review(flooder, ns, web)
				switch {
				case err == nil:
					answered.Add(1)
				case strings.Contains(err.Error(), "status 429"):
					refused.Add(1)
				default:
					t.Log(err)
				}
			}
		}()
	}
	// Once the flood is held back, a pod comes through the API server.
	for deadline := time.Now().Add(20 * time.Second); refused.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if refused.Load() == 0 {
		t.Errorf("the flooding address was never refused")
	}
	pod := appPod(ns, "during-the-flood", web)
	err := k8s.Create(context.Background(), pod)
	close(stop)
	wg.Wait()
	if err != nil || len(pod.Spec.InitContainers) != 1 {
		t.Errorf("a pod created during the flood: %v, init containers %d", err, len(pod.Spec.InitContainers))
	}
	t.Logf("flood: %d reviews answered, %d refused", answered.Load(), refused.Load())
}
