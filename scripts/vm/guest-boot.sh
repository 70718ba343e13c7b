#!/bin/sh
# Runs in the guest as corral-vm.service. The host shares its checkout over virtio-9p (tag
# "corral") and names the path it has there on the kernel command line (corral.ws=PATH): mounted
# at the same path, the test binaries find the workspace through their compile-time
# CARGO_MANIFEST_DIR, the shim in target/debug and the busybox image in target/corral-rig.
# Then the checkout's own scripts/vm/guest-run.sh does the work, so the image does not change
# when the test procedure does.
set -eu
ws=
for arg in $(cat /proc/cmdline); do
  case $arg in corral.ws=*) ws=${arg#corral.ws=} ;; esac
done
[ -n "$ws" ] || { echo "guest-boot: no corral.ws= on the kernel command line" >&2; exit 1; }
mkdir -p "$ws"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,access=any corral "$ws"
exec bash "$ws/scripts/vm/guest-run.sh" "$ws"
