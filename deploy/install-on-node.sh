#!/bin/sh
# Installs or removes corral on a node: the shim binary (and the containerd-shim-corral-node-v2
# link that runs it in node mode), the builtin OCI runtime `corral-oci` beside it (used when
# corral's config says runtime.binary = "builtin"), the `corral` and `corral-node` handlers in containerd's config,
# then restarts containerd. Idempotent; keeps the rest of the config file (comments
# included) byte for byte, because corral's block is appended between marker lines.
#   usage: install-on-node.sh install|uninstall
# Environment: HOST_ROOT (default /host), CONTAINERD_CONFIG (default $HOST_ROOT/etc/containerd/config.toml),
# BIN_DIR (default $HOST_ROOT/usr/local/bin), SHIM (default /opt/corral/containerd-shim-corral-v2;
# corral-oci is taken from the same directory when it is there),
# RESTART (default: restart containerd on the host through nsenter and systemctl).
set -eu
action=${1:?usage: install-on-node.sh install|uninstall}
HOST_ROOT=${HOST_ROOT:-/host}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-$HOST_ROOT/etc/containerd/config.toml}
BIN_DIR=${BIN_DIR:-$HOST_ROOT/usr/local/bin}
SHIM=${SHIM:-/opt/corral/containerd-shim-corral-v2}
RESTART=${RESTART:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd}
BEGIN='# BEGIN corral (managed by install-on-node.sh; do not edit)'
END='# END corral'

log() { echo "corral-deploy: $*" >&2; }

# The CRI plugin's name depends on the config file's version.
handler_block() {
  if grep -Eq '^[[:space:]]*version[[:space:]]*=[[:space:]]*3' "$CONTAINERD_CONFIG" 2>/dev/null; then
    plugin="'io.containerd.cri.v1.runtime'"
  else
    plugin='"io.containerd.grpc.v1.cri"'
  fi
  printf '%s\n[plugins.%s.containerd.runtimes.corral]\n  runtime_type = "io.containerd.corral.v2"\n  sandboxer = "shim"\n' \
    "$BEGIN" "$plugin"
  # The same shim in node mode: one corral server for every pod of this handler.
  printf '[plugins.%s.containerd.runtimes.corral-node]\n  runtime_type = "io.containerd.corral-node.v2"\n  sandboxer = "shim"\n%s\n' \
    "$plugin" "$END"
}

remove_block() {
  [ -f "$CONTAINERD_CONFIG" ] || return 0
  tmp="$CONTAINERD_CONFIG.corral.tmp"
  # Drop the marked block and the one blank line install put before it.
  awk -v b="$BEGIN" -v e="$END" '
    $0 == b { skip = 1; if (held) { held = 0 }; next }
    skip && $0 == e { skip = 0; next }
    skip { next }
    { if (held) print ""; held = 0 }
    $0 == "" { held = 1; next }
    { print }
    END { if (held) print "" }
  ' "$CONTAINERD_CONFIG" >"$tmp"
  cat "$tmp" >"$CONTAINERD_CONFIG" && rm -f "$tmp"
}

case "$action" in
  install)
    mkdir -p "$BIN_DIR" "$(dirname "$CONTAINERD_CONFIG")"
    # Copy then rename: running shims keep their old binary (no "text file busy"), and
    # containerd never sees a half-written one. (No `install`: busybox images lack it.)
    cp "$SHIM" "$BIN_DIR/.containerd-shim-corral-v2.new"
    chmod 0755 "$BIN_DIR/.containerd-shim-corral-v2.new"
    mv -f "$BIN_DIR/.containerd-shim-corral-v2.new" "$BIN_DIR/containerd-shim-corral-v2"
    ln -sfn containerd-shim-corral-v2 "$BIN_DIR/containerd-shim-corral-node-v2"
    oci="$(dirname "$SHIM")/corral-oci"
    if [ -f "$oci" ]; then
      cp "$oci" "$BIN_DIR/.corral-oci.new"
      chmod 0755 "$BIN_DIR/.corral-oci.new"
      mv -f "$BIN_DIR/.corral-oci.new" "$BIN_DIR/corral-oci"
    fi
    touch "$CONTAINERD_CONFIG"
    if grep -Fqx "$BEGIN" "$CONTAINERD_CONFIG"; then
      log "handler already configured in $CONTAINERD_CONFIG"
    elif grep -Eq 'runtimes\.corral\]' "$CONTAINERD_CONFIG"; then
      log "a corral handler that this script did not write exists in $CONTAINERD_CONFIG; leaving it"
    else
      { printf '\n'; handler_block; } >>"$CONTAINERD_CONFIG"
      log "added the corral handler to $CONTAINERD_CONFIG"
    fi
    sh -c "$RESTART"
    ;;
  uninstall)
    remove_block
    rm -f "$BIN_DIR/containerd-shim-corral-v2" "$BIN_DIR/containerd-shim-corral-node-v2" "$BIN_DIR/corral-oci"
    sh -c "$RESTART"
    log "removed corral"
    ;;
  *)
    echo "usage: install-on-node.sh install|uninstall" >&2
    exit 2
    ;;
esac
