package main

import (
	"bytes"
	"os"
	"testing"
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
