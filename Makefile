# hoplink: `make demo` runs a three-relay chain on this machine,
# `make test` runs every test (as root it includes the network-namespace test).

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
FUZZTIME ?= 20s

.PHONY: all build demo test fuzz bench vet fmt clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hoplink ./cmd/hoplink

# The demo's "admin" Tunnel targets the metrics endpoint of the same process,
# so `curl 127.0.0.1:15200/metrics` goes hk -> seattle -> la and back.
demo: build
	bin/hoplink local -f examples/local --metrics-addr 127.0.0.1:9464

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: vet
	$(GO) test -race -count=1 -timeout 20m ./...

# Run every fuzz target for FUZZTIME; the seed corpus lives in testdata/fuzz.
fuzz:
	$(GO) test ./relay/hop -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./relay/hop -run '^$$' -fuzz '^FuzzParseDatagram$$' -fuzztime $(FUZZTIME)

bench: build
	hack/bench/forward.sh

clean:
	rm -rf bin
