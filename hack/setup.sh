#!/usr/bin/env bash
# Installs the Debian packages the tests, benchmarks and demo use, when any is missing;
# `hack/setup.sh cluster` adds what the real single-node cluster (test/cluster) runs: containerd,
# runc, iptables, conntrack, iproute2, ca-certificates (shipped in diskpipe's image),
# xfsprogs, whose reflink filesystem holds its CSI driver's volumes, and ipset, which
# kube-router's NetworkPolicy controller programs.
# Go tools and the Kubernetes binaries are built from Go modules by the Makefile.
set -euo pipefail

# qemu-system-x86, syslinux, mtools and dosfstools make and boot the tests' bootable disk (test/bootdisk);
# its kernel and busybox are fetched as .deb files (apt-get download), never installed. tmux runs
# kubectl diskpipe in a real terminal in the end-to-end suite.
# gcc, libc6-dev, libdeflate-dev and liblzma-dev build the importer's libdeflate inflater and
# liblzma xz decoder (cgo; `file` checks the image's importer is static); nginx-light serves `make bench-import`'s image as a mirror would; getcap (libcap2-bin) reads
# the file capabilities hack/image gives. chromium (and a font) runs the console's pages in the
# browser tests, headless.
packages=(qemu-utils awscli e2fsprogs xz-utils zstd curl util-linux docker-registry ca-certificates
  qemu-system-x86 syslinux syslinux-common mtools dosfstools tmux
  gcc libc6-dev libdeflate-dev liblzma-dev file nginx-light libcap2-bin chromium fonts-dejavu-core)
if [ "${1:-}" = cluster ]; then
  packages+=(containerd runc iptables conntrack iproute2 socat ethtool xfsprogs ipset)
fi
# `hack/setup.sh kubevirt`: what building KubeVirt's handler and launcher links (libvirt) and
# what makes their images' Debian root filesystems.
if [ "${1:-}" = kubevirt ]; then
  packages+=(libvirt-dev linux-libc-dev mmdebstrap)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing Debian packages: ${missing[*]} (run as root, or apt-get install them)" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
