#!/usr/bin/env bash
# mmdebstrap customize hook for build-image.sh: makes the root bootable under qemu and turns it
# into a test runner. $1 is the root directory.
set -euo pipefail
root=${1:?root}
echo corral-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 corral-vm\n::1 localhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
printf 'LABEL=corral-vm / ext4 rw,relatime 0 1\n' >"$root/etc/fstab"
# No password needed: nobody logs in, the unit below runs the tests and powers off.
chroot "$root" passwd -d root >/dev/null
# The rig runs its own containerd; the package's system service would only compete for the
# emulated CPUs. Timers that start apt or man-db jobs likewise.
for unit in containerd.service apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \
  fstrim.timer systemd-timesyncd.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
chmod 0755 "$root/usr/local/sbin/guest-boot.sh"
cat >"$root/etc/systemd/system/corral-vm.service" <<'UNIT'
[Unit]
Description=corral's end-to-end tests (scripts/test-vm.sh)
After=multi-user.target
Wants=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/guest-boot.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
# The host waits for qemu to exit: power off whatever happened.
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Install]
WantedBy=multi-user.target
UNIT
chroot "$root" systemctl enable corral-vm.service >/dev/null 2>&1
# Kernel messages and systemd's status go to the serial console the host records.
mkdir -p "$root/etc/systemd/system.conf.d"
printf '[Manager]\nShowStatus=yes\n' >"$root/etc/systemd/system.conf.d/corral.conf"
