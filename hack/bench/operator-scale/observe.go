package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
)

// watchCache is what the bench reads while it runs: the readiness of every
// object, and what the stand-ins act on (relay DaemonSets, sidecar pods,
// their Services and EndpointSlices), from watches, as a kubelet and the
// EndpointSlice controller read them. Listing them all again every few
// seconds, 21,000 hoplink objects and 5,500 pods at full size, cost the
// shared API server (and the bench's own decoding) more than the operator
// being measured: see docs/benchmarks.md, issue 41.
func watchCache(ctx context.Context, cfg *rest.Config) (cache.Cache, error) {
	hasRelay, _ := labels.NewRequirement(controllers.LabelRelayNode, selection.Exists, nil)
	relays := cache.ByObject{Label: labels.NewSelector().Add(*hasRelay)}
	c, err := cache.New(cfg, cache.Options{Scheme: controllers.Scheme(), DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: relays, &corev1.Service{}: relays}})
	if err != nil {
		return nil, err
	}
	for _, o := range []client.Object{&v1alpha1.RelayNode{}, &v1alpha1.Chain{}, &v1alpha1.Tunnel{},
		&appsv1.DaemonSet{}, &corev1.Pod{}, &corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		if _, err := c.GetInformer(ctx, o); err != nil {
			return nil, err
		}
	}
	go c.Start(ctx)
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the bench's cache did not sync")
	}
	return c, nil
}

// profiles saves CPU profiles of the API server (its /debug/pprof, with
// the bench's admin credentials) and, when it serves one (OPERATOR_PPROF),
// the operator, each over the same seconds, into dir.
func profiles(ctx context.Context, cfg *rest.Config, operatorPprof, dir string, seconds int) {
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "profiles:", err)
		return
	}
	secs := fmt.Sprint(seconds)
	go func() {
		cs, err := kubernetes.NewForConfig(cfg)
		if err == nil {
			var body []byte
			body, err = cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).
				Timeout(time.Duration(seconds+60) * time.Second).DoRaw(ctx)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, "kube-apiserver.pprof"), body, 0o644)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kube-apiserver profile:", err)
		}
	}()
	if operatorPprof == "" {
		return
	}
	go func() {
		resp, err := http.Get("http://" + operatorPprof + "/debug/pprof/profile?seconds=" + secs)
		if err == nil {
			defer resp.Body.Close()
			var f *os.File
			if f, err = os.Create(filepath.Join(dir, "operator.pprof")); err == nil {
				_, err = f.ReadFrom(resp.Body)
				f.Close()
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "operator profile:", err)
		}
	}()
}
