#!/usr/bin/env bash
# Makes the Debian root filesystem of the real node's KubeVirt handler or launcher image, as a
# tar: rootfs.sh handler|launcher OUT.tar. KubeVirt's own images are CentOS Stream; these carry
# Debian 13's libvirt (11.3) and QEMU (10.0) instead — KubeVirt 1.7's storage migration asks for
# libvirt parameters that Debian 12's 9.0 lacks — with what KubeVirt expects of them:
#   - virtqemud: Debian builds no modular daemons, so /usr/sbin/virtqemud is a shim that runs
#     libvirtd (which serves the QEMU driver) and gives its sockets virtqemud's names;
#   - /etc/libvirt/qemu.conf readable by the non-root launcher (Debian: 0600), and
#     virtqemud.conf, which the launcher copies;
#   - the users KubeVirt runs QEMU as: qemu (107) and Debian's libvirt-qemu;
#   - /var/run a relative link, as on CentOS Stream.
# SOURCE_DATE_EPOCH makes the tar the same on every run.
set -euo pipefail
kind=$1 out=$2
suite=trixie
mirror="deb http://deb.debian.org/debian $suite main"
updates="deb http://deb.debian.org/debian $suite-updates main"
security="deb http://deb.debian.org/debian-security $suite-security main"
common=findutils,procps,tar,util-linux,nftables,iproute2,xorriso,ca-certificates
case $kind in
handler) include=$common,qemu-utils ;;
launcher) include=$common,ethtool,qemu-utils,qemu-system-x86,libvirt-daemon,libvirt-daemon-driver-qemu,libvirt-daemon-system,libvirt-clients ;;
*) echo "rootfs.sh: handler or launcher, not $kind" >&2; exit 64 ;;
esac
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}

hook=$(mktemp)
trap 'rm -f "$hook"' EXIT
cat >"$hook" <<'HOOK'
#!/bin/sh
set -e
root=$1
# KubeVirt's handler reaches into a launcher through /proc/PID/root (a live migration's proxy
# sockets): Debian's absolute /var/run -> /run would resolve in the handler's own root there.
# CentOS Stream's link is relative, as this one.
ln -sfn ../run "$root/var/run"
grep -q '^qemu:' "$root/etc/group" || echo 'qemu:x:107:' >>"$root/etc/group"
grep -q '^qemu:' "$root/etc/passwd" || echo 'qemu:x:107:107:qemu:/:/sbin/nologin' >>"$root/etc/passwd"
if [ -x "$root/usr/sbin/libvirtd" ]; then
  chmod 0644 "$root/etc/libvirt/qemu.conf"
  printf 'unix_sock_rw_perms = "0700"\nlog_outputs = "1:stderr"\n' >"$root/etc/libvirt/virtqemud.conf"
  mkdir -p "$root/var/log/libvirt"
  cat >"$root/usr/sbin/virtqemud" <<'SHIM'
#!/bin/sh
# virtqemud for KubeVirt on Debian: libvirtd, whose sockets get virtqemud's names.
dir=${XDG_RUNTIME_DIR:-/var/run}/libvirt
if [ "$(id -u)" = 0 ]; then dir=/var/run/libvirt; fi
mkdir -p "$dir"
(
  for _ in $(seq 600); do [ -S "$dir/libvirt-sock" ] && break; sleep 0.1; done
  ln -sf libvirt-sock "$dir/virtqemud-sock"
  ln -sf libvirt-sock-ro "$dir/virtqemud-sock-ro"
  ln -sf libvirt-admin-sock "$dir/virtqemud-admin-sock"
) &
exec /usr/sbin/libvirtd "$@"
SHIM
  chmod 0755 "$root/usr/sbin/virtqemud"
fi
HOOK
chmod +x "$hook"

mmdebstrap --variant=minbase --mode=root --format=tar --include="$include" \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook="$hook \"\$1\"" \
  "$suite" "$out.tmp" "$mirror" "$updates" "$security"
mv "$out.tmp" "$out"
