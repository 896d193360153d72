#!/usr/bin/env bash
# Makes sure a Docker engine answers, starting Debian's dockerd (apt-get
# install docker.io) when none runs. On VMs whose capability bounding set
# lacks CAP_SYS_RESOURCE, runc cannot start any container (--privileged
# fails with "unable to apply caps"); the engine started here runs
# containers through hack/kind/runcshim, which takes that capability out of
# each container's spec first. As root.
#
#   hack/dockerd.sh && hack/docker-build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# The shim is (re)installed each time: an engine may already use it.
if [[ $(id -u) == 0 ]]; then
  mkdir -p bin/kind
  CGO_ENABLED=0 go build -trimpath -o bin/kind/runcshim ./hack/kind/runcshim
  install -m 0755 bin/kind/runcshim /usr/local/bin/hoplink-runcshim
fi
if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null; then
  echo "dockerd.sh: no Docker engine here: apt-get install docker.io, then run again" >&2
  exit 2
fi
runtime=runc
if ! grep -q '^CapBnd:.*' /proc/self/status || (( (0x$(awk '/^CapBnd/{print $2}' /proc/self/status) >> 24) & 1 )); then
  : # CAP_SYS_RESOURCE is there: plain runc works
else
  runtime=runcshim
fi
mkdir -p /etc/docker
if [[ ! -f /etc/docker/daemon.json ]]; then
  printf '{"runtimes": {"runcshim": {"path": "/usr/local/bin/hoplink-runcshim"}}, "default-runtime": "%s"}\n' "$runtime" >/etc/docker/daemon.json
elif [[ $runtime == runcshim ]] && ! grep -q runcshim /etc/docker/daemon.json; then
  echo "dockerd.sh: /etc/docker/daemon.json exists without the runcshim runtime this machine needs; add it as the default runtime" >&2
  exit 2
fi
echo "dockerd.sh: starting dockerd (default runtime $runtime; log in bin/kind/dockerd.log)" >&2
nohup dockerd >bin/kind/dockerd.log 2>&1 &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd.sh: dockerd did not answer within 30 s; see bin/kind/dockerd.log" >&2
exit 1
