package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// docs/api.md is what the CRDs say now.
func TestAPIReferenceIsGenerated(t *testing.T) {
	want, err := Render("../../config/crd/bases")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/api.md is stale: run go run ./hack/apidocs")
	}
	for _, field := range []string{"`spec.proxyProtocol`", "`spec.route`", "`spec.listen.port`", "`status.certificateNotAfter`"} {
		if !bytes.Contains(got, []byte(field)) {
			t.Errorf("docs/api.md has no row for %s", field)
		}
	}
}

// kubectlGet is a sample of `kubectl get` of a hoplink kind in the docs:
// the command line, then the header kubectl printed.
var kubectlGet = regexp.MustCompile(`(?m)^\$ kubectl\b(.*)\bget (relaynodes|relaynode|rn|chains|chain|ch|tunnels|tunnel|tnl)\b(.*)\n(.*)\n`)

// Every `kubectl get` sample of a hoplink kind in the README and docs has
// the columns the CRD prints now (NAME, then its printer columns; -o wide
// adds the others): a renamed or added column fails here until the
// samples are rerun.
func TestKubectlGetSamplesHaveTheCRDsColumns(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	cols := map[string][]apiextensionsv1.CustomResourceColumnDefinition{}
	crds, _ := filepath.Glob("../../config/crd/bases/*.yaml")
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatal(err)
		}
		n := crd.Spec.Names
		for _, name := range append([]string{n.Plural, n.Singular}, n.ShortNames...) {
			cols[name] = crd.Spec.Versions[0].AdditionalPrinterColumns
		}
	}
	samples := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range kubectlGet.FindAllStringSubmatch(string(b), -1) {
			samples++
			args := m[1] + " " + m[3]
			if strings.Contains(args, " -o ") && !strings.Contains(args, "-o wide") {
				continue // yaml, json, custom columns
			}
			want := []string{"NAME"}
			for _, c := range cols[m[2]] {
				if c.Priority == 0 || strings.Contains(args, "-o wide") {
					want = append(want, strings.ToUpper(c.Name))
				}
			}
			got := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(m[4]), -1)
			if !slices.Equal(got, want) {
				t.Errorf("%s: `$ kubectl%sget %s%s` shows the columns %q; %s prints %q now: rerun the sample", f, m[1], m[2], m[3], got, m[2], want)
			}
		}
	}
	if samples == 0 {
		t.Error("no kubectl get sample found: the README shows one (kubectl get relaynodes)")
	}
}
