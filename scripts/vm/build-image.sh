#!/usr/bin/env bash
# Builds the VM image scripts/test-vm.sh boots: a Debian 12 root made by mmdebstrap with systemd
# as pid 1, Debian's kernel, and containerd 2.1 + runc + CNI plugins + busybox-static installed by
# scripts/install-deps.sh inside it, exactly as on a node.
#   usage: build-image.sh OUT_DIR
# OUT_DIR gets root.img (raw ext4), vmlinuz and initrd.img (taken from the root's /boot, so the
# initramfs is the one initramfs-tools made for that kernel). Needs root, mmdebstrap, e2fsprogs
# and Debian's mirror (the same apt sources install-deps.sh uses).
set -euo pipefail
out=${1:?usage: build-image.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd -P)
scripts=$(dirname "$here")
log() { printf 'vm-image: %s\n' "$*" >&2; }

mkdir -p "$out"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

# What the guest needs besides install-deps.sh's packages: systemd as init, a kernel whose
# initramfs initramfs-tools builds here, D-Bus (runc's and kubelet's way to systemd, as on a node)
# and the tools the tests call (ip, python3, ps).
pkgs=systemd,systemd-sysv,dbus,udev,kmod,linux-image-amd64,initramfs-tools,iproute2,procps,python3,ca-certificates
mirror=http://deb.debian.org/debian
log "mmdebstrap bookworm into $root"
mmdebstrap --mode=root --variant=minbase --include="$pkgs" \
  --customize-hook="copy-in $scripts/install-deps.sh /root" \
  --customize-hook='chroot "$1" bash /root/install-deps.sh' \
  --customize-hook="copy-in $here/guest-boot.sh /usr/local/sbin" \
  --customize-hook="$here/configure-root.sh \"\$1\"" \
  bookworm "$root" \
  "deb $mirror bookworm main" \
  "deb $mirror bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main" >&2

cp "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)" "$work/vmlinuz"
cp "$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)" "$work/initrd.img"
# The guest writes only to its own copy-on-write overlay of this file (see test-vm.sh): 6 GiB
# sparse leaves room for containerd's content store and snapshots.
log "ext4 image"
truncate -s 6G "$work/root.img"
mkfs.ext4 -q -F -L corral-vm -d "$root" "$work/root.img"
mv "$work/vmlinuz" "$work/initrd.img" "$work/root.img" "$out/"
log "done: $(du -h --apparent-size "$out/root.img" | cut -f1) image, $(du -sh "$root" | cut -f1) of files"
