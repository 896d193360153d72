// Command mcscrds writes the Multi-Cluster Services API's CRDs
// (ServiceExport, ServiceImport), as the sigs.k8s.io/mcs-api module of
// go.mod embeds them, into a directory: the chart installs them from there
// (make manifests; make verify-manifests fails when they are stale).
//
//	go run ./hack/mcscrds charts/hoplink/files/mcs-crds
package main

import (
	"fmt"
	"os"
	"path/filepath"

	mcscrd "sigs.k8s.io/mcs-api/config/crd"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mcscrds DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, crd := range map[string][]byte{
		"multicluster.x-k8s.io_serviceexports.yaml": mcscrd.ServiceExportCRD,
		"multicluster.x-k8s.io_serviceimports.yaml": mcscrd.ServiceImportCRD,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), crd, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
