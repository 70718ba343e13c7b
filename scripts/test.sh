#!/usr/bin/env bash
# All of corral's tests: unit tests and the end-to-end tests against a private containerd 2.1
# driven through CRI. Needs root and scripts/install-deps.sh (CI runs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
# e2e tests each start their own containerd; two at a time fits a 2-core machine.
cargo test --workspace -- --test-threads=2
