#!/usr/bin/env bash
# Builds the two images the MCS API conformance suite runs its pods from,
# under exactly the tags it names, without pulling anything (no registry is
# reachable here; hack/kind/node-image.sh builds the rest the same way):
#
#   alpine/socat:1.7.4.4     the "hello" backends: sh -c '<script>' that reads
#                            $MY_POD_IPS with grep -E, tr and awk, then runs
#                            socat TCP/UDP(6)-LISTEN:42 ... SYSTEM:'echo ...'
#   nicolaka/netshoot:v0.15  the "request" pod: sh, sleep, nslookup (whose
#                            A/AAAA/SRV output the suite parses with regexes:
#                            BIND's nslookup prints the shapes it expects),
#                            nc -v -w 2 -4/-6 (OpenBSD netcat), grep, awk
#
# Each is a small root filesystem made of Debian bookworm packages and their
# library dependencies (apt-get download, dpkg-deb), with busybox for the
# shell and text tools, as the Alpine originals have. Both are checked with
# docker run before they are kept: a socat listener started by the suite's
# own kind of script answers nc from the other image. Prints the two tags;
# cached until this script changes. As root, with a Docker engine
# (hack/dockerd.sh); then `kind load docker-image` them into each cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
SOCAT_IMAGE=alpine/socat:1.7.4.4
NETSHOOT_IMAGE=nicolaka/netshoot:v0.15
out=$root/bin/kind/mcs-images
log() { printf 'kind/mcs-images: %s\n' "$*" >&2; }
trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR

hack/dockerd.sh
stamp=$(sha256sum <hack/kind/mcs-images.sh | cut -c1-16)
current() { [[ $(docker image inspect -f '{{index .Config.Labels "hoplink.stamp"}}' "$1" 2>/dev/null) == "$stamp" ]]; }
if current "$SOCAT_IMAGE" && current "$NETSHOOT_IMAGE"; then
  echo "$SOCAT_IMAGE"
  echo "$NETSHOOT_IMAGE"
  exit 0
fi

# --- Debian packages -------------------------------------------------------------
SOCAT_PKGS=(busybox socat)
NETSHOOT_PKGS=(busybox bind9-dnsutils netcat-openbsd)
# The packages and everything they depend on (not what they recommend): the
# libraries their binaries load, and nothing that only maintainer scripts use.
closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "$@" | grep -v '^[ <]' | sort -u
}
# (The host's apt: Debian bookworm here and in CI.)
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[[ $codename == bookworm ]] || log "warning: this host is ${codename:-not Debian}; the images get its packages, not bookworm's"
# A fresh machine may have no package lists yet.
if ! apt-cache show "${SOCAT_PKGS[@]}" "${NETSHOOT_PKGS[@]}" >/dev/null 2>&1; then
  log "apt-get update (package lists are missing)"
  apt-get update -qq
fi
debs=$out/debs && mkdir -p "$debs"
mapfile -t all < <(closure "${SOCAT_PKGS[@]}" "${NETSHOOT_PKGS[@]}")
# Download only what is not cached yet: apt names each file as it would.
missing=()
while read -r _ file _; do
  [[ -f $debs/$file ]] || missing+=("${file%%_*}")
done < <(apt-get download --print-uris "${all[@]}")
if ((${#missing[@]})); then
  log "apt-get download ${#missing[@]} packages"
  # Stale package lists name versions the mirror no longer has: update, retry.
  download() { (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "${missing[@]}"); }
  download || { apt-get update -qq && download; }
fi
# The file of each package at the version apt would take now.
deb_of() { apt-get download --print-uris "$@" | awk -v d="$debs" '{print d "/" $2}'; }

# --- root filesystems --------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"; docker rm -f hoplink-mcs-socat-check >/dev/null 2>&1 || true' EXIT
# rootfs DIR PACKAGE...: the packages' closure unpacked into a merged-/usr
# tree, with busybox's applets for whatever no package provides.
rootfs() {
  local dir=$1 deb a
  shift
  mkdir -p "$dir"/usr/{bin,sbin,lib,lib64} "$dir"/{etc,tmp,root,proc,sys,dev,run,var/tmp}
  chmod 1777 "$dir/tmp" "$dir/var/tmp"
  for a in bin sbin lib lib64; do ln -s "usr/$a" "$dir/$a"; done
  mapfile -t pkgs < <(closure "$@")
  while read -r deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$dir"
  done < <(deb_of "${pkgs[@]}")
  rm -rf "$dir"/usr/share/{doc,man,info,locale,lintian,bug,doc-base,bash-completion}
  # dpkg would have set up these alternatives.
  [[ ! -e $dir/usr/bin/nc.openbsd ]] || ln -s nc.openbsd "$dir/usr/bin/nc"
  # busybox: sh, grep, awk, tr, sleep, ... (never in place of a real binary).
  # Debian's busybox-static would not do: its sh runs its own applets before
  # what PATH finds, so `sh -c 'nc ...'` got busybox's nc, not OpenBSD's.
  for a in $("$dir/usr/bin/busybox" --list); do
    [[ -e $dir/usr/bin/$a || -e $dir/usr/sbin/$a ]] || ln -s busybox "$dir/usr/bin/$a"
  done
  cat >"$dir/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/etc/group"
  printf 'hosts: files dns\nnetworks: files\n' >"$dir/etc/nsswitch.conf"
  printf 'include /etc/ld.so.conf.d/*.conf\n' >"$dir/etc/ld.so.conf"
  ldconfig -r "$dir"
  # Every binary must find its libraries.
  local bin missing_libs
  for bin in "$dir"/usr/bin/socat "$dir"/usr/bin/nslookup "$dir"/usr/bin/nc.openbsd; do
    [[ -e $bin ]] || continue
    missing_libs=$(chroot "$dir" /lib64/ld-linux-x86-64.so.2 --list "${bin#"$dir"}" | grep 'not found' || true)
    [[ -z $missing_libs ]] || { log "${bin#"$dir"} lacks libraries: $missing_libs"; return 1; }
  done
}
PATHS='PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# import DIR TAG CHANGE...: the tree as a one-layer image.
import() {
  local dir=$1 tag=$2
  shift 2
  local changes=(--change "ENV $PATHS" --change "LABEL hoplink.stamp=$stamp")
  for c in "$@"; do changes+=(--change "$c"); done
  tar -C "$dir" --numeric-owner -c . | docker import "${changes[@]}" - "$tag" >/dev/null
}

log "building $SOCAT_IMAGE and $NETSHOOT_IMAGE from Debian packages"
# Images these tags name now: removed once the new ones pass, so rebuilds
# leave no untagged images behind.
old=$(docker image inspect -f '{{.Id}}' "$SOCAT_IMAGE" "$NETSHOOT_IMAGE" 2>/dev/null || true)
rootfs "$work/socat" "${SOCAT_PKGS[@]}"
rootfs "$work/netshoot" "${NETSHOOT_PKGS[@]}"
# As upstream: alpine/socat's entrypoint is socat; netshoot has none, so a
# pod's args (the suite gives the request pod only args) are the command.
import "$work/socat" "$SOCAT_IMAGE" 'ENTRYPOINT ["socat"]'
import "$work/netshoot" "$NETSHOOT_IMAGE" 'CMD ["/bin/sh"]'

# --- check them ------------------------------------------------------------------------
fail() {
  log "check failed: $*"
  docker rm -f hoplink-mcs-socat-check >/dev/null 2>&1 || true
  docker rmi "$SOCAT_IMAGE" "$NETSHOOT_IMAGE" >/dev/null 2>&1 || true
  exit 1
}
# say IMAGE ARG...: what a command in the image prints (its status aside).
say() { docker run --rm --network none "$@" 2>&1 || true; }
[[ $(say --entrypoint socat "$SOCAT_IMAGE" -V) == *"socat version 1.7"* ]] || fail "socat -V"
usage=$(say "$NETSHOOT_IMAGE" nc -h)
for flag in -4 -6 -v -w -u; do
  grep -qE "^[[:space:]]+$flag[[:space:]]" <<<"$usage" || fail "nc -h shows no $flag: $usage"
done
[[ $(say "$NETSHOOT_IMAGE" nslookup -version) == "nslookup 9."* ]] || fail "nslookup -version"
[[ $(say "$NETSHOOT_IMAGE" sh -ec 'for t in sh grep awk tr sleep tail head echo; do command -v $t >/dev/null; done
  echo "10.1.2.3 fd00::1" | grep -qE "([^0-9]|^)[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}([^0-9]|$)"
  echo "10.1.2.3 fd00::1" | grep -qE "[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:]*"
  echo "a,b" | tr "," " " | awk "{print \$1}"') == a ]] || fail "shell tools"
# A listener like the suite's (dual-stack socket, as on a dual-stack pod),
# answered over IPv4 from the request image.
docker rm -f hoplink-mcs-socat-check >/dev/null 2>&1 || true
docker run -d --name hoplink-mcs-socat-check --entrypoint /bin/sh "$SOCAT_IMAGE" -c '
  first_ip=$(hostname -i | tr "," " " | awk "{print \$1}"); export first_ip
  exec socat TCP6-LISTEN:42,crlf,reuseaddr,fork,ipv6only=0 SYSTEM:"echo \"pod ip \$first_ip\""' >/dev/null
ip=$(docker inspect -f '{{.NetworkSettings.IPAddress}}' hoplink-mcs-socat-check)
answer=
for _ in $(seq 20); do
  answer=$(docker run --rm "$NETSHOOT_IMAGE" sh -c "echo hi | nc -v -w 2 -4 $ip 42 2>&1" || true)
  [[ $answer == *"pod ip $ip"* ]] && break
  sleep 0.5
done
[[ $answer == *"pod ip $ip"* ]] || fail "nc to the socat listener answered: $answer"
docker rm -f hoplink-mcs-socat-check >/dev/null
new=$(docker image inspect -f '{{.Id}}' "$SOCAT_IMAGE" "$NETSHOOT_IMAGE")
for id in $old; do
  grep -qx "$id" <<<"$new" || docker rmi "$id" >/dev/null 2>&1 || true # (in use: kept)
done
echo "$SOCAT_IMAGE"
echo "$NETSHOOT_IMAGE"
