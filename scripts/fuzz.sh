#!/usr/bin/env bash
# Bounded fuzzing of corral's input handling (PodSandboxConfig decoding, sysctl validation,
# config.json rewriting, the holder's spec decoder). Each target runs SECONDS (default 60) from
# the corpus in fuzz/corpus; a crash fails the script and leaves its input in fuzz/artifacts.
#   usage: scripts/fuzz.sh [SECONDS]
# cargo-fuzz wants nightly flags; the machine has one stable toolchain, so RUSTC_BOOTSTRAP lets
# it accept them. No sanitizer runtime is used (--sanitizer none): the targets assert what they
# check, and Rust code panics rather than corrupting memory.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O --sanitizer none
for target in pod_config sysctls config_json holder_spec; do
  echo "fuzz: $target for ${seconds}s" >&2
  log=$(mktemp)
  if ! cargo fuzz run -O --sanitizer none "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
    grep -E "ERROR|panicked|SUMMARY|Test unit written" "$log" >&2 || tail -20 "$log" >&2
    echo "fuzz: $target crashed (see fuzz/artifacts/$target)" >&2
    exit 1
  fi
  grep -E "^Done" "$log" >&2
  rm -f "$log"
done
