# hoplink: `make demo` runs a three-relay chain on this machine,
# `make test` runs every test (as root it includes the network-namespace test).

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
FUZZSCALE ?= 2

CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN := bin/controller-gen-$(CONTROLLER_GEN_VERSION)

.PHONY: all build dist demo test e2e mcs-conformance fuzz vulncheck bench vet fmt clean manifests generate verify-manifests

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hoplink ./cmd/hoplink

# A release into dist/: static binaries for linux amd64 and arm64, the image
# (when a Docker engine answers) and SHA256SUMS; docs/standalone.md.
dist:
	VERSION=$(VERSION) GO=$(GO) hack/dist.sh

# The demo's "admin" Tunnel targets the metrics endpoint of the same process,
# so `curl 127.0.0.1:15200/metrics` goes hk -> seattle -> la and back.
demo: build
	bin/hoplink local -f examples/local --metrics-addr 127.0.0.1:9464

vet:
	$(GO) vet ./...
	@# dist builds arm64 too, at the end of CI: fail here, in the first minute, instead.
	GOOS=linux GOARCH=arm64 $(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# Packages run one at a time (-p 1): several of them time real traffic over
# emulated links, and on 2 cores they would otherwise measure each other.
test: vet verify-manifests
	@# envtest's kube-apiserver and etcd, built from Go modules once and cached in bin/k8s.
	assets=$$(hack/setup-envtest.sh) && KUBEBUILDER_ASSETS=$$assets $(GO) test -race -count=1 -p 1 -timeout 30m ./...

# Two kind clusters, the chart, the samples and traffic (as root, with a Docker
# engine; the first run builds the kind node image here, about 20 minutes).
e2e:
	$(GO) test -tags e2e -v -count=1 -timeout 60m ./e2e

$(CONTROLLER_GEN):
	GOBIN=$(CURDIR)/bin/cg-tmp $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv bin/cg-tmp/controller-gen $@ && rmdir bin/cg-tmp

# CRDs and the operator's ClusterRole from the markers in api/ and controllers/.
# The Helm chart carries copies (charts/hoplink/files/crds, files/operator-role.yaml).
manifests: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) crd rbac:roleName=hoplink-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	rm -f charts/hoplink/files/crds/*.yaml && cp config/crd/bases/*.yaml charts/hoplink/files/crds/
	cp config/rbac/role.yaml charts/hoplink/files/operator-role.yaml
	$(GO) run ./hack/mcscrds charts/hoplink/files/mcs-crds
	go run ./hack/apidocs

generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./api/...

# Fails when the committed CRDs, RBAC or deepcopy code are stale.
verify-manifests: $(CONTROLLER_GEN)
	@rm -rf bin/verify && mkdir -p bin/verify
	@$(CONTROLLER_GEN) crd rbac:roleName=hoplink-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=bin/verify/crd output:rbac:artifacts:config=bin/verify/rbac
	@$(GO) run ./hack/mcscrds bin/verify/mcs-crds
	@diff -r bin/verify/crd config/crd/bases && diff bin/verify/rbac/role.yaml config/rbac/role.yaml && \
		diff -r bin/verify/crd charts/hoplink/files/crds && diff bin/verify/rbac/role.yaml charts/hoplink/files/operator-role.yaml && \
		diff -r bin/verify/mcs-crds charts/hoplink/files/mcs-crds || \
		{ echo "config/ or charts/hoplink is stale: run make manifests"; exit 1; }
	@cp api/v1alpha1/zz_generated.deepcopy.go bin/verify/deepcopy.orig && $(CONTROLLER_GEN) object paths=./api/... && \
		{ diff -q bin/verify/deepcopy.orig api/v1alpha1/zz_generated.deepcopy.go >/dev/null || \
		{ echo "api/v1alpha1/zz_generated.deepcopy.go was stale (now regenerated): run make generate and commit"; exit 1; }; }

# Run every fuzz target (counts in hack/fuzz.sh); the seed corpus lives in testdata/fuzz.
fuzz:
	FUZZSCALE=$(FUZZSCALE) GO=$(GO) hack/fuzz.sh

# govulncheck against the vulnerability database from the module proxy;
# hack/vulncheck-accepted.txt lists what it lets through, and why.
vulncheck:
	GO=$(GO) hack/vulncheck.sh

bench: build
	hack/bench/forward.sh

clean:
	rm -rf bin dist

# The Multi-Cluster Services API's own conformance suite against the e2e's two
# kind clusters in multicluster mode: reused when E2E_KEEP=1 make e2e left
# them (E2E_REUSE), else made; prints the suite's summary (bin/mcs/ keeps its report).
mcs-conformance:
	E2E_REUSE=$${E2E_REUSE:-1} $(GO) test -tags e2e -v -count=1 -timeout 60m \
		-run 'TestClusters$$/(relays_ready_on_every_node|a_chain_across_two_clusters|services_by_name_across_clusters)$$' ./e2e
