#!/usr/bin/env bash
# Installs what corral's rig needs on a fresh Debian 12 machine:
#   containerd 2.1.x from Debian's newer suite (pinned so nothing else upgrades),
#   runc, CNI plugins, busybox-static and a few tools from bookworm.
# Idempotent: a second run only checks.
set -euo pipefail

log() { printf 'install-deps: %s\n' "$*" >&2; }

need_containerd=1
if command -v containerd >/dev/null 2>&1 && containerd --version | grep -q ' 2\.1\.'; then
  need_containerd=0
fi
# libseccomp-dev, libelf-dev: corral-oci (the builtin OCI runtime) links libseccomp, and libbpf
# (built from source, for cgroup v2 device rules) needs libelf.
base_pkgs=(runc containernetworking-plugins busybox-static iproute2 protobuf-compiler python3-yaml libseccomp-dev libelf-dev)
missing=()
for p in "${base_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ $need_containerd == 0 && ${#missing[@]} == 0 ]]; then
  log "all dependencies present ($(containerd --version | awk '{print $3}'))"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# The newer suite provides containerd 2.1; it must never be preferred for anything else,
# and libc6 in particular must stay bookworm's.
src=/etc/apt/sources.list.d/corral-forky.sources
if [[ ! -f $src ]]; then
  cat >"$src" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: forky
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
cat >/etc/apt/preferences.d/corral-forky <<'PIN'
Package: *
Pin: release n=forky
Pin-Priority: 50

Package: libc6 libc-bin libc6-dev
Pin: release n=forky
Pin-Priority: -1
PIN
cat >/etc/apt/apt.conf.d/99corral-forky-valid-until <<'CONF'
Acquire::Check-Valid-Until "false";
CONF

log "apt-get update"
# Third-party sources on this machine may be unreachable; Debian's are what matter.
apt-get update -o Acquire::Check-Valid-Until=false >/dev/null 2>&1 || log "apt-get update reported errors (continuing)"

if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
if [[ $need_containerd == 1 ]]; then
  log "installing containerd from forky"
  apt-get install -y --no-install-recommends -t forky containerd >/dev/null
fi
# Debian's package enables a system containerd service on systemd hosts; the rig runs its own.
containerd --version >&2
runc --version | head -1 >&2
