//! `features` (the OCI runtime features document) and `--version`.
//!
//! containerd reads a runtime's features through corral's `-info` (which adjusts them, see
//! corral's `shim/info.rs`): CRI enables user namespaces only when "user" is among the
//! namespaces, and recursive read-only mounts only when "rro" is among the mount options. The
//! lists say what libcontainer 0.7 implements: its mount option table
//! (`syscall/linux.rs`), namespaces, hooks, and seccomp through libseccomp.

pub const LIBCONTAINER: &str = "0.7.0";

const MOUNT_OPTIONS: &[&str] = &[
    "async",
    "atime",
    "bind",
    "defaults",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "mand",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "nomand",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "private",
    "ratime",
    "rbind",
    "rdev",
    "rdiratime",
    "relatime",
    "remount",
    "rexec",
    "rnoatime",
    "rnodev",
    "rnodiratime",
    "rnoexec",
    "rnorelatime",
    "rnostrictatime",
    "rnosuid",
    "rnosymfollow",
    "ro",
    "rprivate",
    "rrelatime",
    "rro",
    "rrw",
    "rshared",
    "rslave",
    "rstrictatime",
    "rsuid",
    "rsymfollow",
    "runbindable",
    "rw",
    "shared",
    "slave",
    "strictatime",
    "suid",
    "sync",
    "unbindable",
];

pub fn document() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": MOUNT_OPTIONS,
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts"],
            "cgroup": { "v1": true, "v2": true, "systemd": true, "systemdUser": false },
            "seccomp": {
                "enabled": true,
                "actions": ["SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
                    "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_NOTIFY", "SCMP_ACT_TRACE", "SCMP_ACT_TRAP"],
                "operators": ["SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE", "SCMP_CMP_LT",
                    "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE"],
            },
            "apparmor": { "enabled": true },
            "selinux": { "enabled": false },
        },
        "annotations": { "io.github.corral.oci.libcontainer": LIBCONTAINER },
    })
}

pub fn version() -> String {
    format!("corral-oci version {} (libcontainer {LIBCONTAINER})\nspec: 1.2.0", env!("CARGO_PKG_VERSION"))
}
