#!/usr/bin/env bash
# Builds a kind node image without pulling anything (no registry is
# reachable here): a Debian bookworm root filesystem from Debian packages
# (systemd, containerd, runc, CNI plugins, iptables), the Kubernetes binaries
# and control-plane images built from Go modules (hack/kind/binaries.sh), and
# kind's own node files (entrypoint, systemd units) as kind's Go module ships
# them. Pods get a bridge network (no CNI DaemonSet image exists here) and
# runc goes through hack/kind/runcshim. Prints the image's name; cached
# until an input changes. As root, with a Docker engine (hack/dockerd.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
K8S_VERSION=${K8S_VERSION:-1.37.1}
ETCD_VERSION=${ETCD_VERSION:-3.7.0}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.6}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
# kubeadm is told to take every image from this repository, which is never
# contacted: the images are in the node already.
REPO=${REPO:-hoplink.local}
NODE_IMAGE=hoplink-kind-node:v$K8S_VERSION
out=$root/bin/kind
log() { printf 'kind/node-image: %s\n' "$*" >&2; }
trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR

hack/dockerd.sh
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }
K8S_VERSION=$K8S_VERSION ETCD_VERSION=$ETCD_VERSION COREDNS_VERSION=$COREDNS_VERSION KIND_VERSION=$KIND_VERSION hack/kind/binaries.sh
k8s=$out/k8s-$K8S_VERSION
stamp=$(cat hack/kind/node-image.sh hack/kind/runcshim/*.go hack/kind/pause/*.go | sha256sum | cut -c1-16)
if [[ $(docker image inspect -f '{{index .Config.Labels "hoplink.stamp"}}' "$NODE_IMAGE" 2>/dev/null) == "$stamp" ]]; then
  echo "$NODE_IMAGE"
  exit 0
fi

# --- root filesystem -----------------------------------------------------------
rootfs=$out/rootfs-bookworm
if [[ ! -f $rootfs/.complete ]]; then
  log "debootstrap Debian bookworm (once; about 5 minutes)"
  rm -rf "$rootfs"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,nftables,conntrack,ethtool,socat,iproute2,kmod,ca-certificates,procps,util-linux,mount,libseccomp2,jq \
    bookworm "$rootfs" http://deb.debian.org/debian >"$out/debootstrap.log" 2>&1 ||
    { log "debootstrap failed; see $out/debootstrap.log"; exit 1; }
  touch "$rootfs/.complete"
fi

# --- images for the node's containerd ------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"; docker rm -f hoplink-kind-build >/dev/null 2>&1 || true' EXIT
# docker build, quiet unless it fails (Debian's engine has only the legacy
# builder, which warns about it every time).
build() { if ! docker build -q "$@" >/dev/null 2>"$work/build.log"; then cat "$work/build.log" >&2; return 1; fi; }
mapfile -t wanted < <("$k8s/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" --image-repository "$REPO")
image_of() { printf '%s\n' "${wanted[@]}" | grep "^$REPO/$1:"; }
scratch_image() { # scratch_image NAME BINARY ENTRYPOINT-JSON: one static binary in /usr/local/bin
  local tag dir
  tag=$(image_of "$1")
  dir=$work/img-$1 && mkdir -p "$dir/usr/local/bin" "$dir/tmp" "$dir/etc"
  cp "$2" "$dir/usr/local/bin/"
  echo 'nobody:x:65534:65534:nobody:/:/sbin/nologin' >"$dir/etc/passwd"
  tar -C "$dir" -c . | docker import --change 'ENV PATH=/usr/local/bin' --change "ENTRYPOINT $3" - "$tag" >/dev/null
  echo "$tag"
}
tags=()
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  tags+=("$(scratch_image "$c" "$k8s/$c" "[\"/usr/local/bin/$c\"]")")
done
tags+=("$(scratch_image etcd "$out/etcd-$ETCD_VERSION/etcd" '["/usr/local/bin/etcd"]')")
tags+=("$(scratch_image coredns "$out/coredns-$COREDNS_VERSION/coredns" '["/usr/local/bin/coredns"]')")
tags+=("$(scratch_image pause "$out/tools/pause" '["/usr/local/bin/pause"]')")
# kube-proxy runs iptables: the Debian root filesystem with it added.
proxy=$(image_of kube-proxy)
tar -C "$rootfs" --exclude=./.complete -c . | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - hoplink-kind-proxy-base >/dev/null
printf 'FROM hoplink-kind-proxy-base\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' >"$work/Dockerfile.proxy"
cp "$k8s/kube-proxy" "$work/"
build -t "$proxy" -f "$work/Dockerfile.proxy" "$work"
tags+=("$proxy")
for w in "${wanted[@]}"; do
  printf '%s\n' "${tags[@]}" | grep -qx "$w" || { log "kubeadm wants $w, which this script does not build"; exit 1; }
done
docker save "${tags[@]}" -o "$work/images.tar"

# --- the node's own files --------------------------------------------------------
kindfiles=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')/images/base/files
[[ -d $kindfiles ]] || { log "kind's node files are not in sigs.k8s.io/kind@$KIND_VERSION"; exit 1; }
node=$work/node && mkdir -p "$node"
cp -a "$kindfiles/." "$node/"
chmod 0755 "$node/usr/local/bin/"* "$node/kind/bin/"*
mkdir -p "$node/usr/bin" "$node/usr/local/bin" "$node/etc/cni/net.d" "$node/etc/containerd" "$node/kind/manifests" "$node/etc/kubernetes/manifests"
for c in kubelet kubeadm kubectl; do cp "$k8s/$c" "$node/usr/bin/"; done
cp "$out/tools/runcshim" "$node/usr/local/bin/runcshim"
ln -sf /usr/bin/containerd "$node/usr/local/bin/containerd"
echo "v$K8S_VERSION" >"$node/kind/version"
cat >"$node/etc/containerd/config.toml" <<TOML
# hoplink's kind node: containerd 1.6 from Debian.
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(image_of pause)"
  tolerate_missing_hugepages_controller = true
  # The VM's bounding set lacks CAP_SYS_RESOURCE, which lowering a
  # container's oom_score_adj needs.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
        BinaryName = "/usr/local/bin/runcshim"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
# Pod network without a CNI DaemonSet (no image of one exists here): at boot,
# before containerd, each node takes 10.244.N.0/24 for its pods, N the last
# byte of its address on the kind network, and routes every other N's range
# to the node with that last byte. Where eth0 has a global IPv6 address too
# (kind's network is dual-stack when Docker gives it IPv6), likewise
# fd00:10:244:H::/64, H the last group of that address (Docker numbers a
# network's containers ::2, ::3, ...), routed to PREFIX::H: each family's
# ranges follow from that family's addresses alone, whatever order Docker
# gave them in. /etc/hoplink/pod-families (a kind extraMount), if there,
# names the families pods get ("ipv6" for an IPv6-only cluster on the
# dual-stack network). Nodes of every cluster on that network get distinct
# ranges.
cat >"$node/usr/local/bin/hoplink-pod-network" <<'SH'
#!/bin/bash
set -eu
addr=$(ip -4 -o addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1 | head -n1)
addr6=$(ip -6 -o addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1 | head -n1)
if [ -f /etc/hoplink/pod-families ]; then
  families=" $(tr -s ', \n' '  ' </etc/hoplink/pod-families) "
  case $families in *" ipv4 "*) ;; *) addr= ;; esac
  case $families in *" ipv6 "*) ;; *) addr6= ;; esac
fi
ranges= routes= batch=
if [ -n "$addr" ]; then
  net=${addr%.*} me=${addr##*.}
  ranges="[{\"subnet\": \"10.244.$me.0/24\"}]" routes='{"dst": "0.0.0.0/0"}'
  for n in $(seq 1 254); do
    [ "$n" = "$me" ] || batch+="route replace 10.244.$n.0/24 via $net.$n dev eth0 onlink"$'\n'
  done
fi
if [ -n "$addr6" ]; then
  prefix=${addr6%:*} me6=${addr6##*:}
  if [[ $addr6 != *::* || ! $me6 =~ ^[0-9a-f]{1,2}$ ]]; then
    echo "hoplink-pod-network: eth0's IPv6 address $addr6 is not PREFIX::H with H at most ff: no IPv6 pod range" >&2
    addr6=
  fi
fi
if [ -n "$addr6" ]; then
  sysctl -qw net.ipv6.conf.all.forwarding=1
  ranges+="${ranges:+, }[{\"subnet\": \"fd00:10:244:$me6::/64\"}]" routes+="${routes:+, }{\"dst\": \"::/0\"}"
  for n in $(seq 1 254); do
    h=$(printf %x "$n")
    [ "$h" = "$me6" ] || batch+="route replace fd00:10:244:$h::/64 via $prefix:$h dev eth0"$'\n'
  done
fi
[ -n "$ranges" ] || { echo "hoplink-pod-network: eth0 has no address for pods" >&2; exit 1; }
mkdir -p /etc/cni/net.d
cat >/etc/cni/net.d/10-bridge.conflist <<JSON
{"cniVersion": "0.4.0", "name": "hoplink-kind", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [$ranges], "routes": [$routes]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
printf '%s' "$batch" | ip -batch -
SH
chmod 0755 "$node/usr/local/bin/hoplink-pod-network"
cat >"$node/etc/systemd/system/hoplink-pod-network.service" <<'UNIT'
[Unit]
Description=hoplink pod network (bridge range and routes to the other nodes)
Before=containerd.service kubelet.service
After=network.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/hoplink-pod-network
[Install]
WantedBy=multi-user.target
UNIT
cat >"$node/kind/manifests/default-storage.yaml" <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
YAML

# --- assemble, then load the images into the node's containerd --------------------
log "assembling $NODE_IMAGE"
tar -C "$rootfs" --exclude=./.complete -c . | docker import - hoplink-kind-node-rootfs >/dev/null
cat >"$work/Dockerfile" <<'DOCKER'
FROM hoplink-kind-node-rootfs
COPY node/ /
RUN find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete; \
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*; \
    echo ReadKMsg=no >>/etc/systemd/journald.conf; \
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service hoplink-pod-network.service; \
    systemctl mask systemd-binfmt.service; \
    ln -sf /usr/lib/systemd/systemd /sbin/init
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
DOCKER
build -t hoplink-kind-node-stage -f "$work/Dockerfile" "$work"
docker rm -f hoplink-kind-build >/dev/null 2>&1 || true
docker run -d --name hoplink-kind-build --privileged --tmpfs /run --tmpfs /tmp hoplink-kind-node-stage >/dev/null
for _ in $(seq 120); do docker exec hoplink-kind-build ctr version >/dev/null 2>&1 && break; sleep 0.5; done
docker exec -i hoplink-kind-build ctr -n k8s.io images import --all-platforms --no-unpack --digests - <"$work/images.tar" >/dev/null
docker exec hoplink-kind-build ctr -n k8s.io images ls -q | grep -q "^$(image_of kube-apiserver)$" ||
  { log "images did not land in the node's containerd"; exit 1; }
docker exec hoplink-kind-build systemctl stop containerd
# (The entrypoint, environment and stop signal come from the stage image.)
docker commit --change "LABEL hoplink.stamp=$stamp" hoplink-kind-build "$NODE_IMAGE" >/dev/null
echo "$NODE_IMAGE"
