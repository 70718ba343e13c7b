#!/usr/bin/env bash
# Builds the release shim as a static executable (glibc linked in, no dynamic loader, no
# relocations at start): it maps fewer pages per pod than a dynamically linked build. Builds the
# builtin OCI runtime `corral-oci` the same way, beside it (libseccomp linked in from Debian's
# libseccomp-dev). Prints the path of the shim.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
# With an explicit --target, RUSTFLAGS reach only the target's crates, not build scripts or
# proc macros (which must stay dynamic).
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
  LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH="$(dirname "$(gcc -print-file-name=libseccomp.a)")" \
  cargo build --release --target "$host" -p containerd-shim-corral-v2 -p corral-oci >&2
echo "$PWD/target/$host/release/containerd-shim-corral-v2"
