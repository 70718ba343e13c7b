#!/usr/bin/env bash
# All of corral's tests: unit tests and the end-to-end tests against a private containerd 2.1
# driven through CRI, then the end-to-end suite once more in node mode (CORRAL_MODE=node, which
# containerd passes on to its shims: one corral server for every pod), and once more with
# corral's builtin OCI runtime instead of runc (CORRAL_RUNC=builtin: corral-oci). Needs root and
# scripts/install-deps.sh (CI runs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
# e2e tests each start their own containerd; two at a time fits a 2-core machine.
cargo test --workspace -- --test-threads=2
echo "test.sh: the end-to-end suite in node mode"
# The same package selection as above (only corral-e2e has integration tests): `-p corral-e2e`
# alone unifies features differently and would build every test binary a second time.
CORRAL_MODE=node cargo test --workspace --test "*" -- --test-threads=2
echo "test.sh: the end-to-end suite with the builtin OCI runtime (corral-oci)"
CORRAL_RUNC=builtin cargo test --workspace --test "*" -- --test-threads=2
