// Command webhookflood measures what a flood of AdmissionReviews, posted
// straight to the operator's injection webhook by anyone who reaches its
// port, does to a legitimate admission. It runs a kube-apiserver and etcd
// (envtest: KUBEBUILDER_ASSETS) with the webhook registered as the chart
// registers it, and the operator (controllers.NewManager) against them,
// with a sidecar RelayNode. For -duration, -flood clients each post reviews
// back to back (so that many are pending at once), while every 500 ms a pod
// labelled for the RelayNode is created through the API server: the
// admission the flood must not delay. It prints the admissions' times and
// failures, and the reviews the flood got answered.
//
//	KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go run ./hack/bench/webhookflood
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

func main() {
	flood := flag.Int("flood", 1500, "clients posting reviews back to back, each with one pending at a time")
	duration := flag.Duration("duration", 30*time.Second, "how long the flood lasts")
	sources := flag.Int("sources", 1, "addresses the flood comes from (127.0.1.1 and on; the API server calls from 127.0.0.1)")
	flooder := flag.String("flooder", "", "internal: be the flood, posting to this address (the webhook's CA on stdin) and printing counts at the end")
	clientAuth := flag.Bool("client-auth", false, "give the API server a client certificate for webhooks and the operator its CA (--webhook-client-ca): the flood, without one, is refused at the handshake")
	flag.Parse()
	ctrl.SetLogger(logr.Discard()) // controller-runtime's logs are not the figure
	if *flooder != "" {
		if err := floodFrom(*flooder, *flood, *sources, *duration); err != nil {
			fmt.Fprintln(os.Stderr, "webhookflood flooder:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*flood, *sources, *duration, *clientAuth); err != nil {
		fmt.Fprintln(os.Stderr, "webhookflood:", err)
		os.Exit(1)
	}
}

const (
	caNS   = "hoplink-system"
	hookNm = "hoplink-sidecar-injector"
	ns     = "bench"
	relay  = "web"
)

func run(flood, sources int, duration time.Duration, clientAuth bool) error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set: export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	hook := inject.WebhookConfiguration(hookNm, caNS, "hoplink-webhook")
	hook.Webhooks[0].ClientConfig.Service.Path = ptr.To(strings.TrimPrefix(inject.Path, "/"))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{hook}},
	}
	var clientCA string
	if clientAuth {
		admission, ca, err := clientCerts()
		if err != nil {
			return err
		}
		env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admission)
		clientCA = ca
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start envtest (run from the repository's root): %w", err)
	}
	defer env.Stop()
	k8s, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range []string{caNS, ns} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{controllers.LabelPrivilegedRelays: "true"}}}); err != nil {
			return err
		}
	}
	wh := &env.WebhookInstallOptions
	secret := types.NamespacedName{Namespace: caNS, Name: "hoplink-webhook-cert"}
	mgr, err := controllers.NewManager(ctx, cfg, controllers.Options{
		Image: "hoplink:bench", CASecret: types.NamespacedName{Namespace: caNS, Name: "hoplink-ca"}, CreateCA: true,
		MetricsAddr: "0", ProbeAddr: "0",
		Webhook: controllers.WebhookOptions{Port: wh.LocalServingPort, Host: wh.LocalServingHost, Hosts: []string{wh.LocalServingHost},
			Secret: secret, Config: hookNm, ClientCA: clientCA},
	})
	if err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "operator:", err)
			os.Exit(1)
		}
	}()
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: relay}, Spec: v1alpha1.RelayNodeSpec{Sidecar: &v1alpha1.RelaySidecar{}}}
	if err := k8s.Create(ctx, rn); err != nil {
		return err
	}
	var seq atomic.Int64
	admit := func() (time.Duration, error) {
		p := pod(fmt.Sprintf("legit-%d", seq.Add(1)))
		c, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		start := time.Now()
		err := k8s.Create(c, p)
		took := time.Since(start)
		if err == nil && len(p.Spec.InitContainers) == 0 {
			err = fmt.Errorf("pod %s admitted without its sidecar", p.Name)
		}
		if err == nil {
			go k8s.Delete(context.Background(), p)
		}
		return took, err
	}
	// The operator is up once a pod is admitted with its sidecar.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := admit(); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("no admission within 60 s: %w", err)
		}
	}
	var quiet []time.Duration
	for range 10 {
		d, err := admit()
		if err != nil {
			return err
		}
		quiet = append(quiet, d)
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("quiet: a legitimate admission took %s (median of 10), %s at most\n", median(quiet), slices.Max(quiet))

	// The flood, from a process of its own (as from another pod: the
	// operator's scheduler runs only its own goroutines): reviews that name
	// the RelayNode, as any pod can post them.
	var sec corev1.Secret
	if err := k8s.Get(ctx, secret, &sec); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var floodOut bytes.Buffer
	fl := exec.CommandContext(ctx, self, "-flooder", addr, "-flood", strconv.Itoa(flood), "-sources", strconv.Itoa(sources), "-duration", duration.String())
	fl.Stdin, fl.Stdout, fl.Stderr = bytes.NewReader(sec.Data["ca.crt"]), &floodOut, os.Stderr
	if err := fl.Start(); err != nil {
		return err
	}
	floodCtx, stopFlood := context.WithTimeout(ctx, duration)
	defer stopFlood()
	fmt.Printf("flood: %d clients posting reviews for %s; a legitimate admission every 500 ms\n", flood, duration)
	var times []time.Duration
	failed, slow := 0, 0
	var firstFail string
	start := time.Now()
	t := time.NewTicker(500 * time.Millisecond)
	for floodCtx.Err() == nil {
		<-t.C
		d, err := admit()
		times = append(times, d)
		if d > time.Second {
			slow++
		}
		if err != nil {
			if failed == 0 {
				firstFail = fmt.Sprintf("%.1f s in: %v", time.Since(start).Seconds(), err)
			}
			failed++
		}
	}
	t.Stop()
	if err := fl.Wait(); err != nil {
		return fmt.Errorf("the flood: %w", err)
	}
	fmt.Printf("under the flood: %d admissions, median %s, slowest %s, %d over 1 s, %d failed\n", len(times), median(times), slices.Max(times), slow, failed)
	if firstFail != "" {
		fmt.Printf("first failure %s\n", firstFail)
	}
	fmt.Print(floodOut.String())
	// After: how long until admissions are quick again.
	after := time.Now()
	for {
		d, err := admit()
		if err == nil && d < time.Second {
			fmt.Printf("after the flood: a quick admission again %.1f s after it ended (%s)\n", time.Since(after).Seconds(), d)
			break
		}
		if time.Since(after) > 60*time.Second {
			fmt.Println("after the flood: no quick admission within 60 s")
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// clientCerts writes an admission configuration that gives the API server
// a client certificate for every webhook, and the CA file that signed it.
func clientCerts() (admission, caFile string, err error) {
	dir, err := os.MkdirTemp("", "webhookflood")
	if err != nil {
		return "", "", err
	}
	ca, err := pki.NewCA("webhook client CA")
	if err != nil {
		return "", "", err
	}
	certPEM, keyPEM, err := ca.Issue("kube-apiserver-webhook-client")
	if err != nil {
		return "", "", err
	}
	files := map[string]string{
		"kubeconfig": fmt.Sprintf("apiVersion: v1\nkind: Config\nusers:\n- name: \"*\"\n  user:\n    client-certificate-data: %s\n    client-key-data: %s\n",
			base64.StdEncoding.EncodeToString(certPEM), base64.StdEncoding.EncodeToString(keyPEM)),
		"admission.yaml": "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: MutatingAdmissionWebhook\n  configuration:\n" +
			"    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: " + filepath.Join(dir, "kubeconfig") + "\n",
		"ca.crt": string(ca.PEM),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o600); err != nil {
			return "", "", err
		}
	}
	return filepath.Join(dir, "admission.yaml"), filepath.Join(dir, "ca.crt"), nil
}

// floodFrom posts reviews to addr from flood clients for duration, and
// prints what came of them.
func floodFrom(addr string, flood, sources int, duration time.Duration) error {
	caPEM, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	// The flood comes from addresses of its own (127.0.1.N), as a pod's
	// would: the API server calls from 127.0.0.1.
	clients := make([]*http.Client, sources)
	for i := range clients {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i))}}
		clients[i] = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
			DialContext: d.DialContext, MaxIdleConnsPerHost: flood, MaxConnsPerHost: flood}}
	}
	body := reviewBody()
	var answered, held, refused atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range flood {
		wg.Add(1)
		hc := clients[i%sources]
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+inject.Path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					refused.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					held.Add(1)
				} else {
					answered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("the flood from %d address(es): %d reviews answered (%.0f a second), %d held back (429), %d refused or failed\n",
		sources, answered.Load(), float64(answered.Load())/duration.Seconds(), held.Load(), refused.Load())
	return nil
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LabelRelayNode: relay}},
		Spec:       corev1.PodSpec{ServiceAccountName: "web", Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
}

func reviewBody() []byte {
	raw, _ := json.Marshal(pod("flood"))
	b, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "flood", Namespace: ns, Operation: admissionv1.Create,
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Object: k8sruntime.RawExtension{Raw: raw}}})
	return b
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
