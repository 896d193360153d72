package controllers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// The suite runs a real kube-apiserver and etcd (hack/setup-envtest.sh builds
// them; `make test` sets KUBEBUILDER_ASSETS) with the CRDs from
// config/crd/bases, and the operator's manager against them.
var (
	cfg       *rest.Config
	k8s       client.Client
	testCA    = types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}
	suiteStop context.CancelFunc
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel())))
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Stderr.WriteString("controllers: KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)\n")
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		os.Stderr.WriteString("controllers: start envtest: " + err.Error() + "\n")
		return 1
	}
	defer env.Stop()
	if k8s, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	suiteStop = cancel
	defer cancel()
	mustCreateNamespace(ctx, testCA.Namespace)
	mgr, err := NewManager(ctx, cfg, Options{
		Image: "hoplink:test", CASecret: testCA, CreateCA: true,
		MetricsAddr: "0", ProbeAddr: "0",
	})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			panic(err)
		}
	}()
	code := m.Run()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	return code
}

func zapLevel() zapcore.Level {
	if os.Getenv("HOPLINK_TEST_LOG") != "" {
		return -1
	}
	return 2 // errors only: envtest suites are chatty
}
