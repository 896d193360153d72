package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// multiClusterDoc is the page TestClusters follows for its chain across two
// clusters: it reads its manifests and commands from there.
const multiClusterDoc = "docs/multi-cluster.md"

// blockRE is a fenced block that a comment names for the test.
var blockRE = regexp.MustCompile("(?s)<!-- e2e: ([a-z0-9-]+) -->\n```[a-z]*\n(.*?)```")

// docBlocks is the named blocks of the page at path, by name.
func docBlocks(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range blockRE.FindAllStringSubmatch(string(b), -1) {
		if _, dup := out[m[1]]; dup {
			return nil, fmt.Errorf("%s: two blocks named %s", path, m[1])
		}
		out[m[1]] = m[2]
	}
	return out, nil
}

// docObject is one manifest of the page.
type docObject struct {
	kind, name, namespace string
	doc                   string
	relay                 *v1alpha1.RelayNode
}

// parseManifests reads a block of manifests strictly, as the API server's
// schema would: every document has apiVersion, kind and a namespace.
func parseManifests(t *testing.T, name, block string) []docObject {
	t.Helper()
	var out []docObject
	for i, doc := range strings.Split(block, "\n---\n") {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s, document %d: %v", name, i+1, err)
		}
		if head.APIVersion != v1alpha1.GroupVersion.String() || head.Kind == "" {
			t.Errorf("%s, document %d: apiVersion %q, kind %q; want %s and a kind", name, i+1, head.APIVersion, head.Kind, v1alpha1.GroupVersion)
		}
		var obj interface {
			GetName() string
			GetNamespace() string
		}
		o := docObject{kind: head.Kind, doc: doc}
		switch head.Kind {
		case "RelayNode":
			o.relay = &v1alpha1.RelayNode{}
			obj = o.relay
		case "Chain":
			obj = &v1alpha1.Chain{}
		case "Tunnel":
			obj = &v1alpha1.Tunnel{}
		default:
			t.Fatalf("%s, document %d: kind %q", name, i+1, head.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s, document %d: %v", name, i+1, err)
		}
		o.name, o.namespace = obj.GetName(), obj.GetNamespace()
		if o.name == "" || o.namespace == "" {
			t.Errorf("%s, document %d: metadata names no name or no namespace", name, i+1)
		}
		out = append(out, o)
	}
	return out
}

// The page's manifests parse, name their apiVersion, kind and one namespace,
// and describe one chain in both clusters: the same Chain and Tunnel, each
// relay at home in one cluster (on its own nodes and port) and external in
// the other at the same endpoints. Its certificate commands move no CA key.
// TestClusters applies and runs these very blocks.
func TestMultiClusterDoc(t *testing.T) {
	blocks, err := docBlocks(filepath.Join("..", multiClusterDoc))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"trust", "cluster-a", "cluster-b"} {
		if blocks[name] == "" {
			t.Fatalf("%s: no block <!-- e2e: %s -->", multiClusterDoc, name)
		}
	}
	var src []byte
	for _, f := range []string{"e2e_test.go", "mcs_test.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	for name := range blocks {
		if !bytes.Contains(src, []byte(`blocks["`+name+`"]`)) {
			t.Errorf("TestClusters does not use the block %s of %s", name, multiClusterDoc)
		}
	}
	if strings.Contains(blocks["trust"], "tls.key") {
		t.Errorf("the trust commands move a CA key between clusters:\n%s", blocks["trust"])
	}

	a, b := parseManifests(t, "cluster-a", blocks["cluster-a"]), parseManifests(t, "cluster-b", blocks["cluster-b"])
	namespaces := map[string]bool{}
	byKey := func(os []docObject) map[string]docObject {
		m := map[string]docObject{}
		for _, o := range os {
			namespaces[o.namespace] = true
			m[o.kind+"/"+o.name] = o
		}
		return m
	}
	ma, mb := byKey(a), byKey(b)
	if len(namespaces) != 1 {
		t.Errorf("the manifests are in namespaces %v: a chain across clusters lives in one namespace of the same name in both", namespaces)
	}
	kinds := map[string]int{}
	for k, oa := range ma {
		kinds[oa.kind]++
		if oa.kind == "RelayNode" {
			continue
		}
		ob, ok := mb[k]
		if !ok {
			t.Errorf("%s is in cluster A's manifests only", k)
		} else if oa.doc != ob.doc {
			t.Errorf("%s differs between the clusters:\n%s\n---\n%s", k, oa.doc, ob.doc)
		}
	}
	if kinds["Chain"] != 1 || kinds["Tunnel"] != 1 {
		t.Errorf("want the Chain and the Tunnel in both clusters; cluster A has %v", kinds)
	}
	// Cluster A's own relays come from config/samples.
	samples, err := os.ReadFile("../config/samples/hoplink_v1alpha1_relaynode.yaml")
	if err != nil {
		t.Fatal(err)
	}
	home := map[string]string{}
	for _, o := range append(slices.Clone(a), b...) {
		if o.relay == nil {
			continue
		}
		r := o.relay
		cluster := "B"
		if _, inA := ma["RelayNode/"+o.name]; inA && ma["RelayNode/"+o.name].doc == o.doc {
			cluster = "A"
		}
		if r.Spec.External {
			other := mb
			if cluster == "B" {
				other = ma
			}
			h, ok := other["RelayNode/"+r.Name]
			switch {
			case ok && h.relay.Spec.External:
				t.Errorf("RelayNode %s is external in both clusters", r.Name)
			case ok && !slices.Equal(h.relay.Spec.Endpoints, r.Spec.Endpoints):
				t.Errorf("RelayNode %s: endpoints %v at home, %v where it is external", r.Name, h.relay.Spec.Endpoints, r.Spec.Endpoints)
			case !ok && !bytes.Contains(samples, []byte("metadata: {name: "+r.Name+"}")):
				t.Errorf("RelayNode %s is external in cluster %s and at home nowhere", r.Name, cluster)
			}
			continue
		}
		if prev, dup := home[r.Name]; dup {
			t.Errorf("RelayNode %s runs in clusters %s and %s", r.Name, prev, cluster)
		}
		home[r.Name] = cluster
		if len(r.Spec.NodeSelector) == 0 || r.Spec.Listen.Port == 0 {
			t.Errorf("RelayNode %s runs with no nodeSelector or no listen port: relays on one node's network would take one port", r.Name)
		}
	}
}
