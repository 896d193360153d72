package controllers

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// The About API's ClusterProperty, as its CRD defines the kind: the test
// installs it, since the module that carries the real one is not served
// here. Only what the operator reads is in it.
const clusterPropertyCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterproperties.about.k8s.io
  # *.k8s.io groups need it; the About API is KEP 2149.
  annotations: {api-approved.kubernetes.io: "https://github.com/kubernetes/enhancements/pull/3084"}
spec:
  group: about.k8s.io
  scope: Cluster
  names: {kind: ClusterProperty, plural: clusterproperties, singular: clusterproperty}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              value: {type: string}
`

// A cluster is named by its ClusterProperty cluster.clusterset.k8s.io where
// the About API is installed and one exists, which wins over the flag (and
// the log says so); else by the flag; with neither, the error names both.
func TestClusterIdentity(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o := MultiClusterOptions{ClusterID: "from-flag"}

	// No About API: the flag.
	got, err := clusterIdentity(ctx, k8s, o, log)
	if err != nil || got.ClusterID != "from-flag" {
		t.Fatalf("without the About API: %q, %v", got.ClusterID, err)
	}
	if _, err := clusterIdentity(ctx, k8s, MultiClusterOptions{}, log); err == nil || !strings.Contains(err.Error(), "--cluster-id") || !strings.Contains(err.Error(), "cluster.clusterset.k8s.io") {
		t.Errorf("no ID at all: %v", err)
	}

	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal([]byte(clusterPropertyCRD), &crd); err != nil {
		t.Fatal(err)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{&crd}}); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string]string{PropertyClusterID: "east-1", PropertyClusterSet: "prod"} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(clusterPropertyGVK)
		u.SetName(name)
		unstructured.SetNestedField(u.Object, value, "spec", "value")
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	got, err = clusterIdentity(ctx, c, o, log)
	if err != nil || got.ClusterID != "east-1" || got.ClusterSet != "prod" {
		t.Errorf("with ClusterProperties: %+v, %v; want east-1 of prod", got, err)
	}
}
