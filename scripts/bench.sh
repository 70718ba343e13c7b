#!/usr/bin/env bash
# Side-by-side benchmark: corral (release build) against containerd's pause sandbox on one
# private containerd. Measures and reports; asserts nothing. Output: a table on stdout,
# target/bench/bench.json and target/bench/bench.svg.
#   usage: scripts/bench.sh [--pods N]      (default 30 pods per handler)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
shim=$(bash scripts/build-release.sh)
cargo build --release -p corral-bench
CORRAL_SHIM_DIR="$(dirname "$shim")" exec target/release/corral-bench "$@"
