package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// kubectl get shows READY and REASON for every kind, MESSAGE under -o wide
// (priority 1), Tunnels their listen address and target, Chains their entry
// and exit, RelayNodes their certificate's expiry: the API server's own
// table for each kind, as kubectl asks for it.
func TestKubectlColumns(t *testing.T) {
	needAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := "columns"
	mustCreateNamespace(ctx, ns)
	if err := k8s.Create(ctx, tunnel(ns, "web", "missing", 8080)); err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := func(resource string) (*metav1.Table, error) {
		u := fmt.Sprintf("%s/apis/hoplink.dev/v1alpha1/namespaces/%s/%s", strings.TrimSuffix(cfg.Host, "/"), ns, resource)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var tb metav1.Table
		if err := json.Unmarshal(b, &tb); err != nil {
			return nil, fmt.Errorf("GET %s: %w: %s", u, err, b)
		}
		return &tb, nil
	}
	want := map[string][]string{
		"tunnels":    {"Chain", "Protocol", "Listen", "Target", "Ready", "Reason"},
		"chains":     {"Entry", "Exit", "Mode", "Route", "Ready", "Reason"},
		"relaynodes": {"Desired", "Available", "Ready", "Reason", "Cert Expires"},
	}
	for resource, cols := range want {
		tb, err := table(resource)
		if err != nil {
			t.Fatalf("%s: %v", resource, err)
		}
		var shown, wide []string
		for _, c := range tb.ColumnDefinitions {
			if c.Priority == 0 {
				shown = append(shown, c.Name)
			} else {
				wide = append(wide, c.Name)
			}
		}
		for _, c := range cols {
			if !slices.Contains(shown, c) {
				t.Errorf("kubectl get %s shows %v, not %s", resource, shown, c)
			}
		}
		if !slices.Contains(wide, "Message") {
			t.Errorf("kubectl get %s -o wide adds %v, not Message", resource, wide)
		}
	}

	// The Tunnel's row says what is wrong: not ready, and why.
	eventually(t, "the Tunnel's row says it is not ready", func() error {
		tb, err := table("tunnels")
		if err != nil {
			return err
		}
		if len(tb.Rows) != 1 {
			return fmt.Errorf("%d rows", len(tb.Rows))
		}
		row := map[string]any{}
		for i, c := range tb.ColumnDefinitions {
			row[c.Name] = tb.Rows[0].Cells[i]
		}
		if row["Ready"] != "False" || row["Reason"] == "" || row["Reason"] == nil || row["Target"] != "backend.example:80" {
			return fmt.Errorf("row %v", row)
		}
		return nil
	})
}
