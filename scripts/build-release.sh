#!/usr/bin/env bash
# Builds the release shim as a static executable (glibc linked in, no dynamic loader, no
# relocations at start): it maps fewer pages per pod than a dynamically linked build.
# Prints the path of the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
# With an explicit --target, RUSTFLAGS reach only the target's crates, not build scripts or
# proc macros (which must stay dynamic).
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
  cargo build --release --target "$host" -p containerd-shim-corral-v2 >&2
echo "$PWD/target/$host/release/containerd-shim-corral-v2"
