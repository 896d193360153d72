package controllers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestConfigManifestsApply sends every object of config/rbac, config/manager
// and config/samples to the API server as a server-side dry run, so a typo in
// a field or a sample the CRDs reject fails here rather than in a cluster.
func TestConfigManifestsApply(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	n := 0
	for _, dir := range []string{"rbac", "manager", "samples"} {
		files, _ := filepath.Glob(filepath.Join("..", "config", dir, "*.yaml"))
		for _, f := range files {
			if strings.HasSuffix(f, "kustomization.yaml") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
			for {
				var obj unstructured.Unstructured
				if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				if obj.Object == nil {
					continue
				}
				if dir == "samples" {
					obj.SetNamespace(ns)
				}
				if err := k8s.Create(ctx, &obj, client.DryRunAll); err != nil && !strings.Contains(err.Error(), "already exists") {
					t.Errorf("%s: %s %s: %v", f, obj.GetKind(), obj.GetName(), err)
				}
				n++
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d objects found under config/", n)
	}
}
