#!/usr/bin/env bash
# Builds a busybox image as an OCI image-layout tarball, offline, from Debian's busybox-static.
#   usage: build-image.sh OUT.tar [NAME [EXTRA_DIR]]
# NAME defaults to docker.io/corral/busybox:test. The image's default command sleeps forever, so
# the same image also serves as the pause image of containerd's default runc handler.
# EXTRA_DIR, if given, is copied over the busybox root (how the node-installer image gets its
# files, see build-installer-image.sh).
set -euo pipefail
out=${1:?usage: build-image.sh OUT.tar [NAME [EXTRA_DIR]]}
name=${2:-docker.io/corral/busybox:test}
extra=${3:-}
bb=/bin/busybox
[[ -x $bb ]] || { echo "build-image: $bb missing (apt-get install busybox-static)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,root} "$work"/layout/blobs/sha256
chmod 1777 "$root/tmp"
cp "$bb" "$root/bin/busybox"
for applet in $("$bb" --list); do
  [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' >"$root/etc/group"
if [[ -n $extra ]]; then
  cp -a "$extra"/. "$root"/
fi

# Reproducible layer: fixed owner, mtime and order.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/layer.tar" .
blob() { # file -> prints "digest size" and stores it as a blob
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  cp "$1" "$work/layout/blobs/sha256/$d"
  echo "$d $s"
}
read -r layer_d layer_s < <(blob "$work/layer.tar")
arch=$(dpkg --print-architecture)
printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["/bin/sleep","2147483647"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$arch" "$layer_d" >"$work/config.json"
read -r config_d config_s < <(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$config_d" "$config_s" "$layer_d" "$layer_s" >"$work/manifest.json"
read -r manifest_d manifest_s < <(blob "$work/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest_d" "$manifest_s" "$name" "${name##*:}" >"$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
mkdir -p "$(dirname "$out")"
tar -C "$work/layout" -cf "$out.tmp.$$" . && mv "$out.tmp.$$" "$out"
echo "build-image: $out ($name)" >&2
