#!/usr/bin/env bash
# Runs inside the VM (started by the image's guest-boot.sh with the shared checkout's path):
# prints what the guest is, runs the e2e test binaries test-vm.sh listed in target/vm/run/tests
# the way `cargo test` does, and writes "passed failed" to target/vm/run/result for the host.
set -uo pipefail
ws=${1:?workspace}
# test-vm.sh names its run directory on the kernel command line (corral.run=PATH).
run=$ws/target/vm/run
mode=pod
runtime=runc
for arg in $(cat /proc/cmdline); do
  case $arg in
    corral.run=*) run=${arg#corral.run=} ;;
    corral.mode=*) mode=${arg#corral.mode=} ;;
    corral.runtime=*) runtime=${arg#corral.runtime=} ;;
    # Log levels test-vm.sh passes on (containerd hands its environment to the shims).
    corral.log=*) export CORRAL_LOG=${arg#corral.log=} ;;
    corral.ocilog=*) export CORRAL_OCI_LOG=${arg#corral.ocilog=} ;;
  esac
done
exec >>"$run/guest.log" 2>&1
echo "guest: $(stat -f -c %T /sys/fs/cgroup)"
echo "guest: $(cat /proc/1/comm)"
echo "guest: corral in $mode mode, runtime $runtime"
echo "guest: kernel $(uname -r), $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), $(nproc) CPUs"
# The rig's systemd mode (tests/rig: CORRAL_RIG_CGROUP=systemd) is also detected on its own;
# naming it makes a wrong detection fail loudly instead of testing cgroupfs.
export CORRAL_RIG_CGROUP=systemd
export CORRAL_SHIM_DIR=$run/bin
# Node mode (test-vm.sh's CORRAL_VM_MODE): containerd passes CORRAL_MODE on to its shims.
if [[ $mode == node ]]; then
  export CORRAL_MODE=node
fi
# The builtin runtime (test-vm.sh's CORRAL_VM_RUNTIME), passed on the same way.
if [[ $runtime == builtin ]]; then
  export CORRAL_RUNC=builtin
fi
# Each rig's containerd log comes back to the host (the guest's disk does not).
export CORRAL_RIG_LOG_COPY=$run/containerd
mkdir -p "$CORRAL_RIG_LOG_COPY"
# Waits in the rig and tests are sized for the host; software emulation is several times
# slower (only waits grow: nothing asserts a duration).
if [[ $(systemd-detect-virt 2>/dev/null) == qemu ]]; then
  export CORRAL_RIG_TIME_SCALE=8
  # containerd's own recovery deadlines do not stretch: fewer pods through its restarts.
  export CORRAL_RESTART_PODS=3
else
  export CORRAL_RIG_TIME_SCALE=2
fi
echo "guest: $(systemd-detect-virt 2>/dev/null || echo bare metal), waits scaled x$CORRAL_RIG_TIME_SCALE"
passed=0 failed=0
cd "$ws/tests/e2e"
while read -r name bin; do
  echo "     Running tests/$name.rs (${bin#"$ws"/})"
  start=$(date +%s)
  touch "$run/$name.start"
  # Appended: a file named twice in --tests keeps both runs' output.
  "$bin" --test-threads=2 2>&1 | tee -a "$run/$name.log"
  result=$(grep -E '^test result: ' "$run/$name.log" | tail -1)
  if [[ $result =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    failed_here=${BASH_REMATCH[2]}
  else
    echo "test-vm: $name ended without a result (crashed or killed)"
    failed=$((failed + 1))
    failed_here=1
  fi
  # A failure's evidence in this log, which CI keeps (the containerd logs stay on the runner):
  # the warnings, errors, panics and exits in the containerd and corral logs its rigs wrote.
  if ((failed_here > 0)); then
    find "$CORRAL_RIG_LOG_COPY" -name '*.log' -newer "$run/$name.start" | while read -r f; do
      echo "test-vm: warnings and errors in $(basename "$f"):"
      grep -E 'level=(warning|error)| WARN | ERROR |panicked|exiting' "$f" | tail -n 40 | cut -c1-600
    done
  fi
  echo "test-vm: $name took $(($(date +%s) - start)) s"
done <"$run/tests"
echo "$passed passed, $failed failed"
echo "$passed $failed" >"$run/result"
# For the record (not the test's business): what is still running, and the units of pods.
{
  systemd-cgls --no-pager
  systemctl list-units --all --no-pager 'kubepods*' 'cri-containerd-*' 'corral-direct-*'
} >"$run/guest-end.txt" 2>&1
sync
# Nothing in the guest needs an orderly shutdown (its disk is a throw-away overlay, results are
# on the share): power off at once instead of waiting for stop timeouts.
systemctl poweroff --force --force
