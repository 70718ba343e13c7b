#!/usr/bin/env bash
# Builds the node-installer image that deploy/corral-deploy.yaml runs, as an OCI image-layout
# tarball, offline (no image builder needed): busybox plus
#   /opt/corral/containerd-shim-corral-v2   the static release shim (scripts/build-release.sh)
#   /opt/corral/corral-oci                  the builtin OCI runtime, from beside SHIM
#   /opt/corral/install-on-node.sh          deploy/install-on-node.sh
#   usage: build-installer-image.sh OUT.tar [SHIM]
# SHIM defaults to a fresh static release build. Load the result with
# `ctr -n k8s.io images import OUT.tar`, or push it with any OCI tool (skopeo copy oci-archive:OUT.tar ...).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: build-installer-image.sh OUT.tar [SHIM]}
shim=${2:-$(bash scripts/build-release.sh)}
name=docker.io/corral/corral-deploy:$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
install -D -m 0755 "$shim" "$staging/opt/corral/containerd-shim-corral-v2"
install -D -m 0755 "$(dirname "$shim")/corral-oci" "$staging/opt/corral/corral-oci"
install -D -m 0755 deploy/install-on-node.sh "$staging/opt/corral/install-on-node.sh"
bash scripts/build-image.sh "$out" "$name" "$staging"
