#!/usr/bin/env bash
# govulncheck over every package, against the Go vulnerability database as the
# module proxy serves it (the module golang.org/x/vulndb, whose data/osv holds
# every report): its newest version where the proxy answers, else the pinned
# one below from the module cache. vuln.go.dev itself need not be reachable.
# The database is laid out for `govulncheck -db file://` once per version in
# bin/vulndb/; a run takes about 40 s (and 4 GiB) on 2 cores.
#
# Fails on a vulnerability the code calls, unless hack/vulncheck-accepted.txt
# lists it with a reason; accepted ones are printed every run, and an entry
# no longer found is reported so that the list shrinks.
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
GOVULNCHECK_VERSION=${GOVULNCHECK_VERSION:-v1.9.0}
VULNDB_PINNED=${VULNDB_PINNED:-v0.0.0-20261105234957-e22db6528018}
VULNDB=${VULNDB:-latest} # or a version, or "pinned"

mkdir -p bin/vulndb
tool() { # name package version: bin/NAME-VERSION, built once
  local bin=bin/$1-$3
  if [[ ! -x $bin ]]; then
    rm -rf "bin/tmp-$1" && GOBIN=$PWD/bin/tmp-$1 GOFLAGS=-mod=mod "$go" install "$2@$3" >&2
    mv "bin/tmp-$1/$1" "$bin" && rmdir "bin/tmp-$1"
  fi
  echo "$bin"
}
download() { # version -> the module's directory, or nothing
  GOFLAGS=-mod=mod timeout 120 "$go" mod download -json "golang.org/x/vulndb@$1" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir","") if not d.get("Error") else "")' || true
}

[[ $VULNDB == pinned ]] && VULNDB=$VULNDB_PINNED
dir=$(download "$VULNDB")
if [[ -z $dir && $VULNDB != "$VULNDB_PINNED" ]]; then
  echo "vulncheck: golang.org/x/vulndb@$VULNDB not available; using the pinned $VULNDB_PINNED" >&2
  dir=$(download "$VULNDB_PINNED")
fi
[[ -n $dir ]] || { echo "vulncheck: no copy of golang.org/x/vulndb (not even $VULNDB_PINNED in the module cache)" >&2; exit 1; }
version=${dir##*@}
db=bin/vulndb/$version
if [[ ! -f $db/index/modules.json ]]; then
  indexdb=$(tool indexdb golang.org/x/vulndb/cmd/indexdb "$VULNDB_PINNED")
  rm -rf "$db.tmp" && "$indexdb" -vulns "$dir/data/osv" -out "$db.tmp" && mv "$db.tmp" "$db"
fi
govulncheck=$(tool govulncheck golang.org/x/vuln/cmd/govulncheck "$GOVULNCHECK_VERSION")
echo "vulncheck: govulncheck $GOVULNCHECK_VERSION, database golang.org/x/vulndb@$version, $("$go" env GOVERSION)"

out=bin/vulndb/findings.json
"$govulncheck" -db "file://$PWD/$db" -format json ./... >"$out"
python3 hack/vulncheck-report.py "$out" hack/vulncheck-accepted.txt
