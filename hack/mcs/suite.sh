#!/usr/bin/env bash
# The Multi-Cluster Services API's own conformance suite (KEP 1645), built
# from the read-only copy beside the project and run against a clusterset.
#
#   hack/mcs/suite.sh build
#       builds bin/mcs/mcs-conformance.test once (about 2 minutes; again only
#       when the suite's files or the Go version change) and prints its path
#   hack/mcs/suite.sh run KUBECONFIG CONTEXTS [LABEL_FILTER]
#       runs it against the clusters of CONTEXTS (comma-separated kubeconfig
#       contexts; the first one is where the suite deploys and exports its
#       service), prints a summary of its report and exits non-zero when a
#       spec failed. report.yaml and report.html, the suite's log and its
#       ginkgo JSON report are kept in bin/mcs/.
#
# The suite is module sigs.k8s.io/mcs-api/conformance, which the module proxy
# does not serve: it is kept unmodified in ../shared/third_party/
# mcs-api-conformance, seen from the directory that holds this repository
# (MCS_SUITE_DIR overrides). Never edit it or copy it into the project.
# Its pods need alpine/socat:1.7.4.4 and nicolaka/netshoot:v0.15 in every
# cluster: hack/kind/mcs-images.sh builds them.
#
# Environment: MCS_SUITE_DIR, MCS_TIMEOUT (ginkgo's whole-suite timeout,
# default 60m), MCS_ARGS (more flags for the suite, e.g.
# --skip-verify-eps-managed-by or --ginkgo.focus=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
suite=${MCS_SUITE_DIR:-$root/../shared/third_party/mcs-api-conformance}
out=$root/bin/mcs
bin=$out/mcs-conformance.test
# The labels of issue 36's target (every spec of the suite today).
DEFAULT_FILTER='Required || ClusterIP || Headless || ExternalName || DNS || Connectivity || EndpointSlice || ExportedLabels || StrictPortConflict'
log() { printf 'mcs/suite: %s\n' "$*" >&2; }

build() {
  [[ -f $suite/go.mod && -f $suite/conformance_suite.go ]] ||
    { log "no conformance suite in $suite (set MCS_SUITE_DIR)"; exit 2; }
  suite=$(cd "$suite" && pwd)
  mkdir -p "$out"
  local stamp
  stamp=$( (cd "$suite" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name '*.gohtml' \) -print0 |
    sort -z | xargs -0 sha256sum; go env GOVERSION) | sha256sum | cut -c1-16)
  if [[ -x $bin && $(cat "$bin.stamp" 2>/dev/null) == "$stamp" ]]; then
    echo "$bin"
    return
  fi
  log "building the conformance suite from $suite (about 2 minutes)"
  # The suite's directory may be read-only: go only reads it (-mod=readonly,
  # the module cache and build cache live elsewhere).
  (cd "$suite" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go test -c -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
  echo "$stamp" >"$bin.stamp"
  echo "$bin"
}

run() {
  local kubeconfig=$1 contexts=$2 filter=${3:-$DEFAULT_FILTER}
  [[ -f $kubeconfig ]] || { log "no kubeconfig at $kubeconfig"; exit 2; }
  kubeconfig=$(cd "$(dirname "$kubeconfig")" && pwd)/$(basename "$kubeconfig")
  build >/dev/null
  # The summarizer, built before the long run so a broken one shows at once.
  go build -o "$out/report" ./hack/mcs/report
  local version
  version=$(git describe --tags --always --dirty 2>/dev/null || echo unknown)
  # The suite writes report.html and report.yaml where it runs.
  dir=$(mktemp -d) # (global: the trap runs after run returns)
  trap 'rm -rf "$dir"' EXIT
  rm -f "$out"/report.yaml "$out"/report.html "$out"/report.json
  local color=()
  [[ -t 1 ]] || color=(--ginkgo.no-color)
  log "running the suite on $contexts (filter: $filter); log in $out/suite.log"
  local rc=0
  # shellcheck disable=SC2086 # MCS_ARGS is a list of flags
  (cd "$dir" && "$bin" \
    --kubeconfig "$kubeconfig" \
    --contexts "$contexts" \
    --ginkgo.label-filter "$filter" \
    --ginkgo.v "${color[@]}" \
    --ginkgo.timeout "${MCS_TIMEOUT:-60m}" \
    --ginkgo.json-report report.json \
    --organization hoplink --project hoplink --version "$version" \
    --url https://github.com/hoplink/hoplink/blob/main/docs/multi-cluster.md \
    ${MCS_ARGS:-}) 2>&1 | tee "$out/suite.log" || rc=$?
  for f in report.yaml report.html report.json; do
    [[ ! -f $dir/$f ]] || cp "$dir/$f" "$out/$f"
  done
  echo
  if [[ ! -f $out/report.yaml ]]; then
    log "the suite wrote no report.yaml (exit status $rc); see $out/suite.log"
    exit $((rc == 0 ? 1 : rc))
  fi
  local verdict=0
  "$out/report" "$out/report.yaml" || verdict=$?
  echo "report: $out/report.html, $out/report.yaml; log: $out/suite.log"
  if ((rc != 0 && verdict == 0)); then
    # E.g. a spec outside the Required/Optional groups of the report, or a
    # clean-up that failed.
    log "the suite exited with status $rc although its report shows no failed spec; see $out/suite.log"
  fi
  ((verdict == 0 && rc == 0)) || exit 1
}

case ${1:-} in
build) build ;;
run)
  [[ $# -ge 3 && $# -le 4 ]] || { echo "usage: $0 run KUBECONFIG CONTEXTS [LABEL_FILTER]" >&2; exit 2; }
  shift
  run "$@"
  ;;
*)
  echo "usage: $0 build | run KUBECONFIG CONTEXTS [LABEL_FILTER]" >&2
  exit 2
  ;;
esac
