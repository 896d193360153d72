package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hoplink/hoplink/inject"
)

// The suite runs a real kube-apiserver and etcd (hack/setup-envtest.sh builds
// them; `make test` sets KUBEBUILDER_ASSETS) with the CRDs from
// config/crd/bases, and the operator's manager against them.
var (
	cfg    *rest.Config
	k8s    client.Client
	testCA = types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}

	testWebhookSecret = types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-webhook-cert"}
	suiteStop         context.CancelFunc

	suiteOnce sync.Once
	suiteErr  error
	suiteDone func()
)

const (
	testWebhookConfig = "hoplink-sidecar-injector"
	testVersion       = "v0.0.0-test"
)

// TestMain stops the API server that needAPI started, if a test did; pure
// tests (helpers, builders of child objects) run without one.
func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel())))
	code := m.Run()
	if suiteDone != nil {
		suiteDone()
	}
	os.Exit(code)
}

// needAPI starts the suite's API server and the operator on it, once, for
// the tests that need them.
func needAPI(t testing.TB) {
	t.Helper()
	suiteOnce.Do(func() { suiteErr = startSuite() })
	if suiteErr != nil {
		t.Fatal(suiteErr)
	}
}

func startSuite() error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	// The injection webhook as the chart registers it, pointed at this
	// process: envtest turns the Service into a local URL (adding its own
	// "/"), and the operator then replaces envtest's caBundle with its own.
	hook := inject.WebhookConfiguration(testWebhookConfig, testCA.Namespace, "hoplink-webhook")
	hook.Webhooks[0].ClientConfig.Service.Path = ptr.To(strings.TrimPrefix(inject.Path, "/"))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{hook},
		},
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		return fmt.Errorf("start envtest: %w", err)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
		env.Stop()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	suiteStop = cancel
	mustCreateNamespace(ctx, testCA.Namespace)
	wh := &env.WebhookInstallOptions
	mgr, err := NewManager(ctx, cfg, Options{
		Image: "hoplink:test", AllowedRelayImages: []string{"allowed.example/hoplink:"}, CASecret: testCA, CreateCA: true,
		MetricsAddr: "0", ProbeAddr: "0", Version: testVersion,
		Webhook: WebhookOptions{Port: wh.LocalServingPort, Host: wh.LocalServingHost, Hosts: []string{wh.LocalServingHost},
			Secret: testWebhookSecret, Config: testWebhookConfig},
	})
	if err != nil {
		cancel()
		env.Stop()
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			panic(err)
		}
	}()
	// Pods created before the webhook answers would fail (it fails closed).
	// Dialed, not asked of the manager: asking it for its webhook server
	// would start one that NewManager forgot to.
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cancel()
			env.Stop()
			return fmt.Errorf("webhook server did not start: %w", err)
		}
	}
	suiteDone = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
		}
		env.Stop()
	}
	return nil
}

func zapLevel() zapcore.Level {
	if os.Getenv("HOPLINK_TEST_LOG") != "" {
		return -1
	}
	return 2 // errors only: envtest suites are chatty
}
