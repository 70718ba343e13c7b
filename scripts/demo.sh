#!/usr/bin/env bash
# corral's main job, end to end: installs what is missing, builds the shim, starts a private
# containerd with the corral handler and runs a demo pod, printing its processes and namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --workspace --bins
exec target/debug/corral-demo
